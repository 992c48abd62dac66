"""``stackforge patches``: the patch series on a stack's pinned upstream.

apply, check, upstreamed, export, range-diff, lint, index, renumber, hash.
The work is done in ``stackforge.patches``; this module only reads arguments,
loads the stack and prints.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import add_json, add_set, load, overrides_for, print_json, root_of, select, workspace_of
from stackforge.clients.workspace import CACHE_ENV
from stackforge.errors import UserError
from stackforge.safeio import OutputDir
from stackforge.stack.names import list_stacks

if TYPE_CHECKING:
    from stackforge import patches as P
    from stackforge.clients import upstream as up
    from stackforge.stack.load import LoadedStack, load_stack
    from stackforge.stack.load import load as load_file
else:
    P = lazy("stackforge.patches")
    up = lazy("stackforge.clients.upstream")
    load_stack = lazy("stackforge.stack.load", "load_stack")
    load_file = lazy("stackforge.stack.load", "load")

# patches.lint.DEFAULT_TRACKER_PATTERN, here so that --help imports no library
DEFAULT_TRACKER_PATTERN = r"(?<![A-Za-z0-9])[A-Z]+-\d{5,}(?!\d)"


def register(sub) -> None:
    top = sub.add_parser("patches", help="the patch series: apply, check, upstreamed, export, range-diff, lint, index")
    verbs = top.add_subparsers(dest="patches_command", metavar="VERB")
    verbs.required = True

    def stack_args(p, stack_optional: bool = False) -> None:
        if stack_optional:
            p.add_argument("stack", nargs="?", help="stack name or path (default: every stack)")
        else:
            p.add_argument("stack", help="stack name or path")
        p.add_argument("--upstream", help="which upstream (default: the only one with a patch series)")
        p.add_argument(
            "--overlay",
            action="append",
            default=[],
            metavar="NAME",
            help="add an overlay's layered range (overlays/NAME/patches/<upstream>) after the base series",
        )
        p.add_argument("--cache", type=Path, help=f"upstream cache (default: ${CACHE_ENV} or build/cache)")
        p.add_argument("--offline", action="store_true", help="use the upstream cache as it is; never fetch")
        add_set(p)

    p = verbs.add_parser(
        "apply", help="export the pinned upstream and apply the series with git am -3, one commit per patch"
    )
    stack_args(p)
    p.add_argument("--to", type=Path, help="the tree to create (default: build/patches/<stack>/<upstream>)")
    p.add_argument("--force", action="store_true", help="replace --to if it exists")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help="after fixing a stopped patch and `git add`: finish it and apply the rest",
    )
    g.add_argument("--skip", action="store_true", help="drop the stopped patch and apply the rest")
    g.add_argument("--abort", action="store_true", help="stop: drop the half-applied patch (commits so far stay)")
    add_json(p)
    p.set_defaults(func=cmd_apply)

    p = verbs.add_parser(
        "check", help="apply into a scratch tree and classify each patch (clean / offset / 3-way / fails / upstreamed)"
    )
    stack_args(p)
    p.add_argument("--commit", help="check against this upstream commit instead of the pin")
    add_json(p)
    p.set_defaults(func=cmd_check)

    p = verbs.add_parser(
        "upstreamed", help="patches a newer upstream commit already contains (git cherry / git am 'No changes')"
    )
    stack_args(p)
    p.add_argument(
        "--to-commit", help="the new upstream commit (default: the commit given with --set upstreams.<u>.commit=…)"
    )
    p.add_argument(
        "--drop",
        action="store_true",
        help="remove them from the series, note Applied-Upstream in its history, renumber",
    )
    add_json(p)
    p.set_defaults(func=cmd_upstreamed)

    p = verbs.add_parser("export", help="write the series back from a worked tree, byte-stable (git format-patch)")
    stack_args(p, stack_optional=True)
    p.add_argument(
        "--from", dest="source", type=Path, help="the worked tree (a tree made by `patches apply`, with commits on top)"
    )
    p.add_argument("--base", help="the commit the series starts from (default: recorded by `patches apply`)")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if an export would change any byte (without --from: apply the series afresh and re-export)",
    )
    add_json(p, "the changed files per series")
    p.set_defaults(func=cmd_export)

    p = verbs.add_parser(
        "range-diff", help="apply the series on two upstream commits and compare per patch (git range-diff)"
    )
    stack_args(p)
    p.add_argument("--from", dest="old", required=True, help="old upstream commit")
    p.add_argument("--to", dest="new", required=True, help="new upstream commit")
    p.add_argument("--raw", action="store_true", help="also print git range-diff's own output")
    add_json(p)
    p.set_defaults(func=cmd_range_diff)

    p = verbs.add_parser("lint", help="static checks of series directories (exit 1 on findings)")
    p.add_argument(
        "dirs", nargs="*", type=Path, help="series directories (default: patches/* and overlays/*/patches/*)"
    )
    p.add_argument(
        "--tracker-pattern",
        default=DEFAULT_TRACKER_PATTERN,
        help="regular expression for internal tracker ids that must not ship (default: %(default)s)",
    )
    add_json(p)
    p.set_defaults(func=cmd_lint)

    p = verbs.add_parser("index", help="regenerate the README.md index of series directories")
    p.add_argument("dirs", nargs="*", type=Path, help="series directories (default: all)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if an index is out of date")
    add_json(p, "the indexes written (or, with --check, the stale ones)")
    p.set_defaults(func=cmd_index)

    p = verbs.add_parser(
        "renumber", help="give the patches of a series (and layered ranges after it) contiguous numbers"
    )
    p.add_argument("dirs", nargs="+", type=Path, help="the base series directory, then layered range directories")
    add_json(p, "the renames")
    p.set_defaults(func=cmd_renumber)

    p = verbs.add_parser("hash", help="print the series hash (sha256 over the order and bytes of the patches)")
    p.add_argument("dirs", nargs="+", type=Path, help="the base series directory, then layered range directories")
    add_json(p, "the series hash")
    p.set_defaults(func=cmd_hash)


# --- helpers ----------------------------------------------------------------------


def _cache(args) -> Path:
    return args.cache.resolve() if getattr(args, "cache", None) else workspace_of(args).cache()


def _target(args, loaded: LoadedStack | None = None, upstream: str | None = None):
    return P.target_from_stack(
        loaded or load(args, args.stack),
        upstream or args.upstream,
        overlays=args.overlay,
        cache_dir=_cache(args),
        offline=args.offline,
        workspace=workspace_of(args),
    )


def _pinned_without_overrides(args, target) -> str | None:
    """The upstream commit the stack pins before any --set (the commit the series was made on)."""
    if not getattr(args, "overrides", None):
        return None
    base = load_stack(args.stack, root=root_of(args))
    spec = dict(base.upstreams).get(target.name)
    if spec is None or spec.git != target.spec.git:
        return None  # another repository: its commits say nothing about this one
    return spec.commit


def _rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _print_report(report: P.ApplyReport) -> None:
    for line in P.summary_lines(report):
        print(line)


def _resume_command(args, dest: Path) -> str:
    parts = ["stackforge", "patches", "apply", args.stack, "--to", str(dest)]
    if args.upstream:
        parts += ["--upstream", args.upstream]
    for o in args.overlay:
        parts += ["--overlay", o]
    return " ".join(shlex.quote(p) for p in parts) + " --continue"


# --- verbs --------------------------------------------------------------------------


def cmd_apply(args) -> int:
    root = root_of(args)
    if args.cont or args.skip or args.abort:
        if args.to is None:
            raise UserError("--continue/--skip/--abort need --to DIR (the stopped tree)")
        dest = args.to.resolve()
        if args.abort:
            P.abort_apply(dest)
            print(f"aborted: the half-applied patch is dropped; {dest} keeps the commits applied before it")
            return 0
        report = P.continue_apply(dest, skip=args.skip)
        resume = (P.read_state(dest) or {}).get("resume") or _resume_command(args, dest)
    else:
        target = _target(args)
        dest = (args.to or root / "build" / "patches" / Path(args.stack).stem / target.name).resolve()
        OutputDir(dest, "patches apply").refuse_inputs([root / d for d in ("stacks", "patches", "overlays")], "--to")
        resume = _resume_command(args, dest)
        report = P.apply_to(
            target,
            dest,
            force=args.force,
            resume=resume,
            context={"stack": args.stack, "upstream": target.name, "overlays": list(args.overlay)},
            seed_commit=_pinned_without_overrides(args, target),
        )
    if args.json:
        print_json(report.to_json())
    else:
        _print_report(report)
    if report.failed:
        raise P.failure_error(report, resume)
    applied = sum(1 for r in report.results if r.commit)
    print(f"applied {applied} patch(es) in {dest}: `git -C {dest} log` shows one commit per patch", file=sys.stderr)
    if report.upstreamed:
        names = ", ".join(r.name for r in report.upstreamed)
        print(f"note: already upstream, so no commit: {names} (see `stackforge patches upstreamed`)", file=sys.stderr)
    return 0


def cmd_check(args) -> int:
    target = _target(args)
    report = P.check(target, commit=args.commit, seed_commit=_pinned_without_overrides(args, target))
    if args.json:
        print_json(report.to_json())
    else:
        _print_report(report)
        for r in report.failed:
            print("\n" + P.failure_message(r))
        counts: dict[str, int] = {}
        for r in report.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        print("\n" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) if counts else "the series is empty")
    return 1 if report.failed else 0


def cmd_upstreamed(args) -> int:
    target = _target(args, load(args, args.stack))
    pinned = _pinned_without_overrides(args, target)
    if args.to_commit:
        new, old = args.to_commit, target.spec.commit
    elif pinned and pinned != target.spec.commit:
        # --set upstreams.<u>.commit=NEW: fetch and verify with the stack's own pin, compare against NEW.
        new, old = target.spec.commit, pinned
        target = _target(args, load_file(args.stack, root=root_of(args)), target.name)
    else:
        raise UserError(
            "which newer upstream commit?", fix=f"pass --to-commit C, or --set upstreams.{target.name}.commit=C"
        )
    found = P.find_upstreamed(target, new, old_commit=old)
    if args.json:
        print_json({"old": old, "new": new, "upstreamed": [u.to_json() for u in found]})
    else:
        if not found:
            print(f"no patch of the series is contained in {new}")
        for u in found:
            carrier = f"{u.commit[:12]} {u.commit_subject}" if u.commit else "(carrying commit not identified)"
            layer = "" if u.layer == P.BASE_LAYER else f" [{u.layer}]"
            print(f"upstreamed  {u.name}{layer}  ({u.how})  ← {carrier}")
    if args.drop and found:
        renames = P.drop_upstreamed(target, found, new)
        print(
            f"dropped {len(found)} patch(es), renumbered {len(renames)}; Applied-Upstream noted in the series",
            file=sys.stderr,
        )
    return 0


def _export_targets(args) -> list:
    """(label, target) for --check without a stack: every stack's upstreams with a series, once per series."""
    root = root_of(args)
    seen: set = set()
    out = []
    names = list_stacks(root)
    select(args, names)
    for name in names:
        loaded = load_file(name, root=root, overrides=overrides_for(args, name))
        stack = loaded.model
        for uname, spec in dict(stack.upstreams).items():
            if not spec.patches:
                continue
            key = (spec.patches, spec.git, spec.commit, spec.sdist.sha256 if spec.sdist else None)
            if key in seen:
                continue
            seen.add(key)
            t = P.target_from_stack(
                loaded,
                uname,
                overlays=args.overlay,
                cache_dir=_cache(args),
                offline=args.offline,
                workspace=workspace_of(args),
            )
            out.append((f"{name}/{uname}", t))
    return out


