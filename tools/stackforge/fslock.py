"""One writer per build directory, and writes into it that land whole or not at all.

``stack_lock(build/<stack>/)`` holds an exclusive ``flock`` on ``build/.<stack>.lock`` for a whole
render, build, bake or publish of that stack. A second stackforge on the same directory waits
(saying so on stderr, naming the holder's pid) up to a timeout, or refuses at once with a timeout
of 0 (``--no-wait``). The kernel drops the lock when its holder exits, however it exits, so a lock
is never stale. Different directories (other stacks, or ``--out DIR``) never wait for each other.
The wait itself is :func:`flock_wait`, the one wait loop for any exclusive ``flock`` in stackforge.

Inside the lock, an ``OSError`` that means the disk is full, read-only or forbidden becomes one
:class:`UserError` naming the path and the fix (:func:`fs_error`); ``atomic_write`` writes a file
under a temporary name and renames it into place, so a reader sees the old file or the new one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from stackforge.errors import UserError

LOCK_NAME = ".lock"
TIMEOUT_ENV = "STACKFORGE_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 3600.0  # seconds a second writer of one build directory waits
POLL = 0.2

REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}

_held: dict[str, int] = {}  # realpath of a build directory -> nesting depth, in this process
_held_guard = threading.Lock()


def lock_timeout(seconds: float | None = None) -> float:
    """``seconds`` if given, else ``$STACKFORGE_LOCK_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`."""
    if seconds is not None:
        return max(0.0, float(seconds))
    env = os.environ.get(TIMEOUT_ENV)
    if not env:
        return DEFAULT_TIMEOUT
    try:
        return max(0.0, float(env))
    except ValueError:
        raise UserError(
            f"{TIMEOUT_ENV}={env!r} is not a number of seconds",
            file=TIMEOUT_ENV,
            fix=f"set {TIMEOUT_ENV} to e.g. 600, or 0 to never wait",
        ) from None


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, with a trailing slash."""
    try:
        text = str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(path)
    return text.rstrip("/") + "/"


def _holder(fd: int) -> str:
    """The pid the current holder wrote into the lock file ("unknown" before it has written it)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def flock_wait(fd: int, timeout: float, on_wait: Callable[[], None] | None = None, *, poll: float = POLL) -> bool:
    """Take an exclusive ``flock`` on ``fd``, waiting up to ``timeout`` seconds (0: one try).

    ``on_wait`` is called once, when the lock is busy and the wait begins. Returns False when
    the lock is still held by another process at the deadline; the caller says why it gave up.
    """
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            return False
        if not waited:
            if on_wait is not None:
                on_wait()
            waited = True
        time.sleep(poll)


def _acquire(fd: int, build_dir: Path, timeout: float, echo: Callable[[str], None]) -> None:
    if flock_wait(
        fd, timeout, lambda: echo(f"waiting for another stackforge on {_shown(build_dir)} (pid {_holder(fd)})…")
    ):
        return
    pid = _holder(fd)
    how = "not waiting (--no-wait)" if timeout == 0 else f"gave up after waiting {timeout:.0f} s"
    raise UserError(
        f"another stackforge (pid {pid}) is writing {_shown(build_dir)}; {how}; nothing was written",
        file=lock_path(build_dir),
        fix=f"wait for pid {pid} to finish (or stop it), write elsewhere with --out DIR, "
        f"or wait longer with --lock-timeout SECONDS / {TIMEOUT_ENV}",
    )


def _write_pid(fd: int) -> None:
    """Record the holder's pid for waiters; best effort (a full disk is reported by the real write)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


def lock_path(build_dir: Path) -> Path:
    """The lock file of ``build_dir``: beside it (``build/.<stack>.lock``), so a command that fails before
    writing anything leaves the directory itself untouched, and removing the directory never removes a
    lock another process waits on."""
    return build_dir.parent / f".{build_dir.name}{LOCK_NAME}"


@contextmanager
def stack_lock(
    build_dir: Path, *, timeout: float | None = None, echo: Callable[[str], None] | None = None
) -> Iterator[Path]:
    """Hold the exclusive lock of ``build_dir`` (see :func:`lock_path`) for the ``with`` block.

    Re-entrant within a process (a build that assembles its context takes it once). ``timeout``
    is how long to wait for another holder (see :func:`lock_timeout`; 0 refuses at once); giving
    up is a :class:`UserError` naming the holder's pid. A full, read-only or forbidden file system
    met inside the block is a :class:`UserError` too (:func:`fs_errors`).
    """
    build_dir = Path(build_dir)
    with fs_errors(build_dir):
        key = os.path.realpath(build_dir)
        with _held_guard:
            depth = _held.get(key, 0)
            if depth:
                _held[key] = depth + 1
        if depth:
            try:
                yield build_dir
            finally:
                with _held_guard:
                    _held[key] -= 1
            return
        if build_dir.exists() and not build_dir.is_dir():
            raise UserError(
                f"cannot use {build_dir}: it exists and is not a directory; nothing was written",
                fix="name a directory (or a path that does not exist yet) with --out DIR",
            )
        build_dir.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(build_dir), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            _acquire(fd, build_dir, lock_timeout(timeout), echo or _stderr)
            _write_pid(fd)
            with _held_guard:
                _held[key] = 1
            try:
                yield build_dir
            finally:
                with _held_guard:
                    _held.pop(key, None)
        finally:
            os.close(fd)  # releases the flock


@contextmanager
def stack_locks(build_dirs: Iterable[Path], *, timeout: float | None = None) -> Iterator[None]:
    """Hold the locks of several build directories, taken in one order (so two holders cannot deadlock)."""
    with ExitStack() as stack:
        for d in sorted({os.path.realpath(p): Path(p) for p in build_dirs}.items()):
            stack.enter_context(stack_lock(d[1], timeout=timeout))
        yield


@contextmanager
def entry_lock(entry: Path, what: str, *, timeout: float | None = None) -> Iterator[None]:
    """Hold the exclusive lock of a cache entry (``entry``: the directory or file it guards; the lock file beside
    it, :func:`lock_path`) while it is made: one writer at a time, in other processes and in other threads of this
    one alike (each holder opens the lock file itself, and two opens' ``flock`` exclude each other in one process
    too). Not re-entrant. ``timeout`` as :func:`lock_timeout`; giving up is a :class:`UserError` naming the holder.

    The cache keeps no lock files: the holder removes its lock file before it lets go, and a waiter that then holds
    a file no longer at the path opens the path again (whoever holds the file at the path holds the lock)."""
    lock = lock_path(Path(entry))
    lock.parent.mkdir(parents=True, exist_ok=True)
    wait = lock_timeout(timeout)
    deadline = time.monotonic() + wait
    said: list[bool] = []
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:

            def waiting(fd: int = fd) -> None:
                if not said:
                    said.append(True)
                    _stderr(f"waiting for another stackforge (pid {_holder(fd)}) making {what}…")

            if not flock_wait(fd, max(0.0, deadline - time.monotonic()), waiting):
                raise UserError(
                    f"another stackforge (pid {_holder(fd)}) is making {what}; gave up after waiting {wait:.0f} s",
                    file=lock,
                    fix=f"wait for it to finish (or stop it), or wait longer with {TIMEOUT_ENV}",
                )
            if _same_file(fd, lock):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed by the holder before: the lock is the file at the path now
    try:
        _write_pid(fd)
        yield
    finally:
        try:
            lock.unlink()
        except OSError:
            pass
        os.close(fd)  # releases the flock


def _same_file(fd: int, path: Path) -> bool:
    try:
        at = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (at.st_dev, at.st_ino) == (mine.st_dev, mine.st_ino)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Writes
# --------------------------------------------------------------------------------------------


def temp_beside(path: Path, suffix: str = ".tmp") -> Path:
    """A temporary name beside ``path`` of this process and thread: two writers of one file (two processes, or two
    threads of one) never write into each other's temporary file; the last rename wins whole."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}{suffix}")


def atomic_write(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it and ``os.replace``.

    On failure the temporary file is removed and the ``OSError`` names ``path``.
    """
    path = Path(path)
    tmp = temp_beside(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename in (None, str(tmp)):
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    return path


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _errno_and_path(exc: OSError) -> tuple[int | None, str | None]:
    """errno and path of an OSError; a ``shutil.Error`` carries them as text in its first failure."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        first = exc.args[0][0]
        if isinstance(first, tuple) and len(first) == 3:
            m = re.search(r"\[Errno (\d+)\]", str(first[2]))
            return (int(m.group(1)) if m else None), str(first[1])
    return exc.errno, exc.filename


def fs_error(exc: OSError, where: Path | None = None) -> UserError | None:
    """The :class:`UserError` for a full, read-only or forbidden file system (None for other errors)."""
    code, path = _errno_and_path(exc)
    if code not in REASONS:
        return None
    path = path or (str(where) if where is not None else "build/")
    cache = os.environ.get("STACKFORGE_CACHE")
    in_cache = "/build/cache" in f"/{path}" or bool(cache and str(path).startswith(cache))
    elsewhere = (
        "point the download cache elsewhere with STACKFORGE_CACHE=DIR"
        if in_cache
        else "write the build directory elsewhere with --out DIR (the download cache: STACKFORGE_CACHE=DIR)"
    )
    first = {
        errno.ENOSPC: "free space there",
        errno.EDQUOT: "free space there or raise the quota",
        errno.EROFS: "make that file system writable",
    }.get(code, "make it writable for this user")
    return UserError(f"cannot write {path}: {REASONS[code]}", fix=f"{first}, or {elsewhere}")


@contextmanager
def fs_errors(where: Path | None = None) -> Iterator[None]:
    """Turn a full, read-only or forbidden file system met in the block into one :class:`UserError`."""
    try:
        yield
    except OSError as exc:
        err = fs_error(exc, where)
        if err is None:
            raise
        raise err from None


def file_sha256(path: Path | str) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
