"""The stack schema: what a stack file may say, as pydantic models.

Every model forbids unknown keys; the loader (``stack.py``) turns unknown keys
into "did you mean" errors before pydantic sees them, and turns pydantic's
type errors into errors that name the file, line and column.
"""

import functools
import re
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from stackforge import grammar
from stackforge.grammar import ENV_NAME_RE as ENV_NAME
from stackforge.urls import redact

if TYPE_CHECKING:
    from packaging.requirements import Requirement as PackagingRequirement

HEX40 = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PROJECT_NAME = grammar.PROJECT_RE
PYTHON_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")
TOOLKIT_VERSION = re.compile(r"^[0-9][0-9A-Za-z._+-]{0,63}$")
REQUIREMENT_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9 ._+-]{0,62}[A-Za-z0-9+])?$")


class _grammar:
    """A pydantic validator from a ``grammar.check_*`` function (``None`` = valid, else the reason), run after
    the type's own validation. It says it takes no validation info, so pydantic need not inspect its signature
    at every field that uses it (which is most of the cost of building the schema)."""

    def __init__(self, check: Callable[[str], str | None]) -> None:
        self.check = check

    def validate(self, value: str) -> str:
        reason = self.check(value)
        if reason:
            raise ValueError(reason)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.validate, handler(source))


def _project(name: str) -> str | None:
    return None if PROJECT_NAME.match(name) else f"{name!r} is not a valid project name"


def _python_version(text: str) -> str | None:
    return None if PYTHON_VERSION.match(text) else f'{text!r} is not a Python version such as "3.11"'


def _toolkit_version(text: str) -> str | None:
    return None if TOOLKIT_VERSION.match(text) else f"{text!r} is not a toolkit version such as 5.2.0"


def _requirement_name(text: str) -> str | None:
    return None if REQUIREMENT_NAME.match(text) else f"{text!r} is not a name such as 'MUSA Toolkit'"


def _sha256(text: str) -> str | None:
    return None if SHA256.match(text) else "sha256 must be 64 lowercase hex digits"


# Values that name something: each type carries its grammar (see grammar.py).
Name = Annotated[str, _grammar(grammar.check_name)]
EnvName = Annotated[str, _grammar(grammar.check_env_name)]
Module = Annotated[str, _grammar(grammar.check_module)]
LabelKey = Annotated[str, _grammar(grammar.check_label_key)]
ProjectName = Annotated[str, _grammar(_project)]
Sha256 = Annotated[str, _grammar(_sha256)]


def _unprintable(value: Any, multiline: bool) -> str | None:
    """The reason a raw field value holds a control character: the string, a list item, a mapping key or value.

    Nested mappings inside lists and mappings are models with their own check. A string ``str.isprintable``
    accepts holds none of the characters ``grammar.check_text`` refuses (control characters and line separators
    are not printable): only the others are searched."""
    if isinstance(value, str):
        return None if value.isprintable() else grammar.check_text(value, multiline)
    if isinstance(value, list):
        for i, item in enumerate(value):
            reason = isinstance(item, str) and not item.isprintable() and grammar.check_text(item, multiline)
            if reason:
                return f"item {i} {reason}"
    if isinstance(value, dict):
        for key, item in value.items():
            reason = isinstance(key, str) and not key.isprintable() and grammar.check_text(key)
            if reason:
                return f"key {key!r} {reason}"
            reason = isinstance(item, str) and not item.isprintable() and grammar.check_text(item, multiline)
            if reason:
                return f"the value of {key!r} {reason}"
    return None


def _is_model(annotation: Any) -> bool:
    """Whether a field holds a model (or an optional one)."""
    options = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    return any(isinstance(a, type) and issubclass(a, BaseModel) for a in options)


@functools.cache
def _checked_keys(model: type[BaseModel]) -> dict[str, bool]:
    """The input keys (each field's name and alias) whose raw value ``Strict`` checks for control characters,
    each with whether it may hold \\n and \\t; a field holding a model is left to that model."""
    multiline: frozenset[str] = getattr(model, "multiline_fields", frozenset())
    keys: dict[str, bool] = {}
    for name, info in model.model_fields.items():
        if not _is_model(info.annotation):
            keys[name] = name in multiline
            if info.alias:
                keys[info.alias] = name in multiline
    return keys


class Strict(BaseModel):
    """Unknown keys are refused; no string holds a control character (``multiline_fields`` may hold \\n, \\t)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)
    multiline_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _printable(cls, data: Any) -> Any:
        """Every raw field value of the mapping, checked once per model before its fields validate; each finding
        is located at its field, as a field's own error would be. (One check per model rather than a validator
        on every field: pydantic inspects a field validator at each field while it builds the schema.)"""
        if not isinstance(data, dict):
            return data
        keys = _checked_keys(cls)
        errors = []
        for key, value in data.items():
            multiline = keys.get(key) if isinstance(key, str) else None
            reason = None if multiline is None else _unprintable(value, multiline)
            if reason:
                error = PydanticCustomError("value_error", "Value error, {reason}", {"reason": reason})
                errors.append(InitErrorDetails(type=error, loc=(key,), input=value))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data


def _exact_version(value: object) -> str:
    """A pin is one exact PEP 440 version, written bare."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f'version {value!r} was read as a number; quote it so no digit is lost, e.g. "{value}"')
    if not isinstance(value, str):
        raise ValueError('a version must be a string such as "2.11.0"')
    text = value.strip()
    if text.startswith("=="):
        raise ValueError(f"write the bare version '{text[2:].strip()}', not '{text}': every pin is exact")
    if any(op in text for op in ("<", ">", "~=", "!=", "*", ",", "^")) or text.startswith("="):
        raise ValueError(f"'{text}' is a range; stacks pin one exact version (e.g. 2.11.0)")
    try:
        Version(text)
    except InvalidVersion:
        raise ValueError(f"'{text}' is not a valid PEP 440 version") from None
    return text


class Platform(Strict):
    os: Name = Field(description="base OS label used in tags, e.g. ubuntu22.04")
    python: Annotated[str, _grammar(_python_version)] = Field(description='Python version, quoted: "3.10"')
    arch: Literal["x86_64", "aarch64"] = Field(
        "x86_64",
        description="CPU architecture of the image: wheel tags and the platform `stackforge lock` resolves for",
    )
    musa: Annotated[str, _grammar(_toolkit_version)] | None = Field(
        default=None, description="MUSA toolkit version, e.g. 5.2.0"
    )
    musa_runtime: Annotated[str, _grammar(_toolkit_version)] | None = Field(
        None, description='MUSA runtime apt series, e.g. "5.2"'
    )
    gpu_arch: list[Name] = Field(default=[], description="GPU architectures to compile for, e.g. [mp_31]")

    @field_validator("python", "musa_runtime", "musa", mode="before")
    @classmethod
    def _quoted(cls, value):
        if isinstance(value, float):
            raise ValueError(f'{value!r} was read as a number; quote it, e.g. "{value}"')
        return value


#: The OCI platform of each CPU architecture a stack may name (``platform.arch``): what the image index lists.
OCI_PLATFORMS: dict[str, str] = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
#: The Debian/Ubuntu multiarch triplet of each architecture: its library directory is /usr/lib/<triplet>.
TRIPLETS: dict[str, str] = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
#: The stack keys a platform line may change (``platforms.<line>.with``): what differs between the CPU lines of
#: one train. The name, upstreams, targets, tags and indexes are the stack's, shared by every platform.
LINE_KEYS = ("platform", "base", "packages", "system", "gate", "rules")
#: A local-version label as a line names it, e.g. musa5.2.1mp22 (PEP 440's local segment).
LOCAL_LABEL = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")


