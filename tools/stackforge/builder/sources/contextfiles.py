"""The files of a build context as the engine copies them into an image: one mode rule and one time, whatever the
host, umask, clock or time zone that wrote them.

COPY keeps a file's mode and modification time, and a module Python imports from a copied file records that
time in its bytecode, so a context written under another umask or at another minute would give other layer bytes.
Once a context is written, every entry under it is set to:

- mode 0755 for a directory and for a file its owner may execute (git's 100755, an archive's x bit: a umask
  takes away group and other bits, not the owner's), else 0644 (:func:`stackforge.digests.portable_mode`);
  set-id and sticky bits are dropped. A symbolic link keeps its target (a link has no mode of its own);
- modification (and access) time :func:`context_time` in whole seconds: the stack's layer epoch when the base
  image records its creation time, else :data:`CONTEXT_TIME`; links included. The fraction of a second is taken
  from the entry's bytes (a file's content, a link's target; a directory's is zero): BuildKit sends a local context
  incrementally, keeping what it holds from the last context of the same directory name (every stack's is
  ``context``) for each file whose size, mode and time are unchanged, so one time for every file would let a changed
  file of the same size through as the old one. Layer tars record whole seconds (the publisher drops the finer
  pax times), and Python's bytecode headers whole seconds too, so the fraction reaches no published byte.

Files the caller names in ``keep_modes`` keep their modes (e.g. an overlay's files, whose modes the overlay
declares); trees named in ``skip`` are left as they are (e.g. the offline mirror's files, linked from the mirror
and only ever mounted into a step, never copied into a layer).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from stackforge.digests import portable_mode

#: 2000-01-01T00:00:00Z (the "portable" time of reproducible archive tools): the context's time when the base image
#: records no creation time. Older than any layer epoch, so the publisher keeps it as it is, and later than 1980, so
#: a zip made from the files (a wheel) can hold it.
CONTEXT_TIME = 946684800


def context_time(base_epoch: int | None) -> int:
    """The time a context's files are dated: the base image's creation time (the layer epoch, which the publisher
    clamps every later time to, so a file dated it reads the same whether the engine copied it now or from a cache
    made before), else :data:`CONTEXT_TIME`. Never the sources' time: one that moved with every upstream bump would
    date the dependency stages' files anew while their build cache (which does not look at times) keeps the old."""
    return base_epoch if base_epoch is not None and base_epoch > 0 else CONTEXT_TIME


def normalize_tree(top: Path, *, mtime: int | None, skip: Iterable[str] = (), keep_modes: Iterable[str] = ()) -> int:
    """Give every entry under ``top`` (``top`` included) the context's mode and the time ``mtime`` (None: modes
    only); ``skip`` and ``keep_modes`` are paths relative to ``top`` (a directory counts with what is under it).
    Returns how many entries were set."""
    skipped = {Path(p) for p in skip}
    kept = {Path(p) for p in keep_modes}
    count = _set(top, top.lstat(), keep=False, mtime=mtime)
    for dirpath, dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        rel = base.relative_to(top)
        keep_here = any(rel == k or k in rel.parents for k in kept)
        for name in list(dirnames):
            sub = rel / name
            if sub in skipped:
                dirnames.remove(name)
                continue
            path = base / name
            st = path.lstat()
            count += _set(path, st, keep=keep_here or sub in kept, mtime=mtime)
            if stat.S_ISLNK(st.st_mode):
                dirnames.remove(name)  # os.walk does not follow it; its entry is set above
        for name in filenames:
            if rel / name in skipped:
                continue
            path = base / name
            count += _set(path, path.lstat(), keep=keep_here or rel / name in kept, mtime=mtime)
    return count


def entry_time_ns(path: Path, st: os.stat_result, seconds: int) -> int:
    """``seconds`` with the fraction of a second taken from the entry's bytes (see the module)."""
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    elif stat.S_ISLNK(st.st_mode):
        h = hashlib.sha256(os.fsencode(os.readlink(path)))
    else:
        return seconds * 10**9
    return seconds * 10**9 + int.from_bytes(h.digest()[:8], "big") % 10**9


def _set(path: Path, st: os.stat_result, *, keep: bool, mtime: int | None) -> int:
    if stat.S_ISLNK(st.st_mode):
        if mtime is not None and st.st_mtime_ns != (ns := entry_time_ns(path, st, mtime)):
            os.utime(path, ns=(ns, ns), follow_symlinks=False)
        return 1
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return 0  # a fifo, socket or device: not a context's entry, and the engine refuses to copy it
    if not keep and stat.S_IMODE(st.st_mode) != portable_mode(st.st_mode):
        os.chmod(path, portable_mode(st.st_mode))
    if mtime is not None and st.st_mtime_ns != (ns := entry_time_ns(path, st, mtime)):
        os.utime(path, ns=(ns, ns))
    return 1
