"""An image's config and layers read from the engine's containerd content store instead of a ``docker save``.

An engine with the containerd image store (daemon.json ``"features": {"containerd-snapshotter": true}``) keeps no
overlay2 layer store: an image is a manifest (or an index of manifests: a platform's image and BuildKit's
attestation manifest) in containerd's content store, ``<root>/io.containerd.content.v1.content/blobs/sha256/<hex>``,
beside its config and its layers as they were pulled, loaded or built (uncompressed, gzip or zstd). The engine names
the image by that manifest's or index's digest. A dockerd that runs its own containerd keeps the store under its
data root (``<data-root>/containerd/daemon``); one that uses the host's containerd, under ``/var/lib/containerd``.

Nothing here is trusted: :func:`open_store` only answers for a daemon on a local socket with the containerd store
whose content store this process can read; every manifest, index and config read is checked against its digest; a
caller hashes every layer's uncompressed tar and refuses one whose sha256 is not its diff id. :class:`Unusable`
(:class:`clients.layerstore.Unusable`) says why the store cannot serve (the caller falls back to ``docker save``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from stackforge import extras, safeio
from stackforge.clients.layerstore import Unusable, local_daemon
from stackforge.errors import UserError
from stackforge.fslock import temp_beside

_CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")
#: a manifest, index or config read into memory: larger is not an engine's
_SMALL = 4 << 20
_SNAPSHOTTER = "io.containerd.snapshotter.v1"
_CONTENT = Path("io.containerd.content.v1.content") / "blobs" / "sha256"
#: where a dockerd that uses the host's containerd finds it (containerd's default root)
HOST_CONTAINERD = Path("/var/lib/containerd")
_INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
_LAYERS = {
    "application/vnd.oci.image.layer.v1.tar": None,
    "application/vnd.docker.image.rootfs.diff.tar": None,
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
}


def _hex(digest: object) -> str:
    algorithm, _, value = str(digest).partition(":")
    if algorithm != "sha256" or len(value) != 64 or not set(value) <= _HEX:
        raise Unusable(f"{digest!r} is not a sha256 digest")
    return value


def uses_containerd_store(info: dict[str, Any]) -> bool:
    """Whether ``docker info`` says the daemon keeps its images in the containerd image store."""
    status = info.get("DriverStatus") or []
    return any(isinstance(row, list) and _SNAPSHOTTER in row for row in status)


@dataclass(frozen=True)
class Layer:
    """One layer blob of the content store: its uncompressed tar through :meth:`chunks`."""

    diff_id: str
    digest: str
    path: Path
    compression: str | None  # None, gzip or zstd
    #: the blob's size as its manifest gives it (what a caller orders work by; the bytes are checked elsewhere)
    size: int = 0

    def chunks(self) -> Iterator[bytes]:
        if not os.access(self.path, os.R_OK):
            raise Unusable(f"cannot read layer {self.digest} ({self.path})")
        with open(self.path, "rb") as fh:
            if self.compression is None:
                while data := fh.read(_CHUNK):
                    yield data
            elif self.compression == "gzip":
                yield from _inflate(fh, self.digest)
            else:
                zstandard = extras.need("zstandard", "zstd", "an engine's zstd layers")
                reader = zstandard.ZstdDecompressor().stream_reader(fh)
                while data := reader.read(_CHUNK):
                    yield data


def _inflate(fh: Any, digest: str) -> Iterator[bytes]:
    """The gzip stream of ``fh`` inflated (every member of a multi-member stream)."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        while data := fh.read(_CHUNK):
            yield inflate.decompress(data)
            while inflate.eof and inflate.unused_data:
                rest = inflate.unused_data
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                yield inflate.decompress(rest)
        yield inflate.flush()
    except zlib.error as exc:
        raise Unusable(f"layer {digest} does not inflate: {exc}") from None


@dataclass(frozen=True)
class Image:
    """A platform image of the content store: its config (checked against its digest) and its layers."""

    config: bytes
    config_digest: str
    layers: list[Layer]


