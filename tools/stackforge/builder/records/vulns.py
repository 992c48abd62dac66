"""An SBOM matched against an OSV database directory, offline, with a gate that fails closed and waivers a
reviewer reads. ``stackforge scan``, ``publish --osv`` and ``nightly --osv`` share it.

Before any verdict, the database must be able to give one (:func:`check_database`); when it cannot, the scan is
an error naming the fix, never ``clear``:

- the directory exists and holds OSV records of the ecosystems the scan reads;
- it covers every ecosystem the image holds: ``PyPI`` when the image has Python distributions, and its
  distribution's release (``Debian:12``, ``Ubuntu:22.04``) when it has Debian packages (an SBOM that does not
  tell the release is refused);
- each of those ecosystems was fetched at most ``max_age`` ago: the ``fetched_at`` of its ``osv-snapshot.json``,
  else (the report says so) the newest ``modified`` time of its records.

Verdict: ``blocked`` when a finding at or above ``fail_on`` (unknown severity counts as high) is not covered by a
waiver (``builder/records/waivers.py``); ``waived`` when such findings exist and every one is waived; ``clear`` when there
are none. A waived finding is reported with its reason and expiry; one whose waiver expired blocks again.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import osv, safeio
from stackforge.builder.records import sbom
from stackforge.builder.records.waivers import Waiver, Waivers, today_utc
from stackforge.errors import UserError, printable

DEFAULT_MAX_AGE = _dt.timedelta(days=7)
#: a snapshot dated later than now by more than this is refused (a wrong clock would make it fresh forever)
CLOCK_SKEW = _dt.timedelta(hours=1)
_AGE = re.compile(r"(\d{1,4})([hdw]?)")
_UNITS = {"h": _dt.timedelta(hours=1), "d": _dt.timedelta(days=1), "w": _dt.timedelta(weeks=1), "": _dt.timedelta(days=1)}  # fmt: skip


def check_level(level: str) -> str:
    if level not in osv.LEVELS:
        raise UserError(f"--fail-on {printable(level)!r} is not a severity", fix=f"use one of: {', '.join(osv.LEVELS)}")
    return level


def parse_max_age(text: str | _dt.timedelta) -> _dt.timedelta:
    """``--osv-max-age``: hours, days or weeks (``36h``, ``7d``, ``2w``; a bare number is days), 1 hour to 1 year."""
    if isinstance(text, _dt.timedelta):
        age = text
    else:
        m = _AGE.fullmatch(str(text).strip())
        if m is None:
            raise UserError(
                f"--osv-max-age {printable(text)!r} is not an age",
                file="--osv-max-age",
                fix="give hours, days or weeks: 36h, 7d, 2w",
            )
        age = int(m.group(1)) * _UNITS[m.group(2)]
    if not _dt.timedelta(hours=1) <= age <= _dt.timedelta(days=366):
        raise UserError(f"--osv-max-age {printable(text)} is out of range", file="--osv-max-age", fix="1h to 52w")
    return age


def show_age(age: _dt.timedelta) -> str:
    hours = age.total_seconds() / 3600
    return f"{hours:.0f} h" if hours < 48 else f"{hours / 24:.1f} days"


@dataclass(frozen=True)
class Freshness:
    """When one ecosystem of the database was fetched, and how that is known."""

    ecosystem: str
    fetched_at: _dt.datetime
    snapshot: bool  # from osv-snapshot.json (else the newest record's modified time)
    age: _dt.timedelta

    def line(self) -> str:
        how = "snapshot" if self.snapshot else f"no {osv.SNAPSHOT}: newest record modified"
        return f"{self.ecosystem} {how} {self.fetched_at.strftime('%Y-%m-%dT%H:%M:%SZ')} ({show_age(self.age)} old)"

    def to_json(self) -> dict[str, Any]:
        return {
            "fetched_at": self.fetched_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "from": "snapshot" if self.snapshot else "newest record",
            "age_hours": round(self.age.total_seconds() / 3600, 1),
        }


def needed(packages: list[osv.Package]) -> dict[osv.Ecosystem, int]:
    """The ecosystems the image's packages need covered, with how many packages each."""
    out: dict[osv.Ecosystem, int] = {}
    for pkg in packages:
        eco = pkg.eco
        if eco is None:
            continue
        out[eco] = out.get(eco, 0) + 1
    return dict(sorted(out.items()))