def cmd_export(args) -> int:
    root = root_of(args)
    if args.source is None:
        if not args.check:
            raise UserError("export needs --from DIR (a worked tree), or --check to verify the committed series")
        targets = [(args.stack, _target(args))] if args.stack else _export_targets(args)
        bad = 0
        series = []
        for label, t in targets:
            changes = P.export_check(t)
            n = len(t.refs)
            bad += bool(changes)
            series.append(
                {
                    "series": label,
                    "patches": n,
                    "changes": [{"kind": c.kind, "path": _rel(c.path, root), "diff": c.diff} for c in changes],
                }
            )
            if args.json:
                continue
            if changes:
                print(f"{label}: a re-export would change {len(changes)} file(s):")
                for c in changes:
                    print(f"  {c.kind}: {_rel(c.path, root)}")
                    if c.diff:
                        print("    " + c.diff.rstrip("\n").replace("\n", "\n    "))
            else:
                print(f"{label}: {n} patch(es) re-export byte-identically")
        if args.json:
            print_json({"check": True, "series": series})
        if bad:
            print(
                "fix: apply the series, then `stackforge patches export STACK --from DIR` and commit the result",
                file=sys.stderr,
            )
        return 1 if bad else 0
    if not args.stack:
        raise UserError("export --from needs the STACK the tree was applied for")
    target = _target(args)
    plan, changes = P.export_series(args.source.resolve(), target.layers, base=args.base, check=args.check)
    if args.json:
        print_json(
            {
                "check": args.check,
                "patches": len(plan.patches),
                "changes": [{"kind": c.kind, "path": _rel(c.path, root)} for c in changes],
            }
        )
        return 1 if (args.check and changes) else 0
    for c in changes:
        print(f"{'would be ' if args.check else ''}{c.kind}: {_rel(c.path, root)}")
    if not changes:
        print(f"{len(plan.patches)} patch(es): no byte changed")
    elif not args.check:
        print(f"{len(plan.patches)} patch(es) exported; series and index rewritten", file=sys.stderr)
    return 1 if (args.check and changes) else 0


