"""``stackforge verify REF --rebuild``: build the published image again from its record and compare.

The record names everything the build took: the stack files as loaded, the ``--set`` values, the target, and (in
its labels) the upstream pins and patch series. The rebuild writes those stack files over a copy of the
checkout's ``stacks/`` (locks, other stacks) in a scratch repository whose other top-level entries (patches,
recipes, …; its fetch cache) are the checkout's own, builds the record's target there with ``--no-cache`` by
default, and prepares the result as the publisher does (normalized, ``publish/oci.py``) without pushing
anything. Then:

- the same config digest is the same image (the config names every layer's diff id): ``identical``;
- otherwise the first differing layer is named with its step (the history's ``created_by``), and its files are
  compared with the published layer read from the engine's layer store after the pull (``publish/layerdiff.py``):
  the first file and field (type, content, link, mode, owner, time) that differ; then the first config key.

The local tag the record's stack names is put back as it was, whether the rebuild compared, failed or was
interrupted; the rebuilt image is removed. Rebuilds in one process that would move the same local tag (two images
of an index whose stack has no line of the second one's platform: both rebuild as written) take turns; those of
different tags (an index's lines: the arm64 line's ends in ``-arm64``) run at once, each in its own scratch
repository, build directory and cache mounts.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stackforge.builder.context.embed import stack_file_name
from stackforge.builder.run.run import BuildOptions, build, target_ref
from stackforge.clients import layerstore
from stackforge.clients.engine import Engine
from stackforge.clients.registry import RegistryClient, RegistryError
from stackforge.errors import UserError, printable
from stackforge.publish import layerdiff, record
from stackforge.publish.codec import OCI_LAYER_ZSTD
from stackforge.publish.oci import ChunkReader, DockerImage, PreparedImage, uncompressed
from stackforge.publish.record_schema import PublishRecord
from stackforge.safeio import write_confined
from stackforge.stack.load import load
from stackforge.stack.names import STACKS_DIR
from stackforge.stack.resolved import ResolvedStack

Line = tuple[bool, str]
#: top-level entries of a checkout the scratch repository does not take
_NOT_TAKEN = {".git", "build", STACKS_DIR}


def scratch_root(rec: PublishRecord, checkout: Path, into: Path) -> Path:
    """A repository at ``into``: the checkout's ``stacks/`` with the record's stack files written over it, and
    every other top-level entry of the checkout linked."""
    if not (checkout / STACKS_DIR).is_dir():
        raise UserError(
            f"{checkout} has no {STACKS_DIR}/: --rebuild runs in a checkout of the repository that built the image",
            file="--root",
            fix="run it from that checkout (or give --root DIR)",
        )
    into.mkdir(parents=True)
    shutil.copytree(checkout / STACKS_DIR, into / STACKS_DIR, symlinks=True)
    for name, entry in rec.stack_files.items():
        if entry.text is None:
            raise UserError(f"the record carries no text of {printable(name)}: nothing to rebuild from", file="REF")
        # The record's names are plain file names (the schema says so); written only under stacks/, never through
        # a link that a checkout's stacks/ may hold.
        write_confined(into / STACKS_DIR, stack_file_name(name, "REF"), entry.text, what="stack file", source="REF")
    for path in checkout.iterdir():
        if path.name not in _NOT_TAKEN:
            (into / path.name).symlink_to(path.resolve())
    cache = checkout / "build" / "cache"
    if cache.is_dir():  # the checkout's fetched upstreams and sdists (STACKFORGE_CACHE, when set, wins anyway)
        (into / "build").mkdir()
        (into / "build" / "cache").symlink_to(cache.resolve())
    return into


def rebuild(
    rec: PublishRecord,
    checkout: Path,
    client: RegistryClient,
    digest: str,
    manifest: dict[str, Any],
    engine: Engine,
    *,
    no_cache: bool = True,
    echo: Callable[[str], None] | None = None,
) -> list[Line]:
    """Rebuild the image ``rec`` describes and compare it with the published one (manifest ``digest`` and its
    document ``manifest``, already pulled into ``engine``); the verify lines. The stack's platform line of the
    published image's platform (its config's OS and architecture) is rebuilt: an index's arm64 image as the arm64
    line, for linux/arm64."""
    try:
        config = client.config_of(manifest)
    except RegistryError as exc:
        return [(False, f"rebuild the published image's config cannot be read: {printable(exc)}")]
    with tempfile.TemporaryDirectory(prefix="stackforge-rebuild-") as tmp:
        work = Path(tmp)
        root = scratch_root(rec, checkout, work / "repo")
        loaded = ResolvedStack.of(load(rec.stack, root=root, overrides=[str(o) for o in rec.overrides]))
        platform = f"{config.get('os') or 'linux'}/{config.get('architecture') or ''}"
        try:
            loaded = loaded.for_platform(platform)
        except UserError:
            pass  # a stack without a line of that platform rebuilds as written; the comparison says what differs
        ref = target_ref(loaded, rec.target)
        opts = BuildOptions(target=rec.target, no_cache=no_cache, out=work / "build", keep_builds=1)
        with tag_lock(ref):
            before = engine.image_id(ref)
            rebuilt: str | None = None
            try:
                outcome = build(loaded, opts, engine=engine, echo=echo)
                rebuilt = outcome.image_id
                image = DockerImage(ref, engine, image_id=outcome.image_id)
                prepared = image.prepare(work / "prepare", compression=_codec(manifest), log=lambda *a, **k: None)
                return compare(prepared, digest, manifest, config, engine, built_on=rec.image_store)
            finally:
                # a failed or interrupted build has dropped a tag it moved; the one before is put back
                _restore(engine, ref, before, rebuilt)


_tag_locks: dict[str, threading.Lock] = {}
_tag_locks_guard = threading.Lock()


def tag_lock(ref: str) -> threading.Lock:
    """The lock a rebuild of this process holds while it moves the local tag ``ref`` and puts it back."""
    with _tag_locks_guard:
        return _tag_locks.setdefault(ref, threading.Lock())


def _codec(manifest: dict[str, Any]) -> str:
    layers = manifest.get("layers") or []
    return "zstd" if any(layer.get("mediaType") == OCI_LAYER_ZSTD for layer in layers) else "gzip"


def _restore(engine: Engine, ref: str, before: str | None, rebuilt: str | None) -> None:
    if before is not None and before != rebuilt:
        engine.tag(before, ref)
    if rebuilt is not None and rebuilt != before:
        engine.discard_image(rebuilt, prune=False)
        if before is None:
            engine.discard_image(ref)


def compare(
    ours: PreparedImage,
    digest: str,
    manifest: dict[str, Any],
    theirs_config: dict[str, Any],
    engine: Engine,
    *,
    built_on: str | None = None,
) -> list[Line]:
    """The verify lines of the rebuilt image ``ours`` against the published manifest (``digest``, ``manifest``)
    and its config; ``built_on``: the image store the record says the published image was built in, named when
    a differing rebuild ran in the other one."""
    published = manifest["config"]["digest"]
    if ours.image_id == published:
        same = "and the same manifest" if ours.digest == digest else "compressed otherwise: another manifest"
        return [(True, f"rebuild identical: config {published}, {len(ours.layers)} layers ({same})")]
    assert ours.config.data is not None
    ours_config = json.loads(ours.config.data)
    ours_ids, theirs_ids = _diff_ids(ours_config), _diff_ids(theirs_config)
    lines: list[Line] = [(False, f"rebuild differs: config {ours.image_id} rebuilt, {published} published")]
    i = layerdiff.first_layer(ours_ids, theirs_ids)
    if i is not None:
        lines.append((False, _layer_line(i, ours, ours_ids, theirs_ids, theirs_config, engine)))
    key = layerdiff.first_config_key(ours_config, theirs_config)
    if key is not None:
        lines.append((False, f"rebuild config {key[0]}: rebuilt {key[1]!r}, published {key[2]!r}"))
    here = record.image_store(engine) if built_on is not None else None  # one `docker info`, only when it can matter
    if here is not None and built_on != here:
        lines.append((False, f"rebuild ran in the {here} image store, the image was built in the {built_on} one: the "
                             f"two write different layers for one build; rebuild on a host of the {built_on} store "
                             "to compare like with like"))  # fmt: skip
    return lines


def _diff_ids(config: dict[str, Any]) -> list[str]:
    return list((config.get("rootfs") or {}).get("diff_ids") or [])


def _step(config: dict[str, Any], index: int) -> str:
    """The build step (history ``created_by``) that made layer ``index``."""
    steps = [h for h in config.get("history") or [] if isinstance(h, dict) and not h.get("empty_layer")]
    return str(steps[index].get("created_by", "?"))[:160] if index < len(steps) else "?"


def _layer_line(
    i: int, ours: PreparedImage, ours_ids: list[str], theirs_ids: list[str], config: dict[str, Any], engine: Engine
) -> str:
    head = f"rebuild layer {i} ({_step(config, i)})"
    if i >= len(ours_ids) or i >= len(theirs_ids):
        return f"{head}: {len(ours_ids)} layers rebuilt, {len(theirs_ids)} published"
    try:
        store = layerstore.open_store(engine)
        chain = layerstore.chain_ids(theirs_ids)[i]
        with uncompressed(ours.layers[i]) as mine:
            rebuilt = layerdiff.entries(mine)
        with io.BufferedReader(ChunkReader(store.layer(theirs_ids[i], chain).chunks())) as published:
            theirs = layerdiff.entries(published)
    except layerstore.Unusable as exc:
        return f"{head}: diff id {ours_ids[i]} rebuilt, {theirs_ids[i]} published (files not compared: {exc})"
    diff = layerdiff.first_entry(rebuilt, theirs)
    return f"{head}: " + (diff.describe() if diff else "the same files in another layout")