def _local_label(text: str) -> str | None:
    ok = len(text) <= 64 and LOCAL_LABEL.match(text)
    return None if ok else f"{text!r} is not a local-version label such as musa5.2.1mp22 (no leading '+')"


class PlatformLine(Strict):
    """One CPU platform of the stack: the stack as written, with what differs on this platform merged over it."""

    arch: Literal["x86_64", "aarch64"] = Field(
        description="the line's CPU architecture (x86_64 is linux/amd64, aarch64 linux/arm64): its platform.arch"
    )
    local: Annotated[str, _grammar(_local_label)] | None = Field(
        None,
        description="the line's local-version label, e.g. musa5.2.1mp22: every pin carrying a MUSA build label "
        "(+musaX.Y.Z, optionally a GPU suffix such as mp22) must carry this one; a pin of another line is a finding",
    )
    with_: dict[str, Any] = Field(
        default={},
        alias="with",
        description="what differs on this platform, in the stack's own keys (platform, base, packages, system, "
        "gate, rules): merged over the resolved stack as a child stack's keys are (a list replaces, a mapping "
        "merges, null removes the key); the stack's own line (its platform.arch) has none",
    )
    unknown: dict[Annotated[str, _grammar(lambda t: _stack_ref(t))], str] = Field(
        default={},
        description="{stack key: why}: values of this line no record states (e.g. packages.deep_ep: no aarch64 "
        "build is named). lint leaves findings at these keys out and names them; render and build refuse the line",
    )
    builder: Name | None = Field(
        None,
        description="the buildx builder (`docker buildx create --name …`) that builds this platform, e.g. a native "
        "node; default: the engine's own builder (emulated when the host's architecture differs)",
    )

    @field_validator("unknown")
    @classmethod
    def _reasons(cls, value: dict) -> dict:
        for key, why in value.items():
            if not isinstance(why, str) or not why.strip():
                raise ValueError(f"unknown.{key}: say why the value is not known (a non-empty string)")
        return value

    @property
    def oci(self) -> str:
        """The OCI platform, e.g. linux/arm64."""
        return OCI_PLATFORMS[self.arch]


class Installer(Strict):
    version: str = Field(description="the exact pip release")
    sha256: list[Sha256] = Field(default=[], description="allowed wheel hashes; enables --require-hashes")

    _v = field_validator("version", mode="before")(classmethod(lambda cls, v: _exact_version(v)))

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, value: Any) -> Any:
        return {"version": value} if isinstance(value, (str, int, float)) else value


class Base(Strict):
    image: Annotated[str, _grammar(grammar.check_image_ref)] = Field(
        description="base image reference; the stand-in for tests is set with --set base.image=…"
    )
    python: Annotated[str, _grammar(grammar.check_python)] = Field(
        "python3", description="interpreter inside the base image"
    )
    digest: Annotated[str, _grammar(grammar.check_digest)] | None = Field(
        None,
        description="sha256 digest the base image must have: a registry digest (recorded as the image's "
        "org.opencontainers.image.base.digest) or its config digest",
    )
    pip: Installer | None = Field(
        None,
        description='the pip every pip phase runs with ("26.3", or {version, sha256}): installed first, into the '
        "virtual environment, from the public index with --no-deps; the gate checks it. Unset, the phases run "
        "with whatever pip the base's venv carries",
    )


class Index(Strict):
    url: str = Field(description="PEP 503/691 simple index URL")
    role: Literal["vendor", "public"] = Field(
        description="vendor: exact wheels installed with --no-deps; public: an ordinary resolution of exact pins"
    )
    deps_from: Name | None = Field(
        default=None, description="vendor indexes: the index their wheels' own dependencies come from"
    )
    private: bool = Field(default=False, description="credentials may be needed; they arrive only as a BuildKit secret")
    lock: bool = Field(
        default=False,
        description="this index installs from stacks/locks/<stack>/<index>.txt (written by "
        "`stackforge lock`; a vendor index with deps_from also needs <index>.deps.txt, the lock of its "
        "wheels' own dependencies); lint and build fail when that file is missing",
    )
    unlocked: Annotated[str, AfterValidator(lambda v: _one_line(v) or v)] | None = Field(
        default=None,
        min_length=1,
        max_length=400,
        description="why this index's phases install without a lock (e.g. its requirement files or its vendor "
        "wheels' metadata cannot be reached where locks are made): `stackforge lint`, render and build print it; "
        "`stackforge lock --check` fails a stack whose public index has pins or requirement files but neither a "
        "lock nor this reason",
    )

    @model_validator(mode="after")
    def _lock_or_reason(self) -> "Index":
        if self.lock and self.unlocked is not None:
            raise ValueError("lock: true and unlocked: say the opposite; keep one")
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        reason = grammar.check_url(value, redact(value))
        if reason:
            raise ValueError(reason)
        return value.rstrip("/")


class Sdist(Strict):
    index: Name = Field(description="name of the index that serves the sdist")
    name: ProjectName = Field(description="the project name on the index, e.g. markupsafe")
    version: str = Field(description="the exact release version of the sdist")
    sha256: str = Field(description="sha256 of the sdist file; the download is checked against it")

    _v = field_validator("version", mode="before")(classmethod(lambda cls, v: _exact_version(v)))

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str) -> str:
        if not SHA256.match(value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value


class PatchesFrom(Strict):
    upstream: Name = Field(description="the upstream whose exported tree carries the series")
    path: Annotated[str, _grammar(grammar.check_relative_path)] = Field(
        description="the series directory inside that tree (a `series` file and its patches), e.g. patches/vllm"
    )
    order: Literal["series", "name"] = Field(
        "series",
        description="series: the directory's `series` file lists the patches in order; name: every *.patch of "
        "the directory, in file-name order (a carrier that keeps no series file, e.g. vllm-musa's "
        "vllm_musa/patches/series)",
    )


class SourceEdit(Strict):
    """An in-place fix of one file of the exported tree: ``old`` must occur exactly once and becomes ``new``."""

    multiline_fields: ClassVar[frozenset[str]] = frozenset({"old", "new"})

    path: Annotated[str, _grammar(grammar.check_relative_path)] = Field(description="file inside the tree")
    old: str = Field(min_length=1, description="the exact text to replace; it must occur exactly once")
    new: str = Field(description="the replacement")


def _stack_ref(text: str) -> str | None:
    """A dotted key of the resolved stack whose value is compared, e.g. upstreams.vllm.tag."""
    ok = re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_.+-]*)+", text)
    return None if ok else f"{text!r} is not a stack key such as upstreams.vllm.tag"


def _reason(value: object) -> object:
    if value is None:
        return None  # a child stack's null takes its parent's override away
    if not isinstance(value, str) or not value.strip():
        raise ValueError("an except needs its reason: a non-empty string saying why the stack differs")
    return value.strip()


