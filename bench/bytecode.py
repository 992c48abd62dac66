"""Run stackforge as an installed copy runs: from byte-compiled modules.

``pip install`` byte-compiles a package, and the peers the benchmarks compare with (pip) run from their
installed ``__pycache__``. A checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (as CI and this machine set
it) would instead compile every stackforge module from source in every process, which measures the
compiler, not stackforge. So the benchmarks copy ``tools/stackforge`` into a scratch directory, byte-compile
it there (the checkout gets no ``__pycache__``) and run stackforge from that copy.
"""

from __future__ import annotations

import compileall
import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"


def compiled_env(scratch: Path) -> dict[str, str]:
    """The environment of a stackforge process that imports a byte-compiled copy of the package in ``scratch``."""
    site = scratch / "site"
    shutil.copytree(TOOLS / "stackforge", site / "stackforge", ignore=shutil.ignore_patterns("__pycache__"))
    if not compileall.compile_dir(str(site), quiet=1):
        raise SystemExit(f"byte-compiling {site} failed")
    return {**os.environ, "PYTHONPATH": str(site)}
