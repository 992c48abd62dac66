"""Checks across the keys that reach into other upstreams' trees and into the installed environment.

``kernels.<k>.trees``, ``upstreams.<u>.patches_from``, ``post_install``, ``steps`` and
``rules.requires`` name upstreams and packages declared elsewhere in the stack; each problem is a
UserError naming the key and its file:line. Pure: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from packaging.utils import canonicalize_name

from stackforge.errors import UserError
from stackforge.stack.model import Stack
from stackforge.stack.yamlsrc import Pos

PosFor = Callable[[tuple], Pos]


def _error(pos_for: PosFor, path: tuple, message: str, fix: str) -> UserError:
    return UserError(f"{'.'.join(map(str, path))}: {message}", **pos_for(path).as_error_kwargs(), fix=fix)


def _unknown(pos_for: PosFor, path: tuple, name: str, pool, what: str) -> UserError | None:
    if name in pool:
        return None
    known = ", ".join(pool) or "none"
    return _error(pos_for, path, f"unknown {what} '{name}'", f"name one of the stack's {what}s ({known})")


def _build_requires(stack: Stack, kname: str, names: list[str], pos_for: PosFor) -> list[UserError]:
    """Each name a package of the stack, once: the kernel's build environment holds exactly those pins."""
    pins = {canonicalize_name(p): p for p in stack.packages}
    out, seen = [], set()
    for i, name in enumerate(names):
        at: tuple = ("kernels", kname, "build_requires", i)
        key = canonicalize_name(name)
        if key not in pins:
            known = ", ".join(stack.packages) or "none"
            out.append(
                _error(
                    pos_for,
                    at,
                    f"'{name}' is not a package of the stack: the build environment installs only the stack's pins",
                    f"pin it under packages:, or name one of them ({known})",
                )
            )
        elif key in seen:
            out.append(_error(pos_for, at, f"'{name}' is listed twice", "list each package once"))
        seen.add(key)
    return out


def problems(stack: Stack, pos_for: PosFor) -> list[UserError]:
    out: list[UserError | None] = []
    for kname, kern in stack.kernels.items():
        for other in kern.trees:
            at: tuple = ("kernels", kname, "trees", other)
            out.append(_unknown(pos_for, at, other, stack.upstreams, "upstream"))
            if other == kern.upstream:
                out.append(
                    _error(
                        pos_for, at, f"'{other}' is this kernel's own tree", "list only other upstreams under trees:"
                    )
                )
        out += _build_requires(stack, kname, kern.build_requires or [], pos_for)
        paths = sorted(kern.trees.values())
        for a, b in itertools.pairwise(paths):
            if b == a or b.startswith(a + "/"):
                out.append(
                    _error(
                        pos_for,
                        ("kernels", kname, "trees"),
                        f"'{b}' overlaps '{a}'",
                        "give each tree its own directory",
                    )
                )
    for uname, up in stack.upstreams.items():
        src = up.patches_from
        if src is None:
            continue
        where: tuple = ("upstreams", uname, "patches_from")
        out.append(_unknown(pos_for, (*where, "upstream"), src.upstream, stack.upstreams, "upstream"))
        if src.upstream == uname:
            out.append(
                _error(
                    pos_for,
                    (*where, "upstream"),
                    "an upstream cannot carry its own series",
                    "name the upstream whose tree holds the series",
                )
            )
    if not any(out) and export_cycle(stack):
        cycle = export_cycle(stack)
        out.append(
            _error(
                pos_for,
                ("upstreams", cycle[0], "patches_from"),
                f"series depend on each other: {' -> '.join(cycle)}",
                "break the cycle",
            )
        )
    seen: set[str] = set()
    for i, entry in enumerate(stack.post_install):
        where = ("post_install", i)
        if (entry.below is None) == (entry.when is None):
            out.append(
                _error(
                    pos_for, where, "declare exactly one of 'below' or 'when'", 'e.g. below: "0.2.6" or when: "<0.2.6"'
                )
            )
        out.append(_unknown(pos_for, (*where, "dist"), entry.dist, stack.packages, "package"))
        if entry.dist in seen:
            out.append(
                _error(
                    pos_for, (*where, "dist"), f"'{entry.dist}' is patched twice", "combine the patches into one file"
                )
            )
        seen.add(entry.dist)
    for i, rule in enumerate(stack.rules.requires):
        if (rule.dist is None) == (rule.command is None):
            out.append(
                _error(
                    pos_for,
                    ("rules", "requires", i),
                    "declare exactly one of 'dist' or 'command'",
                    "dist: reads the installed distribution's version; command: runs a command",
                )
            )
    return [p for p in out if p is not None]


def export_cycle(stack: Stack) -> list[str]:
    """A chain of ``patches_from`` that returns to its start ([] when there is none)."""
    for start in stack.upstreams:
        chain, name = [start], start
        while (src := stack.upstreams[name].patches_from) is not None and src.upstream in stack.upstreams:
            name = src.upstream
            if name in chain:
                return [*chain[chain.index(name) :], name]
            chain.append(name)
    return []


def export_order(stack: Stack) -> list[str]:
    """Upstreams in an order where a series carrier is exported (and patched) before the tree it patches."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        src = stack.upstreams[name].patches_from
        if src is not None:
            visit(src.upstream)
        done.append(name)

    for name in stack.upstreams:
        visit(name)
    return done


def expected(stack: Stack, index: int) -> str:
    """``applied`` or ``skipped``: whether post_install[index] matches the stack's pin of its dist."""
    from packaging.specifiers import SpecifierSet

    entry = stack.post_install[index]
    version = stack.packages[entry.dist].version
    return "applied" if SpecifierSet(entry.specifier).contains(version, prereleases=True) else "skipped"