class Agree(Strict):
    """What of an upstream's own files the stack must agree with (checked by render, build and lint)."""

    multiline_fields: ClassVar[frozenset[str]] = frozenset({"except_"})

    requirements: list[Annotated[str, _grammar(grammar.check_relative_path)]] = Field(
        default=[],
        description="requirement files of the upstream (-r/-c inside its tree followed): every line naming a pin "
        "of the stack must agree with it (==V is Version equality: 0.2.7 is not 0.2.7+musa; any other specifier "
        "must be met)",
    )
    keys: dict[
        Annotated[str, _grammar(grammar.check_relative_path)],
        dict[EnvName, Annotated[str, _grammar(_stack_ref)]],
    ] = Field(
        default={},
        description="KEY=VALUE files of the upstream, read by regex, and the stack key each KEY must equal, e.g. "
        "{third_party/PINS: {VLLM_TAG: upstreams.vllm.tag, VLLM_COMMIT: upstreams.vllm.commit}}",
    )
    args: dict[
        Annotated[str, _grammar(grammar.check_relative_path)],
        dict[EnvName, ProjectName],
    ] = Field(
        default={},
        description="Dockerfiles of the upstream and, for each build argument, the project it pins: every `ARG "
        "NAME=VALUE` line of every stage is compared as the requirement NAME's project ==VALUE, with the stack's "
        "pin of it (a package, or a target's exact requirement), e.g. {docker/musa.Dockerfile: {MOONCAKE_VERSION: "
        "mooncake-transfer-engine-musa}}",
    )
    except_: dict[ProjectName, Annotated[str | None, BeforeValidator(_reason)]] = Field(
        default={},
        alias="except",
        description="{package (or a target's pinned project): why the stack differs from the upstream's line}: the "
        "only way past a "
        "disagreement; an except for a package the files agree on (or do not name) is itself a finding; a child "
        "stack's null removes its parent's",
    )

    @field_validator("except_")
    @classmethod
    def _drop_nulls(cls, value: dict) -> dict:
        return {k: v for k, v in value.items() if v is not None}


class RequirementFile(Strict):
    upstream: Name = Field(description="the upstream whose exported, patched tree holds the file")
    path: Annotated[str, _grammar(grammar.check_relative_path)] = Field(
        description="the requirement file, relative to the upstream's tree (e.g. requirements/common.txt)"
    )
    constraint: bool = Field(
        False,
        description="true: the file's lines constrain the phase (pip -c) instead of being installed, e.g. the "
        "plugin's requirements/common.txt over vLLM's (its huggingface_hub cap)",
    )


class ConstrainedFiles(Strict):
    file: RequirementFile = Field(description="the requirement file a phase installs")
    by: RequirementFile = Field(description="the file that phase must read as a constraint (constraint: true)")


#: The checks a contract line may make, one per line (its other keys say where: target, kernel, index).
CONTRACT_CHECKS = (
    "labels",
    "no_labels",
    "env",
    "no_env",
    "workdir",
    "cmd",
    "entrypoint",
    "installs",
    "only_binary",
    "checks_version",
    "installs_file",
    "constrained",
    "gate_pins",
    "gate_exact",
    "gate_order",
    "gate_imports",
    "options",
    "stages",
)


