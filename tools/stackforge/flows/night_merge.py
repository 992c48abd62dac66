"""``stackforge nightly --merge``: the night's verdict from what its shards reported to the registry.

The merge runs once every shard has run (the CI's last job), on any host with a checkout and the registry; it
builds nothing and pulls no image. In order:

1. the night's recorded plan (``<registry>/stackforge-nightly:<date>-plan``), and each shard's result
   (``…:<date>-<shard id>``, ``publish/night.py``): a row per unit of the plan, each row the one its shard reported;
   a shard that never reported gives each of its units a failed row at stage ``missing`` naming the shard, never a
   silent gap; a result that cannot be read, or that ran another plan of the night, a failed row at stage ``shard``;
   a stack the plan could not read, a failed row at stage ``load``;
2. per stack and target of several platform lines (the plan's units name their ``line``): once every line's unit
   passed — its image pushed by digest, with its record, by its shard — the OCI image index over every line's image
   (in the order the stack declares its lines) tagged under the night's immutable tag, as ``publish --platform all``
   tags it (``publish/platforms.py`` :func:`publish_index`: the same tag scheme and ``-rN`` rules, an index already
   published under a tag of the date found again), each child first checked to be the manifest its unit reported and
   to carry its publish record, which is then attached again naming the index's tag; each row's ``tag`` is the
   index's, its ``digest`` its own platform's image. A line that did not pass leaves no index: its row fails at its
   stage, every other line's row at stage ``publish`` naming it;
3. each published row checked in the registry (stage ``verify`` when it fails): its tag holds its digest (a line's:
   the index that lists it for its platform), the
   publish record attached to that digest describes it (the registry half of ``stackforge verify``:
   ``flows/operator.py`` :func:`registry_checks`; with ``--key`` the signed provenance too), and the night's row is
   attached to it by its shard;
4. the aliases, per stack: they move only when every row of the stack passed — every target and every platform,
   its smoke passed (collected from the shards, which ran it where their runner has the devices) and no
   vulnerability held it — so each ``-latest`` of a stack names one night's build of it; each alias is moved once,
   here, and only when its immutable tag is the newest (``publish/publisher.py`` :func:`advance_aliases`). A stack
   with a row that did not pass keeps every alias where it was, and each of its rows says why;
5. ``summary.json`` and ``summary.md`` in the night's directory, as the one-process nightly writes them (with each
   row's shard and platform, and the shards and the merge's own time), and each row's evidence bundle unpacked as
   ``<stack>-<target>/`` beside it, so ``stackforge history`` reads the night as any other.

The exit follows the verdict as ``stackforge nightly``'s does: 0 passed, 1 a row failed (a missing shard too), 3
none failed but some did not run.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge import safeio
from stackforge.builder.run.verify import Verification
from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, parse_registry, split_ref
from stackforge.errors import UserError
from stackforge.flows.night_plan import Plan, Shard, Unit, lines_of_plan
from stackforge.flows.night_shard import night_client, recorded_plan
from stackforge.flows.nightly import (
    NOT_RUN,
    Overrides,
    Row,
    Summary,
    _host_free,
    ci_run,
    counts_text,
    evidence_name,
    per_stack,
)
from stackforge.flows.operator import registry_checks
from stackforge.fslock import atomic_write
from stackforge.publish import night as nightreg
from stackforge.publish import platforms
from stackforge.publish import record as records
from stackforge.publish.publisher import PushLog, advance_aliases, default_lock_dir, repository_lock
from stackforge.publish.stack import alias_tags, destination
from stackforge.safeio import OutputDir
from stackforge.stack.load import load
from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.scheme import validate_date
from stackforge.urls import redact_text

if TYPE_CHECKING:
    pass

#: a published row's statuses (``not-run``: published, its smoke did not run)
PUBLISHED = ("published", "already-published", NOT_RUN)
#: a row whose image its shard pushed by digest, for the index the merge tags (a stack of several platform lines)
PUSHED = "pushed"


@dataclass(frozen=True)
class MergeOptions:
    """``--merge``'s choices: the night (``date``), where its summary goes (``out``, default
    ``build/nightly/<date>``), the registry's retry policy, the public key the provenance must be signed with
    (``key``), the ``--set`` values the stacks were loaded with (for their tags and aliases)."""

    date: str | None = None
    out: Path | None = None
    policy: RetryPolicy | None = None
    key: Path | None = None
    overrides: Overrides = None
    echo: Callable[[str], None] = print
    lock_dir: Path | None = None


@dataclass
class _Night:
    summary: Summary
    plan: Plan
    plan_digest: str
    outdir: Path
    options: MergeOptions
    taken: dict[str, tuple[str, ...]] = field(default_factory=dict)
    starts: list[float] = field(default_factory=list)
    #: (stack, target) -> the digest of the index the merge tagged over its platform lines
    indexes: dict[tuple[str, str], str] = field(default_factory=dict)


def merge(root: Path, registry: str, options: MergeOptions | None = None) -> Summary:
    """The night's summary from its shards' results (see the module)."""
    options = options or MergeOptions()
    t0, started = time.monotonic(), _now()
    parse_registry(registry, what="--registry")
    date = validate_date(options.date)
    outdir = options.out or root / "build" / "nightly" / date
    inputs = [root / d for d in ("stacks", "patches", "overlays", "recipes")]
    OutputDir(outdir, "nightly").claim(inputs, legacy=("summary.json", "summary.md"))
    client = night_client(registry, options.policy)
    plan, plan_digest = recorded_plan(client, date)
    summary = Summary(date=date, registry=registry, started_at=started, directory=outdir, ci=ci_run(os.environ))
    night = _Night(summary, plan, plan_digest, outdir, options)
    for shard in plan.shards:
        _collect(night, client, shard)
    for problem in plan.problems:
        summary.rows.append(Row(stack=problem.stack, target="*", status="failed", stage="load", reason=problem.reason))
    summary.not_buildable = {name: list(notes) for name, notes in plan.not_buildable.items()}
    _indexes(night, root)
    for row in summary.rows:
        if row.digest and row.status in PUBLISHED:
            _verify(night, row)
    _aliases(night, root)
    summary.overrides = _common([r.overrides for r in summary.rows if r.stage != "missing"])
    took = round(time.monotonic() - t0, 2)
    summary.merge = {"started_at": started, "duration_s": took}
    summary.finished_at = _now()
    first = min(night.starts, default=None)
    summary.started_at = _iso(first) if first is not None else started
    summary.duration_s = round(max(time.time() - first, took), 1) if first is not None else took
    text = _host_free(json.dumps(summary.to_json(), indent=2) + "\n", outdir, root)
    atomic_write(outdir / "summary.json", text)
    atomic_write(outdir / "summary.md", summary.markdown())
    options.echo(
        f"nightly: merge: {counts_text(summary.counts()['images'])} in {took} s; summary {outdir / 'summary.md'}"
    )
    return summary


def _collect(night: _Night, client: RegistryClient, shard: Shard) -> None:
    """The rows of ``shard``'s units from its result (a failed row per unit when there is none to read)."""
    summary, date, echo = night.summary, night.summary.date, night.options.echo
    where = f"{client.repository}:{nightreg.shard_tag(date, shard.id)}"
    info: dict[str, Any] = {"labels": list(shard.runs_on), "units": len(shard.units), "rows": len(shard.units)}
    summary.shards[shard.id] = info
    try:
        reported = nightreg.fetch_shard(client, date, shard.id)
    except (RegistryError, UserError) as exc:
        why = nightreg.registry_error(exc, f"the result of shard {shard.id} ({where}) cannot be read")
        info.update(status="unreadable", reason=why)
        _failed(summary, shard, "shard", why)
        return
    if reported is None:
        why = f"shard {shard.id} never reported: {where} does not exist (its runner did not finish, or did not reach the registry)"  # fmt: skip
        info.update(status="missing", reason=why)
        echo(f"nightly: merge: shard {shard.id} is missing")
        _failed(summary, shard, "missing", why)
        return
    result = reported.result
    if reported.plan_digest != night.plan_digest:
        why = f"shard {shard.id} reported for another plan of the night ({reported.plan_digest}, not {night.plan_digest})"  # fmt: skip
        info.update(status="stale", reason=why)
        _failed(summary, shard, "shard", why)
        return
    info.update(status="reported", started_at=result.started_at, finished_at=result.finished_at,
                duration_s=result.duration_s, result=reported.manifest_digest)  # fmt: skip
    if result.ci.get("run_url"):
        info["run_url"] = result.ci["run_url"]
    if result.bake:
        summary.bake.setdefault("shards", {})[shard.id] = result.bake
    for name, data in result.freshness.items():
        if isinstance(data, dict):
            summary.freshness.setdefault(name, data)
    for name, data in result.drift.items():
        if isinstance(data, dict):
            summary.drift.setdefault(name, data)
    start = _parse(result.started_at)
    if start is not None:
        night.starts.append(start)
    rows = {(r.stack, r.target): r for r in result.rows}
    for unit in shard.units:
        got = rows.pop((unit.stack, unit.target), None)
        if got is None:
            row = Row(stack=unit.stack, target=unit.target, status="failed", stage="shard",
                      reason=f"shard {shard.id} reported no row for {unit.key}", shard=shard.id, platform=unit.platform)  # fmt: skip
        else:
            row = _row(got, shard, unit)
            _evidence(night, client, reported, unit, row)
        summary.rows.append(row)
    for extra in rows.values():  # rows of no unit (a recipe that does not load): once for the night
        if not any((r.stack, r.target) == (extra.stack, extra.target) for r in summary.rows):
            summary.rows.append(_row(extra, shard, None))


