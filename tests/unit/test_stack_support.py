"""Shared helpers for the stack tests (imported by the other test_stack_* modules).

``make_root`` builds a throw-away repository root holding copies of the real
stacks/post1.yaml and stacks/post2.yaml plus any extra stack files a test writes;
``run_cli`` runs the real command line in-process and returns (exit code, stdout, stderr).
The tests at the bottom pin the baseline the rule and malformed-stack tests start from.
"""
from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest
from stackforge.cli.main import main

REPO = Path(__file__).resolve().parents[2]
STACKS = REPO / "stacks"
REAL_STACKS = ("post1.yaml", "post2.yaml")


def make_root(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A repository root with stacks/post1.yaml, stacks/post2.yaml and ``files`` (name -> YAML text)."""
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    for name in REAL_STACKS:
        shutil.copy(STACKS / name, root / "stacks" / name)
    for name, text in (files or {}).items():
        (root / "stacks" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def run_cli(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop anything printed before
    rc = main(["--root", str(root), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def locate(path: Path, line_has: str, value: str) -> tuple[int, int]:
    """1-based (line, column) of ``value`` on the first line of ``path`` containing ``line_has``."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line_has in line:
            col = line.index(value, line.index(line_has))
            return n, col + 1
    raise AssertionError(f"no line containing {line_has!r} in {path}")


#: "error: LOCATION: message", LOCATION being FILE[:LINE[:COL]] or a command-line option ("--set k=v").
ERROR_HEAD = re.compile(r"^error: (?:(?P<loc>--\S+(?: \S+)?|\S+\.ya?ml(?::\d+){0,2}): )?(?P<message>.*)$")


def parse_errors(stderr: str) -> list[dict]:
    """Split rendered UserErrors ("error: FILE:LINE:COL: message" + "  fix: …") into dicts."""
    errors: list[dict] = []
    for line in stderr.splitlines():
        m = ERROR_HEAD.match(line)
        if m:
            loc = m.group("loc")
            if loc and not loc.startswith("--"):
                file, *nums = loc.split(":")
                nums = [int(n) for n in nums]
            else:
                file, nums = loc, []
            errors.append({"file": file, "line": nums[0] if nums else None,
                           "col": nums[1] if len(nums) > 1 else None, "message": m.group("message"), "fix": None})
        elif line.startswith("  fix: ") and errors:
            errors[-1]["fix"] = line[len("  fix: "):]
    return errors


# --------------------------------------------------------------------------- baseline


def test_copied_stacks_lint_clean(tmp_path, capsys):
    rc, out, err = run_cli(capsys, make_root(tmp_path), "lint")
    assert (rc, err) == (0, "")
    assert out.splitlines() == ["post1: ok", "post2: ok"]


def test_parse_errors_reads_locations():
    text = ("error: stacks/a.yaml:4:11: platform.python: 3.10 was read as a number\n  fix: quote it\n"
            "error: --set foo: an override must look like key.path=value\n  fix: e.g. x=y\n"
            "error: no stack named 'x'\n")
    assert parse_errors(text) == [
        {"file": "stacks/a.yaml", "line": 4, "col": 11, "message": "platform.python: 3.10 was read as a number",
         "fix": "quote it"},
        {"file": "--set foo", "line": None, "col": None, "message": "an override must look like key.path=value",
         "fix": "e.g. x=y"},
        {"file": None, "line": None, "col": None, "message": "no stack named 'x'", "fix": None},
    ]


@pytest.mark.parametrize("name", REAL_STACKS)
def test_real_stacks_are_copied_verbatim(tmp_path, name):
    root = make_root(tmp_path)
    assert (root / "stacks" / name).read_bytes() == (STACKS / name).read_bytes()
