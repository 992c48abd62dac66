"""Lock files: the hashes each pip phase must see, per stack and index.

``stacks/locks/<stack>/<index>.txt`` is a requirements file with ``--hash`` lines.
When it exists, that index's pip phase installs from it with ``--require-hashes``; an
index declared ``lock: true`` in the stack must have one.

- a public index is locked with uv's resolver for the stack's Python and platform
  (``builder/plan/resolve.py`` says how, and why not pip): the whole resolution of
  :func:`public_inputs`, pinned and hashed, with every vendor pin held at its exact
  version and left out, so a public lock never names (or pulls) a package a vendor
  index of the stack provides;
- the same resolution covers the requirement files of the index's ``requirements:`` phases, read from the
  exported, patched upstream trees (``builder/locks/reqlocks.py``): the lock's header records each flattened file's
  sha256, the requirement phase then runs ``--no-index``, and a lock made from other files is stale;
- the same resolution covers the vendor wheels' own dependencies: what only a vendor pin
  requires goes to ``<vendor>.deps.txt``, which the ``<vendor>-deps`` phase installs from
  with ``--require-hashes``;
- a vendor index (installed ``--no-deps``) is locked from the index's own file
  hashes (PEP 691/503) for the exact pins.

A public lock (and its vendors' dependency locks) records in its header the target it was resolved for and
every other pin of the stack the resolution held (``# held …``), so ``stackforge lock --check`` can tell
offline whether the lock is still current for the stack (:func:`check_stack`).

A lock holds only ``name==version --hash=sha256:…`` entries and comments: any option,
URL, path, range, duplicate or unhashed entry, a pin missing from it, or a package no pin
leads to is an error naming the lock file and line, and the lock is not used.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge import localver, progress
from stackforge.builder.locks import reqlocks
from stackforge.builder.plan import requirements, resolve
from stackforge.builder.plan.resolve import Input
from stackforge.clients import credentials, pip
from stackforge.clients.index import IndexClient
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import UserError, printable
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack
from stackforge.stack.rules import Finding
from stackforge.urls import redact, scrub

ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9._+!-]+)$")
HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
VIA = re.compile(r"^#\s*via(?:\s+(?P<rest>.*))?$")
VIA_MORE = re.compile(r"^#\s{2,}(?P<rest>\S.*)$")
REQUIREMENTS_IN = "-r requirements.in"
TARGET = re.compile(r"^#.* for (CPython \S+ on \S+?),? ")  # the target a lock's first line names
COMMENT = re.compile(r"(^|\s+)#.*$")  # pip's own comment pattern


@dataclass
class Lock:
    path: Path
    text: str
    pins: dict[str, tuple[str, list[str]]]  # canonical name -> (version, sha256 hashes)
    lines: dict[str, int] = field(default_factory=dict)  # canonical name -> line of its entry
    via: dict[str, set[str]] = field(default_factory=dict)  # canonical name -> what requires it (# via)


DEPS = "-deps"  # the key of a vendor's dependency lock: "<vendor>-deps" (the name of its pip phase)


def lock_path(loaded: LoadedStack, index: str) -> Path:
    """``<index>.txt``; for the key ``<vendor>-deps``, the vendor wheels' dependency lock ``<vendor>.deps.txt``; in
    stacks/locks/<stack>/ (stacks/locks/<stack>@<line>/ for a platform line that is not the stack's own: each
    architecture resolves on its own)."""
    stack = loaded.model
    folder = loaded.root / "stacks" / "locks" / (stack.name + (loaded.line.suffix if loaded.line else ""))
    if index.endswith(DEPS) and index[: -len(DEPS)] in stack.indexes and index not in stack.indexes:
        return folder / f"{index[: -len(DEPS)]}.deps.txt"
    return folder / f"{index}.txt"


def lock_command(loaded: LoadedStack) -> str:
    """The command that writes the stack's locks (with ``--platform`` for a line that is not the stack's own)."""
    line = loaded.line
    return f"stackforge lock {loaded.model.name}" + (f" --platform {line.name}" if line and not line.own else "")


def vendor_names(stack: Stack) -> dict[str, str]:
    """Canonical name -> version of every pin a vendor index of the stack provides."""
    return {
        canonicalize_name(n): p.version for n, p in stack.packages.items() if stack.indexes[p.index].role == "vendor"
    }


def public_inputs(loaded: LoadedStack, index: str, trees: dict[str, Path] | None = None) -> list[Input]:
    """Everything the public resolution of ``index`` must install: its exact pins (``requirements.in``), then
    each requirement file a ``requirements:`` phase of this index reads, flattened from ``trees`` (the exported,
    patched upstream trees; without them, the labels alone) as ``<upstream>/<path>`` (``builder/locks/reqlocks.py``);
    its packages are admitted by ``# via -r <upstream>/<path>``. The build holds every pin as a constraint of
    every phase after the one that installs it; here the index's own pins are exact requirements, the public
    pins of other indexes constraints, and the vendor pins are held by :func:`resolve.run_uv`."""
    stack = loaded.model
    mine = {canonicalize_name(n) for n, p in stack.packages.items() if p.index == index}
    held = [f"{n}=={v}" for n, v in requirements.public_pins(stack).items() if canonicalize_name(n) not in mine]
    return [Input(REQUIREMENTS_IN[3:], _pins(stack, index), constraints=held), *reqlocks.inputs(loaded, index, trees)]


def _deps_vendors(stack: Stack, index: str) -> list[str]:
    """The vendor indexes whose wheels' own dependencies come from ``index`` (and have pins)."""
    return [
        v for v, idx in stack.indexes.items() if idx.role == "vendor" and idx.deps_from == index and _pins(stack, v)
    ]


