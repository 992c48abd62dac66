"""`stackforge lock`: write the hash lock files the build installs from; `--check`: are they current?"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_platform, add_set, load, print_json, workspace_of
from stackforge.errors import UserError

if TYPE_CHECKING:
    from stackforge.builder.locks.locks import check_stack, write_locks
else:
    write_locks = lazy("stackforge.builder.locks.locks", "write_locks")
    check_stack = lazy("stackforge.builder.locks.locks", "check_stack")


def register(sub) -> None:
    p = sub.add_parser(
        "lock",
        help="write stacks/locks/<stack>/<index>.txt (and <vendor>.deps.txt) with hashes, resolved "
        "by uv for the stack's platform.python and platform; --check: exit 1 when a checked-in lock is stale",
    )
    p.add_argument("stack", nargs="+", help="the stack (with --check: one or more)")
    p.add_argument("--index", action="append", help="lock (or check) only this index (repeatable)")
    p.add_argument("--ca-bundle", help="CA bundle for reaching the indexes")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit 0 when every checked-in lock of each stack is current for the stack's pins, "
        "target and requirement files, 1 naming each stale lock and what moved (offline: the requirement "
        "files are checked by name unless --sources)",
    )
    p.add_argument(
        "--sources",
        action="store_true",
        help="with --check: also export and patch the upstreams (cache or remote) and compare each requirement "
        "file's digest with the lock's header",
    )
    add_platform(p, "lock (stacks/locks/<stack>@<line>/ for a line that is not the stack's own)")
    add_json(p, "the lock files written (with --check: the locks checked and the stale ones)")
    add_set(p)
    p.set_defaults(func=cmd_lock)


def cmd_lock(args) -> int:
    if args.sources and not args.check:
        raise UserError(
            "--sources applies to `stackforge lock --check` only",
            file="--sources",
            fix="add --check, or drop --sources",
        )
    if args.check:
        return _check(args)
    if len(args.stack) > 1:
        raise UserError(
            f"`stackforge lock` writes the locks of one stack; given {len(args.stack)}",
            file=" ".join(args.stack),
            fix="lock one stack at a time, or add --check to check several",
        )
    loaded = load(args, args.stack[0])
    paths = write_locks(loaded, args.index, workspace_of(args))
    written = [str(path.relative_to(loaded.root)) for path in paths]
    if args.json:
        print_json({"stack": loaded.name, "written": written})
    else:
        for path in written:
            print(path)
    return 0


def _check(args) -> int:
    loaded_all = [load(args, name) for name in args.stack]  # every stack loads (bad input: exit 2) before any check
    for loaded in loaded_all:
        for index in args.index or []:
            if index not in loaded.model.indexes:
                raise UserError(
                    f"stack '{loaded.name}' has no index '{index}'",
                    file="--index",
                    fix=f"use one of: {', '.join(loaded.model.indexes)}",
                )
    if not args.platform:  # every platform line of each stack, each with its own locks
        loaded_all = [line for loaded in loaded_all for line in loaded.platform_lines().values()]
    report = []
    failed = False
    said: set[str] = set()  # a note of a stack's index, once for all its lines
    for loaded in loaded_all:
        checked, stale, notes = check_stack(loaded, args.sources, workspace_of(args), args.index)
        failed = failed or bool(stale)
        rels = [str(p.relative_to(loaded.root)) for p in checked]
        report.append(
            {
                "stack": loaded.name,
                **({"platform": loaded.line.name} if loaded.line and not loaded.line.own else {}),
                "checked": rels,
                "stale": [{"file": s.rel, "line": s.line, "message": s.message} for s in stale],
            }
        )
        if args.json:
            continue
        for note in notes:
            if note not in said:
                print(note, file=sys.stderr)
            said.add(note)
        for s in stale:
            print(s.render(loaded.name), file=sys.stderr)
        bad = {s.rel for s in stale}
        for rel in rels:
            if rel not in bad:
                print(f"current: {rel}")
        if not rels and not stale:
            folder = loaded.name + (loaded.line.suffix if loaded.line else "")
            print(f"{loaded.name}: no lock files (stacks/locks/{folder}/)")
    if args.json:
        print_json(report if len(report) > 1 else report[0])
    return 1 if failed else 0
