"""A layer's exact tar, rebuilt from the engine's overlay2 layer store instead of a ``docker save``.

The daemon keeps, per layer, ``<data-root>/image/overlay2/layerdb/sha256/<chain id>/`` with ``diff`` (the
layer's diff id), ``cache-id`` (its directory ``<data-root>/overlay2/<cache-id>/diff``) and
``tar-split.json.gz``: gzip-compressed JSON lines, in stream order, each either a raw segment of the
original tar (``{"type": 2, "payload": <base64>}``: headers and padding) or a file (``{"type": 1, "name":
…, "name_raw": <base64, for a name that is not UTF-8>, "size": N}``) whose N payload bytes come from that
path under the diff directory. Concatenating them gives back the layer tar byte for byte; that is how
the daemon itself exports a layer. The image config is ``image/overlay2/imagedb/content/sha256/<hex of the
image id>``.

:meth:`LayerStore.tree` gives an image's files as a container of it would see them, read from the layers'
diff directories top down with overlayfs' own rules (a character device 0/0 hides a name below it, a directory
whose ``trusted.overlay.opaque`` is ``y`` hides everything below it); a name it cannot read that way (a symlink
on the path, a redirected or metacopy entry) is :class:`Unusable`, so the caller asks a container instead.

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
import stat
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine

T = TypeVar("T")

_CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")
_DECODE = json.JSONDecoder().decode


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
    #: the bytes of its files as the store records them (``size`` beside ``diff``; 0 when unrecorded): what a caller
    #: orders work by, never trusted for content
    size: int = 0

    def chunks(self) -> Iterator[bytes]:
        """The layer tar, in pieces (segments as stored, file payloads in ≤ 1 MiB reads)."""
        try:
            with gzip.open(self.tar_split, "rt", encoding="utf-8") as lines:
                for line in lines:
                    if line.strip():
                        yield from self._entry(_DECODE(line))
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
        path = b"/".join([os.fsencode(self.files), *parts])
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise Unusable(f"layer {self.diff_id}: {os.fsdecode(name)}: {exc.strerror or exc}") from None
        try:
            if os.fstat(fd).st_size != size:
                raise Unusable(f"layer {self.diff_id}: {os.fsdecode(name)} is not {size} bytes as the tar-split says")
            left = size
            while left:
                data = os.read(fd, min(left, _CHUNK))
                if not data:
                    raise Unusable(f"layer {self.diff_id}: {os.fsdecode(name)} ended early")
                left -= len(data)
                yield data
        finally:
            os.close(fd)


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
        try:
            recorded_size = int(_read(entry / "size", 32).decode("ascii", errors="replace").strip() or 0)
        except (Unusable, ValueError):
            recorded_size = 0
        return Layer(diff_id=diff_id, chain_id=chain_id, tar_split=tar_split, files=files, size=max(recorded_size, 0))

    def tree(self, image_id: str) -> ImageTree:
        """The files of ``image_id`` (config checked against the id, every layer against its diff id)."""
        try:
            diff_ids = json.loads(self.config(image_id))["rootfs"]["diff_ids"]
        except (ValueError, KeyError, TypeError) as exc:
            raise Unusable(f"the config of {image_id} has no rootfs.diff_ids ({exc})") from None
        if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
            raise Unusable(f"the config of {image_id} has bad rootfs.diff_ids")
        layers = [self.layer(d, c).files for d, c in zip(diff_ids, chain_ids(diff_ids))]
        return ImageTree(list(reversed(layers)))


#: overlayfs' extended attributes on a layer's entries (the daemon mounts with the trusted.* namespace)
_OPAQUE = "trusted.overlay.opaque"
_UNSUPPORTED = ("trusted.overlay.redirect", "trusted.overlay.metacopy")


@dataclass
class _Step:
    """What one layer says about a path: ``found`` (with the entry and its lstat), ``hidden`` (a whiteout or a
    non-directory on the way: no lower layer counts) or ``missing`` (look below, unless ``opaque``: a
    directory on the way hides every lower layer)."""

    state: str
    entry: Path | None = None
    st: os.stat_result | None = None
    opaque: bool = False


@dataclass
class ImageTree:
    """An image's files, read-only, from its layers' diff directories (``layers``: the top layer first)."""

    layers: list[Path]

    @staticmethod
    def _parts(path: str) -> list[str]:
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise Unusable(f"{path!r} is not a plain absolute path")
        return parts

    @staticmethod
    def _step(layer: Path, parts: list[str]) -> _Step:
        here, opaque = layer, _opaque(layer)
        for depth, name in enumerate(parts):
            here = here / name
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                return _Step("missing", opaque=opaque)
            except OSError as exc:
                raise Unusable(f"cannot read {here}: {exc.strerror or exc}") from None
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                return _Step("hidden")  # a whiteout: deleted in this layer
            _check_attrs(here)
            if depth == len(parts) - 1:
                return _Step("found", here, st, opaque or (stat.S_ISDIR(st.st_mode) and _opaque(here)))
            if stat.S_ISLNK(st.st_mode):
                raise Unusable(f"{'/' + '/'.join(parts[: depth + 1])} is a symlink in the image")
            if not stat.S_ISDIR(st.st_mode):
                return _Step("hidden")  # a file where a directory of the path would be
            opaque = opaque or _opaque(here)
        return _Step("found", here, os.lstat(here), opaque)

    def _lookup(self, path: str) -> tuple[Path, os.stat_result] | None:
        """The entry that ``path`` (absolute, no symlink on the way) names in the union, with its lstat; None
        when no layer has it or a whiteout, a non-directory or an opaque directory above it hides it."""
        parts = self._parts(path)
        for layer in self.layers:
            step = self._step(layer, parts)
            if step.state == "found":
                assert step.entry is not None and step.st is not None
                return step.entry, step.st
            if step.state == "hidden" or step.opaque:
                return None
        return None

    def read(self, path: str, limit: int = 64 << 20) -> bytes | None:
        """The bytes of the regular file ``path``; None when the image has no such file. A symlink there is
        :class:`Unusable`."""
        found = self._lookup(path)
        if found is None:
            return None
        entry, st = found
        if stat.S_ISLNK(st.st_mode):
            raise Unusable(f"{path} is a symlink in the image")
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            raise Unusable(f"{path} is {st.st_size} bytes, over {limit}")
        return _read(entry, limit)

    def files(self, directory: str, limit: int = 1 << 62) -> dict[str, bytes]:
        """The regular files directly in ``directory``, by name (symlinks, directories and files over ``limit``
        bytes left out)."""
        out = {}
        for name in self.listdir(directory):
            found = self._lookup(f"{directory.rstrip('/')}/{name}")
            if found is not None and stat.S_ISREG(found[1].st_mode) and found[1].st_size <= limit:
                out[name] = _read(found[0], found[1].st_size + 1)
        return out

    def exists(self, path: str) -> bool:
        """``path`` names an entry of the image (a symlink counts: it is not followed)."""
        return self._lookup(path) is not None

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path``, sorted bytewise (as a shell glob orders them in the C locale); empty
        when the image has no such directory."""
        parts = self._parts(path)
        names: set[str] = set()
        hidden: set[str] = set()
        for layer in self.layers:
            step = self._step(layer, parts)
            if step.state == "hidden":
                break
            if step.state == "found":
                assert step.entry is not None and step.st is not None
                if stat.S_ISLNK(step.st.st_mode):
                    raise Unusable(f"{path} is a symlink in the image")
                if not stat.S_ISDIR(step.st.st_mode):
                    break  # a file in place of the directory: nothing below counts
                for entry in os.scandir(step.entry):
                    if entry.name not in hidden and entry.name not in names:
                        est = entry.stat(follow_symlinks=False)
                        whiteout = stat.S_ISCHR(est.st_mode) and est.st_rdev == 0
                        (hidden if whiteout else names).add(entry.name)
            if step.opaque:
                break
        return sorted(names, key=os.fsencode)