def _row(got: nightreg.Row, shard: Shard, unit: Unit | None) -> Row:
    data = got.model_dump(mode="json")
    keep = {k: data[k] for k in Row.__dataclass_fields__ if k in data}
    row = Row(**keep)
    row.shard, row.platform = shard.id, unit.platform if unit else row.platform
    row.aliases = {}  # a shard moves none; what the merge does with them is said below
    return row


def _failed(summary: Summary, shard: Shard, stage: str, why: str) -> None:
    for unit in shard.units:
        summary.rows.append(Row(stack=unit.stack, target=unit.target, status="failed", stage=stage, reason=why,
                                shard=shard.id, platform=unit.platform))  # fmt: skip


def _evidence(night: _Night, client: RegistryClient, reported: nightreg.Reported, unit: Unit, row: Row) -> None:
    """The row's evidence bundle unpacked as ``<stack>-<target>/`` of the night (``…@<line>`` for another platform
    line than the stack's own; the history reads it there)."""
    reported_name, row.evidence = row.evidence, None
    layer = reported.evidence.get(unit.key)
    if layer is None:
        return
    # another line than the stack's own is named as the one-process nightly names it (its shard's name says which)
    line = f"@{unit.line}" if unit.line is not None and (reported_name or "").endswith(f"@{unit.line}") else ""
    name = evidence_name(unit.stack, unit.target, night.taken, line)
    source = f"{client.repository}@{layer['digest']} (evidence of {unit.key})"
    try:
        data = nightreg.fetch_evidence(client, layer)
        dest = safeio.confined(night.outdir, name, what="evidence directory")
        if dest.is_dir() and not dest.is_symlink():
            import shutil

            shutil.rmtree(dest)
        nightreg.unpack_evidence(data, dest, source)
        row.evidence = name
    except (RegistryError, UserError) as exc:
        night.options.echo(f"nightly: merge: {nightreg.registry_error(exc, f'the evidence of {unit.key} is not kept')}")


