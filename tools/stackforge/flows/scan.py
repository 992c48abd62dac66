"""``stackforge sbom`` and ``stackforge scan``: an image's SBOM, from the local engine or as published, and its
scan against an OSV database directory (``builder/vulns.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackforge.builder import sbom
from stackforge.builder.vulns import ScanReport, check_level, scan_sbom
from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, split_ref
from stackforge.errors import UserError
from stackforge.publish import attest


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
