"""Verbs that render, build and gate images."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import (
    ALL_PLATFORMS,
    BUILD_DIR_OUT,
    NO_CACHE_HELP,
    add_json,
    add_out,
    add_platform,
    add_refresh,
    add_registry_cache,
    add_set,
    load,
    print_json,
    registry_cache_of,
    root_of,
    workspace_of,
)
from stackforge.errors import UserError
from stackforge.fslock import DEFAULT_TIMEOUT, TIMEOUT_ENV, stack_lock

if TYPE_CHECKING:
    from stackforge.builder.context import prepare as prepare_dockerfile
    from stackforge.builder.context.context import build_dir_for
    from stackforge.builder.run.gate import run_gate
    from stackforge.builder.run.run import BuildOptions, build, default_target, prepare, target_ref
else:
    prepare_dockerfile = lazy("stackforge.builder.context.prepare")
    build_dir_for = lazy("stackforge.builder.context.context", "build_dir_for")
    run_gate = lazy("stackforge.builder.run.gate", "run_gate")
    BuildOptions = lazy("stackforge.builder.run.run", "BuildOptions")
    build = lazy("stackforge.builder.run.run", "build")
    default_target = lazy("stackforge.builder.run.run", "default_target")
    prepare = lazy("stackforge.builder.run.run", "prepare")
    target_ref = lazy("stackforge.builder.run.run", "target_ref")


def register(sub) -> None:
    p = sub.add_parser("render", help="write the Dockerfile and build context, print the plan, build nothing")
    p.add_argument("stack")
    p.add_argument("--target", help="target stage (default: the stack's first published target)")
    add_out(p, BUILD_DIR_OUT)
    p.add_argument(
        "--no-sources",
        action="store_true",
        help="fetch no upstream and ask the engine nothing (plan and "
        "Dockerfile only; the Dockerfile then has no base image or inputs labels)",
    )
    p.add_argument("--syntax", help="add a `# syntax=` line (e.g. docker/dockerfile:1.7); off by default")
    add_platform(p, "render", every=True)
    add_json(p, "the build plan (with --platform all: {platform line: plan})")
    add_wait(p)
    add_refresh(p)
    add_set(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser(
        "build",
        help="build, gate and tag the image of a stack (BuildKit via docker buildx)",
        description="BuildKit's log and progress go to stderr; stdout carries only the result: "
        "the image reference (or, with --json, the build outcome).",
    )
    p.add_argument("stack")
    p.add_argument("--target", help="target stage (default: the stack's first published target)")
    p.add_argument("--load", action="store_true", default=True, help="load the image into the engine (default)")
    p.add_argument("--no-load", dest="load", action="store_false", help="build and gate without loading or tagging")
    p.add_argument("--builder", help="buildx builder to use (a remote or Kubernetes BuildKit works the same)")
    p.add_argument(
        "--ca-bundle",
        default="auto",
        help="extra CA bundle for downloads inside the build, bind-mounted from a named build context "
        "(default: $STACKFORGE_CA_BUNDLE or the host's system bundle; 'none' to disable)",
    )
    p.add_argument("--syntax", help="add a `# syntax=` line; off by default")
    p.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
    add_registry_cache(p)
    p.add_argument("--network", help="network for RUN steps (e.g. host, to reach an index on the host's loopback)")
    p.add_argument(
        "--doctor",
        action="store_true",
        help="first check the engine and every endpoint the stack needs (`stackforge doctor`); stop on a failure",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="build from --mirror with no network: upstreams, indexes and the base image from the mirror, every "
        "RUN step with --network=none",
    )
    p.add_argument("--mirror", type=Path, metavar="DIR", help="the mirror (`stackforge mirror STACK --to DIR`)")
    p.add_argument("--overlay", metavar="NAME", help="build overlays/NAME on its base (built first) instead")
    p.add_argument(
        "--reuse-base",
        action="store_true",
        help="with --overlay: layer on the image the last gated build of the base target made, without rebuilding",
    )
    p.add_argument(
        "--keep-builds",
        type=int,
        metavar="N",
        help="evidence of the newest N builds is kept per stack (default $STACKFORGE_KEEP_BUILDS or 10); "
        "a build with a publish.json is never deleted",
    )
    add_platform(p, "build, gate and tag")
    add_out(p, BUILD_DIR_OUT)
    add_json(p, "the outcome (tag, image id, gate lines, evidence directory, duration)")
    add_wait(p)
    add_refresh(p)
    add_set(p)
    p.set_defaults(func=cmd_build)

    # Verbs that check an image against a stack: (name, help, --stack help or None when required, --json's result).
    for name, about, stack_help, result, func in (
        (
            "gate",
            "re-run a stack's dependency gate on a built image (read-only root, /tmp writable)",
            None,
            "the verdict and the gate's lines",
            cmd_gate,
        ),
        (
            "verify",
            "check an image against its stack: labels, pins, gate, ABI; a registry reference (HOST/NAME:TAG or "
            "…@sha256:…) without --stack is checked from the image and its attached publish record (a stack's or an "
            "overlay's), no checkout",
            "default: the stack named by the image's org.stackforge.stack label",
            "the verdict, failure count and lines",
            cmd_verify,
        ),
        (
            "abi",
            "resolve every DT_NEEDED of a stack's vendor packages inside an image",
            None,
            "the verdict and the ABI lines",
            cmd_abi,
        ),
    ):
        p = sub.add_parser(name, help=about)
        p.add_argument("image")
        p.add_argument("--stack", required=stack_help is None, help=stack_help)
        add_json(p, result)
        add_set(p)
        if name == "verify":
            p.add_argument(
                "--key",
                type=Path,
                metavar="PUB",
                help="a registry reference's signed provenance must be signed by this PEM public key and describe "
                "the image and its record; an unsigned image fails",
            )
            p.add_argument(
                "--rebuild",
                action="store_true",
                help="a registry reference: build it again from its record in this checkout (--root), with no "
                "cache, and say 'identical' or name the first differing layer, file and field",
            )
            which = p.add_mutually_exclusive_group()
            which.add_argument(
                "--platform",
                metavar="PLATFORM",
                help="a registry reference that is an index of platforms (`publish --platform all`): check its image "
                "for PLATFORM (linux/arm64, arm64 or aarch64; default: the engine's own platform)",
            )
            which.add_argument(
                "--all-platforms",
                action="store_true",
                help="a registry reference that is an index of platforms: check the image of every platform it lists",
            )
        p.set_defaults(func=func)


def add_wait(p) -> None:
    """--no-wait / --lock-timeout: what to do while another stackforge writes the same build directory."""
    p.add_argument(
        "--no-wait",
        dest="lock_timeout",
        action="store_const",
        const=0.0,
        help="fail at once if another stackforge is writing this stack's build directory",
    )
    p.add_argument(
        "--lock-timeout",
        type=float,
        metavar="SECONDS",
        help=f"how long to wait for it (default: ${TIMEOUT_ENV} or {DEFAULT_TIMEOUT:.0f})",
    )


def cmd_render(args) -> int:
    loaded = load(args, args.stack)
    if args.platform != ALL_PLATFORMS:
        return _render_line(args, loaded)
    if args.out is not None:
        raise UserError("--platform all writes one build directory per line; --out names one", fix="drop --out")
    lines = loaded.platform_lines()
    for line in lines.values():
        prepare_dockerfile.buildable(line)  # refused before any line is written
    if not args.json:
        return max(_render_line(args, line) for line in lines.values())
    plans = {}
    for name, line in lines.items():
        plans[name] = json.loads(_prepare_line(args, line).ctx.plan.to_json())
    print(json.dumps({"platforms": plans}, indent=2))
    return 0


def _prepare_line(args, loaded):
    ws = workspace_of(args)
    with stack_lock(build_dir_for(loaded, args.out), timeout=args.lock_timeout):
        return prepare(loaded, ws.engine, out=args.out, sources=not args.no_sources, syntax=args.syntax, workspace=ws)


def _render_line(args, loaded) -> int:
    from stackforge.builder.plan.plan import INSTALLER, LABEL_NS

    stack = loaded.model
    target = default_target(loaded, args.target)
    prepared = _prepare_line(args, loaded)
    ctx = prepared.ctx
    if args.json:
        print(ctx.plan.to_json())
        return 0
    plan = ctx.plan
    print(f"stack:      {stack.name} ({plan.fingerprint})")
    if loaded.line is not None and loaded.line.declared:
        print(f"platform:   {loaded.line.name} ({loaded.line.oci})")
    print(f"target:     {target} → {target_ref(loaded, target)}")
    print(f"base:       {plan.base_image}")
    for i, ph in enumerate(plan.phases, 1):
        flags = ", ".join(f for f, on in (("--no-deps", ph.no_deps), ("--require-hashes", ph.require_hashes)) if on)
        print(f"pip {i}:      {ph.name}: {len(ph.pins)} pin(s) from {ph.index_url}" + (f" ({flags})" if flags else ""))
    for s in ctx.sources:
        extra = f", {len(s.patches)} patch(es), series {s.series_hash}" if s.series_hash else ""
        extra += f", {len(s.submodules)} submodule(s)" if s.submodules else ""
        print(f"source:     {s.name}: {s.kind} {s.pin}{extra}")
    for k in plan.kernels:
        env = ""
        if k.build_env is not None:
            pins = [p for ph in k.build_env if ph.name != INSTALLER for p in ph.pins]
            env = f" (builds with only {', '.join(pins) or 'the venv'})"
        print(f"kernel:     {k.name}{env}: {k.run}")
    print(
        f"gate:       {len(plan.gate['packages'])} pins, {len(plan.gate['imports'])} imports, "
        f"{len(plan.gate['probes'])} probes"
    )
    inputs = prepared.labels.get(f"{LABEL_NS}.inputs") or f"omitted: {prepared.inputs_omitted}"
    print(f"inputs:     {inputs}")
    print(f"dockerfile: {ctx.dockerfile}")
    print(f"context:    {ctx.context_dir}")
    return 0


def cmd_build(args) -> int:
    from stackforge.builder.run import uptodate

    ws = workspace_of(args)
    lookup, key = _uptodate_keys(args)  # a --no-cache or --refresh build records its answer for a plain one
    if uptodate.answer(lookup, ws.cache("build"), ws.builder):
        return 0
    cache = registry_cache_of(args)  # a bad reference fails before anything runs
    loaded = load(args, args.stack)
    if args.offline or args.mirror:
        _offline_options(args, loaded)
    if args.doctor:
        from stackforge.flows import doctor

        rows = doctor.diagnose([loaded], workspace_of(args), timeout=5.0)
        if doctor.exit_code(rows):
            print(doctor.render_table(rows), file=sys.stderr)
            print("doctor: nothing was built; redirect or fix what failed above", file=sys.stderr)
            return 1
    opts = BuildOptions(
        target=args.target,
        load=args.load,
        syntax=args.syntax,
        no_cache=args.no_cache,
        out=args.out,
        network=args.network,
        lock_timeout=args.lock_timeout,
        keep_builds=args.keep_builds,
        cache=cache,
    )
    if args.overlay:
        return _build_overlay(args, loaded, opts)
    outcome = build(loaded, opts, workspace=workspace_of(args))
    if args.json:
        out, err = json.dumps(asdict(outcome), indent=2, default=str) + "\n", ""
    else:
        built = f"\nbuilt {outcome.tag}" + (f" ({outcome.image_id})" if outcome.image_id else "")
        err = f"{built} in {outcome.duration_s}s\n" + "".join(f"  {line}\n" for line in outcome.gate)
        err, out = err + f"evidence: {outcome.evidence}\n", f"{outcome.tag}\n"
    sys.stderr.write(err)
    sys.stdout.write(out)
    stack_json = loaded.model.model_dump(mode="json")
    uptodate.store(key, _uptodate_keys(args)[1], ws.cache("build"), ws.root, stack_json, outcome, out, err)
    return 0


def _uptodate_keys(args) -> tuple[str | None, str | None]:
    """The keys of this build's recorded answer (``build.uptodate.keys``); None where it may have none."""
    from stackforge.builder.run import uptodate

    ws = workspace_of(args)
    try:
        return uptodate.keys(args, ws.root, ws.ca_bundle_file())
    except (UserError, OSError):
        return None, None