class ContractLine(Strict):
    """One assertion of an upstream's contract test, as a check of the image this stack builds."""

    line: int = Field(ge=1, le=1_000_000, description="the assertion's line in the contract file")
    says: str = Field(min_length=1, max_length=400, description="what the assertion says, in words, for people")
    target: Name | None = Field(None, description="the target (the fork's stage of the same name) the check is about")
    kernel: Name | None = Field(None, description="with env: the kernel step whose environment is checked")
    labels: dict[LabelKey, str] | None = Field(
        None, description="labels the image (of target, else every target) carries with these values ({{ … }} ok)"
    )
    no_labels: list[LabelKey] | None = Field(None, description="labels no image of the stack carries")
    env: dict[EnvName, str | None] | None = Field(
        None, description="ENV of the target (or the kernel's): each NAME with this value; null: NAME is not set"
    )
    no_env: list[EnvName] | None = Field(None, description="names no stage of the Dockerfile sets (ENV or ARG)")
    workdir: str | None = Field(None, description="the target's WORKDIR")
    cmd: list[str] | None = Field(None, description="the target's CMD")
    entrypoint: list[str] | None = Field(None, description="the target's ENTRYPOINT; null: none")
    installs: Annotated[str, _grammar(lambda v: _pep508(v))] | None = Field(
        None, description="an exact requirement (name==version) a pip phase of the target installs"
    )
    index: Literal["vendor", "public"] | None = Field(None, description="with installs: the role of its index")
    only_binary: ProjectName | None = Field(None, description="the target's phase installing it is binary-only")
    checks_version: ProjectName | None = Field(
        None, description="a check of the target reads the installed version of this distribution"
    )
    installs_file: RequirementFile | None = Field(None, description="a requirement phase installs this file")
    constrained: ConstrainedFiles | None = Field(
        None, description="the phase that installs file reads by as a constraint: {file, by}"
    )
    gate_pins: list[ProjectName] | None = Field(None, description="pins the gate checks (packages of the stack)")
    gate_exact: list[ProjectName] | None = Field(None, description="packages under gate.exact")
    gate_order: list[ProjectName] | None = Field(None, description="packages the gate checks in this order")
    gate_imports: list[Module] | None = Field(None, description="modules the gate imports")
    options: dict[EnvName, str] | None = Field(
        None,
        description="build options with these values as the stack declares them (a value chosen with --set, "
        "among the option's choices, is the build's choice, as the fork's build arguments are)",
    )
    stages: list[Name] | None = Field(None, description="targets each built on the one before (from:)")

    @model_validator(mode="after")
    def _one(self) -> "ContractLine":
        given = [k for k in CONTRACT_CHECKS if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(
                f"a contract line checks one thing; it gives {', '.join(given) or 'none'} (one of: "
                f"{', '.join(CONTRACT_CHECKS)})"
            )
        if self.index is not None and given != ["installs"]:
            raise ValueError("index: goes with installs:")
        if self.kernel is not None and (given != ["env"] or self.target is not None):
            raise ValueError("kernel: goes with env: (and no target:)")
        return self


class Contract(Strict):
    """An upstream's contract test, recorded line by line as what the image must hold, install, label and set."""

    file: Annotated[str, _grammar(grammar.check_relative_path)] = Field(
        description="the contract module in the upstream's tree at the pinned commit, e.g. "
        "tests/test_inplace_porting_contract.py"
    )
    lines: list[ContractLine] = Field(
        min_length=1, description="its assertions, each {line, says} and one check (see ContractLine)"
    )


class Upstream(Strict):
    git: str | None = Field(default=None, description="git URL or local path of the upstream repository")
    tag: Annotated[str, _grammar(grammar.check_git_ref)] | None = Field(
        None,
        description="the release tag; the commit must be the one it points to (leave it out for an upstream "
        "pinned by commit only, e.g. a fork without release tags)",
    )
    commit: str | None = Field(default=None, description="full 40-hex commit id")
    sdist: Sdist | None = Field(default=None, description="a release sdist instead of git")
    patches: Annotated[str, _grammar(grammar.check_relative_path)] | None = Field(
        None, description="patch series directory (a `series` file and its patches), relative to the repository root"
    )
    patches_from: PatchesFrom | None = Field(
        None,
        description="a patch series carried inside another upstream's tree, read from its export at its pinned "
        "commit and applied on the host like patches:",
    )
    edits: list[SourceEdit] = Field(
        default=[],
        description="in-place fixes applied on the host after the patch series, each checked to match exactly "
        "once (a fix that no longer matches the pinned tree fails the build); labelled org.stackforge.edits.<name>",
    )
    submodules: bool | None = Field(
        None,
        description="true: the export also holds the git submodules the pinned commit records, recursively, each "
        "at the commit its gitlink names, fetched on the host from the URL .gitmodules gives (checked: no "
        "transport helpers, options or paths out of the tree); their paths, URLs and commits are recorded in the "
        "evidence and the inputs fingerprint",
    )
    agree: Agree | None = Field(
        None,
        description="the upstream's own pins the stack must agree with: requirement files, KEY=VALUE files, and "
        "the reasoned exceptions (render and build fail on a disagreement; `stackforge lint` checks a fetched "
        "upstream; `stackforge drift` compares with a newer revision)",
    )
    contract: Contract | None = Field(
        None,
        description="the upstream's image contract at its pinned commit (its contract test, line by line): lint and "
        "render check the Dockerfile the stack renders against each line, `verify` the image; a mismatch names "
        "the contract's file and line. Checked, never built: outside the fingerprint",
    )

    @property
    def pin(self) -> str:
        """How the pin is written in labels, evidence and errors: ``tag@commit`` (``commit`` when untagged)."""
        return f"{self.tag}@{self.commit}" if self.tag else str(self.commit)

    @field_validator("git")
    @classmethod
    def _git(cls, value):
        reason = value is not None and grammar.check_git_source(value, redact(value))
        if reason:
            raise ValueError(reason)
        return value

    @field_validator("submodules")
    @classmethod
    def _submodules(cls, value):
        return value or None  # false is the default: left out of the fingerprint like an absent key

    @field_validator("commit")
    @classmethod
    def _commit(cls, value):
        if value is not None and not HEX40.match(str(value)):
            raise ValueError(f"'{value}' is not a full 40-hex commit id")
        return value


def _one_line(value: str) -> str:
    if "\n" in value.strip():
        raise ValueError("must be a single line: it becomes one RUN instruction")
    return value.strip()


RESERVED_STAGES = {"base", "venv", "deps", "installed", "gate-env", "gate", "gate-readonly"}
#: Prefixes of the stages the Dockerfile names after upstreams, kernels and system layers.
RESERVED_STAGE_PREFIXES = ("src-", "kernel-", "system-", "toolchain-", "buildenv-")


def _tree_path(path: str) -> str | None:
    if path.rstrip("/") in ("", "."):
        return f"{path!r} is the kernel's own tree; name a directory inside it, e.g. third_party/vllm"
    return grammar.check_relative_path(path)


# A path inside an upstream tree: relative, no '.' or '..' component, never the tree itself.
TreePath = Annotated[str, _grammar(_tree_path), AfterValidator(lambda v: v.rstrip("/"))]


class BuildOption(Strict):
    """A declared choice that changes what is built (e.g. whether an optional stage runs)."""

    choices: list[Annotated[str, _grammar(grammar.check_name)]] = Field(
        min_length=1, description='the values the option may take, e.g. ["1", "0"]'
    )
    value: Annotated[str, _grammar(grammar.check_name)] = Field(
        description="the chosen value, one of choices (set with --set options.NAME.value=…)"
    )
    description: str = Field("", description="what the option selects, for readers")

    @field_validator("choices", "value", mode="before")
    @classmethod
    def _text(cls, value):
        if isinstance(value, list):
            return [cls._text(v) for v in value]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError(f'{value!r}: option values are strings; quote them, e.g. "1"')
        return str(value)

    @field_validator("value")
    @classmethod
    def _chosen(cls, value: str, info: ValidationInfo) -> str:
        choices = info.data.get("choices") or []
        if choices and value not in choices:
            raise ValueError(f"{value!r} is not one of the choices {choices}")
        return value


FileSource = Annotated[str, _grammar(grammar.check_file_source)]
FileDest = Annotated[str, _grammar(grammar.check_file_dest)]


class Toolchain(Strict):
    """What a kernel needs to build that the image must not carry (e.g. Rust): installed with network in the
    kernel's own stages, before and apart from the offline build."""

    run: str = Field(
        description="one shell line run with network before the kernel's offline build, in a stage of its own "
        "(toolchain-<kernel>) that holds no source, so a source change re-runs only the build"
    )
    env: dict[EnvName, str] = Field(
        default={},
        description="environment of the toolchain step and of the build after it; values may use {{ … }} like "
        "kernel env",
    )
    path: list[Annotated[str, _grammar(grammar.check_absolute_path)]] = Field(
        default=[], description="directories put in front of PATH, e.g. [/usr/local/cargo/bin]"
    )
    uses: list[FileSource] = Field(
        default=[],
        description="files or directories of the kernel's tree the toolchain step reads (e.g. "
        "rust-toolchain.toml, the Cargo workspace to fetch crates for), copied alone into its working directory: "
        "a change to them re-runs it, any other source change does not",
    )

    _run = field_validator("run")(classmethod(lambda cls, v: _one_line(v)))
    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _env_values(v)))


class Kernel(Strict):
    upstream: Name = Field(description="the upstream whose patched tree this step builds")
    when: dict[EnvName, Annotated[str, _grammar(grammar.check_name)]] = Field(
        default={},
        description="build options this step needs, e.g. {BUILD_VLLM_RS: '1'}: the step is left out otherwise",
    )
    env: dict[EnvName, str] = Field(
        default={}, description="environment of the build command; values may use {{ … }} like tags"
    )
    run: str = Field(
        description="shell command run in the upstream tree, offline; it writes wheels to /out/wheels (and the "
        "files it declares to /out/files)"
    )
    trees: dict[Name, TreePath] = Field(
        default={},
        description="other upstreams' exported, patched trees placed inside this tree before the build: "
        "{upstream: relative path}, e.g. {vllm: third_party/vllm}",
    )
    toolchain: Toolchain | None = Field(
        None, description="a build toolchain installed with network before the offline build, never in the image"
    )
    files: dict[FileSource, FileDest] = Field(
        default={},
        description="files or directories the step writes besides wheels, {path under /out/files: destination} "
        "(an absolute path or {site}/…), installed in the gate stage after the wheels with their mode (a directory "
        "replaces the destination directory as a whole); a missing one fails the build",
    )
    wheels: bool | None = Field(
        None, description="whether the step writes wheels to /out/wheels (default: true unless it declares files)"
    )
    build_requires: list[ProjectName] | None = Field(
        None,
        description="the stack's packages the build needs, e.g. [setuptools]: the step then builds in a "
        "virtual environment of only these pins (each --no-deps from its index, with its phase's hashes) and "
        "starts beside the remaining pip phases instead of after them; [] builds with none. Unset, it builds in "
        "the whole installed environment. A stack's kernels only, not a target's",
    )

    _run = field_validator("run")(classmethod(lambda cls, v: _one_line(v)))

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value):
        return _env_values(value)


def _env_values(value):
    """Environment names are ENV_NAME; values are strings (a number must be quoted)."""
    if isinstance(value, dict):
        for key, val in value.items():
            if not ENV_NAME.match(str(key)):
                raise ValueError(f"{str(key)!r} is not a valid environment variable name")
            if not isinstance(val, str):
                raise ValueError(f"{key}: environment values must be strings; quote {val!r}")
    return value


class Step(Strict):
    env: dict[EnvName, str] = Field(
        default={}, description="environment of the command; values may use {{ … }} like tags"
    )
    run: str = Field(description="one shell line run in the installed environment, offline")

    _run = field_validator("run")(classmethod(lambda cls, v: _one_line(v)))
    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _env_values(v)))


