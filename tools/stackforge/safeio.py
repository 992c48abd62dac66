"""What comes from outside the process is read within bounds: a file a user or a record names, a JSON document
from a file, a registry, a container or a helper program, a name that will become a path, a directory a
container wrote, text on its way to a terminal.

- :func:`read_bytes` / :func:`read_text`: regular files only (a FIFO, device or socket is refused without
  blocking on it), read as they go under a byte cap (``stat()`` says 0 for ``/dev/zero``), links refused or
  confined to a root, non-UTF-8 text reported with its offset.
- :func:`parse_json`: a JSON document from bytes or text under a size cap and a nesting cap (checked before the
  parser recurses), no ``NaN``/``Infinity``; :func:`read_json` reads a file so.
- :func:`validate` / :func:`load_model`: the document through a typed (pydantic) model; a wrong shape is one
  :class:`Malformed` error naming the source and the field.
- :func:`relative_name` / :func:`confined` / :func:`write_confined`: a name taken from data becomes a path only
  when it is relative, has no ``..`` and no link on its way out of its root.
- :class:`OutputDir`: an ``--out`` directory replaced whole only when this tool made it, and never when it is, or
  holds, an input of the same command.
- :func:`for_terminal`: text from outside with its control characters removed (escape sequences included).

Every refusal is a :class:`Malformed` (a ``UserError``, exit 1) naming the file or reference and what to do.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from stackforge.errors import UserError, for_terminal, printable
from stackforge.fslock import temp_beside

KiB = 1 << 10
MiB = 1 << 20
CHUNK = 256 * KiB

#: a JSON document a run keeps or reads back (summaries, inventories, evidence records, configs)
JSON_LIMIT = 64 * MiB
#: nesting a JSON document may have: the deepest document stackforge writes (a CycloneDX SBOM) is under 10
JSON_DEPTH = 64
#: a key file (PEM), a credential helper's answer
SMALL_LIMIT = 1 * MiB

#: the file an :class:`OutputDir` writes into the directory it made
OUTPUT_MARK = ".stackforge-output"


class Malformed(UserError):
    """Input from outside the process that is not what it must be: nothing of it was used."""

    def __init__(self, message: str, *, file: str | Path | None = None, fix: str | None = None) -> None:
        super().__init__(message, file=file, fix=fix, exit_code=1)


# --------------------------------------------------------------------------------------------------
# Files


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``, with every link resolved, is ``root`` or under it (``root`` resolved too)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _open_regular(path: Path, *, what: str, follow: bool, root: Path | None) -> int:
    """A descriptor of the regular file ``path``; a link is followed only when ``follow`` and, with ``root``,
    only to a place under it. Opening never blocks (a FIFO with no writer is refused, not waited for)."""
    if root is not None and not inside(path, root):
        raise Malformed(f"{what} leads out of {printable(root)}", file=path, fix="it must lie under that directory, with no link out of it")  # fmt: skip
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Malformed(f"{what} does not exist", file=path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Malformed(f"{what} is a symbolic link, which is not followed here", file=path, fix="name the file itself") from None  # fmt: skip
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a socket; a directory
            raise Malformed(f"{what} is not a regular file", file=path) from None
        raise Malformed(f"cannot read {what}: {exc.strerror}", file=path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Malformed(f"{what} is {_kind(mode)}, not a regular file", file=path, fix="name a regular file")  # fmt: skip
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(
    path: str | Path, *, limit: int, what: str = "file", follow: bool = True, root: str | Path | None = None
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (counted as they are read).

    ``follow=False`` refuses a link as the last component; ``root`` refuses a path that, links resolved, leaves it.
    """
    path = Path(path)
    fd = _open_regular(path, what=what, follow=follow, root=Path(root) if root is not None else None)
    chunks: list[bytes] = []
    total = 0
    try:
        while True:
            block = os.read(fd, min(CHUNK, limit + 1 - total))
            if not block:
                break
            total += len(block)
            if total > limit:
                raise Malformed(f"{what} is larger than {limit} bytes (the limit)", file=path)
            chunks.append(block)
    except OSError as exc:
        raise Malformed(f"cannot read {what}: {exc.strerror}", file=path) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode(data: bytes, *, source: str | Path, what: str = "file") -> str:
    """``data`` as UTF-8 (a leading byte-order mark dropped); an invalid byte is named with its offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Malformed(
            f"{what} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})",
            file=source,
        ) from None


def read_text(
    path: str | Path, *, limit: int, what: str = "file", follow: bool = True, root: str | Path | None = None
) -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_bytes`)."""
    return decode(read_bytes(path, limit=limit, what=what, follow=follow, root=root), source=path, what=what)