def _offline_options(args, loaded) -> None:
    """--offline needs --mirror (and the reverse), no --doctor, --overlay or network but none; the base image is
    loaded from the mirror before the build asks the engine for it."""
    from stackforge.builder.mirror.offline import load_base
    from stackforge.errors import UserError

    if not (args.offline and args.mirror):
        raise UserError(
            "--offline and --mirror go together",
            file="--offline" if args.offline else "--mirror",
            fix=f"stackforge build {loaded.name} --offline --mirror DIR",
        )
    for flag, given in (
        ("--doctor", args.doctor),
        ("--overlay", args.overlay),
        ("--network", args.network not in (None, "none")),
    ):
        if given:
            raise UserError(
                f"{flag} cannot be used with --offline (an offline build reaches no endpoint)",
                file=flag,
                fix=f"drop {flag}",
            )
    args.network = "none"
    load_base(loaded, args.mirror, workspace_of(args).engine)


def _build_overlay(args, loaded, opts: BuildOptions) -> int:
    from stackforge.overlay.build import build_overlay
    from stackforge.overlay.load import load_overlay

    ov = load_overlay(loaded.root, args.overlay)
    outcome = build_overlay(loaded, ov, opts, reuse_base=args.reuse_base, workspace=workspace_of(args))
    if args.json:
        print_json(asdict(outcome))
        return 0
    print(
        f"\nbuilt overlay {ov.name} as {outcome.tag} ({outcome.image_id}) on {outcome.base['ref']} in "
        f"{outcome.duration_s}s",
        file=sys.stderr,
    )
    for line in outcome.gate:
        print(f"  {line}", file=sys.stderr)
    print(f"evidence: {outcome.evidence}", file=sys.stderr)
    print(outcome.tag)
    return 0


