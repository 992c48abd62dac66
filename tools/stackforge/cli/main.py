"""The ``stackforge`` command line: each verb is a thin shell over a library function.

Verbs live in ``stackforge.cli.<module>``; each module exposes
``register(subparsers)`` which adds its parser(s) and sets ``func`` on them.
``func(args)`` returns the exit code. ``main`` builds the run's ``Workspace`` (root, caches,
credentials, CA bundle, engine) once and sets it on ``args``; verbs hand it to the library.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from stackforge import __version__
from stackforge.cli.options import WORKSPACE, make_workspace
from stackforge.errors import UserError
from stackforge.fslock import fs_error
from stackforge.signals import Interrupted, handle_signals

# Order here is the order of `stackforge --help`.
COMMAND_MODULES = [
    "stack",
    "build",
    "doctor",
    "mirror",
    "lock",
    "patches",
    "publish",
    "bake",
    "nightly",
    "newest",
    "bump",
    "wheel",
    "audit",
    "recipe",
    "smoke",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stackforge",
        description="Render, build, gate and publish vLLM images for MUSA release trains.",
    )
    parser.add_argument("--root", default=None, help="repository root (default: found from the current directory)")
    parser.add_argument("--version", action="version", version=f"stackforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"stackforge.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setattr(args, WORKSPACE, make_workspace(args))
    try:
        with handle_signals():
            return int(args.func(args) or 0)
    except Interrupted as intr:
        print(intr.render(), file=sys.stderr)
        return intr.exit_code
    except UserError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    except OSError as exc:
        # A path given on the command line (--out, --to, --from …) that cannot be used: one line, no traceback.
        problem = fs_error(exc) or UserError(
            f"cannot use {exc.filename or 'a path'}: {exc.strerror or exc}",
            fix="check the path: its parent directory must exist and be writable",
        )
        print(problem.render(), file=sys.stderr)
        return problem.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