def _refuse(rel: str, line: int | None, message: str, stack_name: str | None) -> UserError:
    fix = f"run: stackforge lock {stack_name}" if stack_name else "regenerate the lock with `stackforge lock STACK`"
    return UserError(f"{message}; the lock was not used", file=rel, line=line, fix=fix + " (and review its diff)")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, text) of each logical line, joined exactly as pip joins a
    requirements file: ``str.splitlines``, a line ending in ``\\`` continues unless it is a comment
    line, and a comment line ends a continuation."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    first = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        comment = bool(COMMENT.match(raw))
        if not raw.endswith("\\") or comment:
            line = " " + raw if comment else raw
            if pending:
                out.append((first, "".join([*pending, line])))
                pending = []
            else:
                out.append((number, line))
        else:
            if not pending:
                first = number
            pending.append(raw.strip("\\"))
    if pending:
        out.append((first, "".join(pending)))
    return out


def _entry(rel: str, number: int, line: str, stack_name: str | None) -> tuple[str, str, list[str]]:
    """One ``name==version --hash=sha256:…`` entry, or a UserError naming what is not allowed."""
    words = line.split()
    head = words[0]
    if head.startswith("-"):
        raise _refuse(
            rel,
            number,
            f"option '{head}' is not allowed in a lock file (only name==version "
            "entries with --hash=sha256:… and comments)",
            stack_name,
        )
    if (
        "://" in head
        or "@" in head
        or words[1:2] == ["@"]
        or head.startswith((".", "/", "~"))
        or head.endswith((".whl", ".zip", ".tar.gz"))
    ):
        raise _refuse(
            rel,
            number,
            f"'{head}' is a URL or path requirement; a lock lists only name==version entries with --hash=sha256:…",
            stack_name,
        )
    m = ENTRY.match(head)
    if not m:
        raise _refuse(rel, number, f"'{head}' is not an exact name==version pin", stack_name)
    try:
        Version(m.group("version"))
    except InvalidVersion:
        raise _refuse(rel, number, f"'{m.group('version')}' is not a PEP 440 version", stack_name) from None
    hashes = []
    for word in words[1:]:
        h = HASH.match(word)
        if not h:
            raise _refuse(
                rel, number, f"'{word}' after {head} is not allowed (only --hash=sha256:<64 hex digits>)", stack_name
            )
        hashes.append(h.group(1))
    if not hashes:
        raise _refuse(
            rel, number, f"{head} has no --hash=sha256:… (every entry of a lock carries its hashes)", stack_name
        )
    return canonicalize_name(m.group("name")), m.group("version"), hashes


def _via_names(rest: str) -> set[str]:
    rest = rest.strip()
    if rest.startswith("-r ") or rest.startswith("-c "):
        return {"-r " + rest[3:].strip().split()[0]}
    return {canonicalize_name(rest.split()[0])} if rest else set()


