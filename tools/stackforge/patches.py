"""The patch overlay's public API (implemented in ``stackforge.overlay``).

Series layout: ``patches/<upstream>/series`` + ``NNNN-<Area>-<summary>.patch``
+ a generated ``README.md``; layered ranges live in
``overlays/<overlay>/patches/<upstream>/`` and apply after the base series.

For the build:

- ``series_hash(patch_dir_or_series, *layers) -> str``: sha256 over the series
  order and patch bytes (labels, evidence);
- ``apply_series(tree_dir, patch_paths) -> ApplyReport``: apply onto an
  exported tree on the host; raises UserError naming the failing patch.
"""
from __future__ import annotations

from .overlay.apply import (
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
from .overlay.export import FORMAT_PATCH_ARGS, Change, ExportPlan, export_series, format_commit, plan_export
from .overlay.index import render_index, write_index
from .overlay.lint import DEFAULT_TRACKER_PATTERN, Finding, lint_layers, lint_repository, lint_series
from .overlay.ops import (
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
    stack_root,
    target_from_stack,
)
from .overlay.patchfile import PatchFile, parse_patch
from .overlay.series import (
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
    from pathlib import Path

    layers = [read_series(patch_dir)]
    layers += [read_series(d, layer=Path(d).parent.parent.name or f"layer{i}") for i, d in enumerate(range_dirs, start=1)]
    return apply_series(tree_dir, layers, keep_git=keep_git).results


__all__ = [
    "ApplyReport",
    "BASE_LAYER",
    "CLEAN",
    "Change",
    "DEFAULT_TRACKER_PATTERN",
    "Diagnosis",
    "ExportPlan",
    "FAILS",
    "FORMAT_PATCH_ARGS",
    "Finding",
    "NOT_RUN",
    "OFFSET",
    "PatchFile",
    "PatchRef",
    "PatchResult",
    "RangeEntry",
    "STATE_FILE",
    "Series",
    "THREEWAY",
    "Target",
    "UPSTREAMED",
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
    "stack_root",
    "summary_lines",
    "target_from_stack",
    "write_index",
    "write_series",
]
