"""Lock files: the hashes each pip phase must see, per stack and index.

``stacks/locks/<stack>/<index>.txt`` is a requirements file with ``--hash`` lines.
When it exists, that index's pip phase installs from it with ``--require-hashes``; an
index declared ``lock: true`` in the stack must have one.

- a public index is locked with pip-tools (``pip-compile --generate-hashes``),
  which pins and hashes the whole resolution; packages that a vendor index of the
  stack provides are left out (``--unsafe-package``), so the public lock can never
  pull e.g. a PyPI build of torch over the vendor's;
- a vendor index (installed ``--no-deps``) is locked from the index's own file
  hashes (PEP 691/503) for the exact pins.

A lock holds only ``name==version --hash=sha256:…`` entries and comments: any option,
URL, path, range, duplicate or unhashed entry, a pin missing from it, or a package no pin
leads to is an error naming the lock file and line, and the lock is not used.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge import credentials, progress
from stackforge.errors import UserError
from stackforge.stack.load import stack_root
from stackforge.stack.model import Stack
from stackforge.urls import redact, scrub

ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9._+!-]+)$")
HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
VIA = re.compile(r"^#\s*via(?:\s+(?P<rest>.*))?$")
VIA_MORE = re.compile(r"^#\s{2,}(?P<rest>\S.*)$")
REQUIREMENTS_IN = "-r requirements.in"
COMMENT = re.compile(r"(^|\s+)#.*$")  # pip's own comment pattern


@dataclass
class Lock:
    path: Path
    text: str
    pins: dict[str, tuple[str, list[str]]]  # canonical name -> (version, sha256 hashes)
    lines: dict[str, int] = field(default_factory=dict)  # canonical name -> line of its entry
    via: dict[str, set[str]] = field(default_factory=dict)  # canonical name -> what requires it (pip-compile)


def lock_path(stack: Stack, index: str) -> Path:
    return stack_root(stack) / "stacks" / "locks" / stack.name / f"{index}.txt"


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
        raise _refuse(rel, number, f"option '{head}' is not allowed in a lock file (only name==version "
                      "entries with --hash=sha256:… and comments)", stack_name)
    if "://" in head or "@" in head or words[1:2] == ["@"] or head.startswith((".", "/", "~")) or head.endswith(
            (".whl", ".zip", ".tar.gz")):
        raise _refuse(rel, number, f"'{head}' is a URL or path requirement; a lock lists only name==version "
                      "entries with --hash=sha256:…", stack_name)
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
            raise _refuse(rel, number, f"'{word}' after {head} is not allowed (only --hash=sha256:<64 hex digits>)",
                          stack_name)
        hashes.append(h.group(1))
    if not hashes:
        raise _refuse(rel, number, f"{head} has no --hash=sha256:… (every entry of a lock carries its hashes)",
                      stack_name)
    return canonicalize_name(m.group("name")), m.group("version"), hashes


def _via_names(rest: str) -> set[str]:
    rest = rest.strip()
    if rest.startswith("-r ") or rest.startswith("-c "):
        return {REQUIREMENTS_IN}
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
    """The entries a pin of the index leads to through pip-compile's ``# via`` annotations.

    ``requirements.in`` holds only the pins, so ``via -r requirements.in`` admits nothing else."""
    reached = set(pins) & set(lock.pins)
    changed = True
    while changed:
        changed = False
        for name, via in lock.via.items():
            if name not in reached and via & reached:
                reached.add(name)
                changed = True
    return reached


def verify_lock(stack: Stack, index: str, lock: Lock, rel: str) -> None:
    """The lock lists every pin of ``index`` once at its version, and nothing the stack does not lead to:
    a vendor index's lock holds exactly its pins; a public index's lock may add only packages that a pin
    requires (by pip-compile's ``# via`` annotations) and none that another index of the stack provides."""
    fix_name = stack.name
    pins = {canonicalize_name(n): p for n, p in stack.packages.items() if p.index == index}
    for cname, pkg in pins.items():
        have = lock.pins.get(cname)
        if have is None or have[0] != pkg.version:
            found = f"has {have[0]}" if have else "does not list it"
            raise UserError(f"lock file is stale: {cname} is pinned at {pkg.version} but the lock {found}",
                            file=rel, line=lock.lines.get(cname), fix=f"run: stackforge lock {fix_name}")
    other: dict[str, str] = {canonicalize_name(n): p.index for n, p in stack.packages.items() if p.index != index}
    for name, line in lock.lines.items():
        if name in other:
            raise _refuse(rel, line, f"{name} comes from index '{other[name]}' in this stack, not from '{index}'",
                          fix_name)
    extra = set(lock.pins) - set(pins)
    if stack.indexes[index].role == "vendor":
        allowed: set[str] = set()
    else:
        allowed = _required_by_pins(lock, set(pins))
    for name in sorted(extra - allowed, key=lambda n: lock.lines[n]):
        raise _refuse(rel, lock.lines[name], f"{name} is not a pin of index '{index}'"
                      + ("" if stack.indexes[index].role == "vendor" else
                         " and no pin requires it (no `# via` chain from a pin)"), fix_name)


def expects_lock(stack: Stack, index: str) -> bool:
    """The stack declares (``indexes.<index>.lock: true``) that this index installs from a lock."""
    return bool(getattr(stack.indexes[index], "lock", False)) and any(
        p.index == index for p in stack.packages.values())


def read_locks(stack: Stack) -> dict[str, Lock]:
    """The stack's lock files, parsed strictly and checked against its pins. {index name: Lock}

    An index declared ``lock: true`` whose lock file is missing is an error: losing the file never
    silently drops ``--require-hashes``."""
    out: dict[str, Lock] = {}
    for index in stack.indexes:
        path = lock_path(stack, index)
        rel = str(path.relative_to(stack_root(stack)))
        if not path.is_file():
            if expects_lock(stack, index):
                raise UserError(f"index '{index}' is declared `lock: true` but its lock file is missing; "
                                "nothing was built", file=rel, fix=f"run: stackforge lock {stack.name} "
                                "(or restore the file from version control)")
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise _refuse(rel, None, "the lock file is not UTF-8 text", stack.name) from None
        lock = parse_lock(path, text, rel, stack.name)
        verify_lock(stack, index, lock, rel)
        out[index] = lock
    return out


def _pins(stack: Stack, index: str) -> list[str]:
    return [f"{n}=={p.version}" for n, p in stack.packages.items() if p.index == index]


def _pip_credentials(tmp: Path, url: str, credential) -> dict[str, str]:
    """Environment that gives pip the index credential through files in the private directory ``tmp``
    (never on the command line, never in the lock): a netrc (``NETRC``) for user/password, and a pip
    configuration file holding the index URL when the credential has query parameters."""
    env = {"PIP_CONFIG_FILE": os.devnull}
    if credential is None:
        return env
    text = credentials.netrc_entries([(url, credential)])
    if text:
        env["NETRC"] = str(credentials.write_secret(tmp / "netrc", text))
    if credential.query:
        conf = credentials.write_secret(tmp / "pip.conf", f"[global]\nindex-url = {credential.with_query(url)}\n")
        env["PIP_CONFIG_FILE"] = str(conf)
    return env


def lock_public(stack: Stack, index: str, ca_bundle: str | None = None) -> str:
    """pip-compile the index's pins with hashes; vendor-provided packages stay out of the lock.
    The index's credential (``credentials.for_index``) reaches pip only through a private temporary
    directory that is removed afterwards; pip's messages are redacted."""
    url = stack.indexes[index].url
    credential = credentials.for_index(stack, index)
    vendor = [n for n, p in stack.packages.items() if stack.indexes[p.index].role == "vendor"]
    with credentials.private_dir("stackforge-lock-") as tmp:
        req_in = tmp / "requirements.in"
        req_in.write_text("\n".join(_pins(stack, index)) + "\n")
        out = tmp / "requirements.txt"
        index_args = [] if credential is not None and credential.query else ["--index-url", url]
        cmd = [sys.executable, "-m", "piptools", "compile", "--quiet", "--generate-hashes", "--allow-unsafe",
               "--no-header", "--no-emit-index-url", "--no-emit-find-links", "--strip-extras", *index_args,
               "--output-file", str(out), *[a for n in vendor for a in ("--unsafe-package", n)], str(req_in)]
        # Only the stack's index counts: no pip configuration of this host leaks into the lock.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "NETRC"}
        env.update(_pip_credentials(tmp, url, credential))
        env.update(CUSTOM_COMPILE_COMMAND=f"stackforge lock {stack.name}")
        if ca_bundle:
            env["PIP_CERT"] = ca_bundle
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
        if proc.returncode != 0:
            raise UserError(f"pip-compile failed for index '{index}': {scrub(proc.stderr, credential).strip()[-800:]}",
                            fix="check the pins and that the index is reachable (and its credentials: "
                                "user:password@ in its URL, STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD or ~/.netrc)")
        text = out.read_text().replace(str(req_in), "requirements.in")
    header = (f"# Lock of the '{index}' pins of stack '{stack.name}', made by `stackforge lock {stack.name}`\n"
              f"# (pip-compile --generate-hashes against {redact(url)}). Do not edit.\n")
    return header + scrub(text, credential)


def lock_vendor(stack: Stack, index: str) -> str:
    """Hashes of the exact pins as the vendor index lists them."""
    from stackforge.freshness.index import IndexClient

    idx = stack.indexes[index]
    client = IndexClient(idx.url, credential=credentials.for_index(stack, index))
    lines = [f"# Lock of the '{index}' pins of stack '{stack.name}', made by `stackforge lock {stack.name}`\n"
             f"# from the index's own file hashes ({redact(idx.url)}). Do not edit.\n"]
    for name, pkg in stack.packages.items():
        if pkg.index != index:
            continue
        files = client.project(name).files_for(pkg.version)
        hashes = sorted({f.sha256 for f in files if f.sha256})
        if not hashes:
            raise UserError(f"index '{index}' lists no hashed file for {name}=={pkg.version}",
                            fix="check the pin, or leave this index unlocked")
        lines.append(f"{name}=={pkg.version}" + "".join(f" \\\n    --hash=sha256:{h}" for h in hashes) + "\n")
    return "".join(lines)


def write_locks(stack: Stack, indexes: list[str] | None = None, ca_bundle: str | None = None) -> list[Path]:
    written = []
    for index in indexes or list(stack.indexes):
        if index not in stack.indexes:
            raise UserError(f"stack '{stack.name}' has no index '{index}'", file="--index",
                            fix=f"use one of: {', '.join(stack.indexes)}")
        if not _pins(stack, index):
            continue
        role = stack.indexes[index].role
        how = "pip-compile" if role == "public" else "read the file hashes of"
        with progress.step(f"lock {stack.name}: {how} index '{index}' ({redact(stack.indexes[index].url)})"):
            text = lock_public(stack, index, ca_bundle) if role == "public" else lock_vendor(stack, index)
        path = lock_path(stack, index)
        rel = str(path.relative_to(stack_root(stack)))
        verify_lock(stack, index, parse_lock(path, text, rel, stack.name), rel)  # never write a lock the build refuses
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".txt.partial")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written
