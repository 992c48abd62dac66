"""The parts of stackforge an operator's install leaves out: a builder's verb that needs one names the extra.

``pip install stackforge`` installs what the operator's verbs need (pull, verify, sbom, scan, history, copy);
``stackforge[lock]`` adds uv (`stackforge lock`), ``stackforge[zstd]`` zstandard (`publish --compression zstd`).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from stackforge.errors import UserError

#: each extra and what it brings (pyproject.toml's optional dependencies)
EXTRAS = {"lock": "uv>=0.13", "zstd": "zstandard>=0.22"}


def install_hint(extra: str) -> str:
    """The command that adds ``extra`` to the Python stackforge runs from (and its pipx spelling)."""
    return (
        f"{sys.executable} -m pip install 'stackforge[{extra}]' "
        f"(installed with pipx: pipx inject stackforge '{EXTRAS[extra]}')"
    )


def need(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or one clear error: ``what`` needs the extra, and the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"{what} needs the Python package {module!r}, which stackforge's own install leaves out",
            fix=f"install the extra: {install_hint(extra)}",
        ) from None