class Blobs:
    """Manifests, indexes and configs read by digest (each checked against it): an image the engine names by a
    manifest's or an index's digest resolved to its platform's manifest and config. ``read`` and ``holds`` are the
    store's (:class:`ContentStore`, :class:`SavedBlobs`)."""

    def read(self, digest: str) -> bytes:
        raise NotImplementedError

    def holds(self, digest: str) -> bool:
        raise NotImplementedError

    def _json(self, digest: str) -> dict[str, Any]:
        try:
            doc = json.loads(self.read(digest))
        except ValueError:
            raise Unusable(f"blob {digest} is not JSON") from None
        if not isinstance(doc, dict):
            raise Unusable(f"blob {digest} is not a JSON object")
        return doc

    def manifest(self, image_id: str, platform: tuple[str, str, str | None]) -> dict[str, Any]:
        """The manifest of the image the engine names ``image_id`` (a manifest's or an index's digest) for
        ``platform`` (os, architecture, variant or None): an index's attestation manifests and other platforms' are
        skipped."""
        doc = self._json(image_id)
        for _ in range(4):
            if doc.get("mediaType") not in _INDEXES and "manifests" not in doc:
                break
            doc = self._json(self._pick(image_id, doc, platform))
        else:
            raise Unusable(f"image {image_id}: indexes nested too deep")
        config = doc.get("config")
        if not isinstance(config, dict) or not isinstance(doc.get("layers"), list):
            raise Unusable(f"image {image_id}: its manifest has no config or layers")
        _hex(config.get("digest"))
        return doc

    def config_digest(self, image_id: str, platform: tuple[str, str, str | None]) -> str:
        """The digest of the config of ``image_id``'s image of ``platform`` (what the classic store names it by),
        the config read and checked."""
        digest = str(self.manifest(image_id, platform)["config"]["digest"])
        self.read(digest)
        return digest

    def _pick(self, image_id: str, index: dict[str, Any], platform: tuple[str, str, str | None]) -> str:
        """The digest of the index's one manifest of ``platform`` whose blob the store holds."""
        found = []
        for child in index.get("manifests") or []:
            if not isinstance(child, dict) or "vnd.docker.reference.type" in (child.get("annotations") or {}):
                continue  # an attestation manifest
            plat = child.get("platform") or {}
            if (plat.get("os"), plat.get("architecture")) != platform[:2]:
                continue
            if platform[2] and plat.get("variant") not in (None, platform[2]):
                continue
            if not self.holds(str(child.get("digest"))):
                continue  # a platform the engine did not pull
            found.append(str(child.get("digest")))
        if len(found) != 1:
            want = "/".join(p for p in platform if p)
            raise Unusable(f"image {image_id}: its index holds {len(found)} local manifests of {want}, not one")
        return found[0]


def _checked(digest: str, data: bytes, where: str) -> bytes:
    if len(data) > _SMALL:
        raise Unusable(f"blob {digest} is larger than a manifest or config is")
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise Unusable(f"blob {digest} of {where} does not hash to its name")
    return data


@dataclass(frozen=True)
class ContentStore(Blobs):
    """The content stores of a daemon's containerd (its own, then the host's), read-only."""

    roots: tuple[Path, ...]

    @property
    def root(self) -> Path:
        return self.roots[0]

    def path(self, digest: str) -> Path:
        name = _hex(digest)
        for root in self.roots:
            path = root / name
            if path.is_file():
                return path
        raise Unusable(f"blob {digest} is not in the content store {self.root}")

    def holds(self, digest: str) -> bool:
        try:
            self.path(digest)
        except Unusable:
            return False
        return True

    def read(self, digest: str) -> bytes:
        """A small blob (manifest, index, config), checked against its digest."""
        path = self.path(digest)
        try:
            with open(path, "rb") as fh:
                data = fh.read(_SMALL + 1)
        except OSError as exc:
            raise Unusable(f"cannot read {path}: {exc.strerror or exc}") from None
        return _checked(digest, data, "the content store")

    def image(self, image_id: str, platform: tuple[str, str, str | None]) -> Image:
        """The image the engine names ``image_id`` for ``platform``: its config and its layers (see
        :meth:`Blobs.manifest`)."""
        doc = self.manifest(image_id, platform)
        config_digest = str(doc["config"]["digest"])
        config_bytes = self.read(config_digest)
        try:
            diff_ids = json.loads(config_bytes)["rootfs"]["diff_ids"]
        except (ValueError, KeyError, TypeError):
            raise Unusable(f"image {image_id}: its config has no rootfs.diff_ids") from None
        if not isinstance(diff_ids, list) or len(diff_ids) != len(doc["layers"]):
            raise Unusable(f"image {image_id}: its config and its manifest list different layers")
        layers = []
        for desc, diff_id in zip(doc["layers"], diff_ids):
            if not isinstance(desc, dict) or desc.get("mediaType") not in _LAYERS:
                media = desc.get("mediaType") if isinstance(desc, dict) else desc
                raise Unusable(f"image {image_id}: a layer of media type {media!r}")
            _hex(diff_id)
            digest = str(desc.get("digest"))
            size = desc.get("size")
            layers.append(
                Layer(
                    diff_id,
                    digest,
                    self.path(digest),
                    _LAYERS[desc["mediaType"]],
                    size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0,
                )
            )
        return Image(config_bytes, config_digest, layers)


@dataclass(frozen=True)
class SavedBlobs(Blobs):
    """The small blobs (manifests, indexes, configs) of an OCI-layout ``docker save`` stream, by digest; its layers
    are read past, not kept (:func:`saved_blobs`)."""

    blobs: dict[str, bytes]

    def holds(self, digest: str) -> bool:
        return _hex(digest) in self.blobs

    def read(self, digest: str) -> bytes:
        data = self.blobs.get(_hex(digest))
        if data is None:
            raise Unusable(f"blob {digest} is not in the engine's export")
        return _checked(digest, data, "the engine's export")


#: small blobs kept from an export: an image's manifests, indexes and configs are a few
_SAVED_MAX = 256


