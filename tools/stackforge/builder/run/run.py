"""Build one stack into a tagged, gated image, and write its evidence bundle.

The order is: lint the stack → check the engine → resolve the base image →
assemble the context (upstreams fetched, verified and patched on the host) →
render the Dockerfile → ``docker buildx build`` (the gate is a build stage, so a
FAIL means no image is loaded and no tag moves) → evidence.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import re
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge import progress
from stackforge.builder.context.context import Context, build_dir_for
from stackforge.builder.context.prepare import BaseImage, EngineFacts, Prepared, prepare_dockerfile
from stackforge.builder.plan import system
from stackforge.builder.plan.render import clean_scope
from stackforge.builder.plan.secrets import host_inputs
from stackforge.builder.records import evidence as evidence_dirs
from stackforge.builder.records import imagerecords, inventory, sbom
from stackforge.builder.records import reports as target_reports
from stackforge.builder.run import regcache
from stackforge.builder.sources import reuse
from stackforge.clients import credentials
from stackforge.clients.engine import Engine
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import BuildFailed, UserError
from stackforge.fslock import atomic_write, stack_lock
from stackforge.signals import Interrupted
from stackforge.stack import targets as target_rules
from stackforge.stack.load import fingerprint, resolved
from stackforge.urls import redact_text

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack

GATE_LINE = re.compile(
    r"^(?:#\d+ [\d.]+ )?((?:read-only: )?(?:(?:PASS|FAIL|WARN) "
    r"(?:machine|python|import|meta  |probe |write |link  |abi  |patch |requires|pip   ) .*"
    r"|gate result: .*)|abi result: .*)$"
)


@dataclass
class BuildOptions:
    """How one build runs; the CA bundle and the builder are the workspace's (``Workspace``)."""

    target: str | None = None
    load: bool = True
    syntax: str | None = None  # a `# syntax=` line; off by default (it pulls a frontend image)
    no_cache: bool = False
    out: Path | None = None
    network: str | None = None  # RUN steps' network, e.g. "host" to reach an index on the host's loopback
    lock_timeout: float | None = None  # seconds to wait for another build of this directory (0: none)
    keep_builds: int | None = None  # builds kept per stack (default $STACKFORGE_KEEP_BUILDS or 10)
    cache: regcache.RegistryCache | None = None  # build cache imported from / exported to a registry


@dataclass
class BuildOutcome:
    stack: str
    target: str
    tag: str
    image_id: str | None
    evidence: Path
    gate: list[str] = field(default_factory=list)
    duration_s: float = 0.0


def default_target(loaded: ResolvedStack, target: str | None) -> str:
    stack = loaded.model
    if not stack.targets:
        raise UserError(
            f"stack '{stack.name}' declares no targets",
            **loaded.position(("name",)).as_error_kwargs(),
            fix="add targets: {vllm-openai: {entrypoint: [vllm, serve]}}",
        )
    if target is None:
        return target_rules.published(stack)[0]
    if target not in stack.targets:
        raise UserError(
            f"stack '{stack.name}' has no target '{target}'",
            file="--target",
            fix=f"use one of: {', '.join(target_rules.published(stack))}",
        )
    if not stack.targets[target].published:
        raise UserError(
            f"target '{target}' of stack '{stack.name}' is publish: false: an intermediate stage, "
            "never tagged or published",
            **loaded.position(("targets", target)).as_error_kwargs(),
            fix=f"build a target that builds on it: {', '.join(target_rules.published(stack))}",
        )
    return target


def target_ref(loaded: ResolvedStack, target: str) -> str:
    """The local reference: the stack's local tag for its first published target, `<tag>-<target>` for the
    others."""
    ref = loaded.resolved.local
    if target == target_rules.published(loaded.model)[0]:
        return str(ref)
    return f"{ref.repository}:{ref.tag}-{target}"[: len(ref.repository) + 1 + 128]


