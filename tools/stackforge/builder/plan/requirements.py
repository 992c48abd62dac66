"""Requirement files of an upstream as pip phases, and the vendor pins no phase may replace.

The plan side is pure (:func:`requirement_phases`, :func:`guarded`): every phase after the vendor
``--no-deps`` phases installs with every pin of the stack (vendor and public) as a constraints file, so no
requirement file moves a pin, and each one runs through ``images/gate/preserve.py``, which checks after the
phase that every vendor pin still has its exact version and names the pin a refused resolution would move.

The context side (:func:`read_phase`) reads the requirement files on the host from the exported, patched
upstream trees. Requirement files are hostile input: ``-r``/``-c`` are followed inside the same tree only,
every other option (index URLs, find-links, editables, per-requirement options), URL and path requirements
are refused with the file's line and the stack key. A line naming a package a vendor index of the stack provides
is compared with the vendor pin (``stack.agreement``): a line that agrees is dropped (the vendor phase installs
the pin), a line that disagrees fails naming the file's line, both versions and the fix, unless the upstream's
``agree.except`` gives the reason the stack differs (then it is dropped, and the manifest says why). A line
naming a public pin that the pin does not meet is dropped the same way when the upstream's ``agree.except`` gives
the reason (the public pin's phase installs the stack's version); without one it stays, and pip refuses the phase
naming the pin. A file declared ``constraint: true`` is read as a ``-c`` file: its lines constrain the phase.
What pip reads is the flattened result, written into deps/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from stackforge import progress
from stackforge.builder.plan.phases import PipPhase
from stackforge.errors import BuildFailed, UserError
from stackforge.stack import agreement
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack
from stackforge.urls import redact

VENDOR_PINS = "deps/vendor-pins.json"  # {name: version} of every vendor pin, read by preserve.py
PUBLIC_PINS = "deps/public-pins.json"  # {name: version} of every public pin, read by preserve.py
CONSTRAINTS = "deps/constraints.txt"  # every pin of the stack as a `name==version` constraint
MANIFEST = "deps/requirements.json"  # what each requirement phase read and dropped (copied into the evidence)
MAX_BYTES = 256 * 1024  # one requirement file
MAX_FILES = 64  # files one phase may read through -r/-c
_OPTION = re.compile(r"^(-r|--requirement|-c|--constraint)(?:=|\s+|(?<=^-[rc]))(\S.*)$")


def vendor_pins(stack: Stack) -> dict[str, str]:
    """Every package of a vendor index, with its exact version."""
    return {n: p.version for n, p in stack.packages.items() if stack.indexes[p.index].role == "vendor"}


def public_pins(stack: Stack) -> dict[str, str]:
    """Every package of a public index, with its exact version."""
    return {n: p.version for n, p in stack.packages.items() if stack.indexes[p.index].role != "vendor"}


def stack_pins(stack: Stack) -> dict[str, str]:
    """Every pin of the stack, vendor pins first: the constraints of every phase after the vendor --no-deps one."""
    return {**vendor_pins(stack), **public_pins(stack)}


def requirement_phases(stack: Stack) -> list[PipPhase]:
    return [
        PipPhase(
            f"requirements.{name}",
            req.index,
            redact(stack.indexes[req.index].url),
            f"deps/requirements/{name}.txt",
            req.no_deps,
            False,
            [],
            key=f"requirements.{name}",
            constraints=f"deps/requirements/{name}.constraints.txt",
            files=[f.model_dump(exclude_defaults=True) for f in req.files],
        )
        for name, req in stack.requirements.items()
    ]


def guarded(stack: Stack, phases: list[PipPhase]) -> list[PipPhase]:
    """Give every phase its stack key, its record path and, once an earlier phase installed pins, every pin
    of the stack as constraints (in a later public phase its own pins repeat its requirements)."""
    installed = False  # an earlier phase installed pins: the vendor --no-deps phase or a public one
    for n, phase in enumerate(phases, 1):
        if not phase.key:
            deps = phase.name.endswith("-deps") and phase.name[: -len("-deps")] in stack.indexes
            phase.key = f"indexes.{phase.name[: -len('-deps')]}.deps_from" if deps else f"indexes.{phase.index}"
        if installed and phase.constraints is None:
            phase.constraints = CONSTRAINTS
        installed = installed or (bool(phase.pins) and phase.checks_pins)
        phase.report = f"/stackforge/reports/{n:02d}-{phase.name}.json"
    return phases


@dataclass
class Dropped:
    """A line naming a vendor pin, left to the vendor phase: it agrees with the pin, or ``excepted`` says why not."""

    phase: str
    requirement: str
    package: str
    where: str  # upstream:path:line
    pin: str = ""  # the stack's version of the package
    excepted: str | None = None  # the upstream's agree.except reason when the line asks another version
    public: bool = False  # a public pin's line (dropped only when excepted), not a vendor pin's


@dataclass
class PhaseFiles:
    """One requirement phase's flattened requirements and constraints, and what was dropped."""

    phase: str
    requirements: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)  # {upstream, path, sha256} of every file read
    dropped: list[Dropped] = field(default_factory=list)


