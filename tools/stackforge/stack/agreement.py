"""Does a stack agree with an upstream's own files? Pure functions over text (no I/O).

An upstream (e.g. the platform plugin) keeps its own pins: requirement files (``requirements/musa_private.txt``:
``torch==2.11.0.post2+musa5.2.0``), KEY=VALUE files read by regex (``third_party/PINS``: ``VLLM_TAG=v0.28.0``) and
the build arguments of its Dockerfiles (``ARG MOONCAKE_VERSION=0.3.13``, per stage).
:func:`read_requirements` parses requirement files (following ``-r``/``-c`` inside the same upstream) through a
``read(path)`` callback the caller gives, :func:`dockerfile_args` reads a Dockerfile's ``ARG NAME=VALUE`` lines as
requirement lines (``project==VALUE``), :func:`compare` compares each line that names a pin of the stack with
that pin, :func:`compare_keys` compares KEY=VALUE files with stack values, and :func:`drift` compares the files of
two revisions of the upstream. Findings name the upstream's file and line, the package, the stack's version and
the upstream's specifier.

Comparison, with ``packaging``: ``==V`` is Version equality (``1.26`` is ``1.26.0``, but ``0.2.7`` is not
``0.2.7+musa``, although PEP 440 matching would accept it); ``===V`` is string equality; a wildcard (``==1.26.*``)
and every other specifier must be satisfied by the stack's version (else a *constraint* finding); a line without a
specifier agrees; a line whose marker is false on the stack's platform is not compared.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

MAX_FILES = 64  # files one read may follow through -r/-c
_COMMENT = re.compile(r"(^|\s+)#.*$")
_INCLUDE = re.compile(r"^(-r|--requirement|-c|--constraint)(?:=|\s+|(?<=^-[rc]))(\S.*)$")
_KEY = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each requirement line: comments stripped, ``\\`` continuations joined."""
    start, buf = 0, ""
    for n, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if raw.endswith("\\"):
            buf += raw[:-1]
            continue
        line = _COMMENT.sub("", buf + raw).strip()
        buf = ""
        if line:
            yield start, line
    if buf and _COMMENT.sub("", buf).strip():
        yield start, _COMMENT.sub("", buf).strip()


@dataclass(frozen=True)
class Line:
    """One requirement of an upstream's file."""

    path: str  # relative to the upstream's tree
    line: int
    text: str  # the requirement as written (comment stripped)
    name: str  # canonical project name
    specifier: str  # e.g. "==0.2.7+musa", "<2.0", "" (none)
    marker: str | None = None
    constraint: bool = False  # read through -c
    stage: str | None = None  # a Dockerfile's ARG: the stage it is declared in ("" before the first FROM)
    arg: str | None = None  # ... and the build argument's name

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def what(self) -> str:
        """The line as a finding quotes it: the requirement, or the build argument with its stage."""
        if self.arg is None:
            return repr(self.text)
        return repr(self.text) + (f" (stage {self.stage})" if self.stage else " (before the first FROM)")

    def pinned(self) -> str | None:
        """The version of an exact pin (``==V`` or ``===V``, no wildcard, nothing else), else None."""
        specs = _specs(self.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and not specs[0].version.endswith(".*"):
            return specs[0].version
        return None


@dataclass
class Read:
    """What :func:`read_requirements` found: the lines, the files read, and what it could not use."""

    lines: list[Line] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # "path" (named by the stack) or "path (via file:line)"
    skipped: list[str] = field(default_factory=list)  # "file:line: why" (options, URLs, unparsable lines)


def _specs(text: str) -> list[Specifier]:
    from packaging.specifiers import SpecifierSet

    return sorted(SpecifierSet(text), key=str) if text else []


def _inside(base: str, target: str) -> str | None:
    """``target`` (relative to the directory of ``base``) as a tree path, None when it leaves the tree."""
    if target.startswith(("/", "~")) or "://" in target:
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(base), target))
    return None if joined.startswith("../") or joined in ("..", ".") else joined


