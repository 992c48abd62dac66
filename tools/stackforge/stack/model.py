"""The stack schema: what a stack file may say, as pydantic models.

Every model forbids unknown keys; the loader (``stack.py``) turns unknown keys
into "did you mean" errors before pydantic sees them, and turns pydantic's
type errors into errors that name the file, line and column.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
)

from stackforge import grammar
from stackforge.grammar import ENV_NAME_RE as ENV_NAME

if TYPE_CHECKING:
    from stackforge.stack.load import LoadedStack

HEX40 = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PROJECT_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
PYTHON_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")
TOOLKIT_VERSION = re.compile(r"^[0-9][0-9A-Za-z._+-]{0,63}$")


def _grammar(check: Callable[[str], str | None]) -> AfterValidator:
    """A pydantic validator from a ``grammar.check_*`` function (``None`` = valid, else the reason)."""

    def validate(value: str) -> str:
        reason = check(value)
        if reason:
            raise ValueError(reason)
        return value

    return AfterValidator(validate)


def _project(name: str) -> str | None:
    return None if PROJECT_NAME.match(name) else f"{name!r} is not a valid project name"


def _python_version(text: str) -> str | None:
    return None if PYTHON_VERSION.match(text) else f'{text!r} is not a Python version such as "3.11"'


def _toolkit_version(text: str) -> str | None:
    return None if TOOLKIT_VERSION.match(text) else f"{text!r} is not a toolkit version such as 5.2.0"


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

    Nested mappings inside lists and mappings are models with their own check."""
    if isinstance(value, str):
        return grammar.check_text(value, multiline)
    if isinstance(value, list):
        for i, item in enumerate(value):
            reason = isinstance(item, str) and grammar.check_text(item, multiline)
            if reason:
                return f"item {i} {reason}"
    if isinstance(value, dict):
        for key, item in value.items():
            reason = isinstance(key, str) and grammar.check_text(key)
            if reason:
                return f"key {key!r} {reason}"
            reason = isinstance(item, str) and grammar.check_text(item, multiline)
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


