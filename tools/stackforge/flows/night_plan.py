"""The night's plan: its units (stack × target × platform) grouped into shards a CI fans out, each shard with the
runner labels it needs, balanced by the durations the last nights recorded.

A *unit* is one image of the night: a stack, one of its published targets, and a platform (``linux/amd64`` from
``platform.arch: x86_64``, ``linux/arm64`` from ``aarch64``): a unit per platform line the stack declares and the
night can build (a line declared with values no record states is left out, as the one-process nightly leaves it out,
and the plan says so in ``not_buildable``), else one on the stack's platform. A unit of a stack of several lines
names its ``line``: its shard pushes the image by digest and the merge tags the index over every line. A unit *needs
a device* when a ``nightly: true`` recipe serves its image with devices and it is the stack's own line (the smoke
runs on the stack's own platform, where the shard runs: the shard's runner must have them).

Grouping, in order:

1. a *block* is one stack on one platform: its targets share their stages (base, dependency phases, kernels), so
   they stay on one host unless the night asks for more shards than it has blocks; a block needs a device when any
   of its units does;
2. blocks are grouped by the runner they need (platform, device); within each group, while there are fewer
   blocks than ``shards`` (the most shards one kind of runner takes), the block expected to take longest is split
   in two (its units packed into two halves by their durations);
3. the blocks are packed into at most ``shards`` shards, longest first, each into the shard with the least expected
   time (LPT), so the shards end at about the same time.

A unit's expected time is the median ``duration_s`` its rows had in the last :data:`NIGHTS_READ` nights under the
nights directory (``summary.json`` of each, read as ``stackforge history`` reads them); a unit no night recorded is
expected to take the median of the units that were (every unit alike when none were).

A shard's id is stable: its platform and the first 10 hex digits of the sha256 of its units' keys, so the same units
give the same id on every host and every night (``amd64-3fa81c2e07``, ``arm64-dev-…`` for a shard that needs a
device). Nothing here builds or asks a registry; recording the plan in the registry is ``publish/night.py``.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from stackforge import safeio
from stackforge.errors import UserError
from stackforge.flows.night_records import NightSummary

SCHEMA: Final = "stackforge.nightly-plan/v1"
#: how many of the newest nights the expected durations are read from
NIGHTS_READ = 7
#: a night's summary is read within this bound (as the history reads it)
MAX_SUMMARY = 16 << 20
#: platform of each ``platform.arch``, and the runner label of each platform's CPU (GitHub's names)
PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
ARCH_LABELS = {"linux/amd64": "x64", "linux/arm64": "arm64"}
#: the label a runner with the night's devices carries
DEVICE_LABEL = "device"
#: the most shards one kind of runner takes
MAX_SHARDS = 256

ShardId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(-dev)?-[0-9a-f]{10}$")]
Label = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")]
Platform = Literal["linux/amd64", "linux/arm64"]
StackName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
TargetName = Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127}|\*)$")]
LineName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]


class _Doc(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Unit(_Doc):
    """One image of the night."""

    stack: StackName
    target: TargetName  # ``*``: a stack that does not load (its row fails in the merge, naming why)
    platform: Platform
    device: bool = False
    estimate_s: float = Field(default=0.0, ge=0)
    #: the platform line (its name under ``platforms:``) when the stack's tag is one index of several lines, which the
    #: merge composes; None: the stack's one image, published under its tag by the shard
    line: LineName | None = None

    @property
    def key(self) -> str:
        return f"{self.stack}/{self.target}/{self.platform}"


class Shard(_Doc):
    """A group of units one runner builds: ``runs_on`` is every label that runner must carry."""

    id: ShardId
    platform: Platform
    device: bool
    labels: list[Label]
    runs_on: list[Label]
    estimate_s: float = Field(ge=0)
    units: list[Unit] = Field(min_length=1)


class Problem(_Doc):
    """A stack the plan could not read (its file does not load): the night reports it as a failed row."""

    stack: StackName
    reason: str


class Plan(_Doc):
    """The night's plan, as ``stackforge nightly --plan --json`` prints it and the registry keeps it."""

    schema_: Literal["stackforge.nightly-plan/v1"] = Field(alias="schema")
    date: Annotated[str, StringConstraints(pattern=r"^[0-9]{8}$")] | None = None
    shards: list[Shard]
    problems: list[Problem] = Field(default_factory=list)
    #: the nights the durations were read from (their dates, newest first)
    durations_from: list[str] = Field(default_factory=list)
    #: per stack, each platform line left out: declared, not buildable (what ``lint`` says of it)
    not_buildable: dict[StackName, list[str]] = Field(default_factory=dict)

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)

    def shard(self, shard_id: str) -> Shard:
        for s in self.shards:
            if s.id == shard_id:
                return s
        known = ", ".join(s.id for s in self.shards) or "none"
        raise UserError(
            f"the night's plan has no shard {shard_id!r} (its shards: {known})",
            file="--shard",
            fix="give an id of the plan `stackforge nightly --plan --registry R --date D` recorded for this night",
        )

    def units(self) -> list[tuple[Shard, Unit]]:
        return [(s, u) for s in self.shards for u in s.units]

    def to_json(self) -> dict[str, Any]:
        doc = self.model_dump(by_alias=True)
        doc["matrix"] = matrix(self)
        return doc


