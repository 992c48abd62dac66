"""``stackforge smoke RECIPE``: start the recipe's image, prove it serves, keep the evidence."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, print_json, root_of, workspace_of
from stackforge.errors import UserError

if TYPE_CHECKING:
    from stackforge.builder.records import evidence
    from stackforge.recipes.load import LoadedRecipe, load_recipe
else:
    evidence = lazy("stackforge.builder.records.evidence")
    load_recipe = lazy("stackforge.recipes.load", "load_recipe")


def register(sub) -> None:
    p = sub.add_parser(
        "smoke",
        help="start a recipe's image with its flags, wait for readiness, run its smoke rows, keep the evidence "
        "(exit 0 every row passed, 1 a row failed, 3 no row failed but some did not run, e.g. no device; "
        "2 invalid input)",
    )
    p.add_argument(
        "recipe",
        metavar="RECIPE",
        help="a recipe name (recipes/<name>.yaml) or a .yaml path (the one way outside a checkout)",
    )
    p.add_argument(
        "--image",
        metavar="REF",
        help="the local image to smoke (default: the local tag of the recipe's stack and target, as "
        "`stackforge build STACK --target T` made it; required outside a checkout)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where smoke.json and container.log go (default: smoke/<recipe>/ in the evidence of the build that "
        "made the image, build/<stack>/evidence/<build-id>/; for an image no build made: build/<stack>/smoke/<id>/; "
        "outside a checkout: ./smoke/<id>/<recipe>/)",
    )
    p.add_argument(
        "--allow-missing-hardware",
        action="store_true",
        help="on a host without the recipe's devices, start the container without device options and run the "
        "rows anyway (stand-in images, CI); smoke.json records that the hardware was missing",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra container environment variable (repeatable; recorded by name only)",
    )
    p.add_argument(
        "--readiness-timeout",
        type=float,
        metavar="SECONDS",
        help="wait at most this long for readiness (default: the recipe's readiness.timeout_s)",
    )
    p.add_argument(
        "--configuration",
        metavar="NAME",
        help="run this one of the recipe's configurations (its serve flags, env values and token budget; default: "
        "the first); its evidence goes to smoke/<recipe>@<NAME>/ unless it is the default",
    )
    p.add_argument(
        "--device-uuid",
        action="append",
        default=[],
        metavar="UUID",
        help="the device uuid the lease granted (repeatable, or a comma list; default: $STACKFORGE_DEVICE_UUID): the "
        "preflight fails when the container sees other devices, and is not run when it sees none",
    )
    add_json(p, "smoke.json (the run, its hardware, container and rows)")
    p.set_defaults(func=cmd_smoke)


def checkout_of(args) -> Path | None:
    """The repository a smoke reads: ``--root DIR`` (checked), else the one found upwards from here, else the recipe
    file's own; None when there is none (an operator holding only a recipe file)."""
    from stackforge.smoke.run import recipe_repository_of

    if getattr(args, "root", None):
        return root_of(args)  # a --root that holds no stacks/ is an error
    try:
        return root_of(args)
    except UserError:  # no stacks/ here or above
        path = Path(args.recipe)
        return recipe_repository_of(path) if path.suffix in (".yaml", ".yml") or "/" in args.recipe else None


def default_image(recipe: LoadedRecipe, root: Path | None) -> str:
    """The local tag ``stackforge build`` gives the recipe's stack and target."""
    from stackforge.builder.run.run import target_ref
    from stackforge.stack.load import load

    img = recipe.model.image
    if root is None:
        raise UserError(
            f"{recipe.display}: no checkout here, so the local tag of its image (stack {img.stack}, target "
            f"{img.target}) is unknown",
            file="--image",
            fix="name the image to smoke: stackforge smoke RECIPE.yaml --image REF",
        )
    if img.overlay is not None:
        raise UserError(
            f"{recipe.display}: the image carries overlay {img.overlay!r}; name it with --image",
            fix=f"pass --image REF of the {img.overlay} overlay's image",
        )
    loaded = load(img.stack, root=root)
    return target_ref(loaded, img.target)


def evidence_name(recipe: LoadedRecipe, configuration: str | None) -> str:
    """The recipe's name in evidence paths: ``<recipe>`` for its default configuration, else
    ``<recipe>@<configuration>``. Raises UserError (exit 2) naming the declared configurations."""
    try:
        chosen = recipe.model.configuration(configuration)
    except KeyError as err:
        declared = [c.name for c in recipe.model.configurations]
        raise UserError(
            f"--configuration {configuration}: {err.args[0]}",
            **recipe.key_pos(("configurations",) if declared else ()).as_error_kwargs(),
            fix=f"use one of: {', '.join(declared)}" if declared else "drop --configuration",
            exit_code=2,
        ) from None
    default = recipe.model.configuration()
    return recipe.name if chosen is None or chosen is default else f"{recipe.name}@{chosen.name}"


def cmd_smoke(args) -> int:
    from stackforge.smoke.device_uuid import expected
    from stackforge.smoke.run import SmokeOptions, parse_env, smoke

    root = checkout_of(args)
    recipe = load_recipe(root, args.recipe)
    name = evidence_name(recipe, args.configuration)
    env = parse_env(args.env)
    device_uuids = expected(args.device_uuid)
    if args.readiness_timeout is not None and not 0 < args.readiness_timeout <= 86400:
        raise UserError(f"--readiness-timeout {args.readiness_timeout:g}: give 0 < SECONDS <= 86400")
    image = args.image or default_image(recipe, root)
    engine = workspace_of(args).engine
    image_id = engine.image_id(image)
    if image_id is None:
        raise UserError(
            f"no image {image} in the engine",
            file="--image" if args.image else recipe.display,
            fix=f"build it: stackforge build {recipe.model.image.stack} --target {recipe.model.image.target}"
            if not args.image
            else "build or pull it first",
        )
    if args.out:
        out = args.out
    elif root is not None:
        out = evidence.smoke_dir(root / "build" / recipe.model.image.stack, image_id, name)
    else:  # no checkout: beside where it runs
        out = Path.cwd() / "smoke" / image_id.removeprefix("sha256:")[:12] / name
    options = SmokeOptions(
        allow_missing_hardware=args.allow_missing_hardware,
        env=env,
        readiness_timeout=args.readiness_timeout,
        echo=lambda line: print(line, file=sys.stderr, flush=True),
        root=root,
        configuration=args.configuration,
        device_uuids=device_uuids,
    )
    report = smoke(recipe, image, out, options, engine=engine, image_id=image_id)
    if args.json:
        print_json(report.to_json())
    else:
        print(report.table())
        print(f"evidence: {out}")
    if report.exit_code == 0:
        return 0
    missing = report.hardware.get("missing")
    if missing and not report.hardware.get("allowed_missing"):
        print(
            f"error: {missing}: every row is recorded as not-run ({out / 'smoke.json'})\n"
            "  fix: run on a host with the recipe's hardware, or pass --allow-missing-hardware to run the rows "
            "without devices",
            file=sys.stderr,
        )
    return report.exit_code
