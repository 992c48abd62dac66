"""One ``docker buildx bake`` plan for a matrix of stacks × targets.

Each stack's context and Dockerfile are prepared exactly as ``stackforge build`` prepares
them (same labels, same build args, same secrets), and every (stack, target) becomes one
bake target. BuildKit solves all targets of one bake run together: a stage that several
stacks share (the base stage, a deps phase with the same pins, an identical kernel) has the
same cache key everywhere and is built once. ``--builder`` selects any buildx builder, so a
remote or Kubernetes BuildKit cluster runs the same plan when one machine is not enough.

A failing target makes BuildKit cancel the rest of that solve; ``stackforge nightly`` then
builds each (stack, target) on its own, from the cache the bake filled, to get a verdict,
gate output and evidence per stack.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge.builder.context.context import build_dir_for
from stackforge.builder.plan import cabundle
from stackforge.builder.plan.render import clean_scope
from stackforge.builder.plan.secrets import host_inputs, secret_files
from stackforge.builder.run.regcache import RegistryCache
from stackforge.builder.run.run import default_target, drop_own_caches, target_ref
from stackforge.builder.run.run import prepare as prepare_build
from stackforge.clients.engine import Engine
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import UserError
from stackforge.fslock import stack_lock, stack_locks
from stackforge.signals import Interrupted
from stackforge.stack.targets import published

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack

SECRET_PLACEHOLDER = "(a temporary file written by `stackforge bake` when it runs)"


@dataclass
class BakeTarget:
    name: str  # bake target name, e.g. "post2-vllm-openai"
    stack: str
    target: str  # Dockerfile stage
    ref: str  # local tag
    context: Path
    dockerfile: Path
    args: dict[str, str] = field(default_factory=dict)
    secrets: list[tuple[str, str]] = field(default_factory=list)  # (id, src) — src may be a placeholder
    contexts: dict[str, str] = field(default_factory=dict)  # named build contexts (name -> dir or placeholder)

    def definition(self, load: bool = True, cache: RegistryCache | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "context": str(self.context),
            "dockerfile": str(self.dockerfile),
            "target": self.target,
            "tags": [self.ref],
        }
        if self.args:
            d["args"] = dict(self.args)
        if self.secrets:
            d["secret"] = [f"id={sid},src={src}" for sid, src in self.secrets]
        if self.contexts:
            d["contexts"] = dict(self.contexts)
        if load:
            d["output"] = ["type=docker"]
        if cache is not None:
            d.update(cache.for_target(self.name).bake_fields())
        return d

    def reads(self) -> list[str]:
        """The host paths the engine reads for this target: its context, Dockerfile, secret files and named
        contexts (placeholders left out)."""
        found = [str(self.context), str(self.dockerfile), *(src for _, src in self.secrets), *self.contexts.values()]
        return [path for path in found if os.path.isabs(path) and os.path.exists(path)]


def target_name(stack: str, target: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{stack}-{target}")


#: the targets of a bake: one list for every stack (None: each stack's published targets), or a list per stack name
Targets = list[str] | Mapping[str, list[str]] | None


def targets_of(targets: Targets, stack: str) -> list[str] | None:
    """The targets ``targets`` gives the stack named ``stack``."""
    if isinstance(targets, Mapping):
        return list(targets.get(stack) or []) or None
    return targets


def stack_targets(loaded: ResolvedStack, targets: list[str] | None) -> list[str]:
    """Every published target of the stack, or those of ``targets`` it has (none of them: an error with the fix)."""

    stack = loaded.model
    if not targets:
        default_target(loaded, None)  # a stack without targets is an error with a fix
        return published(stack)  # an intermediate target (publish: false) is built only as a parent
    chosen = [t for t in targets if t in published(stack)]
    return chosen or [default_target(loaded, targets[0])]


def prepare(
    stacks: list[ResolvedStack],
    *,
    targets: Targets = None,
    engine: Engine | None = None,
    sources: bool = True,
    secrets_dir: Path | None = None,
    syntax: str | None = None,
    workspace: Workspace | None = None,
    cache_scope: str = "",
) -> list[BakeTarget]:
    """Assemble each stack's context and Dockerfile (as ``stackforge build`` does) and describe its targets.

    ``sources=False`` renders the plan without fetching upstreams (for ``--print``); the secret
    files are then not written either and their ``src`` is a placeholder (so is the CA bundle's context).
    The engine, credentials and CA bundle are the workspace's (default: the one at each stack's root).
    ``cache_scope``: a clean bake's own cache mounts (``render.clean_scope``), the same for every stack of it.
    """

    out: list[BakeTarget] = []
    for loaded in stacks:
        ws = workspace_for(loaded, workspace)
        stack = loaded.model
        names = stack_targets(loaded, targets_of(targets, loaded.name))
        with stack_lock(build_dir_for(loaded)):
            prepared = prepare_build(
                loaded, engine or ws.engine, sources=sources, syntax=syntax, workspace=ws, cache_scope=cache_scope
            )
        ctx, args = prepared.ctx, prepared.build_args
        secrets, contexts = _host_inputs(loaded, secrets_dir, ws, engine or ws.engine, sources)
        for t in names:
            out.append(
                BakeTarget(
                    name=target_name(stack.name, t),
                    stack=stack.name,
                    target=t,
                    ref=target_ref(loaded, t),
                    context=ctx.context_dir,
                    dockerfile=ctx.dockerfile,
                    args=dict(args),
                    secrets=list(secrets),
                    contexts=dict(contexts),
                )
            )
    return out


def _host_inputs(
    loaded: ResolvedStack, secrets_dir: Path | None, ws: Workspace, engine: Engine, sources: bool
) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The secrets and named contexts of one stack's targets (``builder/plan/secrets.py``), as the engine takes the
    CA bundle (a plan rendered without sources asks the engine nothing: a named context, as it renders);
    without ``secrets_dir`` nothing is written and each path is a placeholder."""
    named = engine.supports_named_contexts() if sources else True
    if secrets_dir is not None:
        sub = secrets_dir / loaded.name
        sub.mkdir(mode=0o700, exist_ok=True)
        files, dirs = host_inputs(loaded, sub, named, ws)
        return [(sid, str(path)) for sid, path in files], {name: str(d) for name, d in dirs.items()}
    placeholders = [(sid, SECRET_PLACEHOLDER) for sid, _ in secret_files(loaded, None, ws, ca_secret=not named)]
    bundle = named and ws.ca_bundle_file() is not None
    return placeholders, {cabundle.CONTEXT: SECRET_PLACEHOLDER} if bundle else {}


