"""The ``stackforge`` command line: each verb is a thin shell over a library function.

Verbs live in ``stackforge.cli.<module>``; each module exposes
``register(subparsers)`` which adds its parser(s) and sets ``func`` on them.
``func(args)`` returns the exit code. ``main`` builds the run's ``Workspace`` (root, caches,
credentials, CA bundle, engine) once and sets it on ``args``; verbs hand it to the library.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys

from stackforge import __version__
from stackforge.cli.options import WORKSPACE, make_workspace
from stackforge.errors import UserError, for_terminal
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
    "history",
    "newest",
    "drift",
    "bump",
    "wheel",
    "audit",
    "recipe",
    "smoke",
    "trust",
    "test",
]

# The module that registers each verb, so that a run naming its verb builds that verb's parser only
# (tests/unit/test_cli_startup.py checks this against what the modules register).
VERB_MODULES = {
    **dict.fromkeys(("list", "show", "lint", "tags", "diff", "schema"), "stack"),
    **dict.fromkeys(("render", "build", "gate", "verify", "abi"), "build"),
    **dict.fromkeys(("publish", "pull", "copy"), "publish"),
    **dict.fromkeys(("sbom", "scan"), "trust"),
    **{name: name for name in COMMAND_MODULES if name not in ("stack", "build", "publish", "trust")},
}


#: verbs that read stacks and print: they end with the collector paused by the process's start (``__main__.py``);
#: every other verb sets it going again before its work
QUICK_VERBS = frozenset(("list", "show", "lint", "tags", "diff", "schema"))


def _named_verb(argv: list[str]) -> str | None:
    """The verb ``argv`` names when it is ``[--root ROOT | --root=ROOT] VERB ...``; anything else (help,
    --version, an unknown or abbreviated word) is parsed by the whole parser."""
    rest = argv[2:] if argv[:1] == ["--root"] else argv[1:] if argv[:1] and argv[0].startswith("--root=") else argv
    return rest[0] if rest and rest[0] in VERB_MODULES else None


class _Version(argparse.Action):
    """``--version``: the version and the commit, asked only when the flag is given (an editable install asks git)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from stackforge import buildinfo
        from stackforge.clients.git import checkout_commit

        commit = buildinfo.recorded()
        if commit is None:  # an editable install: its checkout says
            commit = checkout_commit(buildinfo.CHECKOUT, buildinfo.BUILD_PATHS)
        print(buildinfo.describe(__version__, commit))
        parser.exit()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every verb; with ``argv`` naming a verb, the parser of that verb only (the same
    parse for that ``argv``, without importing the other verbs' modules)."""
    parser = argparse.ArgumentParser(
        prog="stackforge",
        description="Render, build, gate and publish vLLM images for MUSA release trains.",
    )
    parser.add_argument("--root", default=None, help="repository root (default: found from the current directory)")
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        dest=argparse.SUPPRESS,  # as argparse's own version action: no attribute on the parsed arguments
        default=argparse.SUPPRESS,
        help="print the version and the commit it was built from, and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    verb = _named_verb(argv) if argv is not None else None
    for name in [VERB_MODULES[verb]] if verb else COMMAND_MODULES:
        importlib.import_module(f"stackforge.cli.{name}").register(sub)
    return parser


#: pydantic's documented switch for its plugins. stackforge's models use none, and pydantic finds them by reading
#: the entry points of every installed distribution when it builds its first validator (5 ms with 69
#: distributions, more in a larger environment). A value the user set is kept.
NO_PYDANTIC_PLUGINS = ("PYDANTIC_DISABLE_PLUGINS", "__all__")


def _keep_schema() -> None:
    """A command that succeeded keeps the stack model's schema it built, if it built one (stack/schemacache.py;
    looked up, not imported: a command that loaded no stack has nothing to keep)."""
    schemacache = sys.modules.get("stackforge.stack.schemacache")
    if schemacache is not None:
        schemacache.keep()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault(*NO_PYDANTIC_PLUGINS)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not gc.isenabled() and args.command not in QUICK_VERBS:
        gc.freeze()  # what start-up made lives as long as the process: the collector's passes skip it
        gc.enable()
    setattr(args, WORKSPACE, make_workspace(args))
    try:
        with handle_signals():
            code = int(args.func(args) or 0)
        if code == 0:
            _keep_schema()
        return code
    except Interrupted as intr:
        print(for_terminal(intr.render()), file=sys.stderr)
        return intr.exit_code
    except UserError as err:  # a message may quote what a file, a registry or a container said
        print(for_terminal(err.render()), file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    except OSError as exc:
        from stackforge.fslock import fs_error

        # A path given on the command line (--out, --to, --from …) that cannot be used: one line, no traceback.
        problem = fs_error(exc) or UserError(
            f"cannot use {exc.filename or 'a path'}: {exc.strerror or exc}",
            fix="check the path: its parent directory must exist and be writable",
        )
        print(for_terminal(problem.render()), file=sys.stderr)
        return problem.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
