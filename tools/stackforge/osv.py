"""Known vulnerabilities, offline: installed packages matched against an OSV database directory.

The directory holds OSV records (https://ossf.github.io/osv-schema/) as ``*.json`` files at any depth, one record
each: the layout of OSV's per-ecosystem exports unpacked (``PyPI/all.zip`` into ``PyPI/``, ``Debian/all.zip`` into
``Debian/``, ``Ubuntu/all.zip`` into ``Ubuntu/``). Beside each export, the fetch writes :data:`SNAPSHOT`
(``{"ecosystem": "PyPI", "fetched_at": "2026-12-06T02:00:00Z", "source": URL}``): when the snapshot was taken, which
the gate (``builder/records/vulns.py``) holds against its maximum age.

Every file is read bounded (``safeio``: a regular file of at most :data:`MAX_RECORD_BYTES`, no FIFO or device, no
link out of the directory, no linked directory descended) and validated by :class:`Record`, the parts of the OSV
schema used here, each with its type: a record of the wrong shape is one error naming the file and the field.

Three ecosystems are read: ``PyPI`` (names compared PEP 503-normalised, versions by PEP 440), ``Debian`` /
``Debian:<release>`` and ``Ubuntu:<release>[:LTS]`` (source package names, versions by dpkg's ordering; a record
for one release says nothing of another; ``Ubuntu:Pro:…`` is Ubuntu Pro's archive, not read). An installed version
is affected when a record lists it in ``versions`` or when an ``ECOSYSTEM`` range's events (``introduced``,
``fixed``, ``last_affected``, ``limit``) put it inside: introduced <= v < fixed, or introduced <= v <=
last_affected. A record ``withdrawn`` is skipped.

Severity, in order: the record's ``database_specific.severity`` (GitHub's LOW/MODERATE/HIGH/CRITICAL), else the
highest of its ``severity`` entries (CVSS v3/v4 base scores rated as CVSS rates them; Ubuntu's priority); a record
with neither is ``unknown``, which the gate treats as ``high`` and says so.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cmp_to_key
from pathlib import Path
from typing import Annotated, Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from stackforge import safeio
from stackforge.errors import UserError, printable

#: the gate's order; ``unknown`` ranks as ``high``
LEVELS = ("low", "medium", "high", "critical")
_RANK = {"low": 0, "negligible": 0, "medium": 1, "moderate": 1, "unknown": 2, "high": 2, "critical": 3}
MAX_RECORD_BYTES = 4 << 20
#: the file a fetch writes beside an export: which ecosystem it holds and when it was taken
SNAPSHOT = "osv-snapshot.json"
FAMILIES = ("PyPI", "Debian", "Ubuntu")
#: where the exports come from (one ``all.zip`` per ecosystem)
EXPORTS = "https://osv-vulnerabilities.storage.googleapis.com/<ECOSYSTEM>/all.zip"
FETCH_FIX = (
    f"fetch OSV's exports ({EXPORTS}, for PyPI and the image's distribution) unpacked one directory per "
    f"ecosystem, each with its {SNAPSHOT} (docs/publish.md, SBOM and vulnerability scan)"
)


# -- ecosystems -------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Ecosystem:
    """An ecosystem as the scan reads it: ``family`` (PyPI, Debian, Ubuntu) and, for a distribution, the
    ``release`` (``12``, ``22.04``; None: any release)."""

    family: str
    release: str | None = None

    def __str__(self) -> str:
        return self.family if self.release is None else f"{self.family}:{self.release}"

    def holds(self, other: Ecosystem) -> bool:
        """Whether a record for ``self`` speaks of a package of ``other``: one family, and one release unless
        either names none."""
        return self.family == other.family and (
            self.release is None or other.release is None or self.release == other.release
        )


_DEBIAN_RELEASE = re.compile(r"\d{1,3}")
_UBUNTU_RELEASE = re.compile(r"\d{2}\.\d{2}")


def ecosystem(text: str) -> Ecosystem | None:
    """The ecosystem an OSV ``ecosystem`` string names; None for one the scan does not read."""
    if text == "PyPI":
        return Ecosystem("PyPI")
    if text in ("Debian", "Ubuntu"):
        return Ecosystem(text)
    family, _, rest = text.partition(":")
    if family == "Debian" and _DEBIAN_RELEASE.fullmatch(rest):
        return Ecosystem("Debian", rest)
    if family == "Ubuntu":
        release, _, suffix = rest.partition(":")
        if _UBUNTU_RELEASE.fullmatch(release) and suffix in ("", "LTS"):
            return Ecosystem("Ubuntu", release)
    return None


# -- the OSV schema, as far as it is used -----------------------------------------------------------------

Str = Annotated[str, StringConstraints(strict=True, max_length=4096)]
Text = Annotated[str, StringConstraints(strict=True, max_length=1 << 20)]
RecordId = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}$")]
EVENT_KINDS = ("introduced", "fixed", "last_affected", "limit")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Event(_Model):
    """One event of a range: exactly one of ``introduced``, ``fixed``, ``last_affected``, ``limit``."""

    introduced: Str | None = None
    fixed: Str | None = None
    last_affected: Str | None = None
    limit: Str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = sum(1 for k in EVENT_KINDS if k in data)
            if given != 1:
                raise ValueError(f"an event has exactly one of {', '.join(EVENT_KINDS)} (this one has {given})")
        return data

    @property
    def kind(self) -> str:
        return next(k for k in EVENT_KINDS if getattr(self, k) is not None)

    @property
    def version(self) -> str:
        return str(getattr(self, self.kind))


class Range(_Model):
    type: Str
    events: list[Event] = Field(min_length=1)


class Severity(_Model):
    type: Str
    score: Str


class AffectedPackage(_Model):
    ecosystem: Str
    name: Str
    purl: Str | None = None


class Affected(_Model):
    package: AffectedPackage | None = None
    ranges: list[Range] = []
    versions: list[Str] = []
    severity: list[Severity] = []


class DatabaseSpecific(_Model):
    severity: Str | None = None


class Record(_Model):
    """An OSV record: the fields the scan reads, each with its type (a ``versions`` given as a string, a range
    without events, an event naming two kinds: refused, naming the field)."""

    id: RecordId
    modified: _dt.datetime
    published: _dt.datetime | None = None
    withdrawn: _dt.datetime | None = None
    aliases: list[Str] = []
    summary: Text | None = None
    details: Text | None = None
    severity: list[Severity] = []
    affected: list[Affected] = []
    database_specific: DatabaseSpecific | None = None


class Snapshot(BaseModel):
    """:data:`SNAPSHOT`: the ecosystem of the export beside it, when it was fetched (UTC), from where."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ecosystem: Str
    fetched_at: AwareDatetime
    source: Str | None = None


