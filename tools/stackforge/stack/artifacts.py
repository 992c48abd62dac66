"""Checks across the keys of optional build outputs: kernel toolchains, kernel files and option-selected probes.

Each problem is a UserError naming the key and its file:line. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from stackforge.errors import UserError
from stackforge.stack.model import Stack
from stackforge.stack.yamlsrc import Pos

PosFor = Callable[[tuple], Pos]


def _error(pos_for: PosFor, path: tuple, message: str, fix: str) -> UserError:
    return UserError(f"{'.'.join(map(str, path))}: {message}", **pos_for(path).as_error_kwargs(), fix=fix)


def writes_wheels(stack: Stack, kernel: str) -> bool:
    """Whether a kernel step's wheels are installed: its ``wheels`` value, else true unless it declares files."""
    k = stack.kernels[kernel]
    return k.wheels if k.wheels is not None else not k.files


def problems(stack: Stack, pos_for: PosFor) -> list[UserError]:
    out: list[UserError] = []
    for i, probe in enumerate(stack.gate.probes):
        for option, want in probe.when.items():
            at: tuple = ("gate", "probes", i, "when", option)
            if option not in stack.options:
                known = ", ".join(stack.options) or "none"
                out.append(
                    _error(
                        pos_for,
                        at,
                        f"unknown build option '{option}'",
                        f"declare it under options: (declared: {known})",
                    )
                )
            elif want not in stack.options[option].choices:
                choices = stack.options[option].choices
                out.append(
                    _error(
                        pos_for,
                        at,
                        f"{want!r} is not one of the option's choices {choices}",
                        f"use one of {', '.join(choices)}",
                    )
                )
    installed_at: dict[str, str] = {}
    for name, kern in stack.kernels.items():
        if not writes_wheels(stack, name) and not kern.files:
            out.append(
                _error(
                    pos_for,
                    ("kernels", name, "wheels"),
                    "the step installs nothing (wheels: false, no files)",
                    "declare files: or drop wheels: false",
                )
            )
        for source, dest in kern.files.items():
            if dest in installed_at:
                out.append(
                    _error(
                        pos_for,
                        ("kernels", name, "files", source),
                        f"{dest} is also installed by {installed_at[dest]}",
                        "give each file its own destination",
                    )
                )
            installed_at.setdefault(dest, f"kernels.{name}.files.{source}")
    return out
