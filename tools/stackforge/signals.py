"""SIGINT and SIGTERM as an exception, so every ``finally`` runs: secret files are removed, the engine
process group is stopped and a failure record is written before the command exits.

``handle_signals()`` installs the handlers for the life of a command. The first signal raises
``Interrupted`` in the main thread; a second one while that unwinds is ignored, so the cleanup
itself is not cut short. The CLI turns ``Interrupted`` into one line and exit ``128 + signal``
(130 for SIGINT, 143 for SIGTERM).

Python runs signal handlers in the main thread only. Work the main thread hands to other threads (the platforms of
one ``verify --all-platforms``) runs under a :class:`Stop` (:func:`stoppable`); when the main thread is
interrupted it calls ``Stop.stop(signum)``, which ends the process groups those threads are running (a build, a
pull, any docker or git command started through ``clients``) and makes each of them raise ``Interrupted`` once, as
a signal would have there: when its stopped process has ended, or when it next starts one (:func:`while_running`,
:func:`checkpoint`). What a thread runs after that, unwinding (dropping a tag, putting one back), is not stopped,
as the second signal is ignored in the main thread. The main thread itself waits for other threads' work in slices
(:func:`result`, :data:`POLL`): a signal the kernel gave one of those threads runs its handler only when the main
thread next runs Python code.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import TypeVar

HANDLED = (signal.SIGINT, signal.SIGTERM)
#: how long a wait of the main thread for other threads' work lasts at most before it runs Python code again: a
#: signal the kernel gave another thread of the process reaches its handler in the main thread only then
POLL = 0.25

T = TypeVar("T")


class Interrupted(BaseException):
    """The command received SIGINT or SIGTERM. ``notes`` say what was cleaned up on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.notes: list[str] = []

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def render(self) -> str:
        what = "; ".join(self.notes) if self.notes else "stopped before it finished; nothing was tagged"
        return f"error: interrupted by {self.name}; {what}"


@contextmanager
def handle_signals() -> Iterator[None]:
    """Raise ``Interrupted`` on the first SIGINT/SIGTERM; restore the previous handlers on exit.
    Outside the main thread (where handlers cannot be set) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, _frame):
        if fired:
            return  # already unwinding: let the cleanup finish
        fired.append(signum)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in HANDLED}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Stop:
    """Stops the work of the threads that run under it (:func:`stoppable`): ``stop(signum)`` calls the ender of
    every process they are running (:func:`while_running`), and each of those threads raises ``Interrupted(signum)``
    once, at its next :func:`checkpoint` (the end of a stopped process, the start of the next one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.signum: int | None = None
        self._enders: dict[object, Callable[[], object]] = {}
        self._raised: set[int] = set()  # threads that have raised it: their unwinding runs on

    def stop(self, signum: int) -> None:
        """Stop the threads' work (the first call counts); ``signum`` is what they raise ``Interrupted`` with."""
        with self._lock:
            if self.signum is not None:
                return
            self.signum = signum
            enders = list(self._enders.values())
        for end in enders:
            end()

    def check(self) -> None:
        """Raise ``Interrupted`` in this thread if the work was stopped and this thread has not raised it yet."""
        with self._lock:
            me = threading.get_ident()
            if self.signum is None or me in self._raised:
                return
            self._raised.add(me)
            signum = self.signum
        raise Interrupted(signum)

    @contextmanager
    def running(self, end: Callable[[], object]) -> Iterator[None]:
        """A process runs in this block: ``end()`` (which must not raise) ends it if the work is stopped meanwhile;
        stopped already, this raises at once (the process was just started: its caller ends it)."""
        key = object()
        with self._lock:
            if self.signum is None:
                self._enders[key] = end
        try:
            self.check()
            yield
        finally:
            with self._lock:
                self._enders.pop(key, None)


_local = threading.local()


@contextmanager
def stoppable(stop: Stop) -> Iterator[None]:
    """Run the block (in a thread that is not the main one) under ``stop``."""
    previous = getattr(_local, "stop", None)
    _local.stop = stop
    try:
        yield
    finally:
        _local.stop = previous


def checkpoint() -> None:
    """Raise ``Interrupted`` here when this thread runs under a :class:`Stop` that was stopped (once per thread)."""
    stop: Stop | None = getattr(_local, "stop", None)
    if stop is not None:
        stop.check()


@contextmanager
def while_running(end: Callable[[], object]) -> Iterator[None]:
    """A process runs in this block; under a :class:`Stop`, ``end()`` ends it when the work is stopped (see
    :meth:`Stop.running`). In the main thread, or any thread not under one, this does nothing."""
    stop: Stop | None = getattr(_local, "stop", None)
    if stop is None:
        yield
        return
    with stop.running(end):
        yield


def result(future: Future[T]) -> T:
    """``future.result()``, waited for in slices of :data:`POLL`: a wait with no end in the main thread may never run
    the handler of a signal another thread took (a thread of the pool), so SIGINT would wait for the work."""
    while True:
        try:
            return future.result(timeout=POLL)
        except FutureTimeout:
            continue
