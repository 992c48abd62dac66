"""An SBOM matched against an OSV database directory, offline, with a gate: the verdict is ``blocked`` when a
finding is at or above ``fail_on`` (a finding of unknown severity counts as high), else ``clear``.
``stackforge scan``, ``publish --osv`` and ``nightly --osv`` share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import osv
from stackforge.builder import sbom
from stackforge.errors import UserError


@dataclass
class ScanReport:
    image: str
    database: str
    records: int
    packages: int
    fail_on: str
    findings: list[osv.Finding] = field(default_factory=list)

    @property
    def blocking(self) -> list[osv.Finding]:
        return [f for f in self.findings if f.at_least(self.fail_on)]

    @property
    def verdict(self) -> str:
        return "blocked" if self.blocking else "clear"

    @property
    def reason(self) -> str | None:
        """Why no alias moves (None: nothing blocks)."""
        blocking = self.blocking
        if not blocking:
            return None
        ids = ", ".join(f.id for f in blocking[:5]) + (", …" if len(blocking) > 5 else "")
        plural = "y" if len(blocking) == 1 else "ies"
        return f"{len(blocking)} known vulnerabilit{plural} at or above {self.fail_on} ({ids})"

    def lines(self) -> list[str]:
        out = [("BLOCK " if f.at_least(self.fail_on) else "note  ") + f.line() for f in self.findings]
        out.append(
            f"scan {self.image}: {self.packages} packages against {self.records} OSV records in {self.database}: "
            f"{len(self.findings)} finding(s), {len(self.blocking)} at or above {self.fail_on}: {self.verdict}"
        )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "database": self.database,
            "records": self.records,
            "packages": self.packages,
            "fail_on": self.fail_on,
            "verdict": self.verdict,
            "findings": [
                {
                    "id": f.id,
                    "aliases": list(f.aliases),
                    "ecosystem": f.package.ecosystem,
                    "package": f.package.name,
                    "version": f.package.version,
                    "severity": f.severity,
                    "blocking": f.at_least(self.fail_on),
                    "fixed": list(f.fixed),
                    "summary": f.summary,
                    "record": f.source,
                }
                for f in self.findings
            ],
        }


def check_level(level: str) -> str:
    if level not in osv.LEVELS:
        raise UserError(f"--fail-on {level!r} is not a severity", fix=f"use one of: {', '.join(osv.LEVELS)}")
    return level


def scan_sbom(text: str, image: str, database: Path, fail_on: str = "high") -> ScanReport:
    db = osv.load(database)
    packages = sbom.packages(text)
    return ScanReport(image, str(database), db.count, len(packages), check_level(fail_on), osv.scan(db, packages))
