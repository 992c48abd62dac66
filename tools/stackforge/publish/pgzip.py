"""Deterministic parallel gzip: one gzip member whose deflate stream is cut into fixed-size blocks.

Every block of ``BLOCK`` input bytes is deflated on its own (the deflater releases the GIL, so a thread
pool uses every core), primed with the previous block's last 32 KiB as its dictionary, and ends with a
sync flush; the last block ends the stream. The output depends only on the input, the level and
the block size — never on the number of workers or on timing — so the same layer gives the same
blob on every run and every host with the same deflater. Input is hashed (sha256, the diff id) and
check-summed (crc32) in order while the blocks compress.

Levels 1-3 (:data:`FAST_LEVELS`) deflate with ISA-L (``isal``: Intel's SIMD deflate, its levels 1-3), several
times zlib's level-1 speed at about its ratio (``docs/publish.md``); levels 4-9 with zlib. ISA-L picks its code by CPU features, so
hosts of different architectures are not promised the same bytes from it; where they must write the same blobs
(a shared layer cache, digests compared across architectures), a zlib level is the choice.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO

from isal import isal_zlib

BLOCK = 1 << 20
_WINDOW = 32 << 10
# magic, deflate, no flags, mtime 0, no extra flags, OS "unknown": no name, no time
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
#: the levels ISA-L deflates (at the same level number); zlib the others
FAST_LEVELS = range(1, 4)
_MEM_LEVEL = 8  # part of the output for both deflaters (ISA-L: its hash table's size), so fixed


def workers() -> int:
    """Compression threads: one per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _deflate(block: bytes, dictionary: bytes, level: int, last: bool) -> bytes:
    lib = isal_zlib if level in FAST_LEVELS else zlib
    primed = (dictionary,) if dictionary else ()
    c = lib.compressobj(level, lib.DEFLATED, -15, _MEM_LEVEL, lib.Z_DEFAULT_STRATEGY, *primed)
    return c.compress(block) + c.flush(lib.Z_FINISH if last else lib.Z_SYNC_FLUSH)


def blocks(chunks: Iterable[bytes], block: int) -> Iterator[bytes]:
    """Yield ``block``-sized pieces of the concatenated ``chunks`` (the last may be shorter, and is empty when the
    input is empty or a multiple of ``block``); each piece is one join of the chunks it spans, a chunk split where
    a piece ends."""
    parts: list[memoryview] = []
    have = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while have + len(view) >= block:
            take = block - have
            parts.append(view[:take])
            yield b"".join(parts)
            view = view[take:]
            parts, have = [], 0
        if view:
            parts.append(view)
            have += len(view)
    yield b"".join(parts)


def reads(src: IO[bytes], block: int = BLOCK) -> Iterator[bytes]:
    """``src`` read to its end, ``block`` bytes at a time."""
    return iter(lambda: src.read(block), b"")


def compress(
    src: IO[bytes],
    write: Callable[[bytes], object],
    *,
    level: int,
    pool: ThreadPoolExecutor | None = None,
    head: bytes = b"",
    block: int = BLOCK,
) -> str:
    """Gzip ``head`` + ``src`` into ``write``; returns the input's sha256 digest (``sha256:…``). See
    :func:`compress_chunks`."""
    return compress_chunks(itertools.chain((head,), reads(src, block)), write, level=level, pool=pool, block=block)


def compress_chunks(
    chunks: Iterable[bytes],
    write: Callable[[bytes], object],
    *,
    level: int,
    pool: ThreadPoolExecutor | None = None,
    block: int = BLOCK,
) -> str:
    """Gzip the concatenated ``chunks`` into ``write``; returns the input's sha256 digest (``sha256:…``).

    ``pool`` runs the blocks (None: compress in this thread); at most four per core are in flight.
    """
    diff = hashlib.sha256()
    crc, total = 0, 0
    depth = 4 * workers() if pool is not None else 1
    pending: deque[Future[bytes] | bytes] = deque()
    write(_HEADER)
    previous = b""
    pieces = blocks(chunks, block)
    current = next(pieces)
    while True:
        following = next(pieces, None)
        last = not following  # None (the end) or the empty piece after a whole last block
        diff.update(current)
        crc = isal_zlib.crc32(current, crc)
        total += len(current)
        dictionary = previous[-_WINDOW:]
        if pool is None:
            pending.append(_deflate(current, dictionary, level, last))
        else:
            pending.append(pool.submit(_deflate, current, dictionary, level, last))
        while len(pending) > (0 if last else depth):
            done = pending.popleft()
            write(done if isinstance(done, bytes) else done.result())
        if last:
            break
        assert following is not None
        previous, current = current, following
    write(struct.pack("<II", crc & 0xFFFFFFFF, total & 0xFFFFFFFF))
    return "sha256:" + diff.hexdigest()