def base_identity(engine: Engine, loaded: ResolvedStack) -> BaseImage:
    """The base image as the build records it (pulled when the engine lacks it): its config's digest (the classic
    store's image id; on the containerd store, whose id is a manifest's or index's digest, the config of the build's
    platform read from it), the registry digest the stack pins, its creation time and layer count. The pin
    (``base.digest``, or ``base.image`` by digest) must be one the engine knows the image by: a repository digest,
    its id or its config digest."""
    stack = loaded.model
    image = stack.base.image
    with progress.step(f"resolve base image {image}"):
        info = _inspect(engine, image)
        if info is None:
            with progress.step(f"pull base image {image}"):
                proc = engine.pull(image, timeout=1800)
            if proc.returncode != 0:
                raise BuildFailed(
                    f"base image '{image}' is not present and could not be pulled: "
                    f"{(proc.stderr or proc.stdout).strip()[-300:]}",
                    **loaded.position(("base", "image")).as_error_kwargs(),
                    fix=f"pull or build it first, or redirect it: --set base.image=<IMAGE> (make image "
                    f"STACK={stack.name} ARGS='--set base.image=<IMAGE>')",
                )
            info = _inspect(engine, image) or {}
        image_id = str(info.get("Id") or "")
        line = loaded.line
        platform: tuple[str, str, str | None] | None = None
        if line is not None and line.declared:  # the platform the line builds for
            platform = line.os_arch
        elif info.get("Os") and info.get("Architecture"):
            platform = (str(info["Os"]), str(info["Architecture"]), str(info.get("Variant") or "") or None)
        config = engine.config_digest(image_id, platform) if image_id else ""
    known = {str(d).split("@", 1)[1] for d in info.get("RepoDigests") or [] if "@" in str(d)}
    pin = stack.base.digest or (image.split("@", 1)[1] if "@" in image else None)
    if pin and pin not in known | {image_id, config}:
        have = ", ".join(sorted(known | {config})) or image_id
        raise BuildFailed(
            f"base image '{image}' has digest {have}, but the stack pins {pin}",
            **loaded.position(("base", "digest") if stack.base.digest else ("base", "image")).as_error_kwargs(),
            fix="pull the pinned image, or update base.digest",
        )
    layers = info.get("Layers")
    return BaseImage(
        pin if pin and pin != config else None,
        config or None,
        str(info.get("Created") or "") or None,
        layers if isinstance(layers, int) else None,
        engine_id=image_id or None,
    )


#: what the build reads of the base image, as one JSON object (``index`` for the keys an engine may leave out)
INSPECT = (
    '{"Id":{{json .Id}},"RepoDigests":{{json .RepoDigests}},"Created":{{json .Created}},'
    '"Layers":{{len .RootFS.Layers}},"Os":{{json (index . "Os")}},"Architecture":{{json (index . "Architecture")}},'
    '"Variant":{{json (index . "Variant")}}}'
)


def _inspect(engine: Engine, image: str) -> dict | None:
    """The image's id, repository digests, creation time and layer count (one ``docker image inspect``), or None
    when it is not there."""
    proc = engine.inspect_image(image, INSPECT, timeout=30)
    if proc.returncode != 0:
        if engine.image_exists(image):  # not a missing image: say what failed
            raise BuildFailed(f"'docker image inspect {image}' failed: {(proc.stderr or '').strip()[-300:]}")
        return None
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        raise BuildFailed(f"'docker image inspect {image}' answered {proc.stdout.strip()[:200]!r}") from None
    return info if isinstance(info, dict) else {}


CAUSE = re.compile(
    r"Discarding|inconsistent version|Retrying|Connection refused|Name or service not known|"
    r"Temporary failure in name resolution|\b40[13]\b|DO NOT MATCH THE HASHES|Expected sha256|"
    r"No matching distribution|Could not find a version|^ERROR: |error:|Error|not found|No such file"
)


def _dedupe(lines):
    return list(dict.fromkeys(ln.strip() for ln in lines if ln.strip()))


