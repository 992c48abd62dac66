"""The one path from a stack to its Dockerfile, shared by `render`, `build` and `bake`.

Lint the stack, assemble the build context, compute the image labels and write
build/<stack>/Dockerfile. Nothing here talks to the engine: what only the engine
knows (the base image's identity, whether BuildKit honours SOURCE_DATE_EPOCH and
``RUN --network=none``) comes
in through a callback, so the same stack and inputs give the same Dockerfile bytes
whichever verb wrote it; a clean build's names its own cache mounts (``render.clean_scope``).
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.builder.context import embed
from stackforge.builder.context.context import Context, assemble, write_dockerfile
from stackforge.builder.locks.locks import check_locks, lock_keys, read_lock
from stackforge.builder.plan import contract
from stackforge.builder.plan.cabundle import ca_mount
from stackforge.builder.plan.plan import EPOCH_LABEL, image_labels
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import BuildFailed, UserError
from stackforge.stack import rules

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack

#: Why `org.stackforge.inputs` is left out of a Dockerfile rendered without sources.
INPUTS_OMITTED = (
    "the upstreams were not fetched (--no-sources), so the fingerprint of the inputs "
    "(sources, patch series, base image) cannot be computed"
)


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|z|[+-]\d\d:\d\d)")


@dataclass(frozen=True)
class BaseImage:
    """The base image as the engine resolved it. Its identity in the image and the inputs is what every image store
    agrees on: its config's digest, and the registry digest the stack pins."""

    digest: str | None  # the registry digest the stack pins (base.digest, or base.image@sha256:…); else None
    id: str | None  # its config's digest: the classic store's image id, the containerd store's config
    created: str | None = None  # its config's creation time (RFC 3339), when it records one
    layers: int | None = None  # how many layers it has
    engine_id: str | None = None  # the engine's own name for it (``docker image inspect .Id``): this store's


@dataclass(frozen=True)
class EngineFacts:
    """What only the engine knows and the Dockerfile depends on."""

    base: BaseImage
    source_date_epoch: bool  # BuildKit honours SOURCE_DATE_EPOCH (0.11+)
    run_network: bool = False  # the Dockerfile frontend takes RUN --network=none
    named_contexts: bool = True  # ... and named build contexts (else the CA bundle is a secret)


@dataclass
class Prepared:
    """A stack ready for the engine: context and Dockerfile written, labels and build args fixed.

    ``inputs_omitted`` says why the labels hold no `org.stackforge.inputs` (None when they do)."""

    ctx: Context
    labels: dict[str, str]
    build_args: dict[str, str]
    inputs_omitted: str | None = None
    base: BaseImage | None = None  # the base image as the engine resolved it (None: the engine was not asked)


#: every rule a stack is held to: the release-train rules (``stack.rules``), its lock files, then its upstreams'
#: image contracts (``builder/plan/contract.py``)
RULES = [*rules.RULES, check_locks, contract.check]


def lint(loaded: ResolvedStack) -> list[rules.Finding]:
    """Every rule on every platform line of the stack (``rules.on_lines``)."""
    return rules.on_lines(loaded, RULES)


def buildable(loaded: ResolvedStack) -> None:
    """Refuse a platform line that declares values no record states (``platforms.<line>.unknown``)."""
    line = loaded.line
    if line is None or not line.unknown:
        return
    at = ("platforms", line.name, "unknown")
    shown = "; ".join(f"{key}: {why}" for key, why in list(line.unknown.items())[:3])
    more = f"; … ({len(line.unknown)} in all)" if len(line.unknown) > 3 else ""
    raise BuildFailed(
        f"platform {line.name} ({line.oci}) of stack '{loaded.name}' is declared, not buildable: no record states "
        f"{shown}{more}; nothing was rendered or built",
        **(loaded.keypositions.get(at) or loaded.position(at)).as_error_kwargs(),
        fix=f"pin those values for the line under platforms.{line.name}.with and drop them from "
        f"platforms.{line.name}.unknown",
    )


def lint_or_fail(loaded: ResolvedStack) -> None:
    buildable(loaded)
    stack = loaded.model
    for key in lock_keys(stack):
        try:
            read_lock(loaded, key)
        except UserError as err:  # a lock file the build would refuse: its own error (file:line, fix; exit 2)
            raise BuildFailed(
                err.message, file=err.file, line=err.line, col=err.col, fix=err.fix, exit_code=err.exit_code
            ) from None
    findings = lint(loaded)
    if findings:
        text = "\n".join(f.render(loaded) for f in findings)
        raise BuildFailed(
            f"stack '{stack.name}' fails lint; nothing was built:\n{text}",
            fix=f"fix the findings (stackforge lint {stack.name})",
        )


