"""Apply a series with ``git am -3``, one patch (and one commit) at a time.

Each patch is first probed with ``git apply --check --verbose`` against a
scratch index of HEAD, which says whether it applies cleanly, with an offset,
or not at all (and then which file, line and hunk). ``git am -3`` then applies
it for real, falling back to a 3-way merge. Each commit gets a note
(``refs/notes/stackforge``) naming its layer and patch file, which ``export``
reads back.

On a failure the repository is left with ``git am`` in progress and a marker
file ``.stackforge-apply-state`` at its top; ``continue_apply`` picks up from
there once the conflict is resolved and staged.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeGuard

from stackforge.clients.git import BASE_REF, NOTES_REF, am_in_progress, git, git_dir, rev_parse
from stackforge.errors import UserError
from stackforge.patches.patchfile import Hunk, parse_patch
from stackforge.patches.repo import init_tree_repo
from stackforge.patches.series import BASE_LAYER, PatchRef, Series, flatten

STATE_FILE = ".stackforge-apply-state"

CLEAN = "clean"
RESOLVED = "resolved"
OFFSET = "offset"
THREEWAY = "3-way"
FAILS = "fails"
UPSTREAMED = "upstreamed"
NOT_RUN = "not-run"

AM_ARGS = ["am", "--3way", "--keep-non-patch", "--committer-date-is-author-date", "--no-signoff"]


@dataclass
class Diagnosis:
    """Where a patch does not apply: the file, the line the hunk expects, the hunk."""

    file: str | None = None
    line: int | None = None
    hunk_number: int | None = None  # 1-based within the file
    hunk: str | None = None
    hunk_patch_line: int | None = None  # line of the hunk header in the .patch file
    reason: str = ""
    conflicts: list[str] = field(default_factory=list)
    git_output: str = ""


@dataclass
class PatchResult:
    layer: str
    name: str
    path: str
    position: int
    total: int
    status: str
    commit: str | None = None
    detail: str = ""
    diagnosis: Diagnosis | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        if self.diagnosis is None:
            d.pop("diagnosis")
        return d


@dataclass
class ApplyReport:
    repo: Path
    base: str
    results: list[PatchResult] = field(default_factory=list)

    @property
    def failed(self) -> list[PatchResult]:
        return [r for r in self.results if r.status == FAILS]

    @property
    def upstreamed(self) -> list[PatchResult]:
        return [r for r in self.results if r.status == UPSTREAMED]

    @property
    def ok(self) -> bool:
        return not self.failed and all(r.status != NOT_RUN for r in self.results)

    def to_json(self) -> dict:
        return {
            "repo": str(self.repo),
            "base": self.base,
            "ok": self.ok,
            "patches": [r.to_json() for r in self.results],
        }


# --- probing -------------------------------------------------------------------

_OFFSET_RE = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: \(offset (-?\d+) lines?\))?\.", re.M)
_FAILED_AT_RE = re.compile(r"^error: patch failed: (.+):(\d+)$", re.M)
_NOT_IN_INDEX_RE = re.compile(
    r"^error: (.+): (does not exist in index|already exists in index|does not match index|patch does not apply)$", re.M
)
_CONFLICT_RE = re.compile(r"^CONFLICT \([^)]*\): (?:Merge conflict in )?(.+)$", re.M)


def _scratch_index_apply(repo: Path, patch: Path, *extra: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory(prefix="stackforge-probe-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", "HEAD", env=env)
        res = git(repo, "apply", "--cached", "--check", "--verbose", *extra, str(patch.resolve()), env=env, check=False)
        return res.returncode, res.output


def probe(repo: Path, patch: Path) -> tuple[str, str, Diagnosis | None]:
    """(status, detail, diagnosis) of applying ``patch`` on HEAD without touching anything."""
    rc, out = _scratch_index_apply(repo, patch)
    if rc == 0:
        offsets = [m for m in _OFFSET_RE.finditer(out) if m.group(3)]
        if offsets:
            detail = "; ".join(f"hunk #{m.group(1)} at line {m.group(2)} (offset {m.group(3)})" for m in offsets)
            return OFFSET, detail, None
        return CLEAN, "", None
    rrc, _ = _scratch_index_apply(repo, patch, "--reverse")
    diag = diagnose(patch, out)
    if rrc == 0:
        diag.reason = "its changes are already present (it applies in reverse)"
    return FAILS, diag.reason, diag


def diagnose(patch: Path, apply_output: str) -> Diagnosis:
    """Turn ``git apply --verbose`` output into file, line and hunk."""
    diag = Diagnosis(git_output=apply_output.strip())
    pf = parse_patch(patch)
    m = _FAILED_AT_RE.search(apply_output)
    if m:
        diag.file, diag.line = m.group(1), int(m.group(2))
        diag.reason = "hunk does not match the file"
        hunks = [h for h in pf.hunks if h.file == diag.file]
        for i, h in enumerate(hunks, start=1):
            if h.old_start == diag.line or (h.old_len == 0 and h.old_start + 1 == diag.line):
                _set_hunk(diag, h, i)
                break
        else:
            if hunks:
                _set_hunk(diag, hunks[0], 1)
        return diag
    m2 = _NOT_IN_INDEX_RE.search(apply_output)
    if m2:
        diag.file, diag.reason = m2.group(1), m2.group(2)
        hunks = [h for h in pf.hunks if h.file == diag.file]
        if hunks:
            _set_hunk(diag, hunks[0], 1)
            diag.line = hunks[0].old_start
        return diag
    diag.reason = apply_output.strip().splitlines()[-1] if apply_output.strip() else "git apply failed"
    return diag


def _set_hunk(diag: Diagnosis, h: Hunk, number: int) -> None:
    diag.hunk_number = number
    diag.hunk = h.text()
    diag.hunk_patch_line = h.patch_line


def seed_blobs(repo: Path, base: str, refs: Sequence[PatchRef]) -> int:
    """Write the blobs the series creates on ``base`` into the object store; return how many patches applied.

    ``git am -3`` can fall back to a 3-way merge only if the blobs named on a
    patch's ``index`` line exist. A patch made on top of earlier patches names
    intermediate blobs that no upstream commit has; applying the series on the
    commit it was made against (in a scratch index, no commits) creates them,
    so a later apply onto a different commit can merge.
    """
    n = 0
    with tempfile.TemporaryDirectory(prefix="stackforge-seed-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", base, env=env)
        for ref in refs:
            if not ref.path.is_file():
                break
            res = git(repo, "apply", "--cached", str(ref.path.resolve()), env=env, check=False)
            if not res.ok:
                break
            n += 1
    return n


# --- notes ---------------------------------------------------------------------


def note_text(layer: str, name: str) -> str:
    return f"stackforge-layer: {layer}\nstackforge-patch: {name}\n"


def read_note(repo: Path, commit: str) -> tuple[str | None, str | None]:
    res = git(repo, "notes", f"--ref={NOTES_REF}", "show", commit, check=False)
    if not res.ok:
        return None, None
    layer = name = None
    for ln in res.stdout.splitlines():
        if ln.startswith("stackforge-layer: "):
            layer = ln.split(": ", 1)[1].strip()
        elif ln.startswith("stackforge-patch: "):
            name = ln.split(": ", 1)[1].strip()
    return layer, name


def _head(repo: Path) -> str:
    """The commit HEAD names; a tree being patched always has one (its base commit at least)."""
    head = rev_parse(repo, "HEAD")
    if head is None:
        raise UserError(f"{repo} has no HEAD commit", fix="start again from a fresh checkout of the upstream")
    return head


def _add_note(repo: Path, commit: str, layer: str, name: str) -> None:
    git(repo, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", note_text(layer, name).strip(), commit)


# --- applying --------------------------------------------------------------------


def apply_one(repo: Path, ref: PatchRef) -> PatchResult:
    """Probe and ``git am -3`` one patch. On failure ``git am`` is left in progress."""
    result = PatchResult(ref.layer, ref.name, str(ref.path), ref.position, ref.total, NOT_RUN)
    if not ref.path.is_file():
        result.status = FAILS
        result.diagnosis = Diagnosis(reason=f"patch file {ref.path} is missing")
        result.detail = result.diagnosis.reason
        return result
    status, detail, diag = probe(repo, ref.path)
    before = rev_parse(repo, "HEAD")
    res = git(repo, *AM_ARGS, str(ref.path.resolve()), check=False)
    out = res.output
    if res.ok:
        after = _head(repo)
        if after == before or "No changes -- Patch already applied" in out:
            result.status = UPSTREAMED
            result.detail = "already applied: git am found no changes to make"
            return result
        result.commit = after
        _add_note(repo, after, ref.layer, ref.name)
        if status == FAILS or "Falling back to patching base and 3-way merge" in out:
            result.status = THREEWAY
            result.detail = "applied by 3-way merge" + (f" ({detail})" if detail else "")
        else:
            result.status, result.detail = status, detail
        return result
    result.status = FAILS
    diag = diag or diagnose(ref.path, out)
    diag.conflicts = _CONFLICT_RE.findall(out)
    diag.git_output = (diag.git_output + "\n" + out.strip()).strip()
    if diag.file is None and diag.conflicts:
        diag.file = diag.conflicts[0]
    result.diagnosis = diag
    result.detail = diag.reason
    return result


def state_path(repo: Path) -> Path:
    return Path(repo) / STATE_FILE


def _write_state(
    repo: Path, refs: Sequence[PatchRef], results: list[PatchResult], failed_index: int, resume: str, context: dict
) -> None:
    exclude = git_dir(repo) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    if f"/{STATE_FILE}" not in text.splitlines():
        exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + f"/{STATE_FILE}\n")
    state = {
        "version": 1,
        "status": "stopped: a patch does not apply",
        "failed": refs[failed_index].name,
        "failed_index": failed_index,
        "head": rev_parse(repo, "HEAD"),
        "resume": resume,
        "context": context,
        "patches": [
            {"layer": r.layer, "name": r.name, "path": str(r.path.resolve()), "total": r.total, "position": r.position}
            for r in refs
        ],
        "results": [r.to_json() for r in results],
    }
    state_path(repo).write_text(json.dumps(state, indent=2) + "\n")


def read_state(repo: Path) -> dict | None:
    p = state_path(repo)
    if not p.is_file():
        return None
    return json.loads(p.read_text())


def _results_from_json(items: list[dict]) -> list[PatchResult]:
    out = []
    for d in items:
        diag = d.pop("diagnosis", None)
        r = PatchResult(**d)
        if diag:
            r.diagnosis = Diagnosis(**diag)
        out.append(r)
    return out


def run_patches(
    repo: Path,
    refs: Sequence[PatchRef],
    *,
    start: int = 0,
    stop_on_failure: bool = True,
    results: list[PatchResult] | None = None,
    resume: str = "",
    context: dict | None = None,
) -> list[PatchResult]:
    """Apply ``refs[start:]`` in order.

    With ``stop_on_failure`` the first failure stops everything and leaves the
    marked state; otherwise the failed patch is aborted (HEAD stays where it
    was) and the rest still run, which is what ``check`` wants.
    """
    results = list(results or [])
    for i in range(start, len(refs)):
        r = apply_one(repo, refs[i])
        results.append(r)
        if r.status == FAILS:
            if stop_on_failure:
                _write_state(repo, refs, results, i, resume, context or {})
                for rest in refs[i + 1 :]:
                    results.append(
                        PatchResult(rest.layer, rest.name, str(rest.path), rest.position, rest.total, NOT_RUN)
                    )
                return results
            if am_in_progress(repo):
                git(repo, "am", "--abort", check=False)
    st = state_path(repo)
    if st.exists():
        st.unlink()
    return results


def apply_layers(
    repo: Path,
    layers: Sequence[Series],
    *,
    stop_on_failure: bool = True,
    resume: str = "",
    context: dict | None = None,
) -> ApplyReport:
    base = rev_parse(repo, "HEAD") or ""
    refs = flatten(layers)
    results = run_patches(repo, refs, stop_on_failure=stop_on_failure, resume=resume, context=context)
    return ApplyReport(Path(repo), base, results)


def continue_apply(repo: Path, *, skip: bool = False) -> ApplyReport:
    """Finish the stopped patch (resolved and staged by the user, or ``skip``ped) and apply the rest."""
    repo = Path(repo)
    state = read_state(repo)
    if state is None:
        raise UserError(
            f"{repo} has no {STATE_FILE}: nothing to continue",
            fix="start with `stackforge patches apply STACK --to DIR`",
        )
    refs = [PatchRef(p["layer"], p["name"], Path(p["path"]), p["position"], p["total"]) for p in state["patches"]]
    idx = int(state["failed_index"])
    results = _results_from_json(state["results"])[:idx]
    ref = refs[idx]
    base = rev_parse(repo, BASE_REF) or ""
    resume = state.get("resume", "")
    context = state.get("context")
    if not am_in_progress(repo) and not skip:
        head = _head(repo)
        if state.get("head") and head != state["head"]:
            # The user finished the patch with git directly (git am --continue, or a commit).
            r = PatchResult(
                ref.layer, ref.name, str(ref.path), ref.position, ref.total, RESOLVED, head, "resolved by hand"
            )
            _add_note(repo, head, ref.layer, ref.name)
            results.append(r)
            results = run_patches(repo, refs, start=idx + 1, results=results, resume=resume, context=context)
            return ApplyReport(repo, base, results)
        # Nothing half-applied (e.g. the patch file itself was fixed): try the stopped patch again.
        results = run_patches(repo, refs, start=idx, results=results, resume=resume, context=context)
        return ApplyReport(repo, base, results)
    r = PatchResult(ref.layer, ref.name, str(ref.path), ref.position, ref.total, RESOLVED)
    if am_in_progress(repo):
        before = rev_parse(repo, "HEAD")
        res = git(repo, "am", "--skip" if skip else "--continue", check=False)
        if not res.ok:
            raise UserError(
                f"cannot continue {ref.name}: git am says:\n{res.output.strip()}",
                file=ref.path,
                fix="resolve the conflicts, `git add` the fixed files, then run the resume command again",
            )
        after = _head(repo)
        if not skip and after != before:
            r.commit = after
            r.detail = "resolved by hand"
            _add_note(repo, after, ref.layer, ref.name)
        elif not skip:
            r.status, r.detail = UPSTREAMED, "resolved to no change"
    if skip:
        r.status, r.detail = "skipped", "skipped by the user"
    results.append(r)
    results = run_patches(repo, refs, start=idx + 1, results=results, resume=resume, context=context)
    return ApplyReport(repo, base, results)


def abort_apply(repo: Path) -> None:
    """Drop the in-progress patch and the marker; the commits applied so far stay."""
    repo = Path(repo)
    if am_in_progress(repo):
        git(repo, "am", "--abort")
    st = state_path(repo)
    if st.exists():
        st.unlink()


# --- reporting ---------------------------------------------------------------------


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + ln for ln in text.splitlines())


def failure_message(r: PatchResult) -> str:
    d = r.diagnosis or Diagnosis()
    where = "" if r.layer == BASE_LAYER else f" in layer {r.layer}"
    lines = [f"patch {r.name} (position {r.position} of {r.total}{where}) does not apply"]
    if d.file:
        lines.append(f"  file: {d.file}" + (f", line {d.line}" if d.line else ""))
    if d.reason:
        lines.append(f"  reason: {d.reason}")
    if d.conflicts:
        lines.append("  conflicts after 3-way merge: " + ", ".join(d.conflicts))
    if d.hunk:
        lines.append(f"  hunk #{d.hunk_number} of {d.file} (patch line {d.hunk_patch_line}):")
        lines.append(_indent(d.hunk))
    return "\n".join(lines)


def failure_error(report: ApplyReport, resume: str | None) -> UserError:
    r = report.failed[0]
    d = r.diagnosis or Diagnosis()
    fix = None
    if resume:
        fix = (
            f"the tree at {report.repo} is mid-apply (git am in progress, marker {STATE_FILE}); "
            f"fix the files, `git add` them, then run: {resume}"
            f"  (or add --skip to drop this patch, --abort to stop)"
        )
    return UserError(failure_message(r), file=r.path, line=d.hunk_patch_line, fix=fix, exit_code=1)


def summary_lines(report: ApplyReport) -> list[str]:
    out = []
    for r in report.results:
        where = "" if r.layer == BASE_LAYER else f" [{r.layer}]"
        extra = f"  {r.detail}" if r.detail and r.status != FAILS else ""
        out.append(f"{r.status:<10} {r.position:>4}/{r.total} {r.name}{where}{extra}")
    return out


# --- host-side entry point for the build -----------------------------------------------


def _all_series(items: object) -> TypeGuard[Sequence[Series]]:
    return isinstance(items, (list, tuple)) and bool(items) and all(isinstance(s, Series) for s in items)


def apply_series(
    tree_dir: Path | str,
    patch_paths: Iterable[Path | str] | Series | Sequence[Series],
    *,
    keep_git: bool = True,
    message: str = "upstream",
) -> ApplyReport:
    """Apply patches in order onto a plain exported tree (or an existing git checkout).

    A tree without ``.git`` is first committed as one base commit. Raises
    UserError naming the failing patch (file, line, hunk); the tree is then
    left mid-apply. With ``keep_git=False`` the ``.git`` directory is removed
    after a successful apply, leaving only the patched files.
    """
    tree = Path(tree_dir)
    if isinstance(patch_paths, Series):
        refs = flatten([patch_paths])
    elif _all_series(patch_paths):
        refs = flatten(patch_paths)
    else:
        paths = []
        for p in patch_paths:
            if isinstance(p, Series):
                raise TypeError("apply_series takes patch paths, one Series or a list of Series, not a mix")
            paths.append(Path(p))
        refs = [PatchRef(BASE_LAYER, p.name, p, i, len(paths)) for i, p in enumerate(paths, start=1)]
    if not refs:
        return ApplyReport(tree, "", [])
    if not (tree / ".git").exists():
        init_tree_repo(tree, message)
    base = rev_parse(tree, "HEAD") or ""
    results = run_patches(tree, refs, resume="", context={"tree": str(tree)})
    report = ApplyReport(tree, base, results)
    if report.failed:
        raise failure_error(report, None)
    if not keep_git:
        shutil.rmtree(tree / ".git")
    return report
