"""`stackforge nightly`: lint, bake, gate and publish every nightly stack; write the summary. With ``--plan``,
``--shard ID`` and ``--merge``, the same night split into shards on many build hosts (flows/night_shard.py,
flows/night_merge.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import (
    add_json,
    add_osv,
    add_out,
    add_registry_cache,
    add_retry,
    add_set,
    osv_max_age_of,
    overrides_for,
    print_json,
    registry_cache_of,
    retry_policy,
    root_of,
    select,
    workspace_of,
)

if TYPE_CHECKING:
    from stackforge.flows.night_merge import MergeOptions, merge
    from stackforge.flows.night_plan import PlanOptions
    from stackforge.flows.night_shard import plan_night, record_plan, run_shard
    from stackforge.flows.nightly import NightlyOptions, declared_nightly, nightly
    from stackforge.publish.publisher import PublishOptions, TrustOptions
    from stackforge.smoke.run import SmokeOptions
else:
    MergeOptions = lazy("stackforge.flows.night_merge", "MergeOptions")
    merge = lazy("stackforge.flows.night_merge", "merge")
    PlanOptions = lazy("stackforge.flows.night_plan", "PlanOptions")
    plan_night = lazy("stackforge.flows.night_shard", "plan_night")
    record_plan = lazy("stackforge.flows.night_shard", "record_plan")
    run_shard = lazy("stackforge.flows.night_shard", "run_shard")
    declared_nightly = lazy("stackforge.flows.nightly", "declared_nightly")
    nightly = lazy("stackforge.flows.nightly", "nightly")
    NightlyOptions = lazy("stackforge.flows.nightly", "NightlyOptions")
    PublishOptions = lazy("stackforge.publish.publisher", "PublishOptions")
    TrustOptions = lazy("stackforge.publish.publisher", "TrustOptions")
    SmokeOptions = lazy("stackforge.smoke.run", "SmokeOptions")


def register(sub) -> None:
    p = sub.add_parser(
        "nightly",
        help="lint, bake, gate, publish and smoke every nightly stack; summary in build/nightly/<date>/",
        description="Lint every stack with `nightly: true` (or the named ones), bake them together, build and gate "
        "each (stack, target) — every platform line a stack declares, each on its platform, published together as "
        "one index under its tag — publish each that passed, smoke it with its `nightly: true` recipes (its aliases "
        "move only when every smoke passed), check that every pin is still the newest of its line, and write "
        "build/nightly/<date>/summary.md and summary.json. Exits 1 if any row failed; the rows that passed are "
        "published anyway.",
    )
    p.add_argument("stacks", nargs="*", help="default: every stack with `nightly: true`")
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT][/PATH]",
        help="where to publish (and, sharded, where the night's plan and the shards' results go); required except "
        "for --plan alone",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--plan",
        action="store_true",
        help="print the night's shards (stack × target × platform grouped, each with its runner labels, balanced by "
        "the last nights' durations); with --registry, record it as the night's plan (a night keeps its first)",
    )
    mode.add_argument("--shard", metavar="ID", help="build, gate, publish and report one shard of the night's plan")
    mode.add_argument(
        "--merge",
        action="store_true",
        help="read every shard's result from the registry, verify what was published, move the aliases, write the "
        "night's summary",
    )
    p.add_argument(
        "--shards", type=int, metavar="N", help="--plan: the most shards per kind of runner (default: one per stack)"
    )
    p.add_argument(
        "--nights",
        type=Path,
        metavar="DIR",
        help="--plan: the nights whose durations balance the shards (default: build/nightly)",
    )
    p.add_argument(
        "--runner-label",
        action="append",
        default=[],
        metavar="LABEL",
        help="--plan: a label every shard's runner carries, before the shard's own (repeatable), e.g. self-hosted",
    )
    p.add_argument(
        "--gitlab-pipeline",
        type=Path,
        metavar="FILE",
        help="--plan: also write GitLab's child pipeline of the shards to FILE (one job per shard, extending .shard "
        "of docs/ci/gitlab-shard.yml)",
    )
    p.add_argument(
        "--key",
        type=Path,
        metavar="PUB",
        help="--merge: the public key every published image's provenance must be signed with",
    )
    p.add_argument("--date", help="publish date YYYYMMDD (default: today, UTC)")
    p.add_argument("--target", action="append", dest="targets", metavar="T", help="only these targets (repeatable)")
    p.add_argument("--builder", help="buildx builder for the bake and the builds")
    p.add_argument("--network", help="network for RUN steps of the bake and the builds (e.g. host, as for build)")
    p.add_argument("--no-bake", dest="bake", action="store_false", help="skip the shared bake; build stacks one by one")
    p.add_argument("--ca-bundle", default="auto", help="extra CA bundle, as for `stackforge build`")
    add_registry_cache(p)
    p.add_argument(
        "--compression",
        choices=["gzip", "zstd"],
        help="layer compression of every publish (default: each stack's tags.compression, else gzip)",
    )
    add_osv(p, "every image's SBOM")
    p.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY",
        help="sign every publish's provenance with this PEM private key (Ed25519 or ECDSA P-256); with a key, no "
        "image is published unsigned",
    )
    p.add_argument(
        "--allow-missing-hardware",
        action="store_true",
        help="smoke nightly recipes without their devices on a host that lacks them (as `stackforge smoke`)",
    )
    p.add_argument(
        "--no-freshness",
        dest="freshness",
        action="store_false",
        help="do not ask the indexes whether every pin is still the newest of its line",
    )
    p.add_argument(
        "--no-drift",
        dest="drift",
        action="store_false",
        help="do not compare the upstreams' own pins (agree:) with their default branches (stackforge drift)",
    )
    p.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="bake without first checking the engine, the registry (a push) and every endpoint the stacks need",
    )
    add_retry(p, "registry attempts per operation", "time budget per registry operation")
    add_out(p, "the directory summary.md and summary.json are written to (default: build/nightly/<date>)")
    add_json(p, "summary.json")
    add_set(p)
    p.set_defaults(func=cmd_nightly)


def cmd_nightly(args) -> int:
    if args.plan:
        return _plan(args)
    if args.registry is None:
        from stackforge.errors import UserError

        raise UserError("--registry is required", file="--registry", fix="give --registry HOST[:PORT][/PATH]")
    if args.merge:
        return _merge(args)
    return _nightly(args)


def _plan(args) -> int:
    """``--plan``: the night's shards; recorded in the registry with ``--registry``."""
    from stackforge.stack.scheme import validate_date

    root = root_of(args)
    select(args, args.stacks or declared_nightly(root))
    options = PlanOptions(
        stacks=args.stacks or None,
        targets=args.targets,
        shards=args.shards,
        runner_labels=tuple(args.runner_label),
        nights=args.nights if args.nights is not None else root / "build" / "nightly",
        date=validate_date(args.date) if (args.registry or args.date) else None,
    )
    plan = plan_night(
        root, options, overrides=lambda name: overrides_for(args, name), echo=lambda line: print(line, file=sys.stderr)
    )
    if args.registry:
        plan, digest, recorded = record_plan(plan, args.registry, retry_policy(args))
        print(
            f"nightly: plan of night {plan.date} {'recorded' if recorded else 'already recorded, kept'} ({digest})",
            file=sys.stderr,
        )
    if args.gitlab_pipeline is not None:
        from stackforge.flows.night_plan import gitlab_pipeline
        from stackforge.fslock import atomic_write

        atomic_write(args.gitlab_pipeline, json.dumps(gitlab_pipeline(plan), indent=2) + "\n")
    if args.json:
        print_json(plan.to_json())
        return 0
    print(f"# Plan{' of night ' + plan.date if plan.date else ''}: {len(plan.shards)} shard(s)")
    for shard in plan.shards:
        units = ", ".join(f"{u.stack}/{u.target}" for u in shard.units)
        print(f"{shard.id}  runs on [{', '.join(shard.runs_on)}]  ~{shard.estimate_s:.0f} s  {units}")
    for problem in plan.problems:
        print(f"problem  {problem.stack}: {problem.reason.splitlines()[0]}")
    return 0