def plan(
    items: list[BakeTarget], *, load: bool = True, group: str = "default", cache: RegistryCache | None = None
) -> dict[str, Any]:
    """The bake JSON: one group with every target (each importing and exporting ``cache``, when given)."""
    names = [i.name for i in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UserError(
            f"two stacks/targets map to the same bake target name: {', '.join(dup)}",
            fix="rename one of the stacks or targets",
        )
    return {"group": {group: {"targets": names}}, "target": {i.name: i.definition(load, cache) for i in items}}


@dataclass
class BakeRun:
    returncode: int
    log_file: Path
    metadata: dict[str, Any]
    duration_s: float


def run(
    items: list[BakeTarget],
    workdir: Path,
    *,
    engine: Engine | None = None,
    load: bool = True,
    no_cache: bool = False,
    on_line: Callable[[str], None] | None = None,
    cache: RegistryCache | None = None,
) -> BakeRun:
    """Write ``workdir/bake.json`` and run it with ``engine`` (and its builder); the log goes to
    ``workdir/bake.log``. A failing bake is not raised."""

    engine = engine or Engine()
    workdir.mkdir(parents=True, exist_ok=True)
    plan_file = workdir / "bake.json"
    plan_file.write_text(json.dumps(plan(items, load=load, cache=cache), indent=2) + "\n")
    metadata_file = workdir / "bake-metadata.json"
    log_file = workdir / "bake.log"
    log_file.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        reads = list(dict.fromkeys(path for i in items for path in i.reads()))
        rc = engine.bake(
            plan_file, no_cache=no_cache, metadata_file=metadata_file, on_line=on_line, log_file=log_file, reads=reads
        ).returncode
    except Interrupted as intr:
        # The engine's process group is already stopped; the log ends with what stopped it.
        with log_file.open("a") as log:
            log.write(
                f"stackforge: interrupted by {intr.name} after {time.monotonic() - started:.1f} s; "
                "the bake was stopped and loaded nothing further\n"
            )
        intr.notes.append(f"the bake was stopped (log: {log_file})")
        raise
    try:
        metadata = json.loads(metadata_file.read_text()) if metadata_file.exists() else {}
    except ValueError:
        metadata = {}
    return BakeRun(rc, log_file, metadata, round(time.monotonic() - started, 1))


def bake(
    stacks: list[ResolvedStack],
    *,
    workspace: Workspace | None = None,
    targets: Targets = None,
    load: bool = True,
    no_cache: bool = False,
    workdir: Path,
    engine: Engine | None = None,
    on_line: Callable[[str], None] | None = None,
    cache: RegistryCache | None = None,
) -> tuple[list[BakeTarget], BakeRun]:
    """Prepare every stack, then run one bake over all their targets with the workspace's engine (or
    ``engine``), holding every stack's build directory lock until it ends. Secrets live only while it runs."""

    engine = engine or (workspace.engine if workspace is not None else Engine())
    engine.check()
    with stack_locks(build_dir_for(s) for s in stacks):
        return _bake(
            stacks,
            workspace,
            targets=targets,
            load=load,
            no_cache=no_cache,
            workdir=workdir,
            engine=engine,
            on_line=on_line,
            cache=cache,
        )


def _bake(
    stacks: list[ResolvedStack],
    workspace: Workspace | None,
    *,
    targets,
    load,
    no_cache,
    workdir: Path,
    engine: Engine,
    on_line,
    cache: RegistryCache | None = None,
) -> tuple[list[BakeTarget], BakeRun]:
    secrets_dir = Path(tempfile.mkdtemp(prefix="stackforge-bake-secrets-"))
    os.chmod(secrets_dir, 0o700)
    scope = clean_scope() if no_cache else ""  # a clean bake's cache mounts are its own; the shared ones stay
    try:
        items = prepare(
            stacks, targets=targets, engine=engine, secrets_dir=secrets_dir, workspace=workspace, cache_scope=scope
        )
        workdir.mkdir(parents=True, exist_ok=True)
        for i in items:  # what the bake built, beside its plan (a later `build` rewrites build/<stack>/)
            shutil.copy2(i.dockerfile, workdir / f"{i.stack}.Dockerfile")
        result = run(items, workdir, engine=engine, load=load, no_cache=no_cache, on_line=on_line, cache=cache)
        drop_own_caches(engine, scope)  # passed or failed; an interrupted bake's are still in use
    finally:
        shutil.rmtree(secrets_dir, ignore_errors=True)
    # The plan on disk keeps no path to a deleted secret file.
    root = stacks[0].root if stacks else workdir
    (workdir / "bake.json").write_text(json.dumps(plan(portable(items, root), load=load, cache=cache), indent=2) + "\n")
    return items, result


#: a host file the plan names by what it is, not by where it is on this host
HOST_SECRET = "(on the host that runs the bake: {what})"
SECRET_WHAT = {
    "netrc": "the index credentials stackforge writes",
    "cabundle": "the CA bundle (--ca-bundle)",
    "stackforge-cabundle": "a directory holding the CA bundle (--ca-bundle) as ca.pem",
}


def portable(items: list[BakeTarget], root: Path) -> list[BakeTarget]:
    """The targets as a plan that can be committed or sent to another builder: contexts relative to the
    repository ``root`` (run ``docker buildx bake`` there), each Dockerfile relative to its context, and every
    secret named by what it holds instead of a host path."""
    out = []
    for i in items:
        context = Path(os.path.relpath(i.context, root)) if Path(i.context).is_relative_to(root) else i.context
        dockerfile = Path(os.path.relpath(i.dockerfile, i.context))
        secrets = [(sid, HOST_SECRET.format(what=SECRET_WHAT.get(sid, sid))) for sid, _ in i.secrets]
        contexts = {name: HOST_SECRET.format(what=SECRET_WHAT.get(name, name)) for name in i.contexts}
        out.append(BakeTarget(i.name, i.stack, i.target, i.ref, context, dockerfile, dict(i.args), secrets, contexts))
    return out
