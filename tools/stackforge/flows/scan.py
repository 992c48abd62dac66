"""``stackforge sbom`` and ``stackforge scan``: an image's SBOM, from the local engine or as published (or a
CycloneDX file a user names), and its scan against an OSV database directory (``builder/records/vulns.py``)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from stackforge import safeio
from stackforge.builder.records import sbom, vulns
from stackforge.builder.records.vulns import ScanReport
from stackforge.builder.records.waivers import Waivers
from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, split_ref
from stackforge.errors import UserError, printable
from stackforge.publish import attest


def sbom_text(engine: Any, ref: str, policy: RetryPolicy | None = None) -> str:
    """The SBOM of ``ref``: made from the image when the local engine has it, else the one attached to the
    published image in the registry (its subject checked against the digest the reference resolves to; read
    bounded and checked to be a CycloneDX SBOM before anything of it is shown)."""
    if engine.image_exists(ref):
        return sbom.of_image(engine, ref)
    try:
        repo, reference = split_ref(ref)
    except UserError:
        raise UserError(
            f"{printable(ref)!r} is neither a local image nor a registry reference",
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
    source = f"the SBOM attached to {ref} ({manifest.digest})"
    sbom.read(body, source=source)  # a CycloneDX document, within its bounds, or one error naming the field
    return safeio.decode(body, source=source, what="SBOM")


def scan_image(
    engine: Any,
    ref: str | None,
    database: Path,
    fail_on: str = "high",
    *,
    sbom_file: Path | None = None,
    max_age: _dt.timedelta = vulns.DEFAULT_MAX_AGE,
    waivers: Waivers | None = None,
) -> ScanReport:
    """The scan of ``ref``'s SBOM (or of the CycloneDX file ``sbom_file``) against ``database``."""
    vulns.check_level(fail_on)
    if sbom_file is not None:
        return vulns.scan(sbom.load(sbom_file), str(sbom_file), database, fail_on, max_age=max_age, waivers=waivers)
    if ref is None:
        raise UserError("name an image or an SBOM file", file="IMAGE", fix="stackforge scan IMAGE --osv DIR, or --sbom FILE")  # fmt: skip
    text = sbom_text(engine, ref)
    return vulns.scan_sbom(text, ref, database, fail_on, max_age=max_age, waivers=waivers)
