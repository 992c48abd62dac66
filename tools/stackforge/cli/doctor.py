"""`stackforge doctor [STACK…]`: can this host build these stacks? (exit 0 yes, 1 no, 2 bad input)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, print_json, workspace_of

if TYPE_CHECKING:
    from stackforge.flows import doctor
else:
    doctor = lazy("stackforge.flows.doctor")

DEFAULT_TIMEOUT = 10.0  # build.doctor.DEFAULT_TIMEOUT, here so that --help imports no library


def register(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the engine and every endpoint the stacks need (base image, git, indexes, apt), at once",
        description="Every check runs concurrently with a timeout. A failed endpoint names the --set key that "
        "redirects it, in the CLI's and in make's spelling. Credentials are used, never printed. "
        "Exit 0 when everything answers, 1 when something does not, 2 on bad input.",
    )
    p.add_argument(
        "stacks",
        nargs="*",
        metavar="STACK",
        help="stacks to check (none: the engine, and with --registry that registry)",
    )
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT]/PATH",
        help="also check that each stack's image can be pushed there: the registry answers and takes the "
        "credentials (an upload started and cancelled; nothing is stored); without a STACK, a push to the "
        "repository HOST[:PORT]/PATH itself",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="per check (default %(default)g)",
    )
    p.add_argument("--builder", help="buildx builder to check (default: the current one)")
    p.add_argument(
        "--no-engine",
        dest="engine",
        action="store_false",
        help="check the endpoints only (a host without the engine yet); base images are asked of their registry",
    )
    add_json(p, "one object per check: stack, check, endpoint, status, detail, key, set, make")
    add_set(p)
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    stacks = [load(args, name) for name in args.stacks]
    rows = doctor.diagnose(stacks, workspace_of(args), timeout=args.timeout, engine=args.engine, registry=args.registry)
    if args.json:
        print_json([r.to_json() for r in rows])
    else:
        print(doctor.render_table(rows))
    return doctor.exit_code(rows)