def failure_reason(log: str) -> str:
    """The most useful lines of a failed build log: gate FAILs, or the failing step and its cause."""
    lines = log.splitlines()
    fails = [
        m.group(1).strip()
        for m in (GATE_LINE.match(ln) for ln in lines)
        if m and m.group(1).removeprefix("read-only: ").startswith("FAIL")
    ]
    if fails:
        return "dependency gate failed:\n  " + "\n  ".join(_dedupe(fails))
    names = {m.group(1): m.group(2) for m in (re.match(r"^#(\d+) (\[.*)$", ln) for ln in lines) if m}
    failing = [m.group(1) for m in (re.match(r"^#(\d+) ERROR", ln) for ln in lines) if m]
    step = failing[-1] if failing else None
    output = [m.group(2) for m in (re.match(r"^#(\d+) [\d.]+ (.*)$", ln) for ln in lines) if m and m.group(1) == step]
    causes = _dedupe(ln for ln in output if CAUSE.search(ln))
    retries = [ln for ln in causes if "Retrying" in ln]
    causes = [ln for ln in causes if "Retrying" not in ln or ln == retries[-1]][-8:]  # one retry line says it
    summary = _dedupe(ln[:240] for ln in lines if ln.startswith("ERROR: failed to solve"))[-1:]
    head = "build failed:"
    if step in names:
        label = names[step].split("]", 1)[0] + "]"
        pip = re.search(r"pip install --index-url (\S+)", names[step])
        what = f" (pip install from {pip.group(1)})" if pip else ""
        head = f"build step {label}{what} failed:"
    body = causes + summary if (causes or summary) else _dedupe(lines[-10:])
    return head + "\n  " + "\n  ".join(body)


def gate_lines(log: str) -> list[str]:
    return [m.group(1) for m in (GATE_LINE.match(ln) for ln in log.splitlines()) if m]


def prepare(
    loaded: ResolvedStack,
    engine: Engine,
    *,
    out: Path | None = None,
    sources: bool = True,
    syntax: str | None = None,
    workspace: Workspace | None = None,
    cache_scope: str = "",
) -> Prepared:
    """Everything before the engine runs, shared by `render`, `build` and `bake` so all three write the
    same bytes (and so share BuildKit's cache): the engine resolves the base image and says whether it
    honours SOURCE_DATE_EPOCH; ``sources=False`` asks the engine nothing and fetches no upstream.
    ``cache_scope``: a clean build's own cache mounts (:func:`~stackforge.builder.plan.render.clean_scope`)."""

    def engine_facts() -> EngineFacts:
        return EngineFacts(
            base_identity(engine, loaded),
            engine.supports_source_date_epoch(),
            engine.supports_run_network(),
            engine.supports_named_contexts(),
        )

    return prepare_dockerfile(
        loaded,
        out=out,
        sources=sources,
        syntax=syntax,
        engine_facts=engine_facts if sources else None,
        workspace=workspace,
        cache_scope=cache_scope,
    )


def drop_own_caches(engine: Engine, scope: str) -> None:
    """After a clean build (``scope``: its :func:`~stackforge.builder.plan.render.clean_scope`), remove its own cache
    mounts: no later build names them, and they hold as much as it downloaded and compiled. One that cannot be
    listed or removed (an engine without ``buildx du``, a mount still in use, as an interrupted build's are) is
    left to the builder's garbage collection."""
    if scope:
        try:
            engine.drop_cache_mounts(scope)
        except UserError:
            pass


def _stderr_line(line: str) -> None:
    """Where a build's BuildKit log goes by default: stderr, so stdout carries only the result."""
    print(line, file=sys.stderr, flush=True)


def _holding_build_dir(fn):
    """Run ``fn(loaded, opts, …)`` holding the lock of the stack's build directory for all of it."""

    @functools.wraps(fn)
    def locked(loaded: ResolvedStack, opts: BuildOptions | None = None, *args, **kwargs):
        opts = opts or BuildOptions()
        with stack_lock(build_dir_for(loaded, opts.out), timeout=opts.lock_timeout):
            return fn(loaded, opts, *args, **kwargs)

    return locked


