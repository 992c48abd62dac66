"""What the nightly adds after a publish: the smoke of the image's nightly recipes (the ``-latest`` alias
moves only when every one passed, or when the image has none) and, per stack, whether every pin is still
the newest of its line (``stackforge newest``), so the summary says when a release train has moved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge.errors import UserError
from stackforge.freshness.newest import STATUS_NEWER, STATUS_NEWEST, newest
from stackforge.recipes.load import LoadedRecipe, list_recipes, load_recipe
from stackforge.smoke.report import PASSED, SmokeReport, one_line
from stackforge.smoke.run import SmokeOptions
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.clients.workspace import Workspace
    from stackforge.stack.resolved import ResolvedStack


@dataclass
class NightlyRecipes:
    """The repository's nightly recipes by the (stack, target) whose image they smoke; recipes that did not load."""

    by_image: dict[tuple[str, str], list[LoadedRecipe]] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # recipe -> the error

    def of(self, stack: str, target: str) -> list[LoadedRecipe]:
        return self.by_image.get((stack, target), [])


def nightly_recipes(root: Path) -> NightlyRecipes:
    """Every ``nightly: true`` recipe of ``root/recipes`` on an image the nightly builds (no overlay)."""
    out = NightlyRecipes()
    for name in list_recipes(root):
        try:
            loaded = load_recipe(root, name)
        except UserError as err:
            out.invalid[name] = err.render()
            continue
        img = loaded.model.image
        if loaded.model.nightly and img.overlay is None:
            out.by_image.setdefault((img.stack, img.target), []).append(loaded)
    return out


@dataclass
class SmokeVerdict:
    verdict: str  # passed | failed | not-run | none (no nightly recipe)
    recipes: dict[str, str] = field(default_factory=dict)  # recipe -> passed | failed | not-run
    reason: str | None = None

    @property
    def moves_aliases(self) -> bool:
        return self.verdict in (PASSED, "none")


def smoke_image(
    recipes: list[LoadedRecipe],
    image: str,
    evidence: Path,
    run_smoke: Callable[..., SmokeReport],
    options: SmokeOptions,
    **kwargs: Any,
) -> SmokeVerdict:
    """Smoke ``image`` with each recipe as ``options`` say (evidence in ``evidence/smoke/<recipe>/``)."""
    if not recipes:
        return SmokeVerdict("none")
    reports = {r.name: run_smoke(r, image, evidence / "smoke" / r.name, options=options, **kwargs) for r in recipes}
    verdicts = {name: rep.verdict for name, rep in reports.items()}
    if all(v == PASSED for v in verdicts.values()):
        return SmokeVerdict(PASSED, verdicts)
    worst = "failed" if "failed" in verdicts.values() else "not-run"
    why = []
    for name, rep in reports.items():
        if rep.verdict == PASSED:
            continue
        bad = [r for r in rep.rows if r.status != PASSED]
        first = next((r for r in bad if r.status == "failed"), bad[0] if bad else None)
        if first:
            detail = f"{first.name} {first.status}: {one_line(first.reason, 160)}"
        elif rep.without_hardware:
            detail = f"every row passed without the declared hardware ({rep.hardware.get('missing')})"
        else:
            detail = rep.error or "no row ran"
        why.append(f"{name}: {detail}")
    return SmokeVerdict(worst, verdicts, "; ".join(why))


def pin_freshness(loaded: LoadedStack | ResolvedStack, workspace: Workspace) -> dict[str, Any]:
    """Whether every pin of the stack is the newest of its line: the packages with a newer release, the
    trains whose newest members differ from the pins (the train has moved); an index that does not answer
    makes the answer unknown."""

    try:
        report = newest(loaded, workspace=workspace)
    except (UserError, OSError) as err:
        return {"newest": None, "newer": [], "trains_moved": [], "unknown": [], "error": one_line(str(err))}
    newer = [
        {"package": p.name, "pinned": p.pinned, "newest": p.newest} for p in report.packages if p.status == STATUS_NEWER
    ]
    unknown = [p.name for p in report.packages if p.status not in (STATUS_NEWER, STATUS_NEWEST)]
    moved = sorted({t.name for t in report.trains if t.which == "newest"})
    return {
        "newest": not newer and not unknown,
        "newer": newer,
        "trains_moved": moved,
        "unknown": unknown,
        "error": None,
    }


def freshness_line(stack: str, data: dict[str, Any]) -> str:
    """One markdown table row: stack | every pin newest? | what moved."""
    if data.get("error"):
        return f"| {stack} | unknown | {data['error']} |"
    moved = [f"{n['package']} {n['pinned']} → {n['newest']}" for n in data["newer"]]
    notes = []
    if data["trains_moved"]:
        notes.append("train moved: " + ", ".join(data["trains_moved"]))
    if moved:
        notes.append("newer: " + ", ".join(moved))
    if data["unknown"]:
        notes.append("not answered: " + ", ".join(data["unknown"]))
    verdict = "yes" if data["newest"] else ("no" if moved else "unknown")
    return f"| {stack} | {verdict} | {'; '.join(notes).replace('|', '/')} |"
