"""The commit this stackforge was built from, for ``stackforge --version``.

A wheel or an sdist carries ``stackforge/_build_info.py``, written by setup.py when it is built: the commit of
the git checkout it was built from (``-dirty`` when the package's files differed from it), or, for a wheel built
from an sdist, the commit the sdist was made from, or ``unknown`` when neither was known. An editable install
(a developer's checkout) has no such file: its commit is asked of git in the checkout, as it is now.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

UNKNOWN = "unknown"
#: what setup.py compares with the commit: the files that make the package
BUILD_PATHS = ("tools", "pyproject.toml", "setup.py")
_COMMIT_RE = re.compile(r"[0-9a-f]{40}(-dirty)?")


def commit() -> str:
    """``<40 hex>``, ``<40 hex>-dirty`` or ``unknown``."""
    try:
        recorded = getattr(importlib.import_module("stackforge._build_info"), "COMMIT", None)
    except ImportError:
        recorded = None
    if isinstance(recorded, str):
        return recorded if _COMMIT_RE.fullmatch(recorded) else UNKNOWN
    return checkout_commit(Path(__file__).resolve().parents[2]) or UNKNOWN


def checkout_commit(root: Path) -> str | None:
    """The commit of the git checkout ``root`` (when ``root`` is the top of one), ``-dirty`` when a file of the
    package differs from it or is not tracked; None outside a checkout or without git. Writes nothing (no index
    refresh), so a read-only or shared checkout is left as it is."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None
        head = git("rev-parse", "--verify", "HEAD^{commit}")
        changed = git("status", "--porcelain", "--", *BUILD_PATHS)
    except (OSError, subprocess.SubprocessError):
        return None
    if not re.fullmatch(r"[0-9a-f]{40}", head):
        return None
    return head + ("-dirty" if changed else "")


def describe(version: str) -> str:
    """The line ``stackforge --version`` prints."""
    found = commit()
    if found == UNKNOWN:
        return f"stackforge {version} (commit unknown: built outside a git checkout)"
    return f"stackforge {version} (commit {found})"