def matrix(plan: Plan) -> dict[str, Any]:
    """The CI's fan-out: GitHub's ``strategy.matrix`` (``include``: one entry per shard, its id, runner labels and
    a name a person reads)."""
    return {
        "include": [
            {"shard": s.id, "runs_on": list(s.runs_on), "name": title(s), "estimate_s": round(s.estimate_s)}
            for s in plan.shards
        ]
    }


#: the file of this repository the GitLab child pipeline's jobs extend (its hidden job ``.shard``)
GITLAB_SHARD_JOB = "docs/ci/gitlab-shard.yml"


def gitlab_pipeline(plan: Plan, include: str = GITLAB_SHARD_JOB) -> dict[str, Any]:
    """GitLab's fan-out: a child pipeline (JSON is YAML) with one job per shard, each extending ``.shard`` of
    ``include`` with the shard's runner tags and ``SHARD``; the night's ``DATE`` for every job."""
    doc: dict[str, Any] = {"include": [{"local": include}], "variables": {"DATE": plan.date or ""}}
    for s in plan.shards:
        doc[f"shard {s.id}"] = {"extends": ".shard", "tags": list(s.runs_on), "variables": {"SHARD": s.id}}
    return doc


def title(shard: Shard, limit: int = 80) -> str:
    """``example/escape, example/shell (linux/amd64)``: what a shard builds, for a CI job's name."""
    text = ", ".join(f"{u.stack}/{u.target}" for u in shard.units)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{text} ({shard.platform}{', device' if shard.device else ''})"


def platform_of(arch: str) -> str:
    return PLATFORMS.get(arch, f"linux/{arch}")


# --------------------------------------------------------------------------------------------------------------
# Expected durations


@dataclass
class Durations:
    """Each unit's recorded durations (seconds, newest night first) and the nights they came from."""

    #: (stack, target, platform) -> seconds; platform None: a row of a night written before rows named it
    by_unit: dict[tuple[str, str, str | None], list[float]] = field(default_factory=dict)
    nights: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    def estimate(self, stack: str, target: str, platform: str | None = None) -> float | None:
        """The median of the unit's rows on ``platform`` (an emulated line's build is no estimate of a native one's),
        with the rows that name no platform."""
        seen = self.by_unit.get((stack, target, platform), []) + (self.by_unit.get((stack, target, None), []) if platform else [])  # fmt: skip
        return float(statistics.median(seen)) if seen else None


