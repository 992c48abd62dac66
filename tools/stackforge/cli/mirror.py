"""`stackforge mirror STACK --to DIR`: everything a build of the stack needs, for a host with no network."""

from __future__ import annotations

import sys
from pathlib import Path

from stackforge.cli.options import add_json, add_refresh, add_set, build_input, print_json, workspace_of


def register(sub) -> None:
    p = sub.add_parser(
        "mirror",
        help="copy everything a build of a stack needs into a directory (for `build --offline --mirror DIR`)",
        description="Git repositories of the pinned commits, sdists, every wheel of every pip phase and lock as a "
        "PEP 503 tree per index, the apt packages of the system layers (a local repository), the kernels' toolchain "
        "stages and the base image (image archives), with mirror.json (each part's source, sha256 and size). "
        "Running it again into the same directory adds only what is missing.",
    )
    p.add_argument("stack")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="the mirror directory (created if missing)")
    p.add_argument(
        "--network",
        help="network of the containers and builds the mirror runs for apt layers and toolchain stages "
        "(e.g. host, to reach endpoints on the host's loopback)",
    )
    p.add_argument("--ca-bundle", default="auto", help="extra CA bundle for the downloads (default: as `build`)")
    add_json(p, "the summary (directory, manifest sha256, parts added and kept)")
    add_refresh(p)
    add_set(p)
    p.set_defaults(func=cmd_mirror)


def cmd_mirror(args) -> int:
    from stackforge.flows.mirror import make_mirror

    loaded = build_input(args, args.stack)
    summary = make_mirror(loaded, args.to, workspace_of(args), network=args.network)
    if args.json:
        print_json(summary)
        return 0
    print(
        f"mirror of {summary['stack']} in {summary['directory']}: {summary['parts']} part(s), "
        f"{len(summary['added'])} added, {summary['kept']} kept; manifest {summary['manifest']}",
        file=sys.stderr,
    )
    print(summary["directory"])
    return 0
