"""`stackforge lock`: write the hash lock files the build installs from."""
from __future__ import annotations

from ..lock import write_locks
from ..stack import stack_root
from .common import add_set, load


def register(sub) -> None:
    p = sub.add_parser("lock", help="write stacks/locks/<stack>/<index>.txt with hashes (pip-tools for public indexes)")
    p.add_argument("stack")
    p.add_argument("--index", action="append", help="lock only this index (repeatable)")
    p.add_argument("--ca-bundle", help="CA bundle for reaching the indexes")
    add_set(p)
    p.set_defaults(func=cmd_lock)


def cmd_lock(args) -> int:
    stack = load(args, args.stack)
    for path in write_locks(stack, args.index, args.ca_bundle):
        print(path.relative_to(stack_root(stack)))
    return 0