def read_durations(nights: Path | None, newest: int = NIGHTS_READ, before: str | None = None) -> Durations:
    """The durations of every row of the ``newest`` nights under ``nights`` (those dated before ``before`` when it
    is given: a night's own plan never reads that night). A night whose summary cannot be read is named in
    ``unreadable`` and skipped."""
    out = Durations()
    if nights is None or not nights.is_dir():
        return out
    read: list[NightSummary] = []
    for path in sorted(nights.glob("*/summary.json")):
        if path.is_symlink() or path.parent.is_symlink():
            out.unreadable.append(f"{path}: a link")
            continue
        try:
            doc = safeio.load_model(NightSummary, path, what="nightly summary", limit=MAX_SUMMARY, root=nights)
        except UserError as err:
            out.unreadable.append(f"{path}: {err.message}")
            continue
        if before is None or doc.date < before:
            read.append(doc)
    read.sort(key=lambda d: (d.date, d.finished_at), reverse=True)
    for doc in read[:newest]:
        out.nights.append(doc.date)
        for row in doc.rows:
            if row.duration_s > 0 and row.target != "*":
                out.by_unit.setdefault((row.stack, row.target, row.platform), []).append(row.duration_s)
    return out


# --------------------------------------------------------------------------------------------------------------
# Grouping (pure)


@dataclass
class _Block:
    units: list[Unit]

    @property
    def seconds(self) -> float:
        return sum(u.estimate_s for u in self.units)

    @property
    def device(self) -> bool:
        return any(u.device for u in self.units)

    @property
    def key(self) -> str:
        return min(u.key for u in self.units)


def _halves(units: list[Unit]) -> tuple[list[Unit], list[Unit]]:
    """Two groups of ``units`` with about equal expected time (longest first, each to the lighter group)."""
    a: list[Unit] = []
    b: list[Unit] = []
    for u in sorted(units, key=lambda u: (-u.estimate_s, u.key)):
        (a if sum(x.estimate_s for x in a) <= sum(x.estimate_s for x in b) else b).append(u)
    return a, b


def pack(units: Iterable[Unit], shards: int | None) -> list[list[Unit]]:
    """``units`` of one kind of runner grouped into at most ``shards`` groups (None: one per stack), as the module
    says: a stack's units together unless there are more shards than stacks, then longest first into the group
    with the least expected time."""
    by_stack: dict[str, list[Unit]] = {}
    for u in units:
        by_stack.setdefault(u.stack, []).append(u)
    blocks = [_Block(sorted(us, key=lambda u: u.key)) for _, us in sorted(by_stack.items())]
    if not blocks:
        return []
    bins = len(blocks) if shards is None else max(1, shards)
    while len(blocks) < bins:
        splittable = [b for b in blocks if len(b.units) > 1]
        if not splittable:
            break
        big = max(splittable, key=lambda b: (b.seconds, len(b.units), b.key))
        blocks.remove(big)
        blocks += [_Block(half) for half in _halves(big.units)]
    groups: list[list[Unit]] = [[] for _ in range(min(bins, len(blocks)))]
    loads = [0.0] * len(groups)
    for block in sorted(blocks, key=lambda b: (-b.seconds, b.key)):
        i = min(range(len(groups)), key=lambda k: (loads[k], k))
        groups[i] += block.units
        loads[i] += block.seconds
    return [sorted(g, key=lambda u: u.key) for g in groups if g]


def shard_id(units: list[Unit], device: bool) -> str:
    """The stable id of a shard of ``units`` (see the module); ``device``: its runner needs the night's devices."""
    platform = units[0].platform
    arch = platform.rsplit("/", 1)[-1]
    keys = sorted(u.key for u in units)
    digest = hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:10]
    return f"{arch}{'-dev' if device else ''}-{digest}"


def labels_of(platform: str, device: bool) -> list[str]:
    """The runner labels a shard of ``platform`` needs: its OS and CPU (GitHub's label names), ``device`` when its
    smoke needs the night's devices."""
    os_name, _, _ = platform.partition("/")
    return [os_name, ARCH_LABELS.get(platform, platform.rsplit("/", 1)[-1])] + ([DEVICE_LABEL] if device else [])


