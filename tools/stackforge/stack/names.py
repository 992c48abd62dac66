"""Where stacks live and what a stack is called: ``stacks/`` (found from the root, see ``clients.workspace``), the name grammar.

Kept free of the model and the YAML loader, so a command that only names stacks (``stackforge list``
from its cache, ``--set STACK:`` scopes) imports neither.
"""

from __future__ import annotations

import re
from pathlib import Path

from stackforge.clients.workspace import STACKS_DIR
from stackforge.clients.workspace import find_root as find_root  # the root is found where the caches are

#: A stack is named by its file in stacks/ without ".yaml": one path segment, lowercase.
STACK_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
#: stacks/waivers.yaml holds the repository's vulnerability waivers (builder/records/waivers.py), not a stack
WAIVERS = "waivers.yaml"
RESERVED = {WAIVERS.removesuffix(".yaml")}
#: A file an image or a publish record carries as one of its stack files (a stack, a parent, the overrides):
#: a plain name in stacks/, never a path.
STACK_FILE = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}\.(?:yaml|json)")


def list_stacks(root: Path) -> list[str]:
    """The stem of every stacks/*.yaml but the waivers file, valid stack name or not (loading one that is not
    says why)."""
    return sorted(p.stem for p in (root / STACKS_DIR).glob("*.yaml") if p.name != WAIVERS)