def parse_lock(path: Path, text: str, rel: str | None = None, stack_name: str | None = None) -> Lock:
    """Read a lock strictly: blank lines, ``#`` comments and ``name==version --hash=sha256:…`` entries
    (with backslash continuations) are all it may hold; pip-compile's ``# via`` comments are kept per entry.
    Anything else — options, URLs, paths, ranges, duplicates, entries without hashes — is a UserError
    naming the file and line."""
    rel = rel or str(path)
    lock = Lock(path, text, {})
    last: str | None = None
    in_via = False
    for number, line in _logical_lines(text):
        line = line.strip()
        if not line:
            in_via = False
            continue
        if line.startswith("#"):
            via, more = VIA.match(line), VIA_MORE.match(line)
            if last is not None and via:
                lock.via[last] |= _via_names(via.group("rest") or "")
                in_via = not via.group("rest")
            elif last is not None and in_via and more:
                lock.via[last] |= _via_names(more.group("rest"))
            else:
                in_via = False
            continue
        code = COMMENT.sub("", line).strip()
        if not code:
            continue
        name, version, hashes = _entry(rel, number, code, stack_name)
        if name in lock.pins:
            raise _refuse(rel, number, f"{name} is listed twice (also on line {lock.lines[name]})", stack_name)
        lock.pins[name], lock.lines[name], lock.via[name] = (version, hashes), number, set()
        last, in_via = name, False
    return lock


def _required_by_pins(lock: Lock, pins: set[str]) -> set[str]:
    """The entries ``pins`` (names, or ``-r <input>`` labels) lead to through the ``# via`` annotations.

    ``requirements.in`` holds only the pins, so ``via -r requirements.in`` admits nothing else."""
    reached = set(pins)
    changed = True
    while changed:
        changed = False
        for name, via in lock.via.items():
            if name not in reached and via & reached:
                reached.add(name)
                changed = True
    return reached


def verify_lock(loaded: LoadedStack, index: str, lock: Lock, rel: str) -> None:
    """The lock lists every pin of ``index`` once at its version, and nothing the stack does not lead to:
    a vendor index's lock holds exactly its pins; a public index's lock may add only packages that a pin,
    one of its :func:`public_inputs` or a vendor pin requires (by the ``# via`` annotations), and none that
    another index of the stack provides; a vendor's dependency lock (``<vendor>-deps``) only packages its
    pins require, and no pin of the stack."""
    stack = loaded.model
    fix_name = lock_command(loaded).removeprefix("stackforge lock ")
    deps_of = index[: -len(DEPS)] if index not in stack.indexes and index.endswith(DEPS) else None
    made = TARGET.search(lock.text.split("\n", 1)[0])
    if made and made.group(1) != resolve.Target.of(stack).describe():
        raise _refuse(
            rel,
            1,
            f"the lock was resolved for {made.group(1)}, but the stack targets "
            f"{resolve.Target.of(stack).describe()} (platform.python, platform.os, platform.arch)",
            fix_name,
        )
    reqlocks.verify_header(stack, index, lock, rel)
    pins = {canonicalize_name(n): p for n, p in stack.packages.items() if p.index == index}
    for cname, pkg in pins.items():
        have = lock.pins.get(cname)
        if have is None or not localver.matches(pkg.version, have[0]):
            found = f"has {have[0]}" if have else "does not list it"
            raise UserError(
                f"lock file is stale: {cname} is pinned at {pkg.version} but the lock {found}",
                file=rel,
                line=lock.lines.get(cname),
                fix=f"run: stackforge lock {fix_name}",
            )
    other: dict[str, str] = {canonicalize_name(n): p.index for n, p in stack.packages.items() if p.index != index}
    for name, line in lock.lines.items():
        if name in other:
            where = "a pin of the stack: it is not a dependency to lock here" if deps_of else f"not from '{index}'"
            raise _refuse(rel, line, f"{name} comes from index '{other[name]}' in this stack, {where}", fix_name)
    extra = set(lock.pins) - set(pins)
    vendors = set(vendor_names(stack))
    if deps_of is not None:
        allowed = _required_by_pins(
            lock, {canonicalize_name(n) for n, p in stack.packages.items() if p.index == deps_of} | vendors
        )
        why = f" and no pin of '{deps_of}' requires it (no `# via` chain from a pin)"
    elif stack.indexes[index].role == "vendor":
        allowed, why = set(), ""
    else:
        labels = {"-r " + i.label for i in public_inputs(loaded, index)} - {REQUIREMENTS_IN}
        allowed = _required_by_pins(lock, set(pins) | vendors | labels)
        why = " and no pin requires it (no `# via` chain from a pin)"
    for name in sorted(extra - allowed, key=lambda n: lock.lines[n]):
        raise _refuse(rel, lock.lines[name], f"{name} is not a pin of index '{deps_of or index}'" + why, fix_name)


def expects_lock(stack: Stack, index: str) -> bool:
    """The stack declares (``indexes.<index>.lock: true``) that this index installs from a lock."""
    return bool(getattr(stack.indexes[index], "lock", False)) and any(p.index == index for p in stack.packages.values())


