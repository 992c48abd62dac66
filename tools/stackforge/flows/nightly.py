"""The nightly: lint every nightly stack, bake them, gate them, publish each that passed.

Order per run (``build/nightly/<date>/``):

1. load and lint every selected stack (``nightly: true`` unless stacks are named); a stack
   that does not load or lint gets a failed row and is not built;
2. one ``docker buildx bake`` over all remaining stacks × targets (shared stages built once;
   log and plan kept as ``bake.log`` / ``bake.json``);
3. for each stack and target, ``stackforge build`` (from the cache the bake filled) gives the
   verdict, the gate output and the evidence; a failed gate or build fails only that row; then the target's
   ``nightly: true`` test slices that need no device run in the built image (``stackforge test``, into the
   evidence's ``tests/<slice>/``), and one that does not pass fails the row before it is published. A stack that
   declares platform lines (``platforms:``) has a row per line: each line is built and gated on its platform as
   ``stackforge build --platform LINE`` does (emulated, or on the line's builder, where the host differs; the bake
   builds the stack's own line), the test slices run on the stack's own line;
4. each row that passed is published (``stackforge publish``) under its immutable tag — a stack's lines together,
   as ``publish --platform all`` does, one OCI index under one tag and only when every line passed; an image that
   ``nightly: true`` recipes serve is smoked with each of them (``stackforge smoke``) and its aliases
   (``-latest``) move only when every smoke passed (a stack of lines: its own line's image is smoked, and the
   aliases move with the index); an image without a nightly recipe moves them at
   once. Its evidence bundle (with ``smoke/<recipe>/``) is copied to ``<stack>-<target>/`` (``…@<line>`` for
   another line than the stack's own, :func:`evidence_name`);
5. per stack, whether every pin is still the newest of its line (``stackforge newest``), and whether
   its upstreams' own pins drifted since the pinned commits (``stackforge drift``: "n/a" with the reason
   when it cannot be computed, e.g. no upstream declares ``agree:`` or the upstream cannot be fetched);
6. ``summary.json`` and ``summary.md``: a row per stack, target and platform — status, tag, digest,
   gate result, smoke verdict, duration, failure reason, the ``--set`` values its stack was loaded
   with — and the pins' freshness and drift per stack. Any failed row (a failed smoke too) makes the run fail;
   the rows that passed are published regardless.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from stackforge import safeio
from stackforge.builder.context.context import build_dir_for
from stackforge.builder.context.prepare import lint_or_fail
from stackforge.builder.records import evidence, vulns
from stackforge.builder.run import bake as bakemod
from stackforge.builder.run.regcache import RegistryCache
from stackforge.builder.run.run import BuildOptions, build, target_ref
from stackforge.clients.registry import parse_registry
from stackforge.clients.workspace import Workspace
from stackforge.errors import BuildFailed, UserError
from stackforge.flows import doctor
from stackforge.flows.nightly_smoke import NightlyRecipes, freshness_line, nightly_recipes, pin_freshness, smoke_image
from stackforge.freshness.drift import nightly_cell, nightly_line
from stackforge.fslock import atomic_write, stack_locks
from stackforge.publish.publisher import PublishOptions
from stackforge.publish.stack import publish_platforms, publish_stack, push_line
from stackforge.safeio import OutputDir
from stackforge.signals import Interrupted
from stackforge.smoke import slices as slice_runs
from stackforge.smoke.run import SmokeOptions, smoke
from stackforge.stack import platforms as lines_of_mod
from stackforge.stack.load import load, load_stack
from stackforge.stack.names import list_stacks
from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.scheme import validate_date
from stackforge.urls import redact, redact_text

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine


@dataclass
class Row:
    stack: str
    target: str
    status: str  # published | already-published | failed | interrupted | not-run (published, its smoke did not run)
    stage: str | None = None  # where it failed: load | lint | bake | build | gate | tests | publish
    tag: str | None = None
    digest: str | None = None
    gate: str | None = None
    duration_s: float = 0.0
    reason: str | None = None
    evidence: str | None = None
    overrides: list[str] = field(default_factory=list)  # the --set values its stack was loaded with (redacted)
    smoke: str | None = None  # passed | failed | not-run | none (no nightly recipe); None: not published
    smoke_recipes: dict[str, str] = field(default_factory=dict)  # recipe -> its verdict
    tests: dict[str, str] = field(default_factory=dict)  # test slice -> its verdict (the device-free nightly ones)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> moved | unchanged | not moved: why
    #: the vulnerability gate (``--osv``): {verdict: clear|waived|blocked, fail_on, blocked: [ids], waived: [{id,
    #: package, version, severity, reason, expires, waiver}], findings: N, database: {ecosystem: {fetched_at, from,
    #: age_hours}}, waivers: file}; None: not scanned (builder/records/vulns.py ScanReport.summary)
    scan: dict[str, Any] | None = None
    #: a sharded night: the shard that built the row
    shard: str | None = None
    #: the OCI platform of the row's image (linux/amd64, linux/arm64): the platform line it was built for; None in a
    #: row that built nothing of a known line (a stack that did not load)
    platform: str | None = None
    #: a shard's line of a stack of several lines: ``<repository>@<digest>`` it pushed, untagged, for the merge's index
    pushed: str | None = None

    @property
    def ok(self) -> bool:
        return self.status not in ("failed", "interrupted", NOT_RUN)

    def to_json(self) -> dict[str, Any]:
        """The row as the summary has it (``shard`` only in a sharded night, ``platform`` only when known, ``pushed``
        only when a shard pushed a line by digest)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("shard", "platform", "pushed")}

    @property
    def outcome(self) -> str:
        """passed, failed (also interrupted) or not-run: what the night's counts count."""
        return "passed" if self.ok else NOT_RUN if self.status == NOT_RUN else "failed"


NOT_RUN = "not-run"


def counts(outcomes: list[str]) -> dict[str, int]:
    """``{passed, failed, not_run}`` of a list of outcomes (``none``, an image without a nightly recipe, is none)."""
    return {
        "passed": outcomes.count("passed"),
        "failed": outcomes.count("failed"),
        "not_run": outcomes.count(NOT_RUN),
    }


def counts_text(c: dict[str, int]) -> str:
    return f"{c['passed']} passed, {c['failed']} failed, {c['not_run']} not run"


