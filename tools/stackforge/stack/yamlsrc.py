"""YAML with source positions, read under limits.

Stack files are plain YAML, but every error must name the file, line and column
of the value at fault. ``load_with_positions`` returns the data together with a
map from key paths (tuples of keys and list indexes) to where each value and each
key was written. Duplicate keys, which YAML would silently collapse, are errors.

A stack file and a ``--set`` value are hostile input, so both are read under
limits checked before the data is built: the size (checked before reading), control
characters, the number of values, nesting depth (counted while composing, so deep input stops at the
limit instead of exhausting Python's stack) and alias expansion (the nodes every
alias stands for are counted before any copy is made, so an alias bomb stops at
the first alias over the budget).
"""

from __future__ import annotations

import copy
import datetime
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent

from stackforge.errors import UserError

MAX_FILE_BYTES = 1 << 20  # a stack file is a few KiB
MAX_VALUE_BYTES = 64 << 10  # one --set value
MAX_DEPTH = 64  # nested mappings and lists
MAX_NODES = 20_000  # values (scalars, mappings, lists) written in one document; a stack has a few hundred
MAX_ALIASES = 100  # alias uses (*name, <<: *name) per document
MAX_ALIAS_NODES = 10_000  # nodes the aliases of one document may stand for, in total

# C0 controls but tab, newline and CR; DEL; C1 controls but NEL; direction overrides and
# isolates (they make text read differently from what it is); lone surrogates (undecodable
# bytes of a command-line argument); the non-characters U+FFFE and U+FFFF.
_FORBIDDEN = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)

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

    text: str | None

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


class Refused(Exception):
    """Input over one of the limits: what, where in the text (1-based line and column), and the fix."""

    def __init__(self, message: str, line: int | None, col: int | None, fix: str):
        super().__init__(message)
        self.message, self.line, self.col, self.fix = message, line, col, fix

    def error(self, file: str) -> UserError:
        return UserError(self.message, file=file, line=self.line, col=self.col, fix=self.fix)


def _refused_at(message: str, mark, fix: str) -> Refused:
    return Refused(message, mark.line + 1, mark.column + 1, fix)


# The mixin below runs inside a yaml Loader (its composer, parser and anchors); type-check it as one.
if TYPE_CHECKING:
    _LoaderBase = yaml.SafeLoader
else:
    _LoaderBase = object