SPECIFIER = re.compile(
    r"^(?:(?:==|!=|<=|>=|<|>|~=)\s*[0-9][0-9A-Za-z.+*!]*)(?:\s*,\s*(?:==|!=|<=|>=|<|>|~=)\s*"
    r"[0-9][0-9A-Za-z.+*!]*)*$"
)


def _specifier(text: str) -> str | None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        return f"{text!r} is not a version specifier such as '<0.2.6' or '>=0.2,<0.2.6'"
    return None if SPECIFIER.match(text.strip()) else f"{text!r} is not a version specifier such as '<0.2.6'"


class PostInstall(Strict):
    dist: ProjectName = Field(description="the installed distribution to patch (a package of the stack)")
    below: str | None = Field(None, description="apply only when the installed version is below this one")
    when: Annotated[str, _grammar(_specifier)] | None = Field(
        None, description="apply only when the installed version matches this specifier, e.g. '<0.2.6'"
    )
    patch: Annotated[str, _grammar(grammar.check_relative_path)] = Field(
        description="unified diff relative to site-packages (a/…, b/…), checked in the repository"
    )

    _v = field_validator("below", mode="before")(classmethod(lambda cls, v: v if v is None else _exact_version(v)))

    @property
    def specifier(self) -> str:
        return f"<{self.below}" if self.below is not None else (self.when or "").replace(" ", "")


class Package(Strict):
    version: str = Field(description='the exact pinned version, bare and quoted, e.g. "2.11.0.post2+musa5.2.0"')
    index: Name = Field(description="the one index this package comes from")
    gate: Literal["exact", "metadata", "spec"] = Field(
        "exact",
        description="how the gate finds the package; its version is always compared with the pin by the "
        "local-label rule (a pin with a local label matches only that build, one without matches any build of "
        "its version). exact: import, then the version; metadata: no import, version from package metadata; spec: "
        "as metadata, and the module must be found (importlib.util.find_spec) without importing it",
    )
    import_: Module | None = Field(
        default=None, alias="import", description="module to import (default: name with - → _)"
    )
    sha256: list[Sha256] = Field(default=[], description="allowed wheel hashes; enables --require-hashes")

    _v = field_validator("version", mode="before")(classmethod(lambda cls, v: _exact_version(v)))

    @property
    def import_name(self) -> str:
        return self.import_ or ""


class GateImport(Strict):
    module: Module = Field(description="module the gate imports after the packages (PASS import …)")
    dist: ProjectName | None = Field(
        None, description="distribution whose version the gate reports for the module (default: the module name)"
    )


class Probe(Strict):
    multiline_fields: ClassVar[frozenset[str]] = frozenset({"code", "description"})

    name: Name = Field(description="the probe's name on its gate line (PASS probe <name> …)")
    description: str = Field("", description="what the probe shows, for readers")
    code: str = Field(description="Python run in the gate after the imports; it prints one result line")
    expect: str = Field(description="the exact line the code must print")
    when: dict[EnvName, Annotated[str, _grammar(grammar.check_name)]] = Field(
        default={},
        description="build options this probe needs, e.g. {BUILD_VLLM_RS: '1'}: left out of the gate otherwise",
    )
    env: dict[EnvName, str] = Field(default={}, description="environment set while the probe runs (restored after it)")

    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _env_values(v)))


class PipCheckAllow(Strict):
    dist: ProjectName = Field(description="the installed distribution whose requirement pip check reports unmet")
    requires: ProjectName = Field(description="the project of that requirement")
    reason: str = Field(min_length=1, description="why the image ships with it unmet (printed on the gate's line)")


class Gate(Strict):
    prepare: list[str] = Field(
        default=[],
        description="commands run in the gate stage before the checks; what they write stays in the image layer "
        "(e.g. files a package would otherwise create at import time)",
    )
    imports: list[GateImport] = Field(
        default=[],
        description="extra modules the gate imports after the packages, e.g. {module: vllm, dist: vllm}",
    )
    probes: list[Probe] = Field(
        default=[],
        description="Python snippets the gate runs after the imports; each must print its expected line",
    )

    _prepare = field_validator("prepare")(classmethod(lambda cls, v: [_one_line(c) for c in v]))
    read_only: bool = Field(default=True, description="re-run the imports with site-packages mounted read-only")
    abi: bool = Field(default=True, description="resolve every DT_NEEDED of the vendor packages' shared objects")
    pip_check_allow: list[PipCheckAllow] = Field(
        default=[],
        description="unmet requirements `pip check` may report, each with its reason (e.g. a plugin revision "
        "that pins another release train than this stack); any other unmet requirement fails the gate",
    )
    library_path: list[str] = Field(
        default=[],
        description="directories the loader searches for the ABI check, as the runtime would; {site} is site-packages",
    )
    exact: list[ProjectName] = Field(
        default=[],
        description="packages whose installed version must be the pin itself, local label and all (the fork's "
        "exact_version_dists): for them the gate refuses a build of the pin (0.1.90+x for a pin 0.1.90) that the "
        "local-label rule accepts for the others",
    )


Agreement = Literal["post", "local", "release"]


def _default_agreement() -> list[Agreement]:
    return ["post", "local"]


class Train(Strict):
    name: str = Field(description="the train's name in lint findings, e.g. torch")
    members: list[str] = Field(
        min_length=1, description="pins that move together; the first is the lead the others are compared with"
    )
    agree: list[Agreement] = Field(
        default_factory=_default_agreement,
        description="which parts of the members' versions must agree: post (the .postN), local (the local label), "
        "release (the release numbers)",
    )


class BuiltFor(Strict):
    package: str = Field(description="the pin built against another pin, e.g. deep_ep")
    for_: str = Field(alias="for", description="the pin it is built against, e.g. torch")
    local: str = Field(description="template of the local label, e.g. '{{ for.local }}torch{{ for.public }}'")


class Aligned(Strict):
    name: str = Field(description="the family's name in lint findings, e.g. mate")
    members: list[str] = Field(
        min_length=1,
        description="pins that share one public version (each may carry its own local label); the first is the lead",
    )


class VendorBuild(Strict):
    package: str = Field(description="the pin that must be the vendor's build, e.g. apache-tvm-ffi")
    local_prefix: str = Field(description="what its local label must start with, e.g. musa (0.1.0+musa.1)")


class Condition(Strict):
    package: str = Field(description="the pin the condition reads")
    min: str = Field(description="the minimum applies only when that pin is at least this version")

    _v = field_validator("min", mode="before")(classmethod(lambda cls, v: _exact_version(v)))


class Minimum(Strict):
    package: str = Field(description="the pin that has a minimum version")
    min: str = Field(description="the lowest version `stackforge lint` accepts")
    when: Condition | None = Field(
        None, description="apply only when another pin is at least a version: {package, min}"
    )

    _v = field_validator("min", mode="before")(classmethod(lambda cls, v: _exact_version(v)))


class Requirement(Strict):
    name: Annotated[str, _grammar(_requirement_name)] = Field(description="what is required, e.g. MUSA Toolkit")
    dist: ProjectName | None = Field(None, description="read the version from this distribution's metadata")
    command: str | None = Field(
        None, description="or run this one-line command in the image; its first version-looking token is the version"
    )
    min: str = Field(description="the lowest version accepted")

    _v = field_validator("min", mode="before")(classmethod(lambda cls, v: _exact_version(v)))
    _command = field_validator("command")(classmethod(lambda cls, v: v if v is None else _one_line(v)))


