"""``stackforge scan``: an image's SBOM matched against an OSV database directory, offline, with a gate.

The verdict: ``blocked`` when a finding is at or above ``fail_on`` (a finding of unknown severity counts as
high), else ``clear``. The nightly and ``publish --osv`` use the same verdict to keep moving tags where they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import osv
from stackforge.builder import sbom
from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, split_ref
from stackforge.errors import UserError
from stackforge.publish import attest


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


def sbom_text(engine: Any, ref: str, policy: RetryPolicy | None = None) -> str:
    """The SBOM of ``ref``: made from the image when the local engine has it, else the one attached to the
    published image in the registry (its subject checked against the digest the reference resolves to)."""
    if engine.image_exists(ref):
        return sbom.of_image(engine, ref)
    try:
        repo, reference = split_ref(ref)
    except UserError:
        raise UserError(
            f"{ref!r} is neither a local image nor a registry reference",
            file="IMAGE",
            fix="give a local image, or REGISTRY/NAME:TAG (or @sha256:…) of a published image",
        ) from None
    client = RegistryClient(repo, policy=policy or RetryPolicy())
    try:
        manifest = client.get_manifest(reference)
        if manifest is None:
            raise UserError(f"{ref}: the registry has no such image", file="IMAGE")
        body = attest.sbom_of(client, manifest.digest)
    except RegistryError as exc:
        raise UserError(f"{ref}: {exc}", fix="check the reference and that the registry answers") from None
    if body is None:
        raise UserError(
            f"{ref} ({manifest.digest}) has no SBOM attached",
            fix=f"docker pull {ref} and run `stackforge sbom` on the local image (stackforge publish attaches one)",
        )
    return body.decode()


def scan_image(engine: Any, ref: str, database: Path, fail_on: str = "high") -> ScanReport:
    check_level(fail_on)
    return scan_sbom(sbom_text(engine, ref), ref, database, fail_on)