def rfc3339_seconds(value: str) -> int | None:
    """Whole seconds of an RFC 3339 time as engines write them (``2026-12-01T10:11:12.123456789Z``), or None."""
    match = _RFC3339.fullmatch(value.strip())
    if match is None:
        return None
    zone = "+00:00" if match.group(2) in ("Z", "z") else match.group(2)
    return int(_dt.datetime.fromisoformat(match.group(1) + zone).timestamp())


def layer_epoch(base_created: str | None, source_date_epoch: int | None) -> int | None:
    """The stack's layer epoch (``plan.EPOCH_LABEL``): the base image's creation time, else the sources'
    SOURCE_DATE_EPOCH, else none. Not the sources' time first: a layer epoch that moved with every upstream bump
    would change the bytes (and the build cache) of every dependency layer under the upstream."""
    seconds = rfc3339_seconds(base_created) if base_created else None
    if seconds is not None and seconds > 0:
        return seconds
    return source_date_epoch


def prepare_dockerfile(
    loaded: ResolvedStack,
    *,
    out: Path | None = None,
    sources: bool = True,
    syntax: str | None = None,
    engine_facts: Callable[[], EngineFacts] | None = None,
    workspace: Workspace | None = None,
    cache_scope: str = "",
) -> Prepared:
    """Lint, assemble the context, compute the labels and write the Dockerfile.

    ``engine_facts``, called once the stack passes lint, gives what only the engine knows: the resolved
    base image (its digest and id become labels and part of the inputs), whether BuildKit honours
    SOURCE_DATE_EPOCH (the pinned upstream commit's time then becomes the build argument and the
    `created` label, unless the stack sets ``created_label: false``) and whether it takes
    ``RUN --network=none`` (the offline steps then get no network). Without it the labels name no base digest or id and no creation time.
    ``sources=False`` fetches no upstream; the labels then hold no `org.stackforge.inputs`, since the
    sources it fingerprints are unknown (``Prepared.inputs_omitted`` gives the reason).
    ``cache_scope`` (a clean build's ``render.clean_scope``) gives the Dockerfile's cache mounts ids of the
    build's own; the labels, build arguments and inputs do not depend on it."""
    lint_or_fail(loaded)
    facts = engine_facts() if engine_facts else None
    base, epoch = (facts.base, facts.source_date_epoch) if facts else (None, False)
    base_epoch = rfc3339_seconds(base.created) if base and base.created else None
    ctx = assemble(loaded, out, sources=sources, workspace=workspace, base_epoch=base_epoch)
    digest, image_id = (base.digest, base.id) if base else (None, None)
    ctx.base = digest or image_id
    created = None
    build_args: dict[str, str] = {}
    if sources and epoch and ctx.source_date_epoch is not None and loaded.model.labels_created:
        created = _dt.datetime.fromtimestamp(ctx.source_date_epoch, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    omitted = None if sources else INPUTS_OMITTED
    labels = image_labels(
        loaded,
        base_digest=digest,
        base_id=image_id,
        created=created,
        series=ctx.series,
        inputs=None if omitted else ctx.inputs_fingerprint(),
        post_install=ctx.post_install,
        epoch=layer_epoch(base.created if base else None, ctx.source_date_epoch if sources else None),
        base_layers=base.layers if base else None,
    )
    labels[embed.LABEL] = embed.label(loaded)
    if sources and epoch and EPOCH_LABEL in labels:
        # The engine stamps the image config's times with it: a rebuild from cache is the same image. The layer
        # epoch, not the sources' time: the stages declare it as their SOURCE_DATE_EPOCH, and a build argument
        # that moved with every upstream bump would re-run every dependency stage.
        build_args["SOURCE_DATE_EPOCH"] = labels[EPOCH_LABEL]
    write_dockerfile(
        ctx,
        labels,
        syntax=syntax,
        run_network=bool(facts and facts.run_network),
        ca=ca_mount(
            workspace_for(loaded, workspace).ca_bundle_file() is not None, facts.named_contexts if facts else True
        ),
        cache_scope=cache_scope,
    )
    return Prepared(ctx, labels, build_args, omitted, base)
