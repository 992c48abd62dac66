"""A local image as an OCI image: upload-ready blobs and an OCI image manifest.

An image comes from a ``docker save`` archive on disk (:class:`ArchiveImage`) or from the engine,
streamed by image id (:class:`DockerImage`); either flavour of ``docker save`` (legacy or OCI
layout) is read in one streaming pass by :func:`read_save_stream`. Uncompressed layers are
gzip-compressed deterministically (mtime 0, no name: the same layer gives the same blob), already
compressed ones are kept as they are, and every layer is checked against the config's diff ids.
A :class:`LayerCache` maps a layer's diff id to its compressed blob, so a layer the registry
already holds is not compressed again. The result is a :class:`PreparedImage`: config, layers
and the manifest whose digest the publisher pushes.

An image built by stackforge names its layer epoch (label ``org.stackforge.epoch``): each of its layers is
then rewritten by ``normalize.py`` before it is compressed (times clamped to the epoch, owners' names and pax
times dropped, entries sorted) and its config rewritten to match (:func:`normalized_config`: the new diff ids,
every ``created`` time the image's ``org.opencontainers.image.created`` or the epoch), so two builds of the same
inputs publish the same digests. The published image id (its config digest) is then not the local one:
:attr:`PreparedImage.source_id` keeps the local image's. Other images are published as they are.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import queue
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol, cast

from stackforge import extras, signals
from stackforge.builder.plan.plan import BASE_LAYERS_LABEL, EPOCH_LABEL
from stackforge.clients import contentstore, layerstore
from stackforge.clients.engine import Engine, NoSuchImage, platform_of
from stackforge.clients.registry import OCI_MANIFEST, sha256_digest
from stackforge.errors import BuildFailed, UserError
from stackforge.fslock import atomic_write
from stackforge.grammar import DIGEST_RE
from stackforge.publish.codec import OCI_LAYER_GZIP, OCI_LAYER_ZSTD, Codec, codec, default_key
from stackforge.publish.normalize import OutOfOrder, normalize, stream

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20
_SMALL_JSON = 64 << 20
_OCI_BLOB = re.compile(r"blobs/sha256/([0-9a-f]{64})")
_OCI_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_CREATED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@dataclass
class Blob:
    digest: str
    size: int
    media_type: str
    path: Path | None = None
    data: bytes | None = None
    diff_id: str | None = None
    remote: bool = False  # not exported again: the registry already held it (see LayerCache)
    #: the diff id of the local layer it was made from, when normalizing made it another (see LayerCache)
    source_diff_id: str | None = None

    @property
    def cache_key(self) -> str | None:
        """The id the layer cache knows this blob by: the local layer's diff id."""
        return self.source_diff_id or self.diff_id

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        if self.path is None:
            raise BuildFailed(
                f"layer {self.digest} vanished from the registry during the publish; no tag was created",
                fix="re-run the publish (it will upload the layer)",
            )
        return open(self.path, "rb")

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass
class PreparedImage:
    image_id: str
    config: Blob
    layers: list[Blob]
    manifest: bytes = b""
    manifest_media_type: str = OCI_MANIFEST
    #: the local image's id, when its layers and config were normalized (then ``image_id``, the config digest a
    #: pull gives, is another); None when the image is published as it is
    source_id: str | None = None

    def __post_init__(self) -> None:
        if not self.manifest:
            self.manifest = build_manifest(self.config, self.layers)

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest)

    def unique_blobs(self) -> list[Blob]:
        seen: dict[str, Blob] = {}
        for b in [self.config, *self.layers]:
            seen.setdefault(b.digest, b)
        return list(seen.values())

    @property
    def size(self) -> int:
        """Bytes stored in the registry for this image: manifest + config + distinct layers."""
        return len(self.manifest) + sum(b.size for b in self.unique_blobs())


def build_manifest(config: Blob, layers: list[Blob]) -> bytes:
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.descriptor() for layer in layers],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Normalizing:
    """How an image's layers and config are normalized: file times clamped to ``epoch``, every ``created`` set to
    ``created`` (RFC 3339)."""

    epoch: int
    created: str
    #: the base image's layers, first in the image: published as they are (the base's own blobs)
    keep: int = 0

    def of(self, index: int) -> Normalizing | None:
        """How layer ``index`` is normalized: None for a base image's layer."""
        return None if index < self.keep else self

    @property
    def key(self) -> str:
        """Names the epoch in the layer cache: a layer normalized at another epoch is another blob."""
        return f"sde{self.epoch}"


