"""Known vulnerabilities, offline: installed packages matched against an OSV database directory.

The directory holds OSV records (https://ossf.github.io/osv-schema/) as ``*.json`` files at any depth, one record
each — the layout of OSV's per-ecosystem exports (``PyPI/all.zip``, ``Debian/all.zip`` unpacked). Two ecosystems
are read: ``PyPI`` (names compared PEP 503-normalised, versions by PEP 440) and ``Debian`` / ``Debian:<release>``
(source package names, versions by dpkg's ordering). An installed version is affected when a record lists it in
``versions`` or when an ``ECOSYSTEM`` range's events (``introduced``, ``fixed``, ``last_affected``, ``limit``) put it
inside: introduced <= v < fixed, or introduced <= v <= last_affected. A record ``withdrawn`` is skipped.

Severity, in order: the record's ``database_specific.severity`` (GitHub's LOW/MODERATE/HIGH/CRITICAL), else the
highest CVSS v3/v4 base score in ``severity`` (rated as CVSS rates it); a record with neither is ``unknown``, which
the gate treats as ``high`` and says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cmp_to_key
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge.errors import UserError

#: the gate's order; ``unknown`` ranks as ``high``
LEVELS = ("low", "medium", "high", "critical")
_RANK = {"low": 0, "medium": 1, "moderate": 1, "unknown": 2, "high": 2, "critical": 3}
MAX_RECORD_BYTES = 4 << 20


@dataclass(frozen=True)
class Package:
    """An installed package as the SBOM names it: ``ecosystem`` is ``PyPI`` or ``Debian``; for Debian, ``name``
    is the source package and ``version`` the source version (what advisories name)."""

    ecosystem: str
    name: str
    version: str


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
        fix = f"; fixed in {', '.join(self.fixed)}" if self.fixed else "; no fixed version"
        also = f" ({', '.join(self.aliases[:3])})" if self.aliases else ""
        shown = "unknown, treated as high" if self.severity == "unknown" else self.severity
        return (
            f"{self.id}{also} {self.package.ecosystem} {self.package.name} {self.package.version}: "
            f"{shown}: {self.summary}{fix}"
        )


@dataclass
class Database:
    """The records of an OSV directory that concern the two ecosystems, by (ecosystem, name)."""

    root: Path
    records: dict[tuple[str, str], list[tuple[str, dict]]] = field(default_factory=dict)
    count: int = 0

    def affecting(self, pkg: Package) -> Iterator[Finding]:
        for source, rec in self.records.get((pkg.ecosystem, _name(pkg.ecosystem, pkg.name)), []):
            found = _match(rec, pkg)
            if found is not None:
                yield Finding(
                    id=str(rec.get("id")),
                    package=pkg,
                    severity=severity(rec),
                    summary=_one_line(rec.get("summary") or rec.get("details") or ""),
                    aliases=tuple(str(a) for a in rec.get("aliases") or []),
                    fixed=found,
                    source=source,
                )


def load(root: Path) -> Database:
    """Read every record under ``root``; a file that is not an OSV record is an error naming it."""
    if not root.is_dir():
        raise UserError(f"{root}: no such directory", file="--osv", fix="give a directory of OSV JSON records")
    db = Database(root)
    for path in sorted(root.rglob("*.json")):
        try:
            if path.stat().st_size > MAX_RECORD_BYTES:
                raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
            rec = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
                raise ValueError("not an OSV record (no id)")
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{path}: {exc}", file=str(path), fix="the OSV directory holds OSV JSON records only"
            ) from None
        if rec.get("withdrawn"):
            continue
        db.count += 1
        source = str(path.relative_to(root))
        keys = set()
        for affected in rec.get("affected") or []:
            pkg = affected.get("package") or {} if isinstance(affected, dict) else {}
            eco = _ecosystem(str(pkg.get("ecosystem") or ""))
            if eco and isinstance(pkg.get("name"), str):
                keys.add((eco, _name(eco, pkg["name"])))
        for key in keys:
            db.records.setdefault(key, []).append((source, rec))
    return db


def scan(db: Database, packages: Iterable[Package]) -> list[Finding]:
    """Every finding, most severe first, then by package and id."""
    out = [f for pkg in packages for f in db.affecting(pkg)]
    return sorted(out, key=lambda f: (-_RANK[f.severity], f.package.name, f.id))


def severity(rec: dict) -> str:
    named = (
        (rec.get("database_specific") or {}).get("severity") if isinstance(rec.get("database_specific"), dict) else None
    )
    if isinstance(named, str) and named.lower() in _RANK:
        level = named.lower()
        return "medium" if level == "moderate" else level
    best = None
    for item in rec.get("severity") or []:
        score = _cvss(item) if isinstance(item, dict) else None
        if score is not None and (best is None or score > best):
            best = score
    if best is None:
        return "unknown"
    return "critical" if best >= 9.0 else "high" if best >= 7.0 else "medium" if best >= 4.0 else "low"


def _cvss(item: dict) -> float | None:
    from cvss import CVSS3, CVSS4  # only records without a named severity need it

    kind, vector = item.get("type"), item.get("score")
    if not isinstance(vector, str):
        return None
    try:
        if kind == "CVSS_V3":
            return float(CVSS3(vector).base_score)
        if kind == "CVSS_V4":
            return float(CVSS4(vector).base_score)
    except Exception:  # a malformed vector rates nothing; the record stays "unknown"
        return None
    return None


def _ecosystem(text: str) -> str | None:
    if text == "PyPI":
        return "PyPI"
    if text == "Debian" or text.startswith("Debian:"):
        return "Debian"
    return None


def _name(ecosystem: str, name: str) -> str:
    return canonicalize_name(name) if ecosystem == "PyPI" else name


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _match(rec: dict, pkg: Package) -> tuple[str, ...] | None:
    """The fixed versions when ``pkg`` is affected by ``rec``; None when it is not."""
    hit, fixed = False, []
    for affected in rec.get("affected") or []:
        if not isinstance(affected, dict):
            continue
        named = affected.get("package") or {}
        if _ecosystem(str(named.get("ecosystem") or "")) != pkg.ecosystem:
            continue
        if _name(pkg.ecosystem, str(named.get("name") or "")) != _name(pkg.ecosystem, pkg.name):
            continue
        if pkg.version in (affected.get("versions") or []):
            hit = True
        for rng in affected.get("ranges") or []:
            if not isinstance(rng, dict) or rng.get("type") != "ECOSYSTEM":
                continue
            events = [e for e in rng.get("events") or [] if isinstance(e, dict)]
            fixed += [str(e["fixed"]) for e in events if "fixed" in e]
            if _in_range(events, pkg):
                hit = True
    return tuple(dict.fromkeys(fixed)) if hit else None


def _in_range(events: list[dict], pkg: Package) -> bool:
    """OSV's evaluation: walk the events in version order; the version is affected after an ``introduced``
    at or below it until a ``fixed``/``limit`` at or below it (or past a ``last_affected`` below it)."""
    cmp = compare_function(pkg.ecosystem)

    def at(event: dict) -> str:
        return str(next(iter(event.values())))

    def order(a: dict, b: dict) -> int:
        va, vb = at(a), at(b)
        if va == "0" or vb == "0":
            return (vb == "0") - (va == "0")
        return cmp(va, vb)

    affected = False
    for event in sorted(events, key=cmp_to_key(order)):
        kind, version = next(iter(event.items()))
        version = str(version)
        if kind == "introduced" and (version == "0" or cmp(version, pkg.version) <= 0):
            affected = True
        elif kind in ("fixed", "limit"):
            affected = affected and cmp(version, pkg.version) > 0  # fixed at or below it: no longer affected
        elif kind == "last_affected":
            affected = affected and cmp(version, pkg.version) >= 0
    return affected


def compare_function(ecosystem: str):
    return _pep440 if ecosystem == "PyPI" else dpkg_compare


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
