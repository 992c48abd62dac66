"""`stackforge newest STACK`: is every pin the newest in its line? (exit 0 yes, 1 no, 2 error)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, overrides_for, print_json, root_of, workspace_of

if TYPE_CHECKING:
    from stackforge.clients.index import IndexClient
    from stackforge.freshness import lines, prefetch
    from stackforge.freshness import newest as freshness
    from stackforge.stack.load import LoadedStack
else:
    freshness = lazy("stackforge.freshness.newest")
    lines = lazy("stackforge.freshness.lines")
    prefetch = lazy("stackforge.freshness.prefetch")

DEFAULT_TRAIN_WINDOW = 3600.0  # freshness.newest.DEFAULT_TRAIN_WINDOW, here so that --help imports no library


def add_index_options(p) -> None:
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="do not use the on-disk index cache (build/cache/index/); pages are revalidated anyway",
    )


def cache_dir(args):
    return None if getattr(args, "no_cache", False) else workspace_of(args).cache("index")


def register(sub) -> None:
    p = sub.add_parser(
        "newest",
        help="per pin: the newest version in the same line, its publish time, size and sha256",
        description="Query each package's index (PEP 691 JSON, PEP 503 HTML fallback) and compare the pin with "
        "the newest version of the same line: same python tag, ABI and platform, same local-label family. "
        "Exit 0 when every pin is the newest, 1 when something newer exists or a pin is missing, 2 on error.",
    )
    p.add_argument("stack")
    add_json(p, "the report per pin")
    p.add_argument("--package", action="append", default=[], metavar="NAME", help="only this package (repeatable)")
    p.add_argument(
        "--train-window",
        type=float,
        default=DEFAULT_TRAIN_WINDOW / 60,
        metavar="MINUTES",
        help="flag train members published further apart than this (default %(default)g)",
    )
    add_index_options(p)
    add_set(p)
    p.set_defaults(func=cmd_newest)


def load_and_query(args, packages: list[str] | None = None) -> tuple[LoadedStack, dict[str, IndexClient]]:
    """Stack ``args.stack`` and its index clients (``lines.clients_for``), the clients already asking for the pages
    of ``packages`` (default: all): the queries start from the stack file while the model is imported and
    validated (``freshness.prefetch``)."""
    cache = cache_dir(args)
    early = prefetch.start(
        root_of(args), args.stack, overrides_for(args, args.stack), packages=packages, cache_dir=cache
    )
    loaded = load(args, args.stack, read=early.document)
    return loaded, lines.clients_for(loaded, cache, reuse=early.clients)


def cmd_newest(args) -> int:
    loaded, clients = load_and_query(args, args.package)
    report = freshness.newest(
        loaded,
        packages=args.package or None,
        clients=clients,
        workspace=workspace_of(args),
        train_window=args.train_window * 60,
    )
    if args.json:
        print_json(report.to_json())
    else:
        print(report.render())
    return report.exit_code
