"""A night in the registry: its plan, each shard's result, and each row attached to the image it published.

The shards of a night run on hosts that share nothing but the registry, so the registry is where they report, and
where the merge reads. Three kinds of OCI 1.1 artifact manifests (an empty config, one JSON layer each):

``<registry>/stackforge-nightly:<date>-plan`` (:data:`PLAN_TYPE`)
    the night's plan (``flows/night_plan.py``), recorded once: a second ``--plan`` of the night gets the recorded
    one back, so every shard and the merge read the same units under the same shard ids.
``<registry>/stackforge-nightly:<date>-<shard id>`` (:data:`SHARD_TYPE`)
    a shard's result: every row of its units (as the summary has them), its bake, its freshness and drift answers,
    and one more layer per row holding the row's evidence bundle (a gzip tar of the build's evidence directory, the
    files ``stackforge history`` reads), annotated with the row's unit. Its ``subject`` is the plan's manifest, so a
    result names the plan it ran. Every shard writes one, whatever happened, including a shard that published
    nothing (a failed preflight, lint or build): the tag is found by the night and the shard id alone, with no
    image to look under. A re-run rewrites its shard's tag; the merge reads the newest. One tag per shard: shards
    never write the same tag, so two shards reporting at once cannot lose each other's result (a shared index would).
the row (:data:`ROW_TYPE`), attached to the image it published
    in the image's own repository, ``subject`` the image manifest, through the referrers API or the tag-schema
    fallback as the publish record is (``referrers.py``): an operator who lists an image's referrers sees the night
    and shard that published it, its gate, tests, smoke and scan. The merge checks it agrees with the shard's result.

Everything read back is hostile: bounded (:data:`MAX_PLAN`, :data:`MAX_RESULT`, :data:`MAX_EVIDENCE`), checked
against its digest, validated by a strict model, and an evidence bundle is unpacked file by file (regular files
under relative names only, each and all of them bounded) into a directory of its own.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints

from stackforge import safeio
from stackforge.clients.registry import (
    OCI_MANIFEST,
    MalformedAnswer,
    Manifest,
    RegistryClient,
    RegistryError,
    Repository,
    sha256_digest,
)
from stackforge.errors import UserError, printable
from stackforge.publish import referrers

NIGHT_REPOSITORY = "stackforge-nightly"
PLAN_TYPE = "application/vnd.stackforge.nightly-plan.v1+json"
SHARD_TYPE = "application/vnd.stackforge.nightly-shard.v1+json"
ROW_TYPE = "application/vnd.stackforge.nightly-row.v1+json"
EVIDENCE_TYPE = "application/vnd.stackforge.nightly-evidence.v1.tar+gzip"
UNIT = "org.stackforge.unit"
SHARD = "org.stackforge.shard"
NIGHT = "org.stackforge.night"

MAX_PLAN = 4 << 20
MAX_RESULT = 16 << 20
MAX_ROW = 4 << 20
#: one row's evidence bundle as stored (compressed) and unpacked; one file of it
MAX_EVIDENCE = 128 << 20
MAX_UNPACKED = 256 << 20
MAX_EVIDENCE_FILE = 64 << 20
MAX_EVIDENCE_FILES = 4096

ROW = referrers.Kind(ROW_TYPE, ROW_TYPE, MAX_ROW)
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]


def night_repository(registry: Repository) -> Repository:
    """Where a night's plan and shard results go: ``<registry>/stackforge-nightly``."""
    return registry.child(NIGHT_REPOSITORY)


def plan_tag(date: str) -> str:
    return f"{date}-plan"


def shard_tag(date: str, shard: str) -> str:
    return f"{date}-{shard}"


# --------------------------------------------------------------------------------------------------------------
# Documents