@dataclass
class Summary:
    date: str
    registry: str
    rows: list[Row] = field(default_factory=list)
    bake: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    directory: Path | None = None
    overrides: list[str] = field(default_factory=list)  # the --set values every row's stack was loaded with
    freshness: dict[str, dict[str, Any]] = field(default_factory=dict)  # stack -> pins newest of their lines?
    drift: dict[str, dict[str, Any]] = field(default_factory=dict)  # stack -> its upstreams' pins drifted?
    ci: dict[str, str] = field(default_factory=dict)  # where the night ran: ci_run()
    #: a sharded night (flows/night_merge.py): each shard of the plan and what became of it (status reported,
    #: missing, unreadable or stale; its runner labels, rows, times, CI run), and the merge's own time
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)
    merge: dict[str, Any] = field(default_factory=dict)
    #: stack -> each of its platform lines the night left out: declared, not buildable (values no record states)
    not_buildable: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def verdict(self) -> str:
        """passed (every row), failed (a row failed or was interrupted), or not-run: none failed, but an image's
        smoke did not run (e.g. no device on this host) — or nothing ran at all; never a pass."""
        if self.ok:
            return "passed"
        return "failed" if any(r.outcome == "failed" for r in self.rows) else NOT_RUN

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 3 not run (as ``stackforge smoke``)."""
        return {"passed": 0, "failed": 1}.get(self.verdict, 3)

    def counts(self) -> dict[str, dict[str, int]]:
        """The rows (images) and the smoke recipes, each as passed / failed / not run."""
        recipes = [v for r in self.rows for v in r.smoke_recipes.values()]
        return {"images": counts([r.outcome for r in self.rows]), "smoke": counts(recipes)}

    def to_json(self) -> dict[str, Any]:
        return {
            "date": self.date,
            "registry": self.registry,
            "ok": self.ok,
            "verdict": self.verdict,
            "counts": self.counts(),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "overrides": self.overrides,
            "bake": self.bake,
            "rows": [r.to_json() for r in self.rows],
            "freshness": self.freshness,
            **({"drift": self.drift} if self.drift else {}),
            **({"ci": self.ci} if self.ci else {}),
            **({"shards": self.shards} if self.shards else {}),
            **({"merge": self.merge} if self.merge else {}),
            **({"not_buildable": self.not_buildable} if self.not_buildable else {}),
        }

    def markdown(self) -> str:
        c = self.counts()
        lines = [
            f"# Nightly {self.date}",
            "",
            f"Registry `{self.registry}` — {c['images']['passed']} of {len(self.rows)} passed, "
            f"{c['images']['failed']} failed, {c['images']['not_run']} not run in {self.duration_s:.0f} s.",
            "",
            f"Smoke recipes: {counts_text(c['smoke'])}.",
            "",
        ]
        if self.overrides:
            lines += ["Overrides: " + " ".join(f"`--set {o}`" for o in self.overrides), ""]
        own = self.own_overrides()
        if own:
            lines += [f"Overrides of `{name}`: " + " ".join(f"`--set {o}`" for o in values) for name, values in own]
            lines.append("")
        lines += [self.bake_line(), ""]
        for name, notes in self.not_buildable.items():
            lines += [f"Not built, `{name}`: " + "; ".join(_cell(n) for n in notes) + ".", ""]
        if self.shards:
            lines += self.shard_lines()
        lines += [
            "| stack | target | platform | status | tag | digest | gate | smoke | duration | failure |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in self.rows:
            verdict = r.status if r.ok else {"interrupted": "INTERRUPTED", NOT_RUN: "NOT RUN"}.get(r.status, "FAILED")
            cells = [
                r.stack,
                r.target,
                r.platform or "",
                verdict if r.ok else f"{verdict} ({r.stage})",
                f"`{r.tag}`" if r.tag else "",
                f"`{r.digest}`" if r.digest else "",
                r.gate or "",
                _smoke_cell(r),
                f"{r.duration_s:.0f} s",
                _cell(r.reason),
            ]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        scanned = [r for r in self.rows if r.scan]
        if scanned:
            lines += [
                "",
                "| stack | target | platform | scan | blocked | waived |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            lines += [_scan_line(r) for r in scanned]
        slices = [v for r in self.rows for v in r.tests.values()]
        if slices:
            counted = ", ".join(f"{slices.count(v)} {v}" for v in ("passed", "failed", "not-run") if v in slices)
            lines += ["", f"Test slices: {counted} (`stackforge test`; results under each row's evidence, tests/)."]
        if self.freshness:
            lines += ["", "| stack | every pin the newest of its line | what moved |", "| --- | --- | --- |"]
            lines += [freshness_line(name, data) for name, data in self.freshness.items()]
        if self.drift:
            lines += ["", "| stack | upstream pins drifted | what drifted |", "| --- | --- | --- |"]
            lines += [nightly_line(name, data) for name, data in self.drift.items()]
        return "\n".join(lines) + "\n"

    def shard_lines(self) -> list[str]:
        """The shards of a sharded night: how many reported, then one line each."""
        reported = sum(1 for s in self.shards.values() if s.get("status") == "reported")
        took = self.merge.get("duration_s")
        lines = [
            f"Shards: {reported} of {len(self.shards)} reported"
            + (f"; the merge took {took} s." if took is not None else "."),
            "",
            "| shard | runner | rows | status | duration |",
            "| --- | --- | --- | --- | --- |",
        ]
        for sid, s in self.shards.items():
            status = str(s.get("status", ""))
            if s.get("reason"):
                status += f": {_cell(str(s['reason']))}"
            cells = [f"`{sid}`", " ".join(str(x) for x in s.get("labels") or []), str(s.get("rows", "")), status]
            cells.append(f"{s['duration_s']:.0f} s" if isinstance(s.get("duration_s"), int | float) else "")
            lines.append(
                "| " + " | ".join(safeio.for_terminal(c, lines=False).replace("|", "\\|") for c in cells) + " |"
            )
        return lines + [""]

    def own_overrides(self) -> list[tuple[str, list[str]]]:
        """Per stack, the overrides it was loaded with beyond those every stack was loaded with."""
        own: dict[str, list[str]] = {}
        for r in self.rows:
            extra = [o for o in r.overrides if o not in self.overrides]
            if extra and r.stack not in own:
                own[r.stack] = extra
        return list(own.items())

    def bake_line(self) -> str:
        """What the bake did: its exit and duration, or why it did not run."""
        b = self.bake
        if isinstance(b.get("shards"), dict):  # a sharded night: each shard baked its own units
            parts = [
                f"{sid}: exit {x.get('returncode')} in {x.get('duration_s')} s"
                if isinstance(x, dict) and x.get("returncode") is not None
                else f"{sid}: not run ({_cell(str((x or {}).get('not_run') or 'no bake'))})"
                for sid, x in b["shards"].items()
            ]
            return "Bake, per shard: " + "; ".join(parts) + "."
        if b.get("returncode") is not None:
            return (
                f"Bake: exit {b['returncode']} in {b.get('duration_s')} s "
                f"({b.get('targets')} targets; log `{b.get('log')}`)."
            )
        return f"Bake: not run: {_cell(b.get('not_run') or b.get('error') or 'no bake was attempted')}."


def bake_not_run(rows: list[Row], loaded: list[Any], use_bake: bool, network: str | None = None) -> str | None:
    """Why the bake does not run for this selection (None when it runs)."""
    if loaded and network and use_bake:
        # buildx reads no RUN-step network from a bake file before 0.14 (its bake target keeps it internal)
        return f"--network {network}: a bake file does not carry the RUN steps' network; each build runs with it"
    if loaded:
        return None if use_bake else "--no-bake was given"
    if not rows:
        return "no stack selected"
    stages = {r.stage for r in rows}
    if stages == {"lint"}:
        return "every stack failed lint"
    if stages == {"load"}:
        return "every stack failed to load"
    return "every stack failed to load or lint"


_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")
_WEB = re.compile(r"^https?://[^\s\"'<>\\]+$")


def ci_run(env: Mapping[str, str]) -> dict[str, str]:
    """Where this night runs, from the CI's own environment: the run's page (its log and the night's artifact) and
    the commit it ran from — GitHub Actions (``GITHUB_SERVER_URL``, ``GITHUB_REPOSITORY``, ``GITHUB_RUN_ID``,
    ``GITHUB_SHA``) or GitLab CI (``CI_JOB_URL``, ``CI_PROJECT_URL``, ``CI_COMMIT_SHA``); {} elsewhere. Only
    http(s) URLs, credentials redacted."""
    out: dict[str, str] = {}
    server, repo, run = env.get("GITHUB_SERVER_URL", ""), env.get("GITHUB_REPOSITORY", ""), env.get("GITHUB_RUN_ID", "")
    if server and repo and run.isdigit():
        base = f"{server.rstrip('/')}/{repo}"
        attempt = env.get("GITHUB_RUN_ATTEMPT", "")
        out["provider"] = "github"
        out["run_url"] = f"{base}/actions/runs/{run}" + (f"/attempts/{attempt}" if attempt.isdigit() and attempt != "1" else "")  # fmt: skip
        sha = env.get("GITHUB_SHA", "")
        if _COMMIT.match(sha):
            out["commit"], out["commit_url"] = sha, f"{base}/commit/{sha}"
    elif env.get("CI_JOB_URL"):
        out["provider"], out["run_url"] = "gitlab", env["CI_JOB_URL"]
        sha, project = env.get("CI_COMMIT_SHA", ""), env.get("CI_PROJECT_URL", "")
        if _COMMIT.match(sha):
            out["commit"] = sha
            if project:
                out["commit_url"] = f"{project.rstrip('/')}/-/commit/{sha}"
    for key in ("run_url", "commit_url"):
        if key in out:
            out[key] = redact(out[key])
            if not _WEB.match(out[key]):
                del out[key]
    return out


def _smoke_cell(row: Row) -> str:
    """The smoke verdict and where the aliases went, e.g. ``passed; -latest moved``."""
    if row.smoke is None:
        return ""
    text = "no nightly recipe" if row.smoke == "none" else row.smoke
    if len(row.smoke_recipes) > 1 or any(v != row.smoke for v in row.smoke_recipes.values()):
        text += " (" + ", ".join(f"{name} {v}" for name, v in row.smoke_recipes.items()) + ")"
    if row.aliases:
        text += "; " + ", ".join(f"{a.rsplit(':', 1)[-1]} {v}" for a, v in row.aliases.items())
    return text


def _scan_line(row: Row) -> str:
    """One row of the scan table: the verdict, the blocking ids, each waived finding with its reason and expiry."""
    scan = row.scan or {}
    waived = "; ".join(
        f"{w.get('id')} {w.get('package')} {w.get('version')} until {w.get('expires')}: {w.get('reason')}"
        for w in scan.get("waived") or []
    )
    cells = [row.stack, row.target, row.platform or "", f"{scan.get('verdict')} (at or above {scan.get('fail_on')})"]
    cells += [", ".join(scan.get("blocked") or []), _cell(waived)]
    return "| " + " | ".join(safeio.for_terminal(c, lines=False).replace("|", "\\|") for c in cells) + " |"


def _cell(text: str | None) -> str:
    if not text:
        return ""
    first = " ".join(text.strip().splitlines()[:3])
    return first if len(first) <= 300 else first[:297] + "…"


def _now() -> str:

    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gate_summary(lines: list[str]) -> str | None:
    results = [line.strip() for line in lines if line.strip().startswith("gate result:")]
    fails = [line.strip() for line in lines if line.strip().startswith("FAIL ")]
    if results:
        return results[-1]
    return f"{len(fails)} FAIL" if fails else None


#: The ``--set key.path=value`` values a nightly loads its stacks with: one list for every stack,
#: or a function giving the list for each stack's name.
Overrides = Sequence[str] | Callable[[str], list[str]] | None


def per_stack(overrides: Overrides) -> Callable[[str], list[str]]:
    """``overrides`` as a function of the stack's name."""
    if callable(overrides):
        return overrides
    every = list(overrides or [])
    return lambda name: list(every)


def select_stacks(
    root: Path, names: list[str] | None, overrides: Overrides = None
) -> tuple[list[ResolvedStack], list[Row]]:
    """Load the named stacks (default: every stack with ``nightly: true``) and lint them.

    ``overrides`` (``--set key.path=value``) apply when each stack loads: a list applies to every
    stack, a function gives each stack's own. A stack they make invalid gets a failed row, unless
    it is not a nightly stack anyway (it would not have run).
    """

    for_stack = per_stack(overrides)
    loaded: list[ResolvedStack] = []
    rows: list[Row] = []
    for name in names or list_stacks(root):
        own = for_stack(name)
        try:
            read = load(name, root=root, overrides=own)
        except UserError as err:
            if not names and own and not _nightly_as_declared(root, name):
                continue
            rows.append(Row(stack=name, target="*", status="failed", stage="load", reason=err.render()))
            continue
        if not names and not read.model.nightly:
            continue
        try:
            one = ResolvedStack.of(read)  # every template renders, or the stack's row says which does not
        except UserError as err:
            rows.append(Row(stack=name, target="*", status="failed", stage="load", reason=err.render()))
            continue
        try:
            lint_or_fail(one)
        except BuildFailed as err:
            rows.append(Row(stack=one.name, target="*", status="failed", stage="lint", reason=err.message))
            continue
        loaded.append(one)
    return loaded, rows


def declared_nightly(root: Path) -> list[str]:
    """The stacks whose files, without overrides, say ``nightly: true`` (and those that do not load)."""

    return [name for name in list_stacks(root) if _nightly_as_declared(root, name)]


def _nightly_as_declared(root: Path, name: str) -> bool:
    """Whether the stack file, without overrides, is a nightly stack (True when it does not load either)."""

    try:
        return bool(load_stack(name, root=root).nightly)
    except UserError:
        return True


@dataclass(frozen=True)
class NightlyOptions:
    """What ``stackforge nightly``'s flags decide, built once by the verb and passed to :func:`nightly`.

    ``stacks``: the stacks to run (None: every stack with ``nightly: true``); ``targets``: their targets (None: the
    published ones); ``use_bake``: bake every stack together first; ``out``: where the summary goes (default
    ``build/nightly/<date>``); ``overrides``: the ``--set`` values (a list, or a function of the stack's name);
    ``smoke``: how each smoke runs (``allow_missing_hardware`` is ``stackforge smoke --allow-missing-hardware``,
    ``device_uuids`` the uuids the lease granted, ``$STACKFORGE_DEVICE_UUID``); ``freshness`` asks the indexes
    whether every pin is still the newest of its line; ``drift`` compares each stack's upstreams that declare
    ``agree:`` at the pinned commits with their default branches (``stackforge drift``).
    """

    date: str | None = None
    stacks: list[str] | None = None
    targets: list[str] | None = None
    use_bake: bool = True
    #: how every publish pushes (retry policy, layer compression) and what it proves (signing, the OSV gate); a
    #: night with a signing key never publishes unsigned, one with an OSV database stops before it builds when the
    #: database cannot give a verdict
    publish: PublishOptions = field(default_factory=PublishOptions)
    out: Path | None = None
    overrides: Overrides = None
    echo: Callable[[str], None] = print
    smoke: SmokeOptions = field(default_factory=SmokeOptions)
    freshness: bool = True
    drift: bool = True
    #: before the bake, check every endpoint the night needs (doctor's rows and the registry push): stop in
    #: seconds, naming what failed, instead of after a night of building
    preflight: bool = True
    #: build cache imported from / exported to a registry by the bake and every build (builder/run/regcache.py)
    cache: RegistryCache | None = None
    #: each stack's targets (a shard's units; None: ``targets`` for every stack)
    units: Mapping[str, list[str]] | None = None
    #: False: publish each image under its immutable tag only (a shard; the merge moves the aliases)
    move_aliases: bool = True
    #: the RUN steps' network of the bake and every build, e.g. ``host`` to reach an index on the host's loopback
    network: str | None = None
    #: build, gate and publish every platform line a stack declares (one index under its tag); False: each stack's
    #: own line only, or the line ``lines`` names
    every_platform: bool = True
    #: a shard's: per stack of several platform lines, the one line it builds (by name); its image is pushed by digest
    #: with its record, signature and SBOM, and tagged by the merge as a child of the stack's index
    lines: Mapping[str, str] | None = None


def nightly(
    root: Path, registry: str, options: NightlyOptions | None = None, *, workspace: Workspace | None = None
) -> Summary:
    """Bake, build, gate, publish and smoke the nightly stacks of the repository at ``root`` as ``options`` say,
    with the workspace's engine (its builder), credentials and CA bundle (default: the workspace at ``root``)."""

    options = options or NightlyOptions()
    echo = options.echo
    ws = workspace if workspace is not None else Workspace.at(root)
    started = time.monotonic()
    parse_registry(registry, what="--registry")
    date = validate_date(options.date)
    trust = options.publish.trust
    if trust.osv is not None:  # a database that cannot give a verdict stops the night before it builds
        for fresh in vulns.preflight(trust.osv, trust.osv_max_age or vulns.DEFAULT_MAX_AGE):
            echo(f"nightly: OSV database {fresh.line()}")
    outdir = options.out or root / "build" / "nightly" / date
    # the night's directory holds only what the nightly writes: never one of the repository's inputs, never a
    # directory of other files (a row's evidence is replaced in it)
    inputs = [root / d for d in ("stacks", "patches", "overlays", "recipes")]
    OutputDir(outdir, "nightly").claim(inputs, legacy=("summary.json", "summary.md"))
    summary = Summary(date=date, registry=registry, started_at=_now(), directory=outdir, ci=ci_run(os.environ))
    for_stack = per_stack(options.overrides)

    loaded, summary.rows = select_stacks(root, options.stacks, for_stack)
    for row in summary.rows:
        echo(f"nightly: {row.stack}: {row.stage} failed")
    for stack in loaded if options.every_platform and not options.lines else []:
        if notes := not_buildable(stack):
            summary.not_buildable[stack.name] = notes
            echo(f"nightly: {stack.name}: not built: {'; '.join(notes)}")
    if not loaded and not summary.rows:
        raise UserError(
            f"no nightly stacks in {root / 'stacks'}",
            fix="mark stacks with `nightly: true`, or name them: stackforge nightly STACK…",
        )
    not_run = bake_not_run(summary.rows, loaded, options.use_bake, options.network)
    if not_run:
        summary.bake = {"not_run": not_run}
        echo(f"nightly: bake not run: {not_run}")
    recipes = _nightly_recipes(root, summary, echo)
    use_bake = options.use_bake and not options.network
    try:
        _bake_and_build(summary, loaded, replace(options, date=date, use_bake=use_bake), registry, ws, outdir, recipes)
    except Interrupted as intr:
        # The rows not yet decided say so; the summary is written before the command stops.
        decided = {(r.stack, r.target) for r in summary.rows}
        for stack in loaded:
            for target in _targets_or_star(bakemod, stack, bakemod.targets_of(options.units or options.targets, stack.name)):  # fmt: skip
                if (stack.name, target) not in decided:
                    summary.rows += [
                        Row(
                            stack=stack.name,
                            target=target,
                            status="interrupted",
                            stage="bake" if not summary.bake else "build",
                            reason=f"interrupted by {intr.name} before it finished",
                            platform=platform,
                        )
                        for platform in platforms_of(stack, options.every_platform, options.lines)
                    ]
        if not summary.bake:
            summary.bake = {"not_run": f"interrupted by {intr.name}"}
        _write_summary(summary, outdir, started, for_stack, root)
        intr.notes.append(f"the engine was stopped and nothing more was published (summary: {outdir / 'summary.md'})")
        raise
    if options.freshness:
        for stack in loaded:
            echo(f"nightly: {stack.name}: are the pins the newest of their lines?")
            summary.freshness[stack.name] = pin_freshness(stack, ws)
    if options.drift:
        for stack in loaded:
            echo(f"nightly: {stack.name}: did the upstreams' own pins drift?")
            summary.drift[stack.name] = nightly_cell(stack, ws, fetch=ws.mirror is None)
    _write_summary(summary, outdir, started, for_stack, root)
    echo(f"nightly: {counts_text(summary.counts()['images'])}; summary {outdir / 'summary.md'}")
    return summary


def _nightly_recipes(root: Path, summary: Summary, echo: Callable[[str], None]) -> NightlyRecipes:
    """The nightly recipes by image; a recipe that does not load fails the run (its image's smoke is unknown)."""

    recipes = nightly_recipes(root)
    for name, error in recipes.invalid.items():
        summary.rows.append(Row(stack="recipes", target=name, status="failed", stage="load", reason=error))
        echo(f"nightly: recipe {name}: load failed")
    return recipes


def _targets_or_star(bakemod: ModuleType, stack: ResolvedStack, targets: list[str] | None) -> list[str]:
    try:
        return bakemod.stack_targets(stack, targets)
    except UserError:
        return ["*"]


def _record_overrides(summary: Summary, for_stack: Callable[[str], list[str]]) -> None:
    """Each row's overrides, and those every row's stack was loaded with, redacted."""
    shown: dict[str, list[str]] = {}
    for row in summary.rows:
        if row.stack not in shown:
            shown[row.stack] = [redact_text(o) for o in for_stack(row.stack)]
        row.overrides = list(shown[row.stack])
    lists = list(shown.values())
    summary.overrides = [o for o in lists[0] if all(o in other for other in lists[1:])] if lists else []


def _relative(path: Path, outdir: Path) -> str:
    """``path`` as the summary names it: relative to the run directory when it is inside it."""
    try:
        return Path(path).resolve().relative_to(outdir.resolve()).as_posix()
    except ValueError:
        return str(path)


def _host_free(text: str, outdir: Path, root: Path) -> str:
    """A message without this host's directories: the run directory's files by their own names, the
    repository's by their path in it (a downloaded summary names nothing that is not in it or in a checkout)."""
    for base in sorted({str(outdir.resolve()), str(outdir), str(root.resolve()), str(root)}, key=len, reverse=True):
        text = text.replace(base + "/", "")
    return text


def _write_summary(
    summary: Summary, outdir: Path, started: float, for_stack: Callable[[str], list[str]], root: Path
) -> None:
    _record_overrides(summary, for_stack)
    summary.finished_at = _now()
    summary.duration_s = round(time.monotonic() - started, 1)
    text = _host_free(json.dumps(summary.to_json(), indent=2) + "\n", outdir, root)
    atomic_write(outdir / "summary.json", text)
    atomic_write(outdir / "summary.md", summary.markdown())


def _bake_and_build(
    summary: Summary,
    loaded: list[ResolvedStack],
    options: NightlyOptions,
    registry: str,
    workspace: Workspace,
    outdir: Path,
    recipes: NightlyRecipes | None = None,
) -> None:
    """The bake of every loaded stack, then each stack and target built, gated, published and smoked (rows
    appended). ``options.date`` is the validated date."""

    engine, echo = workspace.engine, options.echo
    targets = options.units if options.units is not None else options.targets
    assert options.date is not None
    if loaded:
        engine.check()
    if loaded and options.preflight and not _preflight(summary, loaded, options, registry, workspace):
        return
    baking = _baked(loaded, options)
    if baking and options.use_bake:
        echo(f"nightly: bake {', '.join(s.name for s in baking)}")
        try:
            items, baked = bakemod.bake(
                baking,
                workspace=workspace,
                targets=targets,
                workdir=outdir,
                engine=engine,
                on_line=lambda line: echo(f"[bake] {line}"),
                cache=options.cache,
            )
            summary.bake = {
                "returncode": baked.returncode,
                "duration_s": baked.duration_s,
                "targets": len(items),
                "log": _relative(baked.log_file, outdir),
                "plan": "bake.json",
            }
            echo(
                f"nightly: bake exit {baked.returncode} in {baked.duration_s} s"
                + ("" if baked.returncode == 0 else " (each stack is now built on its own for its verdict)")
            )
        except UserError as err:
            summary.bake = {"not_run": f"the bake could not start: {err.message}", "error": err.render()}
            echo(f"nightly: bake could not run: {err.message}")
    elif loaded and options.use_bake:
        summary.bake = {"not_run": "every line built here is of another platform than the stacks' own: each is built on its own"}  # fmt: skip

    run = NightlyRun(
        registry=registry,
        date=options.date,
        publishing=options.publish,
        workspace=workspace,
        engine=engine,
        outdir=outdir,
        echo=echo,
        build=build,
        options=BuildOptions,
        publish=publish_stack,
        publish_platforms=publish_platforms,
        smoke=smoke,
        recipes=recipes,
        smoking=options.smoke,
        test=slice_runs.run_slice,
        cache=options.cache,
        move_aliases=options.move_aliases,
        network=options.network,
    )
    for stack in loaded:
        try:
            names = bakemod.stack_targets(stack, bakemod.targets_of(targets, stack.name))
        except UserError as err:
            summary.rows.append(Row(stack=stack.name, target="*", status="failed", stage="build", reason=err.render()))
            continue
        for target in names:
            try:
                lines = night_lines(stack, options.every_platform, options.lines)
                # its builds, publish and evidence copies, as one
                with stack_locks([build_dir_for(line) for line in lines]):
                    if _by_digest(stack, options.lines):  # a shard's line of an index: pushed by digest
                        rows = [_one(replace(run, publish=functools.partial(push_line, of=stack)), lines[0], target)]  # fmt: skip
                    elif len(lines) > 1:
                        rows = _platform_lines(run, stack, target)
                    else:
                        rows = [_one(run, lines[0], target)]
            except UserError as err:  # a build directory is busy or cannot be written
                rows = [Row(stack=stack.name, target=target, status="failed", stage="build", reason=err.render(),
                            platform=platform) for platform in platforms_of(stack, options.every_platform, options.lines)]  # fmt: skip
            summary.rows += rows


def _lines_or_none(stack: ResolvedStack, options: NightlyOptions) -> list[ResolvedStack]:
    """:func:`night_lines` of ``stack`` for this night; none when the plan's line is not the stack's any more."""
    try:
        return night_lines(stack, options.every_platform, options.lines)
    except UserError:
        return []  # the build's row says why


def _baked(loaded: list[ResolvedStack], options: NightlyOptions) -> list[ResolvedStack]:
    """The stacks the bake builds, each on its own line: every stack but one whose line this shard builds is another
    platform's (a bake file carries no platform per target; such a line is built on its own)."""
    own = [s for s in loaded if not _by_digest(s, options.lines)]
    return own + [s for s in loaded if _by_digest(s, options.lines) and all(ln.line is not None and ln.line.own for ln in _lines_or_none(s, options))]  # fmt: skip


def _cache_of(run: NightlyRun, stack: str, target: str) -> dict[str, Any]:
    """The build options of one (stack, target) as its bake target had them: its registry cache (none when the
    night has none) and the RUN steps' network."""
    out: dict[str, Any] = {} if run.network is None else {"network": run.network}
    if run.cache is not None:
        out["cache"] = run.cache.for_target(bakemod.target_name(stack, target))
    return out


def _redirect(row: doctor.Check) -> str:
    fixes = row.fixes()
    return f" (redirect: {fixes[0]})" if fixes else ""


def _preflight(
    summary: Summary, loaded: list[ResolvedStack], options: NightlyOptions, registry: str, workspace: Workspace
) -> bool:
    """Doctor's rows for the night's stacks and each stack's push to the registry, before anything is built;
    False (every row failed at stage ``preflight``, naming what failed and its redirect) when one fails."""
    options.echo(f"nightly: preflight: the engine, the registry and every endpoint of {len(loaded)} stack(s)")
    rows = doctor.diagnose(loaded, workspace, registry=registry)
    # a shard that builds another line than a stack's own needs that line's base, not the stack's (an arm64 runner
    # need not hold the amd64 base image)
    baked = {s.name for s in _baked(loaded, options)}
    other = {s.name for s in loaded if s.name not in baked}
    rows = [r for r in rows if not (r.check == "base image" and r.stack in other)]
    bases = [row for s in loaded for row in doctor.line_base_checks(s, _lines_or_none(s, options), workspace)]
    rows += doctor.run_checks(bases)
    failed = [r for r in rows if r.status == doctor.FAIL]
    if not failed:
        return True
    lines = [f"{r.check} {r.endpoint}: {r.detail}{_redirect(r)}" for r in failed]
    options.echo("nightly: preflight FAILED, nothing is built:\n  " + "\n  ".join(lines))
    reason = "preflight failed, nothing was built: " + "; ".join(dict.fromkeys(lines))
    for stack in loaded:
        for target in _targets_or_star(bakemod, stack, bakemod.targets_of(options.units or options.targets, stack.name)):  # fmt: skip
            for platform in platforms_of(stack, options.every_platform, options.lines):
                summary.rows.append(Row(stack=stack.name, target=target, status="failed", stage="preflight",
                                        reason=reason, platform=platform))  # fmt: skip
    summary.bake = {"not_run": "the preflight failed"}
    return False


@dataclass(frozen=True)
class NightlyRun:
    """What every (stack, target) of one nightly is built, gated and published with."""

    registry: str
    date: str
    publishing: PublishOptions  # how each publish pushes and what it proves (its echo is the run's to set)
    workspace: Workspace  # the builder, credentials and CA bundle
    engine: Engine
    outdir: Path
    echo: Callable[[str], None]
    build: Callable[..., Any]  # stackforge.builder.run.run.build
    options: Callable[..., Any]  # stackforge.builder.run.run.BuildOptions
    publish: Callable[..., Any]  # stackforge.publish.stack.publish_stack
    #: stackforge.publish.stack.publish_platforms: every platform line of a stack that declares them, as one index
    publish_platforms: Callable[..., Any] | None = None
    smoke: Callable[..., Any] | None = None  # stackforge.smoke.run.smoke
    recipes: NightlyRecipes | None = None
    smoking: SmokeOptions = field(default_factory=SmokeOptions)  # how each smoke runs (hardware, lease's uuids)
    test: Callable[..., Any] | None = None  # stackforge.smoke.slices.run_slice; None: no test slices run
    cache: RegistryCache | None = None  # the build cache each build imports and exports, as the bake's
    #: False: publish the immutable tags only, never an alias (a shard: the merge moves them for the whole night)
    move_aliases: bool = True
    network: str | None = None  # the RUN steps' network of the bake and every build (None: the builder's default)
    #: the evidence directories this night named so far: name -> (stack, target[, line])
    evidence_names: dict[str, tuple[str, ...]] = field(default_factory=dict)


def evidence_name(stack: str, target: str, taken: dict[str, tuple[str, ...]], line: str = "") -> str:
    """The directory of a row's evidence in the night: ``<stack>-<target>`` (``line``, the platform line's suffix, after
    it for a line that is not the stack's own: ``post2-vllm-openai@arm64``), and a short hash of the row after it when
    another row of the night has that name already (``hp-a``/``b-c`` and ``hp-a-b``/``c``)."""
    key = (stack, target, line) if line else (stack, target)
    name = f"{stack}-{target}{line}"
    if taken.setdefault(name, key) != key:
        name += "-" + hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:10]
        taken[name] = key
    return name


