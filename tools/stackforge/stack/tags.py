"""Image references derived from the pins, never typed by hand.

Templates live in the stack (``tags:``, ``labels:``, kernel ``env:``) and render in a Jinja
sandbox: values, a few filters and if/else only, with bounded output. Every rendered
reference is checked against the OCI distribution grammar for repository names and tags.
A stack's templated values render once per load (``stack/resolved.py``); the publish references
(:func:`publish_ref`, :func:`alias_refs`) render at publish time, when the registry, date and revision are known.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from stackforge import grammar
from stackforge.errors import UserError
from stackforge.grammar import DATE_RE, check_repository, check_tag, split_tag
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import TRIPLETS, Stack
from stackforge.stack.pins import Pin
from stackforge.stack.scheme import TagScheme

#: Longest template source and longest rendered text of a stack template (a tag, a label, an env value).
MAX_SOURCE = 4096
MAX_OUTPUT = 16384

TEMPLATE_FIX = (
    "a template may use values ({{ platform.python }}, {{ packages.torch.version | public }}), "
    "the filters tagsafe, public, local, musa_arch, dashed, major, replace, join, map, lower, upper, and if/else; "
    "no calls, loops, assignments or names starting with '_'"
)


@dataclass(frozen=True)
class Ref:
    repository: str  # registry host (if any) + path
    tag: str

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}"


class TemplateRefused(Exception):
    """A stack template uses something a template may not (a call, a loop, a private attribute)."""


class Sandbox(ImmutableSandboxedEnvironment):
    """A Jinja sandbox without globals whose string arithmetic cannot build an unbounded value."""

    intercepted_binops = frozenset({"*", "**", "%", "//", "/"})

    def __init__(self, limit: int = MAX_OUTPUT, **kwargs):
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, **kwargs)
        self.limit = limit
        self.globals.clear()

    def call_binop(self, context, operator, left, right):
        if operator == "%" and isinstance(left, str):
            raise SecurityError("string formatting with % is not allowed in a template")
        if operator == "**" and (not isinstance(right, int) or abs(right) > 64 or abs(left) > 2**64):
            raise SecurityError(f"{left!r} ** {right!r} is too large for a template")
        if operator == "*":
            seq, times = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > self.limit:
                raise SecurityError(f"a repetition of {len(seq) * times} items is over the limit of {self.limit}")
        return super().call_binop(context, operator, left, right)

    def render_limited(self, template: jinja2.Template, data: dict) -> str:
        """Render, refusing (SecurityError) once the output is longer than the limit."""
        out, size = [], 0
        for chunk in template.generate(data):
            size += len(chunk)
            if size > self.limit:
                raise SecurityError(f"the rendered text is longer than {self.limit} characters")
            out.append(chunk)
        return "".join(out)


def bounded_replace(limit: int):
    """The ``replace`` filter, refusing a result longer than ``limit`` (``'x'|replace('', long)`` grows fast)."""

    def replace(value, old, new, count=None):
        text, old, new = str(value), str(old), str(new)
        hits = text.count(old) if count is None else min(int(count), text.count(old))
        if len(text) + hits * (len(new) - len(old)) > limit:
            raise SecurityError(f"replace would build a text longer than {limit} characters")
        return text.replace(old, new, -1 if count is None else int(count))

    return replace


def bounded_join(limit: int):
    def join(value, d="", attribute=None):
        items = [str(getattr(v, attribute) if attribute else v) for v in value]
        text = str(d).join(items)
        if len(text) > limit:
            raise SecurityError(f"join would build a text longer than {limit} characters")
        return text

    return join


def sandbox(limit: int = MAX_OUTPUT) -> Sandbox:
    """The environment of every stack template: stackforge's filters and a few bounded built-in ones."""
    env = Sandbox(limit=limit, keep_trailing_newline=False)
    builtin = env.filters
    env.filters = {
        "tagsafe": lambda v: str(v).replace("+", "_"),
        "public": lambda v: Pin(str(v)).public,
        "local": lambda v: Pin(str(v)).local or "",
        "musa_arch": musa_arch,
        "dashed": dashed,
        "major": lambda v: str(v).split(".", 1)[0],
        "replace": bounded_replace(limit),
        "join": bounded_join(limit),
        "map": builtin["map"],
        "lower": builtin["lower"],
        "upper": builtin["upper"],
    }
    return env


