"""The commit this stackforge was built from, for ``stackforge --version``.

A wheel or an sdist carries ``stackforge/_build_info.py``, written by setup.py when it is built: the commit of
the git checkout it was built from (``-dirty`` when the package's files differed from it), or, for a wheel built
from an sdist, the commit the sdist was made from, or ``unknown`` when neither was known. An editable install
(a developer's checkout) has no such file: the CLI asks git in the checkout instead
(:func:`stackforge.clients.git.checkout_commit`).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

UNKNOWN = "unknown"
#: what a build's commit is compared with: the files that make the package (setup.py's list too)
BUILD_PATHS = ("tools", "pyproject.toml", "setup.py")
#: where an editable install's checkout would be: tools/stackforge/buildinfo.py → the repository
CHECKOUT = Path(__file__).resolve().parents[2]
COMMIT_RE = re.compile(r"[0-9a-f]{40}(-dirty)?")


def recorded() -> str | None:
    """The commit the build recorded (``unknown`` when it recorded something else); None without a record."""
    try:
        value = getattr(importlib.import_module("stackforge._build_info"), "COMMIT", None)
    except ImportError:
        return None
    if not isinstance(value, str):
        return None
    return value if value == UNKNOWN or COMMIT_RE.fullmatch(value) else UNKNOWN


def describe(version: str, commit: str | None) -> str:
    """The line ``stackforge --version`` prints."""
    if not commit or commit == UNKNOWN:
        return f"stackforge {version} (commit unknown: built outside a git checkout)"
    return f"stackforge {version} (commit {commit})"
