"""What a publish attaches to the image besides its record: the signed provenance and the SBOM.

Both are OCI 1.1 referrers of the image manifest (``referrers.py``: the referrers API, else the tag-schema
fallback). The provenance is also written where cosign looks for attestations, the tag ``sha256-<hex>.att``: an
image manifest whose layers are DSSE envelopes (``application/vnd.dsse.envelope.v1+json``) annotated with
``dev.cosignproject.cosign/signature`` and ``predicateType`` — the layout ``cosign attest`` writes, so ``cosign
verify-attestation --key KEY.pub --insecure-ignore-tlog --type slsaprovenance1`` can read it (stackforge keeps no
transparency-log entry; not run here, where no cosign binary is installed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stackforge import safeio
from stackforge.clients.registry import OCI_MANIFEST, MalformedAnswer, RegistryClient, RegistryError
from stackforge.clients.registry import sha256_digest as _digest
from stackforge.errors import BuildFailed, UserError, printable
from stackforge.fslock import atomic_write
from stackforge.publish import provenance, referrers

PROVENANCE = referrers.Kind("application/vnd.in-toto+json", provenance.ENVELOPE_TYPE, 4 << 20)
SBOM = referrers.Kind("application/vnd.cyclonedx+json", "application/vnd.cyclonedx+json", 64 << 20)
COSIGN_SIGNATURE = "dev.cosignproject.cosign/signature"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def cosign_tag(digest: str) -> str:
    return referrers.fallback_tag(digest) + ".att"


def _cosign_config(layers: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {
            "architecture": "",
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
            "config": {},
        },
        separators=(",", ":"),
    ).encode()


def attach_cosign(client: RegistryClient, digest: str, envelope: bytes) -> str:
    """Add ``envelope`` to the image's ``.att`` tag (kept: the envelopes already there); returns the tag."""
    tag = cosign_tag(digest)
    current = client.get_manifest(tag)
    doc = current.json() if current is not None else {}
    kept = [x for x in doc.get("layers", []) if isinstance(x, dict)] if isinstance(doc.get("layers"), list) else []
    layer = referrers.descriptor(
        provenance.ENVELOPE_TYPE,
        envelope,
        annotations={COSIGN_SIGNATURE: "", "predicateType": provenance.PREDICATE_TYPE},
    )
    layers = [x for x in kept if x.get("digest") != layer["digest"]] + [layer]
    config = _cosign_config(layers)
    referrers.push_blob(client, envelope)
    referrers.push_blob(client, config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": referrers.descriptor(OCI_CONFIG, config),
        "layers": layers,
    }
    client.put_manifest(tag, json.dumps(manifest, separators=(",", ":")).encode(), OCI_MANIFEST)
    return tag


def envelopes(client: RegistryClient, digest: str) -> list[bytes]:
    """Every provenance envelope attached to ``digest`` (referrers first, then cosign's ``.att`` tag)."""
    out = [f.body for f in referrers.fetch_all(client, digest, PROVENANCE)]
    att = client.get_manifest(cosign_tag(digest))
    if att is not None:
        layers = att.json().get("layers")
        for layer in layers if isinstance(layers, list) else []:
            if isinstance(layer, dict) and layer.get("mediaType") == provenance.ENVELOPE_TYPE:
                problem = referrers.descriptor_problem(layer, PROVENANCE.max_bytes)
                if problem:
                    raise MalformedAnswer(f"{cosign_tag(digest)}: an envelope layer {problem}")
                body = client.get_blob(layer["digest"], max_bytes=PROVENANCE.max_bytes, size=layer["size"])
                if body not in out:
                    out.append(body)
    return out


