"""Render the multi-stage Dockerfile from the plan (templates live in images/)."""

from __future__ import annotations

import json
import re
import secrets
import shlex
from pathlib import Path

import jinja2
from jinja2.sandbox import SecurityError

from stackforge import grammar
from stackforge.builder.plan.cabundle import BIND, CaMount
from stackforge.builder.plan.plan import EPOCH_LABEL, Plan
from stackforge.digests import tree_digest
from stackforge.errors import UserError
from stackforge.stack.tags import Sandbox

#: the templates and in-image scripts stackforge ships (package data: a wheel carries them)
SOURCE_IMAGES = Path(__file__).resolve().parents[2] / "images"
#: Longest Dockerfile the template may render.
MAX_DOCKERFILE = 4 * 1024 * 1024
# Line breaks JSON leaves as they are but str.splitlines (and a reader) would break a line at.
_JSON_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def templates_digest(images: Path) -> str:
    """The templates and image scripts an image is built from: ``images/`` without the local base image's
    directory and bytecode, read through its symlinks, each file's mode as the build context gives it (a checkout
    or an install made under another umask names the same templates)."""
    return tree_digest(images, follow_links=True, skip=("base", "__pycache__"), portable_modes=True)


def images_dir(root: Path | None = None) -> Path:
    """The templates and image scripts: a repository's own images/ (``root``) when it carries them, else the
    ones stackforge ships (``stackforge/images/``, in the checkout and in an installed wheel alike)."""
    if root is not None and (Path(root) / "images" / "Dockerfile.j2").is_file():
        return Path(root) / "images"
    if (SOURCE_IMAGES / "Dockerfile.j2").is_file():
        return SOURCE_IMAGES
    raise UserError(
        f"stackforge's templates are missing: no {SOURCE_IMAGES / 'Dockerfile.j2'}",
        fix="reinstall stackforge (its wheel carries stackforge/images/)",
    )


def dockerword(value: object) -> str:
    """A double-quoted Dockerfile word (ENV and LABEL keys and values) that reads back as exactly ``value``.

    Inside double quotes the Dockerfile parser takes ``\\"``, ``\\\\`` and ``\\$`` as escapes and expands
    ``$NAME``; every other character, UTF-8 included, stands for itself. A line break cannot be written."""
    text = str(value)
    bad = grammar.bad_char(text)
    if bad:
        raise ValueError(f"{text!r} contains {bad}, which a Dockerfile value cannot hold")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def execform(value: list[str]) -> str:
    """The JSON exec form of ENTRYPOINT/CMD on one line: UTF-8 kept, no HTML escaping, no substitution."""
    text = json.dumps([str(v) for v in value], ensure_ascii=False)
    for raw, escaped in _JSON_LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text


def shellword(value: object) -> str:
    """A word of a RUN shell line, quoted only when it holds characters the shell would interpret."""
    text = str(value)
    if grammar.bad_char(text):
        raise ValueError(f"{text!r} contains {grammar.bad_char(text)}, which a shell word cannot hold")
    return shlex.quote(text)


def _env(root: Path | None) -> Sandbox:
    env = Sandbox(
        limit=MAX_DOCKERFILE,
        loader=jinja2.FileSystemLoader(str(images_dir(root))),
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
    builtin = env.filters
    env.filters = {"length": builtin["length"], "dockerword": dockerword, "execform": execform, "shellword": shellword}
    return env


#: what a clean build's cache mount ids end with (:func:`clean_scope`); a shared mount's id has no suffix
CLEAN_SCOPE = re.compile(r"-clean-[0-9a-f]{12}")


def clean_scope() -> str:
    """A suffix for the cache mount ids of one clean (``--no-cache``) build: ``-clean-`` and 12 random hex digits.

    BuildKit starts every cache mount a ``--no-cache`` build names new and empty, and the builds after it use the
    new one (it drops the old one by its id). Ids of the build's own leave the shared mounts (``stackforge-pip``,
    ``stackforge-ccache``, apt's) to the other builds as they are, and the clean build reads none of their
    content. A mount's id is not part of a step's cache key, nor of the image."""
    return "-clean-" + secrets.token_hex(6)


def _epoch(labels: dict[str, str]) -> str:
    """The layer epoch the stages declare as SOURCE_DATE_EPOCH (``plan.EPOCH_LABEL``; digits only, else none)."""
    value = labels.get(EPOCH_LABEL, "")
    return value if value.isdigit() else ""


def render_dockerfile(
    plan: Plan,
    labels: dict[str, str] | None = None,
    syntax: str | None = None,
    root: Path | None = None,
    run_network: bool = False,
    ca: CaMount | None = BIND,
    cache_scope: str = "",
) -> str:
    """The Dockerfile text. ``syntax`` adds a `# syntax=` line (off by default: it needs a registry).
    ``run_network`` (the engine takes ``RUN --network=none``): the steps that must not reach the network
    (kernel builds, steps, post-install patches, the gates, inventories and checks) run with none at all;
    without it they are offline only by construction (no index, local git only).
    ``ca`` (the build passes a CA bundle): how the steps that download mount it (``builder/plan/cabundle.py``: a
    bind mount of the named context ``stackforge-cabundle``, or the secret ``cabundle`` on an engine without
    named contexts). ``None`` (no bundle): they declare no mount at all.
    ``cache_scope`` (a clean build's :func:`clean_scope`) ends the id of every cache mount: the build's own
    mounts instead of the shared ones."""
    if cache_scope and not CLEAN_SCOPE.fullmatch(cache_scope):
        raise ValueError(f"cache scope {cache_scope!r} is not one clean_scope() makes")
    env = _env(root)
    try:
        template = env.get_template("Dockerfile.j2")
        text = env.render_limited(
            template,
            {
                "plan": plan,
                "labels": labels or {},
                "syntax": syntax,
                "offline": "--network=none " if run_network else "",
                "ca": ca,
                "epoch": _epoch(labels or {}),
                "cache_scope": cache_scope,
            },
        )
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(
            f"invalid Dockerfile template: {exc.message}",
            file="images/Dockerfile.j2",
            line=exc.lineno,
            fix="fix the template's {{ … }} / {% … %} syntax",
        ) from None
    except (jinja2.TemplateError, SecurityError, ValueError, TypeError) as exc:
        raise UserError(
            f"cannot render images/Dockerfile.j2: {exc}",
            file="images/Dockerfile.j2",
            fix="the template may use the plan, the filters length, dockerword, execform and shellword; "
            "values must be single lines of printable text",
        ) from None
    # Collapse the blank runs left by template control lines (only \n breaks a Dockerfile line).
    out, blank = [], 0
    for line in text.split("\n"):
        blank = blank + 1 if not line.strip() else 0
        if blank <= 1:
            out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"


def requirements_text(pins: list[str], hashes: dict[str, list[str]] | None = None) -> str:
    lines = []
    for pin in pins:
        name = pin.split("==", 1)[0]
        extra = "".join(f" \\\n    --hash=sha256:{h}" for h in (hashes or {}).get(name, []))
        lines.append(pin + extra)
    return "\n".join(lines) + "\n"