def _verify(night: _Night, row: Row) -> None:
    """The registry's word on a published row: its tag holds its digest, the record attached describes it, its
    shard attached the row (stage ``verify`` when any is not so)."""
    assert row.digest and row.tag
    index = night.indexes.get((row.stack, row.target))
    try:
        repo, tag = split_ref(row.tag)
        client = RegistryClient(repo, policy=night.options.policy or RetryPolicy())
        held = client.head_manifest(tag)
        if held is None or held.digest != (index or row.digest):
            _unverified(row, f"{row.tag} holds {held.digest if held else 'nothing'}, not {index or row.digest}")
            return
        if index is not None and not _lists(client, index, row):
            _unverified(row, f"the index {index} under {row.tag} does not list {row.digest} for {row.platform}")
            return
        v = Verification(row.tag, row.stack)
        on = (index, str(row.platform)) if index is not None else None
        rec = registry_checks(v, client, row.digest, row.tag, night.options.key, index=on)
        failed = [line for ok, line in _lines(v) if not ok]
        if rec is None or failed:
            _unverified(row, "; ".join(failed) or "its publish record does not describe it")
            return
        if (rec.stack, rec.target) != (row.stack, row.target):
            _unverified(row, f"the publish record of {row.digest} is of {rec.stack}/{rec.target}")
            return
        attached = nightreg.fetch_rows(client, row.digest)
        mine = [a for a in attached if a.get("night") == night.summary.date and a.get("shard") == row.shard
                and (a.get("stack"), a.get("target"), a.get("digest")) == (row.stack, row.target, row.digest)]  # fmt: skip
        if not mine:
            _unverified(row, f"shard {row.shard} attached no row of night {night.summary.date} to {row.digest}")
    except (RegistryError, UserError) as exc:
        _unverified(row, nightreg.registry_error(exc, "the registry could not be asked"))


