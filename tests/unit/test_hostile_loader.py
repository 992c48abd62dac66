"""Hostile stack files, stack arguments and --set values, through the real process.

Every case builds a throw-away repository root (copies of the real stacks/ and images/),
adds its hostile files, runs ``python -m stackforge --root ROOT …`` with a timeout and
asserts: exit code 2, the error names where (file:line:col, the option or nothing for a
bad argument) and gives a fix, no traceback, nothing of a file outside stacks/ echoed,
and nothing written (no build/, stacks/ unchanged).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stackforge.builder.plan.render import SOURCE_IMAGES
from tests.fixtures.stack_support import REPO, parse_errors

TIMEOUT = 20  # seconds; every refusal here takes well under one
CHILD = "name: a\ninherits: post2\n"  # a case's own text starts at line 3
CANARY = "canary-3f9d1c: this text lives outside stacks/"


def bomb(levels: int = 9) -> str:
    """A flow-style alias bomb: each level is nine aliases of the one before."""
    items = ["&l0 [" + ", ".join(["lol"] * 9) + "]"]
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def deep(n: int) -> str:
    """``n`` nested flow lists; the root mapping of a file is one level more."""
    return "[" * n + "]" * n


def deep_block(n: int) -> str:
    return "".join(" " * i + f"k{i}:\n" for i in range(n)) + " " * n + "v\n"


@dataclass
class Case:
    id: str
    files: dict  # name under stacks/ -> text (str) or bytes
    args: tuple
    where: str | None  # expected location: "stacks/a.yaml:L:C", "--set key" or None (a bad argument)
    problem: str  # a distinctive part of the message
    fix: str  # a distinctive part of the fix
    setup: Callable[[Path], None] | None = None  # extra preparation of the root
    absent: list = field(default_factory=list)  # texts that must appear nowhere in the output


def link_out(root: Path) -> None:
    outside = root.parent / "outside.yaml"
    outside.write_text(f"name: evil\ndescription: {CANARY}\n")
    (root / "stacks" / "evil.yaml").symlink_to(outside)


def fifo(root: Path) -> None:
    os.mkfifo(root / "stacks" / "pipe.yaml")  # reading it would block for ever


def long_chain(root: Path) -> None:
    for i in range(20):
        parent = f"inherits: c{i + 1}\n" if i < 19 else "inherits: post2\n"
        (root / "stacks" / f"c{i}.yaml").write_text(f"name: c{i}\n{parent}")


BIG = "#" + "x" * (1 << 20) + "\n"

CASES = [
    # --- the YAML loader's limits, stack files
    Case(
        "alias-bomb-file",
        {"a.yaml": CHILD + f"description: {bomb()}\n"},
        ("show", "a"),
        "stacks/a.yaml:3:224",
        "aliases expand to more than 10000 values (alias *l3)",
        "write the values out",
    ),
    Case(
        "alias-recursive-file",
        {"a.yaml": CHILD + "description: &d [*d]\n"},
        ("show", "a"),
        "stacks/a.yaml:3:18",
        "alias *d is used inside its own anchor",
        "write the value out",
    ),
    Case(
        "deep-5000-file",
        {"a.yaml": CHILD + f"description: {deep(5000)}\n"},
        ("show", "a"),
        "stacks/a.yaml:3:77",
        "nesting deeper than 64 levels",
        "flatten the data",
    ),
    Case(
        "deep-100000-file",
        {"a.yaml": CHILD + f"description: {deep(100_000)}\n"},
        ("lint", "a"),
        "stacks/a.yaml:3:77",
        "nesting deeper than 64 levels",
        "flatten the data",
    ),
    Case(
        "deep-block-1000-file",
        {"a.yaml": CHILD + "description:\n" + deep_block(1000)},
        ("show", "a"),
        "stacks/a.yaml:68:65",
        "nesting deeper than 64 levels",
        "flatten the data",
    ),
    Case(
        "nul-byte-file",
        {"a.yaml": CHILD + "description: x\x00y\n"},
        ("show", "a"),
        "stacks/a.yaml:3:15",
        "control character U+0000",
        "remove it",
    ),
    Case(
        "escape-char-file",
        {"a.yaml": CHILD + "description: \x1b[2Jcleared\n"},
        ("lint", "a"),
        "stacks/a.yaml:3:14",
        "control character U+001B",
        "remove it",
    ),
    Case(
        "bidi-override-file",
        {"a.yaml": CHILD + "description: safe\u202eelif\n"},
        ("show", "a"),
        "stacks/a.yaml:3:18",
        "control character U+202E",
        "remove it",
    ),
    Case(
        "not-utf8-file",
        {"a.yaml": CHILD.encode() + b"description: caf\xe9\n"},
        ("show", "a"),
        "stacks/a.yaml:3",
        "not UTF-8 text",
        "save the file as UTF-8",
    ),
    Case(
        "huge-integer-file",
        {"a.yaml": CHILD + "description: " + "1" * 5000 + "\n"},
        ("show", "a"),
        "stacks/a.yaml:3:14",
        "cannot read this value",
        "quote it",
    ),
    Case(
        "oversized-file",
        {"a.yaml": CHILD + BIG},
        ("show", "a"),
        "stacks/a.yaml",
        "stack files are limited to 1048576 bytes",
        "a stack file is a few KiB",
    ),
    Case(
        "too-many-values-file",
        {"a.yaml": CHILD + "description: [" + ",".join(["a"] * 30_000) + "]\n"},
        ("show", "a"),
        "stacks/a.yaml:3:40001",
        "more than 20000 values in one document",
        "a few hundred values",
    ),
    Case("fifo-file", {}, ("show", "pipe"), "stacks/pipe.yaml", "not a regular file", "a plain .yaml file", setup=fifo),
    # --- the same limits on --set values
    Case(
        "alias-bomb-set",
        {},
        ("show", "post2", "--set", f"description={bomb()}"),
        "--set description",
        "aliases expand to more than 10000 values",
        "write the values out",
    ),
    Case(
        "deep-5000-set",
        {},
        ("show", "post2", "--set", f"description={deep(5000)}"),
        "--set description",
        "nesting deeper than 64 levels (line 1, column 65 of the value)",
        "flatten the data",
    ),
    Case(
        "deep-100000-set",
        {},
        ("lint", "post2", "--set", "description=" + "[" * 100_000),
        "--set description",
        "a --set value is limited to 65536 bytes",
        "put large data in a stack file",
    ),
    Case(
        "oversized-set-120k",
        {},
        ("show", "post2", "--set", "description=" + "a://" * 30_000),
        "--set description",
        "the value is 120000 bytes",
        "put large data in a stack file",
    ),
    Case(
        "too-many-values-set",
        {},
        ("show", "post2", "--set", "description=[" + ",".join(["a"] * 30_000) + "]"),
        "--set description",
        "more than 20000 values in one document (line 1, column 40000 of the value)",
        "a few hundred values",
    ),
    Case(
        "escape-char-set",
        {},
        ("show", "post2", "--set", "description=ok\x1b]0;title\x07"),
        "--set description",
        "control character U+001B in the text (line 1, column 3 of the value)",
        "remove it",
    ),
    Case(
        "key-path-too-long-set",
        {},
        ("show", "post2", "--set", ".".join(["k"] * 17) + "=1"),
        "--set " + ".".join(["k"] * 17),
        "a key path of more than 16 parts",
        "name a key of the stack",
    ),
    # --- paths are confined to stacks/
    Case("stack-arg-parent-dir", {}, ("show", "../x"), None, "'../x' is not a stack name", "known stacks:"),
    Case(
        "stack-arg-absolute",
        {},
        ("show", "/etc/passwd"),
        None,
        "'/etc/passwd' is not a stack name",
        "known stacks:",
        absent=["root:"],
    ),
    Case(
        "stack-arg-dotdot-in-stacks",
        {},
        ("lint", "stacks/../../x"),
        None,
        "'stacks/../../x' is not a stack name",
        "known stacks:",
    ),
    Case(
        "stack-arg-path-of-a-stack",
        {},
        ("show", "stacks/post2.yaml"),
        None,
        "'stacks/post2.yaml' is not a stack name",
        "name the stack, not a path: 'post2'",
    ),
    Case(
        "inherits-parent-dir",
        {"a.yaml": "name: a\ninherits: ../x\n"},
        ("show", "a"),
        "stacks/a.yaml:2:11",
        "inherits: '../x' is not a stack name",
        "known stacks:",
    ),
    Case(
        "inherits-absolute",
        {"a.yaml": "name: a\ninherits: /etc/passwd\n"},
        ("show", "a"),
        "stacks/a.yaml:2:11",
        "inherits: '/etc/passwd' is not a stack name",
        "known stacks:",
        absent=["root:"],
    ),
    Case(
        "inherits-self-as-path",
        {"a.yaml": "name: a\ninherits: stacks/a.yaml\n"},
        ("show", "a"),
        "stacks/a.yaml:2:11",
        "inherits: 'stacks/a.yaml' is not a stack name",
        "name the stack, not a path: 'a'",
    ),
    Case(
        "inherits-chain-too-long",
        {},
        ("show", "c0"),
        "stacks/c15.yaml:2:11",
        "inheritance chain longer than 16 stacks",
        "inherit from a stack nearer the root",
        setup=long_chain,
    ),
    Case(
        "symlink-out-of-stacks",
        {},
        ("show", "evil"),
        "stacks/evil.yaml",
        "the file is a link to a file outside stacks/",
        "copy the stack into stacks/",
        setup=link_out,
        absent=[CANARY],
    ),
    Case(
        "set-name-other",
        {},
        ("show", "post2", "--set", "name=post1"),
        "--set name=post1",
        "--set name cannot rename a stack",
        "drop --set name",
    ),
    Case(
        "set-name-below",
        {},
        ("show", "post2", "--set", "name.x=y"),
        "--set name.x=y",
        "--set name cannot rename a stack",
        "drop --set name",
    ),
    Case(
        "set-inherits-other",
        {},
        ("show", "post2", "--set", "inherits=example"),
        "--set inherits=example",
        "--set inherits cannot change the parent stack",
        "'inherits: <parent>'",
    ),
    Case(
        "set-inherits-added",
        {},
        ("show", "post1", "--set", "inherits=post2"),
        "--set inherits=post2",
        "(the parent of post1 is none)",
        "'inherits: <parent>'",
    ),
]


def test_the_table_is_big_enough():
    assert len(CASES) >= 14
    assert len({c.id for c in CASES}) == len(CASES)


def make_repo(tmp_path: Path, files: dict) -> Path:
    """A repository root with copies of the real stacks/ and images/ plus ``files`` under stacks/."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(SOURCE_IMAGES, root / "images")
    for name, text in files.items():
        path = root / "stacks" / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return root


