"""Artifacts attached to a published image: pushed as OCI 1.1 artifact manifests whose ``subject`` is the image
manifest, found again through the referrers API or, where the registry lacks it, the tag-schema fallback
(``sha256-<hex>``: an image index of the image's referrers). Every byte read back is checked against its digest,
and an artifact whose subject is another image is refused.

The provenance and the SBOM use :func:`attach` and :func:`fetch_all` (one artifact type each, one layer each); the
publish record (``record.py``) builds on the same descriptors, fallback tag and index, with its two-half attach.
"""

from __future__ import annotations

import datetime as _dt
import functools
import io
import json
import re
from dataclasses import dataclass
from typing import Any

from stackforge.clients.registry import OCI_INDEX, OCI_MANIFEST, MalformedAnswer, RegistryClient, RegistryError
from stackforge.clients.registry import sha256_digest as _digest

EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
CREATED = "org.opencontainers.image.created"
MANIFEST_LIMIT = 4 << 20
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Kind:
    """One kind of artifact: its ``artifactType``, its one layer's media type and the most bytes that layer may have."""

    artifact_type: str
    layer_type: str
    max_bytes: int = 16 << 20


@dataclass
class Attached:
    digest: str  # the artifact manifest's digest
    via: str  # "referrers" | "tag-schema"
    fallback_tag: str | None


@dataclass
class Fetched:
    body: bytes
    manifest_digest: str
    via: str
    created: str


def fallback_tag(digest: str) -> str:
    algorithm, _, hexpart = digest.partition(":")
    return f"{algorithm}-{hexpart}"


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data), **extra}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def subject_of(client: RegistryClient, digest: str) -> dict[str, Any]:
    """The descriptor of the image manifest ``digest`` as the registry holds it."""
    info = client.head_manifest(digest)
    if info is None:
        raise RegistryError(f"the registry does not hold {digest}")
    return {"mediaType": info.media_type or OCI_MANIFEST, "digest": digest, "size": info.size}


def push_blob(client: RegistryClient, data: bytes) -> str:
    digest = _digest(data)
    if not client.blob_exists(digest):
        client.upload_blob(digest, len(data), functools.partial(io.BytesIO, data))
    return digest


def attach(
    client: RegistryClient,
    kind: Kind,
    body: bytes,
    subject: dict[str, Any],
    annotations: dict[str, str] | None = None,
    created: str | None = None,
) -> Attached:
    """Push ``body`` as a ``kind`` artifact referring to ``subject``; index it in the fallback tag when the
    registry does not (no ``OCI-Subject`` in its answer)."""
    created = created or now()
    notes = {CREATED: created, **(annotations or {})}
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": kind.artifact_type,
            "config": descriptor(EMPTY_TYPE, EMPTY),
            "layers": [descriptor(kind.layer_type, body)],
            "subject": subject,
            "annotations": notes,
        },
        indent=2,
        sort_keys=True,
    ).encode()
    push_blob(client, EMPTY)
    push_blob(client, body)
    digest = _digest(manifest)
    _, indexed = client.put_manifest_subject(digest, manifest, OCI_MANIFEST)
    if indexed == subject["digest"]:
        return Attached(digest, "referrers", None)
    tag = fallback_tag(subject["digest"])
    entry = descriptor(OCI_MANIFEST, manifest, artifactType=kind.artifact_type, annotations=notes)
    current = client.get_manifest(tag)
    index = fallback_index(current.json() if current is not None else None, entry)
    client.put_manifest(tag, json.dumps(index, indent=2).encode(), OCI_INDEX)
    return Attached(digest, "tag-schema", tag)


def descriptor_problem(desc: Any, limit: int) -> str | None:
    """What makes ``desc`` unusable as an OCI descriptor of at most ``limit`` bytes (None when nothing does)."""
    if not isinstance(desc, dict):
        return "is not an object"
    if not isinstance(desc.get("digest"), str) or not DIGEST.fullmatch(desc["digest"]):
        return "has no sha256 digest"
    if not isinstance(desc.get("mediaType"), str):
        return "has no media type"
    size = desc.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= limit:
        return f"declares no size within 0..{limit} bytes"
    if not isinstance(desc.get("annotations", {}), dict):
        return "has annotations that are not an object"
    return None


def fallback_index(existing: dict[str, Any] | None, entry: dict[str, Any]) -> dict[str, Any]:
    """The fallback tag's image index with ``entry`` added (once: an entry with its digest is replaced)."""
    listed = (existing or {}).get("manifests", [])
    manifests = [
        m
        for m in (listed if isinstance(listed, list) else [])
        if isinstance(m, dict) and m.get("digest") != entry["digest"]
    ]
    return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*manifests, entry]}


def listed(client: RegistryClient, digest: str, kind: Kind) -> tuple[list[dict[str, Any]], str]:
    """(descriptors of the ``kind`` artifacts referring to ``digest``, how they were found)."""
    index = client.get_referrers(digest, kind.artifact_type)
    via = "referrers"
    if index is None:
        via = "tag-schema"
        got = client.get_manifest(fallback_tag(digest))
        index = got.json() if got is not None else {"manifests": []}
    manifests = index.get("manifests", []) if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise MalformedAnswer(f"the {via} index of {digest} has no list of manifests")
    found = [m for m in manifests if isinstance(m, dict) and m.get("artifactType") == kind.artifact_type]
    for m in found:
        problem = descriptor_problem(m, MANIFEST_LIMIT)
        if problem:
            raise MalformedAnswer(f"an artifact listed by the {via} index of {digest} {problem}")
    return found, via


def fetch_all(client: RegistryClient, digest: str, kind: Kind) -> list[Fetched]:
    """Every ``kind`` artifact attached to the image ``digest``, oldest first, each checked byte for byte and
    refused when its subject is not ``digest``."""
    found, via = listed(client, digest, kind)
    out = []
    for desc in found:
        ref = desc["digest"]
        got = client.get_manifest(ref)
        if got is None or got.digest != ref:
            raise RegistryError(f"artifact {ref} is listed but the registry serves {got.digest if got else 'nothing'}")
        manifest = got.json()
        subject = manifest.get("subject")
        if not isinstance(subject, dict) or subject.get("digest") != digest:
            shown = subject.get("digest") if isinstance(subject, dict) else None
            raise MalformedAnswer(f"artifact {ref} names the subject {str(shown)[:80]}, not {digest}; refused")
        layers = manifest.get("layers")
        mine = [x for x in layers if isinstance(x, dict) and x.get("mediaType") == kind.layer_type] if isinstance(layers, list) else []  # fmt: skip
        if len(mine) != 1 or descriptor_problem(mine[0], kind.max_bytes):
            raise MalformedAnswer(
                f"artifact {ref} holds no single {kind.layer_type} layer within {kind.max_bytes} bytes"
            )
        body = client.get_blob(mine[0]["digest"], max_bytes=kind.max_bytes, size=mine[0]["size"])
        notes = manifest.get("annotations")
        created = str(notes.get(CREATED, "")) if isinstance(notes, dict) else ""
        out.append(Fetched(body, ref, via, created))
    return sorted(out, key=lambda f: f.created)
