"""Options shared by the verbs (--set, --json, --out), the run's workspace, and how a verb loads the
stacks it names (as ``LoadedStack``: the model with its root, overrides, credentials and positions).

``--set [STACK:]KEY.PATH=VALUE``: without a scope the override applies to every stack the verb
loads; ``STACK:`` limits it to that stack. The text before the first ``:`` is a scope when the
``:`` comes before the first ``=`` (a key path never holds a ``:``) and that text is a stack name;
a scope naming a stack the verb did not select is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.stack.names import STACK_NAME, STACKS_DIR, find_root
from stackforge.urls import redact_text

if TYPE_CHECKING:
    from stackforge.stack.document import Document
    from stackforge.stack.load import LoadedStack

SELECTED = "_selected_stacks"  # the attribute select() sets on args
WORKSPACE = "workspace"  # the attribute main() sets on args


def add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="[STACK:]KEY.PATH=VALUE",
        help="override a stack value, e.g. --set base.image=stackforge/base:bookworm (repeatable); "
        "with STACK: it applies to that stack only, e.g. --set post2:packages.torch.version=2.8.0",
    )


def add_json(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as one JSON value on stdout (progress and errors stay on stderr)",
    )


def add_osv(parser: argparse.ArgumentParser, what: str) -> None:
    """--osv DIR and --fail-on SEVERITY: the vulnerability gate of ``what`` (publish, or every publish of a night)."""
    parser.add_argument(
        "--osv",
        type=Path,
        metavar="DIR",
        help=f"scan {what} against this OSV database directory (offline) and move no alias while a finding at or "
        "above --fail-on stands; the immutable tag is published either way",
    )
    parser.add_argument(
        "--fail-on",
        default="high",
        metavar="SEVERITY",
        help="with --osv: low, medium, high or critical (default high; unknown severity counts as high)",
    )
    add_osv_max_age(parser)


def osv_max_age_of(args) -> Any:
    """``--osv-max-age`` as a timedelta (an error naming the flag when it is not an age)."""
    from stackforge.builder.records.vulns import parse_max_age

    return parse_max_age(args.osv_max_age)


def add_osv_max_age(parser: argparse.ArgumentParser) -> None:
    """--osv-max-age AGE: how old the OSV database may be before the gate refuses it."""
    parser.add_argument(
        "--osv-max-age",
        default="7d",
        metavar="AGE",
        help="refuse an OSV database whose snapshot (osv-snapshot.json's fetched_at) is older than this: 36h, 7d, "
        "2w (default 7d)",
    )


def add_out(parser: argparse.ArgumentParser, names: str) -> None:
    """``--out PATH``; ``names`` says exactly what the path is and its default."""
    parser.add_argument("--out", type=Path, metavar="PATH", help=names)


def add_retry(
    parser: argparse.ArgumentParser,
    attempts: str = "attempts per registry operation on 5xx/429/connection errors",
    budget: str = "time budget per registry operation, retries included",
) -> None:
    """``--retries N`` and ``--retry-time SECONDS`` for a verb that talks to a registry (see :func:`retry_policy`)."""
    parser.add_argument("--retries", type=int, default=6, metavar="N", help=f"{attempts} (default 6)")
    parser.add_argument("--retry-time", type=float, default=120.0, metavar="SECONDS", help=f"{budget} (default 120)")


def retry_policy(args):
    """The registry retry policy of ``--retries`` / ``--retry-time`` (at least one attempt and one second)."""
    from stackforge.clients.registry import RetryPolicy

    return RetryPolicy(attempts=max(1, args.retries), total_seconds=max(1.0, args.retry_time))


BUILD_DIR_OUT = (
    "the stack's build directory: the Dockerfile, the build context and evidence/ go here (default: build/<stack>)"
)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def split_scope(text: str) -> tuple[str | None, str]:
    """``"post2:a.b=1"`` → ``("post2", "a.b=1")``; ``"a.b=x:y"`` → ``(None, "a.b=x:y")``."""
    colon, eq = text.find(":"), text.find("=")
    if colon < 0 or (0 <= eq < colon):
        return None, text
    head = text[:colon]
    if not STACK_NAME.fullmatch(head):
        shown = head if len(head) <= 100 and head.isprintable() else "the scope"
        raise UserError(
            f"'{redact_text(shown)}' is not a stack name",
            file=f"--set {redact_text(shown)}:…",
            fix="write --set STACK:key.path=value with a stack's name (lower-case letters, digits, "
            "'.', '_', '-'), or --set key.path=value for every stack",
        )
    return head, text[colon + 1 :]


def _stack_key(name: str) -> str:
    """The name a scope is compared with: a stack's name, or the file stem of a path to its YAML."""
    path = Path(name)
    return path.stem if path.suffix in (".yaml", ".yml") else name


def select(args, names: Iterable[str]) -> None:
    """Record the stacks a verb works on and refuse a ``--set`` scope naming another one."""
    selected = [_stack_key(n) for n in names]
    setattr(args, SELECTED, selected)
    for raw in getattr(args, "overrides", None) or []:
        scope, _ = split_scope(raw)
        if scope is not None and scope not in selected:
            raise UserError(
                f"the scope '{scope}' names a stack this command does not work on",
                file=f"--set {redact_text(raw) if len(raw) <= 200 else scope + ':…'}",
                fix=f"scope it to one of the selected stacks ({', '.join(selected) or 'none'}), "
                "or drop the scope to apply it to all",
            )


