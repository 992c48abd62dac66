"""Where stacks live and what a stack is called: the repository root, ``stacks/``, the name grammar.

Kept free of the model and the YAML loader, so a command that only names stacks (``stackforge list``
from its cache, ``--set STACK:`` scopes) imports neither.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from stackforge.errors import UserError

STACKS_DIR = "stacks"

#: A stack is named by its file in stacks/ without ".yaml": one path segment, lowercase.
STACK_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")


def find_root(start: Path | None = None) -> Path:
    """The repository root: the nearest directory upwards holding stacks/."""
    env = os.environ.get("STACKFORGE_ROOT")
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / STACKS_DIR).is_dir():
            return cand
    raise UserError(
        f"no {STACKS_DIR}/ directory here or in any parent of {here}",
        fix="run stackforge inside a stackforge repository, or pass --root DIR",
    )


def list_stacks(root: Path) -> list[str]:
    """The stem of every stacks/*.yaml, valid stack name or not (loading one that is not says why)."""
    return sorted(p.stem for p in (root / STACKS_DIR).glob("*.yaml"))