class NightRow(BaseModel):
    """One row of a night: a stack, one of its targets and the platform its image was built for. What
    ``flows/nightly.py`` ``Row`` writes into ``summary.json`` (its fields are these, a unit test holds them together),
    what a shard reports (:class:`Row`) and what ``stackforge history`` reads back (``flows/night_records.py``
    ``SummaryRow``): strict JSON types, keys a newer writer added kept."""

    model_config = ConfigDict(strict=True, extra="allow")

    stack: str
    target: str
    status: str
    #: the OCI platform of the image (linux/amd64, linux/arm64): the platform line it was built for; None in a row
    #: that built nothing (a stack that did not load) and in a night written before rows named it
    platform: str | None = None
    #: a sharded night's: the shard that built the row
    shard: str | None = None
    #: a shard's line of a stack of several platform lines: ``<repository>@<digest>`` it pushed (untagged); the merge
    #: tags the index over every line
    pushed: str | None = None
    stage: str | None = None
    tag: str | None = None
    #: the image's manifest (of its platform, under a tag that is an index of every platform line)
    digest: Digest | None = None
    gate: str | None = None
    duration_s: float = Field(default=0.0, ge=0)
    reason: str | None = None
    evidence: str | None = None
    overrides: list[str] = Field(default_factory=list)
    smoke: str | None = None
    smoke_recipes: dict[str, str] = Field(default_factory=dict)
    tests: dict[str, str] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict)
    #: the vulnerability gate's verdict; typed loosely here so that one the history cannot read (it reads it apart,
    #: ``night_records.Scan``) does not make the whole summary unreadable. None: not scanned
    scan: JsonValue = None


class Row(NightRow):
    """A row as a shard reports it: the summary's row, its scan an object when there is one."""

    scan: dict[str, JsonValue] | None = None


class ShardResult(BaseModel):
    """What a shard reports (the first layer of its result manifest)."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)

    schema_: Literal["stackforge.nightly-shard/v1"] = Field(alias="schema")
    date: Annotated[str, StringConstraints(pattern=r"^[0-9]{8}$")]
    shard: str
    plan: Digest  # the plan manifest it ran
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = Field(default=0.0, ge=0)
    rows: list[Row]
    bake: dict[str, JsonValue] = Field(default_factory=dict)
    freshness: dict[str, JsonValue] = Field(default_factory=dict)
    drift: dict[str, JsonValue] = Field(default_factory=dict)
    ci: dict[str, str] = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list)

    def data(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")


@dataclass
class Reported:
    """A shard's result as the registry holds it: the result, its manifest's digest, the evidence layers by unit."""

    result: ShardResult
    manifest_digest: str
    plan_digest: str
    evidence: dict[str, dict[str, Any]]  # unit key -> the layer's descriptor


# --------------------------------------------------------------------------------------------------------------
# Writing


def _artifact(
    client: RegistryClient,
    artifact_type: str,
    layers: list[tuple[str, bytes, dict[str, str]]],
    annotations: dict[str, str],
    subject: dict[str, Any] | None = None,
) -> tuple[bytes, str]:
    """Push the blobs of an artifact manifest (``layers``: media type, bytes, annotations); its bytes and digest."""
    referrers.push_blob(client, referrers.EMPTY)
    descriptors = []
    for media_type, body, notes in layers:
        referrers.push_blob(client, body)
        descriptors.append(referrers.descriptor(media_type, body, **({"annotations": notes} if notes else {})))
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": referrers.descriptor(referrers.EMPTY_TYPE, referrers.EMPTY),
        "layers": descriptors,
        "annotations": {referrers.CREATED: referrers.now(), **annotations},
    }
    if subject is not None:
        doc["subject"] = subject
    body = json.dumps(doc, indent=2, sort_keys=True).encode()
    return body, sha256_digest(body)


def record_plan(client: RegistryClient, date: str, plan: dict[str, Any]) -> tuple[dict[str, Any], str, bool]:
    """Record ``plan`` as the night's plan, unless the night has one: (the recorded plan, its manifest digest,
    whether this call recorded it)."""
    found = fetch_plan(client, date)
    if found is not None:
        return found[0], found[1], False
    body = (json.dumps(plan, indent=2, sort_keys=True) + "\n").encode()
    manifest, digest = _artifact(client, PLAN_TYPE, [(PLAN_TYPE, body, {})], {NIGHT: date})
    client.put_manifest(plan_tag(date), manifest, OCI_MANIFEST)
    return plan, digest, True


def fetch_plan(client: RegistryClient, date: str) -> tuple[dict[str, Any], str] | None:
    """The night's recorded plan (its JSON, not yet validated) and its manifest digest; None when none is."""
    got = client.get_manifest(plan_tag(date))
    if got is None:
        return None
    body = _only_layer(client, got, PLAN_TYPE, MAX_PLAN, f"the plan of night {date}")
    return safeio.parse_json(body, source=f"{client.repository}:{plan_tag(date)}", what="nightly plan", limit=MAX_PLAN), got.digest  # fmt: skip


def plan_subject(client: RegistryClient, digest: str) -> dict[str, Any]:
    return referrers.subject_of(client, digest)


