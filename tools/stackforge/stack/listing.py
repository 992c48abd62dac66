"""The rows of ``stackforge list`` (each stack's description, or why it is invalid), kept between runs.

A row needs the stack validated, and validating imports the model (pydantic), which alone costs more
than the start-up budget of ``list``. The rows are a function of the stack files, the ``--set`` values,
the interpreter and the code that validates them, and of nothing else: loading reads no other file and
no environment. So a run stores its rows under a key over exactly those inputs (the bytes and resolved
path of every stacks/*.yaml, the overrides, the Python version, and the path, size and mtime of every
module of stackforge and of the libraries that validate: pydantic, pydantic_core, PyYAML), and a run
whose key matches prints the stored rows without importing the model. Any change to an input is a
new key, so the rows are recomputed; a missing, unreadable or malformed store is a miss. Rows are stored
only when every stack is valid: a run over a file that does not load writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeGuard

from stackforge.digests import code_fingerprint
from stackforge.stack.names import STACKS_DIR

Row = dict[str, str]

STORE = "list.json"
KEEP = 16  # keys kept in the store (e.g. list with and without a --set)
VALIDATING_LIBRARIES = ("pydantic", "pydantic_core", "yaml")
#: the modules a ``list`` runs, as paths in the package: a change to one of them is a new key, a change elsewhere in
#: stackforge keeps the rows (tests/unit/test_cli_startup.py checks that a first list loads no module outside them)
VALIDATING_CODE = (
    "__init__.py",
    "__main__.py",
    "cli",
    "clients/__init__.py",
    "clients/credentials.py",
    "clients/workspace.py",
    "digests.py",
    "errors.py",
    "grammar.py",
    "signals.py",
    "stack",
    "urls.py",
)


def fingerprint() -> str:
    """The fingerprint of the code whose answers the rows are."""
    return code_fingerprint(VALIDATING_LIBRARIES, within=VALIDATING_CODE)


def key(root: Path, names: list[str], overrides: list[str], code: str | None = None) -> str:
    """The key of the rows of ``names`` under ``root`` with ``overrides`` (``code``: the validating code's
    fingerprint, when already taken in this run)."""
    h = hashlib.sha256(f"{code or fingerprint()}\0{root}\n".encode())
    for name in names:
        path = root / STACKS_DIR / f"{name}.yaml"
        h.update(f"{name}\0{path.resolve()}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    h.update(json.dumps(overrides).encode())
    return h.hexdigest()


def _valid(rows: object, names: list[str]) -> TypeGuard[list[Row]]:
    if not isinstance(rows, list) or [r.get("name") if isinstance(r, dict) else None for r in rows] != names:
        return False
    return all(
        len(r) == 2
        and ("description" in r or "invalid" in r)
        and all(isinstance(v, str) and all(c.isprintable() or c == "\n" for c in v) for v in r.values())
        for r in rows
    )


def rows(
    root: Path, names: list[str], overrides: list[str], cache: Path | None, compute: Callable[[], list[Row]]
) -> list[Row]:
    """The stored rows when the key matches, else ``compute()``'d and, when every row is valid, stored (in
    ``cache``; None: not kept)."""
    if cache is None:
        return compute()
    try:
        code = fingerprint()
        k = key(root, names, overrides, code)
    except OSError:
        return compute()
    store = cache / STORE
    try:
        doc = json.loads(store.read_text())
        entries = doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        entries = {}
    found = entries.get(k)
    if _valid(found, names):
        return found
    result = compute()
    if any("invalid" in r for r in result):
        return result
    try:
        if key(root, names, overrides, code) != k:  # a stack file changed while the rows were computed
            return result
    except OSError:
        return result
    entries = {kk: v for kk, v in entries.items() if kk != k}
    entries = dict(list(entries.items())[-(KEEP - 1) :]) if KEEP > 1 else {}
    entries[k] = result
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f".{STORE}.{os.getpid()}")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, store)
    except OSError:
        pass
    return result
