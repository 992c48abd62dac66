"""`stackforge history --out DIR`: a static site of the nightly's history (index of nights, a page per image)."""

from __future__ import annotations

import sys
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
        help="write a static site of the nights: each night's images, and per image its proof, packages and changes",
        description="Read every NIGHTS/*/summary.json (the directories `stackforge nightly --out` writes; keep them "
        "outside the work tree in CI) and write DIR/index.html — the nights newest first, grouped by month, each "
        "image's status, tag, digest (checked against the night's own publish record: \"unverified\" when it does "
        "not agree), size, duration, gate, smoke, signed or unsigned, the scan's verdict, where the aliases went, the "
        "source commit and the night's CI run — and DIR/images/*.html, a page per image with its SBOM, installed "
        "Python distributions and Debian packages and what changed since its previous night. Plain HTML, no script, "
        "no network asset. DIR is replaced whole, only when it is new, empty or a site this command wrote; it may lie "
        "under NIGHTS (e.g. NIGHTS/site), never be NIGHTS or hold it. A night or file that cannot be read is shown "
        "as such and named in an error line; the exit is then 1.",
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="where the site goes")
    p.add_argument(
        "--nights",
        type=Path,
        metavar="DIR",
        help="the directory holding one directory per night (default: build/nightly of the repository)",
    )
    p.add_argument(
        "--log-url",
        metavar="TEMPLATE",
        help="the build log of a night whose summary names no CI run: an http(s) URL where {date} and {night} "
        "(its directory) are replaced, e.g. 'https://ci.example.com/nightly/{date}/'",
    )
    p.add_argument(
        "--registry-check",
        action="store_true",
        help="also ask each row's registry which digest its tag holds (a registry that cannot be reached is noted)",
    )
    p.add_argument(
        "--key",
        type=Path,
        metavar="PUB",
        help="a PEM public key: a row is 'signed' only when its provenance is signed by it",
    )
    add_json(p, "the index page's path, the nights read and the problems found")
    p.set_defaults(func=cmd_history)


def cmd_history(args) -> int:
    nights_dir = args.nights if args.nights is not None else root_of(args) / "build" / "nightly"
    options = historymod.HistoryOptions(
        log_url=historymod.check_log_url(args.log_url), registry_check=args.registry_check, key=args.key
    )
    index, nights = historymod.history(nights_dir, args.out, options)
    found = historymod.problems(nights)
    if args.json:
        print_json(
            {
                "index": str(index),
                "nights": [
                    {
                        "date": n.date,
                        "directory": n.name,
                        "images": len(n.images),
                        "unverified": n.unverified,
                        **({"unreadable": n.error} if n.error else {}),
                    }
                    for n in nights
                ],
                "problems": [{"file": p.path, "message": p.message} for p in found],
            }
        )
    else:
        print(index)
    for problem in found:
        print(problem.line(), file=sys.stderr)
    return 1 if found else 0
