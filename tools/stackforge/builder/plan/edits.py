"""In-place source fixes of an exported upstream tree (``upstreams.<name>.edits``), applied on the host.

Each edit names a file of the tree, the exact text to replace and its replacement. The text must occur
exactly once in the pinned, patched tree: a fix written for another release fails the build, naming the
stack key, instead of silently doing nothing or changing a second place.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from stackforge.errors import UserError
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack

LABEL = "org.stackforge.edits"


def digest(stack: Stack, name: str) -> str | None:
    """sha256 of the upstream's declared edits (None when it has none): the label that records them."""
    edits = stack.upstreams[name].edits
    if not edits:
        return None
    blob = json.dumps([e.model_dump() for e in edits], sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def apply(loaded: LoadedStack, name: str, tree: Path) -> list[str]:
    """Apply the edits of upstream ``name`` to its exported ``tree``; the files changed, in order."""
    up = loaded.model.upstreams[name]
    pin = up.pin if up.git else name
    root = tree.resolve()
    changed = []
    for i, edit in enumerate(up.edits):
        key = f"upstreams.{name}.edits[{i}]"
        where = loaded.position(("upstreams", name, "edits", i)).as_error_kwargs()
        path = tree / edit.path
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(root):
            raise UserError(
                f"{key}: {edit.path} is not a file of upstream {name} at {pin}",
                **where,
                fix="name a file the pinned tree has (the path is relative to the tree)",
            )
        text = path.read_text(encoding="utf-8")
        count = text.count(edit.old)
        if count != 1:
            seen = "does not occur" if count == 0 else f"occurs {count} times"
            raise UserError(
                f"{key}: the text to replace {seen} in {edit.path} of upstream {name} at {pin}",
                **where,
                fix="update the edit for this release (old must match exactly once), or drop "
                "it if the release carries the fix",
            )
        path.write_text(text.replace(edit.old, edit.new), encoding="utf-8")
        changed.append(edit.path)
    return changed