def overrides_for(args, name: str) -> list[str]:
    """The ``--set`` values that apply to stack ``name``: the unscoped ones and those scoped to it.

    Without a prior :func:`select`, ``name`` is the only selected stack."""
    if getattr(args, SELECTED, None) is None:
        select(args, [name])
    key = _stack_key(name)
    out = []
    for raw in getattr(args, "overrides", None) or []:
        scope, text = split_scope(raw)
        if scope is None or scope == key:
            out.append(text)
    return out


def make_workspace(args) -> Workspace:
    """The run's workspace: the root of ``--root`` (checked when first asked for), the verb's
    ``--ca-bundle``, ``--builder`` and ``--refresh`` (where it has them)."""
    return Workspace(
        lambda: _checked_root(args),
        ca_bundle=getattr(args, "ca_bundle", "auto"),
        builder=getattr(args, "builder", None),
        refresh=getattr(args, "refresh", False),
        mirror=getattr(args, "mirror", None) if getattr(args, "offline", False) else None,
    )


def workspace_of(args) -> Workspace:
    """The workspace ``main`` built for this run (built here for a verb called without ``main``)."""
    ws = getattr(args, WORKSPACE, None)
    if ws is None:
        ws = make_workspace(args)
        setattr(args, WORKSPACE, ws)
    return ws


def root_of(args) -> Path:
    """The repository root: ``--root DIR`` (which must hold stacks/) or the one found upwards from here."""
    return workspace_of(args).root


def _checked_root(args) -> Path:
    given = getattr(args, "root", None)
    if not given:
        return find_root()
    root = Path(given).resolve()
    if not root.is_dir():
        raise UserError(
            f"no such directory: {given}",
            file="--root",
            fix="pass the stackforge repository's directory (the one holding stacks/)",
        )
    if not (root / STACKS_DIR).is_dir():
        raise UserError(
            f"{root} has no {STACKS_DIR}/ directory",
            file="--root",
            fix="pass the stackforge repository's directory (the one holding stacks/)",
        )
    return root


def load(args, name: str, read: Document | None = None) -> LoadedStack:
    """Load stack ``name`` of the workspace's repository with the ``--set`` values that apply to it (``read``:
    its document as already read, see ``stack.load.load``)."""
    from stackforge.stack.load import load as load_stack_file

    loaded = load_stack_file(name, root=root_of(args), overrides=overrides_for(args, name), read=read)
    which = getattr(args, "platform", None)
    return loaded.for_platform(which) if which and which != ALL_PLATFORMS else loaded


#: ``--platform all``: every platform line of the stack
ALL_PLATFORMS = "all"


def add_platform(parser: argparse.ArgumentParser, what: str, every: bool = False) -> None:
    """``--platform NAME``: the platform line of the stack the verb works on (its name, e.g. arm64, its OCI
    platform linux/arm64 or its architecture aarch64); default: the stack's own (its platform.arch)."""
    parser.add_argument(
        "--platform",
        metavar="NAME",
        help=f"{what} the stack's platform line NAME (arm64, linux/arm64 or aarch64; default: the stack's own, its "
        "platform.arch)" + (f"; {ALL_PLATFORMS}: every line, one after the other" if every else ""),
    )


def add_refresh(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="fetch every upstream again, even one whose pinned commit is already in the cache",
    )


NO_CACHE_HELP = (
    "run every step again, with empty pip, ccache and apt caches of this build's own (removed when it ends); "
    "the shared caches other builds use stay as they are"
)


def add_registry_cache(parser: argparse.ArgumentParser) -> None:
    """``--cache-from REF``, ``--cache-to inline|REF`` and ``--registry-cache REF`` (builder/run/regcache.py)."""
    parser.add_argument(
        "--cache-from",
        action="append",
        default=[],
        metavar="REF",
        help="import BuildKit's build cache from this registry reference: an image built with inline cache (e.g. "
        "the stack's published alias) or a cache pushed by --cache-to REF (repeatable)",
    )
    parser.add_argument(
        "--cache-to",
        metavar="inline|REF",
        help="export the build cache: 'inline' puts it in the image's config (the image's own layers; published "
        "with the image, on every engine), REF pushes every stage's cache to that tag (needs the containerd image "
        "store or a docker-container/remote builder)",
    )
    parser.add_argument(
        "--registry-cache",
        metavar="REF",
        help="reuse another host's work: --cache-from REF --cache-to inline (publish the image to REF to pass "
        "its cache on)",
    )


def registry_cache_of(args):
    """The :class:`~stackforge.builder.run.regcache.RegistryCache` the verb's options ask for, checked (None: none)."""
    from stackforge.builder.run.regcache import RegistryCache

    return RegistryCache.parse(
        getattr(args, "cache_from", None) or [],
        getattr(args, "cache_to", None),
        getattr(args, "registry_cache", None),
    )
