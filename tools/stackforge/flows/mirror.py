"""``stackforge mirror STACK --to DIR``: copy everything a build of the stack needs into DIR.

The build context is assembled as the build assembles it (upstreams through the workspace's cache, requirement
files flattened from the patched trees, locks read), then:

- each git upstream: a bare repository holding the pinned commit (``refs/heads/stackforge/pinned``) and tag;
- each sdist upstream: its release sdist (sha256 checked against the pin), also served by its index's tree;
- each pip phase of the deps stage: ``pip download`` with the phase's own flags, requirements and constraints
  (the files the Dockerfile installs from), for the stack's Python and platform (``builder/plan/resolve.py``'s target
  and a marker shim), from the phase's index with its credential; a phase after the vendor phases also sees the
  vendor wheels already mirrored (``--find-links``), as the build has them installed; a phase whose
  requirements the index's lock already installed (``--no-index``) needs nothing;
- each target pip phase: the same, with the constraints the image writes before it (every vendor pin, with the
  re-pins of the phases before it; :class:`PhaseView`);
- the apt packages of every system layer that installs (:mod:`stackforge.builder.mirror.apt`) and the toolchain stage
  of every kernel that has one (:mod:`stackforge.builder.mirror.toolchains`);
- the base image: ``docker save`` of the image the engine has (pulled first when it has none).

Each part is recorded in ``mirror.json`` with its source (credentials redacted), sha256 and size. A part
already there (same pin, same phase inputs, same base image id) is kept, so re-running only adds what is
missing.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from stackforge import progress
from stackforge.builder.context.context import Context
from stackforge.builder.context.prepare import lint_or_fail
from stackforge.builder.locks.locks import vendor_names
from stackforge.builder.mirror import apt, manifest, toolchains
from stackforge.builder.mirror.manifest import BASE, PhaseView, target_phase_view
from stackforge.builder.plan import resolve
from stackforge.builder.plan.phases import PipPhase
from stackforge.builder.run.run import base_identity, prepare
from stackforge.clients import credentials, pip, submodules
from stackforge.clients import upstream as upstreams
from stackforge.clients.engine import Engine, save_image
from stackforge.clients.git import git
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import UserError
from stackforge.fslock import file_sha256, stack_lock
from stackforge.safeio import OutputDir
from stackforge.stack.load import fingerprint
from stackforge.stack.resolved import ResolvedStack
from stackforge.urls import redact, scrub
from stackforge.urls import split as split_credentials

PIN_REF = "refs/heads/stackforge/pinned"


def make_mirror(
    loaded: ResolvedStack, to: Path, workspace: Workspace | None = None, network: str | None = None
) -> dict:
    """Write (or complete) the mirror of ``loaded`` in ``to``; returns a summary: the directory, the
    manifest's sha256 and the parts added and kept. ``network`` is the engine network of the containers and
    builds the mirror runs (apt layers, toolchain stages): ``host`` reaches endpoints on the host's loopback."""

    stack, ws = loaded.model, workspace_for(loaded, workspace)
    lint_or_fail(loaded)
    to = Path(to)
    inputs = [loaded.root / d for d in ("stacks", "patches", "overlays")]
    if to.is_dir():  # a link out of it is named first: it is the worse problem
        manifest.inside_tree(to, ".", "--to")
    OutputDir(to, "mirror").claim(inputs, flag="--to", legacy=(manifest.MANIFEST,))  # never a directory of others
    with stack_lock(to):
        manifest.inside_tree(to, ".", "--to")  # nothing is written through a link out of the mirror
        data = manifest.read(to, required=False) or manifest.empty(stack.name, fingerprint(stack))
        if data["stack"] != stack.name:
            raise UserError(
                f"{to} is the mirror of stack '{data['stack']}', not '{stack.name}'",
                file="--to",
                fix="one mirror directory holds one stack: choose another directory",
            )
        data["fingerprint"] = fingerprint(stack)
        data.pop("not_mirrored", None)
        before = {p["path"]: p["sha256"] for p in data["parts"]}
        unchanged = json.dumps({k: v for k, v in data.items() if k != "time"}, sort_keys=True)
        with tempfile.TemporaryDirectory(prefix="stackforge-mirror-") as tmp:
            with progress.step(f"assemble the build context of {stack.name}"):
                prepared = prepare(loaded, ws.engine, out=Path(tmp) / "build", workspace=ws)
            ctx = prepared.ctx
            _git(loaded, to, data, ws)
            _sdists(loaded, to, data, ws)
            _wheels(loaded, ctx, to, data, ws)
            base_id = _base(loaded, to, data, ws.engine)
            apt.mirror_apt(loaded, ctx.plan, ctx.context_dir, to, data, ws.engine, base_id, network)
            toolchains.mirror_toolchains(loaded, prepared, to, data, ws, network, base_id)
        data["target"] = resolve.Target.of(stack).describe()
        data["parts"].sort(key=lambda p: (p["kind"], p["path"]))
        if json.dumps({k: v for k, v in data.items() if k != "time"}, sort_keys=True) != unchanged:
            data["time"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            manifest.write(to, data)  # a run that added nothing leaves the manifest (and its sha256) as it was
    added = [p["path"] for p in data["parts"] if before.get(p["path"]) != p["sha256"]]
    return {
        "directory": str(to),
        "stack": stack.name,
        "fingerprint": data["fingerprint"],
        "manifest": manifest.digest(to),
        "parts": len(data["parts"]),
        "added": added,
        "kept": len(data["parts"]) - len(added),
    }


# --------------------------------------------------------------------------- upstreams


def _holds(repo: Path, tag: str | None, commit: str) -> bool:
    if not repo.is_dir() or not git(repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False).ok:
        return False
    full = git(repo, "rev-parse", f"{commit}^{{commit}}").stdout.strip()
    return tag is None or upstreams.peeled_tag(repo, tag) == full


def _repo_record(repo: Path) -> tuple[str, int]:
    """(sha256 of the repository's refs and the objects they name, its size in bytes): git's object ids
    pin the content, so the refs listing stands for it."""
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objectname)").stdout
    size = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())

    return hashlib.sha256(refs.encode()).hexdigest(), size


