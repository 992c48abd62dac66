"""Work handed to other threads stops as the main thread does on SIGINT/SIGTERM (``signals.Stop``): the process a
stopped thread runs (a docker or git command, a build) is ended and the thread raises ``Interrupted`` once, its
unwinding running on; and what two threads share on disk (a cache entry, a file written whole) is made by one at a
time. The threads here meet each other through files and events, never a clock."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from stackforge import signals
from stackforge.clients import proc as bounded
from stackforge.errors import UserError

#: how long a thread waits for another before the test fails (a guard against a hang, not a measurement)
GUARD = 60.0


def sleeper(tmp: Path, name: str) -> Path:
    """A pid file the stand-in's process writes when it runs."""
    return tmp / f"{name}.pid"


def run_until_stopped(pidfile: Path) -> None:
    """A process that runs until it is stopped, started as every docker and git command is (clients/proc.py)."""
    bounded.run(["sh", "-c", f'echo $$ > "{pidfile}"; exec sleep 600'], timeout=600)


def wait_for(path: Path) -> int:
    deadline = time.monotonic() + GUARD
    while not (path.is_file() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.01)
    return int(path.read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_stopped_thread_raises_once_and_its_unwinding_runs_its_commands(tmp_path):
    """After a stopped thread has raised Interrupted, what its cleanup runs (a docker tag, an image removal) runs to
    its end: the stop is not raised twice, and a process started then is not ended."""
    stop = signals.Stop()
    seen: list[object] = []
    pidfile = sleeper(tmp_path, "work")

    def work() -> None:
        with signals.stoppable(stop):
            try:
                run_until_stopped(pidfile)
            except signals.Interrupted as intr:
                seen.append(intr.signum)
                done = bounded.run(["sh", "-c", "echo cleaned"], timeout=60)
                seen.append(done.text().strip())

    t = threading.Thread(target=work)
    t.start()
    pid = wait_for(pidfile)
    stop.stop(signal.SIGTERM)
    t.join(GUARD)
    assert not t.is_alive() and seen == [signal.SIGTERM, "cleaned"] and gone(pid)
    with signals.stoppable(stop), pytest.raises(signals.Interrupted):
        bounded.run(["true"], timeout=60)  # a thread that has not raised it yet starts nothing


def test_a_build_stopped_from_another_thread_is_ended_and_raises(tmp_path):
    """The engine's streamed command (a build) run in a stopped thread: its process group gets SIGTERM, as
    ``stop_group`` begins, and the thread raises Interrupted once the command has ended."""
    from stackforge.clients.engine import Engine

    pidfile = tmp_path / "build.pid"
    stop = signals.Stop()
    seen: list[object] = []

    def work() -> None:
        with signals.stoppable(stop):
            try:
                Engine().stream(["sh", "-c", f'echo $$ > "{pidfile}"; echo step 1; exec sleep 600'])
            except signals.Interrupted as intr:
                seen.append(intr.name)

    t = threading.Thread(target=work)
    t.start()
    pid = wait_for(pidfile)
    stop.stop(signal.SIGINT)
    t.join(GUARD)
    assert not t.is_alive() and seen == ["SIGINT"] and gone(pid)


def test_a_cache_entry_is_made_by_one_thread_at_a_time_and_temporary_files_are_per_thread(tmp_path):
    """Two platforms' builds share the download cache: the lock of an entry (a git mirror, an sdist) held by one
    thread is refused to another thread of the same process as to another process, the next holder after it is
    the only holder, and no lock file stays in the cache; two threads writing one file never share a temporary
    file."""
    from stackforge import fslock

    entry = tmp_path / "cache" / "git" / "vllm-0123.git"
    mirror = "the mirror of vllm"
    holding, release, second = threading.Event(), threading.Event(), threading.Event()

    def hold(got: threading.Event, until: threading.Event) -> None:
        with fslock.entry_lock(entry, mirror, timeout=GUARD):
            got.set()
            until.wait(GUARD)

    refused = f"another stackforge (pid {os.getpid()}) is making {mirror}; gave up after waiting 0 s"
    first = threading.Thread(target=hold, args=(holding, release))
    first.start()
    assert holding.wait(GUARD)
    done = threading.Event()
    after = threading.Thread(target=hold, args=(second, done))  # waits for the first, then holds
    after.start()
    try:
        with pytest.raises(UserError) as err, fslock.entry_lock(entry, mirror, timeout=0):
            pass
        assert err.value.message == refused
        release.set()
        assert second.wait(GUARD)
        with pytest.raises(UserError) as err, fslock.entry_lock(entry, mirror, timeout=0):
            pass
        assert err.value.message == refused
    finally:
        release.set()
        done.set()
        first.join(GUARD)
        after.join(GUARD)
    assert list(entry.parent.iterdir()) == []  # no lock file kept
    with fslock.entry_lock(entry, mirror, timeout=0):  # free again
        pass
    names = [fslock.temp_beside(entry)]
    other = threading.Thread(target=lambda: names.append(fslock.temp_beside(entry)))
    other.start()
    other.join(GUARD)
    assert len(set(names)) == 2 and {n.parent for n in names} == {entry.parent}


def test_a_signal_a_pool_thread_took_reaches_the_main_thread_waiting_for_its_future():
    """The kernel may give a process's signal to any of its threads; Python runs the handler in the main thread when
    that next runs Python code. The main thread waiting with ``signals.result`` does within its poll: the handler
    runs while the work still waits for it (a plain ``future.result()`` would wait for the work first, here until
    the guard)."""
    from concurrent.futures import ThreadPoolExecutor

    handled = threading.Event()
    main = threading.main_thread().ident

    def work() -> bool:
        deadline = time.monotonic() + GUARD
        while getattr(sys._current_frames().get(main), "f_code", None) is None or (
            sys._current_frames()[main].f_code.co_name != "wait"  # the main thread waits for this work
        ):
            assert time.monotonic() < deadline, "the main thread never waited"
            time.sleep(0.01)
        time.sleep(0.1)  # from the wait's Python lines into its lock (the test passes at any pace with the poll)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # taken by this thread, not the main one
        return handled.wait(GUARD)

    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.set())
    try:
        with ThreadPoolExecutor(1) as pool:
            assert signals.result(pool.submit(work)) is True
    finally:
        signal.signal(signal.SIGUSR1, previous)
