"""Work a rebuild can skip because its inputs are proven unchanged.

Two skips, each keyed by a fingerprint and checked before anything is reused:

- **An upstream's exported, patched tree.** Exporting an upstream (sdist extraction or ``git archive``),
  applying its patch series and its edits is the same work for the same inputs. The inputs fingerprint
  (:func:`upstream_inputs`) covers the upstream's declaration, the bytes of every patch it gets (its own
  series and, through ``patches_from``, the carrying upstream's inputs), and the code that exports and
  patches. The record beside the build context (``build/<stack>/.sources/<name>.json``) holds that
  fingerprint, a content digest of the resulting tree and its ``SourceInfo``. The tree of the previous
  context is reused (hard-linked into the new context, so BuildKit sees unchanged files) only when the
  fingerprint matches *and* the tree still has the recorded digest; otherwise it is exported again.
- **What the build left in the image** (gate reports, target checks, the inventory, the system record).
  They are read with one container run and recorded under the image id (``build/<stack>/.image/<id>.json``)
  with the inputs fingerprint; an image id is a digest of the image's config and layers, so a rebuild
  that yields the same id with the same inputs reads the record instead of starting a container.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stackforge.builder.sources.contextfiles import normalize_tree
from stackforge.builder.sources.sources import SourceInfo
from stackforge.digests import code_fingerprint, tree_digest
from stackforge.errors import UserError
from stackforge.fslock import atomic_write
from stackforge.patches import series_hash
from stackforge.stack.load import LoadedStack

#: bump when the layout of a record or the meaning of a fingerprint changes
VERSION = 3  # 3: the image records carry dpkg.txt
SOURCES = ".sources"
IMAGES = ".image"
#: the code whose behaviour shapes an exported tree
_EXPORT_CODE = (
    "clients/upstream.py",
    "clients/submodules.py",
    "builder/plan/edits.py",
    "builder/plan/installed.py",
    "builder/context/context.py",
    "builder/sources/contextfiles.py",
    "patches",
)


def _code_digest() -> str:
    """The fingerprint of the export code only: a change elsewhere in stackforge keeps the trees."""
    return code_fingerprint(within=_EXPORT_CODE)


def upstream_inputs(loaded: LoadedStack, name: str, _seen: frozenset[str] = frozenset()) -> str:
    """sha256 over everything upstream ``name``'s exported, patched tree is made from."""

    up = loaded.model.upstreams[name]
    doc: dict[str, Any] = {"version": VERSION, "code": _code_digest(), "upstream": up.model_dump(mode="json")}
    if up.patches:
        doc["patches"] = series_hash(loaded.root / up.patches)
    if up.patches_from and up.patches_from.upstream not in _seen:  # the carried series is read from that tree
        doc["carried"] = upstream_inputs(loaded, up.patches_from.upstream, _seen | {name})
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def exported(
    loaded: LoadedStack,
    name: str,
    staging: Path,
    previous: Path,
    export: Callable[[Path], SourceInfo],
    *,
    refresh: bool = False,
) -> SourceInfo:
    """Upstream ``name``'s tree at ``staging/src/<name>`` and its SourceInfo: the previous context's tree
    (``previous/src/<name>``) when its record proves it was made from the same inputs and is unchanged, else
    ``export(dest)``; either way the record is (re)written."""
    dest = staging / "src" / name
    record_path = previous.parent / SOURCES / f"{name}.json"
    try:
        inputs = upstream_inputs(loaded, name)
    except UserError:  # e.g. a patch directory without a series: the export says so, at the stack key
        return export(dest)
    old = previous / "src" / name
    if not refresh and old.is_dir() and record_path.is_file():
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("inputs") == inputs and tree_digest(old) == record.get("tree"):
            shutil.copytree(old, dest, symlinks=True, copy_function=os.link)
            return SourceInfo(**record["info"])
    info = export(dest)
    normalize_tree(dest, mtime=None)  # the tree recorded is the one the context holds: the context's modes
    record_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(
        record_path, json.dumps({"inputs": inputs, "tree": tree_digest(dest), "info": asdict(info)}, indent=2) + "\n"
    )
    return info


# --------------------------------------------------------------------------- what the build left in the image


def image_files(
    image_id: str | None, inputs: str | None, build_dir: Path, read: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """The records the build left in the image ``image_id``: from ``build_dir/.image/<id>.json`` when that record
    was read from the same image id with the same inputs fingerprint, else ``read()`` (one container run),
    recorded for the next build."""
    if not image_id or not inputs:
        return read()
    path = build_dir / IMAGES / f"{image_id.removeprefix('sha256:')}.json"
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("version") == VERSION and record.get("image") == image_id and record.get("inputs") == inputs:
            return record["files"]
    files = read()
    if files:
        for stale in (build_dir / IMAGES).glob("*.json"):  # one image's record is kept: the newest
            stale.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(
            path, json.dumps({"version": VERSION, "image": image_id, "inputs": inputs, "files": files}, indent=2) + "\n"
        )
    return files
