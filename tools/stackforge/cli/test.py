"""``stackforge test STACK|IMAGE``: run the declared test slices inside the image, judge their counts, keep the
evidence."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, print_json, root_of, workspace_of
from stackforge.errors import UserError

if TYPE_CHECKING:
    from stackforge.builder.records import evidence
    from stackforge.smoke import slices
    from stackforge.stack.load import LoadedStack
else:
    evidence = lazy("stackforge.builder.records.evidence")
    slices = lazy("stackforge.smoke.slices")


def register(sub) -> None:
    p = sub.add_parser(
        "test",
        help="run the test slices a stack and its recipes declare inside the image (read-only root, no network), "
        "compare pytest's counts with the declared ones, keep result.json and the JUnit XML (exit 0 every slice "
        "passed, 1 one failed, 3 none failed but some did not run, e.g. no device; 2 invalid input)",
    )
    p.add_argument(
        "subject",
        metavar="STACK|IMAGE",
        help="a stack name (its locally built image of each slice's target) or a local image reference (its "
        "org.stackforge labels name the stack whose slices run)",
    )
    p.add_argument(
        "--slice",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this slice (repeatable; <recipe>.<name> for a recipe's)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write each slice's evidence to DIR/<slice>/ (default: tests/<slice>/ in the evidence of the build "
        "that made the image, build/<stack>/evidence/<build-id>/; for an image no build made: "
        "build/<stack>/tests/<id>/<slice>/)",
    )
    p.add_argument(
        "--allow-missing-hardware",
        action="store_true",
        help="run a slice that needs devices on a host without them anyway (recorded; never a pass)",
    )
    add_set(p)
    add_json(p, "every slice's result.json and the exit code")
    p.set_defaults(func=cmd_test)


def _is_stack(root: Path, subject: str) -> bool:
    return "/" not in subject and ":" not in subject and (root / "stacks" / f"{subject}.yaml").is_file()


def _runs(args, root: Path) -> tuple[LoadedStack, list[tuple[slices.SliceRef, str, str | None]]]:
    """The stack and each slice to run with its image and that image's id."""
    engine = workspace_of(args).engine
    if _is_stack(root, args.subject):
        from stackforge.builder.run.run import target_ref

        loaded = load(args, args.subject)
        refs = _chosen(slices.declared(loaded), args.slice, loaded.name)
        out = []
        for ref in refs:
            if ref.target is None:
                raise UserError(
                    f"stacks/{loaded.name}.yaml: slice {ref.name} has no target to run in", fix="declare targets:"
                )
            image = target_ref(loaded, ref.target)
            out.append((ref, image, engine.image_id(image)))
        return loaded, out
    from stackforge.builder.run.verify import image_labels, stack_of

    labels = image_labels(engine, args.subject)
    name = stack_of(labels, args.subject)
    if not (root / "stacks" / f"{name}.yaml").is_file():
        raise UserError(
            f"image {args.subject} is of stack {name!r}, which this repository does not declare",
            file="IMAGE",
            fix=f"run from a checkout holding stacks/{name}.yaml",
        )
    loaded = load(args, name)
    refs = _chosen(slices.declared(loaded, labels.get("org.stackforge.overlay")), args.slice, loaded.name)
    wrong = slices.image_mismatch(loaded, labels, refs)
    if wrong:
        raise UserError(
            f"image {args.subject} is not an image of stacks/{name}.yaml as declared: " + "; ".join(wrong),
            file="IMAGE",
            fix=f"check out the revision of stacks/{name}.yaml the image was built from, or rebuild: stackforge build {name}",
        )
    return loaded, [(ref, args.subject, engine.image_id(args.subject)) for ref in refs]


def _chosen(refs: list[slices.SliceRef], wanted: list[str], stack: str) -> list[slices.SliceRef]:
    if not refs:
        raise UserError(
            f"stacks/{stack}.yaml and its recipes declare no test slice",
            file=f"stacks/{stack}.yaml",
            fix="declare one under tests: (see docs/test-slices.md)",
        )
    known = [r.name for r in refs]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise UserError(f"--slice {unknown[0]}: no such slice", file="--slice", fix=f"one of: {', '.join(known)}")
    return [r for r in refs if not wanted or r.name in wanted]


def cmd_test(args) -> int:
    root = root_of(args)
    loaded, runs = _runs(args, root)
    workspace = workspace_of(args)
    facts = None
    results = []
    for ref, image, image_id in runs:
        if image_id is None:
            raise UserError(
                f"no image {image} in the engine (slice {ref.name}, target {ref.target})",
                fix=f"build it: stackforge build {loaded.name} --target {ref.target}",
            )
        if facts is None:
            from stackforge.smoke.run import host_facts

            facts = host_facts(workspace.engine)
        outdir = (
            args.out / ref.name if args.out else evidence.tests_dir(root / "build" / loaded.name, image_id, ref.name)
        )
        print(f"test: {ref.name} in {image}", file=sys.stderr, flush=True)
        where = slices.SliceTarget(image, image_id, outdir)
        results.append(
            slices.run_slice(
                loaded, ref, where, workspace, allow_missing_hardware=args.allow_missing_hardware, facts=facts
            )
        )
    code = overall(r.exit_code for r in results)
    if args.json:
        print_json({"stack": loaded.name, "exit_code": code, "slices": [r.to_json() for r in results]})
    else:
        for r in results:
            print("\n".join(r.lines()))
            print(f"  evidence: {r.evidence}")
    return code


def overall(codes) -> int:
    """1 when a slice failed, else 3 when one did not run, else 0."""
    seen = set(codes)
    return 1 if 1 in seen else 3 if 3 in seen else 0
