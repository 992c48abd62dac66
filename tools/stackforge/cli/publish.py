"""`stackforge publish`: push a stack's gated image under an immutable, never-overwritten tag; `stackforge pull`:
the newest published image, verified; `stackforge copy`: a published image with everything attached to it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.cli.lazy import lazy
from stackforge.cli.options import (
    BUILD_DIR_OUT,
    add_json,
    add_osv,
    add_out,
    add_retry,
    add_set,
    build_input,
    osv_max_age_of,
    print_json,
    retry_policy,
    root_of,
    workspace_of,
)
from stackforge.errors import UserError
from stackforge.safeio import for_terminal

if TYPE_CHECKING:
    from stackforge.publish.copy import copy as copy_image
    from stackforge.publish.publisher import PublishOptions, TrustOptions, stderr_echo
    from stackforge.publish.stack import publish_stack
else:
    PublishOptions = lazy("stackforge.publish.publisher", "PublishOptions")
    TrustOptions = lazy("stackforge.publish.publisher", "TrustOptions")
    stderr_echo = lazy("stackforge.publish.publisher", "stderr_echo")
    publish_stack = lazy("stackforge.publish.stack", "publish_stack")
    copy_image = lazy("stackforge.publish.copy", "copy")


def register(sub) -> None:
    p = sub.add_parser(
        "publish",
        help="push a stack's gated image by digest and tag it with the first free -rN of the date",
        description="Push the image that `stackforge build STACK` gated, by digest, then tag it "
        "<publish tag>-<YYYYMMDD>-r<N> with the first free N (an existing tag is never overwritten), "
        "re-read the tag and compare digests, and only then move the aliases. "
        "Re-publishing an image already published that day creates nothing.",
    )
    p.add_argument("stack")
    p.add_argument(
        "--registry",
        required=True,
        metavar="HOST[:PORT][/PATH]",
        help="registry and namespace, e.g. registry.example.com/mcconline/inference "
        "(loopback registries are spoken to over plain HTTP)",
    )
    p.add_argument("--date", help="publish date YYYYMMDD (default: today, UTC)")
    p.add_argument("--target", help="target stage (default: the stack's first published target)")
    p.add_argument(
        "--overlay", metavar="NAME", help="publish the gated image of `stackforge build STACK --overlay NAME`"
    )
    add_out(p, BUILD_DIR_OUT.replace("go here", "are read from (the --out given to `stackforge build`)"))
    p.add_argument(
        "--verify-pull",
        action="store_true",
        help="also pull the tag through the engine and compare the image id (re-downloads the layers)",
    )
    p.add_argument(
        "--allow-ungated",
        action="store_true",
        help="publish the local image even without a passing `stackforge build` record for it",
    )
    p.add_argument(
        "--compression",
        choices=["gzip", "zstd", "none"],
        help="layer compression (default: the stack's tags.compression, else gzip; zstd layers pull on Docker 23+ and "
        "containerd 1.5+, not older engines)",
    )
    p.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY",
        help="a PEM private key (Ed25519 or ECDSA P-256, as openssl genpkey writes it): attach DSSE-signed SLSA "
        "provenance before any tag names the image; no tag is written when signing fails",
    )
    add_osv(p, "the build's SBOM")
    p.add_argument(
        "--compression-level",
        type=int,
        metavar="N",
        help="the codec's level (gzip 1-9, default 2: 1-3 by ISA-L, 4-9 by zlib; zstd 1-19, default 3); "
        "one level gives one blob on every host of a CPU architecture",
    )
    add_retry(p)
    p.add_argument(
        "--platform",
        choices=["all"],
        help="all: publish every platform line of the stack (each built with `build --platform LINE`) under one tag, "
        "as an OCI image index with a manifest per platform, each with its own record, signature and SBOM; the "
        "aliases move only when every platform passed",
    )
    add_json(p, "the evidence record")
    add_set(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser(
        "pull",
        help="pull the newest published image (of a stack, or of a repository with no checkout) by digest and "
        "verify it from its attached record",
        description="Resolve the newest -rN of the date (default: the newest date) from the registry's tags, "
        "pull it by digest, fetch the publish record attached to it and verify the image from the image and "
        "its record alone (as `stackforge verify HOST/NAME:TAG`). STACK (a stack of this checkout, with "
        "--registry) takes the repository and tag scheme from the stack's tags; a REPOSITORY (HOST/NAME, or NAME "
        "with --registry; no checkout needed) reads the scheme <...>YYYYMMDD-rN<...> off the repository's tags.",
    )
    p.add_argument("stack", metavar="STACK|REPOSITORY")
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT][/PATH]",
        help="registry and namespace (required with STACK; with NAME the repository is HOST/PATH/NAME)",
    )
    p.add_argument("--date", help="the date YYYYMMDD whose newest revision to pull (default: the newest date)")
    p.add_argument("--target", help="with STACK: the target (default: the stack's first published target)")
    p.add_argument(
        "--tags",
        metavar="PATTERN",
        help="with REPOSITORY holding several tag schemes (stacks, targets, overlays): the one to pull, as the "
        "error lists it (<head>YYYYMMDD-rN<tail>) or what its tags start with before the date",
    )
    p.add_argument(
        "--platform",
        metavar="PLATFORM",
        help="a tag that is an index of platforms: pull the image of PLATFORM (linux/arm64, arm64 or aarch64; default: "
        "the engine's own platform)",
    )
    add_retry(p)
    add_json(p, "the verdict, failure count and lines")
    add_set(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser(
        "copy",
        help="copy a published image with its publish record, signed provenance and SBOM to another repository or "
        "registry, by digest (resumable; a second run copies nothing)",
        description="Copy the image SRC names (an image manifest, or an index with every manifest it lists) byte for "
        "byte, so its digest is unchanged, with every manifest attached to it (the publish record, the signed "
        "provenance, the SBOM: OCI referrers, written as the tag-schema fallback where DST has no referrers API, and "
        "cosign's sha256-<hex>.att tag), then tag it at DST. Blobs DST holds are skipped, ones in another repository "
        "of the same registry mounted; the tag is written last, so a copy cut off part-way completes when run again. "
        "Each registry's credentials are its own (STACKFORGE_REGISTRY_USER/_PASSWORD, else the docker config). "
        "`stackforge verify DST --key KEY.pub` then passes at DST.",
    )
    p.add_argument("source", metavar="SRC", help="HOST/NAME:TAG or HOST/NAME@sha256:… (a published image)")
    p.add_argument(
        "destination",
        metavar="DST",
        help="HOST/NAME[:TAG] (another registry, repository and tag may be named; without a tag, SRC's tag or digest)",
    )
    add_retry(p)
    add_json(p, "what was copied and what DST already held: each manifest, blob and tag")
    p.set_defaults(func=cmd_copy)


def print_verification(args, v, summary: str) -> int:
    """A verification's lines (or JSON), its verdict line and the one line of what it checked; exit 1 when a
    check failed."""
    verb, _, subject = summary.partition(" ")
    subject += " (pulled)" if verb == "pull" else ""
    if args.json:
        print_json(
            {
                "image": v.image,
                "stack": v.stack,
                "ok": not v.failed,
                "failed": v.failed,
                "lines": v.lines,
                "checked": v.checked(),
                "summary": v.summary(subject),
            }
        )
    else:  # the lines carry what a registry and an image said: no escape sequence reaches the terminal
        for line in v.lines:
            print(for_terminal(line, lines=False))
        print(for_terminal(v.summary(subject), lines=False) + (", refused" if v.failed else ""))
    return 1 if v.failed else 0


def _is_stack(args) -> bool:
    """Whether ``pull NAME`` names a stack of a checkout (else a repository)."""
    from stackforge.stack.names import STACK_NAME, STACKS_DIR

    if "/" in args.stack or not STACK_NAME.fullmatch(args.stack):
        return False
    try:
        root = root_of(args)
    except UserError:
        return False
    return (root / STACKS_DIR / f"{args.stack}.yaml").is_file()


def cmd_pull(args) -> int:
    from stackforge.clients.registry import RegistryClient, parse_registry
    from stackforge.flows.operator import newest, newest_published, tag_pulled, verify_ref
    from stackforge.publish.stack import destination
    from stackforge.stack.scheme import validate_date

    date = validate_date(args.date) if args.date else None
    policy = retry_policy(args)
    if args.registry and _is_stack(args):
        if args.tags:
            raise UserError("--tags: a stack's tag scheme comes from its tags.publish", file="--tags",
                            fix="leave out --tags, or pull the repository (HOST/NAME) instead of the stack")  # fmt: skip
        loaded = build_input(args, args.stack)
        _, repository, scheme, _, _ = destination(loaded, args.registry, date or "19700101", args.target)
        tag, _ = newest(RegistryClient(repository, policy=policy), scheme, date)
    else:
        for flag, given in (("--target", args.target), ("--set", args.overrides)):
            if given:
                raise UserError(f"{flag}: {args.stack} is not a stack of this checkout, so it is pulled as a "
                                "repository", file=flag, fix=f"leave out {flag} (use --tags to pick a scheme)")  # fmt: skip
        text = f"{args.registry.strip().rstrip('/')}/{args.stack}" if args.registry else args.stack
        repository = parse_registry(text, what="REPOSITORY", require_name=True)
        tag, _ = newest_published(RegistryClient(repository, policy=policy), date, args.tags)
    engine = workspace_of(args).engine
    v = verify_ref(f"{repository}:{tag}", engine, policy, platform=args.platform)
    if not v.failed:
        tag_pulled(engine, v.image, f"{repository}:{tag}")
    return print_verification(args, v, f"pull {repository}:{tag}")


def cmd_copy(args) -> int:
    copied = copy_image(args.source, args.destination, retry_policy(args), stderr_echo)
    if args.json:
        print_json(copied.to_json())
    else:
        print("\n".join(copied.lines()))
    return 0


def cmd_publish(args) -> int:
    loaded = build_input(args, args.stack)
    options = PublishOptions(
        policy=retry_policy(args),
        compression=args.compression,
        level=args.compression_level,
        trust=TrustOptions(
            sign_key=args.sign_key,
            osv=args.osv,
            fail_on=args.fail_on,
            osv_max_age=osv_max_age_of(args) if args.osv else None,
        ),
        verify_pull=args.verify_pull,
        echo=stderr_echo,
    )
    common = dict(date=args.date, out=args.out, allow_ungated=args.allow_ungated, workspace=workspace_of(args))
    if args.overlay and args.platform:
        raise UserError("--platform: an overlay publishes the one image it was built as", file="--platform",
                        fix="leave out --platform")  # fmt: skip
    if args.overlay:
        from stackforge.overlay.load import load_overlay
        from stackforge.overlay.publish import publish_overlay

        if args.target:
            raise UserError(
                "--target: an overlay publishes the image it was built as", file="--target", fix="leave out --target"
            )
        result = publish_overlay(loaded, load_overlay(loaded.root, args.overlay), args.registry, options, **common)
    elif args.platform == "all":
        from stackforge.publish.stack import publish_platforms

        both = publish_platforms(loaded, args.registry, options, target=args.target, **common)
        if args.json:
            print_json(both.evidence())
            return 0
        result = both.index
        for name, child in both.platforms.items():
            print(f"platform:  {name} {child.repository}@{child.digest}")
    else:
        result = publish_stack(loaded, args.registry, options, target=args.target, **common)
    if args.json:
        print_json(result.evidence())
        return 0
    verb = "published" if result.status == "published" else "already published (nothing new pushed)"
    print(f"{verb}: {result.reference}")
    print(f"digest:    {result.digest}")
    print(f"pinned:    {result.repository}@{result.digest}")
    print(f"image id:  {result.image_id}")
    for alias, what in result.aliases.items():
        print(f"alias:     {result.repository}:{alias} ({what})")
    return 0
