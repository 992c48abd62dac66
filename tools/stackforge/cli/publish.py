"""`stackforge publish`: push a stack's gated image under an immutable, never-overwritten tag."""

from __future__ import annotations

from stackforge.cli.options import (
    BUILD_DIR_OUT,
    add_json,
    add_out,
    add_retry,
    add_set,
    load,
    print_json,
    retry_policy,
    workspace_of,
)
from stackforge.errors import UserError
from stackforge.publish.publisher import stderr_echo
from stackforge.publish.stack import publish_stack


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
    p.add_argument("--compression", choices=["gzip", "none"], default="gzip", help="layer compression (default gzip)")
    add_retry(p)
    add_json(p, "the evidence record")
    add_set(p)
    p.set_defaults(func=cmd_publish)


def cmd_publish(args) -> int:
    loaded = load(args, args.stack)
    common = dict(
        date=args.date,
        out=args.out,
        allow_ungated=args.allow_ungated,
        verify_pull=args.verify_pull,
        policy=retry_policy(args),
        compression=args.compression,
        echo=stderr_echo,
        workspace=workspace_of(args),
    )
    if args.overlay:
        from stackforge.overlay.load import load_overlay
        from stackforge.overlay.publish import publish_overlay

        if args.target:
            raise UserError(
                "--target: an overlay publishes the image it was built as", file="--target", fix="leave out --target"
            )
        result = publish_overlay(loaded, load_overlay(loaded.root, args.overlay), args.registry, **common)
    else:
        result = publish_stack(loaded, args.registry, target=args.target, **common)
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
