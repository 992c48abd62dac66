"""The command line's own options and the paths it is given: one clear line and exit 2, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import stackforge

REPO = Path(__file__).resolve().parents[2]


def sf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stackforge", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_version():
    """The version and the commit (this editable install: the checkout's; tests/unit/test_install_extras.py)."""
    proc = sf("--version")
    assert proc.returncode == 0
    assert re.fullmatch(
        rf"stackforge {re.escape(stackforge.__version__)} \(commit [0-9a-f]{{40}}(-dirty)?\)\n", proc.stdout
    )


CASES = [
    (
        "root-missing",
        ["--root", "/nonexistent/repo", "list"],
        "error: --root: no such directory: /nonexistent/repo",
        "the one holding stacks/",
    ),
    (
        "root-without-stacks",
        ["--root", "{tmp}", "show", "post2"],
        "error: --root: {tmp} has no stacks/ directory",
        "the one holding stacks/",
    ),
    (
        "render-out-cannot-be-made",
        ["render", "example", "--no-sources", "--out", "/proc/stackforge-out"],
        "error: cannot use /proc/",
        "parent directory must exist",
    ),
    (
        "render-out-is-a-file",
        ["render", "example", "--no-sources", "--out", "{tmp}/file"],
        "error: cannot use {tmp}/file: it exists and is not a directory",
        "name a directory",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_unusable_paths_are_one_clear_error(case, tmp_path):
    _, args, head, fix = case
    (tmp_path / "file").write_text("not a directory\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = sf(*args)
    assert proc.returncode == 2, proc.stderr
    first, second = proc.stderr.splitlines()[:2]
    assert first.startswith(head.replace("{tmp}", str(tmp_path))), proc.stderr
    assert second.startswith("  fix: ") and fix in second
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written