def _git(loaded: ResolvedStack, to: Path, data: dict, ws: Workspace) -> None:
    stack = loaded.model
    for name, up in stack.upstreams.items():
        if up.git is None or up.commit is None:
            continue
        rel = f"git/{name}.git"
        dest = to / rel
        if not _holds(dest, up.tag, up.commit):
            spec = upstreams.UpstreamSpec(git=up.git, tag=up.tag, commit=up.commit, name=name)
            credential = loaded.credentials.for_url(up.git) if up.git else None
            cached = upstreams.fetch_upstream(
                spec, ws.cache(), root=loaded.root, workspace=ws, reuse=True, credential=credential
            )
            full = git(cached, "rev-parse", f"{up.commit}^{{commit}}").stdout.strip()
            if not dest.is_dir():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=dest.parent))
                git(None, "init", "--quiet", "--bare", str(tmp))
                tmp.rename(dest)
            refs = [f"+{full}:{PIN_REF}"] + ([f"+refs/tags/{up.tag}:refs/tags/{up.tag}"] if up.tag else [])
            with progress.step(f"mirror {name} {up.tag or full[:12]} (git)"):
                git(cached, "push", "--quiet", str(dest), *refs)
        subs = _submodules(loaded, name, dest, ws) if up.submodules else []
        sha, size = _repo_record(dest)
        full = git(dest, "rev-parse", f"{up.commit}^{{commit}}").stdout.strip()
        url = split_credentials(up.git)[0]
        manifest.add_part(
            data,
            {
                "kind": "git",
                "path": rel,
                "upstream": name,
                "source": redact(url),
                "commit": full,
                "tag": up.tag,
                "sha256": sha,
                "size": size,
                **({"submodules": subs} if subs else {}),
            },
        )


SUBMODULE_REF = "refs/stackforge/submodules/"


