"""Vulnerability waivers a reviewer reads: ``stacks/waivers.yaml``, one file per repository, checked in.

::

    waivers:
      - id: GHSA-xxxx-xxxx-xxxx          # the advisory (or one of its aliases, e.g. its CVE)
        package: torchvision             # PyPI name, or the Debian/Ubuntu source package
        versions: ["0.26.0.post2"]       # the exact installed versions it covers (quoted)
        reason: the vendor's build; no fixed wheel for MUSA yet, and the affected decoder is not used
        expires: 2027-01-31              # valid through this day (UTC); then it blocks again

A waiver covers a finding when the finding's id (or an alias) is ``id``, its package is ``package`` (PyPI names
PEP 503-normalised) and its installed version is one of ``versions``: a new version is a new decision. A covered
finding still shows, as waived with its reason and expiry; an expired waiver covers nothing, so its finding
blocks again. ``stackforge lint`` refuses the file when an entry lacks a reason, has expired, repeats another or
has a wrong shape, naming the file and line.

One file per repository (not per stack): one place holds every accepted risk, a waiver serves each stack that
pins the same version (post2 inherits post1's pins), and ``stackforge scan IMAGE`` in a checkout finds it
without knowing which stack built the image; ``versions`` already scopes it to the stacks that install them.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from stackforge import osv, safeio
from stackforge.errors import UserError, printable
from stackforge.stack import yamlsrc
from stackforge.stack.names import STACKS_DIR, WAIVERS

#: where the repository's waivers are, under its root
WAIVERS_PATH = f"{STACKS_DIR}/{WAIVERS}"
#: the fewest characters a reason has: a reviewer reads why, not "n/a"
MIN_REASON = 10

Str = Annotated[str, StringConstraints(strict=True, strip_whitespace=True, min_length=1, max_length=4096)]
Id = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}$")]


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: Id
    package: Str
    versions: list[Str] = Field(min_length=1)
    reason: Annotated[str, StringConstraints(strict=True, max_length=4096)] | None = None
    expires: _dt.date


class File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    waivers: list[Entry] = []


@dataclass(frozen=True)
class Waiver:
    id: str
    package: str
    versions: tuple[str, ...]
    reason: str
    expires: _dt.date
    where: str  # file:line

    def expired(self, today: _dt.date) -> bool:
        return today > self.expires

    def covers(self, finding: osv.Finding) -> bool:
        if self.id != finding.id and self.id not in finding.aliases:
            return False
        eco = finding.package.eco
        pypi = eco is not None and eco.family == "PyPI"
        name = canonicalize_name(finding.package.name) if pypi else finding.package.name
        mine = canonicalize_name(self.package) if pypi else self.package
        return name == mine and finding.package.version in self.versions

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "expires": self.expires.isoformat(), "waiver": self.where}


@dataclass
class Waivers:
    """The waivers of one file (none: no file)."""

    file: str | None = None
    entries: list[Waiver] = field(default_factory=list)

    def of(self, finding: osv.Finding, today: _dt.date) -> tuple[Waiver | None, Waiver | None]:
        """(the waiver that covers ``finding`` today, one that covered it and has expired)."""
        active = expired = None
        for w in self.entries:
            if w.covers(finding):
                if w.expired(today):
                    expired = expired or w
                else:
                    active = active or w
        return active, expired


@dataclass(frozen=True)
class Problem:
    """What lint refuses in the waivers file, where."""

    message: str
    pos: yamlsrc.Pos
    fix: str

    def error(self) -> UserError:
        return UserError(self.message, **self.pos.as_error_kwargs(), fix=self.fix)

    def render(self) -> str:
        return self.error().render()


def path_of(root: Path) -> Path:
    return Path(root) / WAIVERS_PATH


def _pos(source: yamlsrc.Sourced, display: str, loc: tuple) -> yamlsrc.Pos:
    """Where the value at ``loc`` was written (its nearest written parent for a missing key)."""
    while loc:
        if loc in source.values:
            return source.values[loc]
        loc = loc[:-1]
    return source.values.get((), yamlsrc.Pos(display))


def _read(path: Path, display: str) -> tuple[File, yamlsrc.Sourced]:
    source = yamlsrc.load_with_positions(path, display)
    data = {} if source.data is None else source.data
    try:
        return File.model_validate(data), source
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = tuple(first["loc"])
        key = source.keys.get(loc) if first["type"] == "extra_forbidden" else None  # a stray key: where it is
        where = key or _pos(source, display, loc)
        raise UserError(
            f"{printable(safeio.field_path(loc))}: {printable(first['msg'])}",
            **where.as_error_kwargs(),
            fix="each waiver is {id, package, versions: [quoted exact versions], reason, expires: YYYY-MM-DD}",
        ) from None


def load(path: Path, display: str | None = None) -> Waivers:
    """The waivers of ``path`` for a scan; a wrong shape is an error (the gate does not guess). An entry
    without a reason or past its date is read, and covers nothing: lint refuses it, the scan blocks on it."""
    display = display or str(path)
    parsed, source = _read(path, display)
    out = Waivers(display)
    for i, e in enumerate(parsed.waivers):
        pos = _pos(source, display, ("waivers", i))
        reason = (e.reason or "").strip()
        if len(reason) < MIN_REASON:
            continue  # no reason, no waiver
        out.entries.append(
            Waiver(e.id, e.package, tuple(e.versions), reason, e.expires, f"{display}:{pos.line or '?'}")
        )
    return out


def load_repository(root: Path | None) -> Waivers:
    """The repository's waivers (``stacks/waivers.yaml`` under ``root``); none without a root or the file."""
    if root is None:
        return Waivers()
    path = path_of(root)
    return load(path, WAIVERS_PATH) if path.exists() or path.is_symlink() else Waivers()


