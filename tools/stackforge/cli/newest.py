"""`stackforge newest STACK`: is every pin the newest in its line? (exit 0 yes, 1 no, 2 error)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, overrides_for, print_json, root_of, workspace_of

if TYPE_CHECKING:
    from stackforge.freshness import lines, prefetch
    from stackforge.freshness import newest as freshness
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


def cmd_newest(args) -> int:
    # The index queries start from the stack file while the stack model is imported and validated.
    early = prefetch.start(
        root_of(args), args.stack, overrides_for(args, args.stack), packages=args.package, cache_dir=cache_dir(args)
    )
    loaded = load(args, args.stack, read=early.document)
    report = freshness.newest(
        loaded,
        packages=args.package or None,
        clients=lines.clients_for(loaded, cache_dir(args), workspace=workspace_of(args), reuse=early.clients),
        workspace=workspace_of(args),
        train_window=args.train_window * 60,
    )
    if args.json:
        print_json(report.to_json())
    else:
        print(report.render())
    return report.exit_code