# --------------------------------------------------------------------------------------------------------------
# A stack of several platform lines: one index under its tag


def _indexes(night: _Night, root: Path) -> None:
    """Each (stack, target) of several platform lines: the index over every line's image, tagged once every line's
    unit passed, else every row says why there is none (see the module, step 2)."""
    summary, options = night.summary, night.options
    for_stack = per_stack(options.overrides)
    for (stack, target), units in lines_of_plan(night.plan).items():
        wanted = {u.platform for u in units}
        rows = [r for r in summary.rows if (r.stack, r.target) == (stack, target) and r.platform in wanted]
        failed = [r for r in rows if not (r.digest and r.stage in (None, "smoke"))]
        if failed or len(rows) != len(units):
            why = ", ".join(f"{r.platform} failed ({r.stage})" for r in failed) or "a line reported no row"
            for r in rows:
                if r not in failed:
                    r.status, r.stage = "failed", "publish"
                    r.reason = f"not published: {why}; the stack's tag is one index of every platform line"
                    r.tag = None
            options.echo(f"nightly: merge: {stack}/{target}: no index: {why}")
            continue
        try:
            loaded = ResolvedStack.of(load(stack, root=root, overrides=for_stack(stack)))
            _, repository, scheme, _, _ = destination(loaded, summary.registry, summary.date, target)
            client = RegistryClient(repository, policy=options.policy or RetryPolicy())
            order = [ln.line.oci for ln in loaded.platform_lines().values() if ln.line is not None]
            rows.sort(key=lambda r: order.index(r.platform) if r.platform in order else len(order))
            children = [_child(client, r) for r in rows]
            lock = options.lock_dir or default_lock_dir()
            index = platforms.publish_index(
                children, client, scheme, summary.date, lock_dir=lock, log=PushLog(echo=None),
                description=f"{stack}/{target} for {', '.join(c.platform for c in children)}",
            )  # fmt: skip
        except (RegistryError, UserError) as exc:
            why = nightreg.registry_error(exc, f"the index of {stack}/{target} was not published")
            for r in rows:
                r.status, r.stage, r.reason, r.tag = "failed", "publish", why, None
            options.echo(f"nightly: merge: {why}")
            continue
        night.indexes[(stack, target)] = index.digest
        options.echo(f"nightly: merge: {stack}/{target}: {index.status} {index.reference} ({index.digest})")
        for r in rows:
            r.tag = index.reference
            if r.status == PUSHED:
                r.status = index.status
            _name_the_tag(night, client, r, index)