def read_requirements(read: Callable[[str], str | None], paths: list[str]) -> Read:
    """Parse the requirement files ``paths`` of one upstream; ``read(path)`` gives a file's text (None when the
    upstream has no such file). ``-r``/``-c`` are followed inside the same tree; other options, URLs and lines
    that are not requirements are skipped and listed."""
    out = Read()
    seen: set[str] = set()

    def one(path: str, constraint: bool, via: str | None) -> None:
        if path in seen:
            return
        if len(seen) >= MAX_FILES:
            out.skipped.append(f"{path}: more than {MAX_FILES} files")
            return
        seen.add(path)
        text = read(path)
        if text is None:
            out.missing.append(path if via is None else f"{path} (via {via})")
            return
        out.files.append(path)
        for lineno, line in logical_lines(text):
            where = f"{path}:{lineno}"
            if line.startswith("-"):
                m = _INCLUDE.match(line)
                target = _inside(path, m.group(2).strip()) if m else None
                if m and target is not None:
                    one(target, constraint or m.group(1) in ("-c", "--constraint"), where)
                else:
                    out.skipped.append(f"{where}: {line.split()[0]} is not followed")
                continue
            try:
                req = Requirement(line)
            except InvalidRequirement:
                out.skipped.append(f"{where}: not a requirement")
                continue
            if req.url:
                out.skipped.append(f"{where}: a URL")
                continue
            out.lines.append(
                Line(
                    path,
                    lineno,
                    line,
                    canonicalize_name(req.name),
                    str(req.specifier),
                    str(req.marker) if req.marker else None,
                    constraint,
                )
            )

    for path in paths:
        one(path, False, None)
    return out