class Rules(Strict):
    trains: list[Train] = Field(
        default=[], description="release trains: pins whose versions move together, e.g. torch and torch_musa"
    )
    built_for: list[BuiltFor] = Field(
        default=[],
        description="pins whose local label names the pin they were built against (deep_ep names the stack's torch)",
    )
    aligned: list[Aligned] = Field(
        default=[], description="families sharing one public version (MATE and its wrappers)"
    )
    vendor_build: list[VendorBuild] = Field(
        default=[], description="pins that must be a vendor build (a +<local_prefix> label)"
    )
    minimums: list[Minimum] = Field(
        default=[], description="minimum versions of pins, each optionally conditional on another pin"
    )
    requires: list[Requirement] = Field(
        default=[], description="minimum versions checked in the image by the gate (PASS requires …)"
    )


class Tags(Strict):
    local: str = Field(description="Jinja2 template of the local image reference")
    publish: str | None = Field(default=None, description="template of the publish reference (needs date and revision)")
    aliases: list[str] = Field(default=[], description="moving tags updated after a verified publish")
    compression: Literal["gzip", "zstd"] | None = Field(
        None,
        description="the layer compression `publish` and the nightly write (default gzip; zstd needs Docker 23 or "
        "containerd 1.5 to pull); `publish --compression` overrides it",
    )


class Healthcheck(Strict):
    """The target's Dockerfile HEALTHCHECK: a command the engine runs in the running container (exit 0:
    healthy), e.g. MATE's own environment check."""

    cmd: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        min_length=1, description="the command in exec form, e.g. [python, -m, mate, check]; exit 0 means healthy"
    )
    interval_s: int = Field(30, ge=1, le=86400, description="seconds between checks")
    timeout_s: int = Field(30, ge=1, le=86400, description="seconds one check may take")
    retries: int = Field(3, ge=1, le=100, description="consecutive failures before the container is unhealthy")
    start_period_s: int = Field(0, ge=0, le=86400, description="seconds of start-up during which failures do not count")


@functools.lru_cache(maxsize=4096)
def requirement(text: str) -> "PackagingRequirement":
    """``text`` parsed as a PEP 508 requirement (packaging's InvalidRequirement when it is not one), once per
    process: packaging's parser is pure Python, and a stack, each of its platform lines and the checks across
    keys read the same requirements. The object is shared: read it, never change it."""
    from packaging.requirements import Requirement

    return Requirement(text)


def _pep508(text: str) -> str | None:
    from packaging.requirements import InvalidRequirement

    if text.lstrip().startswith("-") or "://" in text or "\\" in text:
        return f"{text!r}: options, URLs and paths are refused; name a package and a version specifier"
    try:
        req = requirement(text)
    except InvalidRequirement as exc:
        return f"{text!r} is not a requirement: {exc}"
    return f"{text!r}: a direct URL reference is refused" if req.url else None


class TargetPhase(Strict):
    index: Name = Field(description="the one index this phase installs from")
    requirements: list[Annotated[str, _grammar(_pep508)]] = Field(
        default=[], description="PEP 508 requirements, e.g. 'numpy>=1.26.4,<2' (no URLs or options)"
    )
    files: list[RequirementFile] = Field(
        default=[], description="requirement files of an upstream, read on the host like requirements:"
    )
    no_deps: bool = Field(False, description="install with --no-deps")
    only_binary: bool = Field(False, description="install wheels only (--only-binary=:all:)")
    repin: bool = Field(
        False,
        description="this phase deliberately installs another version of a vendor package (exact pins only); "
        "labelled org.stackforge.repin.<dist>, and the preserve check expects the new version",
    )

    @model_validator(mode="after")
    def _some(self) -> "TargetPhase":
        if not self.requirements and not self.files:
            raise ValueError("a phase needs requirements or files")
        if self.repin and (self.files or not all("==" in r for r in self.requirements)):
            raise ValueError("repin: true takes exact pins (name==version) under requirements, no files")
        return self


def _templated(check: Callable[[str], str | None]) -> _grammar:
    """A grammar checked on load unless the value is a template ({{ … }}): then it is checked once rendered."""
    return _grammar(lambda v: None if "{{" in v or "{%" in v else check(v))


def _layer_name(name: str) -> str | None:
    ok = re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name)
    return None if ok else f"{name!r} is not a layer name (lowercase letters, digits, '.', '_', '-')"


AbsPath = Annotated[str, _grammar(grammar.check_absolute_path)]