@_holding_build_dir
def build(
    loaded: ResolvedStack,
    opts: BuildOptions | None = None,
    engine: Engine | None = None,
    echo: Callable[[str], None] | None = None,
    *,
    workspace: Workspace | None = None,
) -> BuildOutcome:
    """Build, gate and tag one target of the stack, with the workspace's engine (or ``engine``),
    credentials and CA bundle, and write its evidence bundle."""
    opts = opts or BuildOptions()
    echo = echo or _stderr_line
    stack = loaded.model
    ws = workspace_for(loaded, workspace)
    started = time.monotonic()
    target = default_target(loaded, opts.target)
    ref = target_ref(loaded, target)
    engine = engine or ws.engine
    line = loaded.line  # a declared platform line builds for its platform, on its builder when it names one
    info = engine.check()
    # A clean build runs with cache mounts of its own, which start empty: the shared ones stay as they are.
    scope = clean_scope() if opts.no_cache else ""
    prepared = prepare(loaded, engine, out=opts.out, syntax=opts.syntax, workspace=ws, cache_scope=scope)
    ctx, labels, build_args = prepared.ctx, prepared.labels, prepared.build_args
    evidence_dirs.keep_builds(opts.keep_builds)  # a bad value fails before the engine runs
    evidence = evidence_dirs.new_build(ctx.build_dir / "evidence")
    atomic_write(evidence / "Dockerfile", ctx.dockerfile.read_bytes())
    _write_inputs(
        evidence, loaded, ctx, labels, info, target, ref, bool(build_args.get("SOURCE_DATE_EPOCH")), prepared.base
    )
    if opts.cache is not None:  # where this build's cache came from and went (references only)
        atomic_write(evidence / "cache.json", json.dumps(opts.cache.record(), indent=2) + "\n")

    had = engine.image_id(ref)
    with recording_interrupts(engine, evidence, ref, had, started):
        with credentials.private_dir("stackforge-secrets-") as secrets_dir:
            secrets, contexts = host_inputs(loaded, secrets_dir, engine.supports_named_contexts(), ws)
            if opts.load:
                sbom.warm()  # its libraries import while the engine runs, not after it
            with progress.step(f"build {ref} with BuildKit (log: {evidence / 'build.log'})"):
                result = engine.build(
                    ctx.context_dir,
                    ctx.dockerfile,
                    platform=line.oci if line is not None and line.declared else None,
                    builder=engine.builder or (line.builder if line is not None else None),
                    target=target,
                    tags=[ref],
                    build_args=build_args,
                    secrets=secrets,
                    contexts=contexts,
                    load=opts.load,
                    no_cache=opts.no_cache,
                    on_line=echo,
                    log_file=evidence / "build.log",
                    extra_args=_extra_args(opts, ctx),
                )
                drop_own_caches(engine, scope)  # passed or failed; an interrupted build's are still in use
    log = result.log
    atomic_write(evidence / "gate.txt", "\n".join(gate_lines(log)) + "\n")
    if result.returncode != 0 or not opts.load:
        system.write_evidence(stack, engine, None, log, evidence)
    if result.returncode != 0:
        now = engine.image_id(ref)
        if now is not None and now != had:  # never leave a tag pointing at an unchecked image
            engine.remove_image(ref, force=True)
        atomic_write(
            evidence / "result.json",
            json.dumps(
                {"ok": False, "reason": failure_reason(log), "target": target, "tag": ref, "build_id": evidence.name},
                indent=2,
            ),
        )
        evidence_dirs.finish(evidence, ok=False, keep=opts.keep_builds)
        if opts.cache is not None and regcache.export_refused(log):
            raise UserError(
                f"{stack.name}/{target}: this builder cannot export build cache to {opts.cache.export} "
                f"(nothing was tagged; log: {evidence / 'build.log'})",
                file="--cache-to",
                fix=regcache.EXPORT_FIX,
            )
        raise BuildFailed(
            f"{stack.name}/{target}: {failure_reason(log)}\n  (no image was tagged; log: {evidence / 'build.log'})",
            fix="read the FAIL/ERROR lines above",
        )
    image_id = engine.image_id(ref) if opts.load else None
    # Read from the image once; a rebuild that yields the same image id from the same inputs reads the record.
    reports = (
        reuse.image_files(
            image_id, ctx.inputs_fingerprint(), ctx.build_dir, lambda: imagerecords.read(engine, ref, image_id)
        )
        if opts.load
        else {}
    )
    gate = reports.get("result.txt") or gate_lines(log)
    atomic_write(evidence / "gate.txt", "\n".join(gate) + "\n")
    checks = imagerecords.CHECKS
    for name, evidence_name in (("abi.txt", "abi.txt"), ("readonly.txt", "gate-readonly.txt"), (checks, checks)):
        if name in reports:
            atomic_write(evidence / evidence_name, "\n".join(reports[name]) + "\n")
    if opts.load:
        system.write_evidence(stack, engine, None, log, evidence, lines=reports.get("system.txt"))
        installed = _json_or_none(reports.get("inventory.json"))
        inventory.write_evidence(engine, ref, ctx.context_dir, evidence, data=installed)
        if installed is not None and image_id is not None:
            sbom.write_evidence(engine, ref, image_id, evidence, installed, reports.get(imagerecords.DPKG, []))
        target_reports.write_evidence(stack, target, engine, ref, evidence, echo=_stderr_line)
    outcome = BuildOutcome(stack.name, target, ref, image_id, evidence, gate, round(time.monotonic() - started, 1))
    atomic_write(
        evidence / "result.json",
        json.dumps(
            {"ok": True, **asdict(outcome), "evidence": str(evidence), "build_id": evidence.name}, indent=2, default=str
        ),
    )
    evidence_dirs.finish(evidence, ok=opts.load, keep=opts.keep_builds)
    return outcome


