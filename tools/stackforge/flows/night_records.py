"""The documents a night leaves, as typed models: what ``stackforge history`` reads back from a night's directory.

A night's directory holds ``summary.json`` (written by :mod:`stackforge.flows.nightly`, :meth:`Summary.to_json`)
and, per row, a copy of the build's evidence (``<stack>-<target>/``): ``inventory.json`` (the in-image inventory,
images/gate/inventory.py), ``publish.json`` (the publisher's record, ``PublishResult.evidence()`` with the stack's
fields first), ``inputs.json`` (the build's inputs and labels, builder/run/run.py), ``provenance.json`` (the signed
DSSE envelope, publish/attest.py) and ``sbom.cdx.json`` (builder/records/sbom.py). Each is read through
:mod:`stackforge.safeio` within its bound and validated here: types are strict (JSON as it is, nothing coerced), a
wrong type is one error naming the file and the field, and keys a model does not name are kept, so a document a
newer writer extended still reads. The models name every key the history uses; those it does not use are typed
loosely so that every summary the nightly writes validates.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints

from stackforge.publish.night import NightRow

Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
Date = Annotated[str, StringConstraints(pattern=r"^[0-9]{8}$")]


class Doc(BaseModel):
    """A document from outside: strict JSON types; unknown keys kept."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


# ---------------------------------------------------------------------------------------------------------------
# summary.json


class CiRun(Doc):
    """Where the night ran, from the CI's own environment (``nightly.ci_run``): absent outside CI."""

    provider: str | None = None
    run_url: str | None = Field(None, description="the CI run (GitHub) or job (GitLab): its log and artifacts")
    commit: str | None = Field(None, description="the commit of the repository the night ran from")
    commit_url: str | None = None


#: One stack, target and platform of a night: :class:`stackforge.flows.nightly.Row` as ``summary.json`` has it — the
#: model a shard's report is read with too (``publish/night.py``)
SummaryRow = NightRow


class NightSummary(Doc):
    """A night's ``summary.json``: :meth:`stackforge.flows.nightly.Summary.to_json`."""

    date: Date
    registry: str
    ok: bool | None = None
    verdict: str | None = None
    counts: dict[str, dict[str, int]] = Field(default_factory=dict)
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = Field(0.0, ge=0)
    overrides: list[str] = Field(default_factory=list)
    bake: dict[str, JsonValue] = Field(default_factory=dict)
    rows: list[SummaryRow]
    freshness: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    drift: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    ci: CiRun | None = None
    #: a sharded night's: each shard of its plan (``status`` reported, missing, unreadable or stale; ``labels``,
    #: ``rows``, ``duration_s``, ``reason``…) and the merge's own ``duration_s``
    shards: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    merge: dict[str, JsonValue] = Field(default_factory=dict)
    #: per stack, each platform line the night left out: declared, not buildable (values no record states)
    not_buildable: dict[str, list[str]] = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# The evidence of a row


class Dist(Doc):
    """One installed Python distribution of ``inventory.json``."""

    name: Annotated[str, StringConstraints(min_length=1)]
    version: str
    index: str | None = None
    phase: str | None = None
    url: str | None = None
    sha256: str | None = None


class Inventory(Doc):
    """``inventory.json``: what the image has installed (images/gate/inventory.py)."""

    dists: list[Dist] = Field(default_factory=list)
    phases: list[JsonValue] = Field(default_factory=list)


class Waiver(Doc):
    """A finding a waiver let pass (``ScanReport.summary()``'s ``waived``): the finding and the waiver's reason."""

    id: str
    reason: str | None = None
    package: str | None = None
    version: str | None = None
    expires: str | None = None
    waiver: str | None = Field(None, description="the waivers file and entry that let it pass")


class Scan(Doc):
    """The vulnerability scan of a publish: a row's ``scan`` (``ScanReport.summary()``: ``findings`` a count,
    ``database`` the snapshots per ecosystem) or ``publish.json``'s (``publish/stack.py`` ``scan_record``:
    ``findings`` their lines, ``database`` the directory). ``blocked`` (or ``blocking``, as older records name them)
    holds the IDs that kept the aliases back; ``waived`` the findings a waiver let pass, each with its reason."""

    verdict: str | None = None
    fail_on: str | None = None
    blocked: list[str] = Field(default_factory=list)
    blocking: list[str] = Field(default_factory=list)
    waived: list[Waiver] = Field(default_factory=list)
    findings: int | list[str | dict[str, JsonValue]] = Field(default_factory=list)
    database: str | dict[str, JsonValue] | None = None
    records: int | None = None
    reason: str | None = None


class PublishRecord(Doc):
    """``publish.json`` of a row's evidence: the publisher's record of what it pushed."""

    status: str
    repository: str | None = None
    tag: str | None = None
    reference: str | None = None
    digest: Digest | None = None
    size: int | None = None
    aliases: dict[str, str] = Field(default_factory=dict)
    stack: str | None = None
    target: str | None = None
    #: the image's platform (``publish --platform all``, a stack of platform lines: each line's image has its record)
    platform: str | None = None
    #: the index the tag holds, over every platform's image (``{digest, reference}``); absent for one image
    index: JsonValue = None
    #: read apart with :class:`Scan` (a scan the history cannot read does not make the record unreadable)
    scan: JsonValue = None


class Inputs(Doc):
    """``inputs.json`` of a row's evidence: the build's inputs; the history reads its labels."""

    labels: dict[str, str] = Field(default_factory=dict)


class Signature(Doc):
    keyid: str | None = None
    sig: str


class Envelope(Doc):
    """``provenance.json``: the DSSE envelope of the signed provenance."""

    payloadType: str
    payload: str
    signatures: list[Signature] = Field(min_length=1)


class Subject(Doc):
    name: str = ""
    digest: dict[str, str]


class Statement(Doc):
    """The in-toto statement an envelope carries."""

    type_: str = Field(alias="_type")
    predicateType: str
    subject: list[Subject] = Field(min_length=1)


class Sbom(Doc):
    """``sbom.cdx.json``: a CycloneDX document (the history links it; it checks only that it is one)."""

    bomFormat: Literal["CycloneDX"]
    specVersion: str
    components: list[dict[str, JsonValue]] = Field(default_factory=list)