class _Limits(_LoaderBase):
    """Composer mixin: refuses more than MAX_NODES values, nesting beyond MAX_DEPTH and alias
    use beyond the budgets.

    Each composed node's size counts the nodes its aliases stand for, so the size of
    an alias's target is what that alias would add to the data once expanded.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._start_limits()

    def _start_limits(self) -> None:
        self._depth = 0
        self._nodes = 0
        self._aliases = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            self._count_alias(self.peek_event())
            return super().compose_node(parent, index)
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _refused_at(
                f"more than {MAX_NODES} values in one document",
                self.peek_event().start_mark,
                "a stack holds a few hundred values; remove what does not belong",
            )
        collection = int(self.check_event(SequenceStartEvent, MappingStartEvent))
        if collection and self._depth >= MAX_DEPTH:
            raise _refused_at(
                f"nesting deeper than {MAX_DEPTH} levels",
                self.peek_event().start_mark,
                f"a stack nests a few levels; flatten the data (at most {MAX_DEPTH} levels)",
            )
        self._depth += collection
        node = super().compose_node(parent, index)
        self._depth -= collection
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in _children(node)) if node else 1
        return node

    def _count_alias(self, event) -> None:
        target = self.anchors.get(event.anchor)
        if target is None:
            return  # undefined: the composer reports it
        size = self._sizes.get(id(target))
        if size is None:
            raise _refused_at(
                f"alias *{event.anchor} is used inside its own anchor",
                event.start_mark,
                "a stack cannot contain itself; write the value out",
            )
        self._aliases += 1
        self._alias_nodes += size
        if self._aliases > MAX_ALIASES:
            raise _refused_at(
                f"more than {MAX_ALIASES} aliases",
                event.start_mark,
                "write the values out instead of repeating anchors",
            )
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise _refused_at(
                f"aliases expand to more than {MAX_ALIAS_NODES} values (alias *{event.anchor})",
                event.start_mark,
                "write the values out; anchors may repeat only small blocks",
            )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


class _SafeLimited(_Limits, yaml.SafeLoader):
    """SafeLoader under the limits: stack files."""


def _check_limits(root: yaml.Node) -> None:
    """The limits of _Limits over a tree composed by libyaml, walked in the order the composer read it: a
    node met again is an alias (libyaml, as PyYAML's composer, gives an alias its anchor's node), so the
    counts are those _Limits takes while composing. Raises Refused where _Limits would refuse."""
    sizes: dict[int, int] = {}  # nodes composed: what an alias of each stands for
    open_: set[int] = set()  # collections being walked: an alias of one is inside its own anchor
    count = [0, 0, 0]  # values, aliases, nodes the aliases stand for

    def visit(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes or key in open_:
            if key in open_:
                raise Refused("alias inside its own anchor", None, None, "")
            count[1] += 1
            count[2] += sizes[key]
            if count[1] > MAX_ALIASES or count[2] > MAX_ALIAS_NODES:
                raise Refused("over the alias budgets", None, None, "")
            return sizes[key]
        count[0] += 1
        if count[0] > MAX_NODES:
            raise Refused("over the node budget", None, None, "")
        size = 1
        if isinstance(node, yaml.CollectionNode):
            if depth >= MAX_DEPTH:
                raise Refused("over the depth budget", None, None, "")
            open_.add(key)
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    size += visit(key_node, depth + 1) + visit(value_node, depth + 1)
            else:
                for item in node.value:
                    size += visit(item, depth + 1)
            open_.discard(key)
        sizes[key] = size
        return size

    visit(root, 0)


# libyaml, when PyYAML was built with it, scans, parses and composes in C (most of the time of reading a stack);
# _check_limits then walks the composed tree for the limits before anything expands an alias. libyaml refuses
# nesting deeper than its own limit (1000 levels), which bounds its composer's recursion; a libyaml without that
# limit only parses, under the Python composer above. Text that fails (a limit included) is read again by the
# Python loader, which gives the error: one message for a fault, with or without libyaml.
_CParser = getattr(yaml, "cyaml", None) and getattr(yaml.cyaml, "CParser", None)  # None without libyaml


def _limits_nesting(parser: type) -> bool:
    """Whether libyaml refuses nesting past its limit before its composer recurses into it. The limit came in
    one change for block and flow nesting; scanning 1001 block levels (not parsing) tells it in microseconds."""
    try:
        parser("- " * 1001 + "x").raw_scan()
    except yaml.YAMLError:
        return True
    return False


if _CParser is not None and not TYPE_CHECKING:

    class _CLimited(yaml.cyaml.CSafeLoader):
        """SafeLoader with libyaml's parser and composer, the limits checked on the composed tree."""

        def get_single_node(self):
            node = super().get_single_node()
            if node is not None:
                _check_limits(node)
            return node

    class _FastSafeLimited(
        _Limits, yaml.composer.Composer, _CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver
    ):
        """_SafeLimited with libyaml's parser."""

        def __init__(self, stream):
            _CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._start_limits()

    _LOADERS: tuple[type, ...] = (
        _CLimited if _limits_nesting(_CParser) else _FastSafeLimited,
        _SafeLimited,
    )
else:
    _LOADERS = (_SafeLimited,)


class _BaseLimited(_Limits, yaml.BaseLoader):
    """BaseLoader under the limits (every scalar stays text): --set values."""


def check_text(text: str) -> None:
    """Refuse control characters (tab, newline and CR are fine) and the other characters in _FORBIDDEN."""
    bad = _FORBIDDEN.search(text)
    if bad is None:
        return
    i = bad.start()
    line = text.count("\n", 0, i) + 1
    col = i - (text.rfind("\n", 0, i) + 1) + 1
    raise Refused(
        f"control character U+{ord(bad.group()):04X} in the text",
        line,
        col,
        "remove it (only tab, newline and carriage return are allowed); "
        "`cat -A` or an editor's show-invisibles mode shows it",
    )


