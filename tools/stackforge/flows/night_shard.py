"""A sharded night, its first two parts: the plan (``stackforge nightly --plan``) and one shard (``--shard ID``).

:func:`plan_night` reads the stacks and the last nights' durations and groups the night's units into shards
(``night_plan.py``); :func:`record_plan` keeps the plan in the registry under the night's date, once
(``publish/night.py``), so every shard and the merge read the same units under the same ids.

:func:`run_shard` is the nightly of one shard's units: it reads the night's recorded plan from the registry, then
lints, bakes, builds, gates, tests, signs, scans and publishes its units exactly as ``stackforge nightly`` does
(``flows/nightly.py``), under the night's immutable tags and never an alias (the merge moves the aliases, once, for
the whole night) — a unit of a stack of several platform lines (its ``line``) is built on its platform and pushed by
digest with its record, signature and SBOM, untagged, for the merge to tag the index over every line; it smokes each
image whose recipes need this runner's devices, and reports:

- every row of its units, their bake, freshness and drift, and each row's evidence bundle, under the tag
  ``<date>-<shard id>`` of the night's repository (``<registry>/stackforge-nightly``), whatever happened: a shard
  that published nothing (a failed preflight, lint or build) is found by the night and its id;
- each published row attached to its image (``subject`` the image manifest), in the image's own repository.

Its builds share one cache through the registry: each imports the cache of the images this night has already
published for its stacks (any shard's, read from the repository's tags of the date) before the ones given with
``--registry-cache``/``--cache-from``, and exports its own inline (unless ``--cache-to REF`` says where), so a
shard that runs after another re-runs none of the stages they share. Re-running a shard is idempotent: a unit whose
image the night already published under a tag (the same image: its config digest) is found under that tag, never
published again under a new ``-rN``.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stackforge import safeio
from stackforge.builder.run import bake as bakemod
from stackforge.builder.run.regcache import INLINE, RegistryCache
from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, parse_registry, split_ref
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.flows import night_plan
from stackforge.flows.night_plan import Plan, PlanOptions, Problem, Shard
from stackforge.flows.nightly import (
    NightlyOptions,
    Overrides,
    Row,
    Summary,
    _host_free,
    _nightly_as_declared,
    lines_of,
    nightly,
    not_buildable,
    per_stack,
)
from stackforge.flows.nightly_smoke import nightly_recipes
from stackforge.publish import night as nightreg
from stackforge.publish.stack import destination
from stackforge.signals import Interrupted
from stackforge.stack.load import load
from stackforge.stack.names import list_stacks
from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.scheme import validate_date

# --------------------------------------------------------------------------------------------------------------
# The plan


def plan_night(
    root: Path, options: PlanOptions, overrides: Overrides = None, echo: Callable[[str], None] = lambda line: None
) -> Plan:
    """The night's plan for the repository at ``root`` (see ``night_plan.py``): its ``nightly: true`` stacks (or
    ``options.stacks``) loaded with their ``--set`` values, each published target (or ``options.targets``) a unit;
    a stack that does not load is a problem of the plan, which the merge reports as a failed row."""
    for_stack = per_stack(overrides)
    loaded: list[ResolvedStack] = []
    problems: list[Problem] = []
    for name in options.stacks or list_stacks(root):
        try:
            read = load(name, root=root, overrides=for_stack(name))
            if not (options.stacks or read.model.nightly):
                continue
            one = ResolvedStack.of(read)
        except UserError as err:
            if not options.stacks and not _nightly_as_declared(root, name):
                continue
            problems.append(Problem(stack=name, reason=err.render()))
            continue
        loaded.append(one)
    recipes = nightly_recipes(root)

    def needs_device(stack: str, target: str) -> bool:
        return any(r.model.hardware.devices != "none" and r.model.hardware.count > 0 for r in recipes.of(stack, target))

    def targets_of(stack: ResolvedStack) -> list[str]:
        try:
            return bakemod.stack_targets(stack, options.targets)
        except UserError as err:
            problems.append(Problem(stack=stack.name, reason=err.render()))
            return []

    units = night_plan.units_of(loaded, targets_of, needs_device, lines_of)
    left_out = {stack.name: notes for stack in loaded if (notes := not_buildable(stack))}
    for name, notes in left_out.items():
        echo(f"nightly: plan: {name}: not built: {'; '.join(notes)}")
    if not units and not problems:
        raise UserError(
            f"no nightly stacks in {root / 'stacks'}",
            fix="mark stacks with `nightly: true`, or name them: stackforge nightly --plan STACK…",
        )
    durations = night_plan.read_durations(options.nights, before=options.date)
    for problem in durations.unreadable:
        echo(f"nightly: plan: a night's durations are not read: {problem}")
    return night_plan.make_plan(units, problems, options, durations, left_out)


def night_client(registry: str, policy: RetryPolicy | None) -> RegistryClient:
    """A client of the night's repository (``<registry>/stackforge-nightly``)."""
    return RegistryClient(nightreg.night_repository(parse_registry(registry, what="--registry")), policy=policy or RetryPolicy())  # fmt: skip


