"""Arguments shared by every verb that reads a stack."""
from __future__ import annotations

import argparse
from pathlib import Path

from stackforge.errors import UserError
from stackforge.stack.load import STACKS_DIR, find_root, load_stack
from stackforge.stack.model import Stack


def add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
        help="override a stack value, e.g. --set base.image=stackforge/base:bookworm (repeatable)",
    )


def root_of(args) -> Path:
    """The repository root: ``--root DIR`` (which must hold stacks/) or the one found upwards from here."""
    given = getattr(args, "root", None)
    if not given:
        return find_root()
    root = Path(given).resolve()
    if not root.is_dir():
        raise UserError(f"no such directory: {given}", file="--root",
                        fix="pass the stackforge repository's directory (the one holding stacks/)")
    if not (root / STACKS_DIR).is_dir():
        raise UserError(f"{root} has no {STACKS_DIR}/ directory", file="--root",
                        fix="pass the stackforge repository's directory (the one holding stacks/)")
    return root


def load(args, name: str) -> Stack:
    return load_stack(name, root=root_of(args), overrides=getattr(args, "overrides", []))
