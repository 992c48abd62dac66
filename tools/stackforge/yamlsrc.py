"""YAML with source positions.

Stack files are plain YAML, but every error must name the file, line and column
of the value at fault. ``load_with_positions`` returns the data together with a
map from key paths (tuples of keys and list indexes) to where each value and each
key was written. Duplicate keys, which YAML would silently collapse, are errors.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

Path_ = tuple  # a key path: ("packages", "torch", "version")


@dataclass(frozen=True)
class Pos:
    """Where a value came from: a file position, or a command-line override."""

    file: str
    line: int | None = None
    col: int | None = None

    def as_error_kwargs(self) -> dict:
        return {"file": self.file, "line": self.line, "col": self.col}


class YamlFloat(float):
    """A float read from YAML that remembers how it was written, so an unquoted
    ``python: 3.10`` is reported as 3.10 (not 3.1) when it is rejected."""

    def __new__(cls, value, text: str | None = None):
        obj = super().__new__(cls, value)
        obj.text = text
        return obj

    def __getnewargs__(self):
        return (float(self), self.text)

    def __repr__(self) -> str:
        return self.text or float.__repr__(self)


@dataclass
class Sourced:
    data: Any
    values: dict  # key path -> Pos of the value
    keys: dict  # key path -> Pos of the key that introduced it


def _mark(file: str, node: yaml.Node) -> Pos:
    return Pos(file, node.start_mark.line + 1, node.start_mark.column + 1)


def load_with_positions(path: Path, display: str | None = None) -> Sourced:
    """Parse one YAML file; raise UserError (with line and column) on bad YAML."""
    display = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"file not found: {display}", file=display) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text ({exc.reason})", file=display, fix="save the file as UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        values: dict = {}
        keys: dict = {}
        data = _convert(loader, node, (), display, values, keys) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        ctx = exc.context_mark
        if exc.problem and exc.context and ctx and exc.problem_mark and ctx.line != exc.problem_mark.line:
            # e.g. an unclosed bracket: the parser notices at the end of the file; say where it opened
            problem += f" ({exc.context} started at line {ctx.line + 1}, column {ctx.column + 1})"
        raise UserError(
            f"invalid YAML: {problem}",
            file=display,
            line=mark.line + 1 if mark else None,
            col=mark.column + 1 if mark else None,
            fix="check indentation, colons and quoting on that line",
        ) from None
    except yaml.YAMLError as exc:
        raise UserError(f"invalid YAML: {exc}", file=display) from None
    finally:
        loader.dispose()
    return Sourced(data, values, keys)


def _convert(loader, node, path, file, values, keys):
    values[path] = _mark(file, node)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                raise UserError(
                    "mapping keys must be plain scalars",
                    **_mark(file, key_node).as_error_kwargs(),
                    fix="use a plain name as the key",
                )
            key = str(key)
            if key in out:
                first = keys[path + (key,)]
                raise UserError(
                    f"duplicate key '{key}' (first written at line {first.line})",
                    **_mark(file, key_node).as_error_kwargs(),
                    fix="keep one of the two entries",
                )
            keys[path + (key,)] = _mark(file, key_node)
            out[key] = _convert(loader, value_node, path + (key,), file, values, keys)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, path + (i,), file, values, keys) for i, item in enumerate(node.value)]
    value = loader.construct_object(node, deep=True)
    if isinstance(value, float):
        return YamlFloat(value, node.value)
    return value