def lock_keys(stack: Stack) -> list[str]:
    """Every lock a stack may have: one per index, and ``<vendor>-deps`` per vendor index with ``deps_from``."""
    keys = list(stack.indexes)
    keys += [v + DEPS for v, idx in stack.indexes.items() if idx.role == "vendor" and idx.deps_from]
    return keys


def confined(loaded: LoadedStack, path: Path, rel: str) -> Path:
    """``path`` (a lock file or where one goes), refused when it resolves outside the repository's ``stacks/``:
    a symlinked lock file or locks directory pointing elsewhere is neither read nor written through."""
    stacks = (loaded.root / "stacks").resolve()
    real = path.resolve()
    if not real.is_relative_to(stacks):
        raise UserError(
            f"the lock file resolves (through a symlink) to {printable(real)}, outside "
            f"{printable(stacks)}; it is neither "
            "read nor written",
            file=rel,
            fix=f"replace the link with the lock file itself (run: {lock_command(loaded)})",
        )
    return path


def read_lock(loaded: LoadedStack, key: str) -> Lock | None:
    """The lock file of ``key`` read, parsed strictly and checked against the stack's pins (None when there is
    none): what render, build and lint all check. A UserError names the file, the line and the fix."""
    stack = loaded.model
    path = lock_path(loaded, key)
    rel = str(path.relative_to(loaded.root))
    if not path.is_file():
        return None
    confined(loaded, path, rel)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise _refuse(rel, None, "the lock file is not UTF-8 text", stack.name) from None
    lock = parse_lock(path, text, rel, stack.name)
    verify_lock(loaded, key, lock, rel)
    return lock


def read_locks(loaded: LoadedStack) -> dict[str, Lock]:
    """The stack's lock files, parsed strictly and checked against its pins (:func:`read_lock`). {lock key: Lock}

    An index declared ``lock: true`` whose lock file is missing is an error (for a vendor index with
    ``deps_from``, its dependency lock too): losing the file never silently drops ``--require-hashes``."""
    stack = loaded.model
    out: dict[str, Lock] = {}
    for key in lock_keys(stack):
        index = key[: -len(DEPS)] if key not in stack.indexes else key
        lock = read_lock(loaded, key)
        if lock is None:
            if expects_lock(stack, index):
                raise UserError(
                    f"index '{index}' is declared `lock: true` but its lock file is missing; nothing was built",
                    file=str(lock_path(loaded, key).relative_to(loaded.root)),
                    fix=f"run: {lock_command(loaded)} (or restore the file from version control)",
                )
            continue
        out[key] = lock
    return out


def _pins(stack: Stack, index: str) -> list[str]:
    return [f"{n}=={p.version}" for n, p in stack.packages.items() if p.index == index]


def _entry_text(node: resolve.Resolved, via: set[str]) -> str:
    lines = [f"{node.name}=={node.version} \\\n    --hash=sha256:{node.sha256}\n"]
    names = sorted(via, key=lambda v: (not v.startswith("-r "), v))
    if len(names) == 1:
        lines.append(f"    # via {names[0]}\n")
    elif names:
        lines.append("    # via\n" + "".join(f"    #   {v}\n" for v in names))
    return "".join(lines)


def _requested_by(inputs: list[resolve.Input]) -> dict[str, str]:
    """Canonical name -> the label of the first input that names it."""
    out: dict[str, str] = {}
    for inp in inputs:
        lines = list(inp.lines) + (inp.file.read_text().splitlines() if inp.file is not None else [])
        for line in lines:
            line = COMMENT.sub("", line).strip()
            m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
            if m and not line.startswith("-"):
                out.setdefault(canonicalize_name(m.group(0)), inp.label)
    return out


