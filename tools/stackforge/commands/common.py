"""Arguments shared by every verb that reads a stack."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..model import Stack
from ..stack import find_root, load_stack


def add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
        help="override a stack value, e.g. --set base.image=stackforge/base:bookworm (repeatable)",
    )


def root_of(args) -> Path:
    return Path(args.root).resolve() if getattr(args, "root", None) else find_root()


def load(args, name: str) -> Stack:
    return load_stack(name, root=root_of(args), overrides=getattr(args, "overrides", []))