def _child(client: RegistryClient, row: Row) -> platforms.Child:
    """The index's entry of ``row``'s image: the manifest its shard reported, read back by digest (its bytes are that
    digest), with the publish record its shard attached describing it."""
    assert row.digest and row.platform
    got = client.get_manifest(row.digest)
    if got is None or got.digest != row.digest:
        raise UserError(f"{client.repository}@{row.digest} ({row.platform}, pushed by shard {row.shard}) is not in the registry")  # fmt: skip
    media = got.media_type or str(got.json().get("mediaType") or "")
    try:
        found = records.fetch(client, row.digest)
    except ValueError as exc:
        raise UserError(f"the publish record of {client.repository}@{row.digest} cannot be read: {exc}") from None
    rec = found.parsed() if found is not None else None
    if rec is None or (rec.stack, rec.target, rec.digest) != (row.stack, row.target, row.digest):
        raise UserError(f"{client.repository}@{row.digest} ({row.platform}) carries no publish record of {row.stack}/{row.target}")  # fmt: skip
    return platforms.Child(row.platform, row.digest, len(got.body), media)


def _name_the_tag(night: _Night, client: RegistryClient, row: Row, index: Any) -> None:
    """The line's publish record attached again naming the index's tag (the newest record is the one ``verify``
    reads), and ``publish.json`` of the row's evidence saying where the image is published, as ``publish --platform
    all`` leaves them."""
    assert row.digest
    try:
        found = records.fetch(client, row.digest)
        if found is not None:
            rec = found.parsed()
            if index.tag not in rec.tags:
                named = rec.model_copy(update={"tags": [index.tag, *rec.tags]})
                records.attach(client, named, records.subject_of(client, row.digest))
    except (RegistryError, UserError, ValueError) as exc:
        err = exc if isinstance(exc, RegistryError | UserError) else UserError(str(exc))
        night.options.echo(f"nightly: merge: {nightreg.registry_error(err, f'the record of {row.digest} does not name {index.reference}')}")  # fmt: skip
    if not row.evidence:
        return
    path = night.outdir / row.evidence / "publish.json"
    try:
        doc = safeio.read_json(
            path, what="publish record", limit=records.EVIDENCE_LIMIT, root=night.outdir / row.evidence
        )
    except UserError:
        return
    if isinstance(doc, dict):
        doc.update(status=index.status, tag=index.tag, reference=index.reference,
                   index={"digest": index.digest, "reference": index.reference})  # fmt: skip
        atomic_write(path, json.dumps(doc, indent=2) + "\n")


def _lists(client: RegistryClient, index: str, row: Row) -> bool:
    """Whether the index ``index`` lists ``row``'s digest for its platform."""
    got = client.get_manifest(index)
    doc = got.json() if got is not None else {}
    for d in doc.get("manifests") or []:
        p = d.get("platform") if isinstance(d, dict) else None
        if (
            isinstance(p, dict)
            and d.get("digest") == row.digest
            and f"{p.get('os')}/{p.get('architecture')}" == row.platform
        ):
            return True
    return False


def _lines(v: Verification) -> list[tuple[bool, str]]:
    """Each line of ``v`` with whether it passed (``FAIL`` lines did not)."""
    return [(not line.startswith("FAIL"), line.removeprefix("FAIL ").strip()) for line in v.lines]