class AptSource(Strict):
    url: str = Field(
        description="repository URL (http, https or file), e.g. https://dl.mthreads.com/repo/repository/ubuntu2204/"
    )
    suite: Annotated[str, _grammar(grammar.check_apt_suite)] = Field(description="suite, e.g. jammy")
    components: list[Annotated[str, _grammar(grammar.check_apt_component)]] = Field(
        default_factory=lambda: ["main"], min_length=1, description="components, e.g. [main]"
    )
    trusted: bool = Field(False, description="true: written as [trusted=yes] (no signature check)")
    signed_by: Annotated[str, _grammar(grammar.check_relative_path)] | None = Field(
        None, description="a key file in the repository (.gpg or .asc) the source is checked against ([signed-by=…])"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        reason = grammar.check_url(value, value)
        if reason:
            raise ValueError(reason)
        return value


class AptMirror(Strict):
    from_: str = Field(
        alias="from", description="URL prefix of the base OS's apt source, e.g. http://archive.ubuntu.com/ubuntu/"
    )
    to: str = Field(description="the mirror that replaces it in /etc/apt/sources.list*")

    @field_validator("from_", "to")
    @classmethod
    def _url(cls, value: str) -> str:
        reason = grammar.check_url(value, value, ("http", "https"))
        if reason:
            raise ValueError(reason)
        return value


class SystemPackage(Strict):
    name: Annotated[str, _templated(grammar.check_apt_name)] = Field(
        description="the logical package; without candidates also the apt package name; may use {{ … }}"
    )
    candidates: list[Annotated[str, _templated(grammar.check_apt_name)]] = Field(
        default=[],
        description="apt package names tried in order, e.g. "
        '["libmudnn3-musa-{{ platform.musa_runtime | dashed }}", "libmudnn3-musa-{{ platform.musa_runtime | major }}"]',
    )
    version: Annotated[str, _templated(grammar.check_apt_version)] | None = Field(
        None, description="exact Debian version, e.g. 2.4.1-1"
    )
    line: Annotated[str, _templated(grammar.check_apt_version)] | None = Field(
        None,
        description="version line resolved in the build with apt-cache madison: an exact version (2.4.1 -> "
        "2.4.1-1) beats a longer one (2.4.1.x); 5.2 matches 5.2.0-1, never 5.20.0",
    )

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_pin(self) -> "SystemPackage":
        if self.version is not None and self.line is not None:
            raise ValueError("give either version (exact) or line (a version line), not both")
        return self


class SystemLayer(Strict):
    install: Literal["auto", "always", "never"] = Field(
        "always",
        description="always: install; never: skip the layer; auto: keep a base that already has "
        "the probe command (command -v), else install",
    )
    probe: Annotated[str, _grammar(grammar.check_command)] | None = Field(
        None, description="command whose presence means the base already carries this layer (install: auto)"
    )
    mirror: AptMirror | None = Field(None, description="rewrite the base OS's apt source to a mirror")
    sources: dict[Name, AptSource] = Field(default={}, description="apt sources this layer adds")
    packages: list[SystemPackage] = Field(
        default=[],
        description="installed in one apt transaction (--allow-downgrades "
        "--no-install-recommends); a string is an unpinned package",
    )
    ld_dirs: list[AbsPath] = Field(default=[], description="written to /etc/ld.so.conf.d/<layer>.conf")
    symlinks: dict[AbsPath, Annotated[str, _templated(grammar.check_absolute_path)]] = Field(
        default={}, description="link: target (ln -sfn); a target missing after the install fails the build"
    )
    env: dict[EnvName, str] = Field(default={}, description="environment set from this layer on")
    path: list[AbsPath] = Field(default=[], description="directories put in front of PATH")

    @model_validator(mode="after")
    def _probe(self) -> "SystemLayer":
        if self.install == "auto" and self.probe is None:
            raise ValueError("install: auto needs a probe command (e.g. probe: mcc)")
        return self


SystemLayerName = Annotated[str, _grammar(_layer_name)]


class Target(Strict):
    # The exec form is written as JSON: newlines and tabs inside an argument stay on one Dockerfile line.
    multiline_fields: ClassVar[frozenset[str]] = frozenset({"entrypoint", "cmd"})

    entrypoint: list[str] | None = Field(
        None, description="ENTRYPOINT in exec form, e.g. [vllm, serve]; child targets inherit it"
    )
    cmd: list[str] | None = Field(None, description="CMD in exec form; child targets inherit it")
    env: dict[EnvName, str] = Field(
        default={},
        description="ENV of the target; values may use {{ … }} like tags (e.g. from platform.gpu_arch)",
    )
    # Per-target layers (builder/plan/targets.py): a target builds on the gate, or on another target with `from:`.
    from_: Name | None = Field(
        None, alias="from", description="the target this one builds on (a child target); default: the gate"
    )
    publish: bool | None = Field(
        None, description="false: an intermediate stage other targets build on; never tagged or published"
    )
    workdir: AbsPath | None = Field(None, description="WORKDIR of the target")
    labels: dict[LabelKey, str] = Field(
        default={}, description="labels of this target; values may use {{ … }} like tags"
    )
    system: dict[SystemLayerName, SystemLayer] | None = Field(
        None, description="apt layers of this target, each one apt transaction, as the top-level system:"
    )
    sources: dict[Name, AbsPath] = Field(
        default={},
        description="upstreams (declared under upstreams:) placed in the image: {upstream: absolute path}",
    )
    kernels: dict[Name, Kernel] = Field(
        default={},
        description="wheels built offline from an upstream's tree in their own stage (the toolchain stays out); "
        "installed --no-deps in this target",
    )
    pip: dict[Name, TargetPhase] = Field(
        default={},
        description="pip phases in order, each with a constraints file generated in the image from every "
        "installed vendor dist and a preserve check after it",
    )
    steps: dict[Name, Step] = Field(default={}, description="shell lines run after the pip phases (e.g. compileall)")
    checks: list[Probe] = Field(default=[], description="probes run in the target's stage; a failure fails the build")
    healthcheck: Healthcheck | None = Field(
        None, description="HEALTHCHECK of the image: {cmd, interval_s, timeout_s, retries, start_period_s}"
    )
    reports: dict[Name, Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default={},
        description="{name: one shell line} run in the built image after the gate (--network=none); each output "
        "is kept in the evidence as reports/<name>.txt, e.g. {mate-config: python -m mate show-config --json}",
    )

    _reports = field_validator("reports")(classmethod(lambda cls, v: {k: _one_line(c) for k, c in v.items()}))

    @property
    def alias(self) -> bool:
        """Only ``from:`` (and ``publish``): the same image as its parent."""
        own = self.model_fields_set - {"from_", "publish"}
        return self.from_ is not None and not any(getattr(self, f) for f in own)

    @property
    def published(self) -> bool:
        return self.publish is not False


class RequirementsPhase(Strict):
    index: Name = Field(description="the one index this phase installs from")
    files: list[RequirementFile] = Field(
        min_length=1,
        description="requirement files read on the host at the upstream's pinned commit; -r/-c inside the same "
        "tree are followed, every other option is refused, and a package a vendor index provides is dropped",
    )
    no_deps: bool = Field(default=False, description="install with --no-deps")


#: pytest's outcome words, as its summary line and `expect:` spell them.
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
Outcome = Literal["passed", "failed", "skipped", "xfailed", "xpassed", "error"]
#: The pytest options a slice's selection may hold, each followed by its value.
SELECT_OPTIONS = ("-k", "-m", "--deselect")
#: A -k / -m expression: names, and/or/not, parentheses (pytest's own expression grammar, nothing a shell reads).
SELECT_EXPRESSION = re.compile(r"^[A-Za-z0-9_ ()\[\].:-]{1,512}$")
#: A test function or class after the file in a node id, optionally with its parameter id.
NODE_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\[[A-Za-z0-9_.,:+=/ -]{0,200}\])?$")


def _node_id(text: str) -> str | None:
    """Why ``text`` is not a pytest node id (``path/to/test_x.py::Class::test[param]``), or None."""
    path, *parts = text.split("::")
    reason = grammar.check_relative_path(path)
    if reason:
        return f"{text!r}: the file part is not a relative path"
    bad = next((p for p in parts if not NODE_PART.match(p)), None)
    return f"{text!r}: {bad!r} is not a test or class name (write Class::test_name[param])" if bad is not None else None


def selection_nodes(args: list[str]) -> list[str]:
    """The node ids of a selection (its arguments that are not an option or an option's value)."""
    return [a for i, a in enumerate(args) if a not in SELECT_OPTIONS and (i == 0 or args[i - 1] not in SELECT_OPTIONS)]


