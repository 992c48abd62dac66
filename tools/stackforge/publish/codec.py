"""Layer compression: which codec a publish writes its layer blobs with, and at which level.

Both codecs are deterministic, so one layer gives one blob on every run and every host with the same library
(for gzip's ISA-L levels: on the same CPU architecture, see ``pgzip``):

- ``gzip`` (``pgzip``): parallel blocks of one gzip member; levels 1-9, default 2: 1-3 deflated by ISA-L, 4-9 by
  zlib. Every engine pulls it.
- ``zstd`` (python-zstandard, libzstd): level 1-19, default 3; compressed by libzstd's own worker threads. Its
  output depends on the level and the job size, never on the number of workers (for one or more workers; the
  single-threaded mode is never used), so hosts with different core counts write the same blob. Engines from
  Docker 23 and containerd 1.5 on pull ``application/vnd.oci.image.layer.v1.tar+zstd`` layers; older ones do not.

The default levels are measured on this project's images (``docs/publish.md``): gzip 2 (ISA-L's) is as fast as
ISA-L's level 1 with a smaller blob, and both are several times zlib's level 1; zstd 3 is a little slower than
gzip 2 with a blob a fifth smaller, and higher levels cost more time than they save in bytes.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, cast

from stackforge import extras
from stackforge.errors import UserError
from stackforge.publish import pgzip

OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"

#: name -> (lowest level, highest level, default level)
LEVELS: dict[str, tuple[int, int, int]] = {"gzip": (1, 9, 2), "zstd": (1, 19, 3)}
NAMES = ("gzip", "zstd", "none")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Codec:
    """A compressor and its level; ``key`` names both in the layer cache, so blobs of another codec never mix."""

    name: str
    level: int

    @property
    def media_type(self) -> str:
        return OCI_LAYER_ZSTD if self.name == "zstd" else OCI_LAYER_GZIP

    @property
    def key(self) -> str:
        """``igzip-N`` (ISA-L's gzip levels), ``pgzip-N`` (zlib's), ``zstd-N``."""
        if self.name == "gzip":
            return f"{'igzip' if self.level in pgzip.FAST_LEVELS else 'pgzip'}-{self.level}"
        return f"{self.name}-{self.level}"

    def pool(self) -> ThreadPoolExecutor | None:
        """Threads for :meth:`compress` (gzip's blocks); zstd runs libzstd's own workers."""
        return ThreadPoolExecutor(pgzip.workers(), thread_name_prefix="pgzip") if self.name == "gzip" else None

    def compress(
        self,
        src: IO[bytes],
        write: Callable[[bytes], object],
        *,
        pool: ThreadPoolExecutor | None = None,
        head: bytes = b"",
    ) -> str:
        """Compress ``head`` + ``src`` into ``write``; returns the input's sha256 digest (the layer's diff id)."""
        return self.compress_chunks(itertools.chain((head,), pgzip.reads(src)), write, pool=pool)

    def compress_chunks(
        self, chunks: Iterable[bytes], write: Callable[[bytes], object], *, pool: ThreadPoolExecutor | None = None
    ) -> str:
        """Compress the concatenated ``chunks`` into ``write``; returns their sha256 digest (the layer's diff id)."""
        if self.name == "gzip":
            return pgzip.compress_chunks(chunks, write, level=self.level, pool=pool)
        return _zstd(chunks, write, self.level)


class _Sink:
    """The file-like object python-zstandard writes compressed bytes to."""

    def __init__(self, write: Callable[[bytes], object]):
        self._write = write

    def write(self, data: bytes) -> int:
        self._write(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def _zstd(chunks: Iterable[bytes], write: Callable[[bytes], object], level: int) -> str:
    zstandard = extras.need("zstandard", "zstd", "zstd layers (--compression zstd)")  # the only user

    diff = hashlib.sha256()
    compressor = zstandard.ZstdCompressor(
        level=level, threads=pgzip.workers(), write_checksum=True, write_content_size=False
    )
    with compressor.stream_writer(cast(IO[bytes], _Sink(write)), closefd=False) as out:
        for piece in pgzip.blocks(chunks, _CHUNK):  # whole pieces: fewer calls into libzstd
            diff.update(piece)
            out.write(piece)
    return "sha256:" + diff.hexdigest()


def codec(name: str, level: int | None = None) -> Codec | None:
    """The codec ``name`` at ``level`` (None: its default); None for ``none`` (layers stay uncompressed)."""
    if name not in NAMES:
        raise UserError(f"unknown layer compression {name!r}", fix=f"use one of: {', '.join(NAMES)}")
    if name == "none":
        return None
    if name == "zstd":
        extras.need("zstandard", "zstd", "zstd layers (--compression zstd)")
    low, high, default = LEVELS[name]
    if level is None:
        return Codec(name, default)
    if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= high:
        raise UserError(
            f"{name} level {level!r} is not {low}-{high}", fix=f"give a {name} level from {low} to {high}, or none"
        )
    return Codec(name, level)


def default_key() -> str:
    """The layer cache key of the default codec (gzip at its default level)."""
    return Codec("gzip", LEVELS["gzip"][2]).key