def _label(stack: ResolvedStack, target: str) -> str:
    """``<stack>/<target>``, the line after the stack for a platform line that is not its own (``post2@arm64/…``)."""
    return f"{stack.name}{_suffix(stack)}/{target}"


def _suffix(stack: ResolvedStack) -> str:
    return stack.line.suffix if stack.line is not None else ""


def _own(stack: ResolvedStack) -> bool:
    return stack.line is None or stack.line.own


def lines_of(stack: ResolvedStack, every: bool = True) -> list[ResolvedStack]:
    """The platform lines a night builds of ``stack``: every line it declares that can be built (``every``; a line
    declared with values no record states is not, :func:`not_buildable`), else the stack as written (its own line).
    A stack with one such line is built as itself."""
    built = [ln for ln in stack.platform_lines().values() if ln.line is None or not ln.line.unknown]
    return built if every and len(built) > 1 else [stack]


def night_lines(
    stack: ResolvedStack, every: bool = True, lines: Mapping[str, str] | None = None
) -> list[ResolvedStack]:
    """:func:`lines_of`, or — a shard's stack of several lines (``lines`` names the one it builds) — that line alone.
    A line the stack no longer declares is a :class:`UserError` (the plan was made from other stack files)."""
    name = (lines or {}).get(stack.name)
    if name is None:
        return lines_of(stack, every)
    found = stack.platform_lines().get(name)
    if found is None or found.line is None or found.line.unknown:
        raise UserError(
            f"the night's plan builds platform line {name!r} of {stack.name}, which the stack does not declare as "
            "buildable here",
            fix="run the shard from the commit the plan was made from",
        )
    return [found]