def _submodules(loaded: ResolvedStack, name: str, dest: Path, ws: Workspace) -> list[dict[str, str]]:
    """The upstream's submodules (recursively), each commit kept in the mirror's repository of the upstream
    (``refs/stackforge/submodules/<commit>``), where the offline build finds it; fetched through the cache only
    when the repository does not hold it yet. Returns their records (path, URL, commit)."""

    up = loaded.model.upstreams[name]
    assert up.git is not None and up.commit is not None
    url = upstreams.resolve_git_url(split_credentials(up.git)[0], loaded.root)
    full = git(dest, "rev-parse", f"{up.commit}^{{commit}}").stdout.strip()
    try:
        try:
            subs = submodules.collect(name, dest, full, url, submodules.repo_fetch(name, dest, ""))
        except UserError:  # a commit the mirror does not hold yet (or a refusal, raised again below)
            fetch = submodules.cache_fetch(name, ws.cache(), workspace=ws, reuse=True)
            subs = submodules.collect(name, dest, full, url, fetch)
            for sub in subs:
                if not git(dest, "cat-file", "-e", f"{sub.commit}^{{commit}}", check=False).ok:
                    with progress.step(f"mirror {name} submodule {sub.path} {sub.commit[:12]} (git)"):
                        git(sub.repo, "push", "--quiet", str(dest), f"+{sub.commit}:{SUBMODULE_REF}{sub.commit}")
    except UserError as err:
        raise loaded.placed(err, ("upstreams", name, "submodules")) from None
    return [s.record() for s in subs]


