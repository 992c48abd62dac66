"""`stackforge history --out DIR`: a static site of the nightly's history (index of nights, a page per image)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, print_json, root_of

if TYPE_CHECKING:
    from stackforge.flows import history as historymod
else:
    historymod = lazy("stackforge.flows.history")


def register(sub) -> None:
    p = sub.add_parser(
        "history",
        help="write a static site of the nights: each night's images, and per image its packages and changes",
        description="Read every NIGHTS/*/summary.json (the directories `stackforge nightly --out` writes; keep them "
        "outside the work tree in CI) and write DIR/index.html — the nights newest first, each image's status, tag, "
        "digest (same image as an earlier night), size, duration, gate and smoke — and DIR/images/*.html, a page per "
        "image with its installed Python distributions and Debian packages and what changed since its previous "
        "night. Plain HTML, no script, no network asset. DIR is replaced whole.",
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="where the site goes")
    p.add_argument(
        "--nights",
        type=Path,
        metavar="DIR",
        help="the directory holding one directory per night (default: build/nightly of the repository)",
    )
    add_json(p, "the index page's path and the nights read")
    p.set_defaults(func=cmd_history)


def cmd_history(args) -> int:
    nights_dir = args.nights if args.nights is not None else root_of(args) / "build" / "nightly"
    index, nights = historymod.history(nights_dir, args.out)
    if args.json:
        print_json({"index": str(index), "nights": [{"date": n.date, "images": len(n.images)} for n in nights]})
    else:
        print(index)
    return 0
