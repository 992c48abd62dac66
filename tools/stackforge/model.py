"""The stack schema: what a stack file may say, as pydantic models.

Every model forbids unknown keys; the loader (``stack.py``) turns unknown keys
into "did you mean" errors before pydantic sees them, and turns pydantic's
type errors into errors that name the file, line and column.
"""
from __future__ import annotations

import re
from typing import Literal

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

HEX40 = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _exact_version(value: object) -> str:
    """A pin is one exact PEP 440 version, written bare."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"version {value!r} was read as a number; quote it so no digit is lost, e.g. \"{value}\"")
    if not isinstance(value, str):
        raise ValueError("a version must be a string such as \"2.11.0\"")
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
    os: str = Field(description="base OS label used in tags, e.g. ubuntu22.04")
    python: str = Field(description="Python version, quoted: \"3.10\"")
    arch: Literal["x86_64", "aarch64"] = "x86_64"
    musa: str | None = Field(None, description="MUSA toolkit version, e.g. 5.2.0")
    musa_runtime: str | None = Field(None, description="MUSA runtime apt series, e.g. \"5.2\"")
    gpu_arch: list[str] = Field(default_factory=list, description="GPU architectures to compile for, e.g. [mp_31]")

    @field_validator("python", "musa_runtime", "musa", mode="before")
    @classmethod
    def _quoted(cls, value):
        if isinstance(value, float):
            raise ValueError(f"{value!r} was read as a number; quote it, e.g. \"{value}\"")
        return value


class Base(Strict):
    image: str = Field(description="base image reference; the stand-in for tests is set with --set base.image=…")
    python: str = Field("python3", description="interpreter inside the base image")
    digest: str | None = Field(None, description="sha256 digest the base image must have")


class Index(Strict):
    url: str = Field(description="PEP 503/691 simple index URL")
    role: Literal["vendor", "public"] = Field(
        description="vendor: exact wheels installed with --no-deps; public: an ordinary resolution of exact pins"
    )
    deps_from: str | None = Field(None, description="vendor indexes: the index their wheels' own dependencies come from")
    private: bool = Field(False, description="credentials may be needed; they arrive only as a BuildKit secret")
    lock: bool = Field(False, description="this index installs from stacks/locks/<stack>/<index>.txt (written by "
                       "`stackforge lock`); lint and build fail when that file is missing")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        from .urls import redact

        if not re.match(r"^(https?|file)://", value):
            raise ValueError(f"'{redact(value)}' is not an http(s):// or file:// URL")
        try:
            urlsplit(value).port
        except ValueError as exc:
            raise ValueError(f"'{redact(value)}' is not a valid URL: {exc}") from None
        return value.rstrip("/")


class Sdist(Strict):
    index: str = Field(description="name of the index that serves the sdist")
    name: str
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
    git: str | None = Field(None, description="git URL or local path of the upstream repository")
    tag: str | None = Field(None, description="the release tag; the commit must be the one it points to")
    commit: str | None = Field(None, description="full 40-hex commit id")
    sdist: Sdist | None = Field(None, description="a release sdist instead of git")
    patches: str | None = Field(None, description="patch overlay directory, relative to the repository root")

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


PROJECT_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
RESERVED_STAGES = {"base", "deps", "gate", "gate-readonly"}


class Kernel(Strict):
    upstream: str = Field(description="the upstream whose patched tree this step builds")
    env: dict[str, str] = Field(default_factory=dict,
                                description="environment of the build command; values may use {{ … }} like tags")
    run: str = Field(description="shell command run in the upstream tree; it writes wheels to /out/wheels")

    _run = field_validator("run")(classmethod(lambda cls, v: _one_line(v)))

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value):
        if isinstance(value, dict):
            for key, val in value.items():
                if not ENV_NAME.match(str(key)):
                    raise ValueError(f"'{key}' is not a valid environment variable name")
                if not isinstance(val, str):
                    raise ValueError(f"{key}: environment values must be strings; quote {val!r}")
        return value


class Package(Strict):
    version: str
    index: str = Field(description="the one index this package comes from")
    gate: Literal["exact", "prefix", "metadata"] = Field(
        "exact",
        description="exact: import, then installed version == pin; prefix: import, then the installed version's "
        "public part == the pin's (any local label); metadata: no import, version from package metadata",
    )
    import_: str | None = Field(None, alias="import", description="module to import (default: name with - → _)")
    sha256: list[str] = Field(default_factory=list, description="allowed wheel hashes; enables --require-hashes")

    _v = field_validator("version", mode="before")(classmethod(lambda cls, v: _exact_version(v)))

    @property
    def import_name(self) -> str:
        return self.import_ or ""


class GateImport(Strict):
    module: str
    dist: str | None = None


class Probe(Strict):
    name: str
    description: str = ""
    code: str = Field(description="Python run in the gate after the imports; it prints one result line")
    expect: str = Field(description="the exact line the code must print")


class Gate(Strict):
    prepare: list[str] = Field(
        default_factory=list,
        description="commands run in the gate stage before the checks; what they write stays in the image layer "
        "(e.g. files a package would otherwise create at import time)")
    imports: list[GateImport] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)

    _prepare = field_validator("prepare")(classmethod(lambda cls, v: [_one_line(c) for c in v]))
    read_only: bool = Field(True, description="re-run the imports with site-packages mounted read-only")
    abi: bool = Field(True, description="resolve every DT_NEEDED of the vendor packages' shared objects")
    library_path: list[str] = Field(
        default_factory=list,
        description="directories the loader searches for the ABI check, as the runtime would; {site} is "
        "site-packages")


class Train(Strict):
    name: str
    members: list[str] = Field(min_length=1)
    agree: list[Literal["post", "local", "release"]] = Field(default_factory=lambda: ["post", "local"])


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
    publish: str | None = Field(None, description="template of the publish reference (needs date and revision)")
    aliases: list[str] = Field(default_factory=list, description="moving tags updated after a verified publish")


class Target(Strict):
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)


class Stack(Strict):
    name: str
    description: str = ""
    inherits: str | None = Field(None, description="parent stack name (stacks/<name>.yaml)")
    nightly: bool = Field(False, description="built and published by `stackforge nightly`")
    source: str | None = Field(None, description="the upstream whose repository, commit and tag become the "
                               "image's org.opencontainers.image.{source,revision,version} (default: the first)")
    platform: Platform
    base: Base
    indexes: dict[str, Index]
    upstreams: dict[str, Upstream] = Field(default_factory=dict)
    kernels: dict[str, Kernel] = Field(default_factory=dict)
    packages: dict[str, Package]
    gate: Gate = Field(default_factory=Gate)
    rules: Rules = Field(default_factory=Rules)
    tags: Tags
    labels: dict[str, str] = Field(default_factory=dict)
    targets: dict[str, Target] = Field(default_factory=dict)

    # Filled by the loader: where each value came from, and the files read.
    _positions: dict = PrivateAttr(default_factory=dict)
    _keypositions: dict = PrivateAttr(default_factory=dict)
    _files: list = PrivateAttr(default_factory=list)
    _root: object = PrivateAttr(default=None)
    _overrides: list = PrivateAttr(default_factory=list)
    _credentials: dict = PrivateAttr(default_factory=dict)  # index name -> (user, password)