class _Reader:
    def __init__(
        self,
        loaded: LoadedStack,
        name: str,
        index: int,
        upstream: str,
        tree: Path,
        pin: str,
        out: PhaseFiles,
        where: tuple = (),
    ):
        stack = loaded.model
        self.loaded, self.name, self.index, self.upstream = loaded, name, index, upstream
        self.where = where or ("requirements", name)  # the phase's stack key
        self.tree, self.pin, self.out = tree.resolve(), pin, out
        self.vendor = {canonicalize_name(n): (n, v) for n, v in vendor_pins(stack).items()}
        self.public = {canonicalize_name(n): (n, v) for n, v in public_pins(stack).items()}
        agree = stack.upstreams[upstream].agree
        self.excepts: dict[str, str] = {
            canonicalize_name(n): r for n, r in (agree.except_ if agree else {}).items() if r is not None
        }
        self.env = agreement.marker_environment(stack.platform.python, stack.platform.arch)
        self.open: list[Path] = []
        self.seen: set[Path] = set()

    @property
    def key(self) -> str:
        return f"{'.'.join(self.where)}.files[{self.index}]"

    def refuse(self, rel: str, line: int | None, what: str, fix: str) -> UserError:
        return UserError(
            f"{self.key}: {what} (upstream {self.upstream} at {self.pin})",
            file=f"{self.upstream}:{rel}",
            line=line,
            fix=fix,
        )

    def inside(self, path: Path, rel: str, via: tuple[str, int] | None) -> Path:
        real = Path(os.path.realpath(path))
        if real != self.tree and self.tree not in real.parents:
            where = via or (rel, None)
            raise self.refuse(
                where[0],
                where[1],
                f"{rel} leads outside the upstream {self.upstream}'s tree",
                "requirement files may include only files of the same tree",
            )
        return real

    def read(self, rel: str, constraints: bool = False, via: tuple[str, int] | None = None) -> None:
        path = self.inside(self.tree / rel, rel, via)
        if not path.is_file():
            if via is None:
                raise UserError(
                    f"{self.key}: {rel} does not exist in upstream {self.upstream} at {self.pin}",
                    **self.loaded.position((*self.where, "files", self.index)).as_error_kwargs(),
                    fix=f"name a file the upstream has at that commit, or move upstreams.{self.upstream}",
                )
            raise self.refuse(
                via[0],
                via[1],
                f"includes {rel}, which does not exist in upstream {self.upstream}",
                "include only files of the same tree",
            )
        if path in self.open:
            raise self.refuse(
                via[0] if via else rel, via[1] if via else None, f"{rel} includes itself", "remove the -r/-c cycle"
            )
        if path in self.seen:
            return
        if len(self.seen) >= MAX_FILES or len(self.open) > 16:
            raise self.refuse(
                rel, None, f"more than {MAX_FILES} files or 16 nested includes", "flatten the requirement files"
            )
        data = path.read_bytes()[: MAX_BYTES + 1]
        if len(data) > MAX_BYTES:
            raise self.refuse(rel, None, f"{rel} is larger than {MAX_BYTES // 1024} KiB", "a requirement file is small")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.refuse(rel, None, f"{rel} is not UTF-8 text", "fix the file's encoding") from None
        self.seen.add(path)
        self.open.append(path)
        self.out.files.append({"upstream": self.upstream, "path": rel, "sha256": hashlib.sha256(data).hexdigest()})
        for lineno, line in _logical_lines(text):
            self.line(rel, lineno, line, constraints)
        self.open.pop()

    def line(self, rel: str, lineno: int, line: str, constraints: bool) -> None:
        if any((ord(c) < 32 and c != "\t") or 0x7F <= ord(c) <= 0x9F for c in line):
            raise self.refuse(rel, lineno, "a control character in a requirement line", "remove it")
        if line.startswith("-"):
            m = _OPTION.match(line)
            if not m:
                option = line.split()[0].split("=", 1)[0]
                raise self.refuse(
                    rel,
                    lineno,
                    f"option {option} is refused in a requirement file",
                    f"only -r/-c of files in the same tree are followed; a phase installs from "
                    f"requirements.{self.name}.index alone (patch the file in the upstream's series)",
                )
            target = m.group(2).strip()
            if "://" in target or target.startswith(("/", "~")):
                raise self.refuse(
                    rel,
                    lineno,
                    f"{m.group(1)} {target}: only files of the same tree are followed",
                    "include a relative path of the same tree",
                )
            included = os.path.normpath(os.path.join(os.path.dirname(rel), target))
            self.read(included, constraints or m.group(1) in ("-c", "--constraint"), via=(rel, lineno))
            return
        if "://" in line or line.startswith((".", "/", "~")) or re.search(r"\s-{1,2}[A-Za-z]", line):
            raise self.refuse(
                rel,
                lineno,
                f"{line!r}: URL, path and per-requirement options are refused",
                "name a package and a version specifier",
            )
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise self.refuse(
                rel, lineno, f"{line!r} is not a requirement: {exc}", "write name[extras] specifier ; marker"
            ) from None
        if req.url:
            raise self.refuse(rel, lineno, f"{line!r}: a direct URL reference is refused", "name a version instead")
        vendor = self.vendor.get(canonicalize_name(req.name))
        if vendor is not None:
            self.vendor_line(rel, lineno, line, req, *vendor)
            return
        public = self.public.get(canonicalize_name(req.name))
        if public is not None and self.excepted_public(rel, lineno, line, req, *public):
            return
        (self.out.constraints if constraints else self.out.requirements).append(str(req))

    def excepted_public(self, rel: str, lineno: int, text: str, req: Requirement, name: str, version: str) -> bool:
        """A line naming public pin ``name`` that the pin does not meet, and the upstream's ``agree.except`` says
        why the stack differs: dropped (the pin's own phase installs the stack's version), as a vendor line is."""
        line = agreement.Line(
            rel, lineno, text, canonicalize_name(req.name), str(req.specifier), str(req.marker) if req.marker else None
        )
        ok, _ = agreement.satisfies(version, line.specifier)
        excepted = self.excepts.get(line.name)
        if ok or excepted is None or not agreement.applies(line, self.env):
            return False
        where = f"{self.upstream}:{rel}:{lineno}"
        self.out.dropped.append(Dropped(self.out.phase, str(req), req.name, where, version, excepted, public=True))
        return True

    def vendor_line(self, rel: str, lineno: int, text: str, req: Requirement, name: str, version: str) -> None:
        """A line naming vendor pin ``name``: dropped when it agrees (or is excepted), else the build fails."""
        where = f"{self.upstream}:{rel}:{lineno}"
        line = agreement.Line(
            rel, lineno, text, canonicalize_name(req.name), str(req.specifier), str(req.marker) if req.marker else None
        )
        ok, kind = agreement.satisfies(version, line.specifier)
        if not agreement.applies(line, self.env):
            ok = True  # not for this platform: pip would skip it too
        excepted = None if ok else self.excepts.get(line.name)
        if not ok and excepted is None:
            finding = agreement.line_finding(
                self.upstream, line, name, version, kind, f"upstreams.{self.upstream}.agree.except"
            )
            raise BuildFailed(
                f"{self.key}: {finding.message} (upstream {self.upstream} at {self.pin}); the vendor phase installs "
                f"the stack's pin, so the upstream's line is not dropped silently",
                file=f"{self.upstream}:{rel}",
                line=lineno,
                fix=finding.fix,
            )
        self.out.dropped.append(Dropped(self.out.phase, str(req), req.name, where, version, excepted))


