"""Image references derived from the pins, never typed by hand.

Templates live in the stack (``tags:``); every rendered reference is checked
against the OCI distribution grammar for repository names and tags.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

import jinja2

from .errors import UserError
from .model import Stack
from .pins import Pin
from .stack import position

TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
PATH_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
REPO_PATH_RE = re.compile(rf"^{PATH_COMPONENT}(?:/{PATH_COMPONENT})*$")
HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                     r"|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$")
DATE_RE = re.compile(r"^\d{8}$")


@dataclass(frozen=True)
class Ref:
    repository: str  # registry host (if any) + path
    tag: str

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
    env.filters["tagsafe"] = lambda v: str(v).replace("+", "_")
    env.filters["public"] = lambda v: Pin(str(v)).public
    env.filters["local"] = lambda v: Pin(str(v)).local or ""
    env.filters["musa_arch"] = musa_arch
    return env


def musa_arch(value: str) -> str:
    """A MUSA GPU architecture as compute capability: mp_31 → 3.1 (MATE_MUSA_ARCH_LIST's form)."""
    m = re.fullmatch(r"mp_(\d)(\d+)", str(value))
    if not m:
        raise jinja2.TemplateError(f"'{value}' is not a MUSA GPU architecture like mp_31")
    return f"{m.group(1)}.{m.group(2)}"


def context(stack: Stack, **extra) -> dict:
    """Values a tag or label template may use."""
    return {
        "stack": {"name": stack.name},
        "platform": stack.platform.model_dump(),
        "packages": {n: Pin(p.version).as_context() for n, p in stack.packages.items()},
        "upstreams": {n: u.model_dump() for n, u in stack.upstreams.items()},
        "base": stack.base.model_dump(),
        **extra,
    }


def render_template(stack: Stack, template: str, path: tuple, **extra) -> str:
    try:
        return _env().from_string(template).render(context(stack, **extra)).strip()
    except jinja2.UndefinedError as exc:
        raise UserError(f"{'.'.join(map(str, path))}: template uses an unknown value ({exc.message})",
                        **position(stack, path).as_error_kwargs(),
                        fix="use platform.*, packages.<name>.version|public|local, upstreams.<name>.tag, "
                            "stack.name, date, revision") from None
    except jinja2.TemplateError as exc:
        raise UserError(f"{'.'.join(map(str, path))}: invalid template: {exc}",
                        **position(stack, path).as_error_kwargs(), fix="check the {{ … }} braces and filters") from None


def check_tag(tag: str) -> str | None:
    """Return a reason when ``tag`` is not a valid OCI tag."""
    if TAG_RE.match(tag):
        return None
    if len(tag) > 128:
        return f"is {len(tag)} characters long (at most 128)"
    bad = sorted({c for c in tag if not re.match(r"[A-Za-z0-9._-]", c)})
    if bad:
        return "contains " + ", ".join(repr(c) for c in bad) + " (allowed: letters, digits, '.', '_', '-')"
    return "must start with a letter, digit or '_'"


def check_repository(repo: str) -> str | None:
    """Return a reason when ``repo`` (optionally with a registry host) is not a valid repository name."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        if not HOST_RE.match(first):
            return f"registry host '{first}' is not a valid host[:port]"
        path = rest
    else:
        path = repo
    if not REPO_PATH_RE.match(path):
        return f"repository path '{path}' must be lowercase letters, digits and separators (., _, __, -) between '/'"
    return None


def parse_ref(text: str) -> Ref:
    """Split ``[host[:port]/]path:tag`` (the last ':' after the last '/')."""
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon <= slash:
        raise ValueError(f"'{text}' has no ':tag'")
    return Ref(text[:colon], text[colon + 1:])


def _checked(stack: Stack, text: str, path: tuple) -> Ref:
    try:
        ref = parse_ref(text)
    except ValueError as exc:
        raise UserError(f"{'.'.join(map(str, path))} renders '{text}', which {exc}",
                        **position(stack, path).as_error_kwargs(), fix="write the template as repository:tag") from None
    for reason in (check_repository(ref.repository), check_tag(ref.tag)):
        if reason:
            in_repo = reason.startswith(("repository", "registry"))
            what = "" if in_repo else f"tag '{ref.tag}' "
            raise UserError(f"{'.'.join(map(str, path))} renders '{text}': {what}{reason}",
                            **position(stack, path).as_error_kwargs(),
                            fix="change the template: repository names are lowercase" if in_repo else
                            "change the template (the tagsafe filter turns '+' into '_')")
    return ref


def local_ref(stack: Stack) -> Ref:
    return _checked(stack, render_template(stack, stack.tags.local, ("tags", "local")), ("tags", "local"))


def check_registry(registry: str) -> str:
    registry = registry.rstrip("/")
    reason = check_repository(registry + "/x") if registry else "is empty"
    if reason or "://" in registry:
        raise UserError(f"registry '{registry}' is not a valid registry reference"
                        + (f": {reason}" if reason and "://" not in registry else ""),
                        file="--registry", fix="write host[:port][/path], e.g. registry.example.com/team (no scheme)")
    return registry


def publish_ref(stack: Stack, registry: str, date: str | None = None, revision: int = 1) -> Ref:
    if not stack.tags.publish:
        raise UserError(f"stack '{stack.name}' declares no tags.publish template",
                        **position(stack, ("tags",)).as_error_kwargs(), fix="add tags.publish to the stack")
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    if not DATE_RE.match(date):
        raise UserError(f"date '{date}' is not YYYYMMDD", file="--date", fix="e.g. --date 20260929")
    if revision < 1:
        raise UserError("revision must be 1 or more", file="--revision", fix="e.g. --revision 2")
    text = render_template(stack, stack.tags.publish, ("tags", "publish"), date=date, revision=revision)
    return _checked(stack, f"{check_registry(registry)}/{text}", ("tags", "publish"))


def alias_refs(stack: Stack, registry: str) -> list[Ref]:
    return [_checked(stack, f"{check_registry(registry)}/{render_template(stack, t, ('tags', 'aliases', i))}",
                     ("tags", "aliases", i)) for i, t in enumerate(stack.tags.aliases)]


def labels(stack: Stack) -> dict[str, str]:
    return {k: render_template(stack, v, ("labels", k)) for k, v in stack.labels.items()}