def snapshot(directory: Path) -> dict:
    """Every entry under ``directory`` (links not followed) with a digest of regular files."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            out[str(path)] = "link:" + os.readlink(path)
        elif path.is_file():
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[str(path)] = "other"
    return out


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STACKFORGE_ROOT"}
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=TIMEOUT,
    )


def location(error: dict) -> str | None:
    where = error["file"]
    if where and error["line"] is not None:
        where += f":{error['line']}" + (f":{error['col']}" if error["col"] is not None else "")
    return where


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused(tmp_path, case):
    root = make_repo(tmp_path, case.files)
    if case.setup:
        case.setup(root)
    before = snapshot(root)
    proc = run(root, *case.args)
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[:2000]}"
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""  # nothing half-printed
    errors = parse_errors(proc.stderr)
    assert errors, proc.stderr[:2000]
    first = errors[0]
    assert location(first) == case.where, proc.stderr[:2000]
    assert case.problem in first["message"], proc.stderr[:2000]
    assert first["fix"] and case.fix in first["fix"], proc.stderr[:2000]
    assert len(proc.stderr) < 2000, "the refusal does not echo the hostile input"
    for text in case.absent:
        assert text not in proc.stderr + proc.stdout
    assert not (root / "build").exists()
    assert snapshot(root) == before


LIST_BAD = {
    "alias-bomb": (f"name: bad\ndescription: {bomb()}\n", "stacks/bad.yaml:2:224: aliases expand"),
    "deep-100000": (f"name: bad\ndescription: {deep(100_000)}\n", "stacks/bad.yaml:2:77: nesting deeper"),
    "nul-byte": ("name: bad\ndescription: x\x00\n", "stacks/bad.yaml:2:15: control character U+0000"),
    "inherits-path": ("name: bad\ninherits: ../../etc/passwd\n", "stacks/bad.yaml:2:11: inherits: '../../etc/passwd'"),
    "not-yaml": ("name: bad\ndescription: [unclosed\n", "stacks/bad.yaml:3:1: invalid YAML"),
}


@pytest.mark.parametrize("bad_id", list(LIST_BAD))
def test_list_reports_a_bad_file_as_a_row_and_goes_on(tmp_path, bad_id):
    text, status = LIST_BAD[bad_id]
    root = make_repo(tmp_path, {"bad.yaml": text})
    proc = run(root, "list")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {line.split()[0]: line.split(None, 1)[1] for line in proc.stdout.splitlines()}
    assert set(rows) == {"bad", "example", "example-multi", "post1", "post2"}
    assert rows["bad"].startswith(f"invalid: {status}"), rows["bad"]
    assert rows["post2"] == "MUSA 5.2.0 release train, torch 2.11.0.post2"
    assert not (root / "build").exists()


def test_list_of_good_stacks_exits_0(tmp_path):
    proc = run(make_repo(tmp_path, {}), "list")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["example", "example-multi", "post1", "post2"]


@pytest.mark.parametrize("override", ["name=post2", "inherits=post1"])
def test_set_name_and_inherits_may_repeat_the_stack_own_values(tmp_path, override):
    proc = run(make_repo(tmp_path, {}), "show", "post2", "--set", override)
    assert proc.returncode == 0, proc.stderr
    assert "files:        stacks/post1.yaml → stacks/post2.yaml" in proc.stdout


def test_small_anchors_and_merge_keys_still_load(tmp_path):
    text = CHILD + (
        "packages:\n  torchvision: &tv {version: 0.26.0.post2+musa5.2.0, index: mthreads}\n"
        "  newpkg:\n    <<: *tv\n    gate: metadata\n"
    )
    proc = run(make_repo(tmp_path, {"a.yaml": text}), "show", "a", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"newpkg": {\n        "version": "0.26.0.post2+musa5.2.0",\n        "index": "mthreads"' in proc.stdout


def test_a_symlink_inside_stacks_is_followed(tmp_path):
    root = make_repo(tmp_path, {})
    (root / "stacks" / "p2.yaml").symlink_to("post2.yaml")
    proc = run(root, "show", "p2")
    assert proc.returncode == 2  # the file names itself post2, not p2
    assert "name 'post2' does not match the file name 'p2'" in proc.stderr


def test_a_file_name_with_control_characters_is_listed_escaped(tmp_path):
    root = make_repo(tmp_path, {"x\x1b[2J.yaml": "name: x\n"})
    proc = run(root, "list")
    assert proc.returncode == 2, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("'x"))
    assert row.startswith("'x\\x1b[2J'") and "invalid: 'x\\x1b[2J' is not a stack name" in row
    proc = run(root, "show", "post3")
    assert "\x1b" not in proc.stderr and "known stacks: example, example-multi, post1, post2" in proc.stderr


def test_the_control_character_patterns_are_unicode_category_cc_and_the_line_separators():
    """grammar.bad_char scans with a regular expression; it must find exactly what Unicode calls a control
    character (category Cc) plus U+2028/U+2029, and the multi-line one the same less \\n and \\t."""
    import unicodedata

    from stackforge import grammar

    for cp in [*range(0x3000), 0x2028, 0x2029, 0xFEFF, 0xFFFF, 0x10FFFF]:
        ch = chr(cp)
        control = ch in "\u2028\u2029" or unicodedata.category(ch) == "Cc"
        assert bool(grammar.CONTROL_RE.search(ch)) == control, hex(cp)
        assert bool(grammar.CONTROL_MULTILINE_RE.search(ch)) == (control and ch not in "\n\t"), hex(cp)
        if control:  # the stack model searches only what str.isprintable refuses (stack/model.py _unprintable)
            assert not ch.isprintable() and not f"a{ch}b".isprintable(), hex(cp)
    assert grammar.bad_char("ab\x85c") == "the control character U+0085"
    assert grammar.bad_char("a\tb\nc", multiline=True) is None
    assert grammar.bad_char("a\tb", multiline=False) == "a tab"
