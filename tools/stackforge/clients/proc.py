"""A program whose output is data from outside (a credential helper, git talking to a remote, the docker CLI
reporting on an image) runs here with a deadline and an output cap: a helper that never answers, or answers
endlessly, is stopped with its whole process group and reported, never waited for or read into memory whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stackforge import signals

MiB = 1 << 20
#: what one stream of a program may print before it is stopped
OUTPUT_LIMIT = 64 * MiB


@dataclass
class Finished:
    """How a bounded run ended: its exit status (None when it was stopped), what it printed (each stream cut at
    the cap), and why it was stopped (``timeout`` or ``output``), if it was."""

    argv: list[str]
    returncode: int | None
    stdout: bytes
    stderr: bytes
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.stopped is None and self.returncode == 0

    def text(self, stream: str = "stdout") -> str:
        return (self.stdout if stream == "stdout" else self.stderr).decode("utf-8", "replace")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Exceeded(subprocess.SubprocessError):
    """A program printed more than its cap and was stopped; ``output`` is what was kept."""

    def __init__(self, argv: Sequence[str], limit: int, output: bytes) -> None:
        super().__init__(f"{argv[0]} printed more than {limit} bytes and was stopped")
        self.limit, self.output = limit, output


def run(
    argv: Sequence[str],
    *,
    input: bytes | str | None = None,
    timeout: float,
    limit: int = OUTPUT_LIMIT,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    merge: bool = False,
) -> Finished:
    """Run ``argv`` (in its own process group) for at most ``timeout`` seconds, keeping at most ``limit`` bytes of
    each of its streams (``merge``: stderr goes into stdout). Over either bound the whole group is killed and
    :attr:`Finished.stopped` says which. ``FileNotFoundError`` (no such program) is raised as is. In a thread whose
    work is stopped (:class:`stackforge.signals.Stop`), the group is killed and ``Interrupted`` raised."""
    data = input.encode() if isinstance(input, str) else input
    signals.checkpoint()  # stopped work starts nothing new
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
    )
    out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    over = threading.Event()

    def drain(name: str, stream: IO[bytes]) -> None:
        buf = out[name]
        while True:
            block = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
            if not block:
                break
            room = limit - len(buf)
            buf += block[: max(room, 0)]
            if len(block) > room:
                over.set()
                _kill(proc)
                break
        stream.close()

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(data or b"")
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    streams = [("stdout", proc.stdout)] + ([] if merge else [("stderr", proc.stderr)])
    threads = [threading.Thread(target=drain, args=(n, s), daemon=True) for n, s in streams]
    if data is not None:
        threads.append(threading.Thread(target=feed, daemon=True))
    for t in threads:
        t.start()
    stopped: str | None = None
    try:
        with signals.while_running(lambda: _kill(proc)):
            proc.wait(timeout=timeout)
        signals.checkpoint()
    except subprocess.TimeoutExpired:
        stopped = "timeout"
        _kill(proc)
        proc.wait()
    except BaseException:
        _kill(proc)
        proc.wait()
        raise
    finally:
        for t in threads:
            t.join(timeout=5)
    if over.is_set():
        stopped = "output"
    rc = None if stopped else proc.returncode
    return Finished(list(argv), rc, bytes(out["stdout"]), bytes(out["stderr"]), stopped)


def completed(
    argv: Sequence[str],
    *,
    timeout: float,
    limit: int = OUTPUT_LIMIT,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess:
    """:func:`run` as a ``CompletedProcess`` of text (undecodable bytes replaced) for callers that read an exit
    status: a run stopped past its deadline exits 124, one stopped for its output 125, each saying so on stderr."""
    done = run(argv, timeout=timeout, limit=limit, env=env, cwd=cwd)
    if done.stopped == "timeout":
        return subprocess.CompletedProcess(
            list(argv), 124, done.text(), f"{argv[0]}: no answer within {timeout:g} s (stopped)\n"
        )
    if done.stopped == "output":
        return subprocess.CompletedProcess(
            list(argv), 125, done.text(), f"{argv[0]}: printed more than {limit} bytes (stopped)\n"
        )
    return subprocess.CompletedProcess(list(argv), done.returncode or 0, done.text(), done.text("stderr"))
