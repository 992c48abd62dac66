"""The publish record, attached to the image in the registry as an OCI artifact.

After a publish, the record (:class:`stackforge.publish.record_schema.PublishRecord`, schema
``stackforge.publish-record/v1``: the stack, its files as loaded, the
``--set`` values, pins, options, fingerprints, the image's labels, gate/ABI/smoke results, the image digest
and id, and every tag that names the image) is pushed as an OCI 1.1 artifact manifest whose ``subject`` is
the image manifest: an empty config, one layer (the record, ``application/vnd.stackforge.publish-record.v1+json``)
and ``artifactType`` naming it. A registry with the referrers API indexes it itself (it answers the PUT with
``OCI-Subject``); otherwise the OCI 1.1 tag-schema fallback is kept: the tag ``sha256-<hex of the image
digest>`` holds an image index listing the image's referrers, and the new artifact is added to it.

A stack's publish attaches it in two halves (:class:`Attacher`): the record and its blobs while the publisher
waits out its settle pause, the artifact manifest once the publish has its verdict.

:func:`fetch` finds the records of an image the same two ways (``GET /v2/<name>/referrers/<digest>``, else the
fallback tag) and checks every byte it reads against its digest; the newest record (by its
``org.opencontainers.image.created`` annotation) is the one ``verify`` checks.
"""

from __future__ import annotations

import datetime as _dt
import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from stackforge import safeio
from stackforge.builder.context import embed
from stackforge.clients.registry import (
    OCI_INDEX,
    OCI_MANIFEST,
    MalformedAnswer,
    RegistryClient,
    RegistryError,
    RetryPolicy,
    parse_answer,
    sha256_digest,
)
from stackforge.errors import BuildFailed
from stackforge.fslock import atomic_write
from stackforge.publish.record_schema import (
    SCHEMA,
    FileEntry,
    GateResults,
    PublishRecord,
    ScanPart,
    parse,
    problems,
)
from stackforge.publish.referrers import (
    CREATED,
    DIGEST,
    EMPTY,
    EMPTY_TYPE,
    MANIFEST_LIMIT,
    descriptor,
    descriptor_problem,
    fallback_index,
    fallback_tag,
    subject_of,
)
from stackforge.stack.load import fingerprint

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine
    from stackforge.clients.registry import Repository
    from stackforge.publish.publisher import PublishResult
    from stackforge.stack.resolved import ResolvedStack

ARTIFACT_TYPE = "application/vnd.stackforge.publish-record.v1+json"
MAX_RECORD = 16 << 20


#: one evidence file the record carries (a gate's lines, a smoke or slice result)
EVIDENCE_LIMIT = 16 << 20


def _lines(path: Path) -> list[str]:
    """The lines of an evidence file (none when the build wrote none); one that is not a file of text within
    :data:`EVIDENCE_LIMIT` is an error naming it."""
    if not path.exists() and not path.is_symlink():
        return []
    return safeio.read_text(path, limit=EVIDENCE_LIMIT, what="evidence file", root=path.parent).splitlines()


class _SmokeJson(BaseModel):
    """The parts of ``smoke.json`` the record carries."""

    model_config = ConfigDict(extra="allow")
    verdict: JsonValue = None
    rows: list[JsonValue] = Field(default_factory=list)


class _SliceJson(BaseModel):
    """The parts of a slice's ``result.json`` the record carries."""

    model_config = ConfigDict(extra="allow")
    verdict: JsonValue = None
    counts: dict[str, JsonValue] | None = None
    expected: dict[str, JsonValue] | None = None


def smoke_results(evidence_dir: Path) -> dict[str, Any]:
    """Each recipe's smoke verdict and rows from ``smoke/<recipe>/smoke.json`` of the build's evidence."""
    out: dict[str, Any] = {}
    for path in sorted(evidence_dir.glob("smoke/*/smoke.json")):
        data = safeio.load_model(_SmokeJson, path, what="smoke result", limit=EVIDENCE_LIMIT, root=evidence_dir)
        rows = [{"name": r.get("name"), "status": r.get("status")} for r in data.rows if isinstance(r, dict)]
        out[path.parent.name] = {"verdict": data.verdict, "rows": rows}
    return out