def _env() -> Sandbox:
    return sandbox()


# Expressions a stack template may hold: values, attributes, filters, comparisons, if/else and '~'.
_ALLOWED = (
    nodes.Template,
    nodes.Output,
    nodes.TemplateData,
    nodes.Const,
    nodes.Name,
    nodes.Getattr,
    nodes.Getitem,
    nodes.Filter,
    nodes.Test,
    nodes.If,
    nodes.CondExpr,
    nodes.Concat,
    nodes.Compare,
    nodes.Operand,
    nodes.And,
    nodes.Or,
    nodes.Not,
    nodes.Add,
    nodes.Sub,
    nodes.Neg,
    nodes.Pos,
    nodes.List,
    nodes.Tuple,
    nodes.Keyword,
    nodes.Slice,
)


def check_template(env: Sandbox, source: str, names: set[str]) -> None:
    """Refuse (TemplateRefused) private attributes and anything outside the expression subset; an unknown
    name is a jinja2.UndefinedError, as at render time. The most telling problem is reported first:
    a private attribute, a statement, an unknown name, then a call or an operator."""
    if len(source) > MAX_SOURCE:
        raise TemplateRefused(f"the template is {len(source)} characters long (at most {MAX_SOURCE})")
    found: list[tuple[int, Exception]] = []
    todo: list[nodes.Node] = [env.parse(source)]
    while todo:
        node = todo.pop()
        problem = _problem(env, node, names)
        if problem:
            found.append(problem)
        todo.extend(reversed(list(node.iter_child_nodes())))
    if found:
        raise min(found, key=lambda p: p[0])[1]


def _problem(env: Sandbox, node: nodes.Node, names: set[str]) -> tuple[int, Exception] | None:
    """(priority, exception) for a node a stack template may not hold, else None."""
    attr = (
        node.attr
        if isinstance(node, nodes.Getattr)
        else (node.arg.value if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) else None)
    )
    if isinstance(attr, str) and attr.startswith("_"):
        return 0, TemplateRefused(f"it reaches the private attribute '{attr}'")
    if not isinstance(node, _ALLOWED):
        return (1 if isinstance(node, nodes.Stmt) else 3), TemplateRefused(
            f"it uses {_describe(node)}, which a template may not"
        )
    if isinstance(node, nodes.Name) and node.name not in names:
        return 2, jinja2.UndefinedError(f"'{node.name}' is undefined")
    if isinstance(node, nodes.Getitem) and not isinstance(node.arg, (nodes.Const, nodes.Slice)):
        return 3, TemplateRefused("it indexes with a computed key")
    if isinstance(node, nodes.Filter) and node.name not in env.filters:
        return 3, TemplateRefused(f"it uses the filter '{node.name}', which is not available")
    if isinstance(node, (nodes.Filter, nodes.Test)) and (node.dyn_args or node.dyn_kwargs):
        return 3, TemplateRefused("it passes *args or **kwargs")
    return None


def _describe(node: nodes.Node) -> str:
    kinds = {
        nodes.Call: "a call",
        nodes.For: "a loop",
        nodes.Assign: "an assignment",
        nodes.AssignBlock: "an assignment",
        nodes.Macro: "a macro",
        nodes.Mul: "'*'",
        nodes.Pow: "'**'",
        nodes.Mod: "'%'",
        nodes.Div: "'/'",
        nodes.FloorDiv: "'//'",
        nodes.Include: "an include",
        nodes.Import: "an import",
        nodes.FromImport: "an import",
        nodes.Extends: "extends",
        nodes.Block: "a block",
        nodes.With: "with",
        nodes.CallBlock: "a call block",
        nodes.FilterBlock: "a filter block",
        nodes.Dict: "a mapping literal",
    }
    return next((text for kind, text in kinds.items() if isinstance(node, kind)), f"'{type(node).__name__}'")


