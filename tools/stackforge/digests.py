"""The two digests every "inputs unchanged" check is made of: a tree's content and the code's identity.

:func:`tree_digest` hashes a directory tree (path, kind, mode bits, and the bytes or the link target of
each entry; with ``portable_modes`` a file's mode as the build context gives it, :func:`portable_mode`);
:func:`code_fingerprint` names the code that runs (the interpreter, stackforge's modules and some libraries, by
path, size and mtime: cheap enough for a command's start). Standard library only: the
up-to-date check and ``list`` use both before any library is imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

import stackforge

PACKAGE = Path(stackforge.__file__).resolve().parent
#: the files a code fingerprint reads: modules and extension libraries
CODE_SUFFIXES = (".py", ".so", ".pyd")


def file_digest(path: Path) -> str:
    """The sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: The modes a build context gives its entries (see :func:`portable_mode`).
DIR_MODE = 0o755
EXEC_MODE = 0o755
FILE_MODE = 0o644


def portable_mode(st_mode: int) -> int:
    """The mode of an entry as the build context gives it, whatever the umask it was written under: 0755 for a
    directory and for a file its owner may execute (git's 100755, an archive's x bit: a umask takes away group and
    other bits, not the owner's), else 0644."""
    if stat.S_ISDIR(st_mode):
        return DIR_MODE
    return EXEC_MODE if st_mode & stat.S_IXUSR else FILE_MODE


def tree_digest(
    top: Path, *, follow_links: bool = False, skip: Iterable[str] = (), portable_modes: bool = False
) -> str:
    """``sha256:`` over every entry under ``top``, in sorted order: each directory (``D path``), each file
    (``F path mode sha256``) and, unless ``follow_links``, each symlink as its target (``L path target``).
    With ``follow_links`` a link is hashed as what it points to (a directory is walked), except a dangling one
    and one that leads back to a directory it is under (a cycle), which are hashed as links. Directories named
    in ``skip`` (at any depth, e.g. ``__pycache__``) are left out, with what is under them. A file as ``top`` is
    one entry, named ``.``. With ``portable_modes`` a file's mode is hashed as :func:`portable_mode` gives it, so
    the same files written under another umask have the same digest."""
    skipped = frozenset(skip)
    h = hashlib.sha256()
    if not top.is_dir() or (top.is_symlink() and not follow_links):
        _entry(h, top, ".", follow_links, portable_modes)
        return "sha256:" + h.hexdigest()
    chains = {os.fspath(top): frozenset({os.path.realpath(top)})}  # each directory's real path and its parents'
    for dirpath, dirnames, filenames in os.walk(top, followlinks=follow_links):
        base, chain = Path(dirpath), chains.pop(dirpath, frozenset())
        dirnames[:] = sorted(d for d in dirnames if d not in skipped)
        links = [
            d for d in dirnames if (base / d).is_symlink() and (not follow_links or os.path.realpath(base / d) in chain)
        ]
        dirnames[:] = [d for d in dirnames if d not in links]
        if follow_links:
            chains.update((os.path.join(dirpath, d), chain | {os.path.realpath(base / d)}) for d in dirnames)
        for name in sorted(filenames + links):
            path = base / name
            _entry(h, path, path.relative_to(top).as_posix(), follow_links and name not in links, portable_modes)
        for name in dirnames:
            h.update(f"D {(base / name).relative_to(top).as_posix()}\n".encode())
    return "sha256:" + h.hexdigest()


def _entry(h, path: Path, rel: str, follow: bool, portable: bool = False) -> None:
    """One file or link of a tree (a link followed when ``follow`` and it leads somewhere)."""
    st = path.stat() if follow and path.exists() else path.lstat()
    if stat.S_ISLNK(st.st_mode):
        h.update(f"L {rel} {os.readlink(path)}\n".encode())
    else:
        mode = portable_mode(st.st_mode) if portable else stat.S_IMODE(st.st_mode)
        h.update(f"F {rel} {mode:o} {file_digest(path)}\n".encode())


def code_fingerprint(libraries: Iterable[str] = (), *, within: Iterable[str] | None = None) -> str:
    """The interpreter, stackforge's version and the path, size and mtime of every module of stackforge
    (only those under ``within``, paths relative to the package, when given) and of each library in
    ``libraries`` (importable names; a missing one counts as missing)."""
    h = hashlib.sha256(f"{sys.version}\0{sys.prefix}\0{stackforge.__version__}\n{PACKAGE}\n".encode())
    for rel in sorted(within) if within is not None else [""]:
        _code_stat(h, PACKAGE / rel, rel)
    for lib in libraries:
        spec = importlib.util.find_spec(lib)
        origin = spec.origin if spec else None
        h.update(f"{lib}\0{origin}\n".encode())
        if origin:
            _code_stat(h, Path(origin).parent, "")
    return h.hexdigest()


def _code_stat(h, path: Path, label: str) -> None:
    if path.is_file():
        st = path.stat()
        h.update(f"{label}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return
    h.update(f"{label}/\n".encode())
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        rel = os.path.relpath(dirpath, path)
        prefix = "" if rel == os.curdir else rel + os.sep
        for fname in sorted(filenames):
            if fname.endswith(CODE_SUFFIXES):
                st = os.stat(os.path.join(dirpath, fname))
                h.update(f"{prefix}{fname}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