def test_results(evidence_dir: Path) -> dict[str, Any]:
    """Each test slice's verdict, counts and expected counts from ``tests/<slice>/result.json`` of the build's
    evidence."""
    out: dict[str, Any] = {}
    for path in sorted(evidence_dir.glob("tests/*/result.json")):
        data = safeio.load_model(_SliceJson, path, what="test slice result", limit=EVIDENCE_LIMIT, root=evidence_dir)
        keep = {k: v for k, v in (("counts", data.counts), ("expected", data.expected)) if v is not None}
        out[path.parent.name] = {"verdict": data.verdict, **keep}
    return out


def head(stack: str, target: str, published: PublishResult) -> dict[str, Any]:
    """The keys every record starts with: schema, stack, target, repository, digest, image id and the tags (the
    immutable one and every alias the publish moved) of ``published`` (a ``PublishResult``)."""
    moved = [a for a, status in published.aliases.items() if not str(status).startswith("not moved")]
    return {
        "schema": SCHEMA,
        "stack": stack,
        "target": target,
        "repository": published.repository,
        "digest": published.digest,
        "image_id": published.image_id,
        **({"gated_image_id": published.gated_image_id} if getattr(published, "gated_image_id", None) else {}),
        "tags": [t for t in (published.tag, *moved) if t],  # none yet: pushed by digest for an index (``pushed``)
    }


def file_entry(data: bytes) -> FileEntry:
    """A file of the record: its sha256 and text."""
    return FileEntry(sha256=embed.digest(data), text=data.decode())


def stack_files(files: dict[str, bytes]) -> dict[str, FileEntry]:
    """The embedded stack files (not the overrides) with their sha256 and text."""
    return {n: file_entry(d) for n, d in files.items() if n != embed.OVERRIDES}


def make(
    loaded: ResolvedStack,
    target: str,
    evidence_dir: Path,
    published: PublishResult,
    labels: dict[str, str],
) -> PublishRecord:
    """The record of one publish: ``loaded`` (a ResolvedStack), the build's evidence directory, the
    ``PublishResult`` and the local image's labels."""
    return PublishRecord(**head(loaded.model.name, target, published), **details(loaded, evidence_dir, labels))


def details(loaded: ResolvedStack, evidence_dir: Path, labels: dict[str, str]) -> dict[str, Any]:
    """The keys of a record after :func:`head`: what the publish result does not decide."""

    stack = loaded.model
    files = embed.files(loaded)
    return {
        "stack_files": stack_files(files),
        "overrides": json.loads(files[embed.OVERRIDES]),
        "pins": {n: p.version for n, p in stack.packages.items()},
        "options": {n: o.value for n, o in stack.options.items()},
        "fingerprint": fingerprint(stack),
        "inputs_fingerprint": labels.get("org.stackforge.inputs"),
        "labels": dict(labels),
        "gate": GateResults(
            gate=_lines(evidence_dir / "gate.txt"),
            abi=_lines(evidence_dir / "abi.txt"),
            readonly=_lines(evidence_dir / "gate-readonly.txt"),
        ),
        "smoke": smoke_results(evidence_dir),
        "tests": test_results(evidence_dir),
        "build_id": evidence_dir.name,
    }


def image_store(engine: Engine) -> str:
    """The record's name of ``engine``'s image store: ``containerd`` or ``classic``."""
    return "containerd" if engine.uses_containerd_store() else "classic"


def check_schema(record: Any) -> list[str]:
    """What is wrong with ``record`` as a record of this schema (empty when nothing is): one line per key."""
    return problems(record)


def body_of(record: PublishRecord) -> bytes:
    """The record as its artifact's layer holds it."""
    return (json.dumps(record.data(), indent=2, sort_keys=True) + "\n").encode()


def artifact(record: PublishRecord, subject: dict[str, Any], created: str) -> tuple[bytes, bytes]:
    """(record bytes, artifact manifest bytes) for ``record`` referring to ``subject`` (a descriptor)."""
    body = body_of(record)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": descriptor(EMPTY_TYPE, EMPTY),
        "layers": [descriptor(ARTIFACT_TYPE, body)],
        "subject": subject,
        "annotations": {CREATED: created, "org.stackforge.stack": record.stack},
    }
    return body, json.dumps(manifest, indent=2, sort_keys=True).encode()


@dataclass
class Attached:
    digest: str  # the artifact manifest's digest
    via: str  # "referrers" | "tag-schema"
    fallback_tag: str | None


