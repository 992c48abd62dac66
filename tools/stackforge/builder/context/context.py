"""Assemble the build context on the host: patched upstream sources, pins, gate spec.

Everything the engine needs is here before the build starts, so nothing inside
the build talks to GitHub: upstreams come from the host-side cache (a verified
git mirror or a checksummed release sdist), patched in order with its patch series.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from stackforge.builder.context import embed
from stackforge.builder.locks import reqlocks
from stackforge.builder.locks.locks import read_locks, unlocked_notes
from stackforge.builder.mirror.offline import apply
from stackforge.builder.plan import artifacts, installed, requirements
from stackforge.builder.plan.cabundle import CaMount
from stackforge.builder.plan.plan import INSTALLER, Plan, make_plan, pip_phases
from stackforge.builder.plan.render import images_dir, render_dockerfile, requirements_text, templates_digest
from stackforge.builder.plan.system import write_context as write_system_context
from stackforge.builder.plan.targets import write_context as write_target_context
from stackforge.builder.sources import agree, reuse
from stackforge.builder.sources.contextfiles import context_time, normalize_tree
from stackforge.builder.sources.sources import SourceInfo, export_source
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.fslock import atomic_write, stack_lock
from stackforge.stack.installed import export_order
from stackforge.stack.load import LoadedStack, fingerprint
from stackforge.stack.model import Stack


@dataclass
class Context:
    loaded: LoadedStack
    plan: Plan
    build_dir: Path  # build/<stack>/
    context_dir: Path  # build/<stack>/context/
    dockerfile: Path
    sources: list[SourceInfo]
    locks: dict[str, str] = field(default_factory=dict)  # index -> sha256 of its lock file
    base: str | None = None  # the base image's digest (or id), once resolved
    post_install: dict[str, str] = field(default_factory=dict)  # dist -> sha256:<patch>:applied|skipped
    mirror: dict | None = None  # the mirror an offline build reads (directory, manifest sha256)
    files_time: int | None = None  # the time every file of the context is dated (contextfiles.context_time)

    @property
    def stack(self) -> Stack:
        return self.loaded.model

    def inputs_fingerprint(self) -> str:
        """sha256 over everything the image is built from: the resolved stack, the base image's digest,
        the upstream pins (with their submodules' commits) and patch series, the lock files, and the templates
        and gate scripts."""
        blob = json.dumps(
            {
                "stack": fingerprint(self.stack),
                "base": self.base,
                "sources": [s.record() for s in self.sources],
                "locks": self.locks,
                "templates": templates_digest(images_dir(self.loaded.root)),
                **({"post_install": self.post_install} if self.post_install else {}),
            },
            sort_keys=True,
        ).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()

    @property
    def series(self) -> dict[str, str]:
        return {s.name: s.series_hash for s in self.sources if s.series_hash}

    @property
    def source_date_epoch(self) -> int | None:
        """The first upstream's SOURCE_DATE_EPOCH (its pinned commit's time, or when its sdist was packed)."""
        for s in self.sources:
            return s.commit_time
        return None


def build_dir_for(loaded: LoadedStack, out: Path | None = None) -> Path:
    """``out``, or build/<stack>/ in the stack's repository (build/<stack>@<line>/ for a platform line that is not
    the stack's own)."""
    return Path(out) if out else loaded.root / "build" / (loaded.name + (loaded.line.suffix if loaded.line else ""))


