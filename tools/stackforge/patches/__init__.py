"""The patch series library: a numbered series of patches applied onto a pinned upstream.

Series layout: ``patches/<upstream>/series`` + ``NNNN-<Area>-<summary>.patch`` + a generated
``README.md``; layered ranges live in ``overlays/<overlay>/patches/<upstream>/`` and apply after
the base series. Modules, along the data flow:

- ``series``    read/write ``series`` files, layers (base series + layered ranges), names, hashes
- ``patchfile`` parse one patch file (headers, message, per-file hunks, added lines)
- ``git``       run git with an isolated, deterministic environment
- ``repo``      turn an upstream export into a git repository to apply onto
- ``apply``     ``git am -3`` one patch at a time, with diagnosis and resumable state
- ``ops``       check (clean / offset / 3-way / fails / upstreamed), upstreamed, range-diff
- ``export``    ``git format-patch`` back into the series, byte-stable, renumbering
- ``lint``      static checks over series directories
- ``index``     the generated README index

This module is the public API; the build uses ``series_hash`` (labels, evidence) and
``apply_to_export`` (apply onto an exported tree on the host; a UserError names the failing patch).
"""

from __future__ import annotations

from pathlib import Path

from stackforge.patches.apply import (
    CLEAN,
    FAILS,
    NOT_RUN,
    OFFSET,
    STATE_FILE,
    THREEWAY,
    UPSTREAMED,
    ApplyReport,
    Diagnosis,
    PatchResult,
    abort_apply,
    apply_layers,
    apply_series,
    continue_apply,
    failure_error,
    failure_message,
    read_state,
    summary_lines,
)
from stackforge.patches.export import (
    FORMAT_PATCH_ARGS,
    Change,
    ExportPlan,
    export_series,
    format_commit,
    plan_export,
)
from stackforge.patches.index import render_index, write_index
from stackforge.patches.lint import (
    DEFAULT_TRACKER_PATTERN,
    Finding,
    lint_layers,
    lint_repository,
    lint_series,
)
from stackforge.patches.ops import (
    RangeEntry,
    Target,
    Upstreamed,
    apply_to,
    check,
    drop_upstreamed,
    export_check,
    find_upstreamed,
    make_target,
    range_diff,
    target_from_stack,
)
from stackforge.patches.patchfile import PatchFile, parse_patch
from stackforge.patches.series import (
    BASE_LAYER,
    PatchRef,
    Series,
    drop_entries,
    flatten,
    layer_dirs,
    load_layers,
    read_series,
    renumber,
    series_hash,
    write_series,
)


def apply_to_export(tree_dir, patch_dir, *range_dirs, keep_git: bool = False) -> list[PatchResult]:
    """Apply the series in ``patch_dir`` (then any layered range dirs) onto an exported tree.

    For the build's source stage: the tree ends up holding the patched files
    only (``keep_git=False``). Raises UserError naming the failing patch.
    Returns one result per patch, in order.
    """

    layers = [read_series(patch_dir)]
    layers += [
        read_series(d, layer=Path(d).parent.parent.name or f"layer{i}") for i, d in enumerate(range_dirs, start=1)
    ]
    return apply_series(tree_dir, layers, keep_git=keep_git).results


__all__ = [
    "BASE_LAYER",
    "CLEAN",
    "DEFAULT_TRACKER_PATTERN",
    "FAILS",
    "FORMAT_PATCH_ARGS",
    "NOT_RUN",
    "OFFSET",
    "STATE_FILE",
    "THREEWAY",
    "UPSTREAMED",
    "ApplyReport",
    "Change",
    "Diagnosis",
    "ExportPlan",
    "Finding",
    "PatchFile",
    "PatchRef",
    "PatchResult",
    "RangeEntry",
    "Series",
    "Target",
    "Upstreamed",
    "abort_apply",
    "apply_layers",
    "apply_series",
    "apply_to",
    "apply_to_export",
    "check",
    "continue_apply",
    "drop_entries",
    "drop_upstreamed",
    "export_check",
    "export_series",
    "failure_error",
    "failure_message",
    "find_upstreamed",
    "flatten",
    "format_commit",
    "layer_dirs",
    "lint_layers",
    "lint_repository",
    "lint_series",
    "load_layers",
    "make_target",
    "parse_patch",
    "plan_export",
    "range_diff",
    "read_series",
    "read_state",
    "render_index",
    "renumber",
    "series_hash",
    "summary_lines",
    "target_from_stack",
    "write_index",
    "write_series",
]