def lint(path: Path, today: _dt.date, display: str | None = None) -> list[Problem]:
    """What ``stackforge lint`` refuses in the waivers file: its shape (the first error), and per entry a
    missing or too short reason, an expiry in the past, a repeat of another entry."""
    display = display or str(path)
    try:
        parsed, source = _read(path, display)
    except UserError as err:
        where = yamlsrc.Pos(str(err.file or display), err.line, err.col)
        return [Problem(err.message, where, err.fix or "")]
    problems = []
    seen: dict[tuple[str, str], int | None] = {}
    for i, e in enumerate(parsed.waivers):
        pos = _pos(source, display, ("waivers", i))
        head = f"waiver {e.id} for {printable(e.package)}"
        reason = (e.reason or "").strip()
        if len(reason) < MIN_REASON:
            problems.append(
                Problem(
                    f"{head} has no reason" if not reason else f"{head}: its reason {printable(reason)!r} says nothing",
                    _pos(source, display, ("waivers", i, "reason")),
                    "say why the finding cannot be fixed now and why the risk is accepted (reason: …)",
                )
            )
        if e.expires < today:
            problems.append(
                Problem(
                    f"{head} expired on {e.expires.isoformat()}: its finding blocks the gate again",
                    _pos(source, display, ("waivers", i, "expires")),
                    "fix the finding (upgrade) and remove the waiver, or review it and set a new expires: date",
                )
            )
        key = (e.id, canonicalize_name(e.package))
        if key in seen:
            problems.append(
                Problem(
                    f"{head} repeats the waiver at line {seen[key]}",
                    pos,
                    "keep one entry per advisory and package (list every version in its versions:)",
                )
            )
        seen.setdefault(key, pos.line)
    return problems


def lint_repository(root: Path, today: _dt.date | None = None) -> list[Problem]:
    """:func:`lint` of the repository's waivers file (nothing when it has none)."""
    path = path_of(root)
    if not (path.exists() or path.is_symlink()):
        return []
    return lint(path, today or today_utc(), WAIVERS_PATH)


def today_utc() -> _dt.date:
    return _dt.datetime.now(_dt.timezone.utc).date()
