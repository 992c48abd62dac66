"""`stackforge drift STACK`: the stack against its upstreams' own files at a newer revision (exit 0 none, 1 drifted,
2 bad input)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, print_json, workspace_of

if TYPE_CHECKING:
    from stackforge.freshness import drift as driftmod
else:
    driftmod = lazy("stackforge.freshness.drift")


def register(sub) -> None:
    p = sub.add_parser(
        "drift",
        help="what an upstream's own pins moved to since the stack's pinned commit (exit 1 when something drifted)",
        description="Compare the files each upstream declares under `agree:` (requirement files, KEY=VALUE files "
        "such as third_party/PINS) at the stack's pinned commit with the same files at a newer ref: exact pins that "
        "moved, pins added or removed, new constraints (e.g. huggingface_hub<2.0) and the values of the compared "
        "keys (the vLLM tag the plugin names), each with its file and line. The upstream is fetched first. Exit 0 "
        "when nothing drifted, 1 when something did, 2 on bad input.",
    )
    p.add_argument("stack")
    p.add_argument("--upstream", metavar="NAME", help="only this upstream (default: every one that declares agree:)")
    p.add_argument(
        "--at", metavar="REF", help="a branch, tag or commit of the upstream (default: its default branch's head)"
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="fetch nothing: compare with what the host's mirror cache holds (its branches as last fetched)",
    )
    add_json(p, "the drift per upstream: rows, the compared keys at the ref, files missing there")
    add_set(p)
    p.set_defaults(func=cmd_drift)


def cmd_drift(args) -> int:
    loaded = load(args, args.stack)
    report = driftmod.drift(
        loaded, upstream=args.upstream, at=args.at, workspace=workspace_of(args), fetch=not args.offline
    )
    if args.json:
        print_json(report.to_json())
    else:
        print(report.render(), end="")
    return report.exit_code
