"""Verbs over recipes: lint (against the repository and an image), docs (the generated cookbook), schema."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, print_json, root_of, workspace_of
from stackforge.errors import UserError

if TYPE_CHECKING:
    from stackforge.recipes import docs as docsmod
    from stackforge.recipes import lint as lintmod
    from stackforge.recipes.load import LoadedRecipe, list_recipes, load_recipe
else:
    docsmod = lazy("stackforge.recipes.docs")
    lintmod = lazy("stackforge.recipes.lint")
    list_recipes = lazy("stackforge.recipes.load", "list_recipes")
    load_recipe = lazy("stackforge.recipes.load", "load_recipe")


def register(sub) -> None:
    top = sub.add_parser(
        "recipe", help="recipes/: lint them against the repository and an image, generate the cookbook"
    )
    verbs = top.add_subparsers(dest="recipe_command", metavar="VERB")
    verbs.required = True

    p = verbs.add_parser("lint", help="check recipes (exit 0 clean, 1 findings, 2 invalid input)")
    p.add_argument("recipes", nargs="*", metavar="RECIPE", help="recipe names or .yaml paths (default: every recipe)")
    p.add_argument(
        "--image",
        metavar="REF",
        help="also check against this local image: every serve flag is in its `vllm serve --help=all`, every env "
        "override is read by its entrypoint",
    )
    add_json(p, "{ok, recipes: [per-recipe findings]}")
    p.set_defaults(func=cmd_lint)

    p = verbs.add_parser("docs", help="render docs/cookbook/<recipe>.md and README.md's recipe table from recipes/")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is out of date")
    add_json(p, "the files written (or, with --check, the stale ones)")
    p.set_defaults(func=cmd_docs)

    p = verbs.add_parser("schema", help="print the JSON Schema of recipe files (for editors)")
    add_json(p, "the schema (always JSON; accepted for symmetry)")
    p.set_defaults(func=cmd_schema)


def cmd_lint(args) -> int:
    root = root_of(args)
    names = args.recipes or list_recipes(root)
    image = None
    if args.image:
        image = lintmod.DockerImage(args.image, workspace_of(args).engine)
    report: list[dict[str, Any]] = []
    invalid = False
    for name in names:
        try:
            recipe = load_recipe(root, name)
        except UserError as err:
            invalid = True
            report.append({"recipe": name, "invalid": err.render()})
            continue
        findings = lintmod.check_repository(recipe, root)
        if image is not None:
            findings += lintmod.check_image(recipe, image)
        report.append({"recipe": recipe.name, "file": recipe.display, "found": findings})
    if args.json:
        rows = [
            {k: v for k, v in r.items() if k != "found"}
            | ({"findings": [lintmod.as_finding(f) for f in r["found"]]} if "found" in r else {})
            for r in report
        ]
        ok = not invalid and not any(r.get("found") for r in report)
        print_json({"ok": ok, "image": args.image, "recipes": rows})
    else:
        for r in report:
            if "invalid" in r:
                print(r["invalid"], file=sys.stderr)
            elif r["found"]:
                for f in r["found"]:
                    print(f.render())
            else:
                print(f"{r['recipe']}: ok" + (f" (against {args.image})" if args.image else ""))
    if invalid:
        return 2
    return 1 if any(r.get("found") for r in report) else 0


def _all(root) -> list[LoadedRecipe]:
    return [load_recipe(root, n) for n in list_recipes(root)]


def cmd_docs(args) -> int:
    root = root_of(args)
    result = docsmod.generate(root, _all(root), check=args.check)
    stale = result.written + result.removed
    if args.json:
        print_json(
            {"check": args.check, "written" if not args.check else "stale": result.written, "removed": result.removed}
        )
    elif args.check:
        for rel in result.written:
            print(f"{rel}: out of date")
        for rel in result.removed:
            print(f"{rel}: generated from a recipe that no longer exists")
    else:
        for rel in result.written:
            print(f"wrote {rel}")
        for rel in result.removed:
            print(f"removed {rel}")
    if args.check and stale:
        print("error: the cookbook differs from recipes/\n  fix: run: stackforge recipe docs", file=sys.stderr)
        return 1
    return 0


def cmd_schema(args) -> int:
    from stackforge.recipes.model import Recipe

    schema = Recipe.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "stackforge recipe file"
    print(json.dumps(schema, indent=2))
    return 0