def _utc(when: _dt.datetime) -> _dt.datetime:
    return when.replace(tzinfo=_dt.timezone.utc) if when.tzinfo is None else when.astimezone(_dt.timezone.utc)


# -- what the scan reports --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """An installed package as the SBOM names it: ``ecosystem`` is ``PyPI``, ``Debian:<release>`` or
    ``Ubuntu:<release>`` (``Debian`` alone: any release); for a distribution, ``name`` is the source package and
    ``version`` the source version (what advisories name)."""

    ecosystem: str
    name: str
    version: str

    @property
    def eco(self) -> Ecosystem | None:
        return ecosystem(self.ecosystem)


@dataclass(frozen=True)
class Finding:
    id: str
    package: Package
    severity: str
    summary: str
    aliases: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()
    source: str = ""

    def at_least(self, level: str) -> bool:
        return _RANK[self.severity] >= _RANK[level]

    def line(self) -> str:
        """One line for a terminal: every part that came from a record or an SBOM stripped of control
        characters and escape sequences."""
        fix = f"; fixed in {', '.join(self.fixed)}" if self.fixed else "; no fixed version"
        also = f" ({', '.join(self.aliases[:3])})" if self.aliases else ""
        shown = "unknown, treated as high" if self.severity == "unknown" else self.severity
        text = (
            f"{self.id}{also} {self.package.ecosystem} {self.package.name} {self.package.version}: "
            f"{shown}: {self.summary}{fix}"
        )
        return safeio.for_terminal(text, lines=False)


@dataclass
class Family:
    """What the database holds of one ecosystem family: its live records, the releases they name, the newest
    ``modified`` time and the snapshot files that date it."""

    name: str
    records: int = 0
    releases: set[str] = field(default_factory=set)
    any_release: bool = False
    newest: _dt.datetime | None = None
    snapshots: list[tuple[str, _dt.datetime]] = field(default_factory=list)  # (file, fetched_at)

    def covers(self, eco: Ecosystem) -> bool:
        return eco.release is None or self.any_release or eco.release in self.releases

    @property
    def fetched_at(self) -> _dt.datetime | None:
        """When the family's snapshot was taken: the oldest of its snapshot files (None without one)."""
        return min((t for _, t in self.snapshots), default=None)