def cmd_range_diff(args) -> int:
    target = _target(args)
    entries, raw = P.range_diff(target, args.old, args.new)
    if args.json:
        print_json({"old": args.old, "new": args.new, "patches": [e.to_json() for e in entries]})
        return 0
    for e in entries:
        layer = "" if e.layer == P.BASE_LAYER else f" [{e.layer}]"
        print(f"{e.status:<10} {e.name}{layer}" + (f"  ({e.detail})" if e.detail else ""))
        if e.interdiff:
            print("    " + e.interdiff.rstrip("\n").replace("\n", "\n    "))
    if args.raw:
        print("\n" + raw.rstrip())
    return 0


def _dirs(args, root: Path) -> list[P.Series]:
    if args.dirs:
        return [
            P.read_series(d.resolve(), layer=P.BASE_LAYER if i == 0 else d.resolve().parent.parent.name)
            for i, d in enumerate(args.dirs)
        ]
    out = []
    for group in _all_series(root):
        out += group
    return out


def _all_series(root: Path) -> list[list[P.Series]]:
    groups: dict[str, list[P.Series]] = {}
    pdir = root / "patches"
    for d in sorted(p for p in pdir.iterdir() if p.is_dir()) if pdir.is_dir() else []:
        groups.setdefault(d.name, []).append(P.read_series(d))
    odir = root / "overlays"
    for ov in sorted(p for p in odir.iterdir() if p.is_dir()) if odir.is_dir() else []:
        for d in sorted(p for p in (ov / "patches").glob("*") if p.is_dir()):
            groups.setdefault(d.name, []).append(P.read_series(d, layer=ov.name))
    return list(groups.values())


