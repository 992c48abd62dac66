"""`stackforge wheel inspect|diff`: what a wheel declares and what its shared objects need."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, print_json, workspace_of

if TYPE_CHECKING:
    from stackforge.freshness import wheel as wheelmod
else:
    wheelmod = lazy("stackforge.freshness.wheel")


def register(sub) -> None:
    p = sub.add_parser("wheel", help="inspect or diff wheels: metadata, RECORD, SONAME / DT_NEEDED / RUNPATH")
    wsub = p.add_subparsers(dest="wheel_command", metavar="ACTION")
    wsub.required = True

    i = wsub.add_parser(
        "inspect",
        help="name, version, tags, Requires-Dist, RECORD and per shared object "
        "its SONAME, DT_NEEDED and RPATH/RUNPATH (read with pyelftools, nothing is run)",
    )
    i.add_argument("wheel", help="a .whl path or an http(s) URL (credentials: in the URL or ~/.netrc)")
    add_json(i, "the wheel's metadata, RECORD and shared objects")
    i.set_defaults(func=cmd_inspect)

    d = wsub.add_parser(
        "diff",
        help="files added/removed/changed (by sha256), metadata changes, and per "
        "shared object the DT_NEEDED entries gained and lost; exit 1 when they differ",
    )
    d.add_argument("a")
    d.add_argument("b")
    add_json(d, "the differences")
    d.set_defaults(func=cmd_diff)


def _cache(args) -> Path:
    return workspace_of(args).cache("wheels")


def _load(src: str, args) -> wheelmod.WheelInfo:
    path, display = wheelmod.resolve_wheel_source(src, _cache(args))
    return wheelmod.inspect_wheel(path, source=display)


def cmd_inspect(args) -> int:
    info = _load(args.wheel, args)
    if args.json:
        for w in info.warnings:
            print(f"WARNING: {w}", file=sys.stderr)
        print_json(info.to_json())
    else:
        print(wheelmod.render_inspect(info))
    return 0


def cmd_diff(args) -> int:
    a, b = _load(args.a, args), _load(args.b, args)
    d = wheelmod.diff_wheels(a, b)
    if args.json:
        print_json(d.to_json())
    else:
        print(wheelmod.render_diff(d))
    return 0 if d.is_empty else 1
