"""Malformed stacks: each must fail with exit code 2, naming the file, line and column,
the problem and the fix, and never with a traceback.

Every case writes its stack files into a throw-away repository root next to copies of
the real post1/post2, then runs the real command line. Most stacks are children of
post2, so lines 1-2 are "name: a" / "inherits: post2" and the case's own text starts
at line 3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.fixtures.stack_support import REPO, make_root, parse_errors, run_cli

CHILD = "name: a\ninherits: post2\n"


@dataclass
class Case:
    id: str
    files: dict
    where: str | None  # "stacks/a.yaml:LINE[:COL]", an option such as "--set k=v", or None (no location)
    problem: str  # a distinctive part of the message
    fix: str  # a distinctive part of the fix
    args: tuple = ("show", "a")
    extra: list = field(default_factory=list)  # more messages the output must contain


def child(text: str) -> dict:
    return {"a.yaml": CHILD + text}


PIN = "packages:\n  torch:\n    version: {}\n"  # the version value is at line 5, column 14

CASES = [
    # --- not YAML
    Case(
        "yaml-tab-indent",
        child("platform:\n\tos: ubuntu22.04\n"),
        "stacks/a.yaml:4:1",
        "invalid YAML: found character '\\t' that cannot start any token",
        "check indentation",
    ),
    Case(
        "yaml-unclosed-bracket",
        child("platform:\n  gpu_arch: [mp_31\n"),
        "stacks/a.yaml:5:1",
        "expected ',' or ']', but got '<stream end>' (while parsing a flow sequence started at line 4, column 13)",
        "check indentation",
    ),
    Case(
        "yaml-duplicate-key",
        child("packages:\n  torch: {version: 2.11.0.post2+musa5.2.0}\n  torch: {version: 2.11.0.post1+musa5.2.0}\n"),
        "stacks/a.yaml:5:3",
        "duplicate key 'torch' (first written at line 4)",
        "keep one of the two entries",
    ),
    Case(
        "yaml-duplicate-key-in-flow-mapping",
        child("packages:\n  torch: {version: 2.11.0.post2+musa5.2.0, version: 2.11.0.post1+musa5.2.0}\n"),
        "stacks/a.yaml:4:44",
        "duplicate key 'version' (first written at line 4)",
        "keep one of the two entries",
    ),
    Case(
        "not-a-mapping",
        {"a.yaml": "- name: a\n- inherits: post2\n"},
        "stacks/a.yaml:1:1",
        "a stack file must be a mapping",
        "start the file with 'name: <stack name>'",
    ),
    # --- wrong types
    Case(
        "python-unquoted",
        child("platform:\n  python: 3.10\n"),
        "stacks/a.yaml:4:11",
        "platform.python: 3.10 was read as a number",
        "double quotes",
    ),
    Case(
        "version-unquoted-number",
        child("packages:\n  triton: {version: 3.2}\n"),
        "stacks/a.yaml:4:21",
        "packages.triton.version: version 3.2 was read as a number",
        "double quotes",
    ),
    Case(
        "list-where-mapping",
        child('platform: [ubuntu22.04, "3.10"]\n'),
        "stacks/a.yaml:3:11",
        "platform: Input should be a valid dictionary",
        "write a mapping of key: value",
    ),
    Case(
        "string-where-list",
        child("platform:\n  gpu_arch: mp_31\n"),
        "stacks/a.yaml:4:13",
        "platform.gpu_arch: Input should be a valid list",
        "write a list",
    ),
    Case(
        "two-indexes-for-one-package",
        child("packages:\n  torch: {version: 2.11.0.post2+musa5.2.0, index: [mthreads, pypi]}\n"),
        "stacks/a.yaml:4:51",
        "packages.torch.index: Input should be a valid string",
        "write a string",
    ),
    Case(
        "gate-not-a-choice",
        child("packages:\n  mate:\n    gate: prefixed\n"),
        "stacks/a.yaml:5:11",
        "packages.mate.gate: Input should be 'exact', 'metadata' or 'spec'",
        "use one of: 'exact', 'metadata'",
    ),
    Case(
        "env-value-not-a-string",
        child("kernels:\n  vllm_musa:\n    env:\n      MAX_JOBS: 4\n"),
        "stacks/a.yaml:6:7",
        "MAX_JOBS: environment values must be strings; quote 4",
        "double quotes",
    ),
    Case(
        "index-url-without-scheme",
        child("indexes:\n  pypi:\n    url: pypi.org/simple\n"),
        "stacks/a.yaml:5:10",
        "indexes.pypi.url: 'pypi.org/simple' is not an http(s):// or file:// URL",
        "https://pypi.org/simple",
    ),
    Case(
        "inherits-not-a-name",
        {"a.yaml": "name: a\ninherits: [post1, post2]\n"},
        "stacks/a.yaml:2:11",
        "inherits must be the name of another stack",
        "inherits: post1",
    ),
    # --- unknown keys, with a near-miss name
    Case(
        "unknown-key-top-level",
        child("pakages: {}\n"),
        "stacks/a.yaml:3:1",
        "unknown key 'pakages' in the top level",
        "did you mean 'packages'?",
    ),
    Case(
        "unknown-key-in-platform",
        child('platform:\n  pyhton: "3.10"\n'),
        "stacks/a.yaml:4:3",
        "unknown key 'pyhton' in platform",
        "did you mean 'python'?",
    ),
    Case(
        "unknown-key-in-package",
        child("packages:\n  torch:\n    verison: 2.11.0.post2+musa5.2.0\n"),
        "stacks/a.yaml:5:5",
        "unknown key 'verison' in packages.torch",
        "did you mean 'version'?",
    ),
    Case(
        "unknown-key-in-rules",
        child("rules:\n  minimum: []\n"),
        "stacks/a.yaml:4:3",
        "unknown key 'minimum' in rules",
        "did you mean 'minimums'?",
    ),
    Case(
        "unknown-key-in-a-rule",
        child("rules:\n  trains:\n    - name: torch\n      memebrs: [torch]\n"),
        "stacks/a.yaml:6:7",
        "unknown key 'memebrs' in rules.trains.0",
        "did you mean 'members'?",
    ),
    # --- pins: exact PEP 440 versions only
    Case(
        "range-pin-ge",
        child(PIN.format('">=2.11.0"')),
        "stacks/a.yaml:5:14",
        "packages.torch.version: '>=2.11.0' is a range",
        "pin one exact version",
    ),
    Case(
        "range-pin-compatible",
        child(PIN.format('"~=2.11.0"')),
        "stacks/a.yaml:5:14",
        "'~=2.11.0' is a range",
        "pin one exact version",
    ),
    Case(
        "range-pin-double-equals",
        child(PIN.format('"==2.11.0.post2+musa5.2.0"')),
        "stacks/a.yaml:5:14",
        "write the bare version '2.11.0.post2+musa5.2.0', not '==2.11.0.post2+musa5.2.0'",
        "pin one exact version",
    ),
    Case(
        "range-pin-wildcard",
        child(PIN.format('"2.11.*"')),
        "stacks/a.yaml:5:14",
        "'2.11.*' is a range",
        "pin one exact version",
    ),
    Case("range-pin-star", child(PIN.format('"*"')), "stacks/a.yaml:5:14", "'*' is a range", "pin one exact version"),
    Case(
        "invalid-pep440",
        child(PIN.format("2.11.0.post2.musa5.2.0")),
        "stacks/a.yaml:5:14",
        "'2.11.0.post2.musa5.2.0' is not a valid PEP 440 version",
        "2.11.0.post2+musa5.2.0",
    ),
    # --- inheritance
    Case(
        "inheritance-cycle",
        {"a.yaml": "name: a\ninherits: b\n", "b.yaml": "name: b\ninherits: a\n"},
        "stacks/b.yaml:2:11",
        "inheritance cycle: a → b → a",
        "remove 'inherits' from one stack in the cycle",
    ),
    Case(
        "inheritance-cycle-of-three",
        {"a.yaml": "name: a\ninherits: b\n", "b.yaml": "name: b\ninherits: c\n", "c.yaml": "name: c\ninherits: a\n"},
        "stacks/c.yaml:2:11",
        "inheritance cycle: a → b → c → a",
        "remove 'inherits'",
    ),
    Case(
        "inherits-itself",
        {"a.yaml": "name: a\ninherits: a\n"},
        "stacks/a.yaml:2:11",
        "inheritance cycle: a → a",
        "remove 'inherits'",
    ),
    Case(
        "missing-parent",
        {"a.yaml": "name: a\ninherits: post3\n"},
        "stacks/a.yaml:2:11",
        "parent stack 'post3' does not exist (stacks/post3.yaml)",
        "did you mean 'post2'?",
    ),
    Case(
        "missing-stack",
        {},
        None,
        "no stack named 'post3' (stacks/post3.yaml does not exist)",
        "did you mean 'post2'?",
        args=("show", "post3"),
    ),
    Case(
        "name-not-matching-file",
        {"a.yaml": "name: b\ninherits: post2\n"},
        "stacks/a.yaml:1:7",
        "name 'b' does not match the file name 'a'",
        "set name: a, or rename the file to b.yaml",
    ),
    Case(
        "child-without-name",
        {"a.yaml": "inherits: post2\ndescription: no name\n"},
        "stacks/a.yaml:1:1",
        "missing required key 'name'",
        "add 'name: a'",
    ),
    # --- missing keys and unknown references
    Case(
        "missing-required-keys",
        {"a.yaml": "name: a\ndescription: no parent, nothing declared\n"},
        "stacks/a.yaml:1:1",
        "missing required key 'platform'",
        "add 'platform:'",
        extra=["missing required key 'packages'", "missing required key 'tags'"],
    ),
    Case(
        "missing-key-in-package",
        child("packages:\n  vllm-flash:\n    version: 1.0.0\n"),
        "stacks/a.yaml:4:3",
        "missing required key 'index' in packages.vllm-flash",
        "add 'index:'",
    ),
    Case(
        "unknown-index",
        child("packages:\n  torchada:\n    index: pypii\n"),
        "stacks/a.yaml:5:12",
        "packages.torchada.index: unknown index 'pypii'",
        "did you mean 'pypi'?",
    ),
    Case(
        "unknown-package-in-rule",
        child("rules:\n  aligned:\n    - name: mate\n      members: [mate, mate-mubn]\n"),
        "stacks/a.yaml:6:23",
        "rules.aligned.0.members.1: unknown package 'mate-mubn'",
        "did you mean 'mate-mubin'?",
    ),
    Case(
        "empty-train",
        child("rules:\n  trains:\n    - {name: torch, members: []}\n"),
        "stacks/a.yaml:5:30",
        "rules.trains.0.members: List should have at least 1 item",
        "list at least one entry",
    ),
    # --- upstreams
    Case(
        "commit-not-40-hex",
        child("upstreams:\n  vllm:\n    commit: 2cf0a69\n"),
        "stacks/a.yaml:5:13",
        "upstreams.vllm.commit: '2cf0a69' is not a full 40-hex commit id",
        "write the full 40-hex commit id",
    ),
    Case(
        "git-upstream-without-commit",
        child("upstreams:\n  extra:\n    git: https://github.com/example/extra.git\n    tag: v1.0\n"),
        "stacks/a.yaml:5:5",
        "upstreams.extra: a git upstream needs 'commit'",
        "add commit:",
    ),
    # --- tags
    Case(
        "tag-template-plus-without-tagsafe",
        child('tags:\n  local: "vllm-musa:{{ packages.torch.version }}"\n'),
        "stacks/a.yaml:4:10",
        "tag '2.11.0.post2+musa5.2.0' contains '+'",
        "the tagsafe filter turns '+' into '_'",
    ),
    Case(
        "tag-template-uppercase-repository",
        child('tags:\n  local: "vLLM-musa:{{ stack.name }}"\n'),
        "stacks/a.yaml:4:10",
        "tags.local renders 'vLLM-musa:a': repository path 'vLLM-musa' must be lowercase",
        "repository names are lowercase",
    ),
    Case(
        "publish-template-plus",
        child('tags:\n  publish: "vllm:{{ packages.torch.version }}-{{ date }}-r{{ revision }}"\n'),
        "stacks/a.yaml:4:12",
        "tag '2.11.0.post2+musa5.2.0-20260929-r1' contains '+'",
        "tagsafe",
        args=("tags", "a", "--registry", "registry.example.com/team", "--date", "20260929", "--revision", "1"),
    ),
    Case(
        "template-undefined-attribute",
        child('tags:\n  local: "vllm-musa:{{ platform.osname }}"\n'),
        "stacks/a.yaml:4:10",
        "tags.local: template uses an unknown value",
        "use platform.*",
        extra=["'osname'"],
    ),
    Case(
        "template-undefined-variable",
        child('tags:\n  local: "vllm-musa:{{ torch_version }}"\n'),
        "stacks/a.yaml:4:10",
        "template uses an unknown value ('torch_version' is undefined)",
        "packages.<name>",
    ),
    Case(
        "bad-registry",
        {},
        "--registry",
        "registry 'https://registry.example.com' is not a valid registry",
        "no scheme",
        args=("tags", "post2", "--registry", "https://registry.example.com", "--revision", "1"),
    ),
    # --- --set overrides
    Case(
        "set-without-equals",
        {},
        "--set base.image",
        "an override must look like key.path=value",
        "e.g. --set",
        args=("show", "post2", "--set", "base.image"),
    ),
    Case(
        "set-below-a-scalar",
        {},
        "--set platform.os.name=x",
        "'platform.os' is a value, not a mapping; cannot set 'platform.os.name'",
        "override the value itself",
        args=("show", "post2", "--set", "platform.os.name=x"),
    ),
    Case(
        "set-range-pin",
        {},
        "--set packages.torch.version=>=2.12",
        "packages.torch.version: '>=2.12' is a range",
        "pin one exact version",
        args=("show", "post2", "--set", "packages.torch.version=>=2.12"),
    ),
    Case(
        "set-unknown-key",
        {},
        "--set platform.pyton=3.11",
        "unknown key 'pyton' in platform",
        "did you mean 'python'?",
        args=("show", "post2", "--set", "platform.pyton=3.11"),
    ),
]


def test_the_table_is_big_enough():
    assert len(CASES) >= 20
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_stack(tmp_path, capsys, case):
    root = make_root(tmp_path, case.files)
    rc, out, err = run_cli(capsys, root, *case.args)
    assert rc == 2, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err
    if case.args[0] == "show":
        assert out == ""  # nothing half-printed
    errors = parse_errors(err)
    assert errors, f"no 'error:' line in stderr:\n{err}"
    first = errors[0]
    where = first["file"]
    if first["line"] is not None:
        where += f":{first['line']}" + (f":{first['col']}" if first["col"] is not None else "")
    assert where == case.where, err
    assert case.problem in first["message"], err
    assert first["fix"] and case.fix in first["fix"], err
    assert str(tmp_path) not in err, "errors name files relative to the repository root"
    for text in case.extra:
        assert text in err


def test_every_problem_in_a_file_is_reported(tmp_path, capsys):
    text = CHILD + 'platform:\n  pyhton: "3.10"\n  archh: x86_64\npakages: {}\n'
    rc, _, err = run_cli(capsys, make_root(tmp_path, {"a.yaml": text}), "show", "a")
    assert rc == 2
    assert [(e["line"], e["fix"]) for e in parse_errors(err)] == [
        (4, "did you mean 'python'?"),
        (5, "did you mean 'arch'?"),
        (6, "did you mean 'packages'?"),
    ]


def test_errors_raised_by_the_library_carry_the_same_location(tmp_path):
    from stackforge.errors import UserError
    from stackforge.stack.load import load_stack

    root = make_root(tmp_path, child("platform:\n  python: 3.10\n"))
    with pytest.raises(UserError) as info:
        load_stack("a", root=root)
    err = info.value
    assert (str(err.file), err.line, err.col, err.exit_code) == ("stacks/a.yaml", 4, 11, 2)
    assert "3.10" in err.message and err.fix


SUBPROCESS_CASES = [
    "yaml-tab-indent",
    "inheritance-cycle",
    "range-pin-ge",
    "tag-template-plus-without-tagsafe",
    "set-below-a-scalar",
    "missing-parent",
]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_no_traceback_from_the_real_process(tmp_path, case_id):
    case = next(c for c in CASES if c.id == case_id)
    root = make_root(tmp_path, case.files)
    env = {k: v for k, v in os.environ.items() if k != "STACKFORGE_ROOT"}
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", *case.args], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {case.where}: " if case.where else "error: ")
    assert case.problem in proc.stderr and case.fix in proc.stderr


def test_malformed_table_does_not_touch_the_real_stacks():
    # every case writes under a tmp root; the repository's own stacks still load
    env = {k: v for k, v in os.environ.items() if k != "STACKFORGE_ROOT"}
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "lint", "post1", "post2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    # at most a note per stack when the plugin it agrees with is not fetched on this host, and one naming why its
    # public index has no lock
    assert all(
        line.startswith(tuple(f"note: {s}: {what}" for s in ("post1", "post2") for what in ("not checked", "index")))
        for line in proc.stderr.splitlines()
    )
