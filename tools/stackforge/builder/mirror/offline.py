"""``stackforge build STACK --offline --mirror DIR``: the build's side of a mirror.

Nothing here reaches the network, on the host or in the engine:

- upstreams: :func:`upstream_cache` lays out a cache view whose entries are the mirror's git repositories and
  sdists, and the build reads it with ``offline=True`` (a missing pin is an error, never a fetch);
- pip phases: :func:`apply` checks that the mirror resolved each phase exactly as the context declares it
  (same requirements, constraints, flags and target), copies each index's PEP 503 tree into the build context
  (``mirror/<index>/``) and points the phase at it as ``file:///stackforge/mirror/<index>/simple``, bind-mounted
  from the context in that RUN alone. The build then runs with ``--network=none``: the engine gives its RUN
  steps no network at all, which a loopback HTTP server would not allow (it needs ``--network=host``);
- target pip phases: the same, resolved with the constraints the image writes before each;
- apt: every system layer that installs reads the mirror's flat repository (``mirror/apt``, bind-mounted in its
  RUN step; :mod:`stackforge.builder.mirror.apt`);
- kernel toolchains: each ``toolchain-<kernel>`` stage starts FROM the image the mirror built and saved, when
  it was built from the same inputs (:mod:`stackforge.builder.mirror.toolchains`);
- the base image: :func:`load_base` loads it from the mirror's archive when the engine does not have it, and
  refuses an engine image of that name with another id; then it loads the toolchain images.

The stack's values are not changed, so the fingerprint and the image labels are the online build's; the
evidence (``inputs.json``) records the mirror and its manifest's sha256.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge import progress
from stackforge.builder.mirror import apt, manifest, toolchains
from stackforge.builder.mirror.manifest import BASE, target_phase_view
from stackforge.builder.plan import resolve
from stackforge.clients import upstream as upstreams
from stackforge.clients.engine import Engine
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError, printable
from stackforge.fslock import file_sha256
from stackforge.urls import split as split_credentials

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack

#: where a phase's index tree is mounted in its RUN step
MOUNT = "/stackforge/mirror"
FIX = "re-run `stackforge mirror {stack} --to DIR` with the same --set values on a host with network"


def _fix(loaded: ResolvedStack) -> str:
    return FIX.format(stack=loaded.name)


def _manifest(loaded: ResolvedStack, root: Path) -> dict:
    data = manifest.read(root)
    assert data is not None
    if data.get("stack") != loaded.name:
        raise UserError(
            f"{printable(root)} is the mirror of stack '{printable(data['stack'])}', not '{loaded.name}'",
            file="--mirror",
            fix=_fix(loaded),
        )
    return data


def upstream_cache(loaded: ResolvedStack, workspace: Workspace) -> Path:
    """A cache directory whose git mirrors and sdists are the mirror's (links), for the build's offline fetch."""
    root = workspace.mirror
    assert root is not None
    data = _manifest(loaded, root)
    view = workspace.cache("mirror-view") / file_sha256(root / manifest.MANIFEST)[:16]
    for name, up in loaded.model.upstreams.items():
        if up.sdist is not None:
            rec = next((p for p in data["parts"] if p["kind"] == "sdist" and p["sha256"] == up.sdist.sha256), None)
            if rec is None or not manifest.inside(root, rec["path"]).is_file():
                raise UserError(
                    f"upstreams.{name}.sdist: the mirror holds no {up.sdist.name}=={up.sdist.version} "
                    f"with sha256 {up.sdist.sha256}",
                    file="--mirror",
                    fix=_fix(loaded),
                )
            manifest.checked(root, rec, rec["path"])  # other bytes are a sha256 mismatch, not a missing file
            link = view / "sdist" / up.sdist.sha256 / Path(rec["path"]).name
        elif up.git is not None:
            repo = manifest.inside(root, f"git/{name}.git")
            if not repo.is_dir():
                raise UserError(
                    f"upstreams.{name}: the mirror holds no repository of it", file="--mirror", fix=_fix(loaded)
                )
            manifest.inside_tree(root, f"git/{name}.git")
            if (repo / "objects" / "info" / "alternates").exists():
                raise UserError(
                    f"git/{name}.git in the mirror borrows objects from elsewhere (objects/info/alternates)",
                    file="--mirror",
                    fix=manifest.REMAKE,
                )
            url = upstreams.resolve_git_url(split_credentials(up.git)[0], loaded.root)
            link, rec = upstreams.mirror_path(url, view), {"path": f"git/{name}.git"}
        else:
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to((root / rec["path"]).resolve())
    return view


def apply(loaded: ResolvedStack, plan, root: Path, staging: Path) -> dict:
    """Point every pip phase of ``plan`` at the mirror's tree of its index, copied into the context in
    ``staging``; returns what the evidence records of the mirror."""
    data = _manifest(loaded, root)
    target = resolve.Target.of(loaded.model)
    toolchains.apply(loaded, plan, data, staging, _fix(loaded))
    copied: set[str] = set()
    phases: list[tuple[Any, str, str, Callable[[], str]]] = [
        (p, p.name, p.key, functools.partial(manifest.phase_key, p, staging, target))
        for p in plan.phases
        if not p.no_index
    ]
    for t in plan.target_stages:
        phases += [(ph, ph.key, ph.key, functools.partial(_target_key, plan, t, ph, staging, target)) for ph in t.pip]
    for phase, name, key, want in phases:
        have = data["phases"].get(name)
        if have is None or have.get("key") != want():
            raise UserError(
                f"{key}: the mirror holds no resolution of pip phase {name} as the stack "
                f"declares it now (other pins, requirement files or target)",
                file="--mirror",
                fix=_fix(loaded),
            )
        if phase.index not in copied:
            _copy_tree(data, root, phase.index, staging / "mirror" / phase.index)
            copied.add(phase.index)
        _point(phase)
    # A kernel's own build environment installs some of a phase's pins: the index's tree holds them.
    for phase in (ph for k in plan.kernels for ph in k.build_env or []):
        if phase.index not in copied:
            raise UserError(
                f"{phase.key}: no pip phase of index {phase.index} is in the mirror",
                file="--mirror",
                fix=_fix(loaded),
            )
        _point(phase)
    apt.apply(plan, root, data, staging, _fix(loaded))
    return {
        "directory": str(root.resolve()),
        "manifest": manifest.digest(root),
        "made_for_fingerprint": data["fingerprint"],
        "network": "none",
    }


def _point(phase) -> None:
    """Install from the mirror's copy of the phase's index, mounted into the step, with no credentials."""
    phase.index_url = f"file://{MOUNT}/{phase.index}/simple"
    phase.mirror = f"mirror/{phase.index}"
    phase.credentials = False


def _target_key(plan, t, ph, staging: Path, target: resolve.Target) -> str:
    with tempfile.TemporaryDirectory(prefix="stackforge-offline-") as tmp:
        return manifest.target_phase_key(target_phase_view(plan, t, ph, staging, Path(tmp)), target)


def _copy_tree(data: dict, root: Path, index: str, dest: Path) -> None:
    """The index's files (each checked against the manifest's sha256) and its simple/ pages."""
    for rec in data["parts"]:
        if rec["kind"] == "file" and rec.get("index") == index:
            path = manifest.checked(root, rec, rec["path"])
            _link(path, dest / "files" / path.name)
    simple = manifest.inside_tree(root, f"indexes/{index}/simple")
    if not simple.is_dir():
        raise UserError(f"indexes/{index}/simple in the mirror is missing", file="--mirror", fix=manifest.REMAKE)
    shutil.copytree(simple.resolve(), dest / "simple", dirs_exist_ok=True)


def _link(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def load_base(loaded: ResolvedStack, root: Path, engine: Engine) -> None:
    """The stack's base image in the engine, loaded from the mirror when missing, with the mirror's id; then
    the kernels' toolchain images."""
    data = _manifest(loaded, root)
    rec = manifest.part(data, BASE)
    image = loaded.model.base.image
    if rec is None or rec.get("image") != image:
        raise UserError(f"base.image: the mirror holds no image {image}", file="--mirror", fix=_fix(loaded))
    have = engine.image_id(image)
    if have is None:
        path = manifest.checked(root, rec, BASE)
        with progress.step(f"load base image {image} from the mirror"):
            engine.load(path, timeout=3600)
        have = engine.image_id(image)
    line = loaded.line
    platform = line.os_arch if line is not None and line.declared else None
    # the mirror names its base by its config's digest (the build's base identity, the same on either image store)
    have = engine.config_digest(have, platform) if have else None
    if have != rec["id"]:
        raise UserError(
            f"base.image: the engine's {image} is {have}, the mirror's is {rec['id']}",
            file="--mirror",
            fix=f"remove the engine's image (docker image rm {image}) so the mirror's "
            "is loaded, or make the mirror again from this one",
        )
    toolchains.load(loaded, root, data, engine, _fix(loaded))