def push_blobs(client: RegistryClient, *blobs: bytes, present: frozenset[str] = frozenset()) -> set[str]:
    """Upload each of ``blobs`` the repository lacks (``present``: digests known to be there); their digests."""
    pushed = set()
    for data in blobs:
        digest = sha256_digest(data)
        if digest not in present and not client.blob_exists(digest):
            client.upload_blob(digest, len(data), functools.partial(io.BytesIO, data))
        pushed.add(digest)
    return pushed


def attach(
    client: RegistryClient,
    record: PublishRecord,
    subject: dict[str, Any],
    created: str | None = None,
    present: frozenset[str] = frozenset(),
) -> Attached:
    """Push ``record`` as an artifact referring to ``subject`` (the image manifest's descriptor)."""
    created = created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body, manifest = artifact(record, subject, created)
    push_blobs(client, EMPTY, body, present=present)
    digest = sha256_digest(manifest)
    _, indexed = client.put_manifest_subject(digest, manifest, OCI_MANIFEST)
    if indexed == subject["digest"]:
        return Attached(digest, "referrers", None)
    tag = fallback_tag(subject["digest"])
    entry = descriptor(OCI_MANIFEST, manifest, artifactType=ARTIFACT_TYPE, annotations={CREATED: created})
    current = client.get_manifest(tag)
    existing = current.json() if current is not None else None
    index = json.dumps(fallback_index(existing, entry), indent=2).encode()
    client.put_manifest(tag, index, OCI_INDEX)
    return Attached(digest, "tag-schema", tag)


@dataclass
class Found:
    record: Any  # the record as the registry served it (JSON, not yet validated: see :meth:`parsed`)
    manifest_digest: str
    via: str
    created: str
    subject: str | None

    def parsed(self) -> PublishRecord:
        """The record validated; a :class:`UserError` naming every bad key when it is not a record."""
        return parse(self.record, f"the record {self.manifest_digest}")


def _verified_manifest(client: RegistryClient, digest: str) -> dict[str, Any]:
    if not DIGEST.fullmatch(digest):
        raise MalformedAnswer(f"referrer {digest[:80]!r} is not a sha256 digest")
    got = client.get_manifest(digest)
    if got is None:
        raise RegistryError(f"referrer {digest} is listed but the registry does not hold it")
    if got.digest != digest:
        raise RegistryError(f"referrer {digest}: the registry served bytes with digest {got.digest}")
    return got.json()


def referrers(client: RegistryClient, digest: str) -> tuple[list[dict[str, Any]], str]:
    """(descriptors of the record artifacts referring to ``digest``, how they were found)."""
    index = client.get_referrers(digest, ARTIFACT_TYPE)
    via = "referrers"
    if index is None:
        via = "tag-schema"
        got = client.get_manifest(fallback_tag(digest))
        index = got.json() if got is not None else {"manifests": []}
    manifests = index.get("manifests", [])
    if not isinstance(manifests, list):
        raise MalformedAnswer(f"the {via} index of {digest} has no list of manifests")
    found = [m for m in manifests if isinstance(m, dict) and m.get("artifactType") == ARTIFACT_TYPE]
    for m in found:
        problem = descriptor_problem(m, MANIFEST_LIMIT)
        if problem:
            raise MalformedAnswer(f"a record listed by the {via} index of {digest} {problem}")
    return found, via


def _subject_of(manifest: dict[str, Any], referrer: str, digest: str) -> str:
    """The subject digest of the artifact manifest ``referrer``: it must be ``digest`` (the pulled image)."""
    subject = manifest.get("subject")
    if isinstance(subject, dict) and not descriptor_problem(subject, MANIFEST_LIMIT) and subject["digest"] == digest:
        return digest
    shown = subject.get("digest") if isinstance(subject, dict) else None
    raise MalformedAnswer(f"referrer {referrer} names the subject {str(shown)[:80]}, not {digest}: "
                          "it is not a record of this image; refused")  # fmt: skip


def _record_layer(manifest: dict[str, Any], referrer: str) -> dict[str, Any]:
    """The one record layer's descriptor of the artifact manifest ``referrer``, validated."""
    listed = manifest.get("layers")
    layers = [x for x in listed if isinstance(x, dict) and x.get("mediaType") == ARTIFACT_TYPE] if isinstance(listed, list) else []  # fmt: skip
    if len(layers) != 1:
        raise MalformedAnswer(f"referrer {referrer} holds {len(layers)} record layers, not one")
    problem = descriptor_problem(layers[0], MAX_RECORD)
    if problem:
        raise MalformedAnswer(f"the record layer of referrer {referrer} {problem}")
    return layers[0]


