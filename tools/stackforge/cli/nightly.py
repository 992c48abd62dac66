"""`stackforge nightly`: lint, bake, gate and publish every nightly stack; write the summary."""

from __future__ import annotations

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
    from stackforge.flows.nightly import NightlyOptions, declared_nightly, nightly
else:
    declared_nightly = lazy("stackforge.flows.nightly", "declared_nightly")
    nightly = lazy("stackforge.flows.nightly", "nightly")
    NightlyOptions = lazy("stackforge.flows.nightly", "NightlyOptions")


def register(sub) -> None:
    p = sub.add_parser(
        "nightly",
        help="lint, bake, gate, publish and smoke every nightly stack; summary in build/nightly/<date>/",
        description="Lint every stack with `nightly: true` (or the named ones), bake them together, build and gate "
        "each (stack, target), publish each that passed, smoke it with its `nightly: true` recipes (its aliases "
        "move only when every smoke passed), check that every pin is still the newest of its line, and write "
        "build/nightly/<date>/summary.md and summary.json. Exits 1 if any row failed; the rows that passed are "
        "published anyway.",
    )
    p.add_argument("stacks", nargs="*", help="default: every stack with `nightly: true`")
    p.add_argument("--registry", required=True, metavar="HOST[:PORT][/PATH]", help="where to publish")
    p.add_argument("--date", help="publish date YYYYMMDD (default: today, UTC)")
    p.add_argument("--target", action="append", dest="targets", metavar="T", help="only these targets (repeatable)")
    p.add_argument("--builder", help="buildx builder for the bake and the builds")
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
        policy=policy,
        out=args.out,
        overrides=lambda name: overrides_for(args, name),
        echo=lambda line: print(line, file=sys.stderr, flush=True),
        allow_missing_hardware=args.allow_missing_hardware,
        freshness=args.freshness,
        drift=args.drift,
        preflight=args.preflight,
        compression=args.compression,
        sign_key=args.sign_key,
        device_uuids=expected([]),  # the lease's $STACKFORGE_DEVICE_UUID, for each smoke's preflight
        osv=args.osv,
        fail_on=args.fail_on,
        osv_max_age=osv_max_age_of(args) if args.osv else None,
        cache=cache,
    )
    summary = nightly(root_of(args), args.registry, options, workspace=workspace_of(args))
    if args.json:
        print_json(summary.to_json())
    else:
        print(summary.markdown())
    return summary.exit_code
