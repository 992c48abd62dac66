"""How a layered range reaches an image: applied on the host, its changed files copied into site-packages.

The range is applied as ``stackforge patches apply --overlay`` applies it (the patch library's ``apply_to``:
the upstream at the base stack's pinned commit, the carried and base series, then the range, ``git am -3``).
The files the range's patches change are read from the patched tree; each must lie inside one of the range's
installed packages (``vllm/…`` → ``{site}/vllm/…``): a patch that changes anything else (csrc/, setup.py,
CMakeLists.txt) needs a rebuild, which an overlay cannot do, and is refused naming the patch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.fslock import file_sha256
from stackforge.overlay.load import OVERLAYS_DIR, LoadedOverlay
from stackforge.patches.apply import failure_error
from stackforge.patches.ops import apply_to, scratch, target_from_stack
from stackforge.patches.patchfile import parse_patch
from stackforge.patches.series import read_series, series_hash

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack


@dataclass(frozen=True)
class Changed:
    """One file of the installed package the range changes: its path in the upstream's tree (= below
    site-packages), the patch that last changed it, and the post-image's sha256 (None: the range deletes it)."""

    upstream: str
    path: str
    patch: str
    sha256: str | None


def range_hash(ov: LoadedOverlay, upstream: str) -> str:
    """sha256 over the range's order and patch bytes (the patch library's series hash of this layer alone)."""
    return "sha256:" + series_hash(read_series(ov.range_dir(upstream), layer=ov.name))


def changed_paths(ov: LoadedOverlay, upstream: str) -> list[tuple[str, str]]:
    """(path, patch name) of every file the range changes, in order, the last patch winning; a file outside the
    range's installed packages is refused naming the patch and its line (exit 2)."""
    series = read_series(ov.range_dir(upstream), layer=ov.name)
    packages = ov.packages(upstream)
    out: dict[str, str] = {}
    for entry, path in zip(series.entries, series.paths):
        if not path.is_file():
            raise UserError(
                f"series lists {entry.name} but the file is missing",
                file=series.series_file,
                line=entry.line,
                fix="add the patch file or remove the entry from the series",
            )
        pf = parse_patch(path)
        for fd in pf.files:
            for touched in dict.fromkeys(p for p in (fd.old_path, fd.new_path) if p):
                top = touched.split("/", 1)[0]
                if top not in packages or "/" not in touched:
                    raise UserError(
                        f"{OVERLAYS_DIR}/{ov.name}/patches/{upstream}/{entry.name} changes {touched}, which is outside "
                        f"the installed package{'s' if len(packages) > 1 else ''} {', '.join(packages)}: an overlay "
                        "copies changed files into site-packages and cannot rebuild anything",
                        file=str(path),
                        line=fd.patch_line,
                        fix=f"a change to {touched} needs a stack to rebuild it: move the patch into the stack's series "
                        f"(patches/{upstream}) and build the stack, or list the package under "
                        f"patches.{upstream}.packages if {top}/ is installed as is",
                    )
                out[touched] = entry.name
    return list(out.items())


def apply_range(
    loaded: ResolvedStack, ov: LoadedOverlay, upstream: str, dest: Path, *, workspace: Workspace | None = None
) -> list[Changed]:
    """Apply the base series and the range onto the upstream at the stack's pinned commit (a scratch tree) and
    copy the post-image of every changed file to ``dest/<path>``; returns the changed files with their hashes."""
    if upstream not in loaded.model.upstreams:
        raise ov.error(
            f"patches.{upstream}: stack {loaded.name} has no upstream {upstream!r}",
            ("patches", upstream),
            fix=f"name one of: {', '.join(loaded.model.upstreams)}",
        )
    paths = changed_paths(ov, upstream)
    target = target_from_stack(loaded, upstream, overlays=[str(ov.dir)], workspace=workspace)
    out: list[Changed] = []
    with scratch("stackforge-overlay-") as tree:
        report = apply_to(target, tree, context={"overlay": ov.name})
        if report.failed:
            err = failure_error(report, None)
            raise UserError(
                f"patches.{upstream} of overlay {ov.name}: {err.message}",
                file=err.file,
                line=err.line,
                fix="refresh the range on the base series: stackforge patches apply "
                f"{loaded.name} --overlay {ov.name} --to DIR, fix, then export",
                exit_code=1,
            )
        for path, patch in paths:
            src = tree / path
            if src.is_file() and not src.is_symlink():
                (dest / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest / path)
                out.append(Changed(upstream, path, patch, file_sha256(src)))
            elif src.exists():
                raise UserError(
                    f"{patch} leaves {path} as something other than a file",
                    file=str(ov.range_dir(upstream)),
                    fix="a layered range may add, change or delete regular files only",
                )
            else:
                out.append(Changed(upstream, path, patch, None))
    return out


def base_series_hash(loaded: ResolvedStack, upstream: str, workspace: Workspace | None = None) -> str | None:
    """The series hash the base image's ``org.stackforge.series.<upstream>`` label carries when it was built from
    this stack's series (carried series, then the stack's own), computed on the host; None without a series."""
    up = loaded.model.upstreams[upstream]
    if not (up.patches or up.patches_from):
        return None
    target = target_from_stack(loaded, upstream, workspace=workspace)
    dirs = [s.dir for s in (target.carried_layer(), *target.layers) if s is not None]  # as the build hashes them
    digest = series_hash(*dirs)
    return digest if digest.startswith("sha256:") else f"sha256:{digest}"


def changed_digest(changed: list[Changed]) -> str:
    """One digest over the changed files (path and post-image hash, in order): the label's value."""
    text = "".join(f"{c.path} {c.sha256 or 'deleted'}\n" for c in changed)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def manifest(ov: LoadedOverlay, changed: dict[str, list[Changed]]) -> dict:
    """What the image's install step reads: the packages per upstream and every changed file."""
    return {
        "overlay": ov.name,
        "packages": sorted({p for up in changed for p in ov.packages(up)}),
        "files": [asdict(c) for up in changed for c in changed[up]],
    }


def manifest_text(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
