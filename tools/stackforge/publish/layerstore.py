"""A layer's exact tar, rebuilt from the engine's overlay2 layer store instead of a ``docker save``.

The daemon keeps, per layer, ``<data-root>/image/overlay2/layerdb/sha256/<chain id>/`` with ``diff`` (the
layer's diff id), ``cache-id`` (its directory ``<data-root>/overlay2/<cache-id>/diff``) and
``tar-split.json.gz``: gzip-compressed JSON lines, in stream order, each either a raw segment of the
original tar (``{"type": 2, "payload": <base64>}``: headers and padding) or a file (``{"type": 1, "name":
…, "name_raw": <base64, for a name that is not UTF-8>, "size": N}``) whose N payload bytes come from that
path under the diff directory. Concatenating them gives back the layer tar byte for byte; that is how
the daemon itself exports a layer. The image config is ``image/overlay2/imagedb/content/sha256/<hex of the
image id>``.

Nothing here is trusted: :func:`open_store` only answers for a daemon on a local socket whose storage
driver is overlay2 and whose data root this process can read; :meth:`LayerStore.config` checks the
config's sha256 against the image id; a caller hashes every rebuilt layer and refuses one whose sha256
is not its diff id. :class:`Unusable` says why the store cannot serve (the caller falls back to
``docker save``).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")


class Unusable(Exception):
    """The layer store cannot serve this image or layer (the message says why)."""


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The chain id of every layer: the first is its diff id, each next ``sha256(parent + " " + diff id)``."""
    out: list[str] = []
    for diff_id in diff_ids:
        out.append(diff_id if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {diff_id}".encode()).hexdigest())
    return out


def _hex(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256" or len(value) != 64 or not set(value) <= _HEX:
        raise Unusable(f"{digest!r} is not a sha256 digest")
    return value


def _read(path: Path, limit: int = 4096) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError as exc:
        raise Unusable(f"cannot read {path}: {exc.strerror or exc}") from None


@dataclass
class Layer:
    """One layer of the store: where its tar-split and its files are."""

    diff_id: str
    chain_id: str
    tar_split: Path
    files: Path

    def chunks(self) -> Iterator[bytes]:
        """The layer tar, in pieces (segments as stored, file payloads in ≤ 1 MiB reads)."""
        try:
            with gzip.open(self.tar_split, "rb") as lines:
                for line in lines:
                    if line.strip():
                        yield from self._entry(json.loads(line))
        except (OSError, EOFError, ValueError) as exc:
            raise Unusable(f"tar-split of layer {self.diff_id} is unreadable: {exc}") from None

    def _entry(self, entry: Any) -> Iterator[bytes]:
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind == 2:
            payload = entry.get("payload")
            if payload:
                yield base64.b64decode(payload, validate=True)
            return
        if kind != 1:
            raise Unusable(f"tar-split of layer {self.diff_id} has an entry of unknown type {kind!r}")
        size = entry.get("size") or 0
        if not isinstance(size, int) or size < 0:
            raise Unusable(f"tar-split of layer {self.diff_id}: bad size {size!r}")
        if size == 0:
            return  # directories, links, empty files: the header segment is all there is
        raw = entry.get("name_raw")
        name = base64.b64decode(raw) if raw else str(entry.get("name") or "").encode()
        yield from self._payload(name, size)

    def _payload(self, name: bytes, size: int) -> Iterator[bytes]:
        parts = [p for p in name.split(b"/") if p not in (b"", b".")]
        if not parts or b".." in parts:
            raise Unusable(f"layer {self.diff_id}: file name {name!r} leaves the layer")
        path = os.path.join(os.fsencode(self.files), *parts)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise Unusable(f"layer {self.diff_id}: {os.fsdecode(name)}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb", buffering=0) as fh:
            if os.fstat(fd).st_size != size:
                raise Unusable(f"layer {self.diff_id}: {os.fsdecode(name)} is not {size} bytes as the tar-split says")
            left = size
            while left:
                data = fh.read(min(left, _CHUNK))
                if not data:
                    raise Unusable(f"layer {self.diff_id}: {os.fsdecode(name)} ended early")
                left -= len(data)
                yield data


@dataclass
class LayerStore:
    """The overlay2 layer store under a daemon's data root."""

    root: Path

    @property
    def _db(self) -> Path:
        return self.root / "image" / "overlay2"

    def config(self, image_id: str) -> bytes:
        """The image's raw config, checked: its sha256 is ``image_id``."""
        path = self._db / "imagedb" / "content" / "sha256" / _hex(image_id)
        data = _read(path, 64 << 20)
        if "sha256:" + hashlib.sha256(data).hexdigest() != image_id:
            raise Unusable(f"{path} does not hash to the image id {image_id}")
        return data

    def layer(self, diff_id: str, chain_id: str) -> Layer:
        """The layer ``chain_id``, checked: the store records ``diff_id`` for it and has its files."""
        entry = self._db / "layerdb" / "sha256" / _hex(chain_id)
        recorded = _read(entry / "diff").decode(errors="replace").strip()
        if recorded != diff_id:
            raise Unusable(f"layer store entry {chain_id} holds diff id {recorded}, the image says {diff_id}")
        cache_id = _read(entry / "cache-id").decode(errors="replace").strip()
        if not cache_id or "/" in cache_id or cache_id in (".", ".."):
            raise Unusable(f"layer store entry {chain_id} has a bad cache-id {cache_id!r}")
        files = self.root / "overlay2" / cache_id / "diff"
        tar_split = entry / "tar-split.json.gz"
        for needed in (files, tar_split):
            if not os.access(needed, os.R_OK):
                raise Unusable(f"{needed} is missing or unreadable")
        return Layer(diff_id=diff_id, chain_id=chain_id, tar_split=tar_split, files=files)


def open_store(engine: Any) -> LayerStore:
    """The layer store of ``engine``'s daemon, when it is local, overlay2 and readable; else :class:`Unusable`."""
    try:
        client = engine.sdk()
        base_url = str(client.api.base_url)
        info = client.info()
    except Exception as exc:
        raise Unusable(f"the engine did not answer: {exc}") from None
    if base_url != "http+docker://localhost":  # what the SDK makes of a unix socket; tcp, ssh, npipe are not
        raise Unusable(f"the engine is not on a local socket ({base_url})")
    driver = info.get("Driver")
    if driver != "overlay2":
        raise Unusable(f"the engine's storage driver is {driver!r}, not overlay2")
    root = Path(str(info.get("DockerRootDir") or ""))
    db = root / "image" / "overlay2" / "layerdb" / "sha256"
    if not root.is_absolute() or not os.access(db, os.R_OK | os.X_OK):
        raise Unusable(f"the layer store {db} is not readable here")
    return LayerStore(root)