def report_shard(
    client: RegistryClient, result: ShardResult, plan_subject: dict[str, Any], evidence: dict[str, bytes]
) -> str:
    """Write ``result`` (and each row's evidence bundle, by unit key) under the shard's tag of the night; the
    manifest's digest."""
    body = (json.dumps(result.data(), indent=2, sort_keys=True) + "\n").encode()
    layers: list[tuple[str, bytes, dict[str, str]]] = [(SHARD_TYPE, body, {})]
    layers += [(EVIDENCE_TYPE, data, {UNIT: unit}) for unit, data in sorted(evidence.items())]
    manifest, digest = _artifact(
        client, SHARD_TYPE, layers, {NIGHT: result.date, SHARD: result.shard}, subject=plan_subject
    )
    # Indexed by the tag alone: the referrers API may list it too (its subject is the plan), but nothing needs it.
    client.put_manifest(shard_tag(result.date, result.shard), manifest, OCI_MANIFEST)
    return digest


def attach_row(client: RegistryClient, digest: str, row: dict[str, Any], date: str, shard: str) -> str:
    """Attach ``row`` to the published image ``digest`` (in ``client``'s repository); the artifact's digest."""
    body = (json.dumps(row, indent=2, sort_keys=True) + "\n").encode()
    done = referrers.attach(client, ROW, body, referrers.subject_of(client, digest), {NIGHT: date, SHARD: shard})
    return done.digest


# --------------------------------------------------------------------------------------------------------------
# Reading


def _only_layer(client: RegistryClient, got: Manifest, media_type: str, limit: int, what: str) -> bytes:
    doc = got.json()
    if doc.get("artifactType") != media_type:
        raise MalformedAnswer(f"{what}: the manifest is a {str(doc.get('artifactType'))[:80]!r}, not {media_type}")
    layers = doc.get("layers")
    mine = [x for x in layers if isinstance(x, dict) and x.get("mediaType") == media_type] if isinstance(layers, list) else []  # fmt: skip
    if len(mine) != 1 or referrers.descriptor_problem(mine[0], limit):
        raise MalformedAnswer(f"{what}: no single {media_type} layer within {limit} bytes")
    return client.get_blob(mine[0]["digest"], max_bytes=limit, size=mine[0]["size"])


def fetch_shard(client: RegistryClient, date: str, shard: str) -> Reported | None:
    """A shard's result for the night (None: it never reported). Its evidence layers are listed, not read."""
    got = client.get_manifest(shard_tag(date, shard))
    if got is None:
        return None
    where = f"{client.repository}:{shard_tag(date, shard)}"
    body = _only_layer(client, got, SHARD_TYPE, MAX_RESULT, f"the result of shard {shard}")
    result = safeio.parse_model(ShardResult, body, source=where, what="shard result", limit=MAX_RESULT)
    if result.date != date or result.shard != shard:
        raise MalformedAnswer(f"{where} holds the result of night {result.date} shard {result.shard}; refused")
    doc = got.json()
    subject = doc.get("subject")
    plan = subject.get("digest") if isinstance(subject, dict) else None
    if plan != result.plan:
        raise MalformedAnswer(f"{where}: its subject ({str(plan)[:80]}) is not the plan it names ({result.plan})")
    evidence: dict[str, dict[str, Any]] = {}
    for layer in doc.get("layers") or []:
        if isinstance(layer, dict) and layer.get("mediaType") == EVIDENCE_TYPE:
            unit = (layer.get("annotations") or {}).get(UNIT) if isinstance(layer.get("annotations"), dict) else None
            if isinstance(unit, str) and not referrers.descriptor_problem(layer, MAX_EVIDENCE):
                evidence[unit] = layer
    return Reported(result, got.digest, str(plan), evidence)


def fetch_rows(client: RegistryClient, digest: str) -> list[dict[str, Any]]:
    """Every night row attached to the image ``digest`` (oldest first), each a JSON object."""
    out = []
    for fetched in referrers.fetch_all(client, digest, ROW):
        doc = safeio.parse_json(fetched.body, source=f"{client.repository}@{fetched.manifest_digest}", what="night row", limit=MAX_ROW)  # fmt: skip
        if isinstance(doc, dict):
            out.append(doc)
    return out


# --------------------------------------------------------------------------------------------------------------
# Evidence bundles


