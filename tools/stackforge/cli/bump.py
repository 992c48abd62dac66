"""`stackforge bump STACK --name NEW`: write a stack that moves the train to its newest coherent release."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.newest import add_index_options, load_and_query
from stackforge.cli.options import add_json, add_set, overrides_for, print_json, root_of, select, workspace_of

if TYPE_CHECKING:
    from stackforge.freshness import bump as freshness
    from stackforge.freshness.lines import load_catalog
    from stackforge.stack import diff as diffmod
    from stackforge.stack.load import load_stack
else:
    freshness = lazy("stackforge.freshness.bump")
    load_catalog = lazy("stackforge.freshness.lines", "load_catalog")
    diffmod = lazy("stackforge.stack.diff")
    load_stack = lazy("stackforge.stack.load", "load_stack")


def register(sub) -> None:
    p = sub.add_parser(
        "bump",
        help="write stacks/NEW.yaml moving a release train (and what is built for it) to its newest release",
        description="Query the indexes, move each train (rules.trains) as a unit to its newest coherent release, "
        "move built-for packages (rules.built_for) and declared minimums with it, write stacks/NEW.yaml "
        "inheriting STACK, lint it and print the pin table. Exit 1 without writing when a build is missing.",
    )
    p.add_argument("stack")
    p.add_argument("--name", required=True, help="name of the new stack (stacks/NAME.yaml)")
    p.add_argument("--train", action="append", default=[], metavar="NAME", help="move only this train (repeatable)")
    p.add_argument("--description", help="description of the new stack (default: the old one with versions moved)")
    p.add_argument("--dry-run", action="store_true", help="print the new stack file instead of writing it")
    p.add_argument("--force", action="store_true", help="overwrite an existing stacks/NAME.yaml")
    add_index_options(p)
    add_json(p, "the moves, notes, problems, the file written (or with --dry-run its text) and the pin diff")
    add_set(p)
    p.set_defaults(func=cmd_bump)


def cmd_bump(args) -> int:
    select(args, [args.stack, args.name])
    loaded, clients = load_and_query(args)
    stack = loaded.model
    names = list(stack.packages)
    catalog, _ = load_catalog(loaded, names, clients=clients, workspace=workspace_of(args))
    plan = freshness.plan_bump(stack, catalog, new_name=args.name, trains=args.train or None)
    if args.json:
        return _bump_json(args, loaded, plan)
    for mv in plan.moves:
        print(f"move {mv.package}: {mv.before} -> {mv.after} ({mv.reason})")
    for note in plan.notes:
        print(f"note: {note}")
    if plan.problems:
        for prob in plan.problems:
            print(f"missing: {prob}", file=sys.stderr)
        print(f"nothing written: stacks/{args.name}.yaml would not be a coherent stack", file=sys.stderr)
        return 1
    if not plan.moves:
        print("nothing to move; no file written")
        return 0
    if args.dry_run:
        print(freshness.render_bump(stack, plan, args.description), end="")
        return 0
    path = freshness.write_bump(loaded, plan, force=args.force, description=args.description)
    print(f"wrote {path.relative_to(root_of(args))} (lint: ok)")
    print()
    new = load_stack(args.name, root=root_of(args), overrides=overrides_for(args, args.name))
    print(diffmod.to_markdown(diffmod.diff_stacks(stack, new)), end="")
    return 0


def _bump_json(args, loaded, plan) -> int:
    stack = loaded.model
    result: dict = {
        "stack": stack.name,
        "name": args.name,
        "moves": [vars(mv) for mv in plan.moves],
        "notes": list(plan.notes),
        "problems": list(plan.problems),
        "written": None,
    }
    if plan.problems:
        print(f"nothing written: stacks/{args.name}.yaml would not be a coherent stack", file=sys.stderr)
    elif plan.moves and args.dry_run:
        result["text"] = freshness.render_bump(stack, plan, args.description)
    elif plan.moves:
        path = freshness.write_bump(loaded, plan, force=args.force, description=args.description)
        result["written"] = str(path.relative_to(root_of(args)))
        new = load_stack(args.name, root=root_of(args), overrides=overrides_for(args, args.name))
        result["diff"] = json.loads(diffmod.diff_stacks(stack, new).to_json())
    print_json(result)
    return 1 if plan.problems else 0