def _copy(src: Path, dest: Path) -> None:
    """``src`` to ``dest`` (a hard link where the file system allows it), atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def _file_part(data: dict, to: Path, rel: str, **extra: object) -> None:
    path = to / rel
    manifest.add_part(data, {"path": rel, "sha256": file_sha256(path), "size": path.stat().st_size, **extra})


def _sdists(loaded: ResolvedStack, to: Path, data: dict, ws: Workspace) -> None:
    stack = loaded.model
    for name, up in stack.upstreams.items():
        if up.sdist is None:
            continue
        index_url = stack.indexes[up.sdist.index].url
        spec = upstreams.SdistSpec(index_url, up.sdist.name, up.sdist.version, up.sdist.sha256)
        credential = loaded.credentials.for_index(up.sdist.index)
        archive = upstreams.fetch_sdist(spec, ws.cache(), workspace=ws, credential=credential)
        source = f"{redact(index_url)}/{canonicalize_name(up.sdist.name)}/"
        for rel in (f"sdist/{archive.name}", f"indexes/{up.sdist.index}/files/{archive.name}"):
            have = manifest.part(data, rel)
            if not (have and have["sha256"] == up.sdist.sha256 and (to / rel).is_file()):
                _copy(archive, to / rel)
            kind = "sdist" if rel.startswith("sdist/") else "file"
            _file_part(data, to, rel, kind=kind, upstream=name, index=up.sdist.index, source=source)
        _simple(to, up.sdist.index, data)


# --------------------------------------------------------------------------- pip phases


def _wheels(loaded: ResolvedStack, ctx: Context, to: Path, data: dict, ws: Workspace) -> None:
    """Every pip phase of the deps stage and of every target, each resolved as the build runs it."""
    target = resolve.Target.of(loaded.model)
    pip.check_pip()
    for phase in ctx.plan.phases:
        if phase.no_index:
            continue  # its index's lock installed the closure in an earlier phase
        _phase(
            loaded, phase, phase.name, manifest.phase_key(phase, ctx.context_dir, target), ctx.context_dir, to, data, ws
        )
    for t in ctx.plan.target_stages:
        for ph in t.pip:
            with tempfile.TemporaryDirectory(prefix="stackforge-mirror-") as tmp:
                view = target_phase_view(ctx.plan, t, ph, ctx.context_dir, Path(tmp))
                _phase(loaded, view, ph.key, manifest.target_phase_key(view, target), ctx.context_dir, to, data, ws)


def _phase(
    loaded: ResolvedStack,
    phase: PipPhase | PhaseView,
    name: str,
    key: str,
    context_dir: Path,
    to: Path,
    data: dict,
    ws: Workspace,
) -> None:
    """One phase's files into its index's tree (kept when the phase's key and files are there)."""
    stack = loaded.model
    target = resolve.Target.of(stack)
    vendors = vendor_names(stack)
    files_dir = manifest.index_dir(to, phase.index) / "files"
    have = data["phases"].get(name)
    if have and have["key"] == key and all((files_dir / f).is_file() for f in have["files"]):
        return
    find_links = [
        manifest.index_dir(to, v) / "files"
        for v, idx in stack.indexes.items()
        if idx.role == "vendor" and v != phase.index and (manifest.index_dir(to, v) / "files").is_dir()
    ]
    with (
        credentials.private_dir("stackforge-mirror-") as tmp,
        progress.step(f"mirror pip phase {name} from {phase.index_url}"),
    ):
        got = _download(loaded, phase, context_dir, tmp, target, find_links, ws)
        names = []
        for path in got:
            project = manifest.project_of(path.name)
            if project and canonicalize_name(project) in vendors and stack.indexes[phase.index].role != "vendor":
                continue  # a vendor wheel seen through --find-links: it belongs to its vendor's tree
            _copy(path, files_dir / path.name)
            names.append(path.name)
    source = redact(stack.indexes[phase.index].url)
    for n in names:
        _file_part(
            data,
            to,
            f"indexes/{phase.index}/files/{n}",
            kind="file",
            index=phase.index,
            source=f"{source}/{canonicalize_name(manifest.project_of(n) or n)}/",
        )
    data["phases"][name] = {"key": key, "index": phase.index, "files": sorted(names)}
    _simple(to, phase.index, data)


def _download(
    loaded: ResolvedStack,
    phase: PipPhase | PhaseView,
    context_dir: Path,
    tmp: Path,
    target: resolve.Target,
    find_links: list[Path],
    ws: Workspace,
) -> list[Path]:
    """``pip download`` of one phase into ``tmp/files``: the files it would install, for the target."""
    stack = loaded.model
    url = stack.indexes[phase.index].url
    credential = loaded.credentials.for_index(phase.index)
    env, index_args = pip.pip_env(tmp, url, credential, ws.ca_bundle_file())
    dest = tmp / "files"
    cmd = [
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--dest",
        str(dest),
        *target.pip_args(),
        *index_args,
    ]
    cmd += ["--no-deps"] if phase.no_deps else []
    cmd += ["--require-hashes"] if phase.require_hashes else []
    for d in find_links:
        cmd += ["--find-links", str(d)]
    if phase.constraints:
        cmd += ["-c", str(context_dir / phase.constraints)]
    cmd += ["-r", str(context_dir / phase.requirements)]
    proc = pip.pip_download(cmd, target.markers(), env, tmp)
    if proc.returncode != 0:
        tail = "\n".join(line for line in scrub(proc.stderr, credential).splitlines() if line.strip())[-1500:]
        raise UserError(
            f"{phase.key}: pip could not download pip phase {phase.name} from {redact(url)} for "
            f"{target.describe()}:\n{tail}",
            fix="check that the index is reachable (stackforge doctor) and serves a wheel for the "
            "target of every package the phase installs",
        )
    return sorted(dest.iterdir()) if dest.is_dir() else []


def _simple(to: Path, index: str, data: dict) -> None:
    hashes = {
        p["path"].rsplit("/", 1)[-1]: p["sha256"]
        for p in data["parts"]
        if p["kind"] == "file" and p.get("index") == index
    }
    manifest.write_simple(manifest.index_dir(to, index), hashes)


# --------------------------------------------------------------------------- base image


def _base(loaded: ResolvedStack, to: Path, data: dict, engine: Engine) -> str:
    """The base image as the build resolves it (pulled when the engine lacks it, checked against base.digest),
    saved once per image id."""

    image = loaded.model.base.image
    engine.check()
    base = base_identity(engine, loaded)
    image_id = str(base.id)  # its config's digest: the mirror's base is the same on either image store
    have = manifest.part(data, BASE)
    if have and have.get("id") == image_id and (to / BASE).is_file():
        return image_id
    save_image(engine, image, to / BASE, f"base image {image} ({image_id})")
    _file_part(data, to, BASE, kind="base", image=image, id=image_id, digest=base.digest, source=image)
    return image_id