def group(
    units: list[Unit], shards: int | None = None, runner_labels: Iterable[str] = (), date: str | None = None
) -> list[Shard]:
    """Every unit in exactly one shard: per kind of runner (platform, device), :func:`pack`'s groups; each shard with
    its labels, ``runs_on`` (``runner_labels`` first) and its expected time. A stack whose units need a device goes
    to a device runner whole (its targets share their stages)."""
    if shards is not None and not 1 <= shards <= MAX_SHARDS:
        raise UserError(f"--shards {shards}: give 1 to {MAX_SHARDS}", file="--shards")
    device_stacks = {(u.stack, u.platform) for u in units if u.device}
    kinds: dict[tuple[str, bool], list[Unit]] = {}
    for u in units:
        kinds.setdefault((u.platform, (u.stack, u.platform) in device_stacks), []).append(u)
    extra = list(dict.fromkeys(runner_labels))
    out = []
    for (platform, device), members in sorted(kinds.items()):
        for g in pack(members, shards):
            labels = labels_of(platform, device)
            out.append(
                Shard(
                    id=shard_id(g, device),
                    platform=platform,  # type: ignore[arg-type]
                    device=device,
                    labels=labels,
                    runs_on=[*extra, *(label for label in labels if label not in extra)],
                    estimate_s=round(sum(u.estimate_s for u in g), 1),
                    units=g,
                )
            )
    ids = [s.id for s in out]
    assert len(set(ids)) == len(ids), ids  # distinct unit sets hash apart
    return sorted(out, key=lambda s: (-s.estimate_s, s.id))


def estimate(units: list[Unit], durations: Durations) -> list[Unit]:
    """``units`` with their expected times (see the module)."""
    known = {u.key: t for u in units if (t := durations.estimate(u.stack, u.target, u.platform)) is not None}
    fallback = float(statistics.median(known.values())) if known else 1.0
    return [u.model_copy(update={"estimate_s": round(known.get(u.key, fallback), 1)}) for u in units]


@dataclass(frozen=True)
class PlanOptions:
    """``stackforge nightly --plan``'s choices: the stacks (None: every ``nightly: true`` stack) and targets (None:
    the published ones), the most shards per kind of runner (None: one per stack), the labels every runner carries
    (``--runner-label``), the nights the durations come from, and the night's date."""

    stacks: list[str] | None = None
    targets: list[str] | None = None
    shards: int | None = None
    runner_labels: tuple[str, ...] = ()
    nights: Path | None = None
    date: str | None = None


def make_plan(
    units: list[Unit],
    problems: list[Problem],
    options: PlanOptions,
    durations: Durations | None = None,
    not_buildable: dict[str, list[str]] | None = None,
) -> Plan:
    """The plan of ``units`` as ``options`` say (pure: ``durations`` as read; ``not_buildable``: the lines left out)."""
    for label in options.runner_labels:
        safeio.validate(Label, label, source="--runner-label", what="runner label")
    durations = durations or Durations()
    shards = group(estimate(units, durations), options.shards, options.runner_labels, options.date)
    return Plan(schema=SCHEMA, date=options.date, shards=shards, problems=problems, durations_from=durations.nights,
                not_buildable=dict(not_buildable or {}))  # fmt: skip


def units_of(
    loaded: Iterable[Any],
    targets_of: Callable[[Any], list[str]],
    needs_device: Callable[[str, str], bool],
    lines_of: Callable[[Any], list[Any]] = lambda stack: [stack],
) -> list[Unit]:
    """The units of the loaded stacks: each published target (``targets_of``) on each platform line the night builds
    of the stack (``lines_of``: ``flows/nightly.py`` :func:`lines_of`, each a resolved stack of its line; one: the
    stack itself). Only the stack's own line needs a device (its smoke runs there)."""
    out = []
    for stack in loaded:
        lines = lines_of(stack)
        for target in targets_of(stack):
            for line in lines:
                own = line.line is None or line.line.own
                out.append(Unit(stack=stack.name, target=target, platform=platform_of(line.model.platform.arch),  # type: ignore[arg-type]
                                device=own and needs_device(stack.name, target),
                                line=line.line.name if len(lines) > 1 and line.line is not None else None))  # fmt: skip
    return out


def lines_of_plan(plan: Plan) -> dict[tuple[str, str], list[Unit]]:
    """Each (stack, target) whose tag is one index of several platform lines, with its units (every shard's)."""
    out: dict[tuple[str, str], list[Unit]] = {}
    for _, unit in plan.units():
        if unit.line is not None:
            out.setdefault((unit.stack, unit.target), []).append(unit)
    return out