def check_database(
    db: osv.Database, packages: list[osv.Package], max_age: _dt.timedelta, now: _dt.datetime
) -> list[Freshness]:
    """The freshness of each ecosystem the image needs; an error naming the fix when the database is empty, does
    not cover one of them, or is older than ``max_age`` for one of them."""
    where = printable(db.root)
    if db.count == 0:
        raise UserError(
            f"{where} holds no OSV records of {', '.join(osv.FAMILIES)}: nothing to scan against",
            file="--osv",
            fix=osv.FETCH_FIX,
        )
    wanted = needed(packages)
    if not wanted:
        raise UserError(
            "the SBOM lists no Python distribution and no Debian package: there is nothing to scan, which is no "
            "verdict",
            fix="scan the image itself (stackforge scan IMAGE), or an SBOM stackforge made of it",
        )
    out = []
    for eco, count in wanted.items():
        if eco.family != "PyPI" and eco.release is None:
            raise UserError(
                f"the image holds {count} {eco.family} packages, but its SBOM does not say which {eco.family} "
                "release they come from, so no advisory can be matched to them",
                fix="scan the local image (its SBOM then records the image's os-release), or rebuild it",
            )
        if not db.covers(eco):
            family = eco.family
            held = db.families.get(family)
            has = f" (it has {family} records of {', '.join(sorted(held.releases))})" if held and held.releases else ""
            raise UserError(
                f"{where} has no {eco} records{has}: the image's {count} {eco} packages would go unscanned",
                file="--osv",
                fix=f"fetch {osv.EXPORTS.replace('<ECOSYSTEM>', family)} unpacked into {where}/{family}/ with its "
                f"{osv.SNAPSHOT}",
            )
        fam = db.families[eco.family]
        when, snapshot = (fam.fetched_at, True) if fam.fetched_at is not None else (fam.newest, False)
        assert when is not None  # a family with records has a newest one
        age = now - when
        if age < -CLOCK_SKEW:
            raise UserError(
                f"the {eco.family} snapshot in {where} is dated {when.isoformat()}, in the future",
                file="--osv",
                fix=f"check the clock of the host that fetched it and its {osv.SNAPSHOT}; fetch it again",
            )
        fresh = Freshness(str(eco), when, snapshot, max(age, _dt.timedelta(0)))
        if age > max_age:
            raise UserError(
                f"the {eco.family} advisories in {where} are {show_age(age)} old ({fresh.line()}), older than "
                f"--osv-max-age {show_age(max_age)}: a scan against them could miss what is known now",
                file="--osv",
                fix=f"fetch the {eco.family} export again ({osv.EXPORTS.replace('<ECOSYSTEM>', eco.family)}), "
                "or, knowing why, give a longer --osv-max-age",
            )
        out.append(fresh)
    return out


@dataclass
class Judged:
    """One finding and what the waivers say of it."""

    finding: osv.Finding
    blocks: bool  # at or above fail_on and not waived
    waiver: Waiver | None = None  # the waiver that covers it
    expired: Waiver | None = None  # a waiver that covered it and has expired

    def line(self, fail_on: str) -> str:
        text = self.finding.line()
        if self.waiver is not None:
            w = self.waiver
            return (
                f"waived {text} [until {w.expires.isoformat()}, {printable(w.where)}: "
                f"{safeio.for_terminal(w.reason, lines=False)}]"
            )
        head = "BLOCK " if self.blocks else "note  "
        if self.expired is not None:
            text += f" [its waiver ({printable(self.expired.where)}) expired on {self.expired.expires.isoformat()}]"
        return head + text


