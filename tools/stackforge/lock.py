"""Lock files: the hashes each pip phase must see, per stack and index.

``stacks/locks/<stack>/<index>.txt`` is a requirements file with ``--hash`` lines.
When it exists, that index's pip phase installs from it with ``--require-hashes``.

- a public index is locked with pip-tools (``pip-compile --generate-hashes``),
  which pins and hashes the whole resolution; packages that a vendor index of the
  stack provides are left out (``--unsafe-package``), so the public lock can never
  pull e.g. a PyPI build of torch over the vendor's;
- a vendor index (installed ``--no-deps``) is locked from the index's own file
  hashes (PEP 691/503) for the exact pins.

A lock that no longer matches the stack's pins is an error naming the lock file.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from . import credentials
from .errors import UserError
from .model import Stack
from .stack import stack_root
from .urls import redact, scrub

REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass
class Lock:
    path: Path
    text: str
    pins: dict[str, tuple[str, list[str]]]  # canonical name -> (version, sha256 hashes)


def lock_path(stack: Stack, index: str) -> Path:
    return stack_root(stack) / "stacks" / "locks" / stack.name / f"{index}.txt"


def parse_lock(path: Path, text: str) -> Lock:
    pins: dict[str, tuple[str, list[str]]] = {}
    logical = re.sub(r"\\\n", " ", text)
    for raw in logical.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        m = REQ.match(line)
        if not m:
            continue
        pins[canonicalize_name(m.group(1))] = (m.group(2).split(";", 1)[0], HASH.findall(line))
    return Lock(path, text, pins)


def read_locks(stack: Stack) -> dict[str, Lock]:
    """The stack's lock files, checked against its pins. {index name: Lock}"""
    out: dict[str, Lock] = {}
    for index in stack.indexes:
        path = lock_path(stack, index)
        if not path.is_file():
            continue
        lock = parse_lock(path, path.read_text())
        rel = path.relative_to(stack_root(stack))
        for name, pkg in stack.packages.items():
            if pkg.index != index:
                continue
            have = lock.pins.get(canonicalize_name(name))
            if have is None or have[0] != pkg.version:
                found = f"has {have[0]}" if have else "does not list it"
                raise UserError(f"lock file is stale: {name} is pinned at {pkg.version} but the lock {found}",
                                file=str(rel), fix=f"run: stackforge lock {stack.name}")
        missing = [n for n, (_, hashes) in lock.pins.items() if not hashes]
        if missing:
            raise UserError(f"lock file has requirements without hashes: {', '.join(missing)}", file=str(rel),
                            fix=f"run: stackforge lock {stack.name}")
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
    from .index import IndexClient

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
        text = lock_public(stack, index, ca_bundle) if role == "public" else lock_vendor(stack, index)
        path = lock_path(stack, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".txt.partial")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written