def _by_digest(stack: ResolvedStack, lines: Mapping[str, str] | None) -> bool:
    """Whether a shard pushes ``stack``'s line by digest for the merge's index (a stack of several lines)."""
    return stack.name in (lines or {})


def not_buildable(stack: ResolvedStack) -> list[str]:
    """What ``lint`` says of each platform line of ``stack`` that is declared, not buildable (values no record
    states): the night leaves those lines out, and its summary says so."""
    return [note for ln in stack.lines.values() if ln.line is not None and (note := lines_of_mod.unknown_note(ln.line))]


def platforms_of(stack: ResolvedStack, every: bool = True, lines: Mapping[str, str] | None = None) -> list[str | None]:
    """The OCI platform of each line :func:`night_lines` gives."""
    try:
        built = night_lines(stack, every, lines)
    except UserError:
        return [None]
    return [line.line.oci if line.line is not None else None for line in built]


def _publisher(run: NightlyRun, fn: Callable[..., Any], stack: ResolvedStack, target: str) -> Callable[..., Any]:
    """``fn`` (publish_stack or publish_platforms) bound to this night's registry, options, date, engine and
    workspace for one stack and target; the caller says whether the aliases move."""
    return functools.partial(
        fn,
        stack,
        run.registry,
        options=replace(run.publishing, echo=lambda line: None),
        date=run.date,
        target=target,
        engine=run.engine,
        workspace=run.workspace,
    )