@dataclass
class ScanReport:
    image: str
    database: str
    records: int
    packages: int
    fail_on: str
    findings: list[osv.Finding] = field(default_factory=list)
    waivers: Waivers = field(default_factory=Waivers)
    freshness: list[Freshness] = field(default_factory=list)
    today: _dt.date = field(default_factory=today_utc)

    def judged(self) -> list[Judged]:
        out = []
        for f in self.findings:
            active, expired = self.waivers.of(f, self.today)
            out.append(Judged(f, f.at_least(self.fail_on) and active is None, active, expired))
        return out

    @property
    def blocking(self) -> list[osv.Finding]:
        """The findings at or above ``fail_on`` that no waiver covers: each holds the aliases back."""
        return [j.finding for j in self.judged() if j.blocks]

    @property
    def waived(self) -> list[Judged]:
        return [j for j in self.judged() if j.waiver is not None]

    @property
    def verdict(self) -> str:
        """blocked, waived (every finding at or above ``fail_on`` is waived) or clear."""
        if self.blocking:
            return "blocked"
        return "waived" if any(j.finding.at_least(self.fail_on) for j in self.waived) else "clear"

    @property
    def reason(self) -> str | None:
        """Why no alias moves (None: nothing blocks)."""
        blocking = self.blocking
        if not blocking:
            return None
        ids = ", ".join(dict.fromkeys(f.id for f in blocking[:5])) + (", …" if len(blocking) > 5 else "")
        plural = "y" if len(blocking) == 1 else "ies"
        return f"{len(blocking)} known vulnerabilit{plural} at or above {self.fail_on} ({ids})"

    def lines(self) -> list[str]:
        """The report for a terminal: every text from a record, an SBOM or the waivers stripped of control
        characters."""
        judged = self.judged()
        out = [j.line(self.fail_on) for j in judged]
        if self.freshness:
            out.append("database: " + "; ".join(f.line() for f in self.freshness))
        out.append(f"waivers: {printable(self.waivers.file) if self.waivers.file else 'none'}")
        waived = [j for j in judged if j.waiver is not None]
        out.append(
            safeio.for_terminal(
                f"scan {self.image}: {self.packages} packages against {self.records} OSV records in {self.database}: "
                f"{len(self.findings)} finding(s), {sum(j.blocks for j in judged)} blocking and {len(waived)} waived "
                f"at or above {self.fail_on}: {self.verdict}",
                lines=False,
            )
        )
        return out

    def summary(self) -> dict[str, Any]:
        """The scan as the nightly summary and the publish evidence carry it (the history renders these)."""
        return {
            "verdict": self.verdict,
            "fail_on": self.fail_on,
            "blocked": list(dict.fromkeys(f.id for f in self.blocking)),
            "waived": [
                {
                    "id": j.finding.id,
                    "package": j.finding.package.name,
                    "version": j.finding.package.version,
                    "severity": j.finding.severity,
                    **j.waiver.to_json(),
                }
                for j in self.waived
                if j.waiver is not None
            ],
            "findings": len(self.findings),
            "database": {f.ecosystem: f.to_json() for f in self.freshness},
            "waivers": self.waivers.file,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "database": self.database,
            "records": self.records,
            "packages": self.packages,
            "fail_on": self.fail_on,
            "verdict": self.verdict,
            "snapshots": {f.ecosystem: f.to_json() for f in self.freshness},
            "waivers": self.waivers.file,
            "findings": [
                {
                    "id": j.finding.id,
                    "aliases": list(j.finding.aliases),
                    "ecosystem": j.finding.package.ecosystem,
                    "package": j.finding.package.name,
                    "version": j.finding.package.version,
                    "severity": j.finding.severity,
                    "blocking": j.blocks,
                    "waived": j.waiver.to_json() if j.waiver is not None else None,
                    "expired_waiver": j.expired.to_json() if j.expired is not None and j.waiver is None else None,
                    "fixed": list(j.finding.fixed),
                    "summary": j.finding.summary,
                    "record": j.finding.source,
                }
                for j in self.judged()
            ],
        }


# One database per process: a nightly scans each of its images against the same directory.
_LOADED: dict[str, tuple[str, osv.Database]] = {}


def _signature(root: Path) -> str:
    """What changes when any file of the database does: every entry's path, size, time and inode (a stat per
    file costs little beside reading it)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            digest.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode(errors="replace"))
    return digest.hexdigest()


def load_database(root: Path) -> osv.Database:
    """:func:`osv.load` of ``root``, kept for this process while the directory is unchanged."""
    key = os.path.realpath(root)
    sig = _signature(Path(root))
    cached = _LOADED.get(key)
    if cached is not None and cached[0] == sig:
        return cached[1]
    db = osv.load(Path(root))
    _LOADED.clear()
    _LOADED[key] = (sig, db)
    return db


def scan(
    bom: sbom.Bom,
    image: str,
    database: Path,
    fail_on: str = "high",
    *,
    max_age: _dt.timedelta = DEFAULT_MAX_AGE,
    waivers: Waivers | None = None,
    now: _dt.datetime | None = None,
) -> ScanReport:
    """The SBOM ``bom`` of ``image`` against the OSV directory ``database``: an error when the database cannot
    give a verdict (:func:`check_database`), else the report."""
    check_level(fail_on)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    db = load_database(database)
    packages = sbom.packages(bom)
    fresh = check_database(db, packages, max_age, now)
    return ScanReport(
        image,
        str(database),
        db.count,
        len(packages),
        fail_on,
        osv.scan(db, packages),
        waivers or Waivers(),
        fresh,
        now.date(),
    )


def scan_sbom(
    text: str | bytes,
    image: str,
    database: Path,
    fail_on: str = "high",
    *,
    source: str | Path | None = None,
    max_age: _dt.timedelta = DEFAULT_MAX_AGE,
    waivers: Waivers | None = None,
    now: _dt.datetime | None = None,
) -> ScanReport:
    """:func:`scan` of an SBOM's text (``source`` names it in errors)."""
    check_level(fail_on)
    bom = sbom.read(text, source=source or f"the SBOM of {image}")
    return scan(bom, image, database, fail_on, max_age=max_age, waivers=waivers, now=now)


def preflight(
    database: Path, max_age: _dt.timedelta = DEFAULT_MAX_AGE, now: _dt.datetime | None = None
) -> list[Freshness]:
    """What can be checked of ``database`` before any image exists (a nightly's first step): it holds records,
    covers PyPI (every image stackforge builds has Python distributions) and is not too old for it. Each image's
    distribution is checked when it is scanned."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    db = load_database(database)
    return check_database(db, [osv.Package("PyPI", "pip", "0")], max_age, now)