def normalizing(config: bytes) -> Normalizing | None:
    """The normalization an image's config asks for (its ``org.stackforge.epoch`` label), or None."""
    try:
        labels = (json.loads(config).get("config") or {}).get("Labels") or {}
    except (ValueError, AttributeError):
        return None
    epoch = str(labels.get(EPOCH_LABEL) or "")
    if not epoch.isdigit():
        return None
    created = str(labels.get("org.opencontainers.image.created") or "")
    if not _CREATED.fullmatch(created):
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
    keep = str(labels.get(BASE_LAYERS_LABEL) or "0")
    return Normalizing(int(epoch), created, int(keep) if keep.isdigit() else 0)


def normalized_config(config: bytes, diff_ids: list[str], norm: Normalizing) -> bytes:
    """``config`` with the normalized layers' diff ids and every creation time (the image's and each history
    entry's) set to ``norm.created``; written with sorted keys, so the same content gives the same bytes."""
    doc = json.loads(config)
    doc["rootfs"]["diff_ids"] = diff_ids
    doc["created"] = norm.created
    for entry in doc.get("history") or []:
        if isinstance(entry, dict) and "created" in entry:
            entry["created"] = norm.created
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def normalize_layer(
    reopen: Callable[[], IO[bytes]], path: Path, packer: Codec, norm: Normalizing, pool: ThreadPoolExecutor | None
) -> Blob:
    """Normalize the layer tar ``reopen()`` gives and compress it to ``path``: its blob (``diff_id``: the normalized
    tar's). One pass, piped into the compressor, when the layer is in walk order (``normalize.stream``); else it is
    read again and sorted through a spool."""

    def streamed(out: IO[bytes]) -> None:
        with reopen() as src:
            stream(src, out, norm.epoch)

    def sorted_(out: IO[bytes]) -> None:
        with reopen() as src:
            normalize(src, out, norm.epoch, spool=path.parent)

    try:
        return _piped(streamed, path, packer, pool)
    except OutOfOrder:
        return _piped(sorted_, path, packer, pool)


def _piped(produce: Callable[[IO[bytes]], None], path: Path, packer: Codec, pool: ThreadPoolExecutor | None) -> Blob:
    """Compress to ``path`` what ``produce`` writes (``produce`` runs in a thread, its writes handed over in 1 MiB
    pieces); ``produce``'s exception is raised here, after the compressor has seen the end of what it wrote."""
    handoff = _Handoff()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with io.BufferedWriter(handoff, _CHUNK) as out:
                produce(cast(IO[bytes], out))
        except BaseException as exc:  # handed to the caller below
            failed.append(exc)
        finally:
            handoff.end()

    producer = threading.Thread(target=run, name="normalize", daemon=True)
    producer.start()
    try:
        with open(path, "wb") as out:
            writer = _HashingWriter(out)
            diff_id = packer.compress_chunks(handoff.pieces(), writer.write, pool=pool)
    finally:
        handoff.stop()
        producer.join()
    if failed:
        raise failed[0]
    return Blob("sha256:" + writer.hash.hexdigest(), writer.size, packer.media_type, path, diff_id=diff_id)


class _Handoff(io.RawIOBase):
    """Byte pieces from a writing thread to a reading one through a bounded queue: :meth:`write` (the producer)
    blocks while ``DEPTH`` pieces wait, :meth:`pieces` (the consumer) yields them until :meth:`end`. Once the
    consumer calls :meth:`stop`, a write raises ``BrokenPipeError`` (as a pipe's write end would), so a producer
    never waits for a reader that has gone."""

    DEPTH = 8

    def __init__(self) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(self.DEPTH)
        self._stopped = threading.Event()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        if data:
            self._put(data)
        return len(data)

    def end(self) -> None:
        """No more pieces (the producer is done, or failed)."""
        try:
            self._put(None)
        except BrokenPipeError:
            pass

    def stop(self) -> None:
        """The consumer has stopped reading: writes from now on fail."""
        self._stopped.set()

    def _put(self, item: bytes | None) -> None:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=signals.POLL)
                return
            except queue.Full:
                continue
        raise BrokenPipeError("the compressor stopped reading")

    def pieces(self) -> Iterator[bytes]:
        while (item := self._queue.get()) is not None:
            yield item


class ImageSource(Protocol):
    """Where the image comes from. ``image_id`` may be None until ``prepare`` ran."""

    image_id: str | None
    local_size: int | None

    @property
    def description(self) -> str: ...

    def prepare(
        self,
        workdir: Path,
        *,
        compression: str,
        log: Callable[..., None],
        cache: LayerCache | None = None,
        level: int | None = None,
        sink: Callable[[Blob], object] | None = None,
    ) -> PreparedImage: ...


