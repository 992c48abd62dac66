"""Render the multi-stage Dockerfile from the plan (templates live in images/)."""
from __future__ import annotations

from pathlib import Path

import jinja2

from .plan import Plan

IMAGES_DIR = Path(__file__).resolve().parents[2] / "images"


def images_dir() -> Path:
    return IMAGES_DIR


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(IMAGES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def render_dockerfile(plan: Plan, labels: dict[str, str] | None = None, syntax: str | None = None) -> str:
    """The Dockerfile text. ``syntax`` adds a `# syntax=` line (off by default: it needs a registry)."""
    text = _env().get_template("Dockerfile.j2").render(plan=plan, labels=labels or {}, syntax=syntax)
    # Collapse the blank runs left by template control lines.
    out, blank = [], 0
    for line in text.splitlines():
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
