"""Write a series back from a worked tree, byte-stable.

Every commit between the base (``refs/stackforge/base``, set when the series
was applied) and HEAD becomes one patch via ``git format-patch`` with a fixed
set of options and an isolated git configuration, so exporting an unchanged
series reproduces every byte. Patch names stay what they were (only the
number moves), new commits are named from their subject, and numbering runs
on across layers.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stackforge.clients.git import BASE_REF, git, git_bytes, rev_parse
from stackforge.errors import UserError
from stackforge.patches.apply import read_note
from stackforge.patches.index import render_index
from stackforge.patches.patchfile import parse_patch
from stackforge.patches.series import (
    INDEX_FILE,
    SERIES_FILE,
    Entry,
    Series,
    patch_name,
    render_series,
    renumbered,
)

# The export form. Options that would otherwise come from configuration are
# spelled out so that nothing outside the command changes the bytes.
FORMAT_PATCH_ARGS = [
    "format-patch",
    "--stdout",
    "--keep-subject",
    "--no-stat",
    "--zero-commit",
    "--no-signature",
    "--full-index",
    "--no-numbered",
    "--no-thread",
    "--no-cover-letter",
    "--no-attach",
    "--no-notes",
    "--encode-email-headers",
    "--binary",
    "--diff-algorithm=myers",
    "--unified=3",
    "--inter-hunk-context=0",
    "--find-renames=50%",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-relative",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]
# Diff configuration pinned on the command line as well.
CONFIG_ARGS = [
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "diff.suppressBlankEmpty=false",
    "-c",
    "core.quotePath=true",
    "-c",
    "format.useAutoBase=false",
    "-c",
    "i18n.logOutputEncoding=UTF-8",
]


def format_commit(repo: Path, commit: str) -> bytes:
    """One commit in export form."""
    return git_bytes(repo, *CONFIG_ARGS, *FORMAT_PATCH_ARGS, "-1", commit)


@dataclass
class ExportedPatch:
    layer: str
    name: str
    commit: str
    subject: str
    data: bytes
    previous: str | None  # the old name this patch continues, if any


@dataclass
class Change:
    path: Path
    kind: str  # "changed" | "added" | "removed"
    diff: str = ""


@dataclass
class ExportPlan:
    layers: list[Series]  # the new series, one per layer
    patches: list[ExportedPatch]
    files: dict[Path, bytes] = field(default_factory=dict)  # everything to write
    remove: list[Path] = field(default_factory=list)  # old patch files no longer in any series

    def changes(self) -> list[Change]:
        out: list[Change] = []
        for path, data in self.files.items():
            if not path.is_file():
                out.append(Change(path, "added"))
                continue
            old = path.read_bytes()
            if old != data:
                diff = "".join(
                    difflib.unified_diff(
                        old.decode("utf-8", "replace").splitlines(True),
                        data.decode("utf-8", "replace").splitlines(True),
                        fromfile=f"{path} (on disk)",
                        tofile=f"{path} (re-export)",
                        n=2,
                    )
                )
                out.append(Change(path, "changed", diff))
        for path in self.remove:
            if path.exists():
                out.append(Change(path, "removed"))
        return out

    def write(self) -> list[Change]:
        changes = self.changes()
        for s in self.layers:
            s.dir.mkdir(parents=True, exist_ok=True)
        for path, data in self.files.items():
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)
        for path in self.remove:
            if path.exists():
                path.unlink()
        return changes


def series_commits(repo: Path, base: str | None = None) -> tuple[str, list[str]]:
    """(base commit, commits base..HEAD oldest first)."""
    repo = Path(repo)
    base_id = rev_parse(repo, base) if base else rev_parse(repo, BASE_REF)
    if not base_id:
        raise UserError(
            f"cannot tell where the series starts in {repo}" + (f": {base} is not a commit" if base else ""),
            fix="pass --base COMMIT (the upstream commit the series sits on), or apply with `stackforge patches apply`",
        )
    if git(repo, "merge-base", "--is-ancestor", base_id, "HEAD", check=False).returncode != 0:
        raise UserError(
            f"the base {base_id} is not an ancestor of HEAD in {repo}",
            fix="rebase the work onto the base, or pass the right --base",
        )
    merges = git(repo, "rev-list", "--min-parents=2", f"{base_id}..HEAD").stdout.split()
    if merges:
        raise UserError(
            f"{repo} has merge commits between the base and HEAD ({merges[0][:12]}…)",
            fix="a series is linear: rebase the merges away",
        )
    commits = git(repo, "rev-list", "--reverse", f"{base_id}..HEAD").stdout.split()
    return base_id, commits


def plan_export(repo: Path, layers: Sequence[Series], *, base: str | None = None) -> ExportPlan:
    """Work out every file an export would write, without writing."""
    if not layers:
        raise UserError("no series to export into", fix="declare upstreams.<name>.patches in the stack")
    repo = Path(repo)
    _, commits = series_commits(repo, base)
    layer_index = {s.layer: i for i, s in enumerate(layers)}
    old_subjects: list[dict[str, str]] = []
    for s in layers:
        subs: dict[str, str] = {}
        for e in s.entries:
            p = s.dir / e.name
            if p.is_file():
                subs[e.name] = parse_patch(p).subject
        old_subjects.append(subs)
    used: set[tuple[int, str]] = set()
    grouped: list[list[tuple[str, str, str | None]]] = [[] for _ in layers]  # (commit, subject, old name)
    current = 0
    for c in commits:
        layer, note_name = read_note(repo, c)
        subject = git(repo, "log", "-1", "--format=%s", c).stdout.rstrip("\n")
        if layer is not None:
            if layer not in layer_index:
                raise UserError(
                    f"commit {c[:12]} ({subject}) belongs to layer {layer!r}, which is not being exported",
                    fix="pass the overlay that layer comes from (--overlay), or drop the commit",
                )
            li = layer_index[layer]
            if li < current:
                raise UserError(
                    f"commit {c[:12]} ({subject}) of layer {layer!r} comes after commits of a later layer",
                    fix="keep each layer's commits together: base first, then each layered range",
                )
            current = li
        li = current
        old = None
        names = [e.name for e in layers[li].entries]
        if note_name in names and (li, note_name) not in used:
            old = note_name
        else:
            for n in names:
                if (li, n) not in used and old_subjects[li].get(n) == subject:
                    old = n
                    break
        if old:
            used.add((li, old))
        grouped[li].append((c, subject, old))
    new_layers: list[Series] = []
    patches: list[ExportedPatch] = []
    files: dict[Path, bytes] = {}
    number = 1
    for li, s in enumerate(layers):
        leads = {e.name: e.lead for e in s.entries}
        entries: list[Entry] = []
        for c, subject, old in grouped[li]:
            name = renumbered(old, number) if old else patch_name(number, subject)
            data = format_commit(repo, c)
            patches.append(ExportedPatch(s.layer, name, c, subject, data, old))
            entries.append(Entry(name=name, line=0, lead=list(leads.get(old, [])) if old else []))
            files[s.dir / name] = data
            number += 1
        ns = Series(dir=s.dir, layer=s.layer, entries=entries, header=list(s.header), footer=list(s.footer))
        new_layers.append(ns)
        files[s.dir / SERIES_FILE] = render_series(ns).encode()
        pb = {p.name: p.data for p in patches if p.layer == s.layer}
        files[s.dir / INDEX_FILE] = render_index(ns, patch_bytes=pb).encode()
    keep = set(files)
    remove = [s.dir / e.name for s in layers for e in s.entries if (s.dir / e.name) not in keep]
    return ExportPlan(new_layers, patches, files, remove)


def export_series(
    repo: Path, layers: Sequence[Series], *, base: str | None = None, check: bool = False
) -> tuple[ExportPlan, list[Change]]:
    """Export (or with ``check`` only compare); returns the plan and the byte changes."""
    plan = plan_export(repo, layers, base=base)
    changes = plan.changes() if check else plan.write()
    return plan, changes
