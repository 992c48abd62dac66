"""The publish record's schema (``stackforge.publish-record/v1``), as pydantic models: the project's published
contract, attached to every published image (:mod:`stackforge.publish.record`) and read back by ``stackforge
verify REF`` and ``pull``.

Writing builds a :class:`PublishRecord` and serializes it with :meth:`PublishRecord.data` (the keys a record
holds, in the order they were set); reading validates with :func:`problems` (one line per bad key, worded as
``verify`` prints it) or :func:`parse` (a :class:`UserError` naming the keys). Types are strict (JSON as it is,
nothing coerced); keys the model does not know are kept, so a record a newer writer extended still reads.
``stackforge schema --record`` prints :func:`json_schema`; ``docs/record-schema.json`` holds it, written by
``stackforge schema --record --docs`` (``--check``: exit 1 when it is stale).
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, ValidationError, field_validator

from stackforge.errors import UserError, printable
from stackforge.grammar import TAG_RE
from stackforge.stack.names import STACK_FILE
from stackforge.stack.reference import DocsResult

SCHEMA = "stackforge.publish-record/v1"
#: the checked-in JSON Schema of the record, relative to the repository root
SCHEMA_FILE = "docs/record-schema.json"

Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
#: a stack file's name: a plain file name of stacks/ (``verify --rebuild`` writes the file under it)
StackFile = Annotated[str, StringConstraints(pattern=rf"^{STACK_FILE.pattern}$")]
#: an OCI tag (``pull`` tags the image with it, ``verify`` reads it back)
Tag = Annotated[str, StringConstraints(pattern=TAG_RE.pattern)]


class Part(BaseModel):
    """A part of the record: strict JSON types; unknown keys kept (a newer writer's)."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)

    def data(self) -> dict[str, Any]:
        """The keys as JSON data: every key that was set (or read), in that order."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class FileEntry(Part):
    """A file the record carries: its hash and its text."""

    sha256: str = Field(description="the file's sha256 digest, `sha256:<hex>`")
    text: str | None = Field(None, description="the file's text")


class GateResults(Part):
    """The gate's results in the build's evidence, one line per list item."""

    gate: list[str] = Field(default_factory=list, description="`gate.txt` of the build's evidence")
    abi: list[str] = Field(default_factory=list, description="`abi.txt` (the ABI checks)")
    readonly: list[str] = Field(default_factory=list, description="`gate-readonly.txt` (the read-only root re-run)")


class SmokeRow(Part):
    """One smoke check of a recipe."""

    name: JsonValue = Field(None, description="the check's name, as `smoke.json` holds it")
    status: JsonValue = Field(None, description="the check's status, as `smoke.json` holds it")


class SmokeResult(Part):
    """One recipe's smoke verdict and rows, from `smoke/<recipe>/smoke.json` of the build's evidence."""

    verdict: JsonValue = Field(None, description="the recipe's smoke verdict")
    rows: list[SmokeRow] = Field(default_factory=list, description="each check of the recipe: name and status")


class SliceResult(Part):
    """One test slice's verdict and counts, from `tests/<slice>/result.json` of the build's evidence."""

    verdict: JsonValue = Field(None, description="the slice's verdict: passed, failed or not-run")
    counts: dict[str, JsonValue] = Field(
        default_factory=dict, description="the count of each pytest outcome the run reported"
    )
    expected: dict[str, JsonValue] = Field(default_factory=dict, description="the counts the slice declares")


class ScanWaived(Part):
    """A finding the scan waived, with the waiver's reason."""

    id: str = Field(description="the advisory's id")
    package: str = Field(description="the package it affects")
    version: str | None = Field(None, description="the version the image holds")
    severity: str | None = Field(None, description="the advisory's severity")
    reason: str = Field(description="why it is waived (the waiver's reason)")
    expires: str = Field(description="the day the waiver ends (ISO date): after it the finding blocks again")
    waiver: str | None = Field(None, description="where the waiver is written: file:line")


class ScanPart(Part):
    """The vulnerability gate's verdict at publish (`publish --osv`, the nightly's scan)."""

    verdict: Literal["clear", "waived", "blocked"] = Field(
        description="clear: nothing at or above the threshold; waived: only waived findings; blocked: a finding "
        "blocks (the publish moved no alias)"
    )
    fail_on: str = Field(description="the severity threshold the verdict was taken at")
    blocked: list[str] = Field(default_factory=list, description="the ids of the findings that block")
    waived: list[ScanWaived] = Field(default_factory=list, description="the findings waived, each with its reason")
    findings: int = Field(0, description="how many findings the scan made, below the threshold included")
    database: dict[str, JsonValue] = Field(
        default_factory=dict, description="each ecosystem's OSV snapshot: when it was fetched, its age"
    )


class OverlayPart(Part):
    """What an overlay image's record adds: the overlay (see `stackforge.overlay.record`)."""

    name: str = Field(description="the overlay's name (label `org.stackforge.overlay`)")
    fingerprint: str = Field(description="the overlay declaration's fingerprint (label `….overlay.fingerprint`)")
    definition: FileEntry = Field(description="`overlay.yaml` as built: its sha256 and text")
    base: dict[str, JsonValue] = Field(
        description="the base: the gated build's inputs (reference, image id, registry digest or stack and target)"
        " or the base labels (`identity`, `image_id`, `ref`)"
    )
    ranges: dict[str, str] = Field(description="each upstream's range hash (labels `….overlay.range.<upstream>`)")
    changed: dict[str, str] = Field(
        description="each upstream's changed-files digest (labels `….overlay.changed.<upstream>`)"
    )
    files: str = Field(description="the digest of the overlay's files (label `….overlay.files`)")


class PublishRecord(Part):
    """The record of one publish (schema `stackforge.publish-record/v1`)."""

    schema_: Literal["stackforge.publish-record/v1"] = Field(alias="schema", description="the record's schema")
    stack: str = Field(description="the stack published (empty for an overlay whose base carries no stack)")
    target: str = Field(description="the target published")
    repository: str = Field(description="the registry repository, `host/path`")
    digest: Digest = Field(description="the image manifest's digest, the artifact's subject")
    image_id: str = Field(description="the image id (its config digest): what a pull gives")
    gated_image_id: str | None = Field(
        default=None,
        description="the id of the local image the gate ran in, when the publish normalized its layers and config "
        "(file times clamped to the layer epoch, entries sorted): the same files under another id",
    )
    tags: list[Tag] = Field(description="the immutable tag, then every alias the publish moved")
    stack_files: dict[StackFile, FileEntry] = Field(
        description="the stack files embedded in the image (not the overrides), by their plain file names in stacks/"
    )
    overrides: list[JsonValue] = Field(description="the `--set` values the image was built with")
    pins: dict[str, str] = Field(description="each package's pinned version")
    options: dict[str, JsonValue] = Field(description="each build option's value")
    fingerprint: str = Field(description="the stack's fingerprint (label `org.stackforge.fingerprint`)")
    inputs_fingerprint: str | None = Field(
        None, description="the inputs fingerprint (label `org.stackforge.inputs`); null when the image has none"
    )
    labels: dict[str, str] = Field(description="the image's labels")
    gate: GateResults = Field(description="the gate's results")
    smoke: dict[str, SmokeResult] = Field(description="each recipe's smoke results, by recipe")
    tests: dict[str, SliceResult] = Field(
        default_factory=dict, description="each test slice's verdict and counts, by slice (`stackforge test`)"
    )
    build_id: str | None = Field(None, description="the build id of the evidence the record was made from")
    image_store: Literal["classic", "containerd"] | None = Field(
        None,
        description="the engine's image store the image was built in: `classic` (dockerd's graph driver) or "
        "`containerd` (the containerd image store). The two write different layers for one build (the classic "
        "store keeps entries of directories whose only change is their time, and whiteouts the other does not "
        "write), so `verify --rebuild` compares like with like on a host of the same store",
    )
    scan: ScanPart | None = Field(None, description="the vulnerability gate's verdict; absent when none ran")
    overlay: OverlayPart | None = Field(None, description="an overlay image's overlay; absent for a stack image")

    @field_validator("overlay", mode="before")
    @classmethod
    def _overlay_object(cls, value: Any) -> Any:
        if value is None:  # absent is a stack image's record; a null overlay is neither
            raise ValueError("not an object")
        return value


#: how a key whose items are wrong is said (the keys ``verify`` reads item by item)
ITEMS = {
    "tags": "not a list of tags",
    "pins": "not an object of strings",
    "labels": "not an object of strings",
    "stack_files": "an entry without a sha256",
    "ranges": "not an object of strings",
    "changed": "not an object of strings",
}


def _kind(model: type[BaseModel], key: str) -> str:
    """The JSON type of ``key`` of ``model`` as ``verify`` names it: str, list or dict."""
    info = model.model_fields.get(key) or next(f for f in model.model_fields.values() if f.alias == key)
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(annotation) or annotation
    return "list" if origin is list else "str" if origin in (str, Literal) else "dict"


def _problem(error: Any) -> str:
    """One line for one pydantic error: the key (``overlay.<key>`` inside the overlay) and what is wrong."""
    loc = [str(p) for p in error["loc"]]
    key, inner = loc[0], loc[1:]
    if key == "schema" and not inner:
        return f"schema is {error.get('input') if error['type'] != 'missing' else None!r}, not {SCHEMA!r}"
    if key == "overlay" and not inner:
        return "overlay: not an object"
    model: type[BaseModel] = PublishRecord
    if key == "overlay":
        model, key, inner = OverlayPart, f"overlay.{inner[0]}", inner[1:]
    name = key.rpartition(".")[2]
    if inner and inner[-1] == "[key]":
        return f"{key}: the name {printable(repr(inner[0]))[:120]} is not a plain file name of stacks/"
    if not inner:
        if error["type"] == "string_pattern_mismatch":
            return f"{key}: not a sha256 digest"
        return f"{key}: missing or not a {_kind(model, name)}"
    return f"{key}: {ITEMS.get(name) or 'at ' + '.'.join(inner) + ': ' + error['msg']}"


def problems(data: Any) -> list[str]:
    """What is wrong with ``data`` as a record of this schema, one line per key (empty when nothing is)."""
    if not isinstance(data, dict):
        return ["the record is not a JSON object"]
    try:
        PublishRecord.model_validate(data)
    except ValidationError as exc:
        return list(dict.fromkeys(_problem(e) for e in exc.errors()))
    return []


def parse(data: Any, source: str = "the publish record") -> PublishRecord:
    """``data`` as a record; a :class:`UserError` naming every bad key when it is not one."""
    found = problems(data)
    if found:
        raise UserError(
            f"{source} is not a {SCHEMA} record: " + "; ".join(found),
            fix="re-publish the image with this stackforge (its record is written by `stackforge publish`)",
        )
    return PublishRecord.model_validate(data)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the record."""
    schema = PublishRecord.model_json_schema(by_alias=True)
    overlay = schema["properties"]["overlay"]  # absent or an object, never null
    overlay.pop("default", None)
    overlay["$ref"] = next(o["$ref"] for o in overlay.pop("anyOf") if "$ref" in o)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "stackforge publish record"
    return schema


def schema_text() -> str:
    """:func:`json_schema` as ``docs/record-schema.json`` holds it."""
    return json.dumps(json_schema(), indent=2) + "\n"


def generate(root: Path, *, check: bool = False) -> DocsResult:
    """Write (or, with ``check``, compare) ``docs/record-schema.json`` under ``root``."""
    path = Path(root) / SCHEMA_FILE
    text = schema_text()
    stale = (path.read_text(encoding="utf-8") if path.is_file() else None) != text
    if stale and not check:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return DocsResult(SCHEMA_FILE, stale)
