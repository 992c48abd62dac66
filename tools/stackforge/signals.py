"""SIGINT and SIGTERM as an exception, so every ``finally`` runs: secret files are removed, the engine
process group is stopped and a failure record is written before the command exits.

``handle_signals()`` installs the handlers for the life of a command. The first signal raises
``Interrupted`` in the main thread; a second one while that unwinds is ignored, so the cleanup
itself is not cut short. The CLI turns ``Interrupted`` into one line and exit ``128 + signal``
(130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM)


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
