"""Where two images differ: the first layer, file and field, or the first config key.

``verify --rebuild`` compares a rebuilt image with the published one. Images that differ are compared in three
steps, each naming the first difference it finds:

- the layer lists (:func:`first_layer`): the first index whose diff ids differ, or a different layer count;
- one layer pair (:func:`first_entry`): both tars are read entry by entry into ``name → Entry``; the first name (in
  a layer's order, ``normalize.key``) that one lacks or whose type, content (sha256 of the bytes), link target, mode, owner (uid:gid) or
  time (mtime) differs, in that order;
- the configs (:func:`first_config_key`): both flattened to ``key.path → value``; the first path whose value
  differs. ``rootfs.diff_ids`` is left out: the layers answer for it.
"""

from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass
from typing import IO, Any

from stackforge.publish.normalize import key

_CHUNK = 1 << 20
#: the fields of an entry in the order a difference is reported
FIELDS = ("type", "content", "link", "mode", "owner", "time")


@dataclass(frozen=True)
class Entry:
    type: str
    content: str  # sha256 of a regular file's bytes, "" for other types
    link: str
    mode: str
    owner: str
    time: int

    def get(self, name: str) -> Any:
        return getattr(self, name)


@dataclass(frozen=True)
class Difference:
    path: str
    field: str  # one of FIELDS, or "missing" when only one side has the entry
    ours: Any
    theirs: Any

    def describe(self, ours: str = "rebuilt", theirs: str = "published") -> str:
        if self.field == "missing":
            side = theirs if self.ours is None else ours
            return f"/{self.path}: only in the {side} image"
        return f"/{self.path}: {self.field} differs ({ours} {self.ours}, {theirs} {self.theirs})"


_TYPES = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.CHRTYPE: "char-device",
    tarfile.BLKTYPE: "block-device",
    tarfile.FIFOTYPE: "fifo",
}


def entries(tar_stream: IO[bytes]) -> dict[str, Entry]:
    """``name → Entry`` of every member of the layer tar ``tar_stream`` (read once, streaming)."""
    out: dict[str, Entry] = {}
    with tarfile.open(fileobj=tar_stream, mode="r|") as tar:
        for info in tar:
            content = ""
            if info.isreg():
                data = tar.extractfile(info)
                assert data is not None
                h = hashlib.sha256()
                while chunk := data.read(_CHUNK):
                    h.update(chunk)
                content = "sha256:" + h.hexdigest()
            out[info.name.lstrip("./") or "."] = Entry(
                type=_TYPES.get(info.type, f"type {info.type!r}"),
                content=content,
                link=info.linkname,
                mode=oct(info.mode),
                owner=f"{info.uid}:{info.gid}",
                time=int(info.mtime),
            )
    return out


def first_entry(ours: dict[str, Entry], theirs: dict[str, Entry]) -> Difference | None:
    """The first difference between two layers' entries (see the module), or None when they are the same."""
    for path in sorted(set(ours) | set(theirs), key=key):
        a, b = ours.get(path), theirs.get(path)
        if a is None or b is None:
            return Difference(path, "missing", a, b)
        for name in FIELDS:
            if a.get(name) != b.get(name):
                return Difference(path, name, a.get(name), b.get(name))
    return None


def first_layer(ours: list[str], theirs: list[str]) -> int | None:
    """The index of the first layer whose diff ids differ (or the shorter list's length), or None."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _flatten(item, f"{path}[{i}]", out)
    else:
        out[path] = value


def first_config_key(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """(key path, ours, theirs) of the first config value that differs, ``rootfs.diff_ids`` left out; or None."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(ours, "", a)
    _flatten(theirs, "", b)
    for path in sorted(set(a) | set(b)):
        if path.startswith("rootfs.diff_ids"):
            continue
        if a.get(path) != b.get(path):
            return path, a.get(path), b.get(path)
    return None
