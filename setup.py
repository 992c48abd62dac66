"""The build's one hook: the commit a wheel or an sdist is built from, recorded in the package.

Everything else is in pyproject.toml. ``stackforge/_build_info.py`` (read by ``stackforge --version``, see
tools/stackforge/buildinfo.py) is written into the build, never into the source tree: from the git checkout the
build runs in; for a wheel built from an sdist (no git), the file the sdist carries is kept; else ``unknown``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
MODULE = Path("stackforge", "_build_info.py")


#: the files that make the package (tools/stackforge/buildinfo.py's BUILD_PATHS)
BUILD_PATHS = ("tools", "pyproject.toml", "setup.py")


def _checkout_commit(root: Path) -> str | None:
    """The commit of the git checkout whose top is ``root`` (``-dirty`` when a file under BUILD_PATHS differs from
    it or is untracked); None outside one. As stackforge.clients.git.checkout_commit, which the package uses: this
    file runs before the package can be imported. Writes nothing (no index refresh)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60, check=True, env=env
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None
        head = git("rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        changed = git("status", "--porcelain", "--", *BUILD_PATHS)
    except (OSError, subprocess.SubprocessError):
        return None
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        return None
    return head + ("-dirty" if changed else "")


def _write(path: Path, commit: str, source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # an sdist's release tree hard-links the source's files: never write through one
    path.write_text(
        f'"""Written by setup.py when this package was built ({source})."""\n\nCOMMIT = {commit!r}\n',
        encoding="utf-8",
    )


def _recorded(path: Path) -> str | None:
    """The commit an earlier build recorded at ``path`` (an sdist's copy), if any: its ``COMMIT = '…'`` line."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COMMIT"]:
            value = node.value
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    return None


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install asks git in its checkout at run time
        target = Path(self.build_lib, MODULE)
        commit = _checkout_commit(ROOT)
        if commit:
            _write(target, commit, "a git checkout")
        elif _recorded(target) is None:  # not from an sdist that says its commit
            _write(target, "unknown", "outside a git checkout")


class Sdist(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        target = Path(base_dir, "tools", MODULE)
        commit = _checkout_commit(ROOT) or _recorded(ROOT / "tools" / MODULE) or "unknown"
        _write(target, commit, "a git checkout" if commit != "unknown" else "outside a git checkout")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