def record_plan(plan: Plan, registry: str, policy: RetryPolicy | None = None) -> tuple[Plan, str, bool]:
    """Keep ``plan`` as the night's plan in the registry unless the night has one: (the night's plan, its manifest
    digest, whether this call recorded it)."""
    assert plan.date is not None
    client = night_client(registry, policy)
    try:
        doc, digest, recorded = nightreg.record_plan(client, plan.date, plan.model_dump(by_alias=True, mode="json"))
    except RegistryError as exc:
        raise UserError(
            f"the night's plan cannot be recorded in {client.repository}: {exc}",
            fix="check --registry and that the push credential (STACKFORGE_REGISTRY_USER/_PASSWORD) may write there",
        ) from None
    return _valid_plan(doc, f"{client.repository}:{nightreg.plan_tag(plan.date)}"), digest, recorded


def recorded_plan(client: RegistryClient, date: str) -> tuple[Plan, str]:
    """The night's recorded plan and its manifest digest; a :class:`UserError` when the night has none."""
    try:
        found = nightreg.fetch_plan(client, date)
    except RegistryError as exc:
        raise UserError(f"the plan of night {date} cannot be read from {client.repository}: {exc}",
                        fix="check --registry and that the registry answers") from None  # fmt: skip
    if found is None:
        raise UserError(
            f"no plan of night {date} in {client.repository}",
            fix=f"record it first: stackforge nightly --plan --registry R --date {date} (the CI's plan job)",
        )
    doc, digest = found
    return _valid_plan(doc, f"{client.repository}:{nightreg.plan_tag(date)}"), digest


def _valid_plan(doc: Any, source: str) -> Plan:
    return safeio.validate(Plan, doc, source=source, what="nightly plan")


# --------------------------------------------------------------------------------------------------------------
# One shard


@dataclass
class ShardRun:
    """What a shard did: its summary (every row of its units), the manifest its result went to (None: it could not
    report), and why not."""

    summary: Summary
    shard: Shard
    reported: str | None
    problem: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.reported is None else self.summary.exit_code


def shard_cache(
    given: RegistryCache | None,
    loaded: list[ResolvedStack],
    registry: str,
    date: str,
    policy: RetryPolicy | None,
    echo: Callable[[str], None],
) -> RegistryCache:
    """The cache of a shard's builds: the night's published images of its stacks first, then ``given``'s imports;
    exported as ``given`` says, else inline (so the images this shard publishes carry it to the next)."""
    night: list[str] = []
    for stack in loaded:
        try:
            names = bakemod.stack_targets(stack, None)
        except UserError:
            continue
        tags_of: dict[str, list[str]] = {}
        for target in names:
            try:
                _, repository, scheme, _, _ = destination(stack, registry, date, target)
                if str(repository) not in tags_of:
                    tags_of[str(repository)] = RegistryClient(repository, policy=policy or RetryPolicy()).list_tags()
            except (UserError, RegistryError):
                continue
            revisions = scheme.revisions(tags_of[str(repository)], date)
            if revisions:
                night.append(repository.ref(revisions[max(revisions)]))
    if night:
        echo(f"nightly: shard: cache from tonight's images: {', '.join(night)}")
    imports = tuple(dict.fromkeys([*night, *(given.imports if given else ())]))
    return RegistryCache(imports, given.export if given and given.export else INLINE)


def _unit_rows(summary: Summary, shard: Shard) -> tuple[list[Row], list[Row]]:
    """(one row per unit of ``shard``, in its order; the summary's rows of no unit, e.g. a recipe that does not load):
    a stack's ``*`` row (it did not load or lint, or its targets are not what the plan says) stands for each of its
    units; a unit no row names is a failed row saying so."""
    by_key = {(r.stack, r.target): r for r in summary.rows}
    stars = {r.stack: r for r in summary.rows if r.target == "*"}
    units, used = [], set()
    for unit in shard.units:
        row = by_key.get((unit.stack, unit.target))
        if row is None and unit.stack in stars:
            row = replace(stars[unit.stack], target=unit.target)
            used.add((unit.stack, "*"))
        elif row is None:
            row = Row(stack=unit.stack, target=unit.target, status="failed", stage="build",
                      reason=f"the shard built no {unit.stack}/{unit.target}: the stack does not publish that target")  # fmt: skip
        used.add((unit.stack, unit.target))
        units.append(replace(row, shard=shard.id, platform=unit.platform))
    rest = [replace(r, shard=shard.id) for r in summary.rows if (r.stack, r.target) not in used]
    return units, rest


