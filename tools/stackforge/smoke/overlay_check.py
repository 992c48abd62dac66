"""A recipe that needs an overlay (``needs.overlay`` / ``image.overlay``) is smoked only against an image that
carries that overlay's label (``org.stackforge.overlay=<name>``, written by ``stackforge build --overlay``):
the check runs before any container starts and refuses with the recipe's file and line (exit 2)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from stackforge.errors import UserError
from stackforge.overlay.build import NS as OVERLAY_LABEL
from stackforge.recipes.load import LoadedRecipe

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine


def image_labels(engine: Engine, image: str) -> dict[str, str]:
    """The image's labels (``docker image inspect``); an image the engine cannot inspect is refused."""
    proc = engine.inspect_image(image, "{{json .Config.Labels}}", timeout=60)
    if proc.returncode != 0:
        raise UserError(f"cannot inspect {image}: {(proc.stderr or proc.stdout).strip()[-200:]}",
                        fix="build or pull the image first")  # fmt: skip
    try:
        labels = json.loads(proc.stdout or "null") or {}
    except ValueError:
        labels = {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def require_overlay(loaded: LoadedRecipe, image: str, labels: dict[str, str]) -> None:
    """Refuse ``image`` when the recipe needs an overlay the image's labels do not name."""
    recipe = loaded.model
    wanted = recipe.needs.overlay or recipe.image.overlay
    if wanted is None:
        return
    have = labels.get(OVERLAY_LABEL)
    if have == wanted:
        return
    at = ("needs", "overlay") if recipe.needs.overlay else ("image", "overlay")
    carries = f"carries overlay {have!r}" if have else f"carries no {OVERLAY_LABEL} label"
    img = recipe.image
    raise loaded.error(
        f"{'.'.join(at)} is {wanted!r}, but the image {image} {carries}: it is not the {wanted} overlay's image; "
        "no container was started",
        at,
        fix=f"build the overlay image (stackforge build {img.stack} --overlay {wanted}) or pull the published one "
        f"(stackforge pull …), and pass it with --image",
        exit_code=2,
    )
