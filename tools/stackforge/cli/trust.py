"""``stackforge sbom IMAGE`` and ``stackforge scan IMAGE --osv DIR``: what an image holds, and what is known
to be vulnerable in it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, print_json, workspace_of

if TYPE_CHECKING:
    from stackforge.flows import scan
else:
    scan = lazy("stackforge.flows.scan")


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
    s.add_argument("image", metavar="IMAGE", help="a local image, or a published REGISTRY/NAME:TAG")
    s.add_argument("--osv", type=Path, required=True, metavar="DIR", help="OSV JSON records (PyPI and Debian)")
    s.add_argument(
        "--fail-on",
        default="high",
        metavar="SEVERITY",
        help="low, medium, high or critical (default high; a finding of unknown severity counts as high)",
    )
    add_json(s, "the findings and the verdict")
    s.set_defaults(func=cmd_scan)


def cmd_sbom(args) -> int:
    text = scan.sbom_text(workspace_of(args).engine, args.image).rstrip("\n") + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"sbom: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_scan(args) -> int:
    report = scan.scan_image(workspace_of(args).engine, args.image, args.osv, args.fail_on)
    if args.json:
        print_json(report.to_json())
    else:
        print("\n".join(report.lines()))
    return 1 if report.blocking else 0
