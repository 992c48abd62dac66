"""Verbs over the stack model: list, show, lint, tags, diff, schema."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, print_json, root_of, select, workspace_of
from stackforge.errors import UserError
from stackforge.stack import listing
from stackforge.stack.names import list_stacks
from stackforge.urls import redact_text

if TYPE_CHECKING:
    from stackforge.builder.context import prepare
    from stackforge.builder.locks import locks
    from stackforge.builder.records import waivers
    from stackforge.builder.sources import agree
    from stackforge.stack import diff as diffmod
    from stackforge.stack import platforms as lines_of
    from stackforge.stack import rules, tags
    from stackforge.stack.load import fingerprint, resolved
else:
    agree = lazy("stackforge.builder.sources.agree")
    locks = lazy("stackforge.builder.locks.locks")
    prepare = lazy("stackforge.builder.context.prepare")
    waivers = lazy("stackforge.builder.records.waivers")
    diffmod = lazy("stackforge.stack.diff")
    rules = lazy("stackforge.stack.rules")
    lines_of = lazy("stackforge.stack.platforms")
    tags = lazy("stackforge.stack.tags")
    fingerprint = lazy("stackforge.stack.load", "fingerprint")
    resolved = lazy("stackforge.stack.load", "resolved")


def register(sub) -> None:
    p = sub.add_parser("list", help="list the stacks in stacks/")
    add_json(p, "the stacks and their descriptions (or why they are invalid)")
    add_set(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="the resolved stack, its tags and the fingerprint of its inputs")
    p.add_argument("stack")
    add_json(p, "the resolved stack, files, overrides, tags and fingerprint")
    add_set(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "lint",
        help="check stacks against their release-train rules, and stacks/waivers.yaml (every waiver has a reason "
        "and has not expired) (exit 1 on findings)",
    )
    p.add_argument("stacks", nargs="*", help="default: every stack")
    p.add_argument(
        "--upstreams",
        action="store_true",
        help="fetch the upstreams that declare `agree:` when the host's cache lacks their pinned commit, and compare "
        "(default: compare only those already fetched; the others are a note)",
    )
    add_json(p, "the findings per stack (a list of objects)")
    add_set(p)
    p.set_defaults(func=cmd_lint)

    p = sub.add_parser("tags", help="the image references derived from the pins")
    p.add_argument("stack")
    p.add_argument("--registry", help="also print the publish reference under this registry/namespace")
    p.add_argument("--date", help="publish date YYYYMMDD (default: today, UTC)")
    p.add_argument(
        "--revision",
        type=int,
        default=None,
        help="publish revision N of -rN (default 1; `stackforge publish` picks the first free one)",
    )
    add_json(p, "the local reference, and with --registry the publish reference and aliases")
    add_set(p)
    p.set_defaults(func=cmd_tags)

    p = sub.add_parser("diff", help="the pin table between two stacks (--inventory: the installed dists of two builds)")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument(
        "--inventory",
        action="store_true",
        help="OLD and NEW are builds (evidence directories, build directories or inventory.json files) or local "
        "images: print the distributions added, removed and changed (version, index, archive sha256)",
    )
    p.add_argument(
        "--format",
        choices=["markdown", "json"],
        default="markdown",
        help="markdown (default) or json (the same as --json)",
    )
    add_json(p, "the pin table")
    add_set(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser(
        "schema", help="print the JSON Schema of stack files (for editors), or write the stack-file reference"
    )
    p.add_argument(
        "--docs",
        action="store_true",
        help="write docs/stack-reference.md (every key path: type, default, description) instead of printing",
    )
    p.add_argument(
        "--check", action="store_true", help="with --docs: write nothing; exit 1 if docs/stack-reference.md is stale"
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="the publish record's JSON Schema instead (with --docs: write docs/record-schema.json)",
    )
    add_json(p, "the schema (always JSON; accepted for symmetry); with --docs, the file and whether it was stale")
    p.set_defaults(func=cmd_schema)


def cmd_list(args) -> int:
    """A row per stack file: its description, or "invalid: <first error>"; exit 2 when any is invalid."""
    root = root_of(args)
    names = list_stacks(root)
    select(args, names)

    def compute() -> list[dict[str, str]]:
        rows = []
        for name in names:
            try:
                rows.append({"name": name, "description": load(args, name).model.description})
            except UserError as err:
                where = err.location()
                rows.append({"name": name, "invalid": f"{where + ': ' if where else ''}{err.message}"})
        return rows

    rows = listing.rows(root, names, list(args.overrides), workspace_of(args).cache("list"), compute)
    if args.json:
        print_json({"stacks": rows})
    else:
        for row in rows:
            name = row["name"]
            shown = name if name.isprintable() and name.isascii() else ascii(name)
            print(f"{shown:<16} " + (f"invalid: {row['invalid']}" if "invalid" in row else row["description"]))
    return 2 if any("invalid" in r for r in rows) else 0


def cmd_show(args) -> int:
    loaded = load(args, args.stack)
    stack = loaded.model
    info = {
        "stack": resolved(stack),
        "files": list(loaded.files),
        "overrides": [redact_text(o) for o in args.overrides],
        "local_tag": str(loaded.resolved.local),
        "labels": loaded.resolved.labels,
        "fingerprint": fingerprint(stack),
        "platforms": [_line_info(line) for line in loaded.platform_lines().values()],
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"stack:        {stack.name} — {stack.description}")
    print(f"files:        {' → '.join(info['files'])}")
    if args.overrides:
        print(f"overrides:    {' '.join(redact_text(o) for o in args.overrides)}")
    print(f"local tag:    {info['local_tag']}")
    print(f"fingerprint:  {info['fingerprint']}")
    p = stack.platform
    print(
        f"platform:     {p.os} python {p.python} {p.arch}"
        + (f" musa {p.musa} (runtime {p.musa_runtime})" if p.musa else "")
        + (f" gpu {','.join(p.gpu_arch)}" if p.gpu_arch else "")
    )
    for row in info["platforms"]:
        print(
            f"platform line: {row['name']} {row['platform']}"
            + (f" +{row['local']}" if row.get("local") else "")
            + f" python {row['python']}"
            + (f" musa {row['musa']}" if row.get("musa") else "")
            + (f" ({len(row['unknown'])} values unknown: not buildable)" if row.get("unknown") else "")
        )
    print(f"base:         {stack.base.image}")
    for name, idx in stack.indexes.items():
        print(f"index:        {name} ({idx.role}) {idx.url}")
    for name, up in stack.upstreams.items():
        if up.sdist is not None:
            src = f"sdist {up.sdist.name}=={up.sdist.version}"
        else:
            src = f"{up.git} {up.pin}"
        series = ([f"{up.patches_from.upstream}:{up.patches_from.path}"] if up.patches_from else []) + (
            [up.patches] if up.patches else []
        )
        print(f"upstream:     {name}: {src}" + "".join(f" + {s}" for s in series))
    print("packages:")
    width = max(len(n) for n in stack.packages)
    for name, pkg in stack.packages.items():
        print(f"  {name:<{width}}  {pkg.version:<36} {pkg.index:<10} gate={pkg.gate}")
    return 0


def _line_info(line) -> dict:
    """One platform line as `show` prints it: its platform, label, what differs and its own fingerprint."""
    model = line.model
    info = line.line.as_json() if line.line else {}
    unknown = line.line.unknown if line.line else {}
    pins = {n: "unknown" if lines_of.covers(unknown, ("packages", n)) else p.version for n, p in model.packages.items()}
    return {
        **info,
        "python": model.platform.python,
        **({"musa": model.platform.musa} if model.platform.musa else {}),
        "base": model.base.image,
        "pins": pins,
        "fingerprint": fingerprint(model),
    }


def cmd_lint(args) -> int:
    root = root_of(args)
    names = args.stacks or list_stacks(root)
    select(args, names)
    report = []
    invalid = False
    for name in names:
        try:
            loaded = load(args, name)
        except UserError as err:
            invalid = True
            report.append({"stack": name, "invalid": err.render()})
            continue
        findings = prepare.lint(loaded)
        try:
            tags.local_ref(loaded)  # every template of the stack renders (or refuses): stack/resolved.py
            upstream = agree.lint_upstreams(loaded, workspace_of(args), fetch=args.upstreams)
        except UserError as err:
            invalid = True
            report.append({"stack": name, "invalid": err.render()})
            continue
        # an index that installs without a lock, with the reason the stack gives (indexes.<name>.unlocked)
        unlocked = [
            f"index '{i}' installs without hashes (no lock): {loaded.model.indexes[i].unlocked} (indexes.{i}.unlocked)"
            for i in locks.unlocked_indexes(loaded)
            if loaded.model.indexes[i].unlocked is not None
        ]
        undecided = [n for ln in loaded.platform_lines().values() if ln.line and (n := lines_of.unknown_note(ln.line))]
        notes = upstream.notes + unlocked + undecided
        report.append(
            {
                "stack": name,
                "findings": [f.located(loaded) for f in findings] + [agree.located(f) for f in upstream.findings],
                "rendered": [f.render(loaded) for f in findings] + [agree.render(f) for f in upstream.findings],
                **({"notes": notes} if notes else {}),
            }
        )
    refused = waivers.lint_repository(root)  # the repository's vulnerability waivers
    if args.json:
        stacks = [{k: v for k, v in r.items() if k not in ("rendered", "notes")} for r in report]
        notes = [f"{r['stack']}: {n}" for r in report for n in r.get("notes", [])]
        ok = not invalid and not any(r.get("findings") for r in report) and not refused
        waived = {"waivers": [p.render() for p in refused]} if refused else {}
        print_json({"ok": ok, "stacks": stacks, **waived, **({"notes": notes} if notes else {})})
    else:
        for r in report:
            for note in r.get("notes", []):
                print(f"note: {r['stack']}: {note}", file=sys.stderr)
            if "invalid" in r:
                print(r["invalid"], file=sys.stderr)
            elif r["rendered"]:
                for line in r["rendered"]:
                    print(line)
            else:
                print(f"{r['stack']}: ok")
        for problem in refused:
            print(problem.render())
    if invalid:
        return 2
    return 1 if any(r.get("findings") for r in report) or refused else 0


def cmd_tags(args) -> int:
    loaded = load(args, args.stack)
    result: dict = {"stack": loaded.name, "local": str(loaded.resolved.local)}
    if args.registry:
        if args.revision is None:
            print("note: revision 1 shown; `stackforge publish` takes the first free -rN for the date", file=sys.stderr)
        result["publish"] = str(
            tags.publish_ref(loaded, args.registry, args.date, 1 if args.revision is None else args.revision)
        )
        tags.publish_scheme(loaded, args.registry)  # a template publish refuses is refused here too
        result["aliases"] = [str(ref) for ref in tags.alias_refs(loaded, args.registry)]
    if args.json:
        print_json(result)
        return 0
    for ref in [result["local"], *([result["publish"], *result["aliases"]] if args.registry else [])]:
        print(ref)
    return 0


def cmd_diff(args) -> int:
    if args.inventory:
        from stackforge.builder.records import inventory

        d_inv = inventory.diff(inventory.load(args.old), inventory.load(args.new))
        print(d_inv.to_json() if args.json or args.format == "json" else inventory.to_text(d_inv), end="")
        return 0
    select(args, [args.old, args.new])
    old_loaded, new_loaded = load(args, args.old), load(args, args.new)
    d = diffmod.diff_stacks(old_loaded.model, new_loaded.model)
    d.platforms = diffmod.platform_rows(*(_other_lines(s) for s in (old_loaded, new_loaded)))
    if args.json or args.format == "json":
        print(d.to_json())
    else:
        print(diffmod.to_markdown(d), end="")
    return 0


def _other_lines(loaded) -> dict:
    """{OCI platform: (Stack, Line)} of the stack's platform lines that are not its own."""
    return {ln.line.oci: (ln.model, ln.line) for ln in loaded.platform_lines().values() if ln.line and not ln.line.own}


def cmd_schema(args) -> int:
    if args.docs:
        return _schema_docs(args)
    if args.check:
        raise UserError("--check needs --docs", fix="run: stackforge schema --docs --check")
    if args.record:
        from stackforge.publish import record_schema

        print(record_schema.schema_text(), end="")
        return 0
    from stackforge.stack.load import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _schema_docs(args) -> int:
    """Write (or check) docs/stack-reference.md, generated from the model's field descriptions (with --record:
    docs/record-schema.json, the publish record's JSON Schema)."""
    if args.record:
        from stackforge.publish import record_schema

        result = record_schema.generate(root_of(args), check=args.check)
        what, fix = "the publish record's JSON Schema differs from the model", "stackforge schema --record --docs"
    else:
        from stackforge.stack import reference

        result = reference.generate(root_of(args), check=args.check)
        what, fix = "the stack-file reference differs from the model", "stackforge schema --docs"
    if args.json:
        print_json({"check": args.check, "file": result.path, "stale": result.stale})
    elif result.stale:
        print(f"{result.path}: out of date" if args.check else f"wrote {result.path}")
    if args.check and result.stale:
        print(f"error: {what}\n  fix: run: {fix}", file=sys.stderr)
        return 1
    return 0
