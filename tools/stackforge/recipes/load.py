"""Read ``recipes/<name>.yaml`` with positions (the stacks' YAML loader and its limits) and validate it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stackforge.errors import UserError
from stackforge.recipes.model import RECIPE_NAME, Recipe
from stackforge.stack.load import Located, StackInvalid, load_model

RECIPES_DIR = "recipes"


@dataclass(frozen=True)
class LoadedRecipe(Located):
    """A validated recipe with where each of its values and keys was written."""

    name: str
    path: Path
    display: str  # the file as errors name it (relative to the root when inside it)
    model: Recipe = field(compare=False, repr=False)
    positions: dict = field(compare=False, repr=False)
    keypositions: dict = field(compare=False, repr=False)

    def error(self, message: str, path: tuple, fix: str | None = None, *, exit_code: int = 1) -> UserError:
        return UserError(message, **self.key_pos(path).as_error_kwargs(), fix=fix, exit_code=exit_code)


def list_recipes(root: Path) -> list[str]:
    d = Path(root) / RECIPES_DIR
    return sorted(p.stem for p in d.glob("*.yaml") if p.is_file() and RECIPE_NAME.match(p.stem)) if d.is_dir() else []


def recipe_path(root: Path | None, name: str) -> Path:
    """``name`` as recipes/<name>.yaml of the repository at ``root``, or a path to a .yaml file (the one way to
    name a recipe with no repository: ``root`` None)."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name)
    if root is None:
        raise UserError(
            f"no checkout here to find recipe {name!r} in (no {RECIPES_DIR}/ of a repository)",
            file=f"{RECIPES_DIR}/{name}.yaml",
            fix="name the recipe by its file's path (e.g. ./qwen3-8b.yaml), or run inside a checkout",
        )
    if not RECIPE_NAME.match(name):
        raise UserError(
            f"{name!r} is not a recipe name",
            file=f"{RECIPES_DIR}/",
            fix="name a recipe by its file's stem (lower-case letters, digits, '.', '_', '-'), or pass a .yaml path",
        )
    path = Path(root) / RECIPES_DIR / f"{name}.yaml"
    if not path.is_file():
        known = list_recipes(root)
        raise UserError(
            f"no recipe {name!r}",
            file=f"{RECIPES_DIR}/{name}.yaml",
            fix=f"one of: {', '.join(known)}" if known else f"write {RECIPES_DIR}/{name}.yaml",
        )
    return path


def _display(root: Path | None, path: Path) -> str:
    if root is None:
        return str(path)
    try:
        return str(path.resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def load_recipe(root: Path | None, name_or_path: str) -> LoadedRecipe:
    """Load and validate one recipe (``root``: the repository, None for a recipe file outside any); raises
    ``StackInvalid`` (every problem, exit 2) or ``UserError``."""
    path = recipe_path(root, name_or_path)
    display = _display(root, path)
    stem = path.stem
    if not RECIPE_NAME.match(stem):
        raise UserError(
            f"{stem!r} is not a recipe name",
            file=display,
            fix="rename the file: lower-case letters, digits, '.', '_', '-' (it names the cookbook page)",
        )
    model, values, keys = load_model(Recipe, path, display, "a recipe", "recipes/README.md")
    loaded = LoadedRecipe(stem, path, display, model, values, keys)
    found = [loaded.error(msg, at, fix, exit_code=2) for msg, at, fix in model.problems()]
    if found:
        raise StackInvalid(found)
    return loaded
