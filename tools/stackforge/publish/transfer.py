"""Concurrent blob transfer for one publish: skip what the repository has, mount what a sibling has, upload the rest.

:class:`Uploader` takes blobs as they become ready (the export hands over each layer as soon as it is
compressed, so uploads overlap the compression of the next layer) and pushes them on a bounded pool.
For each blob, in order: ``HEAD`` in the target repository (present: skipped); a cross-repository
mount from a repository of the same registry this host pushed it to before (the :class:`LayerCache`
remembers where blobs went), or one named in ``mount_from``; otherwise a monolithic upload, with the
registry client's retries. Every blob is pushed at most once per publish; :meth:`wait` raises the
first failure after the others have finished. The manifest is built from the export, never from the
order in which uploads complete.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stackforge import progress, signals
from stackforge.clients.registry import RegistryClient
from stackforge.publish.oci import Blob, LayerCache

UPLOADS = 4  # concurrent blob pushes: enough to hide per-request latency, few enough for a registry


@dataclass
class Uploader:
    client: RegistryClient
    log: Callable[..., None]
    cache: LayerCache | None = None
    mount_from: tuple[str, ...] = ()  # repository names on the same registry to try mounting from
    workers: int = UPLOADS
    echo: Callable[[str], None] | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"skipped": 0, "mounted": 0, "uploaded": 0})

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="upload")
        self._futures: dict[str, Future[str]] = {}
        self._lock = threading.Lock()

    # -- where a blob may come from -------------------------------------------------------------

    def _sources(self, diff_id: str | None) -> list[str]:
        """Repository names of this registry to mount from: remembered pushes first, then ``mount_from``."""
        host = self.client.repository.host
        names: list[str] = []
        for ref in self.cache.sources(diff_id) if self.cache is not None and diff_id else []:
            ref_host, _, name = ref.partition("/")
            if ref_host == host and name and name != self.client.repository.name:
                names.append(name)
        names += [n for n in self.mount_from if n != self.client.repository.name]
        return list(dict.fromkeys(names))

    def available(self, digest: str, diff_id: str | None = None) -> bool:
        """Does the target repository hold ``digest`` now, after a mount where one is possible?"""
        if self.client.blob_exists(digest):
            self.log("blob-exists", digest=digest)
            return True
        return self._mount(digest, diff_id)

    def _mount(self, digest: str, diff_id: str | None) -> bool:
        for source in self._sources(diff_id):
            if self.client.mount_blob(digest, source):
                self.log("blob-mounted", digest=digest, source=source)
                with self._lock:
                    self.counts["mounted"] += 1
                return True
        return False

    # -- pushing ------------------------------------------------------------------------------

    def submit(self, blob: Blob) -> Future[str]:
        """Push ``blob`` in the background (once per digest); the future's result says how."""
        with self._lock:
            fut = self._futures.get(blob.digest)
            if fut is None:
                fut = self._futures[blob.digest] = self._pool.submit(self._push, blob)
            return fut

    def push_all(self, blobs: Iterable[Blob]) -> dict[str, str]:
        """Push every blob not yet submitted, wait for all; digest → "skipped" | "mounted" | "uploaded"."""
        for blob in blobs:
            if not blob.remote:
                self.submit(blob)
        return self.wait()

    def wait(self) -> dict[str, str]:
        with self._lock:
            futures = dict(self._futures)
        first: BaseException | None = None
        out: dict[str, str] = {}
        for digest, fut in futures.items():
            try:
                out[digest] = signals.result(fut)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _push(self, blob: Blob) -> str:
        if self.client.blob_exists(blob.digest):
            self.log("blob-exists", digest=blob.digest, size=blob.size)
            how = "skipped"
        elif self._mount(blob.digest, blob.cache_key):
            return self._pushed(blob, "mounted")
        else:
            t = time.monotonic()
            self.log("blob-upload", digest=blob.digest, size=blob.size, media_type=blob.media_type)
            # Running byte counts for a long upload (the push log has its start and end).
            moving = progress.Transfer(f"upload {blob.digest[:19]}", blob.size, self.echo)
            self.client.upload_blob(blob.digest, blob.size, functools.partial(_counted, blob, moving))
            self.log("blob-uploaded", digest=blob.digest, seconds=round(time.monotonic() - t, 3))
            how = "uploaded"
        with self._lock:
            self.counts[how] += 1
        return self._pushed(blob, how)

    def _pushed(self, blob: Blob, how: str) -> str:
        if self.cache is not None and blob.cache_key and blob.media_type.endswith(("+gzip", "+zstd")):
            self.cache.record(blob.cache_key, blob.digest, blob.size, str(self.client.repository), blob.diff_id)
        return how


class _BigReads:
    """An upload body that hands the HTTP client 1 MiB at a time (it asks for 16 KiB), with a ``len``."""

    def __init__(self, raw: Any):
        self.raw = raw

    def read(self, n: int = -1) -> bytes:
        return self.raw.read(-1 if n is None or n < 0 else max(n, 1 << 20))

    def __len__(self) -> int:
        return len(self.raw)

    def close(self) -> None:
        self.raw.close()


def _counted(blob: Blob, moving: progress.Transfer) -> _BigReads:
    """A fresh upload body for ``blob`` that reports its bytes to ``moving``."""
    return _BigReads(progress.CountingReader(blob.open(), blob.size, moving))
