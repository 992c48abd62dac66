"""The stack document: a stack file read with its inheritance chain and its ``--set`` overrides, before the
model validates it (``stack.load``).

It imports no model, so a command can read what a stack names (its indexes, its packages) while the model is
still being built: ``freshness.prefetch`` starts index queries from it. Anything taken from here is unvalidated
input: check it with the model's own grammar (``stackforge.grammar``) before it reaches a request or a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stackforge.errors import UserError
from stackforge.stack.names import RESERVED, STACK_NAME, STACKS_DIR, list_stacks
from stackforge.stack.yamlsrc import Pos, Refused, load_value, load_with_positions
from stackforge.urls import redact_text
from stackforge.urls import split as split_credentials


@dataclass
class Document:
    """Stack ``name`` of ``root`` as read with ``overrides``: its ``data`` (parents merged in, overrides applied),
    where each value and key was written, and the files of its chain (parent first). ``stack.load`` validates
    it and changes ``data`` as it goes, so it takes a document once (``used``)."""

    root: Path
    name: str
    overrides: tuple[str, ...]
    data: dict
    values: dict
    keys: dict
    files: list[str]
    used: bool = False

    def is_for(self, root: Path, name: str, overrides: list[str]) -> bool:
        """Whether this is the unused document of stack ``name`` of ``root`` (resolved) with ``overrides``."""
        return not self.used and (self.root, self.name, self.overrides) == (root, name, tuple(overrides))


def read(root: Path, name: str, overrides: list[str]) -> Document:
    """Read stack ``name`` of ``root`` (a resolved path) with its parents and ``overrides``. Raises UserError for
    what the loader refuses before the model: a missing or misnamed file, a bad parent, a bad override."""
    data, values, keys, files = read_chain(root, name, [])
    apply_overrides(data, values, keys, list(overrides))
    return Document(root, name, tuple(overrides), data, values, keys, files)


# --------------------------------------------------------------------------- repository


MAX_INHERITANCE = 16  # stacks in one inheritance chain


def _name_problem(root: Path, name: Any) -> tuple[str, str] | None:
    """Why ``name`` is not a stack name (message, fix), or None when it is one."""
    if isinstance(name, str) and name in RESERVED:
        return (
            f"{STACKS_DIR}/{name}.yaml holds the repository's vulnerability waivers, not a stack",
            "name a stack; `stackforge lint` checks the waivers",
        )
    if isinstance(name, str) and STACK_NAME.fullmatch(name) and not name.endswith((".yaml", ".yml")):
        return None
    shown = repr(name) if isinstance(name, str) and len(name) <= 200 else "this value"
    known = _known(root)
    stem = Path(name).stem if isinstance(name, str) and len(name) <= 200 else ""
    if stem in known:
        fix = f"name the stack, not a path: '{stem}'"
    else:
        fix = (
            f"name a stack of {STACKS_DIR}/ by its file name without .yaml; known stacks: {', '.join(known) or 'none'}"
        )
    return (f"{shown} is not a stack name (lowercase letters, digits, '.', '_' and '-'; no path, no .yaml)"), fix


def stack_path(root: Path, name: str) -> Path:
    """``stacks/<name>.yaml`` under ``root``; a name that is not a single plain segment is an error."""
    problem = _name_problem(root, name)
    if problem:
        raise UserError(problem[0], fix=problem[1])
    return root / STACKS_DIR / f"{name}.yaml"


def _confined(root: Path, path: Path, display: str) -> None:
    """Refuse a stack file that resolves (through a symlink) outside stacks/."""
    stacks = (root / STACKS_DIR).resolve()
    try:
        path.resolve().relative_to(stacks)
    except ValueError:
        raise UserError(
            f"the file is a link to a file outside {STACKS_DIR}/",
            file=display,
            fix=f"copy the stack into {STACKS_DIR}/ instead of linking to it",
        ) from None


def _close(word: str, choices: list[str]) -> list[str]:
    """The choice closest to ``word`` (a list of at most one), for a hint; difflib is imported for a problem only."""
    import difflib

    return difflib.get_close_matches(word, choices, n=1)


def _known(root: Path) -> list[str]:
    """The stacks that hints may name: files of stacks/ whose stem is a stack name."""
    return [n for n in list_stacks(root) if STACK_NAME.fullmatch(n)]


# --------------------------------------------------------------------------- inheritance


def _merge(base: Any, over: Any) -> Any:
    """Deep-merge mappings (keys keep the parent's order, new keys follow); anything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    return over


def _value_at(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def _merge_positions(base: dict, over: dict, over_data: Any) -> dict:
    # A replaced (non-mapping) value drops the parent's positions below it; mappings merge.
    replaced = {path for path in over if not isinstance(_value_at(over_data, path), dict)}
    heads = {path[0] for path in replaced if path}  # a path below a replaced one starts with its first key
    out = {
        p: at
        for p, at in base.items()
        if len(p) < 2 or p[0] not in heads or not any(p[:k] in replaced for k in range(1, len(p)))
    }
    out.update(over)
    return out


def read_chain(root: Path, name: str, seen: list[str]) -> tuple[dict, dict, dict, list[str]]:
    path = stack_path(root, name)
    display = f"{STACKS_DIR}/{name}.yaml"
    if not path.exists():
        near = _close(name, _known(root))
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise UserError(
            f"no stack named '{name}' ({display} does not exist)",
            fix=f"{hint}known stacks: {', '.join(_known(root)) or 'none'}",
        )
    _confined(root, path, display)
    src = load_with_positions(path, display)
    data = src.data
    if not isinstance(data, dict):
        raise UserError(
            "a stack file must be a mapping of keys (name, platform, packages, …)",
            file=display,
            line=1,
            col=1,
            fix="start the file with 'name: <stack name>'",
        )
    _check_own_name(data, src.values, display, name)
    parent = data.get("inherits")
    if parent is None:
        return data, src.values, src.keys, [display]
    _check_parent(root, parent, src.values[("inherits",)], [*seen, name])
    pdata, pvals, pkeys, pfiles = read_chain(root, parent, [*seen, name])
    merged = _merge(pdata, data)
    merged.pop("inherits", None)
    merged["inherits"] = parent
    return (
        merged,
        _merge_positions(pvals, src.values, data),
        _merge_positions(pkeys, src.keys, data),
        [*pfiles, display],
    )


def _check_own_name(data: dict, values: dict, display: str, name: str) -> None:
    """A stack file names itself, with the name of its file."""
    own = data.get("name")
    if own is None:
        # Without this a child stack would silently carry its parent's name.
        raise UserError(
            "missing required key 'name'",
            file=display,
            line=1,
            col=1,
            fix=f"add 'name: {name}' (every stack file names itself)",
        )
    if own != name:
        shown = repr(own) if isinstance(own, str) and len(own) <= 200 else "this value"
        raise UserError(
            f"name {shown} does not match the file name '{name}'",
            **values[("name",)].as_error_kwargs(),
            fix=f"set name: {name}"
            + (f", or rename the file to {own}.yaml" if isinstance(own, str) and STACK_NAME.fullmatch(own) else ""),
        )


def _check_parent(root: Path, parent: Any, pos: Pos, chain: list[str]) -> None:
    """``inherits`` names another stack of stacks/: a plain name, no cycle, not too long a chain."""
    if not isinstance(parent, str):
        raise UserError(
            "inherits must be the name of another stack", **pos.as_error_kwargs(), fix="write e.g. 'inherits: post1'"
        )
    problem = _name_problem(root, parent)
    if problem:
        raise UserError(f"inherits: {problem[0]}", **pos.as_error_kwargs(), fix=problem[1])
    if parent in chain:
        raise UserError(
            f"inheritance cycle: {' → '.join([*chain, parent])}",
            **pos.as_error_kwargs(),
            fix="remove 'inherits' from one stack in the cycle",
        )
    if len(chain) >= MAX_INHERITANCE:
        raise UserError(
            f"inheritance chain longer than {MAX_INHERITANCE} stacks ({' → '.join(chain)} → {parent})",
            **pos.as_error_kwargs(),
            fix="inherit from a stack nearer the root of the chain",
        )
    if not stack_path(root, parent).exists():
        near = _close(parent, _known(root))
        raise UserError(
            f"parent stack '{parent}' does not exist ({STACKS_DIR}/{parent}.yaml)",
            **pos.as_error_kwargs(),
            fix=(f"did you mean '{near[0]}'?" if near else f"known stacks: {', '.join(_known(root))}"),
        )


# --------------------------------------------------------------------------- --set overrides


def _nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return None if value in ("null", "~") else value


KEY_PART = re.compile(r"[A-Za-z0-9_-]{1,100}")
MAX_KEY_PARTS = 16
LONG_OVERRIDE = 200  # longer overrides are named by their key alone in messages
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def _override_value(raw: str, n: int) -> tuple[list[str], Any, Pos]:
    """Check one ``key.path=value`` override: (key parts, value, where), or UserError.

    The value is read as YAML under the loader's limits, its size checked before it is
    read, redacted or echoed. Scalars stay text ("3.10" stays "3.10", a hex digest stays a
    string); pydantic converts where a number or a boolean is meant. null/~ mean "unset".
    """
    key, eq, text = raw.partition("=")
    parts = key.strip().split(".")
    if len(key) > 1000 or not all(KEY_PART.fullmatch(p) for p in parts):
        printable = 0 < len(key.strip()) <= 200 and not _UNPRINTABLE.search(key)
        raise UserError(
            f"'{redact_text(key)}' is not a key path" if printable else "the key is not a key path",
            file=f"--set {redact_text(key.strip())}" if printable else f"--set #{n}",
            fix="write dotted keys of letters, digits, '_' and '-': packages.torch.version",
        )
    label = f"--set {'.'.join(parts)}"
    if len(parts) > MAX_KEY_PARTS:
        raise UserError(
            f"a key path of more than {MAX_KEY_PARTS} parts",
            file=label,
            fix="name a key of the stack, e.g. packages.torch.version",
        )
    if not eq:
        raise UserError(
            "an override must look like key.path=value", file=label, fix="e.g. --set upstreams.vllm.commit=0123abcd…"
        )
    try:
        value = _nulls(load_value(text)) if text.strip() else ""
    except Refused as exc:
        raise UserError(
            exc.message + (f" (line {exc.line}, column {exc.col} of the value)" if exc.line else ""),
            file=label,
            fix=exc.fix,
        ) from None
    except yaml.YAMLError:
        value = text
    where = Pos(f"--set {redact_text(raw)}" if len(raw) <= LONG_OVERRIDE else f"{label}=…")
    return parts, value, where


def _check_identity(parts: list[str], value: Any, data: dict, where: Pos) -> None:
    """``name`` and ``inherits`` are fixed by the stack's file; an override may only repeat them.

    Overrides apply to the resolved stack, after inheritance: a new parent would change
    which file every inherited value comes from, and a new name would file the build's
    evidence under another stack. Both are refused.
    """
    field = parts[0]
    if field not in ("name", "inherits"):
        return
    current = data.get(field)
    if len(parts) == 1 and value == current:
        return
    own = data.get("name")
    if field == "name":
        raise UserError(
            "--set name cannot rename a stack: its name is its file's "
            f"({STACKS_DIR}/{own}.yaml), and the build's evidence is filed under it",
            file=where.file,
            fix=f"drop --set name; for another stack, write {STACKS_DIR}/<new>.yaml with "
            f"'name: <new>' and 'inherits: {own}'",
        )
    raise UserError(
        "--set inherits cannot change the parent stack: overrides apply after inheritance "
        f"(the parent of {own} is {current or 'none'})",
        file=where.file,
        fix=f"write {STACKS_DIR}/<new>.yaml with 'name: <new>' and 'inherits: <parent>', "
        f"or change 'inherits:' in {STACKS_DIR}/{own}.yaml",
    )


def apply_overrides(data: dict, values: dict, keys: dict, overrides: list[str]) -> None:
    """Apply ``key.path=value`` overrides in place; values are read as YAML scalars/lists under limits."""
    for n, raw in enumerate(overrides, start=1):
        parts, value, where = _override_value(raw, n)
        _check_identity(parts, value, data, where)
        key = ".".join(parts)
        node = data
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None:
                nxt = {}
                node[part] = nxt
            if not isinstance(nxt, dict):
                raise UserError(
                    f"'{'.'.join(parts[: i + 1])}' is a value, not a mapping; cannot set '{key}'",
                    file=where.file,
                    fix="override the value itself, or a key below a mapping",
                )
            node = nxt
        node[parts[-1]] = value
        path = tuple(parts)
        for old in [p for p in values if p[: len(path)] == path]:
            del values[old]
        values[path] = where
        keys[path] = where
        for n_ in range(1, len(path)):
            values.setdefault(path[:n_], where)
            keys.setdefault(path[:n_], where)


# --------------------------------------------------------------------------- credentials


def split_off_credentials(data: dict) -> tuple[dict, dict]:
    """Replace index URLs and git upstream URLs in the raw stack data by their credential-free form;
    return the credentials found, by index name and by upstream name."""
    found: tuple[dict, dict] = ({}, {})
    for (section, key), out in ((("indexes", "url"), found[0]), (("upstreams", "git"), found[1])):
        entries = data.get(section)
        if not isinstance(entries, dict):
            continue
        for name, entry in entries.items():
            if isinstance(entry, dict) and isinstance(entry.get(key), str):
                entry[key], cred = split_credentials(entry[key])
                if cred:
                    out[name] = cred
    return found