def _read_limited(path: Path, display: str) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES, checked before reading."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise UserError("not a regular file", file=display, fix="a stack is a plain .yaml file in stacks/")
        if info.st_size > MAX_FILE_BYTES:
            raise UserError(
                f"the file is {info.st_size} bytes; stack files are limited to {MAX_FILE_BYTES} bytes (1 MiB)",
                file=display,
                fix="a stack file is a few KiB; remove what does not belong",
            )
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"file not found: {display}", file=display) from None
    except OSError as exc:
        raise UserError(
            f"cannot read the file: {exc.strerror}", file=display, fix="check that it exists and is readable"
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise UserError(
            f"the file grew past {MAX_FILE_BYTES} bytes while it was read",
            file=display,
            fix="a stack file is a few KiB; remove what does not belong",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(
            f"not UTF-8 text ({exc.reason})", file=display, line=line, fix="save the file as UTF-8"
        ) from None


#: Files parsed in this process, by how errors name them and their text: a stack's parent is read again for each
#: stack that inherits it (``stackforge list`` reads post1 twice). Only small texts, at most MAX_PARSED of them.
_PARSED: dict[tuple[str, str], Sourced] = {}
MAX_PARSED = 32
MAX_PARSED_BYTES = 256 << 10


def load_with_positions(path: Path, display: str | None = None) -> Sourced:
    """Parse one YAML file under the limits; raise UserError (with line and column) on bad YAML. The data is
    the caller's own (a copy when the same text was parsed before in this process)."""
    display = display or str(path)
    text = _read_limited(path, display)
    parsed = _PARSED.get((display, text))
    if parsed is None:
        parsed = _parse(text, display)
        if len(text) <= MAX_PARSED_BYTES:
            if len(_PARSED) >= MAX_PARSED:
                _PARSED.pop(next(iter(_PARSED)))
            _PARSED[(display, text)] = parsed
    return Sourced(_copied(parsed.data), dict(parsed.values), dict(parsed.keys))


#: Values _convert makes that nothing can change: shared between copies.
_IMMUTABLE = frozenset({str, int, bool, float, YamlFloat, type(None), bytes, datetime.date, datetime.datetime})


def _copied(data: Any) -> Any:
    """A deep copy of parsed data (_convert makes mappings, lists and scalars): its mappings and lists copied,
    its scalars shared, anything else deep-copied. _convert builds every alias anew: there is no sharing to
    keep."""
    kind = type(data)
    if kind is dict:
        return {key: _copied(value) for key, value in data.items()}
    if kind is list:
        return [_copied(value) for value in data]
    if kind in _IMMUTABLE:
        return data
    return copy.deepcopy(data)


def _parse(text: str, display: str) -> Sourced:
    try:
        check_text(text)
        for i, cls in enumerate(_LOADERS):
            loader = cls(text)
            try:
                node = loader.get_single_node()
                values: dict = {}
                keys: dict = {}
                data = _convert(loader, node, (), display, values, keys) if node is not None else None
                break
            except (Refused, yaml.YAMLError):
                if i == len(_LOADERS) - 1:
                    raise
            finally:
                loader.dispose()
    except Refused as exc:
        raise exc.error(display) from None
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, display) from None
    except yaml.YAMLError as exc:
        raise UserError(f"invalid YAML: {exc}", file=display, fix="check the quoting on that line") from None
    return Sourced(data, values, keys)


def _yaml_error(exc: yaml.MarkedYAMLError, display: str) -> UserError:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "invalid YAML"
    ctx = exc.context_mark
    if exc.problem and exc.context and ctx and exc.problem_mark and ctx.line != exc.problem_mark.line:
        # e.g. an unclosed bracket: the parser notices at the end of the file; say where it opened
        problem += f" ({exc.context} started at line {ctx.line + 1}, column {ctx.column + 1})"
    return UserError(
        f"invalid YAML: {problem}",
        file=display,
        line=mark.line + 1 if mark else None,
        col=mark.column + 1 if mark else None,
        fix="check indentation, colons and quoting on that line",
    )


def load_value(text: str) -> Any:
    """One ``--set`` value read as YAML under the limits, every scalar as text.

    Raises Refused (line and column within the value) over a limit; yaml.YAMLError
    when the text is not YAML.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_VALUE_BYTES:
        raise Refused(
            f"the value is {size} bytes; a --set value is limited to {MAX_VALUE_BYTES} bytes (64 KiB)",
            None,
            None,
            "put large data in a stack file instead",
        )
    check_text(text)
    loader = _BaseLimited(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _convert(loader, node, path, file, values, keys):
    values[path] = _mark(file, node)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict = {}
        for key_node, value_node in node.value:
            key = _construct(loader, key_node, file)
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
    value = _construct(loader, node, file)
    if isinstance(value, float):
        return YamlFloat(value, node.value)
    return value


_STR_TAG = "tag:yaml.org,2002:str"


def _construct(loader, node, file):
    """One scalar (or key) as Python data; a value Python cannot hold is an error at its position."""
    if node.tag == _STR_TAG and type(node) is yaml.ScalarNode:
        return node.value  # what SafeConstructor makes of a string, without its bookkeeping
    try:
        return loader.construct_object(node, deep=True)
    except (ValueError, OverflowError) as exc:
        raise UserError(
            f"cannot read this value: {str(exc).split(';')[0]}",
            **_mark(file, node).as_error_kwargs(),
            fix="quote it to keep it as text",
        ) from None