@dataclass
class LayerCache:
    """Remembers diff_id → compressed blob, and where that blob was pushed, so a layer is compressed once.

    Gzip is what makes exporting slow; base layers repeat from one publish to the next. An entry is
    used only when ``available(digest, diff_id)`` confirms the registry holds that blob in the target
    repository (after a cross-repository mount from one of :meth:`sources`, where it allows one).
    ``key`` names the codec and level (:attr:`Codec.key`): blobs of another codec or level never mix in.
    """

    directory: Path
    available: Callable[[str, str], bool]
    key: str = field(default_factory=default_key)
    hits: int = 0
    keep_repositories: int = 8

    def _path(self, diff_id: str) -> Path:
        return self.directory / f"{diff_id.split(':', 1)[1]}.json"

    def _read(self, diff_id: str) -> dict[str, Any]:
        try:
            data = json.loads(self._path(diff_id).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def scope(self, suffix: str) -> None:
        """Keep the entries of this publish apart under ``suffix`` too (e.g. the normalizing epoch)."""
        if not self.key.endswith(f"-{suffix}"):
            self.key = f"{self.key}-{suffix}"

    def normalized(self, diff_id: str) -> str | None:
        """The diff id the cached blob of local layer ``diff_id`` uncompresses to, when it was normalized."""
        try:
            value = self._read(diff_id)[self.key].get("diff_id")
        except (KeyError, TypeError, AttributeError):
            return None
        return value if isinstance(value, str) and DIGEST_RE.fullmatch(value) else None

    def lookup(self, diff_id: str) -> tuple[str, int] | None:
        try:
            entry = self._read(diff_id)[self.key]
            digest, size = entry["digest"], int(entry["size"])
        except (KeyError, TypeError, ValueError):
            return None
        return (digest, size) if isinstance(digest, str) and DIGEST_RE.fullmatch(digest) else None

    def sources(self, diff_id: str) -> list[str]:
        """The repositories (``host/name``) this blob was last pushed to, newest first."""
        try:
            repos = self._read(diff_id)[self.key].get("repositories") or []
        except (KeyError, TypeError, AttributeError):
            return []
        return [r for r in repos if isinstance(r, str)]

    def usable(self, diff_id: str) -> tuple[str, int] | None:
        """The cached blob of ``diff_id`` when the target repository holds it (or now does, by a mount)."""
        hit = self.lookup(diff_id)
        if hit is None or not self.available(hit[0], diff_id):
            return None
        self.hits += 1
        return hit

    def record(
        self, diff_id: str, digest: str, size: int, repository: str | None = None, blob_diff_id: str | None = None
    ) -> None:
        """Remember the blob of ``diff_id`` and, when given, that ``repository`` (``host/name``) now holds it;
        ``blob_diff_id``: what the blob uncompresses to, when normalizing made it another layer."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self._path(diff_id)
            data = self._read(diff_id)
            old = data.get(self.key)
            kept = old.get("repositories") or [] if isinstance(old, dict) and old.get("digest") == digest else []
            repos = [r for r in kept if isinstance(r, str) and r != repository]
            if repository:
                repos.insert(0, repository)
            data[self.key] = {"digest": digest, "size": size, "repositories": repos[: self.keep_repositories]}
            if blob_diff_id:
                data[self.key]["diff_id"] = blob_diff_id
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written only costs time


@dataclass
class PublishedImages:
    """Remembers what a local image was published as (manifest and config digest, per codec ``key``), so the next
    publish of a normalized image finds its tag without exporting it again. Only a hint: the publisher still
    compares what the registry holds."""

    directory: Path
    key: str

    def _path(self, image_id: str) -> Path:
        return self.directory / f"{image_id.split(':', 1)[-1]}.json"

    def get(self, image_id: str) -> tuple[str, str] | None:
        try:
            entry = json.loads(self._path(image_id).read_text())[self.key]
            digest, config = entry["digest"], entry["config"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        ok = all(isinstance(d, str) and DIGEST_RE.fullmatch(d) for d in (digest, config))
        return (digest, config) if ok else None

    def put(self, image_id: str, digest: str, config: str) -> None:
        path = self._path(image_id)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}
            data = data if isinstance(data, dict) else {}
            data[self.key] = {"digest": digest, "config": config}
            atomic_write(path, json.dumps(data))
        except OSError:
            pass  # a hint that cannot be written only costs an export


class _HashingWriter:
    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


@dataclass
class _Entry:
    path: Path | None = None
    data: bytes | None = None
    digest: str = ""
    size: int = 0
    media_type: str = ""
    diff_id: str | None = None
    link: str | None = None
    remote: bool = False
    kept: bool = False  # stored as the archive held it (its digest is the archive's bytes')

    def blob(self) -> Blob:
        return Blob(
            digest=self.digest,
            size=self.size,
            media_type=self.media_type,
            path=self.path,
            diff_id=self.diff_id,
            remote=self.remote,
        )


def read_save_stream(
    stream: BinaryIO,
    workdir: Path,
    *,
    compression: str = "gzip",
    level: int | None = None,
    expected_id: str | None = None,
    cache: LayerCache | None = None,
    pool: ThreadPoolExecutor | None = None,
    sink: Callable[[Blob], object] | None = None,
) -> PreparedImage:
    """Turn a ``docker save`` stream (legacy or OCI-layout flavour) into upload-ready blobs.

    One pass, streaming: small JSON files are kept in memory, layers go to ``workdir``,
    uncompressed layers compressed there by the ``compression`` codec at ``level`` (None: the codec's default;
    ``codec.py``: the same input gives the same bytes) unless ``compression`` is ``"none"``. Already compressed
    layers (a containerd image store exports them) are stored as they are. In the OCI-layout
    flavour a blob's name is its digest, so a layer whose cached blob the registry holds is
    skipped unread. ``sink`` gets every layer blob as soon as it is on disk (to upload it while
    the next one compresses).
    """
    packer = codec(compression, level)
    workdir.mkdir(parents=True, exist_ok=True)
    own_pool = pool is None and packer is not None
    if own_pool and packer is not None:
        pool = packer.pool()
    try:
        entries = _read_members(stream, workdir, packer, cache, pool, sink)
    finally:
        if own_pool and pool is not None:
            pool.shutdown(cancel_futures=True)
    return _assemble(entries, expected_id)


def read_image(
    stream: BinaryIO,
    workdir: Path,
    *,
    compression: str = "gzip",
    level: int | None = None,
    expected_id: str | None = None,
    cache: LayerCache | None = None,
    sink: Callable[[Blob], object] | None = None,
) -> PreparedImage:
    """:func:`read_save_stream`, normalized when the image names its layer epoch (see the module): its layers are
    then read uncompressed first (the config, which says whether to normalize, may come last in the stream),
    and each is normalized and compressed, or taken from ``cache`` when the registry holds its normalized blob."""
    packer = codec(compression, level)
    if packer is None:
        return read_save_stream(stream, workdir, compression=compression, expected_id=expected_id, sink=sink)
    raw = read_save_stream(stream, workdir / "raw", compression="none", expected_id=expected_id)
    assert raw.config.data is not None
    norm = normalizing(raw.config.data)
    if norm is not None and cache is not None:
        cache.scope(norm.key)
    pool = packer.pool()
    layers: list[Blob] = []
    try:
        for i, layer in enumerate(raw.layers):
            blob = _from_raw(layer, workdir / f"layer-{i}", packer, norm and norm.of(i), cache, pool)
            if sink is not None and not blob.remote:
                sink(blob)
            layers.append(blob)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    if norm is None:
        return PreparedImage(image_id=raw.image_id, config=raw.config, layers=layers)
    config_bytes = normalized_config(raw.config.data, [b.diff_id or "" for b in layers], norm)
    config = Blob(sha256_digest(config_bytes), len(config_bytes), OCI_CONFIG, data=config_bytes)
    return PreparedImage(image_id=config.digest, config=config, layers=layers, source_id=raw.image_id)


def _from_raw(
    layer: Blob,
    path: Path,
    packer: Codec,
    norm: Normalizing | None,
    cache: LayerCache | None,
    pool: ThreadPoolExecutor | None,
) -> Blob:
    """One layer of a ``docker save`` read uncompressed (or as the engine stored it): its blob, normalized with
    ``norm``, from ``cache`` when the registry holds it."""
    assert layer.path is not None and layer.diff_id is not None
    diff_id = layer.diff_id
    hit = _cached(cache, diff_id, norm)
    if hit is not None:
        layer.path.unlink()
        return Blob(hit[0], hit[1], packer.media_type, diff_id=hit[2], remote=True, source_diff_id=diff_id)
    if norm is None:
        with uncompressed(layer) as src, open(path, "wb") as out:
            writer = _HashingWriter(out)
            packer.compress(src, writer.write, pool=pool)
        blob = Blob("sha256:" + writer.hash.hexdigest(), writer.size, packer.media_type, path, diff_id=diff_id)
    else:
        blob = normalize_layer(lambda: uncompressed(layer), path, packer, norm, pool)
        blob.source_diff_id = diff_id
    layer.path.unlink()
    if cache is not None:
        cache.record(diff_id, blob.digest, blob.size, blob_diff_id=blob.diff_id)
    return blob


def uncompressed(layer: Blob) -> IO[bytes]:
    """The layer's tar: its file, decompressed when the engine exported it compressed."""
    assert layer.path is not None
    if layer.media_type == OCI_LAYER_GZIP:
        import gzip

        return cast(IO[bytes], gzip.open(layer.path, "rb"))
    if layer.media_type == OCI_LAYER_ZSTD:
        zstandard = extras.need("zstandard", "zstd", "an engine's zstd layers")
        return zstandard.ZstdDecompressor().stream_reader(open(layer.path, "rb"), closefd=True)
    return open(layer.path, "rb")


def _read_members(
    stream: BinaryIO,
    workdir: Path,
    packer: Codec | None,
    cache: LayerCache | None,
    pool: ThreadPoolExecutor | None,
    sink: Callable[[Blob], object] | None,
) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    counter = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = posixpath.normpath(member.name.lstrip("./") or ".")
            if member.issym() or member.islnk():
                target = member.linkname
                if member.issym():
                    target = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                entries[name] = _Entry(link=posixpath.normpath(target.lstrip("./")))
                continue
            if not member.isfile():
                continue
            named = _OCI_BLOB.fullmatch(name)
            if cache is not None and named and packer is not None:
                diff_id = "sha256:" + named.group(1)
                hit = cache.usable(diff_id)  # only layers have entries: a config or index is read below
                if hit is not None:
                    entries[name] = _Entry(
                        digest=hit[0], size=hit[1], media_type=packer.media_type, diff_id=diff_id, remote=True
                    )
                    continue  # not read: the stream skips it
            src = tar.extractfile(member)
            assert src is not None
            head = src.read(8)
            if name.endswith("/VERSION"):
                continue
            if (
                (head[:1] in (b"{", b"[") and member.size <= _SMALL_JSON)
                or name.endswith(".json")
                or name in ("repositories", "oci-layout")
            ):
                data = head + src.read()
                entries[name] = _Entry(data=data, digest=sha256_digest(data), size=len(data), media_type="json")
                continue
            counter += 1
            path = workdir / f"blob-{counter}"
            entry = entries[name] = _store_layer(head, src, path, packer, cache, pool, bool(named))
            if named and entry.kept and entry.digest != "sha256:" + named.group(1):
                raise BuildFailed(
                    f"the exported blob {name} hashes to {entry.digest}",
                    fix="the export is corrupt; re-run the publish",
                )
            if sink is not None and entry.path is not None:
                sink(entry.blob())
    return entries


def _store_layer(
    head: bytes,
    src: IO[bytes],
    path: Path,
    packer: Codec | None,
    cache: LayerCache | None = None,
    pool: ThreadPoolExecutor | None = None,
    named: bool = False,
) -> _Entry:
    """Store one layer at ``path``; ``named``: its name in the archive is its digest (OCI layout), so the cache
    was asked before reading it and it is compressed straight from the stream."""
    with open(path, "wb") as out:
        writer = _HashingWriter(out)
        if head.startswith(_GZIP_MAGIC) or head.startswith(_ZSTD_MAGIC) or packer is None:
            media = (
                OCI_LAYER_GZIP
                if head.startswith(_GZIP_MAGIC)
                else OCI_LAYER_ZSTD
                if head.startswith(_ZSTD_MAGIC)
                else OCI_LAYER_TAR
            )
            writer.write(head)
            while chunk := src.read(_CHUNK):
                writer.write(chunk)
            digest = "sha256:" + writer.hash.hexdigest()
            return _Entry(
                path=path,
                digest=digest,
                size=writer.size,
                media_type=media,
                diff_id=digest if media == OCI_LAYER_TAR else None,
                kept=True,
            )
        if cache is not None and not named:
            return _store_layer_cached(head, src, path, writer, packer, cache, pool)
        diff_id = packer.compress(src, writer.write, pool=pool, head=head)
    entry = _Entry(
        path=path,
        digest="sha256:" + writer.hash.hexdigest(),
        size=writer.size,
        media_type=packer.media_type,
        diff_id=diff_id,
    )
    if cache is not None:
        cache.record(diff_id, entry.digest, entry.size)
    return entry


def _store_layer_cached(
    head: bytes,
    src: IO[bytes],
    path: Path,
    writer: _HashingWriter,
    packer: Codec,
    cache: LayerCache,
    pool: ThreadPoolExecutor | None,
) -> _Entry:
    """Spool the raw layer first (its name does not say its diff id); compress it only when the registry lacks
    its cached blob. The OCI-layout flavour never comes here for a layer the cache knows (see read_save_stream)."""
    raw = path.with_suffix(".tar")
    diff = hashlib.sha256(head)
    with open(raw, "wb") as out:
        out.write(head)
        while chunk := src.read(_CHUNK):
            diff.update(chunk)
            out.write(chunk)
    diff_id = "sha256:" + diff.hexdigest()
    hit = cache.usable(diff_id)
    if hit is not None:
        raw.unlink()
        return _Entry(path=None, digest=hit[0], size=hit[1], media_type=packer.media_type, diff_id=diff_id, remote=True)
    with open(raw, "rb") as fh:
        packer.compress(fh, writer.write, pool=pool)
    raw.unlink()
    digest = "sha256:" + writer.hash.hexdigest()
    cache.record(diff_id, digest, writer.size)
    return _Entry(path=path, digest=digest, size=writer.size, media_type=packer.media_type, diff_id=diff_id)


def _resolve(entries: dict[str, _Entry], name: str) -> _Entry:
    name = posixpath.normpath(name.lstrip("./"))
    for _ in range(16):
        entry = entries.get(name)
        if entry is None:
            raise BuildFailed(
                f"image archive has no file {name!r} that its manifest.json names",
                fix="re-export the image (docker save) and retry",
            )
        if entry.link is None:
            return entry
        name = entry.link
    raise BuildFailed(f"image archive: link loop at {name!r}")


def _assemble(entries: dict[str, _Entry], expected_id: str | None) -> PreparedImage:
    top = entries.get("manifest.json")
    if top is None or top.data is None:
        raise BuildFailed(
            "image archive has no manifest.json (not a docker save archive)", fix="export the image with docker save"
        )
    items = json.loads(top.data)
    if not isinstance(items, list) or not items:
        raise BuildFailed("image archive manifest.json lists no image")
    chosen = None
    # the classic store's image id is its config digest; the containerd store's is its manifest's or index's
    # digest (a blob of the OCI-layout flavour), which names the config
    configs = _configs_named(entries, expected_id) if expected_id else set()
    for item in items:
        cfg = _resolve(entries, item["Config"])
        if expected_id is None or cfg.digest == expected_id or cfg.digest in configs:
            chosen, config_entry = item, cfg
            break
    if chosen is None:
        raise BuildFailed(
            f"image archive holds no image with id {expected_id}",
            fix="the local image changed while it was being exported; retry",
        )
    if len(items) > 1 and expected_id is None:
        raise BuildFailed(f"image archive holds {len(items)} images; publish needs exactly one")
    config_bytes = config_entry.data
    assert config_bytes is not None
    config = Blob(digest=config_entry.digest, size=config_entry.size, media_type=OCI_CONFIG, data=config_bytes)
    layers = []
    for name in chosen["Layers"]:
        e = _resolve(entries, name)
        if e.path is None and not e.remote:
            raise BuildFailed(f"image archive layer {name!r} is not a layer file")
        layers.append(e.blob())
    try:
        diff_ids = json.loads(config_bytes)["rootfs"]["diff_ids"]
    except (ValueError, KeyError, TypeError):
        raise BuildFailed("image config has no rootfs.diff_ids") from None
    if len(diff_ids) != len(layers):
        raise BuildFailed(f"image config lists {len(diff_ids)} layers, the archive {len(layers)}")
    for i, (want, layer) in enumerate(zip(diff_ids, layers)):
        if layer.diff_id is not None and layer.diff_id != want:
            raise BuildFailed(
                f"layer {i} of the exported image hashes to {layer.diff_id}, its config says {want}",
                fix="the export is corrupt; re-run the publish",
            )
        if layer.diff_id is None and isinstance(want, str) and DIGEST_RE.fullmatch(want):
            # a compressed layer (the containerd store exports its blobs as stored): its bytes hashed to the
            # digest its content-addressed name gives (_read_members); its diff id is the config's
            layer.diff_id = want
    return PreparedImage(image_id=config.digest, config=config, layers=layers)


def _configs_named(entries: dict[str, _Entry], digest: str, depth: int = 0) -> set[str]:
    """The config digests the manifest or index blob ``digest`` of an OCI-layout archive names (an index's
    manifests followed, four levels at most); empty when the archive has no such blob."""
    found = _OCI_DIGEST.fullmatch(digest)
    entry = entries.get(f"blobs/sha256/{found.group(1)}") if found else None
    if entry is None or entry.data is None or entry.digest != digest or depth > 4:
        return set()
    try:
        doc = json.loads(entry.data)
    except ValueError:
        return set()
    if not isinstance(doc, dict):
        return set()
    config = doc.get("config")
    if isinstance(config, dict) and isinstance(config.get("digest"), str):
        return {config["digest"]}
    out: set[str] = set()
    for child in doc.get("manifests") or []:
        if isinstance(child, dict) and isinstance(child.get("digest"), str):
            out |= _configs_named(entries, child["digest"], depth + 1)
    return out


@dataclass
class ArchiveImage:
    """An image from a ``docker save`` tar file on disk."""

    path: Path
    image_id: str | None = None
    local_size: int | None = None

    @property
    def description(self) -> str:
        return str(self.path)

    def prepare(
        self,
        workdir: Path,
        *,
        compression: str,
        log: Callable[..., None],
        cache: LayerCache | None = None,
        level: int | None = None,
        sink: Callable[[Blob], object] | None = None,
    ) -> PreparedImage:
        with open(self.path, "rb") as fh:
            img = read_image(
                fh, workdir, compression=compression, level=level, expected_id=self.image_id, cache=cache, sink=sink
            )
        self.image_id = img.image_id
        return img


class ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's streamed ``docker save``: ``Engine.export_image``)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


@dataclass
class DockerImage:
    """A local image of the engine, exported by id (so a re-tag meanwhile cannot change what is pushed)."""

    ref: str
    engine: Engine | None = None
    image_id: str | None = None
    local_size: int | None = None
    #: (os, architecture, variant) of the local image: the manifest of an index the containerd store exports
    platform: tuple[str, str, str | None] | None = None

    @property
    def description(self) -> str:
        return self.ref

    def _engine(self) -> Engine:
        if self.engine is None:
            self.engine = Engine()
        return self.engine

    def inspect(self) -> None:
        """The image's id, size and platform, from one description of the reference (one snapshot: a tag moved
        meanwhile cannot pair one image's id with another's size)."""
        try:
            attrs = self._engine().image_attrs(self.ref)
        except NoSuchImage:
            raise UserError(
                f"local image {self.ref} does not exist", fix="build it first (stackforge build STACK)"
            ) from None
        image_id = attrs.get("Id")
        if not isinstance(image_id, str) or not image_id.startswith("sha256:"):
            raise UserError(
                f"the engine described {self.ref} without an image id", fix="check the engine (stackforge doctor)"
            )
        self.image_id = image_id
        size = attrs.get("Size")
        self.local_size = size if isinstance(size, int) else None
        self.platform = platform_of(attrs)

    def prepare(
        self,
        workdir: Path,
        *,
        compression: str,
        log: Callable[..., None],
        cache: LayerCache | None = None,
        level: int | None = None,
        sink: Callable[[Blob], object] | None = None,
    ) -> PreparedImage:
        if self.image_id is None:
            self.inspect()
        packer = codec(compression, level)
        if packer is not None:
            reasons = []
            for store in ("layer", "content"):  # the classic store's layer store; the containerd store's content
                try:
                    return self._prepare_from_store(
                        workdir, log=log, cache=cache, packer=packer, sink=sink, store=store
                    )
                except layerstore.Unusable as exc:
                    reasons.append(str(exc))
            log("export-from-layer-store-refused", reason="; ".join(reasons), then="docker save")
        image_id = self.image_id
        assert image_id is not None  # inspect() set it
        try:
            chunks = self._engine().export_image(image_id)  # streamed: no temporary tar file
            with io.BufferedReader(ChunkReader(chunks), buffer_size=_CHUNK) as stream:
                return read_image(
                    stream,
                    workdir,
                    compression=compression,
                    level=level,
                    expected_id=self.image_id,
                    cache=cache,
                    sink=sink,
                )
        except tarfile.TarError as exc:
            raise BuildFailed(
                f"the engine's export of {self.ref} is unreadable: {exc}", fix="re-run the publish"
            ) from None

    def _prepare_from_store(
        self,
        workdir: Path,
        *,
        log: Callable[..., None],
        cache: LayerCache | None,
        packer: Codec,
        sink: Callable[[Blob], object] | None,
        store: str = "layer",
    ) -> PreparedImage:
        """The image without ``docker save``: config and the layers the target lacks read from the engine's
        layer store (``store="layer"``, the classic store: ``layerstore.py``) or from its containerd content store
        (``store="content"``, the containerd image store: ``contentstore.py``), each layer compressed while its
        tar is hashed and refused (:class:`layerstore.Unusable`) unless its sha256 is its diff id. Every layer is
        found in the store before any is read, so a refusal costs at most the layers already compressed (kept
        valid: digest-checked)."""
        assert self.image_id is not None
        if store == "layer":
            layer_store = layerstore.open_store(self._engine())
            config_bytes, root = layer_store.config(self.image_id), str(layer_store.root)

            def find(i: int, diff_id: str, chain_id: str) -> LayerSource:
                return layer_store.layer(diff_id, chain_id)
        else:
            content = contentstore.open_store(self._engine())
            if self.platform is None:
                self.inspect()
            assert self.platform is not None
            image = content.image(self.image_id, self.platform)
            config_bytes, root = image.config, str(content.root)

            def find(i: int, diff_id: str, chain_id: str) -> LayerSource:
                return image.layers[i]

        try:
            diff_ids = json.loads(config_bytes)["rootfs"]["diff_ids"]
        except (ValueError, KeyError, TypeError):
            diff_ids = None
        if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
            raise layerstore.Unusable("the image config has no rootfs.diff_ids")
        norm = normalizing(config_bytes)
        if norm is not None and cache is not None:
            cache.scope(norm.key)
        wanted: list[tuple[str, int, str] | LayerSource] = []
        for i, (diff_id, chain_id) in enumerate(zip(diff_ids, layerstore.chain_ids(diff_ids))):
            hit = _cached(cache, diff_id, norm and norm.of(i))
            wanted.append(hit if hit is not None else find(i, diff_id, chain_id))
        log(
            "export-from-layer-store" if store == "layer" else "export-from-content-store",
            root=root,
            read=sum(not isinstance(w, tuple) for w in wanted),
            normalize_epoch=norm.epoch if norm else None,
        )
        blobs: dict[int, Blob] = {}
        for i, (diff_id, want) in enumerate(zip(diff_ids, wanted)):
            if isinstance(want, tuple):
                source = diff_id if want[2] != diff_id else None
                blobs[i] = Blob(
                    want[0], want[1], packer.media_type, diff_id=want[2], remote=True, source_diff_id=source
                )
        # The largest layers first: their uploads then overlap the compression of the smaller ones, and what is left
        # to upload after the last layer is compressed is small.
        order = sorted((i for i in range(len(wanted)) if i not in blobs), key=lambda i: -_size_of(wanted[i]))
        workdir.mkdir(parents=True, exist_ok=True)
        pool = packer.pool()
        try:
            for i in order:
                diff_id, want = diff_ids[i], wanted[i]
                assert not isinstance(want, tuple)
                t = time.monotonic()
                blob = _rebuild(want, workdir / f"layer-{i}", packer, norm and norm.of(i), pool)
                log(
                    "layer-rebuilt",
                    index=i,
                    diff_id=diff_id,
                    digest=blob.digest,
                    size=blob.size,
                    seconds=round(time.monotonic() - t, 3),
                    **({"normalized_diff_id": blob.diff_id} if norm else {}),
                )
                if cache is not None:
                    cache.record(diff_id, blob.digest, blob.size, blob_diff_id=blob.diff_id)
                if sink is not None:
                    sink(blob)
                blobs[i] = blob
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        layers = [blobs[i] for i in range(len(wanted))]
        if norm is None:
            config = Blob(sha256_digest(config_bytes), len(config_bytes), OCI_CONFIG, data=config_bytes)
            return PreparedImage(image_id=config.digest, config=config, layers=layers)
        config_bytes = normalized_config(config_bytes, [b.diff_id or "" for b in layers], norm)
        config = Blob(sha256_digest(config_bytes), len(config_bytes), OCI_CONFIG, data=config_bytes)
        return PreparedImage(image_id=config.digest, config=config, layers=layers, source_id=self.image_id)


def _cached(cache: LayerCache | None, diff_id: str, norm: Normalizing | None) -> tuple[str, int, str] | None:
    """(digest, size, diff id of the blob) of the cached blob of local layer ``diff_id`` the registry holds."""
    hit = cache.usable(diff_id) if cache is not None else None
    if hit is None or cache is None:
        return None
    blob_diff_id = cache.normalized(diff_id) if norm is not None else diff_id
    return (hit[0], hit[1], blob_diff_id) if blob_diff_id else None


class LayerSource(Protocol):
    """A layer a store gives: its diff id, its tar in pieces and roughly how big it is (``layerstore.Layer``,
    ``contentstore.Layer``)."""

    @property
    def diff_id(self) -> str: ...

    @property
    def size(self) -> int: ...

    def chunks(self) -> Iterator[bytes]: ...


def _size_of(want: tuple[str, int, str] | LayerSource) -> int:
    return 0 if isinstance(want, tuple) else want.size


def _rebuild(
    layer: LayerSource, path: Path, packer: Codec, norm: Normalizing | None, pool: ThreadPoolExecutor | None
) -> Blob:
    """Rebuild ``layer``'s tar from the store and compress it to ``path`` (normalized first with ``norm``);
    :class:`layerstore.Unusable` unless the rebuilt tar hashes to the layer's diff id."""
    if norm is None:
        with open(path, "wb") as out:
            writer = _HashingWriter(out)
            got = packer.compress_chunks(layer.chunks(), writer.write, pool=pool)
        blob = Blob("sha256:" + writer.hash.hexdigest(), writer.size, packer.media_type, path, diff_id=got)
    else:
        readers: list[_HashingReader] = []

        def reopen() -> IO[bytes]:
            readers.append(_HashingReader(io.BufferedReader(ChunkReader(layer.chunks()), _CHUNK)))
            return cast(IO[bytes], readers[-1])

        blob = normalize_layer(reopen, path, packer, norm, pool)
        got = readers[-1].drain()
        blob.source_diff_id = layer.diff_id
    if got != layer.diff_id:
        path.unlink()
        raise layerstore.Unusable(f"a layer read from the store hashes to {got}, not {layer.diff_id}")
    return blob


class _HashingReader:
    """Reads ``raw`` and hashes what it read; :meth:`drain` reads the rest and gives the whole stream's digest."""

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.hash = hashlib.sha256()
        self.digest: str | None = None

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hash.update(data)
        return data

    def drain(self) -> str:
        if self.digest is None:
            while self.read(_CHUNK):
                pass
            self.digest = "sha256:" + self.hash.hexdigest()
        return self.digest

    def __enter__(self) -> _HashingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        """Closing drains: the digest then covers the whole stream (a tar reader stops at its end marker)."""
        if exc[0] is None:
            self.drain()
        self.raw.close()