def musa_arch(value: str) -> str:
    """A MUSA GPU architecture as compute capability: mp_31 → 3.1 (MATE_MUSA_ARCH_LIST's form)."""
    m = re.fullmatch(r"mp_(\d)(\d+)", str(value))
    if not m:
        raise jinja2.TemplateError(f"'{value}' is not a MUSA GPU architecture like mp_31")
    return f"{m.group(1)}.{m.group(2)}"


def dashed(value: str) -> str:
    """A version as an apt package-name suffix: 5.2 → 5-2 (the MUSA packages' musa-toolkit-5-2)."""
    return str(value).replace(".", "-")


def context(stack: Stack, **extra) -> dict:
    """Values a tag or label template may use."""
    return {
        "stack": {"name": stack.name},
        # the multiarch triplet: a line's library paths are written once, /usr/lib/{{ platform.triplet }}
        "platform": {**stack.platform.model_dump(), "triplet": TRIPLETS[stack.platform.arch]},
        "packages": {n: Pin(p.version).as_context() for n, p in stack.packages.items()},
        "upstreams": {n: u.model_dump() for n, u in stack.upstreams.items()},
        "base": stack.base.model_dump(),
        "options": {n: o.value for n, o in stack.options.items()},
        **extra,
    }


def render_sandboxed(template: str, data: dict, env: Sandbox | None = None) -> str:
    """Render a stack template in the sandbox; raises TemplateRefused, SecurityError or a jinja2.TemplateError."""
    env = env or sandbox()
    check_template(env, template, set(data))
    return env.render_limited(env.from_string(template), data).strip()


def render_template(
    loaded: LoadedStack | ResolvedStack, template: str, path: tuple, *, data: dict | None = None, **extra
) -> str:
    """A stack template rendered in the sandbox with ``data`` (default: the stack's :func:`context`) and
    ``extra``; every refusal is a UserError naming the key and its place."""
    key = ".".join(map(str, path))
    where = loaded.position(path).as_error_kwargs()
    try:
        text = render_sandboxed(template, {**(context(loaded.model) if data is None else data), **extra})
    except TemplateRefused as exc:
        raise UserError(f"{key}: template refused: {exc}", **where, fix=TEMPLATE_FIX) from None
    except SecurityError as exc:
        raise UserError(f"{key}: template refused: {exc}", **where, fix=TEMPLATE_FIX) from None
    except jinja2.UndefinedError as exc:
        raise UserError(
            f"{key}: template uses an unknown value ({exc.message})",
            **where,
            fix="use platform.*, packages.<name>.version|public|local, upstreams.<name>.tag, options.<NAME>, "
            "stack.name, date, revision",
        ) from None
    except jinja2.TemplateError as exc:
        raise UserError(
            f"{key}: invalid template: {exc}", **where, fix="check the {{ … }} braces and filters"
        ) from None
    except (ValueError, TypeError, ArithmeticError, LookupError, AttributeError, RecursionError) as exc:
        raise UserError(f"{key}: template failed: {type(exc).__name__}: {exc}", **where, fix=TEMPLATE_FIX) from None
    bad = grammar.bad_char(text)
    if bad:
        raise UserError(
            f"{key}: the template renders {text!r}, which contains {bad}",
            **where,
            fix="a rendered tag, label or environment value is one line of printable text",
        )
    return text


def parse_ref(text: str) -> Ref:
    """Split ``[host[:port]/]path:tag`` (the last ':' after the last '/')."""
    repository, tag = split_tag(text)
    if tag is None:
        raise ValueError(f"'{text}' has no ':tag'")
    return Ref(repository, tag)