def assemble(
    loaded: LoadedStack,
    out: Path | None = None,
    *,
    sources: bool = True,
    workspace: Workspace | None = None,
    base_epoch: int | None = None,
) -> Context:
    """Write build/<stack>/context/ under the build directory's lock. With ``sources=False`` upstreams
    are not fetched (for `render --no-sources`, which shows the plan only); fetched upstreams are
    cached in the workspace's cache (default: the one at the stack's root).

    The context is assembled in a temporary directory beside it and renamed into place, so
    build/<stack>/context/ is the previous complete context or the new one; a failure removes
    the temporary directory. Once written, its entries get the context's modes and time
    (:mod:`stackforge.builder.sources.contextfiles`: ``base_epoch``, the base image's creation time, when the caller knows
    it), whatever the umask and clock they were written under; the offline mirror's files, linked from the mirror
    and only mounted into steps, are left as they are."""
    root = loaded.root
    ws = workspace_for(loaded, workspace)
    locks = read_locks(loaded)
    for note in unlocked_notes(loaded):  # not an error: the phase installs, without --require-hashes
        print(note, file=sys.stderr)
    plan = make_plan(loaded, {i: str(ln.path.relative_to(root)) for i, ln in locks.items()})
    bdir = build_dir_for(loaded, out)
    ctx_dir = bdir / "context"
    with stack_lock(bdir):
        _remove_leftovers(bdir)
        bdir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".context-", suffix=STAGING_SUFFIX, dir=bdir))
        try:
            os.chmod(staging, 0o755)  # as a plain mkdir would make it, not mkdtemp's 0700
            infos, post_install = _fill(loaded, plan, locks, staging, sources, root, ws)
            mirrored = _offline(loaded, plan, staging, ws) if ws.mirror is not None else None
            normalize_tree(staging, mtime=context_time(base_epoch), skip=[MIRROR_DIR])
            _swap(staging, ctx_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    dockerfile = bdir / "Dockerfile"
    lock_hashes = {i: hashlib.sha256(ln.text.encode()).hexdigest() for i, ln in locks.items()}
    return Context(
        loaded,
        plan,
        bdir,
        ctx_dir,
        dockerfile,
        infos,
        lock_hashes,
        post_install=post_install,
        mirror=mirrored,
        files_time=context_time(base_epoch),
    )


def _offline(loaded: LoadedStack, plan: Plan, staging: Path, ws: Workspace) -> dict:
    assert ws.mirror is not None
    return apply(loaded, plan, ws.mirror, staging)


STAGING_SUFFIX = ".partial"
#: the offline mirror's tree in the context (``builder/mirror/offline.py``, ``builder/mirror/apt.py``)
MIRROR_DIR = "mirror"


def _remove_leftovers(bdir: Path) -> None:
    """Remove staging directories a killed run left behind (the caller holds the lock)."""
    for path in [bdir / "context.partial", *bdir.glob(f".context-*{STAGING_SUFFIX}*")]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _fill(
    loaded: LoadedStack, plan: Plan, locks: dict, staging: Path, sources: bool, root: Path, workspace: Workspace
) -> tuple[list[SourceInfo], dict[str, str]]:
    """Requirements files, the gate and the (patched) upstream sources (through the workspace's cache),
    written into ``staging``."""
    stack = loaded.model
    (staging / "deps").mkdir(parents=True)
    hashes = {n: p.sha256 for n, p in stack.packages.items() if p.sha256}
    if stack.base.pip and stack.base.pip.sha256:
        hashes["pip"] = stack.base.pip.sha256
    for phase in plan.phases:
        if phase.files:
            continue  # a requirement phase: written from the upstream trees below
        if phase.lock:
            text = locks[phase.lock_key()].text
        else:
            text = requirements_text(phase.pins, hashes if phase.require_hashes else None)
        atomic_write(staging / phase.requirements, text)
    _write_build_envs(plan, locks, hashes, staging)
    constrained = any(phase.constraints == requirements.CONSTRAINTS for phase in pip_phases(stack))
    if not sources:
        requirements.write_phases(loaded, staging, None, {}, atomic_write, constrained)
    gate_dir = staging / "gate"
    shutil.copytree(images_dir(root) / "gate", gate_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    atomic_write(gate_dir / "gate.json", json.dumps(plan.gate, indent=2) + "\n")
    post_install = installed.write_context(loaded, plan.post_install, staging, images_dir(root))
    write_system_context(plan.system, images_dir(root), staging)
    artifacts.write_context(plan.files, images_dir(root), staging)
    embed.write_context(loaded, staging)
    infos: list[SourceInfo] = []
    if sources:
        exported = {}
        for name in export_order(stack):

            def export(dest: Path, name: str = name) -> SourceInfo:
                return export_source(loaded, name, dest, workspace)

            exported[name] = reuse.exported(
                loaded, name, staging, staging.parent / "context", export, refresh=workspace.refresh
            )
        infos = [exported[name] for name in stack.upstreams]
        agree.check_trees(loaded, {n: staging / "src" / n for n in stack.upstreams})
        requirements.write_phases(
            loaded,
            staging,
            {n: staging / "src" / n for n in stack.upstreams},
            {i.name: i.pin for i in infos},
            atomic_write,
            constrained,
        )
        for k in plan.kernels:
            artifacts.check_uses(loaded, k.name, k.upstream, staging / "src" / k.upstream)
        reqlocks.check_fresh(loaded, locks, {n: staging / "src" / n for n in stack.upstreams})
    else:
        for name in stack.upstreams:
            (staging / "src" / name).mkdir(parents=True)
    write_target_context(
        loaded,
        plan.target_stages,
        images_dir(root),
        staging,
        {n: staging / "src" / n for n in stack.upstreams} if sources else None,
        {i.name: i.pin for i in infos},
    )
    return infos, post_install


def _write_build_envs(plan: Plan, locks: dict, hashes: dict[str, list[str]], staging: Path) -> None:
    """The requirement files of each kernel's own build environment: its pins, hashed as its phase is (from the
    phase's lock, else the stack's sha256); the installer phase's file is the main one."""
    for k in plan.kernels:
        for phase in k.build_env or []:
            if phase.name == INSTALLER:
                continue
            names = [p.split("==", 1)[0] for p in phase.pins]
            if phase.lock:
                by_pin = {n: locks[phase.lock_key()].pins[canonicalize_name(n)][1] for n in names}
            else:
                by_pin = {n: hashes.get(n, []) for n in names} if phase.require_hashes else {}
            (staging / phase.requirements).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(staging / phase.requirements, requirements_text(phase.pins, by_pin))


def _swap(staging: Path, ctx_dir: Path) -> None:
    """Rename the complete ``staging`` to ``ctx_dir``; the previous context is moved aside, then removed."""
    old = staging.with_name(staging.name + ".old")
    if ctx_dir.exists() or ctx_dir.is_symlink():
        ctx_dir.rename(old)
    try:
        staging.rename(ctx_dir)
    except BaseException:
        if old.exists() and not ctx_dir.exists():
            old.rename(ctx_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_dockerfile(
    ctx: Context,
    labels: dict[str, str],
    syntax: str | None = None,
    run_network: bool = False,
    ca: CaMount | None = None,
    cache_scope: str = "",
) -> Path:
    """Write build/<stack>/Dockerfile (whole, under the build directory's lock); ``cache_scope``: a clean build's
    own cache mounts (``render.clean_scope``)."""
    with stack_lock(ctx.build_dir):
        atomic_write(
            ctx.dockerfile,
            render_dockerfile(
                ctx.plan,
                labels,
                syntax=syntax,
                root=ctx.loaded.root,
                run_network=run_network,
                ca=ca,
                cache_scope=cache_scope,
            ),
        )
    return ctx.dockerfile