def _one(run: NightlyRun, stack: ResolvedStack, target: str) -> Row:
    """Build, gate and publish one stack and target; its evidence bundle is copied under ``run.outdir``."""
    t0 = time.monotonic()
    row, evidence = _build_and_gate(run, stack, target)
    if row.stage is None:
        run.echo(f"nightly: {_label(stack, target)}: publish")
        recipes = run.recipes.of(stack.name, target) if run.recipes is not None else []
        publish = _publisher(run, run.publish, stack, target)
        try:
            result = publish(move_aliases=not recipes and run.move_aliases)
            row.status, row.digest = result.status, result.digest
            pushed = result.status == "pushed"  # by digest, for the index the merge tags
            row.tag = None if pushed else result.reference
            row.pushed = f"{result.repository}@{result.digest}" if pushed else None
            row.scan = getattr(result, "scan", None)
            run.echo(
                f"nightly: {_label(stack, target)}: {result.status} {result.digest if pushed else result.reference}"
            )
            if recipes and not _own(stack):
                row.smoke = NOT_RUN  # a recipe serves the image on the stack's own platform: that line is smoked
            elif recipes:
                _smoke_then_aliases(run, stack, target, row, recipes, evidence, publish)
            else:
                row.smoke, row.aliases = "none", dict(result.aliases)
        except UserError as err:  # nothing published, or the aliases not moved after the smoke
            row.status, row.stage, row.reason = "failed", "publish", err.render()
            run.echo(f"nightly: {_label(stack, target)}: publish FAILED")
    row.duration_s = round(time.monotonic() - t0, 1)
    _keep_evidence(run, stack, target, row, evidence)
    return row