_logical_lines = agreement.logical_lines


def read_item(loaded: LoadedStack, name: str, index: int, trees: dict[str, Path], pins: dict[str, str]) -> PhaseFiles:
    """Read one file of requirement phase ``name`` (``files[index]``) alone, as :func:`read_phase` reads it."""
    out = PhaseFiles(f"requirements.{name}")
    item = loaded.model.requirements[name].files[index]
    reader = _Reader(loaded, name, index, item.upstream, trees[item.upstream], pins.get(item.upstream, "?"), out)
    reader.read(item.path, item.constraint)
    return out


def read_phase(loaded: LoadedStack, name: str, trees: dict[str, Path], pins: dict[str, str]) -> PhaseFiles:
    """Read requirement phase ``name`` from the exported trees (upstream -> directory); ``pins``: upstream ->
    the pin shown in errors (tag@commit)."""
    out = PhaseFiles(f"requirements.{name}")
    for i, item in enumerate(loaded.model.requirements[name].files):
        reader = _Reader(loaded, name, i, item.upstream, trees[item.upstream], pins.get(item.upstream, "?"), out)
        reader.read(item.path, item.constraint)
    return out


def requirements_file(phase: PhaseFiles) -> str:
    head = [f"# {phase.phase}: " + ", ".join(f"{f['upstream']}:{f['path']}" for f in phase.files)]
    dropped = [
        f"# dropped, the vendor phase installs {d.package}=={d.pin}: {d.requirement} ({d.where})"
        if d.excepted is None
        else f"# dropped, the stack differs on purpose ({d.excepted}): {d.requirement} ({d.where}); "
        f"the {'public pin' if d.public else 'vendor phase'} installs {d.package}=={d.pin}"
        for d in phase.dropped
    ]
    return "\n".join(head + dropped + phase.requirements) + "\n"


