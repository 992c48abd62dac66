"""An upstream as a build uses it: fetched into the workspace's cache (or read from a mirror), exported at its
pinned commit or sdist, its submodules added, its patch series applied and its edits made; with the facts the
labels and the reuse checks record (:class:`SourceInfo`)."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stackforge import patches
from stackforge.builder.mirror.offline import _fix, upstream_cache
from stackforge.builder.plan import edits, installed
from stackforge.clients import submodules
from stackforge.clients import upstream as upstreams
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.patches.series import in_tree_series
from stackforge.stack.load import LoadedStack
from stackforge.urls import split as split_credentials


@dataclass
class SourceInfo:
    name: str
    kind: str  # git | sdist
    pin: str  # tag@commit or name==version@sha256
    commit_time: int | None = None
    series_hash: str | None = None
    patches: list[str] = field(default_factory=list)
    submodules: list[dict[str, str]] = field(default_factory=list)  # {path, url, commit}, parents first

    def record(self) -> dict:
        """As the evidence and the inputs fingerprint hold it (no ``submodules`` key for an upstream without)."""
        data = asdict(self)
        if not data["submodules"]:
            del data["submodules"]
        return data


def _redirect(loaded: LoadedStack, path: tuple[str, ...], err: UserError) -> UserError:
    """``err`` placed at the stack key whose endpoint failed, with the redirect in the CLI's and make's spelling
    (an error that already names a file keeps it)."""
    if err.file:
        return err
    key = ".".join(path)
    fix = (f"{err.fix}; or " if err.fix else "") + (
        f"redirect it: --set {key}=<URL> (make image STACK={loaded.name} ARGS='--set {key}=<URL>'); "
        f"`stackforge doctor {loaded.name}` checks every endpoint at once"
    )
    return UserError(
        f"{key}: {err.message}", **loaded.position(path).as_error_kwargs(), fix=fix, exit_code=err.exit_code
    )


def export_source(loaded: LoadedStack, name: str, dest: Path, workspace: Workspace) -> SourceInfo:
    """Fetch (into the workspace's cache, with its credentials), export, patch and edit upstream ``name``."""
    stack, root, cache = loaded.model, loaded.root, workspace.cache()
    offline = workspace.mirror is not None
    if offline:  # the mirror's repositories and sdists, never a fetch
        cache = upstream_cache(loaded, workspace)
    up = stack.upstreams[name]
    if up.sdist is not None:
        sdist = upstreams.SdistSpec(stack.indexes[up.sdist.index].url, up.sdist.name, up.sdist.version, up.sdist.sha256)
        archive = upstreams.fetch_sdist(sdist, cache, offline=offline, workspace=workspace)
        upstreams.unpack_sdist(archive, dest)
        pin = f"{up.sdist.name}=={up.sdist.version}@sha256:{up.sdist.sha256}"
        info = SourceInfo(name, "sdist", pin, commit_time=upstreams.sdist_time(archive))
    else:
        if up.commit is None:
            raise UserError(
                f"upstreams.{name}: a git upstream needs 'commit'",
                fix="add commit: … (the commit is checked against the tag)",
            )
        spec = upstreams.UpstreamSpec(git=up.git, tag=up.tag, commit=up.commit, name=name)
        try:
            mirror = upstreams.fetch_upstream(
                spec, cache, root=root, workspace=workspace, reuse=not workspace.refresh, offline=offline
            )
        except UserError as err:
            raise _redirect(loaded, ("upstreams", name, "git"), err) from None
        upstreams.export_commit(mirror, up.commit, dest)
        info = SourceInfo(name, "git", up.pin, commit_time=upstreams.commit_time(mirror, up.commit))
        if up.submodules:
            info.submodules = _export_submodules(loaded, name, mirror, dest, cache, workspace, offline)
    if up.patches or up.patches_from:
        # The series another upstream carries first, then the repository's own on top of it.
        carried = in_tree_series(loaded, name, dest.parent) if up.patches_from else None
        own = root / up.patches if up.patches else None
        if carried is not None:
            try:
                info.patches = [r.name for r in patches.apply_to_export(dest, carried)]
            except UserError as err:
                raise installed.naming_key(loaded, name, err) from None
        if own is not None:
            info.patches += [r.name for r in patches.apply_to_export(dest, own)]
        layers = [d for d in (carried, own) if d is not None]
        digest = patches.series_hash(*layers)
        info.series_hash = digest if digest.startswith("sha256:") else f"sha256:{digest}"
        if carried is not None and carried.parent.name == ".series":  # listed by file name for this export only
            shutil.rmtree(carried.parent)
    info.patches += [f"edit {path}" for path in edits.apply(loaded, name, dest)]
    return info


def _export_submodules(
    loaded: LoadedStack, name: str, mirror: Path, dest: Path, cache: Path, workspace: Workspace, offline: bool
) -> list[dict[str, str]]:
    """Fetch the submodules the pinned commit records (recursively; from the mirror's repository when offline),
    write their trees into ``dest`` and return their records; a refusal is placed at
    ``upstreams.<name>.submodules``."""

    up = loaded.model.upstreams[name]
    assert up.git is not None and up.commit is not None
    url = upstreams.resolve_git_url(split_credentials(up.git)[0], loaded.root)
    if offline:
        fetch = submodules.repo_fetch(name, mirror, _fix(loaded))
    else:
        fetch = submodules.cache_fetch(name, cache, workspace=workspace, reuse=not workspace.refresh)
    try:
        subs = submodules.collect(name, mirror, up.commit, url, fetch)
        submodules.export(subs, dest)
    except UserError as err:
        raise loaded.placed(err, ("upstreams", name, "submodules")) from None
    return [s.record() for s in subs]