def _build_and_gate(run: NightlyRun, stack: ResolvedStack, target: str) -> tuple[Row, Path | None]:
    """Build and gate one platform line of a stack and target (on its platform: a line of another platform than the
    host's builds under emulation or on its builder, as ``build --platform`` does), then, on the stack's own line,
    the target's device-free nightly test slices: the row (``stage`` None when it may be published) and the build's
    evidence."""
    echo, label = run.echo, _label(stack, target)
    row = Row(stack=stack.name, target=target, status="failed", platform=stack.line.oci if stack.line else None)
    echo(f"nightly: {label}: build and gate")
    evidence = None
    try:
        outcome = run.build(
            stack,
            run.options(target=target, **_cache_of(run, stack.name + _suffix(stack), target)),
            engine=run.engine,
            echo=lambda line: echo(f"[{label}] {line}"),  # the engine's log, each line prefixed
            workspace=run.workspace,
        )
        evidence = outcome.evidence
        row.gate = _gate_summary(outcome.gate)
    except BuildFailed as err:
        evidence = _evidence_dir(stack)
        gate = _read_lines(evidence / "gate.txt")
        failed_gate = any(line.strip().startswith("FAIL ") for line in gate)
        row.stage = "gate" if failed_gate else "build"
        row.gate = _gate_summary(gate)
        row.reason = err.message
        echo(f"nightly: {label}: {row.stage} FAILED")
    except UserError as err:
        row.stage, row.reason = "build", err.render()
        echo(f"nightly: {label}: build FAILED")
    if row.stage is None and evidence is not None and run.test is not None and _own(stack):
        _test_slices(run, stack, target, row, evidence)
    return row, evidence