# --------------------------------------------------------------------------------------------------
# JSON

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (strings skipped), counted without
    recursion: the parser's own recursion fails on 100,000 levels before it can say where."""
    brackets = _NOT_BRACKET.sub(b"", _STRINGS.sub(b"", data))
    level = deepest = 0
    for byte in brackets:
        level += _DEPTH_STEP[byte]
        deepest = max(deepest, level)
    return deepest


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(
    data: bytes | str,
    *,
    source: str | Path,
    what: str = "document",
    limit: int = JSON_LIMIT,
    max_depth: int = JSON_DEPTH,
) -> Any:
    """The JSON value in ``data`` (from ``source``, named in errors): at most ``limit`` bytes and ``max_depth``
    levels of nesting, UTF-8, no ``NaN`` or ``Infinity``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > limit:
        raise Malformed(f"{what} is larger than {limit} bytes (the limit)", file=str(source))
    text = decode(raw, source=source, what=what) if isinstance(data, bytes | bytearray | memoryview) else str(data)
    deepest = depth(raw) if raw.count(b"[") + raw.count(b"{") > max_depth else 0  # fewer cannot nest deeper
    if deepest > max_depth:
        raise Malformed(f"{what} nests {deepest} levels deep (the limit is {max_depth})", file=str(source))
    try:
        return json.loads(text, parse_constant=_constant)
    except (ValueError, RecursionError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise Malformed(f"{what} is not JSON{where}: {printable(reason)}", file=str(source)) from None


def read_json(
    path: str | Path,
    *,
    what: str = "file",
    limit: int = JSON_LIMIT,
    max_depth: int = JSON_DEPTH,
    follow: bool = True,
    root: str | Path | None = None,
) -> Any:
    """The JSON value of the regular file ``path``, within ``limit`` bytes and ``max_depth`` levels."""
    data = read_bytes(path, limit=limit, what=what, follow=follow, root=root)
    return parse_json(data, source=path, what=what, limit=limit, max_depth=max_depth)


# --------------------------------------------------------------------------------------------------
# Typed models

M = TypeVar("M")


def field_path(loc: Iterable[Any]) -> str:
    """A pydantic error location as a field path: ``rows[2].digest``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(the document)"


@functools.lru_cache(maxsize=256)
def _adapter(model: Any) -> Any:
    """The pydantic adapter of ``model``, made once: making one costs more than validating a small document."""
    from pydantic import TypeAdapter

    return TypeAdapter(model)