def constraints_file(stack: Stack, phase: PhaseFiles | None = None) -> str:
    lines = [f"{n}=={v}" for n, v in stack_pins(stack).items()]
    own = ["# the upstream's own constraints", *phase.constraints] if phase and phase.constraints else []
    return "\n".join(["# every pin of the stack (vendor, then public): no phase may move one", *lines, *own]) + "\n"


def write_phases(
    loaded: LoadedStack,
    staging: Path,
    trees: dict[str, Path] | None,
    pins: dict[str, str],
    write,
    constrained: bool,
) -> list:
    """Write the vendor pins, the constraints (when a phase of the plan reads them: ``constrained``) and each
    requirement phase's files into the context; ``trees`` None (no sources) writes placeholders. Returns the
    phases read."""
    stack = loaded.model
    write(staging / VENDOR_PINS, json.dumps(vendor_pins(stack), indent=2) + "\n")
    write(staging / PUBLIC_PINS, json.dumps(public_pins(stack), indent=2) + "\n")
    if constrained:
        write(staging / CONSTRAINTS, constraints_file(stack))
    if not stack.requirements:
        return []
    (staging / "deps" / "requirements").mkdir(parents=True, exist_ok=True)
    read: list[PhaseFiles] = []
    for name in stack.requirements:
        if trees is None:
            phase = PhaseFiles(f"requirements.{name}", requirements=["# not read: no sources were fetched"])
        else:
            phase = read_phase(loaded, name, trees, pins)
            read.append(phase)
            agreed = [d.package for d in phase.dropped if d.excepted is None]
            excepted = [f"{d.package} ({d.excepted})" for d in phase.dropped if d.excepted is not None]
            if agreed:
                progress.note(
                    f"{phase.phase}: {len(agreed)} line(s) naming a vendor pin agree with it and are left to the "
                    f"vendor phase: {', '.join(agreed)}"
                )
            if excepted:
                progress.note(
                    f"{phase.phase}: {len(excepted)} line(s) ask another version than the stack's pin, excepted by "
                    f"the stack: {', '.join(excepted)}"
                )
        write(staging / "deps" / "requirements" / f"{name}.txt", requirements_file(phase))
        write(staging / "deps" / "requirements" / f"{name}.constraints.txt", constraints_file(stack, phase))
    write(staging / MANIFEST, json.dumps([asdict(p) for p in read], indent=2) + "\n")
    return read