def run_shard(
    root: Path,
    registry: str,
    shard_id: str,
    options: NightlyOptions | None = None,
    *,
    workspace: Workspace | None = None,
) -> ShardRun:
    """Build, gate, test, sign, scan, publish and smoke the units of shard ``shard_id`` of the night's recorded plan,
    then report (see the module). ``options`` as for :func:`nightly` (its stacks, targets and aliases are the
    shard's)."""
    options = options or NightlyOptions()
    echo = options.echo
    date = validate_date(options.date)
    client = night_client(registry, options.publish.policy)
    plan, plan_digest = recorded_plan(client, date)
    shard = plan.shard(shard_id)
    try:
        client.check_push()
    except RegistryError as exc:
        raise UserError(
            f"shard {shard_id} could not report to {client.repository}: {exc}; nothing was built",
            fix="check that the push credential (STACKFORGE_REGISTRY_USER/_PASSWORD) may write there",
        ) from None
    units: dict[str, list[str]] = {}
    lines: dict[str, str] = {}  # a stack of several lines: the one this shard builds (a shard is of one platform)
    for unit in shard.units:
        if unit.target != "*":
            units.setdefault(unit.stack, []).append(unit.target)
        if unit.line is not None:
            lines[unit.stack] = unit.line
    stacks = sorted({u.stack for u in shard.units})
    outdir = options.out or root / "build" / "shards" / date / shard_id
    for_stack = per_stack(options.overrides)
    loaded = []
    for name in stacks:
        try:
            loaded.append(ResolvedStack.of(load(name, root=root, overrides=for_stack(name))))
        except UserError:
            pass  # its row says why (the nightly loads it again)
    cache = shard_cache(options.cache, loaded, registry, date, options.publish.policy, echo)
    echo(f"nightly: shard {shard_id} of night {date}: {night_plan.title(shard, 400)}")
    mine = replace(options, date=date, stacks=stacks, units=units, move_aliases=False, out=outdir, cache=cache,
                   every_platform=False, lines=lines)  # fmt: skip
    started, t0 = _now(), time.monotonic()
    try:
        summary = nightly(root, registry, mine, workspace=workspace)
    except Interrupted as intr:
        summary = Summary(date=date, registry=registry, started_at=started, directory=outdir)
        summary.rows = [Row(stack=u.stack, target=u.target, status="interrupted", stage="build",
                            reason=f"shard {shard_id} was interrupted by {intr.name}") for u in shard.units]  # fmt: skip
        _report(root, client, summary, shard, plan_digest, started, t0, outdir, echo)
        raise
    return _report(root, client, summary, shard, plan_digest, started, t0, outdir, echo)


def _portable(doc: dict[str, Any], outdir: Path, root: Path) -> dict[str, Any]:
    """A row without this host's directories (as the summary file has it: it travels to the merge's host)."""
    return json.loads(_host_free(json.dumps(doc), outdir, root))


def _shard_row(row: Row, outdir: Path, root: Path) -> nightreg.Row:
    return safeio.validate(nightreg.Row, _portable(row.to_json(), outdir, root), source="shard row", what="shard row")


def _report(
    root: Path,
    client: RegistryClient,
    summary: Summary,
    shard: Shard,
    plan_digest: str,
    started: str,
    t0: float,
    outdir: Path,
    echo: Callable[[str], None],
) -> ShardRun:
    """Attach each published row to its image and write the shard's result under its tag of the night."""
    rows, rest = _unit_rows(summary, shard)
    summary.rows = rows + rest
    problems = []
    for row in rows:
        if row.digest and (row.tag or row.pushed):
            try:
                repo, _ = split_ref(row.tag or row.pushed or "")
                image = RegistryClient(repo, policy=client.policy)
                doc = {**_portable(row.to_json(), outdir, root), "night": summary.date}
                nightreg.attach_row(image, row.digest, doc, summary.date, shard.id)
            except (RegistryError, UserError) as exc:
                problems.append(nightreg.registry_error(exc, f"the row of {row.stack}/{row.target} was not attached to {row.digest}"))  # fmt: skip
    evidence: dict[str, bytes] = {}
    for row, unit in zip(rows, shard.units, strict=True):
        where = outdir / row.evidence if row.evidence else None
        if where is not None and where.is_dir() and not where.is_symlink():
            evidence[unit.key], left_out = nightreg.pack_evidence(where)
            if left_out:
                echo(f"nightly: shard: {unit.key}: evidence not sent: {', '.join(left_out[:10])}")
    result = nightreg.ShardResult(
        schema="stackforge.nightly-shard/v1",
        date=summary.date,
        shard=shard.id,
        plan=plan_digest,
        started_at=started,
        finished_at=_now(),
        duration_s=round(time.monotonic() - t0, 1),
        rows=[_shard_row(r, outdir, root) for r in summary.rows],
        bake=json.loads(json.dumps(summary.bake)),
        freshness=json.loads(json.dumps(summary.freshness)),
        drift=json.loads(json.dumps(summary.drift)),
        ci=dict(summary.ci),
        overrides=list(summary.overrides),
    )
    reported: str | None = None
    try:
        subject = nightreg.plan_subject(client, plan_digest)
        reported = nightreg.report_shard(client, result, subject, evidence)
        echo(f"nightly: shard {shard.id}: reported to {client.repository}:{nightreg.shard_tag(summary.date, shard.id)}")
    except (RegistryError, UserError) as exc:
        problems.append(nightreg.registry_error(exc, f"shard {shard.id} could not report to {client.repository}"))
    for problem in problems:
        echo(f"nightly: shard {shard.id}: {problem}")
    return ShardRun(summary, shard, reported, "; ".join(problems) or None)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