def _unverified(row: Row, why: str) -> None:
    row.status, row.stage = "failed", "verify"
    row.reason = f"published {row.tag}, but the registry does not confirm it: {redact_text(why)[:600]}"


def _held(rows: list[Row]) -> str | None:
    """Why a stack's aliases stay where they are (None: every row passed)."""
    bad = [r for r in rows if not r.ok]
    if bad:
        named = ", ".join(f"{r.target}{'@' + r.platform if r.platform else ''} {r.status} ({r.stage})" for r in bad[:4])
        return f"{len(bad)} of {len(rows)} rows of the stack did not pass: {named}"
    blocked = [r for r in rows if isinstance(r.scan, dict) and r.scan.get("verdict") == "blocked"]
    if blocked:
        ids = sorted({i for r in blocked for i in (r.scan or {}).get("blocked") or []})
        return f"{len(ids)} known vulnerabilities at or above {(blocked[0].scan or {}).get('fail_on')} ({', '.join(ids[:6])})"
    return None


def _aliases(night: _Night, root: Path) -> None:
    """Each stack's aliases moved when every row of it passed, else each row says why they stayed (see the module)."""
    summary, options = night.summary, night.options
    by_stack: dict[str, list[Row]] = {}
    for row in summary.rows:
        if row.target != "*" and row.stack != "recipes":
            by_stack.setdefault(row.stack, []).append(row)
    for_stack = per_stack(options.overrides)
    log = PushLog(echo=None)
    for name, rows in by_stack.items():
        why = _held(rows)
        if why is not None:
            for row in rows:
                row.aliases = {"*": f"not moved: {why}"}
            options.echo(f"nightly: merge: {name}: aliases not moved: {why}")
            continue
        try:
            loaded = ResolvedStack.of(load(name, root=root, overrides=for_stack(name)))
        except UserError as err:
            for row in rows:
                row.aliases = {"*": f"not moved: the stack does not load here: {err.message}"}
            continue
        moved: dict[tuple[str, str], dict[str, str]] = {}  # an index's aliases move once for every line's row
        for row in rows:
            key = (row.stack, row.target)
            if key not in moved:
                moved[key] = _move(loaded, row, summary, options, log, night.indexes.get(key))
            row.aliases = dict(moved[key])


def _move(
    loaded: ResolvedStack, row: Row, summary: Summary, options: MergeOptions, log: PushLog, index: str | None = None
) -> dict[str, str]:
    """Move the aliases of ``row``'s target to what its tag holds: its digest, or ``index`` (its lines' index)."""
    assert row.tag and row.digest
    expected = index or row.digest
    try:
        _, repository, scheme, first, suffix = destination(loaded, summary.registry, summary.date, row.target)
        aliases = alias_tags(loaded, summary.registry, first, suffix)
        if not aliases:
            return {}
        repo, tag = split_ref(row.tag)
        if str(repo) != str(repository):
            return {"*": f"not moved: {row.tag} is not in the stack's repository {repository}"}
        client = RegistryClient(repository, policy=options.policy or RetryPolicy())
        manifest = client.get_manifest(tag)
        if manifest is None or manifest.digest != expected:
            return {"*": f"not moved: {row.tag} no longer holds {expected}"}
        lock = options.lock_dir or default_lock_dir()
        with repository_lock(repository, lock, timeout=600.0, log=log):
            media = manifest.media_type or json.loads(manifest.body).get("mediaType") or ""
            moved = advance_aliases(client, scheme, tag, manifest.body, media, expected, aliases, log)
        options.echo(f"nightly: merge: {row.stack}/{row.target}: aliases {moved}")
        return moved
    except (RegistryError, UserError) as exc:
        return {"*": f"not moved: {nightreg.registry_error(exc, 'the registry refused')}"}


def _common(lists: list[list[str]]) -> list[str]:
    return [o for o in lists[0] if all(o in other for other in lists[1:])] if lists else []


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str) -> float | None:
    try:
        return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc).timestamp()
    except ValueError:
        return None


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