def check_selection(args: list[str]) -> str | None:
    """Why ``args`` is not a slice's pytest selection, or None: node ids, ``-k EXPR``, ``-m EXPR``,
    ``--deselect NODEID``; no other option reaches pytest."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in SELECT_OPTIONS:
            if i + 1 >= len(args):
                return f"select[{i}]: {arg} needs a value after it, e.g. [{arg}, 'not slow']"
            value = args[i + 1]
            if arg == "--deselect":
                reason = _node_id(value)
            elif value.startswith("-") or not SELECT_EXPRESSION.match(value):
                reason = f"{value!r} is not a pytest expression (names, and, or, not, parentheses)"
            else:
                reason = None
            if reason:
                return f"select[{i + 1}]: {reason}"
            i += 2
            continue
        if arg.startswith("-"):
            return f"select[{i}]: option {arg!r} is not taken (a selection holds node ids, -k, -m, --deselect)"
        reason = _node_id(arg)
        if reason:
            return f"select[{i}]: {reason}"
        i += 1
    return None


class SliceFiles(Strict):
    upstream: Name | None = Field(
        None,
        description="the upstream (under upstreams:) whose tree at the stack's pinned commit holds the paths; "
        "absent: the paths are files of this repository",
    )
    paths: list[Annotated[str, _grammar(grammar.check_relative_path)]] = Field(
        min_length=1,
        max_length=256,
        description="files or directories staged for the run at the same relative paths (the test files and "
        "whatever they read, e.g. [tests/test_x.py, requirements])",
    )


class SliceHardware(Strict):
    devices: Literal["none", "mthreads"] = Field(
        "none", description="the accelerator the slice needs (none: it runs on any host, in CI and the nightly)"
    )
    count: int = Field(1, ge=0, le=64, description="how many devices")


class Slice(Strict):
    """A pytest slice run inside the built image with a read-only root (``stackforge test``)."""

    description: str = Field("", max_length=200, description="what the slice shows, one line")
    files: SliceFiles = Field(description="where the test files come from: {upstream, paths}")
    select: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default=[],
        max_length=256,
        description="pytest arguments: node ids (tests/test_x.py::test_y), -k EXPR, -m EXPR, --deselect NODEID; "
        "default: the paths",
    )
    expect: dict[Outcome, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(
        min_length=1,
        description="the counts pytest must report, e.g. {passed: 60, xfailed: 4}; an outcome not named must be 0 "
        "(passed, failed, skipped, xfailed, xpassed, error)",
    )
    hardware: SliceHardware = Field(
        default={},
        validate_default=True,
        description="the devices the slice needs: {devices: none | mthreads, count}",
    )
    target: Name | None = Field(
        None, description="the image target the slice runs in (default: the stack's first published target)"
    )
    timeout_s: int = Field(600, ge=1, le=86400, description="seconds the run may take before it fails")
    nightly: bool = Field(False, description="the nightly runs this slice after the build (when it needs no device)")

    @field_validator("select")
    @classmethod
    def _grammar(cls, value: list[str]) -> list[str]:
        reason = check_selection(value)
        if reason:
            raise ValueError(reason)
        return value

    @model_validator(mode="after")
    def _staged(self) -> "Slice":
        staged = [p.rstrip("/") for p in self.files.paths]
        for node in selection_nodes(self.select):
            path = node.split("::")[0].rstrip("/")
            if not any(path == p or path.startswith(p + "/") for p in staged):
                raise ValueError(f"select: {node!r} is not under files.paths ({', '.join(staged)}); stage it there")
        return self

    def arguments(self) -> list[str]:
        """What follows ``pytest`` options: the selection, or the staged paths when it names no node id."""
        return list(self.select) if selection_nodes(self.select) else [*self.select, *self.files.paths]

    def expected(self) -> dict[str, int]:
        """Every outcome's expected count (0 for one not named)."""
        declared: dict[str, int] = {str(k): v for k, v in self.expect.items()}
        return {o: declared.get(o, 0) for o in OUTCOMES}


class Stack(Strict):
    name: Name = Field(description="the stack's name: its file's name (stacks/<name>.yaml); cannot be overridden")
    description: str = Field(default="", description="one line; it becomes the image's description label")
    inherits: Name | None = Field(default=None, description="parent stack name (stacks/<name>.yaml)")
    nightly: bool = Field(default=False, description="built and published by `stackforge nightly`")
    source: Name | None = Field(
        default=None,
        description="the upstream whose repository, commit and tag become the "
        "image's org.opencontainers.image.{source,revision,version} (default: the first)",
    )
    created_label: bool | None = Field(
        default=None,
        description="true (the default): label the image org.opencontainers.image.created with its sources' time "
        "(SOURCE_DATE_EPOCH, when the engine honours it: the same for every build of the same inputs); false "
        "leaves the label out, for an upstream whose image contract forbids it (the image config's own created "
        "time is that time either way)",
    )

    @field_validator("created_label")
    @classmethod
    def _created_label(cls, value):
        return None if value is True else value  # the default: left out of the fingerprint like an absent key

    @property
    def labels_created(self) -> bool:
        """Whether the image carries the ``org.opencontainers.image.created`` label (``created_label``)."""
        return self.created_label is not False

    platform: Platform = Field(
        description="what the image is built for: OS label, Python, CPU and GPU architectures, MUSA"
    )
    base: Base = Field(description="the base image, its interpreter and the pip the phases run with")
    platforms: dict[Name, PlatformLine] = Field(
        default={},
        description="the CPU platforms one tag publishes, by name (e.g. amd64, arm64), each a line of the train "
        "with what differs; the stack as written is the line of its platform.arch. Absent: that one platform",
    )
    indexes: dict[Name, Index] = Field(
        description="package indexes by name, each vendor or public; every package comes from exactly one"
    )
    upstreams: dict[Name, Upstream] = Field(
        default={},
        description="source trees (git or release sdist) fetched, verified and patched on the host",
    )
    kernels: dict[Name, Kernel] = Field(
        default={},
        description="offline build steps in their own stages, from an upstream's patched tree; their wheels and "
        "files are installed after the pip phases",
    )
    packages: dict[ProjectName, Package] = Field(
        description="the pins, {project: {version, index, …}}: one exact version from one index each"
    )
    requirements: dict[Name, RequirementsPhase] = Field(
        default={},
        description="pip phases from upstream requirement files, run in order after the public pins, with every "
        "pin of the stack (vendor and public) as constraints: a file that would move a pin fails the phase",
    )
    gate: Gate = Field(
        default={},
        validate_default=True,
        description="what the gate checks beyond the pins: prepare commands, imports, probes, the read-only "
        "re-run, ABI, pip check",
    )
    rules: Rules = Field(
        default={},
        validate_default=True,
        description="rules between the pins that `stackforge lint` checks, and the minimums the gate checks (requires)",
    )
    tags: Tags = Field(description="tag templates: the local tag, the publish tag and the moving aliases")
    labels: dict[LabelKey, str] = Field(
        default={}, description="extra labels of the image; values may use {{ … }} like tags"
    )
    targets: dict[Name, Target] = Field(
        default={},
        description="the images built on the gate (or on another target), by name, e.g. vllm-openai",
    )
    options: dict[EnvName, BuildOption] = Field(
        default={},
        description="build options with declared choices; they select optional steps, are part of the "
        "fingerprint and labelled org.stackforge.option.<NAME>",
    )
    tuning: dict[EnvName, Annotated[str, AfterValidator(_one_line)]] = Field(
        default={},
        description="environment of the build steps that does not change what is built (e.g. MAX_JOBS): "
        "kept out of the fingerprint, the tags and the labels; recorded in the evidence",
    )
    post_install: list[PostInstall] = Field(
        default=[],
        description="patches of installed distributions, applied in site-packages after the pip phases when the "
        "installed version matches (label org.stackforge.postinstall.<dist>)",
    )
    steps: dict[Name, Step] = Field(
        default={},
        description="commands run in the installed environment after the pip phases and post-install patches",
    )
    system: dict[SystemLayerName, SystemLayer] | None = Field(
        None, description="system layers (apt), in order, each its own stage system-<layer> after base"
    )
    tests: dict[Name, Slice] = Field(
        default={},
        description="pytest slices run in the built image by `stackforge test` (read-only root, no network), each "
        "with the counts pytest must report; never part of the fingerprint",
    )

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """The schema a previous process built for this same code, when ``stack/schemacache.py`` offers one for
        this build; else the schema pydantic builds."""
        if cls is Stack and source is Stack and _offered:
            return _offered[0]
        return handler(source)


#: the core schema offered for the stack model's next build (stack/schemacache.py): none, or one
_offered: list[core_schema.CoreSchema] = []


def offer_schema(schema: core_schema.CoreSchema | None) -> None:
    """Offer ``schema`` (a core schema this code built before) to the stack model's next build; None: withdraw
    it."""
    _offered[:] = [schema] if schema is not None else []