def saved_blobs(stream: BinaryIO) -> SavedBlobs:
    """The small blobs of a ``docker save`` stream (the OCI layout's ``blobs/sha256/<hex>``), read in one pass: a
    member larger than a manifest or config is read past; at most :data:`_SAVED_MAX` are kept."""
    kept: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts = member.name.lstrip("./").split("/")
                if not member.isfile() or member.size > _SMALL or len(parts) != 3 or parts[:2] != ["blobs", "sha256"]:
                    continue
                if len(kept) >= _SAVED_MAX:
                    raise Unusable(f"the engine's export holds more than {_SAVED_MAX} small blobs")
                src = tar.extractfile(member)
                if src is not None and len(parts[2]) == 64 and set(parts[2]) <= _HEX:
                    kept[parts[2]] = src.read(_SMALL + 1)
    except tarfile.TarError as exc:
        raise Unusable(f"the engine's export is unreadable: {exc}") from None
    return SavedBlobs(kept)


class _ChunkStream(io.RawIOBase):
    """An iterator of byte chunks (the SDK's ``docker save`` stream) as a readable file."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._rest))
        b[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


#: the file (in the engine cache, ``Workspace.cache("engine")``) that remembers the config digests read from an
#: engine's export: an index's or a manifest's digest names its bytes, so the config of each of its platforms is
#: a fact about that digest, true on every engine
MEMO = "config-digests.json"
MEMO_KEEP = 256


def config_digest(engine: Any, image_id: str, platform: tuple[str, str, str | None], memo: Path | None = None) -> str:
    """The config digest of the image a containerd-store engine names ``image_id`` (a manifest's or an index's
    digest), for ``platform``: read from its content store when that serves (:func:`open_store`), else remembered in
    ``memo`` (a directory) from an earlier export, else from the engine's ``docker save`` of it, streamed (its layers
    read past) and then remembered: a remote engine exports a base image once, not at every build.
    :class:`Unusable` says why none could."""
    try:
        return open_store(engine).config_digest(image_id, platform)
    except Unusable as exc:
        why = str(exc)
    key = _memo_key(image_id, platform) if memo is not None else None
    remembered = _memo(memo / MEMO).get(key) if memo is not None and key else None
    if remembered:
        return remembered
    try:
        chunks = engine.sdk().api.get_image(image_id, chunk_size=_CHUNK)
        with io.BufferedReader(_ChunkStream(iter(chunks)), buffer_size=_CHUNK) as stream:
            found = saved_blobs(stream).config_digest(image_id, platform)
    except Unusable as exc:
        raise Unusable(f"{why}; its export: {exc}") from None
    except Exception as exc:  # the SDK's errors (docker.errors.DockerException, requests' own)
        raise Unusable(f"{why}; exporting it failed: {exc}") from None
    if memo is not None and key:
        _remember(memo / MEMO, key, found)
    return found


def _memo(path: Path) -> dict[str, str]:
    """The memo's entries that are well formed (a missing, unreadable or malformed file: none)."""
    try:  # the one bounded reader: a regular file within the limit (a FIFO or /dev/zero is refused, not read)
        doc = safeio.read_json(path, what="config-digest memo", limit=1 << 20)
    except (UserError, OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    out = {}
    for key, value in doc.items():
        try:
            _hex(value)
        except Unusable:
            continue
        out[str(key)] = str(value)
    return out


def _memo_key(image_id: str, platform: tuple[str, str, str | None]) -> str | None:
    """The memo's key of an image named by a digest, on a platform (None: not a digest, not remembered)."""
    try:
        return f"{_hex(image_id)} {'/'.join(p for p in platform if p)}"
    except Unusable:
        return None


def _remember(path: Path, key: str, digest: str) -> None:
    """Add ``key`` to the memo (the newest MEMO_KEEP kept), written whole through a temporary file; a memo that
    cannot be written is not kept (the next build exports again)."""
    entries = {k: v for k, v in _memo(path).items() if k != key}
    entries = dict(list(entries.items())[-(MEMO_KEEP - 1) :])
    entries[key] = digest
    tmp = temp_beside(path, "")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries, indent=0) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def open_store(engine: Any) -> ContentStore:
    """The content store of ``engine``'s daemon, when it is local, keeps the containerd image store and is readable
    here; else :class:`Unusable`."""
    info = local_daemon(engine)
    if not uses_containerd_store(info):
        raise Unusable("the engine keeps the classic image store, not the containerd one")
    data_root = Path(str(info.get("DockerRootDir") or ""))
    if not data_root.is_absolute():
        raise Unusable(f"the engine names no data root ({data_root})")
    roots = tuple(
        root / _CONTENT
        for root in (data_root / "containerd" / "daemon", HOST_CONTAINERD)
        if os.access(root / _CONTENT, os.R_OK | os.X_OK)
    )
    if not roots:
        raise Unusable(
            f"the containerd content store ({data_root / 'containerd' / 'daemon' / _CONTENT}) is not readable here"
        )
    return ContentStore(roots)
