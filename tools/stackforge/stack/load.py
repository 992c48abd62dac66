"""Load a stack: YAML → inheritance → ``--set`` overrides → validated ``Stack``, returned by
``load`` as a ``LoadedStack`` (the model with its root, files, overrides, credentials and positions).

Errors name the file, line and column of the value at fault and say how to fix
it; they are collected, so one run reports every problem in a file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from stackforge.clients.credentials import StackCredentials
from stackforge.errors import UserError
from stackforge.stack import artifacts, document, installed, schemacache
from stackforge.stack import platforms as lines_of
from stackforge.stack import targets as target_rules
from stackforge.stack.model import LINE_KEYS, PROJECT_NAME, RESERVED_STAGE_PREFIXES, RESERVED_STAGES, Stack
from stackforge.stack.names import find_root
from stackforge.stack.yamlsrc import Pos, load_with_positions
from stackforge.urls import Credential

if TYPE_CHECKING:
    from stackforge.stack.resolved import Resolved, ResolvedStack


@dataclass(frozen=True)
class LoadedStack:
    """A validated stack with what the loader knows about it: where each value and key was
    written, the files of its inheritance chain (parent first), the repository root, the
    ``--set`` overrides applied and the credentials split off its index URLs (by index name)."""

    model: Stack = dataclasses.field(compare=False, repr=False)
    positions: dict[tuple, Pos]
    keypositions: dict[tuple, Pos]
    files: list[str]
    root: Path
    overrides: list[str] = dataclasses.field(repr=False)  # a --set value may carry a credential
    credentials: StackCredentials = dataclasses.field(repr=False)
    #: the platform line this stack is (the stack's own line for a stack as loaded)
    line: lines_of.Line | None = dataclasses.field(default=None, compare=False)
    #: every declared line as a stack of its own, by name (empty when the stack declares no ``platforms:``)
    lines: dict[str, LoadedStack] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.model.name

    def platform_lines(self) -> dict[str, LoadedStack]:
        """Every platform line of the stack as a stack of its own: the declared ones, else the stack itself."""
        if self.lines:
            return dict(self.lines)
        return {self.line.name if self.line else lines_of.ARCH_NAMES[self.model.platform.arch]: self}

    def for_platform(self, which: str) -> LoadedStack:
        """The line named ``which``: its name (arm64), its OCI platform (linux/arm64) or its architecture
        (aarch64)."""
        return line_named(self.name, self.platform_lines(), which)

    @functools.cached_property
    def resolved(self) -> Resolved:
        """Every templated value rendered, once per load (``stack/resolved.py``); the first template error is
        raised when a value is first needed."""
        from stackforge.stack.resolved import resolve  # Jinja is imported when a template is first rendered

        return resolve(self)

    def position(self, path: tuple) -> Pos:
        """Where the value at ``path`` (or its nearest declared parent) was written."""
        return position_of(tuple(path), self.positions, self.keypositions)

    def placed(self, err: UserError, path: tuple) -> UserError:
        """``err`` (its message, fix and exit code) placed at the stack key ``path``."""
        return UserError(err.message, **self.position(path).as_error_kwargs(), fix=err.fix, exit_code=err.exit_code)


L = typing.TypeVar("L", bound="LoadedStack | ResolvedStack")


def line_named(stack: str, found: dict[str, L], which: str) -> L:
    """The line of ``found`` (a stack's platform lines) named ``which``: its name (arm64), its OCI platform
    (linux/arm64) or its architecture (aarch64); a UserError naming the lines when none is."""
    for name, line in found.items():
        arch = line.model.platform.arch
        if which in (name, arch, lines_of.OCI_PLATFORMS[arch]):
            return line
    shown = which if len(which) <= 64 and which.isprintable() else "this value"
    raise UserError(
        f"stack '{stack}' has no platform {shown!r}",
        fix="name one of its platforms: "
        + ", ".join(f"{n} ({lines_of.OCI_PLATFORMS[ln.model.platform.arch]})" for n, ln in found.items()),
    )


def position_of(path: tuple, positions: Mapping[tuple, Pos], keypositions: Mapping[tuple, Pos]) -> Pos:
    """Where the value at ``path`` (or its nearest declared parent) was written."""
    return _pos_for(path, positions, keypositions, False)


class Located:
    """Positions of a file read with the YAML position loader: its ``display`` name and where each value
    (``positions``) and key (``keypositions``) was written. Mixed into the loaded records of recipes and
    overlays."""

    display: str
    positions: dict
    keypositions: dict

    def pos(self, path: tuple) -> Pos:
        """Where the value at ``path`` (or its nearest written parent) is; the file itself when nowhere."""
        found = _pos_for(tuple(path), self.positions, self.keypositions, False)
        return found if found.file != "?" else Pos(self.display)

    def key_pos(self, path: tuple) -> Pos:
        """Where the key introducing ``path`` is (the value's position when it has no key)."""
        return self.keypositions.get(tuple(path)) or self.pos(path)


class StackInvalid(UserError):
    """One or more problems in a stack's input; renders every problem."""

    def __init__(self, problems: list[UserError]):
        first = problems[0]
        super().__init__(first.message, file=first.file, line=first.line, col=first.col, fix=first.fix, exit_code=2)
        self.problems = problems

    def render(self) -> str:
        return "\n".join(p.render() for p in self.problems)


# --------------------------------------------------------------------------- validation


def _model_for(annotation) -> tuple[str, Any]:
    """Classify a field annotation: ('model', cls) | ('dict', value-ann) | ('list', item-ann) | ('scalar', None)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _model_for(non_none[0])
        return "scalar", None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", annotation
    if origin is dict:
        return "dict", args[1]
    if origin is list:
        return "list", args[0]
    return "scalar", None


def _close(word: str, choices: list[str], cutoff: float = 0.6) -> list[str]:
    """The choice closest to ``word`` (a list of at most one), for a hint; difflib is imported for a problem only."""
    import difflib

    return difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)


def _field_names(cls: type[BaseModel]) -> dict[str, str]:
    """Accepted key → field name (aliases included)."""
    out = {}
    for fname, field in cls.model_fields.items():
        out[field.alias or fname] = fname
    return out


def check_keys(cls: type[BaseModel], data: Any, path: tuple, keys: dict, values: dict, problems: list) -> None:
    if not isinstance(data, dict):
        return
    accepted = _field_names(cls)
    for key, value in data.items():
        if key not in accepted:
            near = _close(key, list(accepted), cutoff=0.6)
            pos = keys.get(path + (key,)) or values.get(path) or Pos("?")
            where = ".".join(str(p) for p in path) or "the top level"
            fix = f"did you mean '{near[0]}'?" if near else f"allowed keys in {where}: {', '.join(accepted)}"
            problems.append(UserError(f"unknown key '{key}' in {where}", **pos.as_error_kwargs(), fix=fix))
            continue
        field = cls.model_fields[accepted[key]]
        _check_value(field.annotation, value, path + (key,), keys, values, problems)


def _check_value(annotation, value, path, keys, values, problems):
    kind, inner = _model_for(annotation)
    if kind == "model":
        check_keys(inner, value, path, keys, values, problems)
    elif kind == "dict" and isinstance(value, dict):
        for k, v in value.items():
            _check_value(inner, v, path + (k,), keys, values, problems)
    elif kind == "list" and isinstance(value, list):
        for i, v in enumerate(value):
            _check_value(inner, v, path + (i,), keys, values, problems)


_FIXES = {
    "missing": "add it",
    "string_type": "write a string (quote it if it looks like a number)",
    "bool_type": "write true or false",
    "list_type": "write a list, e.g. [a, b]",
    "dict_type": "write a mapping of key: value",
    "model_type": "write a mapping of key: value",
    "literal_error": None,
    "too_short": "list at least one entry",
}


def _pos_for(loc: tuple, values: Mapping, keys: Mapping, missing: bool) -> Pos:
    if missing:
        parent = loc[:-1]
        while parent not in values and parent:
            parent = parent[:-1]
        return keys.get(parent) or values.get(parent) or Pos("?")
    probe = loc
    while probe and probe not in values:
        probe = probe[:-1]
    return values.get(probe) or Pos("?")


M = typing.TypeVar("M", bound=BaseModel)


def load_model(cls: type[M], path: Path, display: str, what: str, guide: str) -> tuple[M, dict, dict]:
    """Read one YAML file (``display`` is how errors name it) into ``cls``: a mapping, known keys, valid
    values, every problem at its file:line. Returns (model, value positions, key positions). For the files
    that are not stacks (recipes, overlays); ``what`` and ``guide`` name the file's kind and where to start."""
    src = load_with_positions(path, display)
    if not isinstance(src.data, dict):
        raise UserError(f"{what} is a mapping of keys", file=display, line=1, fix=f"start from {guide}")
    problems: list[UserError] = []
    check_keys(cls, src.data, (), src.keys, src.values, problems)
    if problems:
        raise StackInvalid(problems)
    try:
        model = cls.model_validate(src.data)
    except ValidationError as exc:
        raise StackInvalid(validation_problems(exc, src.values, src.keys)) from None
    return model, src.values, src.keys


def validation_problems(exc: ValidationError, values: dict, keys: dict) -> list[UserError]:
    problems = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        kind = err["type"]
        dotted = ".".join(str(p) for p in loc)
        msg = err["msg"]
        fix: str | None
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if kind == "missing":
            text = f"missing required key '{loc[-1]}'" + (
                f" in {'.'.join(str(p) for p in loc[:-1])}" if len(loc) > 1 else ""
            )
            fix = f"add '{loc[-1]}:'" + (" here or in a parent stack" if len(loc) >= 1 else "")
        else:
            text = f"{dotted}: {msg}"
            fix = _FIXES.get(kind)
            if kind == "literal_error":
                fix = f"use one of: {msg.split('Input should be ', 1)[-1]}"
            elif kind == "value_error":
                fix = _value_fix(msg)
        pos = _pos_for(loc, values, keys, kind == "missing")
        problems.append(UserError(text, **pos.as_error_kwargs(), fix=fix))
    return problems


def _value_fix(msg: str) -> str | None:
    if "only printable characters" in msg:
        return "remove the control characters: the value must be printable text on one line"
    if "git URL or path" in msg:
        return (
            "write an https://, ssh://, git:// or file:// URL, user@host:path or a local path "
            "(no spaces, quotes or shell characters, not starting with '-')"
        )
    if "image reference" in msg:
        return "write [registry[:port]/]repository[:tag][@sha256:<64 hex>], e.g. stackforge/base:bookworm"
    if "is not a digest" in msg:
        return "write sha256: followed by the 64 lowercase hex digits of the image's digest"
    if "URL" in msg:
        return (
            "write an http(s):// URL with a host (or a file:/// path) without spaces, quotes, '?', '#' "
            "or shell characters, e.g. https://pypi.org/simple"
        )
    if "is not a valid name" in msg:
        return (
            "use letters, digits, '.', '_' and '-', starting with a letter or digit (at most 128 characters): "
            "the name becomes a build stage, a directory and a file name"
        )
    if "module name" in msg:
        return "write a Python module name: identifiers joined by '.', e.g. deep_gemm or vllm.entrypoints"
    if "label key" in msg:
        return "write a reverse-DNS key: lowercase letters, digits, '-' and '_' between dots, e.g. com.example.version"
    if "interpreter" in msg:
        return "write a command name such as python3, or an absolute path such as /usr/bin/python3.11"
    if "git tag name" in msg:
        return "write the tag as git names it: letters, digits, '.', '_', '+', '-' and '/' (no '..', no spaces)"
    if "relative path inside the repository" in msg:
        return "write a directory relative to the repository root, e.g. patches/vllm (no '..', not absolute)"
    if "Python version" in msg:
        return 'write major.minor in quotes, e.g. "3.11"'
    if "toolkit version" in msg:
        return "write the version as digits and dots, e.g. 5.2.0"
    if "single line" in msg:
        return "join the commands with && on one line, or put a script in the upstream and run it"
    if "reserved" in msg:
        return "rename the target"
    if "project name" in msg:
        return "use the distribution's name as the index lists it (letters, digits, '.', '_', '-')"
    if "range" in msg or "bare version" in msg:
        return "pin one exact version, as the index names it"
    if "quote" in msg:
        return "put the value in double quotes"
    if "PEP 440" in msg:
        return "use a version such as 2.11.0.post2+musa5.2.0"
    if "commit" in msg:
        return "write the full 40-hex commit id (git rev-parse TAG^{commit})"
    if "sha256" in msg:
        return "copy the wheel's or sdist's sha256 from the index (64 lowercase hex digits)"
    if "environment variable name" in msg:
        return "use letters, digits and '_', not starting with a digit"
    if "URL" in msg:
        return "write the full index URL, e.g. https://pypi.org/simple"
    if "must be a string" in msg:
        return "put the value in double quotes"
    return None


def _cross_references(stack: Stack, values: dict) -> list[UserError]:
    """Names used in one part of the stack must be declared in another."""
    problems: list[UserError] = []

    def ref(path: tuple, name: str, pool: dict | list, what: str, fix_add: str) -> bool:
        """Whether ``name`` is declared in ``pool``; records the problem when it is not."""
        if name not in pool:
            near = _close(name, list(pool))
            fix = f"did you mean '{near[0]}'?" if near else fix_add
            problems.append(
                UserError(
                    f"{'.'.join(map(str, path))}: unknown {what} '{name}'",
                    **_pos_for(path, values, {}, False).as_error_kwargs(),
                    fix=fix,
                )
            )
            return False
        return True

    for name, pkg in stack.packages.items():
        ref(("packages", name, "index"), pkg.index, stack.indexes, "index", "declare it under indexes:")
    for name in stack.packages:
        if not PROJECT_NAME.match(name):
            problems.append(
                UserError(
                    f"packages: '{name}' is not a valid project name",
                    **_pos_for(("packages", name), values, {}, False).as_error_kwargs(),
                    fix=_value_fix("project name"),
                )
            )
    for name in stack.targets:
        reason = None
        if name in RESERVED_STAGES or name.startswith(RESERVED_STAGE_PREFIXES):
            reason = f"target name '{name}' is reserved for a build stage"
        elif not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
            reason = f"target name '{name}' must be lowercase letters, digits, '.', '_' or '-'"
        if reason:
            problems.append(
                UserError(
                    f"targets: {reason}",
                    **_pos_for(("targets", name), values, {}, False).as_error_kwargs(),
                    fix="rename the target",
                )
            )
    for iname in stack.indexes:
        members = [n for n, p in stack.packages.items() if p.index == iname]
        hashed = [n for n in members if stack.packages[n].sha256]
        if hashed and len(hashed) != len(members):
            first = hashed[0]
            bare = [n for n in members if n not in hashed]
            problems.append(
                UserError(
                    f"packages.{first}.sha256: only some pins of index '{iname}' carry hashes (none on "
                    f"{', '.join(bare[:4])}{' …' if len(bare) > 4 else ''}); pip checks hashes for a whole phase or not at all",
                    **_pos_for(("packages", first, "sha256"), values, {}, False).as_error_kwargs(),
                    fix=f"give every pin of '{iname}' its sha256, or drop them and run `stackforge lock {stack.name}`",
                )
            )
    for name, idx in stack.indexes.items():
        if idx.deps_from is not None:
            ref(("indexes", name, "deps_from"), idx.deps_from, stack.indexes, "index", "declare it under indexes:")
    for name, up in stack.upstreams.items():
        if (up.git is None) == (up.sdist is None):
            problems.append(
                UserError(
                    f"upstreams.{name}: declare exactly one of 'git' or 'sdist'",
                    **_pos_for(("upstreams", name), values, {}, False).as_error_kwargs(),
                    fix="a git upstream needs git and commit (and its tag, if released); a release needs sdist",
                )
            )
        if up.git is not None and up.commit is None:
            problems.append(
                UserError(
                    f"upstreams.{name}: a git upstream needs 'commit'",
                    **_pos_for(("upstreams", name), values, {}, False).as_error_kwargs(),
                    fix="add commit: <40 hex> (checked against the tag when there is one)",
                )
            )
        if up.submodules and up.sdist is not None:
            problems.append(
                UserError(
                    f"upstreams.{name}.submodules: a release sdist has no submodules to fetch",
                    **_pos_for(("upstreams", name, "submodules"), values, {}, False).as_error_kwargs(),
                    fix="drop submodules: true, or pin the upstream's git repository (git and commit) instead",
                )
            )
        if up.sdist is not None:
            ref(
                ("upstreams", name, "sdist", "index"),
                up.sdist.index,
                stack.indexes,
                "index",
                "declare it under indexes:",
            )
    problems += _agree_references(stack, values)
    for name, phase in stack.requirements.items():
        ref(("requirements", name, "index"), phase.index, stack.indexes, "index", "declare it under indexes:")
        for i, item in enumerate(phase.files):
            ref(
                ("requirements", name, "files", i, "upstream"),
                item.upstream,
                stack.upstreams,
                "upstream",
                "declare it under upstreams:",
            )
    for name, kern in stack.kernels.items():
        ref(("kernels", name, "upstream"), kern.upstream, stack.upstreams, "upstream", "declare it under upstreams:")
        for option, want in kern.when.items():
            path = ("kernels", name, "when", option)
            if ref(path, option, stack.options, "build option", "declare it under options:"):
                choices = stack.options[option].choices
                if want not in choices:
                    problems.append(
                        UserError(
                            f"kernels.{name}.when.{option}: {want!r} is not one of the option's choices {choices}",
                            **_pos_for(path, values, {}, False).as_error_kwargs(),
                            fix=f"use one of {', '.join(choices)}",
                        )
                    )
    for kind, name, env in [("kernels", n, k.env) for n, k in stack.kernels.items()] + [
        ("steps", n, st.env) for n, st in stack.steps.items()
    ]:
        for key in sorted(set(env) & set(stack.tuning)):
            problems.append(
                UserError(
                    f"{kind}.{name}.env.{key}: {key} is also declared under tuning:",
                    **_pos_for((kind, name, "env", key), values, {}, False).as_error_kwargs(),
                    fix="declare it once: under tuning: if it does not change what is built, else in the step's env",
                )
            )
    if stack.source is not None:
        ref(("source",), stack.source, stack.upstreams, "upstream", "name one of the stack's upstreams")
    r = stack.rules
    for i, train in enumerate(r.trains):
        for j, member in enumerate(train.members):
            ref(("rules", "trains", i, "members", j), member, stack.packages, "package", "declare it under packages:")
    for i, bf in enumerate(r.built_for):
        ref(("rules", "built_for", i, "package"), bf.package, stack.packages, "package", "declare it under packages:")
        ref(("rules", "built_for", i, "for"), bf.for_, stack.packages, "package", "declare it under packages:")
    for i, fam in enumerate(r.aligned):
        for j, member in enumerate(fam.members):
            ref(("rules", "aligned", i, "members", j), member, stack.packages, "package", "declare it under packages:")
    for i, vb in enumerate(r.vendor_build):
        ref(
            ("rules", "vendor_build", i, "package"), vb.package, stack.packages, "package", "declare it under packages:"
        )
    for i, mn in enumerate(r.minimums):
        ref(("rules", "minimums", i, "package"), mn.package, stack.packages, "package", "declare it under packages:")
        if mn.when is not None:
            ref(
                ("rules", "minimums", i, "when", "package"),
                mn.when.package,
                stack.packages,
                "package",
                "declare it under packages:",
            )
    for name, sl in stack.tests.items():
        up_name = sl.files.upstream
        at = ("tests", name, "files", "upstream")
        known = up_name is not None and ref(at, up_name, stack.upstreams, "upstream", "declare it under upstreams:")
        if known and stack.upstreams[str(up_name)].git is None:
            problems.append(
                UserError(
                    f"tests.{name}.files.upstream: {up_name!r} is a release sdist; slices read a git upstream "
                    "at its pinned commit",
                    **_pos_for(at, values, {}, False).as_error_kwargs(),
                    fix="name a git upstream, or copy the files into this repository and drop upstream:",
                )
            )
        if sl.target is not None:
            ref(("tests", name, "target"), sl.target, stack.targets, "target", "name one of the stack's targets")
    problems += installed.problems(stack, lambda path: _pos_for(path, values, {}, False))
    problems += artifacts.problems(stack, lambda path: _pos_for(path, values, {}, False))
    problems += target_rules.problems(stack, lambda path: _pos_for(path, values, {}, False))
    return problems


class _Unknown(Exception):
    pass


def _walk(stack: Stack, key: str) -> Any:
    """The value at dotted ``key`` of the model (None when declared but unset); _Unknown when the path names no
    field or no declared entry."""
    node: Any = stack
    for part in key.split("."):
        if isinstance(node, BaseModel):
            fields = {f.alias or n: n for n, f in type(node).model_fields.items()} | {
                n: n for n in type(node).model_fields
            }
            if part not in fields:
                raise _Unknown(part)
            node = getattr(node, fields[part])
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise _Unknown(part)
    if isinstance(node, (dict, list, BaseModel, bool)):
        raise _Unknown(key)
    return node


def stack_value(stack: Stack, key: str) -> str | None:
    """The text at dotted ``key`` of the stack (e.g. ``upstreams.vllm.tag``); None when it is unset (or names
    nothing)."""
    try:
        value = _walk(stack, key)
    except _Unknown:
        return None
    return None if value is None else str(value)


def _agree_references(stack: Stack, values: dict) -> list[UserError]:
    """An upstream's ``agree``: its exceptions name packages of the stack, its keys name values of the stack."""
    from packaging.utils import canonicalize_name

    problems: list[UserError] = []
    names = {canonicalize_name(n) for n in stack.packages}
    for i, exact in enumerate(stack.gate.exact):
        if canonicalize_name(exact) not in names:
            problems.append(
                UserError(
                    f"gate.exact: '{exact}' is not a package of the stack; only a pin has a version to hold exactly",
                    **_pos_for(("gate", "exact", i), values, {}, False).as_error_kwargs(),
                    fix="name a package of the stack, or remove it",
                )
            )
    pinned = list(target_rules.agreed_pins(stack))
    packages = {canonicalize_name(n) for n in pinned}
    for uname, up in stack.upstreams.items():
        if up.agree is None:
            continue
        for pkg in up.agree.except_:
            if canonicalize_name(pkg) not in packages:
                near = _close(pkg, pinned)
                path = ("upstreams", uname, "agree", "except", pkg)
                problems.append(
                    UserError(
                        f"upstreams.{uname}.agree.except: '{pkg}' is not a pin of the stack (a package, or a "
                        "target's exact requirement); only a pin of the stack is compared",
                        **_pos_for(path, values, {}, False).as_error_kwargs(),
                        fix=f"did you mean '{near[0]}'?" if near else "remove it",
                    )
                )
        for file, keys in up.agree.keys.items():
            for key, ref in keys.items():
                try:
                    _walk(stack, ref)
                except _Unknown:
                    where = ("upstreams", uname, "agree", "keys", file, key)
                    problems.append(
                        UserError(
                            f"upstreams.{uname}.agree.keys.{file}.{key}: '{ref}' names no value of the stack",
                            **_pos_for(where, values, {}, False).as_error_kwargs(),
                            fix="name a single value, e.g. upstreams.vllm.tag or packages.torch.version",
                        )
                    )
    return problems


def load(
    name_or_path: str,
    root: Path | str | None = None,
    overrides: list[str] | None = None,
    *,
    read: document.Document | None = None,
) -> LoadedStack:
    """Load, inherit, override and validate one stack. Raises StackInvalid / UserError (exit code 2).
    ``read``: this stack's document as already read (e.g. by ``freshness.prefetch``), used when it is for the same
    root, name and overrides and no load has taken it yet; otherwise the stack is read here."""
    root = Path(root).resolve() if root else find_root()
    overrides = list(overrides or [])
    doc = read if read is not None and read.is_for(root, name_or_path, overrides) else None
    doc = doc or document.read(root, name_or_path, overrides)
    doc.used = True
    data, values, keys, files = doc.data, doc.values, doc.keys, doc.files
    # Credentials (userinfo and sensitive query parameters) are split off before validation, so they
    # never reach the model, its error messages or anything that prints or hashes it. The resolver
    # keeps them for the steps that use them.
    index_found, git_found = document.split_off_credentials(data)
    schemacache.build(schemacache.user_cache())  # the model's validator, from the schema kept for this code
    try:
        stack = Stack.model_validate(data)
    except ValidationError as exc:
        # Unknown keys first, every one with the key it may have meant; else what the model refused.
        problems: list[UserError] = []
        check_keys(Stack, data, (), keys, values, problems)
        raise StackInvalid(problems or validation_problems(exc, values, keys)) from None
    split_off: dict[str, Credential] = {}
    for iname, idx in stack.indexes.items():
        found = index_found.get(iname)
        if found:
            split_off[idx.url.rstrip("/")] = found
    for uname, up in stack.upstreams.items():
        if up.git is not None:
            found = git_found.get(uname)
            if found:
                split_off[up.git.rstrip("/")] = found
    credentials = StackCredentials({iname: idx.url for iname, idx in stack.indexes.items()}, split_off)
    for pname, pkg in stack.packages.items():
        if pkg.import_ is None:
            pkg.import_ = pname.replace("-", "_")
    problems = _cross_references(stack, values)
    if problems:
        raise StackInvalid(problems)
    if not stack.platforms:
        own = lines_of.Line(lines_of.ARCH_NAMES[stack.platform.arch], stack.platform.arch)
        return LoadedStack(stack, values, keys, files, root, overrides, credentials, line=own)
    derived = {
        name: LoadedStack(model, lvalues, lkeys, files, root, overrides, credentials, line=line)
        for name, (model, lvalues, lkeys, line) in _platform_lines(stack, data, values, keys).items()
    }
    own = next(d.line for d in derived.values() if d.line and d.line.arch == stack.platform.arch)
    return LoadedStack(stack, values, keys, files, root, overrides, credentials, line=own, lines=derived)


def _platform_lines(stack: Stack, data: dict, values: dict, keys: dict) -> dict[str, tuple]:
    """Each declared platform line validated as a stack: {name: (model, value positions, key positions, Line)}.
    Raises StackInvalid naming every problem at its line of the stack file."""
    problems: list[UserError] = []

    def problem(path: tuple, message: str, fix: str) -> None:
        problems.append(UserError(message, **_pos_for(path, values, keys, False).as_error_kwargs(), fix=fix))

    arch = stack.platform.arch
    seen: dict[str, str] = {}
    for name, line in stack.platforms.items():
        if line.arch in seen:
            problem(
                ("platforms", name, "arch"),
                f"platforms.{name}: {line.arch} is also line '{seen[line.arch]}'; one tag holds one image per platform",
                "remove one of the two lines",
            )
        seen.setdefault(line.arch, name)
        for key in lines_of.misplaced_keys(line.with_):
            problem(
                ("platforms", name, "with", key),
                f"platforms.{name}.with: '{key}' is the stack's, the same on every platform",
                f"a line may change only {', '.join(LINE_KEYS)}; move '{key}' to the stack",
            )
        if line.arch == arch and line.with_:
            problem(
                ("platforms", name, "with"),
                f"platforms.{name} is the stack's own platform (platform.arch {arch}): its values are the stack's",
                f"write them in the stack itself and drop platforms.{name}.with",
            )
    if arch not in seen:
        problem(
            ("platforms",),
            f"platforms: no line is the stack's own platform (platform.arch {arch})",
            f"declare it: {lines_of.ARCH_NAMES[arch]}: {{arch: {arch}}}",
        )
    if problems:
        raise StackInvalid(problems)
    out: dict[str, tuple] = {}
    for name, line in stack.platforms.items():
        prefix = ("platforms", name, "with")
        check_keys(Stack, {k: v for k, v in line.with_.items() if v is not None}, prefix, keys, values, problems)
        ldata = lines_of.line_data(data, name)
        raw_with = data["platforms"][name].get("with") or {}
        lvalues = lines_of.line_positions(values, name, raw_with)
        lkeys = lines_of.line_positions(keys, name, raw_with)
        if problems:
            continue
        if line.arch == arch:
            # The stack's own line changes nothing (its with: is refused above): it is the stack as validated,
            # without its lines. No check reads platforms, so the stack's checks hold for it. The copy shares
            # the stack's values, which nothing changes after loading.
            model = stack.model_copy(update={"platforms": {}})
        else:
            try:
                model = Stack.model_validate(ldata)
            except ValidationError as exc:
                problems += validation_problems(exc, lvalues, lkeys)
                continue
            for pname, pkg in model.packages.items():
                if pkg.import_ is None:
                    pkg.import_ = pname.replace("-", "_")
            problems += _cross_references(model, lvalues)
        dumped = resolved(model) if line.unknown else {}
        for key in line.unknown:
            if not lines_of.key_exists(dumped, key):
                problem(
                    ("platforms", name, "unknown", key),
                    f"platforms.{name}.unknown: '{key}' names no value of the line",
                    "name a key of the stack, e.g. packages.deep_ep, or remove it",
                )
        info = lines_of.Line(
            name, line.arch, line.local, dict(line.unknown), line.builder, declared=True, own=line.arch == arch
        )
        out[name] = (model, lvalues, lkeys, info)
    if problems:
        raise StackInvalid(problems)
    return out


def load_stack(name_or_path: str, root: Path | str | None = None, overrides: list[str] | None = None) -> Stack:
    """The validated model of ``load(...)``, for code that needs the model only (the schema's values,
    not where they were written, the root or the credentials)."""
    return load(name_or_path, root, overrides).model


def json_schema() -> dict:
    """JSON Schema for stack files. Every key is optional because a child stack states only what it changes."""
    schema = Stack.model_json_schema(by_alias=True)

    def strip(node):
        if isinstance(node, dict):
            node.pop("required", None)
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(schema)
    packages = schema["$defs"]["SystemLayer"]["properties"]["packages"]  # a bare string is an unpinned package
    packages["items"] = {"anyOf": [packages["items"], {"type": "string"}]}
    pip = schema["$defs"]["Base"]["properties"]["pip"]  # a bare version is the installer without hashes
    pip["anyOf"] = [{"type": "string"}, *pip["anyOf"]]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "stackforge stack file"
    return schema


def resolved(stack: Stack) -> dict:
    """The fully resolved stack as plain data (inheritance and overrides applied)."""
    return stack.model_dump(mode="json", by_alias=True, exclude_none=True)


#: Keys of the resolved stack that do not change what is built (tuning; the test slices run in the built image);
#: the fingerprint leaves them out.
#: Each platform line's image carries its own fingerprint (the stack derived for it), so ``platforms`` is left out
#: too: declaring another line does not move the fingerprint of the stack's own.
UNFINGERPRINTED = ("tuning", "tests", "platforms")


def _empty_by_default(field: FieldInfo) -> bool:
    """Whether a field's default is an empty mapping or list (written as a value or as a factory)."""
    if field.default_factory is not None:
        return field.default_factory in (dict, list)
    return isinstance(field.default, (dict, list)) and not field.default


def _unused_dropped(model: BaseModel, data: dict) -> dict:
    """``data`` (the model's dump) without fields that are empty and empty by default: a stack that does not
    use a feature has the same fingerprint whether or not the schema knows the feature."""
    out = {}
    for name, field in type(model).model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        value, attr = data[key], getattr(model, name)
        if value in ({}, []) and not isinstance(attr, BaseModel) and _empty_by_default(field):
            continue
        if isinstance(attr, BaseModel) and isinstance(value, dict):
            value = _unused_dropped(attr, value)
        elif isinstance(attr, dict) and isinstance(value, dict):
            value = {
                k: _unused_dropped(attr[k], v) if isinstance(attr.get(k), BaseModel) else v for k, v in value.items()
            }
        elif isinstance(attr, list) and isinstance(value, list):
            value = [_unused_dropped(a, v) if isinstance(a, BaseModel) else v for a, v in zip(attr, value)]
        out[key] = value
    return out


def fingerprint(stack: Stack) -> str:
    """sha256 of the resolved stack: equal fingerprints mean equal declared inputs."""

    data = {k: v for k, v in _unused_dropped(stack, resolved(stack)).items() if k not in UNFINGERPRINTED}
    for idx in data.get("indexes", {}).values():
        idx.pop("unlocked", None)  # why an index has no lock: said, never built
    for up in data.get("upstreams", {}).values():
        up.pop("agree", None)  # what the stack must agree with is checked, never built
        up.pop("contract", None)  # ... and so is the image contract it is held to
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()