def fetch(client: RegistryClient, digest: str) -> Found | None:
    """The newest publish record attached to the image ``digest`` (None when there is none). Every manifest
    and blob read is checked against its digest; a record whose subject is not ``digest`` is refused."""
    found, via = referrers(client, digest)
    if not found:
        return None
    newest = max(enumerate(found), key=lambda im: (str((im[1].get("annotations") or {}).get(CREATED, "")), im[0]))[1]
    manifest = _verified_manifest(client, newest["digest"])
    subject = _subject_of(manifest, newest["digest"], digest)
    layer = _record_layer(manifest, newest["digest"])
    blob = client.get_blob(layer["digest"], max_bytes=MAX_RECORD, size=layer["size"])
    record = parse_answer(blob, f"record blob {layer['digest']}")
    annotations = manifest.get("annotations")
    created = annotations.get(CREATED, "") if isinstance(annotations, dict) else ""
    return Found(record, newest["digest"], via, str(created), subject)


def attach_made(
    record: PublishRecord,
    evidence_dir: Path,
    published: PublishResult,
    repository: Repository,
    policy: RetryPolicy | None = None,
    early: Early | None = None,
) -> Attached:
    """Attach ``record`` to the image a publish that just succeeded pushed, and keep it beside ``publish.json``
    as ``record.json`` (with where it was attached). ``early``: what :meth:`Attacher.prepare` already did."""

    early = early if early is not None and early.subject["digest"] == published.digest else None
    client = early.client if early else _client(repository, policy)
    try:
        subject = early.subject if early else subject_of(client, published.digest)
        done = attach(client, record, subject, published.finished_at, present=early.present if early else frozenset())
    except RegistryError as exc:
        raise BuildFailed(
            f"{published.reference} is published, but its publish record could not be attached: {exc}",
            fix="re-run the same publish: the image is found already published and the record is attached",
        ) from None
    atomic_write(
        evidence_dir / "record.json", json.dumps({"attached": done.__dict__, "record": record.data()}, indent=2) + "\n"
    )
    return done


def _client(repository: Repository, policy: RetryPolicy | None) -> RegistryClient:
    return RegistryClient(repository, policy=policy or RetryPolicy())


@dataclass
class Early:
    """What was done for a record before the publish's verdict: its subject and the blobs the registry holds."""

    client: RegistryClient
    subject: dict[str, Any]
    present: frozenset[str]


@dataclass
class Attacher:
    """Attach a stack's publish record in two halves. :meth:`prepare` runs in the publisher's settle pause
    with the result the publish is about to report: the labels, the record (stack files, fingerprints, gate
    results), its blobs uploaded and the subject read. :meth:`finish` runs on the result the publish
    reported: the record for its tags (uploaded again only where they differ) and the artifact manifest."""

    loaded: ResolvedStack
    target: str
    evidence_dir: Path
    repository: Repository
    engine: Engine
    local_ref: str
    policy: RetryPolicy | None = None
    #: the vulnerability gate's verdict (``ScanReport.summary()``), carried by the record; None: no scan ran
    scan: dict[str, Any] | None = None
    _details: dict[str, Any] | None = None
    _early: Early | None = None

    def _record(self, published: PublishResult) -> PublishRecord:
        if self._details is None:
            labels = self.engine.image_labels(self.local_ref)
            self._details = details(self.loaded, self.evidence_dir, labels)
            self._details["image_store"] = image_store(self.engine)
            if self.scan is not None:
                keys = ("verdict", "fail_on", "blocked", "waived", "findings", "database")
                self._details["scan"] = ScanPart(**{k: self.scan[k] for k in keys if k in self.scan})
        return PublishRecord(**head(self.loaded.model.name, self.target, published), **self._details)

    def prepare(self, provisional: PublishResult) -> None:
        client = _client(self.repository, self.policy)
        subject = subject_of(client, provisional.digest)
        present = push_blobs(client, EMPTY, body_of(self._record(provisional)))
        self._early = Early(client, subject, frozenset(present))

    def finish(self, published: PublishResult) -> Attached:
        return attach_made(
            self._record(published), self.evidence_dir, published, self.repository, self.policy, self._early
        )
