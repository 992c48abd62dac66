"""Series operations against a pinned upstream: apply, check, export --check,
upstreamed (+ drop), range-diff.

Everything here takes a ``Target``: one upstream (a ``clients.upstream.UpstreamPin``: the stack's upstream,
or an ``UpstreamSpec``) and the layers to apply onto it. ``target_from_stack`` builds one from a loaded stack
(its model and repository root; an sdist's index looked up to its URL); tests build them from an ``UpstreamSpec``.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.clients import upstream as up
from stackforge.clients.git import BASE_REF, git, git_bytes, rev_parse
from stackforge.clients.workspace import Workspace
from stackforge.clients.workspace import cache_dir as workspace_cache
from stackforge.errors import UserError
from stackforge.patches.apply import (
    FAILS,
    UPSTREAMED,
    ApplyReport,
    apply_layers,
    failure_error,
    run_patches,
    seed_blobs,
)
from stackforge.patches.export import Change, plan_export
from stackforge.patches.index import render_index, write_index
from stackforge.patches.patchfile import parse_patch
from stackforge.patches.repo import prepare
from stackforge.patches.series import (
    INDEX_FILE,
    SERIES_FILE,
    PatchRef,
    Series,
    drop_entries,
    flatten,
    in_tree_series,
    layer_dirs,
    load_layers,
    render_series,
    renumber,
)
from stackforge.stack.load import LoadedStack
from stackforge.urls import Credential

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import Stack, Upstream


@dataclass
class Target:
    name: str  # the upstream's name in the stack
    spec: up.UpstreamPin
    layers: list[Series]
    root: Path
    cache_dir: Path
    offline: bool = False
    workspace: Workspace | None = None  # whose credentials fetch the upstream (default: Workspace.default())
    #: what the stack gives for the upstream's git URL or sdist index (None: the workspace's resolver decides)
    credential: Credential | None = field(default=None, repr=False)
    #: a series another upstream carries for this one (``patches_from``): applied before the layers, as the
    #: build applies it, and part of the base the layers sit on (export writes only the layers)
    carried: Series | None = None
    #: reads ``carried`` when a tree is first prepared (a verb that needs no tree never fetches the carrier)
    carry: Callable[[], Series] | None = field(default=None, repr=False)

    @property
    def refs(self) -> list[PatchRef]:
        return flatten(self.layers)

    def carried_layer(self) -> Series | None:
        """The carried series, read from the carrier on first use (None when the upstream carries none)."""
        if self.carried is None and self.carry is not None:
            self.carried = self.carry()
        return self.carried


def make_target(
    name: str,
    spec: up.UpstreamPin,
    *,
    root: Path,
    cache_dir: Path | None = None,
    overlays: Sequence[str] = (),
    offline: bool = False,
    workspace: Workspace | None = None,
) -> Target:
    patches = spec.patches
    if not patches:
        raise UserError(
            f"upstream {name!r} declares no patch series",
            fix=f"set upstreams.{name}.patches (e.g. patches/{name}) in the stack",
        )
    dirs = layer_dirs(root, name, patches, overlays)
    cache = cache_dir or (workspace.cache() if workspace else workspace_cache(root, ""))
    return Target(name, spec, load_layers(dirs), root, cache, offline, workspace)


def target_from_stack(
    loaded: LoadedStack | ResolvedStack,
    upstream: str | None = None,
    *,
    overlays: Sequence[str] = (),
    cache_dir: Path | None = None,
    offline: bool = False,
    workspace: Workspace | None = None,
) -> Target:
    """Pick the upstream (the only one with a series, unless named) of a loaded stack."""
    stack = loaded.model
    ups = dict(stack.upstreams)
    if upstream is None:
        with_series = [n for n, u in ups.items() if u.patches]
        if len(with_series) != 1:
            raise UserError(
                f"stack {stack.name} has {len(with_series)} upstreams with a patch series ({', '.join(with_series) or 'none'})",
                fix="name one with --upstream",
            )
        upstream = with_series[0]
    if upstream not in ups:
        raise UserError(
            f"stack {stack.name} has no upstream {upstream!r} (it has: {', '.join(ups)})", fix="check --upstream"
        )
    spec = _resolve_sdist_index(stack, ups[upstream])
    target = make_target(
        upstream, spec, root=loaded.root, cache_dir=cache_dir, overlays=overlays, offline=offline, workspace=workspace
    )
    found = ups[upstream]
    target.credential = (
        loaded.credentials.for_index(found.sdist.index)
        if found.sdist is not None and found.sdist.index in stack.indexes
        else loaded.credentials.for_url(found.git)
        if found.git
        else None
    )
    if stack.upstreams[upstream].patches_from is not None:
        target.carry = functools.partial(
            carried_series, loaded, upstream, target.cache_dir, offline=offline, workspace=workspace
        )
    return target


def carried_series(
    loaded: LoadedStack | ResolvedStack,
    name: str,
    cache_dir: Path,
    *,
    offline: bool = False,
    workspace: Workspace | None = None,
) -> Series:
    """The series ``upstreams.<name>.patches_from`` names, read from the carrying upstream's tree at its pinned
    commit (the build's rules: ``patches.series.in_tree_series``) and kept in the cache under that pin."""
    src = loaded.model.upstreams[name].patches_from
    assert src is not None
    carrier = loaded.model.upstreams[src.upstream]
    key = f"{src.upstream}-{carrier.commit}-{src.order}-{src.path}"
    kept = Path(cache_dir) / "carried" / re.sub(r"[^A-Za-z0-9._-]", "_", key)
    if not (kept / SERIES_FILE).is_file():
        with scratch() as tmp:
            credential = loaded.credentials.for_url(carrier.git) if carrier.git else None
            mirror = up.fetch_upstream(
                carrier, cache_dir, root=loaded.root, offline=offline, workspace=workspace, credential=credential
            )
            up.export_commit(mirror, str(carrier.commit), tmp / "src" / src.upstream)
            found = in_tree_series(loaded, name, tmp / "src")
            staged = Path(tempfile.mkdtemp(prefix=kept.name + ".", dir=_parent(kept)))
            for entry in found.iterdir():
                if entry.is_file() and not entry.is_symlink():
                    shutil.copyfile(entry, staged / entry.name)
            if kept.exists():
                shutil.rmtree(kept)
            staged.rename(kept)
    return load_layers([(f"{src.upstream}:{src.path}", kept)])[0]


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.parent


def _resolve_sdist_index(stack: Stack, spec: Upstream) -> up.UpstreamPin:
    """An sdist's ``index`` names one of the stack's indexes; give it that index's URL."""
    sdist = spec.sdist
    if not sdist:
        return spec
    index = stack.indexes.get(sdist.index)
    url = index.url if index is not None else sdist.index
    return up.UpstreamSpec(
        git=spec.git,
        tag=spec.tag,
        commit=spec.commit,
        sdist=up.SdistSpec(str(url), sdist.name, str(sdist.version), sdist.sha256),
        patches=spec.patches,
    )


@contextmanager
def scratch(prefix: str = "stackforge-patches-") -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d / "tree"
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- apply / check -----------------------------------------------------------------


def apply_to(
    target: Target,
    dest: Path,
    *,
    force: bool = False,
    resume: str = "",
    context: dict | None = None,
    seed_commit: str | None = None,
) -> ApplyReport:
    """Export the pinned upstream into ``dest`` as a repository and apply every layer.

    On a failure the report says which patch; the caller raises
    ``failure_error(report, resume)`` so the message carries the resume command.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise UserError(
                f"{dest} exists and is not empty",
                fix="choose a new directory, pass --force to replace it, or --continue a stopped apply",
            )
        if dest.is_symlink() or not (dest / ".git").is_dir():
            raise UserError(
                f"{dest} is not a tree `stackforge patches apply` made (a git repository): --force replaces only such "
                "a tree",
                fix="choose a new directory, or remove that one yourself",
            )
        shutil.rmtree(dest)
    head = _prepare(target, dest)
    _seed(dest, head, seed_commit, target.refs)
    return apply_layers(dest, target.layers, stop_on_failure=True, resume=resume, context=context)


def _prepare(target: Target, dest: Path, *, commit: str | None = None, history: bool | str = True) -> str:
    """``prepare`` the target's upstream at ``dest`` from the target's cache (``commit``: that one of its mirror),
    with the carried series applied on top and made the base the layers start from."""
    head = prepare(
        target.spec,
        target.cache_dir,
        dest,
        root=target.root,
        commit=commit,
        history=history,
        offline=target.offline,
        label=target.name,
        workspace=target.workspace,
        credential=target.credential,
    )
    carried = target.carried_layer()
    if carried is None:
        return head
    report = apply_layers(dest, [carried], stop_on_failure=True)
    if report.failed:
        raise failure_error(report, None)
    base = rev_parse(dest, "HEAD")
    assert base
    git(dest, "update-ref", BASE_REF, base)
    return head


def _seed(repo: Path, head: str, seed_commit: str | None, refs: Sequence[PatchRef]) -> None:
    if seed_commit and refs:
        seed = rev_parse(repo, seed_commit)
        if seed and seed != head:
            seed_blobs(repo, seed, refs)


def check(target: Target, *, commit: str | None = None, seed_commit: str | None = None) -> ApplyReport:
    """Apply into a scratch tree and classify every patch; nothing stops at a failure.

    ``commit`` checks against another commit of the upstream than the pin; the
    series is then first replayed on the pin (or ``seed_commit``) so 3-way
    merges have the blobs they need. Whether a patch is upstreamed is decided by
    ``find_upstreamed`` (pin → ``commit``), the function ``patches upstreamed``
    uses, so both verbs always agree; an upstreamed patch is never reported as failing.
    """
    with scratch() as tmp:
        head = _prepare(target, tmp, commit=commit, history="shared")
        seed = seed_commit or (target.spec.commit if commit else None)
        _seed(tmp, head, seed, target.refs)
        report = apply_layers(tmp, target.layers, stop_on_failure=False)
        report.repo = Path("(scratch)")
    if target.spec.sdist:
        return report
    found = find_upstreamed(target, commit or up.pinned_commit(target.spec), old_commit=seed)
    by_name = {(u.layer, u.name): u for u in found}
    for r in report.results:
        u = by_name.get((r.layer, r.name))
        if u is not None:
            r.status, r.detail, r.diagnosis, r.commit = UPSTREAMED, u.detail(), None, None
    return report


# --- export --check ------------------------------------------------------------------


def _static_changes(layers: Sequence[Series]) -> list[Change]:
    """For layers without patches: only the series file and the index can differ."""
    out: list[Change] = []
    for s in layers:
        for fname, text in ((SERIES_FILE, render_series(s)), (INDEX_FILE, render_index(s))):
            p = s.dir / fname
            if not p.is_file():
                out.append(Change(p, "added"))
            elif p.read_text(encoding="utf-8") != text:
                out.append(Change(p, "changed"))
    return out


def export_check(target: Target) -> list[Change]:
    """What a fresh apply + export would change, byte for byte (empty list: nothing)."""
    if not target.refs:
        return _static_changes(target.layers)
    with scratch() as tmp:
        _prepare(target, tmp, history="shared")
        report = apply_layers(tmp, target.layers, stop_on_failure=True)
        if report.failed:
            raise failure_error(report, None)
        plan = plan_export(tmp, target.layers)
        return plan.changes()


# --- upstreamed ----------------------------------------------------------------------


@dataclass
class Upstreamed:
    layer: str
    name: str
    subject: str
    how: str  # "patch-id" (git cherry) and/or "no changes" (git am)
    commit: str | None  # the upstream commit that carries it, where found
    commit_subject: str | None = None

    def detail(self) -> str:
        """One line for reports: which upstream commit carries the patch, and how that was found."""
        if self.commit:
            return f"already applied upstream in {self.commit[:12]} ({self.commit_subject}) [{self.how}]"
        return f"already applied upstream (carrying commit not identified) [{self.how}]"

    def note(self, new_commit: str) -> str:
        where = f"upstream commit {self.commit}" if self.commit else "an upstream commit not identified"
        return f"Applied-Upstream: {self.name} ({self.subject}): in {where}; found at {new_commit}"

    def to_json(self) -> dict:
        return self.__dict__.copy()


def _patch_ids(repo: Path, rev_range: str) -> dict[str, str]:
    """patch-id -> commit for every non-merge commit in a range."""
    log = git_bytes(repo, "log", "-p", "--no-merges", "--no-color", "--format=commit %H", rev_range)
    res = git(repo, "patch-id", "--stable", input=log)
    out: dict[str, str] = {}
    for ln in res.stdout.splitlines():
        pid, commit = ln.split()
        out.setdefault(pid, commit)
    return out


def _added_lines(text: str) -> set[str]:
    return {
        ln[1:].strip() for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip()
    }


def _find_carrier(repo: Path, patch: Path, new: str, old: str | None) -> str | None:
    """The upstream commit whose added lines best cover the patch's added lines."""
    pf = parse_patch(patch)
    want = {a.text.strip() for a in pf.added_lines() if a.text.strip()}
    files = [f for f in pf.touched_files() if f != "?"]
    if not want or not files:
        return None
    rng = [f"{old}..{new}"] if old and old != new else ["-n", "400", new]
    cands = git(repo, "log", "--no-merges", "--format=%H", *rng, "--", *files).stdout.split()
    best, score = None, 0
    for c in cands:
        show = git(repo, "show", "--format=", "--no-color", "-U0", c, "--", *files).stdout
        s = len(want & _added_lines(show))
        if s > score:
            best, score = c, s
            if s == len(want):
                break
    return best


def _require_git(target: Target, what: str) -> None:
    if target.spec.sdist:
        raise UserError(
            f"upstream {target.name} is a release sdist; {what} needs a git upstream",
            fix="drop sdist from the upstream to work on its git history",
        )


def _two_pins(target: Target, tmp: Path, old_commit: str, new_commit: str) -> tuple[str, str]:
    """Export the upstream's shared history at ``old_commit`` into ``tmp``; return (old id, new id)."""
    old_id = _prepare(target, tmp, commit=old_commit, history="shared")
    new_id = rev_parse(tmp, new_commit)
    if new_id is None:
        raise UserError(
            f"commit {new_commit} is not in the upstream {target.spec.git}",
            fix="fetch it first; is the id right?",
        )
    return old_id, new_id


def find_upstreamed(target: Target, new_commit: str, *, old_commit: str | None = None) -> list[Upstreamed]:
    """Patches the upstream at ``new_commit`` already contains.

    With the old pin known, the series is applied on it and ``git cherry``
    (patch-id equivalence) lists the patches whose change is in old..new; then
    the series is applied on the new commit and every patch ``git am`` reports
    as "No changes -- Patch already applied" is added. The carrying upstream
    commit is the patch-id match, else the commit in old..new whose added lines
    cover the patch best.
    """
    _require_git(target, "upstreamed detection")
    old = old_commit or up.pinned_commit(target.spec)
    refs = target.refs
    found: dict[str, Upstreamed] = {}
    with scratch() as tmp:
        old_id, new_id = _two_pins(target, tmp, old, new_commit)
        subjects = {r.name: parse_patch(r.path).subject for r in refs if r.path.is_file()}
        upstream_ids: dict[str, str] = {}
        if old_id != new_id:
            results = run_patches(tmp, refs, stop_on_failure=False)
            by_commit = {r.commit: r for r in results if r.commit}
            cherry = git(tmp, "cherry", new_id, "HEAD", old_id).stdout.splitlines()
            upstream_ids = _patch_ids(tmp, f"{old_id}..{new_id}")
            mine = _patch_ids(tmp, f"{old_id}..HEAD")
            mine_rev = {c: pid for pid, c in mine.items()}
            for ln in cherry:
                sign, commit = ln.split()[:2]
                r = by_commit.get(commit)
                if sign == "-" and r:
                    carrier = upstream_ids.get(mine_rev.get(commit, ""))
                    found[r.name] = Upstreamed(r.layer, r.name, subjects.get(r.name, ""), "patch-id", carrier)
        git(tmp, "checkout", "--quiet", "-B", "new", new_id)
        results = run_patches(tmp, refs, stop_on_failure=False)
        for r in results:
            if r.status != UPSTREAMED:
                continue
            if r.name in found:
                found[r.name].how = "patch-id, no changes"
                continue
            ref = next(x for x in refs if x.name == r.name and x.layer == r.layer)
            carrier = _find_carrier(tmp, ref.path, new_id, old_id if old_id != new_id else None)
            found[r.name] = Upstreamed(r.layer, r.name, subjects.get(r.name, ""), "no changes", carrier)
        for u in found.values():
            if u.commit:
                u.commit_subject = git(tmp, "log", "-1", "--format=%s", u.commit).stdout.strip()
    order = {r.name: r.position for r in refs}
    return sorted(found.values(), key=lambda u: order.get(u.name, 0))


def drop_upstreamed(target: Target, found: Sequence[Upstreamed], new_commit: str) -> list[tuple[Path, Path]]:
    """Remove the upstreamed patches, note them in each series' history, renumber, re-index."""
    for s in target.layers:
        mine = [u for u in found if u.layer == s.layer]
        if mine:
            drop_entries(s, [u.name for u in mine], [u.note(new_commit) for u in mine])
    renames = renumber(target.layers)
    for s in target.layers:
        write_index(s)
    return renames


# --- range-diff ------------------------------------------------------------------------

_RD_RE = re.compile(r"^\s*(\d+|-):\s+(\S+) ([=!<>]) \s*(\d+|-):\s+(\S+) (.*)$")


@dataclass
class RangeEntry:
    layer: str
    name: str
    status: str  # unchanged | changed | dropped | new | fails-old | fails-new | upstreamed-new
    interdiff: str = ""
    detail: str = ""

    def to_json(self) -> dict:
        return self.__dict__.copy()


def range_diff(
    target: Target, old_commit: str, new_commit: str, *, creation_factor: int = 60
) -> tuple[list[RangeEntry], str]:
    """Apply the series on both pins and compare with ``git range-diff``; returns entries and the raw output."""
    _require_git(target, "range-diff")
    refs = target.refs
    with scratch() as tmp:
        old_id, new_id = _two_pins(target, tmp, old_commit, new_commit)
        old_results = run_patches(tmp, refs, stop_on_failure=False)
        old_tip = rev_parse(tmp, "HEAD")
        git(tmp, "checkout", "--quiet", "-B", "new", new_id)
        new_results = run_patches(tmp, refs, stop_on_failure=False)
        new_tip = rev_parse(tmp, "HEAD")
        raw = git(
            tmp,
            "range-diff",
            "--no-color",
            f"--creation-factor={creation_factor}",
            f"{old_id}..{old_tip}",
            f"{new_id}..{new_tip}",
        ).stdout
    old_applied = [r for r in old_results if r.commit]
    new_applied = [r for r in new_results if r.commit]
    status: dict[str, RangeEntry] = {}
    current: RangeEntry | None = None
    for ln in raw.splitlines():
        m = _RD_RE.match(ln)
        if m:
            li, op, ri = m.group(1), m.group(3), m.group(4)
            left = old_applied[int(li) - 1] if li != "-" else None
            right = new_applied[int(ri) - 1] if ri != "-" else None
            r = left or right
            assert r is not None
            kind = {"=": "unchanged", "!": "changed", "<": "dropped", ">": "new"}[op]
            current = RangeEntry(r.layer, r.name, kind)
            if left and right and left.name != right.name:
                current.detail = f"matched {right.name}"
            status.setdefault(r.name, current)
            continue
        if current is not None and current.status == "changed" and ln.startswith("    "):
            current.interdiff += ln[4:] + "\n"
    new_by_name = {r.name: r for r in new_results}
    old_by_name = {r.name: r for r in old_results}
    out: list[RangeEntry] = []
    for ref in refs:
        e = status.get(ref.name)
        nr, orr = new_by_name.get(ref.name), old_by_name.get(ref.name)
        if orr and orr.status == FAILS:
            e = RangeEntry(
                ref.layer,
                ref.name,
                "fails-old" if not (nr and nr.commit) else "new",
                detail="does not apply on the old pin",
            )
        elif nr and nr.status == UPSTREAMED:
            e = RangeEntry(ref.layer, ref.name, "dropped", detail="already applied upstream at the new pin")
        elif nr and nr.status == FAILS:
            e = RangeEntry(ref.layer, ref.name, "fails-new", detail=nr.detail or "does not apply on the new pin")
        elif e is None:
            e = RangeEntry(ref.layer, ref.name, "unchanged" if (orr and orr.status == UPSTREAMED) else "dropped")
        out.append(e)
    return out, raw
