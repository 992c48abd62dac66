"""A layer tar rewritten so that the same files give the same bytes, whatever build made them.

What a build leaves variable in a layer, and what is done with it:

- times: every entry's mtime is clamped to ``epoch`` (SOURCE_DATE_EPOCH: the pinned commits' time), so files a
  step created at build time carry the epoch, and files older than it keep their own time;
- owners' names: ``uname``/``gname`` are cleared (the numeric uid/gid, which the image's files really have, stay);
- pax records: only extended attributes (``SCHILY.xattr.*``, e.g. ``security.capability``) are kept; atime,
  ctime and fractional mtimes go (tarfile writes the pax records a long name or a large value needs itself);
- entry order: entries are sorted by their path's components (:func:`key`: a directory, then what it holds, then
  its next sibling), so the order a filesystem listed them in does not matter. A hard link whose target would
  now come after it is written the other way round: the first name of the group in the new order carries the
  data and the others link to it.

Content is untouched: names, modes, uid/gid, link targets, device numbers and file bytes are the same, so the
layer unpacks to the same tree.

Two ways to the same bytes. An engine writes a layer in the order of a directory walk, which is already this
order: :func:`stream` rewrites each entry as it reads it, and raises :class:`OutOfOrder` at the first entry
that is not (its output is then to be discarded). :func:`normalize` takes any order: it spools member data to
``spool`` (a directory) while the stream is read, so a layer of any size needs disk, not memory, then writes
the entries sorted.
"""

from __future__ import annotations

import copy
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

KEPT_PAX = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")
WHITEOUT = b".wh."
OPAQUE = b".wh..wh..opq"
_CHUNK = 1 << 20


@dataclass
class _Member:
    info: tarfile.TarInfo
    offset: int = 0  # of its data in the spool file
    size: int = 0


class OutOfOrder(Exception):
    """The layer is not in the normalized order (or names an entry twice): :func:`normalize` it instead."""


def key(name: str) -> tuple[bytes, ...]:
    """The normalized order of ``name``: its path components, compared as bytes, where a whiteout (``.wh.X``,
    deleting ``X``) sorts as the name it deletes and a directory's opaque marker (``.wh..wh..opq``) before the
    directory's entries: the order engines write them in."""
    parts = name.encode("utf-8", "surrogateescape").split(b"/")
    last = parts[-1]
    if last == OPAQUE:
        parts[-1] = b""
    elif last.startswith(WHITEOUT):
        parts[-1] = last[len(WHITEOUT) :]
    return tuple(parts)


def _order(name: str) -> tuple[tuple[bytes, ...], str]:
    """:func:`key`, then the name itself: a whiteout and an entry of the name it deletes keep one order."""
    return key(name), name


def stream(src: IO[bytes], out: IO[bytes], epoch: int) -> None:
    """Normalize ``src`` into ``out`` in one pass when ``src`` is in the normalized order already (see the
    module); :class:`OutOfOrder` at the first entry that is not, or a hard link to an entry not written before."""
    last: tuple[tuple[bytes, ...], str] | None = None
    seen: set[str] = set()
    with (
        tarfile.open(fileobj=src, mode="r|") as tar,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst,
    ):
        for info in tar:
            here = _order(info.name)
            if last is not None and here <= last:
                raise OutOfOrder(info.name)
            if info.islnk() and info.linkname not in seen:
                raise OutOfOrder(info.name)
            last = here
            seen.add(info.name)
            clean = _clean(info, epoch)
            if info.isreg():
                clean.type = tarfile.REGTYPE  # a GNU sparse file is written out whole
                dst.addfile(clean, tar.extractfile(info))
            else:
                dst.addfile(clean)


def _clean(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    out = copy.copy(info)
    out.mtime = min(int(info.mtime), epoch)
    out.uname = out.gname = ""
    out.pax_headers = {k: v for k, v in info.pax_headers.items() if k.startswith(KEPT_PAX)}
    return out


def _read(src: IO[bytes], spool: IO[bytes], epoch: int) -> dict[str, _Member]:
    members: dict[str, _Member] = {}
    with tarfile.open(fileobj=src, mode="r|") as tar:
        for info in tar:
            member = _Member(_clean(info, epoch))
            if info.isreg():
                data = tar.extractfile(info)
                assert data is not None
                member.offset = spool.tell()
                shutil.copyfileobj(data, spool, _CHUNK)
                member.size = spool.tell() - member.offset
                member.info.type = tarfile.REGTYPE  # a GNU sparse file is written out whole
            members[info.name] = member  # a later entry of the same name replaces the earlier, as extraction does
    return members


def _relink(members: dict[str, _Member]) -> None:
    """Make the first name (in sorted order) of each hard-link group the one that carries the data."""
    groups: dict[str, list[str]] = {}
    for name, m in members.items():
        if m.info.islnk() and m.info.linkname in members:
            groups.setdefault(m.info.linkname, [m.info.linkname]).append(name)
    for target, names in groups.items():
        first = min(names, key=_order)
        if first == target:
            continue
        data = members[target]
        moved = copy.copy(data.info)
        moved.name = first
        members[first] = _Member(moved, data.offset, data.size)
        for name in names:
            if name != first:
                link = copy.copy(members[name].info if name != target else data.info)
                link.name, link.type, link.linkname, link.size = name, tarfile.LNKTYPE, first, 0
                members[name] = _Member(link)


def normalize(src: IO[bytes], out: IO[bytes], epoch: int, spool: Path | None = None) -> None:
    """Read the layer tar ``src`` and write its normalized form to ``out`` (see the module)."""
    with tempfile.TemporaryFile(dir=spool) as data:
        members = _read(src, data, epoch)
        _relink(members)
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(members, key=_order):
                m = members[name]
                if m.info.isreg():
                    data.seek(m.offset)
                    m.info.size = m.size
                    tar.addfile(m.info, _Slice(data, m.size))
                else:
                    tar.addfile(m.info)


class _Slice:
    """``size`` bytes of ``fh`` from its current position, as a readable file."""

    def __init__(self, fh: IO[bytes], size: int):
        self.fh, self.left = fh, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.fh.read(n)
        self.left -= len(data)
        return data