@dataclass
class Signing:
    """Sign and attach the provenance of a stack's publish before any tag names the image (``Publisher.before_tag``).

    An image already signed by this key (an envelope its key opens, whose subject is the image) is not signed
    again. A failure raises: the publish then writes no tag, so a publish given a key never leaves an unsigned tag."""

    key: Path
    record: Any  # () -> the publish record's data without its tags (see record.details)
    inputs: dict[str, Any]
    client: RegistryClient
    evidence_dir: Path
    echo: Any = None
    attached: dict[str, Any] | None = None

    def __call__(self, digest: str, image_id: str) -> None:
        public = provenance.public_key_of(self.key)
        try:
            for body in envelopes(self.client, digest):
                try:
                    stmt = provenance.open_envelope(body, public)
                except Exception:
                    continue
                if all(ok for ok, _ in provenance.check(stmt, digest, None)):
                    self.attached = {"digest": digest, "already": True}
                    atomic_write(self.evidence_dir / "provenance.json", body + b"\n")
                    return
            data = {**self.record(), "digest": digest, "image_id": image_id}
            stmt = provenance.statement(data, self.inputs, f"{self.client.repository}")
            envelope = provenance.sign(stmt, self.key)
            subject = referrers.subject_of(self.client, digest)
            done = referrers.attach(
                self.client, PROVENANCE, envelope, subject, {"in-toto.io/predicate-type": provenance.PREDICATE_TYPE}
            )
            tag = attach_cosign(self.client, digest, envelope)
        except RegistryError as exc:
            raise BuildFailed(
                f"the provenance of {digest} could not be attached: {exc}; no tag names the image",
                fix="re-run the publish (the image's blobs are kept in the registry)",
            ) from None
        self.attached = {
            "digest": digest,
            "referrer": done.digest,
            "via": done.via,
            "cosign_tag": tag,
            "envelope": _digest(envelope),
        }
        atomic_write(self.evidence_dir / "provenance.json", envelope.decode() + "\n")


def attach_sbom(client: RegistryClient, digest: str, body: bytes) -> referrers.Attached | None:
    """Attach the SBOM ``body`` to the image ``digest`` unless the same bytes are attached already (None then)."""
    if any(f.body == body for f in referrers.fetch_all(client, digest, SBOM)):
        return None
    return referrers.attach(client, SBOM, body, referrers.subject_of(client, digest))


def sbom_of(client: RegistryClient, digest: str) -> bytes | None:
    """The newest SBOM attached to the image ``digest`` (checked byte for byte and by its subject)."""
    found = referrers.fetch_all(client, digest, SBOM)
    return found[-1].body if found else None


def check_provenance(
    client: RegistryClient, digest: str, key: Path, record: dict[str, Any] | None
) -> list[tuple[bool, str]]:
    """``verify --key``: (ok, line) for the provenance attached to ``digest``. Passes when one envelope is signed by
    ``key`` and its statement's subject and predicate agree with the image and its record; fails, naming why, for an
    unsigned image, envelopes signed by other keys, or a statement that does not describe this image."""
    public = provenance.public_key(key)
    try:
        found = envelopes(client, digest)
    except (RegistryError, UserError) as exc:  # an attachment over its cap, or not what it says it is
        return [(False, f"signed  the provenance attached to {digest} cannot be read: {printable(_message(exc))}")]
    if not found:
        return [(False, f"signed  no provenance attached to {digest}: the image is unsigned")]
    reasons = []
    for body in found:
        try:
            stmt = provenance.open_envelope(body, public)
        except UserError as err:
            reasons.append(err.message)
            continue
        try:
            checks = provenance.check(stmt, digest, record)
        except UserError as err:
            reasons.append(err.message)
            continue
        lines = [(ok, f"signed  {text}") for ok, text in checks]
        head = (True, f"signed  provenance signed by {key} (keyid {public.keyid[:16]}…), {len(found)} attached")
        return [head, *lines]
    return [
        (False, f"signed  none of {len(found)} provenance envelope(s) is signed by {key} and readable: {reasons[0]}")
    ]


def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, UserError) else str(exc)


def check_sbom(attached: bytes, installed: str) -> tuple[bool, str]:
    """The SBOM attached to an image against ``installed`` (the SBOM made from the pulled image): the same packages
    and versions, 0 mismatches."""
    want = set(_components(attached, "the attached SBOM"))
    have = set(_components(installed, "the SBOM of the pulled image"))
    missing, extra = sorted(want - have), sorted(have - want)
    shown = ", ".join([*(f"-{p}" for p in missing[:4]), *(f"+{p}" for p in extra[:4])])
    ok = not missing and not extra
    return ok, (
        f"sbom    {len(want)} packages in the attached SBOM, {len(have)} installed: "
        + ("0 mismatches" if ok else f"{len(missing) + len(extra)} mismatches ({shown})")
    )


class _Component(BaseModel):
    model_config = ConfigDict(extra="allow")
    purl: str | None = None


class _Bom(BaseModel):
    model_config = ConfigDict(extra="allow")
    components: list[_Component] = Field(default_factory=list)


def _components(data: bytes | str, source: str) -> list[str]:
    """The package URLs of a CycloneDX document (bounded, typed: a wrong shape is a :class:`safeio.Malformed`)."""
    bom = safeio.parse_model(_Bom, data, source=source, what="SBOM", limit=SBOM.max_bytes)
    return [printable(c.purl) for c in bom.components]
