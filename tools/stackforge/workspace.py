"""Where stackforge keeps its caches on the host.

Every cache lives in one base directory: ``$STACKFORGE_CACHE`` when set, else
``<root>/build/cache`` inside the repository, else ``~/.cache/stackforge``
(``$XDG_CACHE_HOME/stackforge`` when that is set). Each kind of cache is a
subdirectory of it:

- ``git/`` and ``sdist/``: the upstream cache (bare mirrors, downloaded sdists);
  ``build.sources`` takes the base itself (``kind=""``) and adds these below it
- ``layers/``: the publisher's diff-id → blob cache
- ``index/``: package index pages, revalidated with ETag / Last-Modified
- ``wheels/``: wheels downloaded by ``stackforge wheel``
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "STACKFORGE_CACHE"


def cache_dir(root: Path | None, kind: str) -> Path:
    """The cache directory of ``kind`` (``""``: the base directory) for the repository at ``root``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        base = Path(env)
    elif root is not None:
        base = Path(root) / "build" / "cache"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stackforge"
    return base / kind if kind else base