def _keep_evidence(run: NightlyRun, stack: ResolvedStack, target: str, row: Row, evidence: Path | None) -> None:
    """The build's evidence bundle copied into the night's directory; the row names it there."""
    if evidence is not None and evidence.is_dir():
        dest = run.outdir / evidence_name(stack.name, target, run.evidence_names, _suffix(stack))
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(evidence, dest)
        row.evidence = dest.name  # relative to the run directory: the summary travels as an artifact


def _platform_lines(run: NightlyRun, stack: ResolvedStack, target: str) -> list[Row]:
    """Every platform line of a stack that declares them, for one target: each built and gated on its platform (the
    own line's test slices run, as for a stack of one line), then — only when every line passed — all published
    under one immutable tag as an OCI image index (``publish --platform all``: ``publish.stack.publish_platforms``),
    each line's image with its own record, signature and SBOM. The own line is smoked with the image's nightly
    recipes; the aliases move with the index only when every line passed and the smoke did. A row per line."""
    t0 = time.monotonic()
    lines = lines_of(stack)
    stack = replace(stack, lines={ln.line.name: ln for ln in lines if ln.line is not None})  # what is published
    built: list[tuple[ResolvedStack, Row, Path | None, float]] = []
    for line in lines:
        started = time.monotonic()
        row, evidence = _build_and_gate(run, line, target)
        built.append((line, row, evidence, time.monotonic() - started))
    failed = [row for _, row, _, _ in built if row.stage is not None]
    started = time.monotonic()
    if failed:
        why = ", ".join(f"{r.platform} failed ({r.stage})" for r in failed)
        for _, row, _, _ in built:
            if row.stage is None:
                row.stage = "publish"
                row.reason = f"not published: {why}; the stack's tag is one index of every platform line"
        run.echo(f"nightly: {stack.name}/{target}: not published: {why}")
    else:
        _publish_lines(run, stack, target, [(line, row, evidence) for line, row, evidence, _ in built])
    shared = time.monotonic() - started
    for line, row, evidence, took in built:
        row.duration_s = round(took + shared, 1)
        _keep_evidence(run, line, target, row, evidence)
    run.echo(f"nightly: {stack.name}/{target}: {len(built)} platform lines in {time.monotonic() - t0:.0f} s")
    return [row for _, row, _, _ in built]