def cmd_verify(args) -> int:
    from stackforge.builder.run.verify import image_config, image_labels, line_of, local_record, stack_of, verify
    from stackforge.clients.registry import is_remote

    engine = workspace_of(args).engine
    engine.check()
    if args.stack is None and not args.overrides and is_remote(args.image):
        from stackforge.cli.publish import print_verification
        from stackforge.flows.operator import verify_ref

        rebuild_from = root_of(args) if args.rebuild else None
        v = verify_ref(args.image, engine, key=args.key, rebuild_from=rebuild_from, platform=args.platform,
                       all_platforms=args.all_platforms)  # fmt: skip
        return print_verification(args, v, f"verify {args.image}")
    for flag, given in (("--platform", args.platform), ("--all-platforms", args.all_platforms)):
        if given:
            raise UserError(f"{flag} picks the images of a published index: give a registry reference, without "
                            "--stack", file=flag, fix=f"stackforge verify HOST/NAME:TAG {flag}")  # fmt: skip
    if args.rebuild:
        raise UserError(
            "--rebuild rebuilds a published image from the record attached in the registry: give a registry "
            "reference, without --stack",
            file="--rebuild",
            fix="stackforge verify HOST/NAME:TAG --rebuild",
        )
    if args.key is not None:
        raise UserError(
            "--key checks the provenance attached in the registry: give a registry reference, without --stack",
            file="--key",
            fix="stackforge verify HOST/NAME:TAG --key key.pub",
        )
    labels = image_labels(engine, args.image)
    loaded = line_of(load(args, args.stack or stack_of(labels, args.image)), engine, args.image)
    stack = loaded.model
    result = verify(loaded, args.image, labels, engine, image_config(engine, args.image))
    kept = local_record(loaded, engine.image_id(args.image))  # the record its build kept, when it was published
    if kept is not None:
        result.record_tests, result.record_smoke = kept.get("tests"), kept.get("smoke")
    from stackforge.overlay.verify import overlay_of, verify_overlay

    if overlay_of(labels):
        verify_overlay(result, loaded.root, args.image, labels, engine)
    subject = f"{args.image} against {stack.name}"
    if args.json:
        print_json(
            {
                "image": args.image,
                "stack": stack.name,
                "ok": not result.failed,
                "failed": result.failed,
                "lines": result.lines,
                "checked": result.checked(),
                "summary": result.summary(subject),
            }
        )
        return 1 if result.failed else 0
    for line in result.lines:
        print(line)
    print(result.summary(subject))
    return 1 if result.failed else 0


def cmd_abi(args) -> int:
    return _gate(args, "abi.py")


def cmd_gate(args) -> int:
    return _gate(args, "gate.py")


def _gate(args, script: str) -> int:
    loaded = load(args, args.stack)
    ok, lines = run_gate(loaded, args.image, workspace_of(args).engine, script=script)
    if args.json:
        print_json({"image": args.image, "stack": loaded.name, "ok": ok, "lines": lines})
    else:
        for line in lines:
            print(line)
    return 0 if ok else 1
