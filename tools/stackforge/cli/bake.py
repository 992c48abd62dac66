"""`stackforge bake`: one `docker buildx bake` plan for a matrix of stacks × targets."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import (
    NO_CACHE_HELP,
    add_json,
    add_out,
    add_refresh,
    add_registry_cache,
    add_set,
    load,
    print_json,
    registry_cache_of,
    root_of,
    select,
    workspace_of,
)
from stackforge.errors import UserError
from stackforge.stack.names import list_stacks

if TYPE_CHECKING:
    from stackforge.builder.run import bake as bakemod
else:
    bakemod = lazy("stackforge.builder.run.bake")


def register(sub) -> None:
    p = sub.add_parser(
        "bake",
        help="build stacks × targets in one `docker buildx bake` (shared stages built once)",
        description="Prepare each stack's context and Dockerfile as `stackforge build` does and build every "
        "(stack, target) in one `docker buildx bake` run, so stages several stacks share are built "
        "once. Any buildx builder works (--builder), e.g. a remote or Kubernetes BuildKit. "
        "The per-stack gate verdicts and evidence come from `stackforge build` / `stackforge nightly`. "
        "BuildKit's log goes to stderr (and to bake.log); stdout carries only the result.",
    )
    p.add_argument("stacks", nargs="*", help="default: every stack with `nightly: true`")
    p.add_argument(
        "--target",
        action="append",
        dest="targets",
        metavar="T",
        help="only these targets (repeatable; default: every target of each stack)",
    )
    p.add_argument("--print", action="store_true", help="print the bake JSON plan; fetch nothing, build nothing")
    p.add_argument("--builder", help="buildx builder (docker, docker-container, remote, kubernetes drivers)")
    p.add_argument("--no-load", dest="load", action="store_false", help="build without loading images into the engine")
    p.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
    add_registry_cache(p)
    p.add_argument("--ca-bundle", default="auto", help="extra CA bundle, as for `stackforge build`")
    add_out(p, "the directory bake.json and bake.log are written to (default: build/bake)")
    add_json(p, "the result (ok, exit code, targets, duration, plan and log files); with --print, the plan")
    add_refresh(p)
    add_set(p)
    p.set_defaults(func=cmd_bake)


def _stacks(args):
    root = root_of(args)
    names = args.stacks
    if not names:
        select(args, list_stacks(root))
        names = [n for n in list_stacks(root) if load(args, n).model.nightly]
        if not names:
            raise UserError("no stack has `nightly: true`", fix="name the stacks: stackforge bake STACK…")
    select(args, names)
    return root, [load(args, n) for n in names]


def cmd_bake(args) -> int:
    cache = registry_cache_of(args)  # a bad reference fails before anything runs
    root, stacks = _stacks(args)
    if args.print:
        items = bakemod.prepare(stacks, targets=args.targets, sources=False, workspace=workspace_of(args))
        print(json.dumps(bakemod.plan(bakemod.portable(items, root), load=args.load, cache=cache), indent=2))
        return 0
    workdir = args.out or root / "build" / "bake"
    items, run = bakemod.bake(
        stacks,
        workspace=workspace_of(args),
        targets=args.targets,
        load=args.load,
        no_cache=args.no_cache,
        workdir=workdir,
        on_line=lambda line: print(line, file=sys.stderr, flush=True),
        cache=cache,
    )
    ok = run.returncode == 0
    if args.json:
        print_json(
            {
                "ok": ok,
                "returncode": run.returncode,
                "targets": [{"name": i.name, "stack": i.stack, "target": i.target, "ref": i.ref} for i in items],
                "duration_s": run.duration_s,
                "plan": workdir / "bake.json",
                "log": run.log_file,
            }
        )
        return 0 if ok else 1
    status = "ok" if ok else f"FAILED (exit {run.returncode})"
    print(
        f"bake {status}: {len(items)} target(s) in {run.duration_s} s; plan {workdir / 'bake.json'}, "
        f"log {run.log_file}",
        file=sys.stderr,
    )
    return 0 if run.returncode == 0 else 1