def validate(model: type[M], data: Any, *, source: str | Path, what: str = "document") -> M:
    """``data`` validated by the pydantic ``model``; a wrong shape is one error naming ``source``, the first
    field that is wrong, and how many others are."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return (_adapter(model) if isinstance(model, Hashable) else TypeAdapter(model)).validate_python(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise Malformed(
            f"{what}: {printable(field_path(first['loc']))}: {printable(first['msg'])}{more}",
            file=str(source),
        ) from None


def load_model(
    model: type[M],
    path: str | Path,
    *,
    what: str = "file",
    limit: int = JSON_LIMIT,
    max_depth: int = JSON_DEPTH,
    follow: bool = True,
    root: str | Path | None = None,
) -> M:
    """The JSON file ``path`` read within its bounds and validated by ``model``."""
    data = read_json(path, what=what, limit=limit, max_depth=max_depth, follow=follow, root=root)
    return validate(model, data, source=path, what=what)


def parse_model(
    model: type[M],
    data: bytes | str,
    *,
    source: str | Path,
    what: str = "document",
    limit: int = JSON_LIMIT,
    max_depth: int = JSON_DEPTH,
) -> M:
    """The JSON document ``data`` (from ``source``) within its bounds, validated by ``model``."""
    return validate(model, parse_json(data, source=source, what=what, limit=limit, max_depth=max_depth), source=source, what=what)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Names that become paths

_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@=,-]*")


def relative_name(name: object, *, what: str = "name", source: str | Path | None = None) -> PurePosixPath:
    """``name`` (taken from a record, a summary or a container) as a relative path that stays where it is put:
    ``/``-separated parts of letters, digits and ``_ . + @ = , -``, none of them ``.`` or ``..``, not absolute."""
    text = name if isinstance(name, str) else None
    problem = None
    if text is None:
        problem = "is not a string"
    elif not text or len(text) > 1024:
        problem = "is empty" if not text else "is longer than 1024 characters"
    elif text.startswith("/"):
        problem = "is an absolute path"
    else:
        for part in text.split("/"):
            if part in ("", ".", ".."):
                problem = "has an empty, '.' or '..' part"
                break
            if not _NAME_PART.fullmatch(part):
                problem = f"has a part ({printable(part)}) with characters a file name here may not have"
                break
    if problem is not None:
        raise Malformed(
            f"{what} {printable(repr(name))} {problem}",
            file=str(source) if source is not None else None,
            fix="the name must be a relative path (letters, digits, _ . + @ = , -) with no '..'",
        )
    return PurePosixPath(str(text))


def confined(
    root: str | Path,
    name: str | PurePosixPath,
    *,
    what: str = "name",
    source: str | Path | None = None,
    last_may_be_link: bool = False,
) -> Path:
    """``root/name`` for a :func:`relative_name`, refused when a part of it that exists is a link or not a
    directory (the last part may be a link when ``last_may_be_link``: a rename onto it replaces the link itself):
    nothing read or written through it leaves ``root``."""
    rel = relative_name(str(name), what=what, source=source)
    here = Path(root)
    for i, part in enumerate(rel.parts):
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            break
        last = i == len(rel.parts) - 1
        if (stat.S_ISLNK(mode) and not (last and last_may_be_link)) or (not last and not stat.S_ISDIR(mode)):
            raise Malformed(
                f"{what} {printable(str(rel))}: {printable(here)} is {_kind(mode)}; nothing is written through it",
                file=str(source) if source is not None else None,
            )
    return Path(root) / rel


def write_confined(
    root: str | Path,
    name: str | PurePosixPath,
    data: bytes | str,
    *,
    what: str = "name",
    source: str | Path | None = None,
) -> Path:
    """Write ``data`` to ``root/name`` (see :func:`confined`), its directories made, never through a link: a file
    written beside it is renamed onto the name, so a link there is replaced, not followed."""
    path = confined(root, name, what=what, source=source, last_may_be_link=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    confined(root, name, what=what, source=source, last_may_be_link=True)  # nothing moved in meanwhile
    tmp = temp_beside(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# --------------------------------------------------------------------------------------------------
# Output directories


def output_verb(path: str | Path) -> str | None:
    """The verb whose :class:`OutputDir` mark the directory ``path`` carries (``history``, ``nightly``…), None when
    it carries none (or one that is not a regular file of this tool's form)."""
    try:
        text = read_text(Path(path) / OUTPUT_MARK, limit=4096, what="mark", follow=False)
    except Malformed:
        return None
    head, _, verb = text.strip().partition(" ")
    return verb if head == "stackforge" and verb and " " not in verb else None


@dataclass(frozen=True)
class OutputDir:
    """An ``--out`` directory a command replaces whole: refused when it is one of the command's inputs or holds
    one; replaced only when it is absent, empty, or carries the mark this class writes into what it made
    (:data:`OUTPUT_MARK`, naming the ``verb``)."""

    path: Path
    verb: str

    def check(self, inputs: Iterable[str | Path] = (), *, flag: str = "--out", legacy: Iterable[str] = ()) -> None:
        """Refuse before anything runs: ``path`` is an input or holds one, or it holds files this verb did not
        write (``legacy``: names of files only this verb writes, which count as its mark in a directory made
        before marks were written)."""
        self.refuse_inputs(inputs, flag)
        if not os.path.lexists(self.path):
            return
        if os.path.islink(self.path) or not os.path.isdir(self.path):
            raise UserError(f"{printable(self.path)} exists and is not a directory", file=flag, fix="name a directory")
        legacy_mark = any(os.path.lexists(Path(self.path) / name) for name in legacy)
        if any(os.scandir(self.path)) and not self._marked() and not legacy_mark:
            raise UserError(
                f"{printable(self.path)} holds files `stackforge {self.verb}` did not write; it is not touched",
                file=flag,
                fix="give a new or empty directory, or remove that one yourself",
            )

    def refuse_inputs(self, inputs: Iterable[str | Path], flag: str = "--out") -> None:
        """Refuse when ``path`` is one of ``inputs`` or holds one (links resolved)."""
        out = os.path.realpath(self.path)
        for given in inputs:
            src = os.path.realpath(given)
            if out == src or src.startswith(out.rstrip(os.sep) + os.sep):
                raise UserError(
                    f"{printable(self.path)} is, or holds, {printable(given)}, which this command reads: "
                    "writing it would delete what it reads",
                    file=flag,
                    fix=f"give {flag} a directory of its own (for example a new one beside the input)",
                )

    def claim(self, inputs: Iterable[str | Path] = (), *, flag: str = "--out", legacy: Iterable[str] = ()) -> Path:
        """For a command that writes into ``path`` as it goes (a nightly's directory, a mirror): the refusals of
        :meth:`check`, then the directory made and marked as this verb's."""
        self.check(inputs, flag=flag, legacy=legacy)
        out = Path(self.path)
        out.mkdir(parents=True, exist_ok=True)
        if not self._marked():
            (out / OUTPUT_MARK).write_text(f"stackforge {self.verb}\n", encoding="utf-8")
        return out

    def _marked(self) -> bool:
        return output_verb(self.path) == self.verb

    @contextmanager
    def staging(self, inputs: Iterable[str | Path] = (), *, flag: str = "--out") -> Iterator[Path]:
        """A fresh directory beside ``path`` to write into; when the block ends without an error it replaces
        ``path`` (marked as this verb's), else it is removed and ``path`` is as it was."""
        self.check(inputs, flag=flag)
        out = Path(self.path)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            staging.chmod(0o755)
            (staging / OUTPUT_MARK).write_text(f"stackforge {self.verb}\n", encoding="utf-8")
            yield staging
            self.check(inputs, flag=flag)  # nothing moved in meanwhile
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            if os.path.lexists(out):
                out.rename(old)
            staging.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


# --------------------------------------------------------------------------------------------------
# Terminals


def clean_tree(value: Any, *, lines: bool = True) -> Any:
    """:func:`for_terminal` applied to every string in a JSON-like value (keys included)."""
    if isinstance(value, str):
        return for_terminal(value, lines=lines)
    if isinstance(value, dict):
        return {for_terminal(k, lines=False): clean_tree(v, lines=lines) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_tree(v, lines=lines) for v in value]
    return value


__all__ = [
    "JSON_DEPTH",
    "JSON_LIMIT",
    "SMALL_LIMIT",
    "Malformed",
    "OutputDir",
    "clean_tree",
    "confined",
    "decode",
    "depth",
    "field_path",
    "for_terminal",
    "inside",
    "load_model",
    "output_verb",
    "parse_json",
    "parse_model",
    "read_bytes",
    "read_json",
    "read_text",
    "relative_name",
    "validate",
    "write_confined",
]
