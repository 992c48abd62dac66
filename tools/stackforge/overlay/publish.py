"""Publish an overlay image with the stack publisher: the gated local image of the last ``stackforge build STACK
--overlay NAME``, under the overlay's immutable ``tags.publish`` scheme (dated ``-rN``, never moved), with the overlay's publish record
attached (:mod:`stackforge.overlay.record`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from stackforge.clients.engine import Engine
from stackforge.clients.registry import parse_registry, parse_repository
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import UserError
from stackforge.fslock import stack_lock
from stackforge.overlay import record as overlay_record
from stackforge.overlay.build import check_stack, local_ref, overlay_build_dir, publish_ref
from stackforge.overlay.load import LoadedOverlay, check_files
from stackforge.publish import record as records
from stackforge.publish.codec import codec
from stackforge.publish.oci import DockerImage
from stackforge.publish.publisher import PublishOptions, PublishResult, publish
from stackforge.publish.stack import check_gated, publish_dir
from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.scheme import TagScheme, validate_date


def publish_overlay(
    loaded: ResolvedStack,
    ov: LoadedOverlay,
    registry: str,
    options: PublishOptions | None = None,
    *,
    date: str | None = None,
    out: Path | None = None,
    allow_ungated: bool = False,
    engine: Engine | None = None,
    workspace: Workspace | None = None,
) -> PublishResult:
    """Publish the overlay image a gated overlay build made (found by image id); the record goes beside that
    build's evidence."""
    ws = workspace_for(loaded, workspace)
    reg = parse_registry(registry, what="--registry")
    date = validate_date(date)
    target = check_stack(loaded, ov, None)
    check_files(ov)  # the overlay directory still declares what was built
    first = publish_ref(loaded, ov, str(reg), date, 1)
    repository = parse_repository(first.repository, what="publish repository", plain_http=reg.scheme == "http")
    scheme = TagScheme.from_render(lambda d, r: publish_ref(loaded, ov, str(reg), d, r).tag)
    options = options or PublishOptions()
    codec(options.compression or "gzip", options.level)  # refused before the engine or the registry is asked
    local = local_ref(loaded, ov)
    odir = overlay_build_dir(loaded, ov, out)
    with stack_lock(odir):
        root = odir / "evidence"
        engine = engine or ws.engine
        image = DockerImage(local, engine=engine)
        try:
            image.inspect()
        except UserError as err:
            raise UserError(
                f"{err.message}; nothing was published",
                fix=f"build it first: stackforge build {loaded.name} --overlay {ov.name}",
            ) from None
        assert image.image_id is not None
        gated = (
            None
            if allow_ungated
            else check_gated(root, f"{loaded.name} --overlay {ov.name}", target, image.image_id, local)
        )
        extra = {
            "stack": loaded.name,
            "overlay": ov.name,
            "target": target,
            "local_ref": local,
            "gated_build": gated,
            "date": date,
        }
        evidence_dir = publish_dir(root, gated, image.image_id)
        options = replace(options, layer_cache=ws.cache("layers"))
        result = publish(image, repository, scheme, date, options, engine=engine, evidence=evidence_dir, extra=extra)
        labels = engine.image_labels(local)
        made = overlay_record.make(target, evidence_dir, result, labels, engine, local)
        records.attach_made(made, evidence_dir, result, repository, options.policy)
        return result