@dataclass
class Database:
    """The records of an OSV directory that concern the ecosystems read, by (family, name), and what it
    holds of each family."""

    root: Path
    records: dict[tuple[str, str], list[tuple[str, Record]]] = field(default_factory=dict)
    count: int = 0
    families: dict[str, Family] = field(default_factory=dict)

    def family(self, name: str) -> Family:
        return self.families.setdefault(name, Family(name))

    def covers(self, eco: Ecosystem) -> bool:
        fam = self.families.get(eco.family)
        return fam is not None and fam.records > 0 and fam.covers(eco)

    def affecting(self, pkg: Package) -> Iterator[Finding]:
        eco = pkg.eco
        if eco is None:
            return
        for source, rec in self.records.get((eco.family, _name(eco.family, pkg.name)), []):
            found = _match(rec, pkg, eco)
            if found is not None:
                yield Finding(
                    id=rec.id,
                    package=pkg,
                    severity=severity(rec),
                    summary=_one_line(rec.summary or rec.details or ""),
                    aliases=tuple(rec.aliases),
                    fixed=found,
                    source=source,
                )


def load(root: Path) -> Database:
    """Read every record and snapshot file under ``root`` (bounded, typed); a file that is not one is an error
    naming it and the field."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{printable(root)}: no such directory", file="--osv", fix=FETCH_FIX)
    try:
        return _load(root)
    except safeio.Malformed as err:
        raise UserError(
            err.message,
            file=err.file,
            fix=err.fix or "the OSV directory holds OSV records (and osv-snapshot.json files) only: fetch it again",
        ) from None


def _load(root: Path) -> Database:
    db = Database(root)

    def refuse(exc: OSError) -> None:
        raise safeio.Malformed(f"cannot read the directory: {exc.strerror}", file=exc.filename)

    top = str(root)
    for dirpath, dirnames, filenames in os.walk(top, onerror=refuse):
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise safeio.Malformed(
                    "a link to a directory in the OSV database: links are not followed here",
                    file=os.path.join(dirpath, name),
                    fix="put the export itself in the database directory (unpack it there)",
                )
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".json"):
                continue
            path = os.path.join(dirpath, name)
            source = os.path.relpath(path, top)
            if name == SNAPSHOT:
                _snapshot(db, path, source)
                continue
            # a link is refused whole (a record is a file of the export), so nothing is read from outside
            rec = safeio.load_model(Record, path, what="OSV record", limit=MAX_RECORD_BYTES, follow=False)
            if rec.withdrawn is None:
                _index(db, rec, source)
    return db


def _snapshot(db: Database, path: str, source: str) -> None:
    snap = safeio.load_model(Snapshot, path, what="OSV snapshot file", limit=safeio.SMALL_LIMIT, follow=False)
    eco = ecosystem(snap.ecosystem)
    if eco is None:
        raise safeio.Malformed(
            f"OSV snapshot file: ecosystem: {printable(snap.ecosystem)!r} is not one the scan reads",
            file=path,
            fix=f"one of {', '.join(FAMILIES)} (a release may follow: Debian:12)",
        )
    db.family(eco.family).snapshots.append((source, _utc(snap.fetched_at)))


def _index(db: Database, rec: Record, source: str) -> None:
    keys: set[tuple[str, str]] = set()
    families: set[str] = set()
    for affected in rec.affected:
        if affected.package is None:
            continue
        eco = ecosystem(affected.package.ecosystem)
        if eco is None:
            continue
        fam = db.family(eco.family)
        if eco.release is None:
            fam.any_release = True
        else:
            fam.releases.add(eco.release)
        families.add(eco.family)
        keys.add((eco.family, _name(eco.family, affected.package.name)))
    if not families:
        return
    db.count += 1
    modified = _utc(rec.modified)
    for name in families:
        fam = db.family(name)
        fam.records += 1
        fam.newest = modified if fam.newest is None else max(fam.newest, modified)
    for key in keys:
        db.records.setdefault(key, []).append((source, rec))


def scan(db: Database, packages: Iterable[Package]) -> list[Finding]:
    """Every finding, most severe first, then by package and id."""
    out = [f for pkg in packages for f in db.affecting(pkg)]
    return sorted(out, key=lambda f: (-_RANK[f.severity], f.package.name, f.id))


def severity(rec: Record) -> str:
    named = rec.database_specific.severity if rec.database_specific is not None else None
    if named is not None and named.lower() in _RANK:
        return _level(named.lower())
    best: int | None = None
    items = [*rec.severity, *(s for a in rec.affected for s in a.severity)]
    for item in items:
        rank = _rated(item)
        if rank is not None and (best is None or rank > best):
            best = rank
    return "unknown" if best is None else LEVELS[best]


def _level(name: str) -> str:
    return {"moderate": "medium", "negligible": "low"}.get(name, name)


def _rated(item: Severity) -> int | None:
    """The rank of one ``severity`` entry: a CVSS vector's base score as CVSS rates it, or Ubuntu's priority."""
    if item.type == "Ubuntu":
        level = item.score.lower()
        return _RANK[level] if level in _RANK and level != "unknown" else None
    score = _cvss(item)
    if score is None:
        return None
    return 3 if score >= 9.0 else 2 if score >= 7.0 else 1 if score >= 4.0 else 0


def _cvss(item: Severity) -> float | None:
    from cvss import CVSS3, CVSS4  # only records without a named severity need it

    try:
        if item.type == "CVSS_V3":
            return float(CVSS3(item.score).base_score)
        if item.type == "CVSS_V4":
            return float(CVSS4(item.score).base_score)
    except Exception:  # a malformed vector rates nothing; the record stays "unknown"
        return None
    return None


def _name(family: str, name: str) -> str:
    return canonicalize_name(name) if family == "PyPI" else name


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _match(rec: Record, pkg: Package, eco: Ecosystem) -> tuple[str, ...] | None:
    """The fixed versions when ``pkg`` is affected by ``rec``; None when it is not."""
    hit, fixed = False, []
    want = _name(eco.family, pkg.name)
    for affected in rec.affected:
        named = affected.package
        if named is None:
            continue
        theirs = ecosystem(named.ecosystem)
        if theirs is None or not theirs.holds(eco) or _name(eco.family, named.name) != want:
            continue
        if pkg.version in affected.versions:  # a list of versions, compared whole
            hit = True
        for rng in affected.ranges:
            if rng.type != "ECOSYSTEM":
                continue
            fixed += [e.version for e in rng.events if e.kind == "fixed"]
            if _in_range(rng.events, pkg.version, eco.family):
                hit = True
    return tuple(dict.fromkeys(fixed)) if hit else None


def _in_range(events: list[Event], version: str, family: str) -> bool:
    """OSV's evaluation: walk the events in version order; the version is affected after an ``introduced``
    at or below it until a ``fixed``/``limit`` at or below it (or past a ``last_affected`` below it)."""
    cmp = compare_function(family)

    def order(a: Event, b: Event) -> int:
        va, vb = a.version, b.version
        if va == "0" or vb == "0":
            return (vb == "0") - (va == "0")
        return cmp(va, vb)

    affected = False
    for event in sorted(events, key=cmp_to_key(order)):
        kind, at = event.kind, event.version
        if kind == "introduced" and (at == "0" or cmp(at, version) <= 0):
            affected = True
        elif kind in ("fixed", "limit"):
            affected = affected and cmp(at, version) > 0  # fixed at or below it: no longer affected
        elif kind == "last_affected":
            affected = affected and cmp(at, version) >= 0
    return affected


def compare_function(family: str) -> Any:
    """The version order of an ecosystem family (``Debian:12`` is read as its family)."""
    return _pep440 if family.partition(":")[0] == "PyPI" else dpkg_compare


def _pep440(a: str, b: str) -> int:
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return (a > b) - (a < b)
    return (va > vb) - (va < vb)


# -- dpkg's version order (deb-version(7)) -----------------------------------------------------------------


def _digit(c: str) -> bool:
    return "0" <= c <= "9"


def _order(c: str) -> int:
    if c == "~":
        return -1
    if _digit(c):
        return 0
    if c.isascii() and c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not _digit(a[i])) or (j < len(b) and not _digit(b[j])):
            ac = _order(a[i]) if i < len(a) and not _digit(a[i]) else 0
            bc = _order(b[j]) if j < len(b) and not _digit(b[j]) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and _digit(a[i]) and j < len(b) and _digit(b[j]):
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and _digit(a[i]):
            return 1
        if j < len(b) and _digit(b[j]):
            return -1
        if first_diff:
            return first_diff
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0) if epoch.isdigit() else 0, upstream, revision


def dpkg_compare(a: str, b: str) -> int:
    """-1, 0 or 1 as ``dpkg --compare-versions a lt/eq/gt b`` decides."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    result = (ea > eb) - (ea < eb) or _compare_part(ua, ub) or _compare_part(ra, rb)
    return (result > 0) - (result < 0)
