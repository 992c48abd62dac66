"""Render the multi-stage Dockerfile from the plan (templates live in images/)."""
from __future__ import annotations

from pathlib import Path

import jinja2

from .errors import UserError
from .plan import Plan

SOURCE_IMAGES = Path(__file__).resolve().parents[2] / "images"


def images_dir(root: Path | None = None) -> Path:
    """The templates and image scripts: the repository's images/ (``root``) when it has them, else the
    ones beside this source tree."""
    if root is not None and (Path(root) / "images" / "Dockerfile.j2").is_file():
        return Path(root) / "images"
    if (SOURCE_IMAGES / "Dockerfile.j2").is_file():
        return SOURCE_IMAGES
    raise UserError("no images/Dockerfile.j2 found", fix="run stackforge inside its repository (or pass --root)")


def _env(root: Path | None) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images_dir(root))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def render_dockerfile(plan: Plan, labels: dict[str, str] | None = None, syntax: str | None = None,
                      root: Path | None = None) -> str:
    """The Dockerfile text. ``syntax`` adds a `# syntax=` line (off by default: it needs a registry)."""
    text = _env(root).get_template("Dockerfile.j2").render(plan=plan, labels=labels or {}, syntax=syntax)
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