def checked_ref(loaded: LoadedStack | ResolvedStack, text: str, path: tuple) -> Ref:
    try:
        ref = parse_ref(text)
    except ValueError as exc:
        raise UserError(
            f"{'.'.join(map(str, path))} renders '{text}', which {exc}",
            **loaded.position(path).as_error_kwargs(),
            fix="write the template as repository:tag",
        ) from None
    for reason in (check_repository(ref.repository), check_tag(ref.tag)):
        if reason:
            in_repo = reason.startswith(("repository", "registry"))
            what = "" if in_repo else f"tag '{ref.tag}' "
            raise UserError(
                f"{'.'.join(map(str, path))} renders '{text}': {what}{reason}",
                **loaded.position(path).as_error_kwargs(),
                fix="change the template: a registry port is 1-65535"
                if "out of range" in reason
                else "change the template: repository names are lowercase"
                if in_repo
                else "change the template (the tagsafe filter turns '+' into '_')",
            )
    return ref


def local_ref(loaded: LoadedStack | ResolvedStack) -> Ref:
    """The local reference (``tags.local``), as the load resolved it (``stack/resolved.py``)."""
    return loaded.resolved.local


def check_registry(registry: str) -> str:
    registry = registry.rstrip("/")
    reason = check_repository(registry + "/x") if registry else "is empty"
    if reason or "://" in registry:
        raise UserError(
            f"registry '{registry}' is not a valid registry reference"
            + (f": {reason}" if reason and "://" not in registry else ""),
            file="--registry",
            fix="write host[:port][/path], e.g. registry.example.com/team (no scheme)",
        )
    return registry


def publish_ref(loaded: LoadedStack | ResolvedStack, registry: str, date: str | None = None, revision: int = 1) -> Ref:
    """The immutable publish reference under ``registry``. Rendered here, at publish time, not with the rest of
    the stack's templates (``stack/resolved.py``): it depends on the registry, the date and the revision; the
    other values come from the resolved context."""
    stack = loaded.model
    if not stack.tags.publish:
        raise UserError(
            f"stack '{stack.name}' declares no tags.publish template",
            **loaded.position(("tags",)).as_error_kwargs(),
            fix="add tags.publish to the stack",
        )
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    if not DATE_RE.match(date):
        raise UserError(f"date '{date}' is not YYYYMMDD", file="--date", fix="e.g. --date 20260929")
    if revision < 1:
        raise UserError("revision must be 1 or more", file="--revision", fix="e.g. --revision 2")
    data = loaded.resolved.context
    text = render_template(loaded, stack.tags.publish, ("tags", "publish"), data=data, date=date, revision=revision)
    return checked_ref(loaded, f"{check_registry(registry)}/{text}", ("tags", "publish"))


def publish_scheme(loaded: LoadedStack | ResolvedStack, registry: str, suffix: str = "") -> TagScheme:
    """The immutable tag scheme of ``tags.publish`` under ``registry`` (``suffix``: a target's ``-<target>``):
    the one check that the template holds the date and then the revision, which ``tags --registry`` and
    ``publish`` both make."""
    try:
        return TagScheme.from_render(lambda d, r: publish_ref(loaded, registry, d, r).tag + suffix)
    except UserError as err:
        if err.file is not None:
            raise
        raise UserError(
            f"tags.publish: {err.message}", **loaded.position(("tags", "publish")).as_error_kwargs(), fix=err.fix
        ) from None


def alias_refs(loaded: LoadedStack | ResolvedStack, registry: str) -> list[Ref]:
    """The moving aliases under ``registry``: rendered at publish time, like :func:`publish_ref`, from the
    resolved context."""
    data = loaded.resolved.context
    return [
        checked_ref(
            loaded,
            f"{check_registry(registry)}/{render_template(loaded, t, ('tags', 'aliases', i), data=data)}",
            ("tags", "aliases", i),
        )
        for i, t in enumerate(loaded.model.tags.aliases)
    ]
