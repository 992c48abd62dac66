"""Targets that build on other targets (``from:``), intermediate targets (``publish: false``) and aliases.

Pure: the checks across keys (unknown names and cycles, each a UserError naming the key and its
file:line), the order the target stages are written in (a parent before its children), and which targets
are images to tag and publish.
"""

from __future__ import annotations

from collections.abc import Callable

from packaging.utils import canonicalize_name

from stackforge.errors import UserError
from stackforge.stack.model import Stack, requirement
from stackforge.stack.yamlsrc import Pos

PosFor = Callable[[tuple], Pos]


def _error(pos_for: PosFor, path: tuple, message: str, fix: str) -> UserError:
    return UserError(f"{'.'.join(map(str, path))}: {message}", **pos_for(path).as_error_kwargs(), fix=fix)


def cycle(stack: Stack) -> list[str]:
    """A chain of ``from:`` that returns to its start ([] when there is none)."""
    for start in stack.targets:
        chain, name = [start], start
        while (parent := stack.targets[name].from_) is not None and parent in stack.targets:
            name = parent
            if name in chain:
                return [*chain[chain.index(name) :], name]
            chain.append(name)
    return []


def order(stack: Stack) -> list[str]:
    """Target names with every parent before its children (declaration order otherwise)."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        parent = stack.targets[name].from_
        if parent is not None:
            visit(parent)
        done.append(name)

    for name in stack.targets:
        visit(name)
    return done


def published(stack: Stack) -> list[str]:
    """The targets that are images to tag and publish, in declaration order."""
    return [n for n, t in stack.targets.items() if t.published]


def vendor_names(stack: Stack) -> set[str]:
    return {
        canonicalize_name(n)
        for n, p in stack.packages.items()
        if p.index in stack.indexes and stack.indexes[p.index].role == "vendor"
    }


def problems(stack: Stack, pos_for: PosFor) -> list[UserError]:
    out: list[UserError] = []

    def unknown(path: tuple, name: str, pool, what: str) -> None:
        if name not in pool:
            known = ", ".join(pool) or "none"
            out.append(_error(pos_for, path, f"unknown {what} '{name}'", f"name one of the stack's {what}s ({known})"))

    vendor = vendor_names(stack)
    for tname, t in stack.targets.items():
        base: tuple = ("targets", tname)
        if t.from_ is not None:
            unknown((*base, "from"), t.from_, stack.targets, "target")
        for up in t.sources:
            unknown((*base, "sources", up), up, stack.upstreams, "upstream")
        for kname, k in t.kernels.items():
            unknown((*base, "kernels", kname, "upstream"), k.upstream, stack.upstreams, "upstream")
            for other in k.trees:
                unknown((*base, "kernels", kname, "trees", other), other, stack.upstreams, "upstream")
            for opt in k.when:
                unknown((*base, "kernels", kname, "when", opt), opt, stack.options, "option")
            if k.build_requires is not None:
                out.append(
                    _error(
                        pos_for,
                        (*base, "kernels", kname, "build_requires"),
                        "a target's kernel builds in its parent image's environment",
                        "remove build_requires here (it applies to the stack's kernels:)",
                    )
                )
        for pname, ph in t.pip.items():
            where = (*base, "pip", pname)
            unknown((*where, "index"), ph.index, stack.indexes, "index")
            for i, f in enumerate(ph.files):
                unknown((*where, "files", i, "upstream"), f.upstream, stack.upstreams, "upstream")
            if not ph.repin:
                continue
            for i, text in enumerate(ph.requirements):
                if canonicalize_name(requirement(text).name) not in vendor:
                    out.append(
                        _error(
                            pos_for,
                            (*where, "requirements", i),
                            f"'{text}' re-pins a package no vendor index of the stack provides",
                            "repin: true is only for vendor packages; drop it for an ordinary phase",
                        )
                    )
    if not out and (found := cycle(stack)):
        out.append(
            _error(
                pos_for,
                ("targets", found[0], "from"),
                f"targets build on each other: {' -> '.join(found)}",
                "break the cycle: a target builds on the gate or on another target",
            )
        )
    if stack.targets and not published(stack):
        out.append(_error(pos_for, ("targets",), "every target is publish: false", "publish at least one target"))
    return out


def repins(stack: Stack) -> dict[str, tuple[str, str]]:
    """dist -> (version, stack key) of every deliberate re-pin of a vendor package."""
    out: dict[str, tuple[str, str]] = {}
    for tname, t in stack.targets.items():
        for pname, ph in t.pip.items():
            if ph.repin:
                for text in ph.requirements:
                    req = requirement(text)
                    version = str(req.specifier).lstrip("=")
                    out[req.name] = (version, f"targets.{tname}.pip.{pname}")
    return out


def target_pins(stack: Stack) -> dict[str, tuple[str, str]]:
    """dist -> (version, stack key) of every exact ``name==version`` a target's phase installs (a re-pin aside) of
    a project that is not a package of the stack: the version the image holds, as a package pin says it. The first
    target in declaration order names it (this runs on load, before a cycle of ``from:`` is refused)."""
    packages = {canonicalize_name(n) for n in stack.packages}
    out: dict[str, tuple[str, str]] = {}
    for tname, target in stack.targets.items():
        for pname, ph in target.pip.items():
            if ph.repin:
                continue
            for i, text in enumerate(ph.requirements):
                req = requirement(text)
                specs = list(req.specifier)
                if len(specs) != 1 or specs[0].operator not in ("==", "===") or specs[0].version.endswith(".*"):
                    continue
                name = canonicalize_name(req.name)
                if name in packages or req.name in out or req.marker is not None:
                    continue
                out[req.name] = (specs[0].version, f"targets.{tname}.pip.{pname}.requirements[{i}]")
    return out


def agreed_pins(stack: Stack) -> dict[str, tuple[str, str]]:
    """Every pin an upstream's ``agree`` compares: dist -> (version, the stack key that pins it), the packages
    first, then the targets' own exact pins (:func:`target_pins`)."""
    out = {n: (p.version, f"packages.{n}.version") for n, p in stack.packages.items()}
    return {**out, **target_pins(stack)}