def _opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _check_attrs(path: Path) -> None:
    for name in _UNSUPPORTED:
        try:
            os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
        raise Unusable(f"{path} carries {name}: read it through a container")


#: each engine's store once found: a daemon's storage driver and data root stay as they are while it runs
_STORES: weakref.WeakKeyDictionary[Any, LayerStore] = weakref.WeakKeyDictionary()


def local_daemon(engine: Engine) -> dict[str, Any]:
    """The ``docker info`` of ``engine``'s daemon, when it answers on a local socket (the stores below its data root
    may then be read here); else :class:`Unusable`."""
    try:
        client = engine.sdk()
        base_url = str(client.api.base_url)
        info = client.info()
    except Exception as exc:
        raise Unusable(f"the engine did not answer: {exc}") from None
    if base_url != "http+docker://localhost":  # what the SDK makes of a unix socket; tcp, ssh, npipe are not
        raise Unusable(f"the engine is not on a local socket ({base_url})")
    return dict(info)


def open_store(engine: Engine) -> LayerStore:
    """The layer store of ``engine``'s daemon, when it is local, overlay2 and readable; else :class:`Unusable`."""
    try:
        return _STORES[engine]
    except (KeyError, TypeError):  # not asked yet, or an engine object that cannot be weakly referenced
        pass
    info = local_daemon(engine)
    driver = info.get("Driver")
    if driver != "overlay2":
        raise Unusable(f"the engine's storage driver is {driver!r}, not overlay2")
    root = Path(str(info.get("DockerRootDir") or ""))
    db = root / "image" / "overlay2" / "layerdb" / "sha256"
    if not root.is_absolute() or not os.access(db, os.R_OK | os.X_OK):
        raise Unusable(f"the layer store {db} is not readable here")
    store = LayerStore(root)
    try:
        _STORES[engine] = store
    except TypeError:
        pass
    return store


def read_image(engine: Engine, image_id: str | None, reader: Callable[[ImageTree], T]) -> T | None:
    """``reader``'s answer from the files of image ``image_id`` in ``engine``'s layer store; None when there is
    no id or the store cannot serve (:class:`Unusable`, from the store or ``reader``): the caller then reads the
    image through a container."""
    if not image_id:
        return None
    try:
        return reader(open_store(engine).tree(image_id))
    except Unusable:
        return None