def _merge(args) -> int:
    root = root_of(args)
    select(args, args.stacks or declared_nightly(root))
    options = MergeOptions(
        date=args.date,
        out=args.out,
        policy=retry_policy(args),
        key=args.key,
        overrides=lambda name: overrides_for(args, name),
        echo=lambda line: print(line, file=sys.stderr, flush=True),
    )
    summary = merge(root, args.registry, options)
    if args.json:
        print_json(summary.to_json())
    else:
        print(summary.markdown())
    return summary.exit_code


def _nightly(args) -> int:
    from stackforge.smoke.device_uuid import expected

    # A --set scope must name a stack this run builds: the named ones, else the declared nightly stacks.
    select(args, args.stacks or declared_nightly(root_of(args)))
    policy = retry_policy(args)
    cache = registry_cache_of(args)  # a bad reference fails before anything runs
    options = NightlyOptions(
        date=args.date,
        stacks=args.stacks or None,
        targets=args.targets,
        use_bake=args.bake,
        publish=PublishOptions(
            policy=policy,
            compression=args.compression,
            trust=TrustOptions(
                sign_key=args.sign_key,
                osv=args.osv,
                fail_on=args.fail_on,
                osv_max_age=osv_max_age_of(args) if args.osv else None,
            ),
        ),
        out=args.out,
        overrides=lambda name: overrides_for(args, name),
        echo=lambda line: print(line, file=sys.stderr, flush=True),
        smoke=SmokeOptions(
            allow_missing_hardware=args.allow_missing_hardware,
            device_uuids=expected([]),  # the lease's $STACKFORGE_DEVICE_UUID, for each smoke's preflight
        ),
        freshness=args.freshness,
        drift=args.drift,
        preflight=args.preflight,
        cache=cache,
        network=args.network,
    )
    if args.shard:
        ran = run_shard(root_of(args), args.registry, args.shard, options, workspace=workspace_of(args))
        if args.json:
            print_json(ran.summary.to_json())
        else:
            print(ran.summary.markdown())
        if ran.reported is None:
            print(f"error: shard {args.shard} did not report: {ran.problem}", file=sys.stderr)
        return ran.exit_code
    summary = nightly(root_of(args), args.registry, options, workspace=workspace_of(args))
    if args.json:
        print_json(summary.to_json())
    else:
        print(summary.markdown())
    return summary.exit_code