_FROM = re.compile(r"^FROM\s+(?:--\S+\s+)*\S+(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)
_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def dockerfile_instructions(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each instruction of a Dockerfile: comment lines dropped, ``\\`` continuations
    joined (the default escape character)."""
    start, parts = 0, list[str]()
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not parts:
            if not stripped or stripped.startswith("#"):
                continue
            start = n
        elif not stripped or stripped.startswith("#"):
            continue  # a comment or empty line inside a continued instruction is dropped, as BuildKit does
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        yield start, " ".join(p for p in parts if p)
        parts = []
    if parts:
        yield start, " ".join(p for p in parts if p)


@dataclass
class Args:
    """What :func:`dockerfile_args` found: the ARG lines as requirement lines, and what it could not compare."""

    lines: list[Line] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file:line: why"


def dockerfile_args(text: str, path: str, names: dict[str, str]) -> Args:
    """Each ``ARG NAME=VALUE`` of Dockerfile ``text`` whose NAME ``names`` maps to a project (``{ARG: project}``),
    in every stage, as a line pinning that project to VALUE (``==VALUE``; ``===VALUE`` when VALUE is no PEP 440
    version). An ARG without a default, or whose value refers to another variable, is listed as skipped."""
    out = Args()
    stage, count = "", 0
    for lineno, line in dockerfile_instructions(text):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            m = _FROM.match(line)
            stage = m.group(1) if m and m.group(1) else str(count)  # a stage without a name: its index
            count += 1
            continue
        if keyword.upper() != "ARG":
            continue
        try:
            words = shlex.split(rest, posix=True)
        except ValueError:
            out.skipped.append(f"{path}:{lineno}: not an ARG instruction shlex can read")
            continue
        for word in words:
            name, eq, value = word.partition("=")
            if name not in names or not _ARG_NAME.match(name):
                continue
            if not eq:
                out.skipped.append(f"{path}:{lineno}: ARG {name} has no default to compare")
                continue
            if "$" in value or not value:
                out.skipped.append(f"{path}:{lineno}: ARG {name}={value} is not a literal version")
                continue
            try:
                Version(value)
                spec = f"=={value}"
            except InvalidVersion:
                spec = f"==={value}"
            project = names[name]
            out.lines.append(
                Line(path, lineno, f"ARG {name}={value}", canonicalize_name(project), spec, stage=stage, arg=name)
            )
    return out


def marker_environment(python: str, arch: str = "x86_64") -> dict[str, str]:
    """The PEP 508 environment of a stack's platform: Linux, CPython ``python`` (``"3.10"``) on ``arch``."""
    parts = python.split(".")
    full = python if len(parts) >= 3 else f"{python}.0"
    return {
        "python_version": ".".join(parts[:2]),
        "python_full_version": full,
        "implementation_version": full,
        "platform_machine": arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def applies(line: Line, env: dict[str, str] | None) -> bool:
    """Whether ``line``'s marker holds on the platform ``env`` (a line without a marker, or no ``env``: yes)."""
    if not line.marker or env is None:
        return True
    try:
        return Marker(line.marker).evaluate(env)
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return True


def satisfies(version: str, specifier: str) -> tuple[bool, str]:
    """Whether the exact pin ``version`` meets ``specifier``, and the kind of a miss: ``pin`` (an ``==``/``===``
    the version is not) or ``constraint`` (any other specifier, a wildcard included)."""
    try:
        have = Version(version)
    except InvalidVersion:
        return False, "pin"
    for spec in _specs(specifier):
        if spec.operator == "===":
            if spec.version != version:
                return False, "pin"
        elif spec.operator == "==" and not spec.version.endswith(".*"):
            try:
                if Version(spec.version) != have:
                    return False, "pin"
            except InvalidVersion:
                return False, "pin"
        elif not spec.contains(have, prereleases=True):
            return False, "constraint"
    return True, ""


@dataclass(frozen=True)
class Finding:
    """The stack and an upstream's file disagree (or a stack override is stale)."""

    kind: str  # pin | constraint | key | stale | missing
    upstream: str
    path: str | None  # the upstream's file; None for a stale override that names no line
    line: int | None
    package: str  # the package (or KEY of a KEY=VALUE file)
    stack: str | None  # the stack's version (or value)
    spec: str | None  # the upstream's specifier (or value)
    message: str
    fix: str

    @property
    def where(self) -> str:
        if self.path is None:
            return f"{self.upstream}"
        return f"{self.upstream}:{self.path}" + (f":{self.line}" if self.line else "")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Agreement:
    """The lines naming a pin of the stack: those that agree, those an ``except`` lets through, the findings."""

    agreed: list[Line] = field(default_factory=list)
    excepted: list[tuple[Line, str]] = field(default_factory=list)  # (line, the reason)
    findings: list[Finding] = field(default_factory=list)


def canonical_pins(pins: dict[str, str]) -> dict[str, tuple[str, str]]:
    """``{canonical name: (name as the stack writes it, version)}``."""
    return {str(canonicalize_name(n)): (n, v) for n, v in pins.items()}


def line_finding(
    upstream: str, line: Line, name: str, version: str, kind: str, except_key: str, key: str | None = None
) -> Finding:
    """The finding of a line naming pin ``name`` (written so in the stack, at stack key ``key``: default its
    package's version) that ``version`` does not meet."""
    want = line.pinned()
    key = key or f"packages.{name}.version"
    value = repr(want) if key.endswith(".version") else repr(f"{name}=={want}")  # a requirement: name==version
    if kind == "pin":
        message = f"{line.what} pins {name} {want}, but the stack pins {name} {version}"
        fix = f"pin {key}: {value} (the upstream's), or add {except_key}.{name}: <why they differ>"
    else:
        message = f"{line.what} asks {name}{line.specifier}, which the stack's {name} {version} does not meet"
        fix = f"pin a version of {name} that meets {line.specifier}, or add {except_key}.{name}: <why they differ>"
    return Finding(kind, upstream, line.path, line.line, name, version, line.specifier, message, fix)


def compare(
    upstream: str,
    lines: list[Line],
    pins: dict[str, str],
    excepts: dict[str, str] | None = None,
    *,
    env: dict[str, str] | None = None,
    stale: bool = True,
    except_key: str | None = None,
    keys: dict[str, str] | None = None,
) -> Agreement:
    """Compare each line naming a pin of ``pins`` (``{name: version}``) with it. A line that disagrees is a
    finding unless ``excepts`` (``{name: reason}``) names its package; with ``stale``, an except whose package
    every line agrees with, or that no line names, is a finding too (``stale``). ``keys``: the stack key of a pin
    that is not a package's version (``{name: key}``), for the fix."""
    except_key = except_key or f"upstreams.{upstream}.agree.except"
    by_name = canonical_pins(pins)
    reasons = {str(canonicalize_name(n)): (n, r) for n, r in (excepts or {}).items()}
    out = Agreement()
    named: set[str] = set()
    differ: set[str] = set()
    for line in lines:
        pin = by_name.get(line.name)
        if pin is None or not applies(line, env):
            continue
        named.add(line.name)
        name, version = pin
        ok, kind = satisfies(version, line.specifier)
        if ok:
            out.agreed.append(line)
        elif line.name in reasons:
            differ.add(line.name)
            out.excepted.append((line, reasons[line.name][1]))
        else:
            out.findings.append(line_finding(upstream, line, name, version, kind, except_key, (keys or {}).get(name)))
    if stale:
        for key, (written, _) in reasons.items():
            if key in differ:
                continue
            first = next((ln for ln in lines if ln.name == key and applies(ln, env)), None)
            pinned = by_name[key][1] if key in by_name else None
            if first is None:
                what = f"{except_key}.{written} names a package none of the upstream's files name"
                out.findings.append(
                    Finding(
                        "stale", upstream, None, None, written, pinned, None, what, f"remove {except_key}.{written}"
                    )
                )
            else:
                what = f"{except_key}.{written} is stale: the upstream's {first.what} agrees with the stack's {pinned}"
                out.findings.append(
                    Finding(
                        "stale",
                        upstream,
                        first.path,
                        first.line,
                        written,
                        pinned,
                        first.specifier,
                        what,
                        f"remove {except_key}.{written}",
                    )
                )
    return out


def parse_keys(text: str) -> dict[str, tuple[str, int]]:
    """``{KEY: (value, line)}`` of a KEY=VALUE file (``#`` comments, optional quotes; the last assignment wins)."""
    out: dict[str, tuple[str, int]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.lstrip().startswith("#"):
            continue
        m = _KEY.match(raw)
        if not m:
            continue
        value = m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = re.sub(r"\s+#.*$", "", value)
        out[m.group(1)] = (value, n)
    return out


def compare_keys(
    upstream: str, path: str, text: str | None, wanted: dict[str, tuple[str, str | None]]
) -> list[Finding]:
    """Compare KEY=VALUE file ``path`` (``text``; None: the upstream has no such file) with the stack:
    ``wanted`` is ``{KEY: (stack key, stack value)}`` (None: the stack leaves it unset). Values are compared as
    strings."""

    def missing(key: str, value: str | None, message: str, fix: str) -> Finding:
        return Finding("missing", upstream, path, None, key, value, None, message, fix)

    if text is None:
        fix = f"name a file the upstream has in upstreams.{upstream}.agree.keys"
        return [
            missing(key, value, f"{path} does not exist in the upstream, so {key} cannot be compared with {ref}", fix)
            for key, (ref, value) in wanted.items()
        ]
    found = parse_keys(text)
    out = []
    for key, (ref, value) in wanted.items():
        if key not in found:
            fix = f"remove {key} from upstreams.{upstream}.agree.keys.{path}, or name the key the file assigns"
            out.append(missing(key, value, f"{path} assigns no {key} to compare with {ref}", fix))
            continue
        have, line = found[key]
        if have != value:
            out.append(
                Finding(
                    "key",
                    upstream,
                    path,
                    line,
                    key,
                    value,
                    have,
                    f"{key}={have}, but the stack's {ref} is {value}"
                    if value is not None
                    else f"{key}={have}, but the stack sets no {ref}",
                    f"set {ref}: {have} (the upstream's), or move upstreams.{upstream}.commit to a revision that "
                    f"names {value}",
                )
            )
    return out


# --- drift ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriftRow:
    """One thing that differs between the upstream's files at the pinned revision and at a newer one."""

    change: str  # moved | added | removed | constraint | key
    package: str  # canonical name, or KEY
    stack: str | None  # the stack's pin (or value) of it, if any
    before: str | None  # the specifier (or value) at the pinned revision
    after: str | None  # ... at the newer one
    where: str  # file:line at the newer revision (at the pinned one for a removal)
    agrees: bool | None = None  # whether the stack's pin meets the newer specifier (None: the stack has no pin)

    def to_json(self) -> dict:
        return asdict(self)


def _by_name(lines: list[Line], env: dict[str, str] | None) -> dict[tuple[str, str | None], Line]:
    """The first line naming each project (a Dockerfile's ARG: each project per stage)."""
    out: dict[tuple[str, str | None], Line] = {}
    for line in lines:
        key = (line.name, line.stage if line.arg is not None else None)
        if applies(line, env) and key not in out:
            out[key] = line
    return out


def drift(
    before: list[Line],
    after: list[Line],
    pins: dict[str, str],
    *,
    env: dict[str, str] | None = None,
    keys_before: dict[str, dict[str, tuple[str, int]]] | None = None,
    keys_after: dict[str, dict[str, tuple[str, int]]] | None = None,
    key_values: dict[str, dict[str, str | None]] | None = None,
) -> list[DriftRow]:
    """What moved in the upstream's requirement lines (``before`` at the pinned revision, ``after`` at the newer
    one) and its KEY=VALUE files (``{path: parse_keys(...)}``), with the stack's pins (``{name: version}``) and
    compared values (``key_values``: ``{path: {KEY: stack value}}``; keys_before/after cover the same paths).
    An exact pin whose version changed is *moved*; a line that appears is *added* (an exact pin) or a new
    *constraint* (any other specifier, or an exact pin that became a range); a line that goes is *removed*."""
    pins_by = {k: v for k, (_, v) in canonical_pins(pins).items()}
    old, new = _by_name(before, env), _by_name(after, env)
    rows: list[DriftRow] = []

    def agrees(name: str, spec: str | None) -> bool | None:
        if name not in pins_by or spec is None:
            return None
        return satisfies(pins_by[name], spec)[0]

    for at, line in new.items():
        name = line.name
        prev = old.get(at)
        stack = pins_by.get(name)
        if prev is None:
            change = "added" if line.pinned() is not None or not line.specifier else "constraint"
            rows.append(DriftRow(change, name, stack, None, line.specifier, line.where, agrees(name, line.specifier)))
        elif prev.specifier != line.specifier:
            change = "moved" if line.pinned() is not None else "constraint"  # now an exact pin, or a range
            rows.append(
                DriftRow(change, name, stack, prev.specifier, line.specifier, line.where, agrees(name, line.specifier))
            )
    for at, line in old.items():
        if at not in new:
            rows.append(DriftRow("removed", line.name, pins_by.get(line.name), line.specifier, None, line.where, None))
    for path, wanted in (key_values or {}).items():
        kb, ka = (keys_before or {}).get(path, {}), (keys_after or {}).get(path, {})
        for key in wanted:
            b, a = kb.get(key), ka.get(key)
            if (b and b[0]) != (a and a[0]):
                where = f"{path}:{a[1]}" if a else (f"{path}:{b[1]}" if b else path)
                value = wanted[key]
                rows.append(
                    DriftRow(
                        "key",
                        key,
                        value,
                        b[0] if b else None,
                        a[0] if a else None,
                        where,
                        None if a is None else a[0] == value,
                    )
                )
    order = {"moved": 0, "constraint": 1, "added": 2, "removed": 3, "key": 4}
    rows.sort(key=lambda r: (order[r.change], r.where.split(":")[0], r.package))
    return rows