def lock_public(
    loaded: LoadedStack, index: str, workspace: Workspace | None = None, trees: dict[str, Path] | None = None
) -> dict[str, str]:
    """Resolve :func:`public_inputs` of ``index`` with uv for the stack's Python and platform, the vendor
    pins held at their exact versions (``builder/plan/resolve.py``). {lock key: text}: the index's lock, and
    ``<vendor>-deps`` for each vendor whose ``deps_from`` is this index (what only its pins require).
    The index's credential (the workspace's resolver) reaches uv only through a private temporary
    directory that is removed afterwards; uv's messages are redacted. uv and the vendor wheels' metadata
    reach the index through the workspace's CA bundle."""
    stack, ws = loaded.model, workspace_for(loaded, workspace)
    if trees is None and reqlocks.sources(stack, index):
        with reqlocks.exported(loaded, reqlocks.upstreams_needed(stack, index), ws) as exported:
            return lock_public(loaded, index, ws, exported)
    uv = pip.find_uv()
    url = stack.indexes[index].url
    credential = ws.index_credential(loaded, index)
    ca_bundle = ws.ca_bundle_file()
    target = resolve.Target.of(stack)
    vendors = vendor_names(stack)
    inputs = public_inputs(loaded, index, trees)
    deps_vendors = _deps_vendors(stack, index)
    with credentials.private_dir("stackforge-lock-") as tmp:
        stubs = tmp / "vendor-wheels"
        stubs.mkdir()
        for name, pkg in stack.packages.items():
            if canonicalize_name(name) in vendors:
                meta = resolve.vendor_metadata(
                    stack,
                    pkg.index,
                    name,
                    pkg.version,
                    target,
                    ws.cache("wheel-metadata"),
                    ws.index_credential(loaded, pkg.index),
                    ca_bundle,
                )
                resolve.stub_wheel(stubs, name, pkg.version, meta)
        env = pip.uv_env(tmp, url, credential, ca_bundle, ws.cache("uv"))
        nodes = resolve.run_uv(
            uv, tmp, target, env, inputs, vendors, stubs, lambda text: scrub(text, credential), stack, index, credential
        )
        stub_url = stubs.as_uri()
        stub_files = {p.as_uri() for p in stubs.iterdir()} | {str(p) for p in stubs.iterdir()}
    for name, version in vendors.items():
        node = nodes.get(name)
        if node is not None and (
            not localver.matches(version, node.version) or not (node.url.startswith(stub_url) or node.url in stub_files)
        ):
            raise UserError(
                f"the resolution of index '{index}' took {name} {node.version} from {redact(node.url)}, "
                f"not the vendor pin {version}",
                fix="check the vendor pins and the public requirements",
            )
    requested = _requested_by(inputs)
    via: dict[str, set[str]] = {n: set(node.via) for n, node in nodes.items()}
    for name, node in nodes.items():
        if node.requested and name not in vendors:
            via[name].add("-r " + requested.get(name, inputs[0].label))
    public_roots = {n for n in nodes if n not in vendors and nodes[n].requested}
    public = resolve.reach(nodes, public_roots) - set(vendors)
    texts: dict[str, str] = {}
    kind = f"for {target.describe()}"
    held = f"; the {len(vendors)} vendor pins held at their exact versions and left out" if vendors else ""
    head = (
        f"# Lock of the '{index}' requirements of stack '{stack.name}' {kind}, made by "
        f"`{lock_command(loaded)}`\n# (uv's resolver against {redact(url)}{held}). Do not edit.\n"
        + reqlocks.header(stack, index, inputs)
        + held_block(stack, index)
    )
    taken = set(public)
    for vendor in deps_vendors:
        own: set[str] = {canonicalize_name(n) for n, p in stack.packages.items() if p.index == vendor}
        mine = sorted(resolve.reach(nodes, own) - set(vendors) - taken)
        taken |= set(mine)
        texts[vendor + DEPS] = (
            f"# Lock of the dependencies of the '{vendor}' wheels of stack '{stack.name}' {kind}, from index "
            f"'{index}',\n# made by `{lock_command(loaded)}` in the same resolution as {index}.txt. "
            "Do not edit.\n" + held_block(stack, index) + "".join(_entry_text(nodes[n], via[n]) for n in mine)
        )
    for name in sorted(taken):
        if not nodes[name].sha256:
            raise UserError(
                f"index '{index}' gives no sha256 for {name}=={nodes[name].version} "
                f"({redact(nodes[name].url)}); a lock needs each file's hash",
                fix="use an index that publishes file hashes (PEP 503 #sha256= or PEP 691 hashes)",
            )
    left = sorted(set(nodes) - taken - set(vendors))
    texts[index] = head + "".join(_entry_text(nodes[n], via[n]) for n in sorted(public | set(left)))
    return {k: scrub(v, credential) for k, v in texts.items()}


def lock_vendor(loaded: LoadedStack, index: str, workspace: Workspace | None = None) -> str:
    """Hashes of the exact pins as the vendor index lists them."""

    stack, ws = loaded.model, workspace_for(loaded, workspace)
    idx = stack.indexes[index]
    client = IndexClient(idx.url, credential=ws.index_credential(loaded, index))
    lines = [
        f"# Lock of the '{index}' pins of stack '{stack.name}', made by `{lock_command(loaded)}`\n"
        f"# from the index's own file hashes ({redact(idx.url)}). Do not edit.\n"
    ]
    for name, pkg in stack.packages.items():
        if pkg.index != index:
            continue
        files = client.project(name).files_for(pkg.version)
        hashes = sorted({f.sha256 for f in files if f.sha256})
        if not hashes:
            raise UserError(
                f"index '{index}' lists no hashed file for {name}=={pkg.version}",
                fix="check the pin, or leave this index unlocked",
            )
        lines.append(f"{name}=={pkg.version}" + "".join(f" \\\n    --hash=sha256:{h}" for h in hashes) + "\n")
    return "".join(lines)