class Strict(BaseModel):
    """Unknown keys are refused; no string holds a control character (``multiline_fields`` may hold \\n, \\t)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    multiline_fields: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _printable(cls, value: Any, info: ValidationInfo) -> Any:
        field = info.field_name
        if field is None:
            raise TypeError(f"{cls.__name__}._printable validates fields; pydantic called it without a field name")
        if _is_model(cls.model_fields[field].annotation):
            return value  # a nested model checks its own fields
        reason = _unprintable(value, field in cls.multiline_fields)
        if reason:
            raise ValueError(reason)
        return value


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
    arch: Literal["x86_64", "aarch64"] = "x86_64"
    musa: Annotated[str, _grammar(_toolkit_version)] | None = Field(
        default=None, description="MUSA toolkit version, e.g. 5.2.0"
    )
    musa_runtime: Annotated[str, _grammar(_toolkit_version)] | None = Field(
        None, description='MUSA runtime apt series, e.g. "5.2"'
    )
    gpu_arch: list[Name] = Field(default_factory=list, description="GPU architectures to compile for, e.g. [mp_31]")

    @field_validator("python", "musa_runtime", "musa", mode="before")
    @classmethod
    def _quoted(cls, value):
        if isinstance(value, float):
            raise ValueError(f'{value!r} was read as a number; quote it, e.g. "{value}"')
        return value


class Base(Strict):
    image: Annotated[str, _grammar(grammar.check_image_ref)] = Field(
        description="base image reference; the stand-in for tests is set with --set base.image=…"
    )
    python: Annotated[str, _grammar(grammar.check_python)] = Field(
        "python3", description="interpreter inside the base image"
    )
    digest: Annotated[str, _grammar(grammar.check_digest)] | None = Field(
        None, description="sha256 digest the base image must have"
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

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        from stackforge.urls import redact

        reason = grammar.check_url(value, redact(value))
        if reason:
            raise ValueError(reason)
        return value.rstrip("/")


class Sdist(Strict):
    index: Name = Field(description="name of the index that serves the sdist")
    name: ProjectName
    version: str
    sha256: str

    _v = field_validator("version", mode="before")(classmethod(lambda cls, v: _exact_version(v)))

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str) -> str:
        if not SHA256.match(value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value


class Upstream(Strict):
    git: str | None = Field(default=None, description="git URL or local path of the upstream repository")
    tag: Annotated[str, _grammar(grammar.check_git_ref)] | None = Field(
        None, description="the release tag; the commit must be the one it points to"
    )
    commit: str | None = Field(default=None, description="full 40-hex commit id")
    sdist: Sdist | None = Field(default=None, description="a release sdist instead of git")
    patches: Annotated[str, _grammar(grammar.check_relative_path)] | None = Field(
        None, description="patch overlay directory, relative to the repository root"
    )

    @field_validator("git")
    @classmethod
    def _git(cls, value):
        from stackforge.urls import redact

        reason = value is not None and grammar.check_git_source(value, redact(value))
        if reason:
            raise ValueError(reason)
        return value

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


RESERVED_STAGES = {"base", "deps", "gate", "gate-readonly"}


class Kernel(Strict):
    upstream: Name = Field(description="the upstream whose patched tree this step builds")
    env: dict[EnvName, str] = Field(
        default_factory=dict, description="environment of the build command; values may use {{ … }} like tags"
    )
    run: str = Field(description="shell command run in the upstream tree; it writes wheels to /out/wheels")

    _run = field_validator("run")(classmethod(lambda cls, v: _one_line(v)))

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value):
        if isinstance(value, dict):
            for key, val in value.items():
                if not ENV_NAME.match(str(key)):
                    raise ValueError(f"{str(key)!r} is not a valid environment variable name")
                if not isinstance(val, str):
                    raise ValueError(f"{key}: environment values must be strings; quote {val!r}")
        return value


class Package(Strict):
    version: str
    index: Name = Field(description="the one index this package comes from")
    gate: Literal["exact", "prefix", "metadata"] = Field(
        "exact",
        description="exact: import, then installed version == pin; prefix: import, then the installed version's "
        "public part == the pin's (any local label); metadata: no import, version from package metadata",
    )
    import_: Module | None = Field(
        default=None, alias="import", description="module to import (default: name with - → _)"
    )
    sha256: list[Sha256] = Field(default_factory=list, description="allowed wheel hashes; enables --require-hashes")

    _v = field_validator("version", mode="before")(classmethod(lambda cls, v: _exact_version(v)))

    @property
    def import_name(self) -> str:
        return self.import_ or ""


class GateImport(Strict):
    module: Module
    dist: ProjectName | None = None


class Probe(Strict):
    multiline_fields: ClassVar[frozenset[str]] = frozenset({"code", "description"})

    name: Name
    description: str = ""
    code: str = Field(description="Python run in the gate after the imports; it prints one result line")
    expect: str = Field(description="the exact line the code must print")


class Gate(Strict):
    prepare: list[str] = Field(
        default_factory=list,
        description="commands run in the gate stage before the checks; what they write stays in the image layer "
        "(e.g. files a package would otherwise create at import time)",
    )
    imports: list[GateImport] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)

    _prepare = field_validator("prepare")(classmethod(lambda cls, v: [_one_line(c) for c in v]))
    read_only: bool = Field(default=True, description="re-run the imports with site-packages mounted read-only")
    abi: bool = Field(default=True, description="resolve every DT_NEEDED of the vendor packages' shared objects")
    library_path: list[str] = Field(
        default_factory=list,
        description="directories the loader searches for the ABI check, as the runtime would; {site} is site-packages",
    )


Agreement = Literal["post", "local", "release"]


def _default_agreement() -> list[Agreement]:
    return ["post", "local"]


class Train(Strict):
    name: str
    members: list[str] = Field(min_length=1)
    agree: list[Agreement] = Field(default_factory=_default_agreement)


class BuiltFor(Strict):
    package: str
    for_: str = Field(alias="for")
    local: str = Field(description="template of the local label, e.g. '{{ for.local }}torch{{ for.public }}'")


class Aligned(Strict):
    name: str
    members: list[str] = Field(min_length=1)


class VendorBuild(Strict):
    package: str
    local_prefix: str


class Condition(Strict):
    package: str
    min: str

    _v = field_validator("min", mode="before")(classmethod(lambda cls, v: _exact_version(v)))


class Minimum(Strict):
    package: str
    min: str
    when: Condition | None = None

    _v = field_validator("min", mode="before")(classmethod(lambda cls, v: _exact_version(v)))


class Rules(Strict):
    trains: list[Train] = Field(default_factory=list)
    built_for: list[BuiltFor] = Field(default_factory=list)
    aligned: list[Aligned] = Field(default_factory=list)
    vendor_build: list[VendorBuild] = Field(default_factory=list)
    minimums: list[Minimum] = Field(default_factory=list)


class Tags(Strict):
    local: str = Field(description="Jinja2 template of the local image reference")
    publish: str | None = Field(default=None, description="template of the publish reference (needs date and revision)")
    aliases: list[str] = Field(default_factory=list, description="moving tags updated after a verified publish")


class Target(Strict):
    # The exec form is written as JSON: newlines and tabs inside an argument stay on one Dockerfile line.
    multiline_fields: ClassVar[frozenset[str]] = frozenset({"entrypoint", "cmd"})

    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: dict[EnvName, str] = Field(default_factory=dict)


class Stack(Strict):
    name: Name
    description: str = Field(default="", description="one line; it becomes the image's description label")
    inherits: Name | None = Field(default=None, description="parent stack name (stacks/<name>.yaml)")
    nightly: bool = Field(default=False, description="built and published by `stackforge nightly`")
    source: Name | None = Field(
        default=None,
        description="the upstream whose repository, commit and tag become the "
        "image's org.opencontainers.image.{source,revision,version} (default: the first)",
    )
    platform: Platform
    base: Base
    indexes: dict[Name, Index]
    upstreams: dict[Name, Upstream] = Field(default_factory=dict)
    kernels: dict[Name, Kernel] = Field(default_factory=dict)
    packages: dict[ProjectName, Package]
    gate: Gate = Field(default_factory=Gate)
    rules: Rules = Field(default_factory=Rules)
    tags: Tags
    labels: dict[LabelKey, str] = Field(default_factory=dict)
    targets: dict[Name, Target] = Field(default_factory=dict)

    # Filled by load_stack: the loader's provenance (positions, files, root, overrides, credentials).
    # Read it through the accessors of stackforge.stack.load.
    _loaded: LoadedStack | None = PrivateAttr(default=None)
