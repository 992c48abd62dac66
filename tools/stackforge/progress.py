"""Progress lines for steps that can take more than a few seconds (fetches, pulls, locks, uploads).

Progress goes to stderr, so stdout carries only a command's result (`$(stackforge tags X)`, `--json`).
A step says when it starts and when it ends with its duration; a transfer also says how many bytes
moved, at most once every few seconds while it runs::

    with step("fetch vllm (git)"):
        ...
    with transfer("upload layer sha256:ab12…", total=size) as t:
        for chunk in chunks:
            t.advance(len(chunk))

``STACKFORGE_PROGRESS=0`` silences them (tests that compare stderr, scripted use).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

INTERVAL_S = 5.0  # at most one running-transfer line per interval
HEARTBEAT_S = 10.0  # a step that runs longer says so this often: a quiet log is not a hung one


def enabled() -> bool:
    return os.environ.get("STACKFORGE_PROGRESS", "1") not in ("0", "false", "no")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def note(text: str, echo: Callable[[str], None] | None = None) -> None:
    """One progress line (``stackforge: <text>``) on stderr."""
    if enabled():
        (echo or _stderr)(f"stackforge: {text}")


def _heartbeat(what: str, echo: Callable[[str], None] | None, started: float, every: float, stop: threading.Event):
    while not stop.wait(every):
        note(f"{what}: still running after {time.monotonic() - started:.0f} s", echo)


@contextmanager
def step(what: str, echo: Callable[[str], None] | None = None, heartbeat: float = HEARTBEAT_S) -> Iterator[None]:
    """``<what>…`` when the step starts, ``<what>: still running after N s`` every ``heartbeat`` seconds while it
    runs, ``<what>: done in N s`` (or ``failed after N s``) when it ends."""
    started = time.monotonic()
    note(f"{what}…", echo)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(what, echo, started, heartbeat, stop), daemon=True)
    if enabled() and heartbeat > 0:
        beat.start()
    try:
        yield
    except BaseException:
        note(f"{what}: failed after {time.monotonic() - started:.1f} s", echo)
        raise
    finally:
        stop.set()
        if beat.is_alive():
            beat.join()
    note(f"{what}: done in {time.monotonic() - started:.1f} s", echo)


class Transfer:
    """Bytes moved by one download or upload; reports while it runs and when it ends."""

    def __init__(self, what: str, total: int | None, echo: Callable[[str], None] | None):
        self.what, self.total, self.echo = what, total, echo
        self.done = 0
        self.started = self.last = time.monotonic()

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= INTERVAL_S:
            self.last = now
            note(f"{self.what}: {self._amount()}", self.echo)

    def _amount(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        of = f" of {human_bytes(self.total)}" if self.total else ""
        return f"{human_bytes(self.done)}{of} ({human_bytes(self.done / elapsed)}/s)"

    def finish(self) -> None:
        note(f"{self.what}: {self._amount()} in {time.monotonic() - self.started:.1f} s", self.echo)


class CountingReader:
    """A readable that tells ``transfer`` how many bytes were read from it (an upload body). ``len()``
    is the size still to send, so an HTTP client sets Content-Length instead of chunking."""

    def __init__(self, raw, size: int, transfer: Transfer):
        self.raw, self.left, self.transfer = raw, size, transfer
        transfer.done = 0  # a retried upload starts from byte 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.left -= len(data)
        self.transfer.advance(len(data))
        return data

    def __len__(self) -> int:
        return max(self.left, 0)

    def close(self) -> None:
        self.raw.close()


@contextmanager
def transfer(what: str, total: int | None = None, echo: Callable[[str], None] | None = None) -> Iterator[Transfer]:
    t = Transfer(what, total, echo)
    yield t
    t.finish()
