"""``stackforge sbom IMAGE`` and ``stackforge scan IMAGE --osv DIR``: what an image holds, and what is known
to be vulnerable in it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge import safeio
from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_osv_max_age, print_json, workspace_of
from stackforge.errors import UserError

if TYPE_CHECKING:
    from stackforge.builder.records import vulns, waivers
    from stackforge.flows import scan
else:
    scan = lazy("stackforge.flows.scan")
    vulns = lazy("stackforge.builder.records.vulns")
    waivers = lazy("stackforge.builder.records.waivers")


def register(sub) -> None:
    p = sub.add_parser(
        "sbom",
        help="print the image's SBOM (CycloneDX 1.5 JSON): every Python distribution (version, index, wheel "
        "sha256) and Debian package (version, source package) installed in it",
    )
    p.add_argument(
        "image",
        metavar="IMAGE",
        help="a local image, or a published REGISTRY/NAME:TAG (the SBOM stackforge publish attached to it)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write it to FILE instead of stdout")
    p.add_argument("--json", action="store_true", help="print the SBOM (always JSON; accepted for symmetry)")
    p.set_defaults(func=cmd_sbom)

    s = sub.add_parser(
        "scan",
        help="match the image's SBOM against an OSV database directory, offline (exit 1 when a finding is at or "
        "above --fail-on, 2 bad input)",
    )
    s.add_argument("image", nargs="?", metavar="IMAGE", help="a local image, or a published REGISTRY/NAME:TAG")
    s.add_argument("--sbom", type=Path, metavar="FILE", help="scan this CycloneDX SBOM file instead of an image's")
    s.add_argument(
        "--osv",
        type=Path,
        required=True,
        metavar="DIR",
        help="OSV records (PyPI, Debian, Ubuntu), one directory per export, each with its osv-snapshot.json",
    )
    s.add_argument(
        "--fail-on",
        default="high",
        metavar="SEVERITY",
        help="low, medium, high or critical (default high; a finding of unknown severity counts as high)",
    )
    add_osv_max_age(s)
    s.add_argument(
        "--waivers",
        type=Path,
        metavar="FILE",
        help="the waivers to apply (default: stacks/waivers.yaml of the repository this runs in, if any)",
    )
    add_json(s, "the findings and the verdict")
    s.set_defaults(func=cmd_scan)


def cmd_sbom(args) -> int:
    text = scan.sbom_text(workspace_of(args).engine, args.image).rstrip("\n") + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"sbom: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(safeio.for_terminal(text))
    return 0


def cmd_scan(args) -> int:
    if (args.image is None) == (args.sbom is None):
        raise UserError("name an image or give --sbom FILE (one of them)", file="IMAGE")
    max_age = vulns.parse_max_age(args.osv_max_age)
    report = scan.scan_image(
        workspace_of(args).engine if args.sbom is None else None,
        args.image,
        args.osv,
        args.fail_on,
        sbom_file=args.sbom,
        max_age=max_age,
        waivers=_waivers(args),
    )
    if args.json:
        print_json(report.to_json())
    else:
        print("\n".join(report.lines()))
    return 1 if report.blocking else 0


def _waivers(args):
    if args.waivers is not None:
        return waivers.load(args.waivers)
    try:
        root = workspace_of(args).root
    except UserError:  # not in a repository: no waivers unless named
        return None
    return waivers.load_repository(root)