def pack_evidence(directory: Path) -> tuple[bytes, list[str]]:
    """The regular files under ``directory`` as a gzip tar (sorted, no owners or times: the same files give the same
    bytes), and the names left out: links, special files, and files over :data:`MAX_EVIDENCE_FILE` or past
    :data:`MAX_UNPACKED` in all."""
    buf = io.BytesIO()
    left_out: list[str] = []
    total = 0
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # fmt: skip
        for path in sorted(p for p in directory.rglob("*")):
            rel = path.relative_to(directory).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                left_out.append(rel)
                continue
            if path.is_dir():
                continue
            size = path.stat().st_size
            if size > MAX_EVIDENCE_FILE or total + size > MAX_UNPACKED or len(tar.getmembers()) >= MAX_EVIDENCE_FILES:
                left_out.append(rel)
                continue
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = size, 0o644, 0
            with path.open("rb") as fh:
                tar.addfile(info, fh)
            total += size
    return buf.getvalue(), left_out


class _Bounded(io.RawIOBase):
    """A reader of ``inner`` that raises once more than ``limit`` bytes came out of it (a gzip bomb stops there)."""

    def __init__(self, inner: Any, limit: int):
        self.inner, self.limit, self.seen = inner, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.inner.read(len(b))
        self.seen += len(data)
        if self.seen > self.limit:
            raise MalformedAnswer(f"the evidence bundle unpacks to more than {self.limit} bytes")
        b[: len(data)] = data
        return len(data)


def unpack_evidence(data: bytes, dest: Path, source: str) -> list[str]:
    """The evidence bundle ``data`` written under ``dest`` (made), file by file: every member a regular file under a
    relative name (:func:`safeio.relative_name`), each within :data:`MAX_EVIDENCE_FILE`, all within
    :data:`MAX_UNPACKED`; anything else refuses the bundle (a :class:`UserError` naming ``source``) before ``dest``
    holds a file of it. The names written."""
    if len(data) > MAX_EVIDENCE:
        raise safeio.Malformed(f"evidence bundle of {len(data)} bytes, over {MAX_EVIDENCE}", file=source)
    files: list[tuple[str, bytes]] = []
    try:
        stream = _Bounded(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"), MAX_UNPACKED + (1 << 20))
        with tarfile.open(fileobj=io.BufferedReader(stream), mode="r|") as tar:
            for member in tar:
                if member.isdir():
                    continue
                if not member.isreg():
                    raise safeio.Malformed(f"evidence bundle member {printable(member.name)!s} is not a regular file", file=source)  # fmt: skip
                name = str(safeio.relative_name(member.name, what="evidence bundle member", source=source))
                if member.size > MAX_EVIDENCE_FILE or len(files) >= MAX_EVIDENCE_FILES:
                    raise safeio.Malformed(f"evidence bundle member {name} is over the bounds", file=source)
                fh = tar.extractfile(member)
                body = fh.read(MAX_EVIDENCE_FILE + 1) if fh is not None else b""
                files.append((name, body))
    except (tarfile.TarError, OSError, EOFError, MalformedAnswer) as exc:
        raise safeio.Malformed(f"evidence bundle cannot be read: {printable(str(exc))}", file=source) from None
    if sum(len(b) for _, b in files) > MAX_UNPACKED:
        raise safeio.Malformed(f"evidence bundle unpacks to more than {MAX_UNPACKED} bytes", file=source)
    dest.mkdir(parents=True, exist_ok=True)
    for name, body in files:
        safeio.write_confined(dest, name, body, what="evidence file", source=source)
    return [n for n, _ in files]


def fetch_evidence(client: RegistryClient, layer: dict[str, Any]) -> bytes:
    return client.get_blob(layer["digest"], max_bytes=MAX_EVIDENCE, size=layer["size"])


def registry_error(exc: RegistryError | UserError, what: str) -> str:
    """One line saying why ``what`` could not be read or written."""
    text = exc.message if isinstance(exc, UserError) else str(exc)
    return f"{what}: {printable(text)[:400]}"


__all__ = [
    "EVIDENCE_TYPE",
    "NIGHT_REPOSITORY",
    "PLAN_TYPE",
    "ROW_TYPE",
    "SHARD_TYPE",
    "NightRow",
    "Reported",
    "Row",
    "ShardResult",
    "attach_row",
    "fetch_evidence",
    "fetch_plan",
    "fetch_rows",
    "fetch_shard",
    "night_repository",
    "pack_evidence",
    "plan_tag",
    "record_plan",
    "report_shard",
    "shard_tag",
    "unpack_evidence",
]