def _publish_lines(
    run: NightlyRun, stack: ResolvedStack, target: str, built: list[tuple[ResolvedStack, Row, Path | None]]
) -> None:
    """Publish every line (gated) of ``stack``/``target`` as one index, smoke the own line, move the aliases (each row
    filled in)."""
    assert run.publish_platforms is not None
    label = f"{stack.name}/{target}"
    run.echo(f"nightly: {label}: publish {', '.join(str(row.platform) for _, row, _ in built)} as one index")
    recipes = run.recipes.of(stack.name, target) if run.recipes is not None else []
    publish = _publisher(run, run.publish_platforms, stack, target)
    try:
        result = publish(move_aliases=not recipes and run.move_aliases)
        index = result.index
        run.echo(f"nightly: {label}: {index.status} {index.reference} ({index.digest})")
        for line, row, _ in built:
            assert line.line is not None
            child = result.platforms[line.line.name]
            row.status, row.tag, row.digest = index.status, index.reference, child.digest
            row.scan = getattr(child, "scan", None)
        if not recipes:
            for _, row, _ in built:
                row.smoke, row.aliases = "none", dict(index.aliases)
            return
        own, own_row, own_evidence = next(((ln, r, e) for ln, r, e in built if _own(ln)), built[0])
        _smoke_then_aliases(run, own, target, own_row, recipes, own_evidence, lambda **kw: publish(**kw).index)
    except UserError as err:  # nothing published, or the aliases not moved after the smoke
        for _, row, _ in built:
            row.stage, row.reason = "publish", err.render()
            row.status = "failed"
        run.echo(f"nightly: {label}: publish FAILED")
        return
    for _, row, _ in built:
        if row is own_row:
            continue
        row.smoke = NOT_RUN  # a recipe serves the image on the host's platform: the own line's image is smoked
        if own_row.ok:
            row.aliases = dict(own_row.aliases)
        elif run.move_aliases:
            row.aliases = {"*": f"not moved: smoke {own_row.smoke} on {own_row.platform}"}


def _test_slices(run: NightlyRun, stack: ResolvedStack, target: str, row: Row, evidence: Path) -> None:
    """Run the target's nightly test slices that need no device in the built image, into the build's evidence
    (``tests/<slice>/``, which the publish record reads); a slice that does not pass fails the row before
    publishing, as the gate does."""
    test = run.test
    assert test is not None
    try:
        refs = [
            r
            for r in slice_runs.declared(stack)
            if r.target == target and r.slice.nightly and r.slice.hardware.devices == "none"
        ]
        if not refs:
            return
        image = target_ref(stack, target)
        image_id = run.engine.image_id(image)
        for ref in refs:
            run.echo(f"nightly: {stack.name}/{target}: test {ref.name}")
            where = slice_runs.SliceTarget(image, image_id, evidence / "tests" / ref.name)
            result = test(stack, ref, where, run.workspace, engine=run.engine)
            row.tests[ref.name] = result.verdict
            if result.verdict != "passed":
                row.stage, row.reason = "tests", f"test slice {ref.name} {result.verdict}: {result.reason}"
    except UserError as err:
        row.stage, row.reason = "tests", err.render()
    if row.stage == "tests":
        run.echo(f"nightly: {stack.name}/{target}: tests FAILED; not published")


def _smoke_then_aliases(
    run: NightlyRun,
    stack: ResolvedStack,
    target: str,
    row: Row,
    recipes: list,
    evidence: Path | None,
    publish: Callable[..., Any],
) -> None:
    """Smoke the published image with its nightly recipes; move its aliases only when every smoke passed."""

    assert run.smoke is not None
    ref = target_ref(stack, target)
    run.echo(f"nightly: {stack.name}/{target}: smoke {', '.join(r.name for r in recipes)}")
    verdict = smoke_image(
        recipes,
        ref,
        evidence or _evidence_dir(stack),
        run.smoke,
        run.smoking,
        engine=run.engine,
        image_id=run.engine.image_id(ref),
    )
    row.smoke, row.smoke_recipes = verdict.verdict, verdict.recipes
    if verdict.moves_aliases and not run.move_aliases:
        run.echo(f"nightly: {stack.name}/{target}: smoke passed; the merge moves the aliases")
        return
    if verdict.moves_aliases:
        moved = publish(move_aliases=True)
        row.aliases = dict(moved.aliases)
        row.scan = getattr(moved, "scan", None) or row.scan
        run.echo(f"nightly: {stack.name}/{target}: smoke passed; aliases {row.aliases}")
        return
    row.status, row.stage = ("failed" if verdict.verdict == "failed" else NOT_RUN), "smoke"
    row.reason = (
        f"smoke {verdict.verdict} ({verdict.reason}); published {row.tag or row.digest}, its aliases were not moved"
    )
    row.aliases = {"*": f"not moved: smoke {verdict.verdict}"} if run.move_aliases else {}
    run.echo(f"nightly: {stack.name}/{target}: smoke {verdict.verdict}; aliases not moved")


def _evidence_dir(stack: ResolvedStack) -> Path:
    """The newest build's evidence (under the nightly's stack lock: the one it just ran, failed or not)."""

    root = build_dir_for(stack) / "evidence"
    return evidence.newest(root) or root


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []
