"""`stackforge audit STACK`: tracked files that still name versions the stack moved away from."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, print_json, select

if TYPE_CHECKING:
    from stackforge.freshness import audit as freshness
else:
    freshness = lazy("stackforge.freshness.audit")

ALLOW_FILE = "stacks/audit-allow.txt"  # freshness.audit.ALLOW_FILE, here so that --help imports no library


def register(sub) -> None:
    p = sub.add_parser(
        "audit",
        help="list file:line references to versions the stack moved away from (exit 1 if any is not allowed)",
        description="Compare STACK with its parent (or --against OLD), collect the versions, upstream tags and "
        "commits it moved away from, and scan every tracked text file (git ls-files) for them. References "
        f"allowed by {ALLOW_FILE} (lines of 'GLOB [STALE-STRING]') and the old stack's own files "
        "are not findings.",
    )
    p.add_argument("stack")
    p.add_argument("--against", metavar="OLD", help="compare with this stack instead of the parent")
    p.add_argument("--allow", metavar="FILE", help=f"allow-list file (default {ALLOW_FILE})")
    p.add_argument("--show-allowed", action="store_true", help="also list the allowed references")
    add_json(p, "the findings and allowed references")
    add_set(p)
    p.set_defaults(func=cmd_audit)


def cmd_audit(args) -> int:
    select(args, [args.stack] + ([args.against] if args.against else []))
    loaded = load(args, args.stack)
    against = load(args, args.against) if args.against else None
    report = freshness.audit(loaded, against, allow_file=Path(args.allow).resolve() if args.allow else None)
    if args.json:
        print_json(report.to_json())
    else:
        print(report.render(show_allowed=args.show_allowed))
    return report.exit_code
