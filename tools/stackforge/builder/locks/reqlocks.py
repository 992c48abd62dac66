"""The requirement-file closure of a public lock, and how the build proves a lock still covers it.

``stackforge lock`` exports and patches the upstreams that ``requirements:`` phases read, exactly as the
build does (``builder/context/context.py``: the verified git mirror or checksummed sdist at the pinned commit, then
the patch series), flattens each file with ``builder/plan/requirements.py`` (the same refusals, the same vendor
names dropped) and adds it to the resolution of its index (:func:`inputs`, through
``locks.public_inputs``). The lock then pins and hashes the whole closure; each file's entries are
annotated ``# via -r <upstream>/<path>``, and the lock's header records what it was made from::

    # input vllm/requirements/common.txt flattened sha256:<64 hex> (requirements.vllm-common.files[0], …)

In the build, the index's own phase installs the whole closure with ``--require-hashes``; the requirement
phase then runs ``pip install --no-index``: it proves that the closure is already installed and can fetch
nothing. A lock whose header does not name exactly the requirement files of its index (:func:`verify_header`),
whose recorded digest differs from the file flattened from today's patched tree, or which lacks a package a
file names (:func:`check_fresh`) is refused naming the lock's line, with ``run: stackforge lock STACK``.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from stackforge.builder.plan import requirements
from stackforge.builder.plan.resolve import Input, Target
from stackforge.builder.sources.sources import export_source
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import UserError
from stackforge.stack.installed import export_order
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack

if TYPE_CHECKING:
    from stackforge.builder.locks.locks import Lock

HEADER = re.compile(r"^# input (?P<label>\S+) flattened sha256:(?P<digest>[0-9a-f]{64})(?:\s|$)")


def sources(stack: Stack, index: str) -> dict[str, str]:
    """``<upstream>/<path>`` -> the stack key of every requirement file a phase of ``index`` reads (first key)."""
    out: dict[str, str] = {}
    for name, phase in stack.requirements.items():
        if phase.index == index:
            for i, item in enumerate(phase.files):
                out.setdefault(f"{item.upstream}/{item.path}", f"requirements.{name}.files[{i}]")
    return out


def upstreams_needed(stack: Stack, index: str | None = None) -> list[str]:
    """The upstreams the requirement phases (of ``index``, or all) read, with the upstreams carrying their
    series (``patches_from``), in export order."""
    need: set[str] = set()
    for phase in stack.requirements.values():
        if index is None or phase.index == index:
            for item in phase.files:
                name: str | None = item.upstream
                while name is not None and name not in need:
                    need.add(name)
                    src = stack.upstreams[name].patches_from
                    name = src.upstream if src is not None else None
    return [n for n in export_order(stack) if n in need]


def pin_of(stack: Stack, name: str) -> str:
    up = stack.upstreams[name]
    if up.sdist is not None:
        return f"{up.sdist.name}=={up.sdist.version}@sha256:{up.sdist.sha256}"
    return up.pin


@contextmanager
def exported(loaded: LoadedStack, names: list[str], workspace: Workspace | None = None) -> Iterator[dict[str, Path]]:
    """The upstreams ``names`` fetched, verified and patched by the build's own export (the workspace's cache,
    same credentials), in a temporary directory removed afterwards. {upstream: tree}"""
    ws = workspace_for(loaded, workspace)
    with tempfile.TemporaryDirectory(prefix="stackforge-lock-trees-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in names:
            export_source(loaded, name, src / name, ws)
        yield {name: src / name for name in names}


def inputs(loaded: LoadedStack, index: str, trees: dict[str, Path] | None = None) -> list[Input]:
    """One resolution input per requirement file of ``index``, labelled ``<upstream>/<path>``: its flattened
    requirements and constraints when ``trees`` are given, else the label alone (what the lock verifier needs)."""
    stack = loaded.model
    out: list[Input] = []
    for label, key in sources(stack, index).items():
        if trees is None:
            out.append(Input(label))
            continue
        phase, i = _phase_and_item(key)
        read = requirements.read_item(loaded, phase, i, trees, {n: pin_of(stack, n) for n in trees})
        out.append(Input(label, list(read.requirements), constraints=list(read.constraints)))
    return out


def _phase_and_item(key: str) -> tuple[str, int]:
    m = re.fullmatch(r"requirements\.(.+)\.files\[(\d+)\]", key)
    assert m is not None
    return m.group(1), int(m.group(2))


def digest(inp: Input) -> str:
    """sha256 of what pip reads from one flattened requirement file: its requirements, then its constraints."""
    text = "".join(f"{line}\n" for line in inp.lines) + "--\n" + "".join(f"{line}\n" for line in inp.constraints)
    return hashlib.sha256(text.encode()).hexdigest()


def header(stack: Stack, index: str, made: list[Input]) -> str:
    """The lock header lines recording each requirement file the resolution read."""
    keys = sources(stack, index)
    lines = []
    for inp in made:
        if inp.label in keys:
            upstream = inp.label.split("/", 1)[0]
            lines.append(
                f"# input {inp.label} flattened sha256:{digest(inp)} ({keys[inp.label]}, "
                f"upstream {upstream} at {pin_of(stack, upstream)})\n"
            )
    return "".join(lines)


def recorded(text: str) -> dict[str, tuple[int, str]]:
    """``<upstream>/<path>`` -> (line, sha256) of each requirement file a lock's header records."""
    out: dict[str, tuple[int, str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        m = HEADER.match(line)
        if m:
            out.setdefault(m.group("label"), (number, m.group("digest")))
    return out


def _stale(rel: str, line: int | None, message: str, stack: Stack) -> UserError:
    return UserError(
        f"lock file is stale: {message}; the lock was not used",
        file=rel,
        line=line,
        fix=f"run: stackforge lock {stack.name} (and review its diff)",
    )


def verify_header(stack: Stack, key: str, lock: Lock, rel: str) -> None:
    """The lock of a public index records exactly the requirement files its phases read; a vendor index's
    lock holds only its pins, so a requirement phase cannot install from a locked vendor index."""
    if key not in stack.indexes:
        return
    want = sources(stack, key)
    if stack.indexes[key].role == "vendor":
        if want:
            raise UserError(
                f"{want[next(iter(want))].rsplit('.files', 1)[0]}.index names the vendor index '{key}', "
                "which has a lock: a vendor lock holds exactly its pins, so the phase could not be "
                "hash-checked",
                file=rel,
                fix="install the requirement files from a public index",
            )
        return
    have = recorded(lock.text)
    for label, k in want.items():
        if label not in have:
            raise _stale(rel, 1, f"it does not cover {label} ({k}), a requirement file index '{key}' installs", stack)
    for label, (line, _) in have.items():
        if label not in want:
            raise _stale(
                rel, line, f"it was made from {label}, which no requirement phase of index '{key}' reads", stack
            )


def check_fresh(loaded: LoadedStack, locks: dict[str, Lock], trees: dict[str, Path]) -> None:
    """Each locked public index was locked from the requirement files the build reads now: the digest of
    every file flattened from today's exported, patched tree matches the lock's header, and every package
    a file requires for the stack's target is in the lock (or a vendor pin)."""
    stack = loaded.model
    target = Target.of(stack).markers()
    vendors = {canonicalize_name(n) for n in requirements.vendor_pins(stack)}
    for key, lock in locks.items():
        if key not in stack.indexes or stack.indexes[key].role != "public" or not sources(stack, key):
            continue
        rel = str(lock.path.relative_to(loaded.root)) if lock.path.is_absolute() else str(lock.path)
        have = recorded(lock.text)
        for inp in inputs(loaded, key, trees):
            line, made = have[inp.label]
            now = digest(inp)
            if now != made:
                upstream = inp.label.split("/", 1)[0]
                raise _stale(
                    rel,
                    line,
                    f"{inp.label} ({sources(stack, key)[inp.label]}) changed since the lock was "
                    f"made: flattened from upstream {upstream} at {pin_of(stack, upstream)} with its patch "
                    f"series it is sha256:{now}, the lock was made from sha256:{made}",
                    stack,
                )
            for text in inp.lines:
                try:
                    req = Requirement(text)
                except InvalidRequirement:
                    continue
                name = canonicalize_name(req.name)
                if (req.marker is None or req.marker.evaluate(target)) and name not in set(lock.pins) | vendors:
                    raise _stale(rel, line, f"{inp.label} requires {text}, which the lock does not list", stack)