def cmd_lint(args) -> int:
    root = root_of(args)
    if args.dirs:
        layers = _dirs(args, root)
        findings = P.lint_layers(layers, tracker_pattern=args.tracker_pattern, root=root)
    else:
        findings = P.lint_repository(root, tracker_pattern=args.tracker_pattern)
    if args.json:
        print_json({"count": len(findings), "findings": [f.to_json() for f in findings]})
    else:
        for f in findings:
            print(f.render())
        print(f"{len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0


def cmd_index(args) -> int:
    root = root_of(args)
    stale, written = [], []
    for s in _dirs(args, root):
        rel = _rel(s.dir / "README.md", root)
        if args.check:
            text = P.render_index(s)
            p = s.dir / "README.md"
            if not p.is_file() or p.read_text(encoding="utf-8") != text:
                stale.append(rel)
        elif P.write_index(s):
            written.append(rel)
    if args.json:
        print_json({"stale": stale} if args.check else {"written": written})
    else:
        for rel in stale:
            print(f"out of date: {rel}")
        for rel in written:
            print(f"wrote {rel}")
    return 1 if stale else 0


def cmd_renumber(args) -> int:
    root = root_of(args)
    layers = _dirs(args, root)
    renames = P.renumber(layers)
    for s in layers:
        P.write_index(s)
    if args.json:
        print_json({"renames": [{"from": _rel(src, root), "to": dst.name} for src, dst in renames]})
        return 0
    for src, dst in renames:
        print(f"{_rel(src, root)} -> {dst.name}")
    if not renames:
        print("numbering already contiguous")
    return 0


def cmd_hash(args) -> int:
    root = root_of(args)
    layers = _dirs(args, root)
    digest = P.series_hash(*layers)
    if args.json:
        print_json({"hash": digest})
    else:
        print(digest)
    return 0