def _extra_args(opts: BuildOptions, ctx: Context) -> list[str]:
    """The run's network (none for a mirror build) and its registry cache, as buildx arguments."""
    network = "none" if ctx.mirror else opts.network
    return ([f"--network={network}"] if network else []) + (opts.cache.buildx_args() if opts.cache else [])


def _json_or_none(lines: list[str] | None) -> dict | None:
    """The image's inventory as its records hold it, typed (a wrong shape is an error naming the field)."""
    return inventory.parse("\n".join(lines), source=f"the image's {inventory.IMAGE_PATH}") if lines else None


@contextmanager
def recording_interrupts(engine: Engine, evidence: Path, ref: str, had: str | None, started: float):
    """Around the engine run: on SIGINT/SIGTERM (the engine's process group is already stopped and the
    secrets directory removed by the inner blocks) drop a tag the interrupted run may have moved, write
    ``result.json`` with status ``interrupted`` and the signal, and let the interruption go on."""
    try:
        yield
    except Interrupted as intr:
        try:
            now = engine.image_id(ref)
            if now is not None and now != had:
                engine.remove_image(ref, force=True)
        except UserError:
            pass
        atomic_write(
            evidence / "result.json",
            json.dumps(
                {
                    "ok": False,
                    "status": "interrupted",
                    "signal": intr.name,
                    "reason": f"interrupted by {intr.name}",
                    "duration_s": round(time.monotonic() - started, 1),
                },
                indent=2,
            ),
        )
        intr.notes.append(
            f"the engine was stopped, the build's secrets removed and nothing was tagged "
            f"(record: {evidence / 'result.json'})"
        )
        raise


def _write_inputs(
    evidence: Path,
    loaded: ResolvedStack,
    ctx: Context,
    labels: dict,
    info,
    target: str,
    ref: str,
    epoch: bool = False,
    base: BaseImage | None = None,
) -> None:
    """``epoch``: the engine stamps the image with SOURCE_DATE_EPOCH (its ``created`` label may be left out).
    ``base``: the base image as the engine resolved it (``base.engine_id`` is this engine's name for it, which
    the no-op build asks the engine about; the labels hold its config digest)."""
    stack = loaded.model
    data = {
        "stack": stack.name,
        "target": target,
        "tag": ref,
        "fingerprint": fingerprint(stack),
        "inputs_fingerprint": ctx.inputs_fingerprint(),
        "locks": ctx.locks,
        "pins": {n: p.version for n, p in stack.packages.items()},
        "options": {n: o.value for n, o in stack.options.items()},
        "tuning": dict(stack.tuning),
        "upstreams": [s.record() for s in ctx.sources],
        "overrides": [redact_text(o) for o in loaded.overrides],
        "labels": labels,
        "engine": asdict(info),
        **({"base": {"image": loaded.model.base.image, **asdict(base)}} if base else {}),
        "source_date_epoch": ctx.source_date_epoch if labels.get("org.opencontainers.image.created") or epoch else None,
        "resolved": resolved(stack),
        "time": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **({"mirror": ctx.mirror} if ctx.mirror else {}),
    }
    atomic_write(evidence / "inputs.json", json.dumps(data, indent=2) + "\n")
