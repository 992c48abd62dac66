"""One error type for everything a user can get wrong.

A ``UserError`` carries where the problem is (file, line, column), what it is,
and how to fix it. The CLI prints it without a traceback and exits with its code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object) -> str:
    """``text`` with its control characters and line separators escaped (``\\n``): a path or a name read from
    a file can then be put in a message without making a line of its own."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


#: C0 and C1 controls but tab and newline, DEL, and the line and paragraph separators
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
#: ANSI/VT escape sequences (CSI, OSC, …) taken whole, so no parameter bytes are left behind
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|[@-Z\\-_])")


def for_terminal(text: object, *, lines: bool = True) -> str:
    """``text`` from outside (an advisory, a record, a file a container wrote) safe to print: escape sequences
    and control characters removed; newlines and tabs kept unless ``lines`` is false (then each becomes a
    space)."""
    out = _CONTROL.sub("", _ESCAPE.sub("", str(text)))
    return out if lines else out.replace("\n", " ").replace("\t", " ")  # runs of spaces kept: verify's columns


def clip(text: object, limit: int = 300) -> str:
    """``text`` on one line, cut at its end (never its start, where a message says what failed) to ``limit``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


@dataclass
class UserError(Exception):
    message: str
    file: str | Path | None = None
    line: int | None = None
    col: int | None = None
    fix: str | None = None
    exit_code: int = 2

    def location(self) -> str:
        """``file[:line[:col]]`` on one line: control characters in a path or a ``--set`` value are
        shown escaped, so no input can make an error print a line of its own."""
        if self.file is None:
            return ""
        loc = printable(self.file)
        if self.line is not None:
            loc += f":{self.line}"
            if self.col is not None:
                loc += f":{self.col}"
        return loc

    def render(self) -> str:
        loc = self.location()
        head = f"error: {loc}: {self.message}" if loc else f"error: {self.message}"
        if self.fix:
            head += f"\n  fix: {self.fix}"
        return head

    def __str__(self) -> str:  # pragma: no cover - used by logs
        return self.render()


class BuildFailed(UserError):
    """A build, gate or publish step failed; nothing was tagged."""

    def __init__(self, message: str, *, fix: str | None = None, exit_code: int = 1, file=None, line=None, col=None):
        super().__init__(message, file=file, line=line, col=col, fix=fix, exit_code=exit_code)