def write_locks(
    loaded: LoadedStack, indexes: list[str] | None = None, workspace: Workspace | None = None
) -> list[Path]:
    """Lock each index (all by default); locking a public index also writes the dependency lock of every
    vendor whose ``deps_from`` it is. Every lock is checked as the build reads it before any is written.
    Indexes are reached with the workspace's credentials and CA bundle (default: the one at the stack's root)."""
    stack, ws = loaded.model, workspace_for(loaded, workspace)
    texts: dict[str, str] = {}
    todo = []
    for index in indexes or list(stack.indexes):
        if index not in stack.indexes:
            raise UserError(
                f"stack '{stack.name}' has no index '{index}'",
                file="--index",
                fix=f"use one of: {', '.join(stack.indexes)}",
            )
        role = stack.indexes[index].role
        if _pins(stack, index) or (role == "public" and _deps_vendors(stack, index)):
            todo.append(index)
    if any(stack.indexes[i].role == "public" for i in todo):
        pip.find_uv()  # before any export: an install without uv says so at once
    # the trees the requirement phases of the public indexes read, exported and patched as the build does
    need = [
        n
        for n in reqlocks.upstreams_needed(stack)
        if any(stack.indexes[i].role == "public" and n in reqlocks.upstreams_needed(stack, i) for i in todo)
    ]
    with contextlib.ExitStack() as scope:
        trees: dict[str, Path] = {}
        if need:
            with progress.step(f"lock {stack.name}: export and patch {', '.join(need)} for the requirement files"):
                trees = scope.enter_context(reqlocks.exported(loaded, need, ws))
        for index in todo:
            role = stack.indexes[index].role
            how = "resolve (uv) for" if role == "public" else "read the file hashes of"
            with progress.step(f"lock {stack.name}: {how} index '{index}' ({redact(stack.indexes[index].url)})"):
                texts.update(
                    lock_public(loaded, index, ws, trees)
                    if role == "public"
                    else {index: lock_vendor(loaded, index, ws)}
                )
    for key, text in texts.items():
        path = lock_path(loaded, key)
        rel = str(path.relative_to(loaded.root))
        verify_lock(loaded, key, parse_lock(path, text, rel, stack.name), rel)  # never write a lock the build refuses
        confined(loaded, path.parent, rel)  # nor one through a locks directory linked out of stacks/
    written = []
    for key, text in texts.items():
        path = lock_path(loaded, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written


# --------------------------------------------------------------------------- held pins, --check, notes

HELD_HEAD = "# held (the other pins of the stack, which the resolution held at their versions):"
HELD_ITEM = re.compile(r"^#\s+(?P<name>[A-Za-z0-9][\w.-]*)==(?P<version>\S+) \(index '(?P<index>[^']+)'\)$")


def held_pins(stack: Stack, index: str) -> dict[str, tuple[str, str, str]]:
    """Canonical name -> (name, version, index) of every pin the resolution of public ``index`` holds: the
    pins of every other index of the stack (vendor pins as stand-ins, public pins as constraints)."""
    return {canonicalize_name(n): (n, p.version, p.index) for n, p in stack.packages.items() if p.index != index}


def held_block(stack: Stack, index: str) -> str:
    """The header lines recording :func:`held_pins` (``none`` when the stack has no other pin)."""
    held = held_pins(stack, index)
    if not held:
        return HELD_HEAD + " none\n"
    return HELD_HEAD + "\n" + "".join(f"#   {n}=={v} (index '{i}')\n" for _, (n, v, i) in sorted(held.items()))


def recorded_held(text: str) -> tuple[int, dict[str, tuple[str, str, str]]] | None:
    """(line, held pins) a lock's header records, or None when it records none (made before it did)."""
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.startswith(HELD_HEAD):
            continue
        out: dict[str, tuple[str, str, str]] = {}
        if line[len(HELD_HEAD) :].strip() != "none":
            for more in lines[number:]:
                m = HELD_ITEM.match(more)
                if not m:
                    break
                out[canonicalize_name(m.group("name"))] = (m.group("name"), m.group("version"), m.group("index"))
        return number, out
    return None


@dataclass
class Stale:
    """One checked-in lock that is not current for its inputs (or a public index with neither a lock nor the
    reason it has none)."""

    rel: str
    line: int | None
    message: str
    fix: str | None = None

    def render(self, stack: str) -> str:
        where = f"{self.rel}:{self.line}" if self.line else self.rel
        return f"stale: {where}: {self.message}\n  fix: {self.fix or f'run: stackforge lock {stack} (and review its diff)'}"


def _plain(message: str) -> str:
    return message.removeprefix("lock file is stale: ").removesuffix("; the lock was not used")


def _resolution_index(stack: Stack, key: str) -> str | None:
    """The public index whose resolution made the lock ``key`` (None for a vendor index's own lock)."""
    if key in stack.indexes:
        return key if stack.indexes[key].role == "public" else None
    return stack.indexes[key[: -len(DEPS)]].deps_from


def _held_moves(stack: Stack, index: str, made: dict[str, tuple[str, str, str]]) -> list[str]:
    now = held_pins(stack, index)
    out = []
    for name in sorted(set(made) | set(now)):
        if name not in now:
            out.append(
                f"{made[name][0]}=={made[name][1]} (index '{made[name][2]}') was held by the resolution, and "
                "the stack no longer pins it"
            )
        elif name not in made:
            out.append(
                f"packages.{now[name][0]} ({now[name][0]}=={now[name][1]}, index '{now[name][2]}') is a pin "
                "the resolution did not hold"
            )
        elif made[name][1:] != now[name][1:]:
            out.append(
                f"packages.{now[name][0]} moved: the resolution held {made[name][0]}=={made[name][1]} "
                f"(index '{made[name][2]}'), the stack pins {now[name][1]} (index '{now[name][2]}')"
            )
    return out


def check_stack(
    loaded: LoadedStack, sources: bool = False, workspace: Workspace | None = None, indexes: list[str] | None = None
) -> tuple[list[Path], list[Stale], list[str]]:
    """``stackforge lock --check``: is every checked-in lock of the stack current for its inputs? Writes nothing.

    Offline, from the stack and the lock files alone: each lock parses and passes the build's own checks
    (:func:`verify_lock`: its pins at the stack's versions, the target it was resolved for, the requirement
    files its index's phases read), and the other pins of the stack its resolution held are the ones the lock
    recorded (``# held``); an index declared ``lock: true`` has its lock, and a public index with pins or
    requirement files has one or says why not (``indexes.<name>.unlocked``, a note). With ``sources``, the upstreams are
    exported and patched as the build does (their cache or their remotes) and each requirement file's
    flattened digest is compared with the lock's header (:func:`reqlocks.check_fresh`). The file hashes of a
    vendor lock and what the index serves now are not checked (that is `stackforge lock`'s work).
    Returns (locks checked, stale ones, notes)."""
    stack = loaded.model
    checked: list[Path] = []
    stale: list[Stale] = []
    notes: list[str] = []
    fresh: dict[str, Lock] = {}
    for key in lock_keys(stack):
        index = key[: -len(DEPS)] if key not in stack.indexes else key
        if indexes and index not in indexes:
            continue
        path = lock_path(loaded, key)
        rel = str(path.relative_to(loaded.root))
        if not path.is_file():
            if expects_lock(stack, index):
                stale.append(Stale(rel, None, f"index '{index}' is declared `lock: true` but its lock file is missing"))
            continue
        checked.append(path)
        try:
            lock = read_lock(loaded, key)  # as render, build and lint read it
        except UserError as err:
            stale.append(Stale(rel, err.line, _plain(err.message)))
            continue
        assert lock is not None
        text = lock.text
        made_by = _resolution_index(stack, key)
        if made_by is None:
            continue
        held = recorded_held(text)
        if held is None:
            stale.append(
                Stale(
                    rel,
                    1,
                    "it records no `# held` pins (made before `stackforge lock` recorded the "
                    "other pins its resolution held), so it cannot be checked",
                )
            )
        else:
            for moved in _held_moves(stack, made_by, held[1]):
                stale.append(Stale(rel, held[0], moved))
        if key in stack.indexes and reqlocks.sources(stack, key):
            fresh[key] = lock
    if fresh and sources:
        need = [
            n for n in reqlocks.upstreams_needed(stack) if any(n in reqlocks.upstreams_needed(stack, k) for k in fresh)
        ]
        with reqlocks.exported(loaded, need, workspace_for(loaded, workspace)) as trees:
            for key, lock in fresh.items():
                try:
                    reqlocks.check_fresh(loaded, {key: lock}, trees)
                except UserError as err:
                    stale.append(Stale(str(lock.path.relative_to(loaded.root)), err.line, _plain(err.message)))
    for index in unlocked_indexes(loaded):
        if indexes and index not in indexes:
            continue
        reason = stack.indexes[index].unlocked
        rel = str(lock_path(loaded, index).relative_to(loaded.root))
        if reason is None:
            stale.append(
                Stale(
                    rel,
                    None,
                    f"index '{index}' (public) installs without hashes: it has no lock and no "
                    f"indexes.{index}.unlocked reason",
                    f"run: {lock_command(loaded)}, or declare indexes.{index}.unlocked: <why it cannot be "
                    "locked> in the stack",
                )
            )
        else:
            notes.append(f"note: index '{index}' of {stack.name} is unlocked: {reason}")
    if fresh and not sources:
        names = ", ".join(sorted({label for k in fresh for label in reqlocks.sources(stack, k)}))
        rels = ", ".join(str(lock_path(loaded, k).relative_to(loaded.root)) for k in fresh)
        notes.append(
            f"note: the requirement files of {rels} ({names}) were checked by name, not re-read: add "
            "--sources to export the upstreams and compare their digests (the build does at every assemble)"
        )
    return checked, stale, notes


def unlocked_indexes(loaded: LoadedStack) -> list[str]:
    """The public indexes of the stack whose phases install without a lock: with pins, requirement files, or the
    dependencies of a vendor index (``deps_from``), and no lock file."""
    stack = loaded.model
    out = []
    for index, idx in stack.indexes.items():
        if idx.role != "public" or lock_path(loaded, index).is_file():
            continue
        if _pins(stack, index) or reqlocks.sources(stack, index) or _deps_vendors(stack, index):
            out.append(index)
    return out


def unlocked_notes(loaded: LoadedStack) -> list[str]:
    """One ``note:`` per public index of the stack whose phases install without a lock (no
    ``--require-hashes``): the reason the stack gives (``indexes.<name>.unlocked``), else how to lock it."""
    stack = loaded.model
    out = []
    for index in unlocked_indexes(loaded):
        reason = stack.indexes[index].unlocked
        if reason is not None:
            out.append(
                f"note: index '{index}' of {stack.name} has no lock: its phases install without hashes, because "
                f"{reason} (indexes.{index}.unlocked)"
            )
        else:
            out.append(
                f"note: index '{index}' of {stack.name} has no lock: its phase installs without hashes "
                f"(run: {lock_command(loaded)})"
            )
    return out


def check_locks(loaded: LoadedStack) -> list[Finding]:
    """An index declared ``lock: true`` has its lock file: deleting it never drops ``--require-hashes``; and
    each lock file passes the check render and build make before they use it (``build/locks.read_lock``)."""
    stack = loaded.model
    out = _unhashed_installer(loaded)
    for key in lock_keys(stack):
        name = key if key in stack.indexes else key[: -len(DEPS)]
        path = lock_path(loaded, key)
        try:
            read_lock(loaded, key)
        except UserError as err:
            out.append(
                Finding(
                    "lock",
                    err.message.removesuffix("; the lock was not used"),
                    ("indexes", name, "lock"),
                    err.fix or f"run: {lock_command(loaded)}",
                    file=str(err.file or path.relative_to(loaded.root).as_posix()),
                    line=err.line,
                )
            )
            continue
        if expects_lock(stack, name) and not path.is_file():
            rel = path.relative_to(loaded.root).as_posix()
            out.append(
                Finding(
                    "lock",
                    f"index '{name}' is declared `lock: true` but {rel} is missing",
                    ("indexes", name, "lock"),
                    f"run: {lock_command(loaded)} (or restore {rel} from version control)",
                )
            )
    return out


def _unhashed_installer(loaded: LoadedStack) -> list[Finding]:
    """A stack whose public index installs from a lock (with hashes) pins its installer with a hash too: the
    installer phase (``base.pip``) comes from that index before every other phase."""
    stack = loaded.model
    pip = stack.base.pip
    public = next((n for n, i in stack.indexes.items() if i.role == "public"), None)
    if pip is None or pip.sha256 or public is None:
        return []
    if not (expects_lock(stack, public) or lock_path(loaded, public).is_file()):
        return []
    return [
        Finding(
            "lock",
            f"index '{public}' installs from a lock with hashes, but base.pip names no sha256: the installer phase "
            f"would fetch pip {pip.version} without one",
            ("base", "pip"),
            f'give base.pip: {{version: "{pip.version}", sha256: [<sha256 of pip-{pip.version}-py3-none-any.whl '
            f"on '{public}'>]}}",
        )
    ]
