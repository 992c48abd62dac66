"""`stackforge lock`: write the hash lock files the build installs from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, print_json, workspace_of

if TYPE_CHECKING:
    from stackforge.build.locks import write_locks
else:
    write_locks = lazy("stackforge.build.locks", "write_locks")


def register(sub) -> None:
    p = sub.add_parser(
        "lock",
        help="write stacks/locks/<stack>/<index>.txt (and <vendor>.deps.txt) with hashes, resolved "
        "by pip for the stack's platform.python and platform",
    )
    p.add_argument("stack")
    p.add_argument("--index", action="append", help="lock only this index (repeatable)")
    p.add_argument("--ca-bundle", help="CA bundle for reaching the indexes")
    add_json(p, "the lock files written")
    add_set(p)
    p.set_defaults(func=cmd_lock)


def cmd_lock(args) -> int:
    loaded = load(args, args.stack)
    paths = write_locks(loaded, args.index, workspace_of(args))
    written = [str(path.relative_to(loaded.root)) for path in paths]
    if args.json:
        print_json({"stack": loaded.name, "written": written})
    else:
        for path in written:
            print(path)
    return 0
