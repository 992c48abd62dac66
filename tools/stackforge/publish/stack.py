"""Publishing a built stack: the glue between ``stackforge build`` and the publisher.

:func:`publish_stack` takes the local image the last build of a stack and target made, checks
that this build passed its gate (:func:`check_gated`), derives the repository, tag scheme and
aliases from the stack's ``tags:`` templates and publishes under the stack's build-directory lock,
with the evidence in ``build/<stack>/evidence/``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stackforge.build.context import build_dir_for
from stackforge.build.engine import Engine
from stackforge.build.prepare import lint_or_fail
from stackforge.build.run import default_target, target_ref
from stackforge.errors import BuildFailed, UserError
from stackforge.fslock import stack_lock
from stackforge.publish.oci import DockerImage
from stackforge.publish.publisher import PublishResult, publish
from stackforge.publish.registry import RetryPolicy, parse_registry, parse_repository
from stackforge.publish.scheme import TagScheme, validate_date
from stackforge.stack import tags as tagsmod
from stackforge.stack.load import LoadedStack
from stackforge.stack.targets import published
from stackforge.workspace import Workspace, workspace_for


def check_gated(evidence_dir: Path, stack_name: str, target: str, image_id: str, local_ref: str) -> dict[str, Any]:
    """The local image must be the one the last ``stackforge build`` of this stack and target gated."""
    path = evidence_dir / "result.json"
    fix = f"run `stackforge build {stack_name} --target {target}` first (publish only ships gated images)"
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"no gated build of {stack_name}/{target}: {path} does not exist; nothing was published",
            fix=fix + ", or pass --allow-ungated",
        ) from None
    except ValueError:
        raise UserError(f"{path} is not valid JSON; nothing was published", fix=fix) from None
    if not result.get("ok"):
        raise BuildFailed(
            f"the last build of {stack_name} failed ({result.get('reason', 'see its evidence')}); "
            "nothing was published",
            fix=fix,
        )
    if result.get("target") != target:
        raise UserError(
            f"the last build of {stack_name} was for target {result.get('target')!r}, not {target!r}; "
            "nothing was published",
            fix=fix,
        )
    if result.get("image_id") != image_id:
        raise BuildFailed(
            f"local image {local_ref} is {image_id}, but the gated build produced {result.get('image_id')}; "
            "nothing was published",
            fix=fix,
        )
    return {"evidence": str(path), "image_id": result.get("image_id"), "tag": result.get("tag")}


def publish_stack(
    loaded: LoadedStack,
    registry: str,
    *,
    date: str | None = None,
    target: str | None = None,
    out: Path | None = None,
    allow_ungated: bool = False,
    verify_pull: bool = False,
    policy: RetryPolicy | None = None,
    compression: str = "gzip",
    engine: Engine | None = None,
    lock_dir: Path | None = None,
    echo: Callable[[str], None] | None = None,
    workspace: Workspace | None = None,
    move_aliases: bool = True,
) -> PublishResult:
    """Publish the local image that ``stackforge build`` made for ``stack``/``target``.

    Repository, immutable tag scheme and aliases come from the stack's ``tags:`` templates
    under ``registry``; a target other than the stack's first one gets ``-<target>`` after
    the tag (as its local tag does). The evidence goes to ``build/<stack>/evidence/publish.json``; the
    engine (unless ``engine`` is given) and the layer cache are the workspace's. ``move_aliases=False``
    publishes the immutable tag only (the nightly moves ``-latest`` after the image's smoke passed, by
    publishing again: the image is found already published and only the aliases move).
    """
    stack, ws = loaded.model, workspace_for(loaded, workspace)
    reg = parse_registry(registry, what="--registry")
    date = validate_date(date)
    try:
        lint_or_fail(loaded)
    except BuildFailed as err:
        raise BuildFailed(f"{err.message}\nNothing was published.", fix=f"{err.fix}, rebuild, then publish") from None
    target = default_target(loaded, target)
    suffix = "" if target == published(stack)[0] else f"-{target}"
    first = tagsmod.publish_ref(loaded, str(reg), date, 1)
    repository = parse_repository(first.repository, what="publish repository", plain_http=reg.scheme == "http")
    scheme = TagScheme.from_render(lambda d, r: tagsmod.publish_ref(loaded, str(reg), d, r).tag + suffix)
    aliases = []
    for alias in tagsmod.alias_refs(loaded, str(reg)):
        if alias.repository != first.repository:
            raise UserError(
                f"alias {alias} is not in the publish repository {first.repository}",
                fix="aliases name the same repository as tags.publish",
            )
        aliases.append(alias.tag + suffix)
    local = target_ref(loaded, target)
    with stack_lock(build_dir_for(loaded, out)):  # no build of this stack replaces its evidence meanwhile
        evidence = build_dir_for(loaded, out) / "evidence"
        engine = engine or ws.engine
        image = DockerImage(local, engine=engine)
        image.inspect()
        assert image.image_id is not None
        gated = None if allow_ungated else check_gated(evidence, stack.name, target, image.image_id, local)
        extra = {"stack": stack.name, "target": target, "local_ref": local, "gated_build": gated, "date": date}
        return publish(
            image,
            repository,
            scheme,
            date,
            aliases=aliases if move_aliases else [],
            policy=policy,
            compression=compression,
            lock_dir=lock_dir,
            verify_pull=verify_pull,
            engine=engine,
            echo=echo,
            evidence=evidence,
            extra=extra,
            layer_cache=ws.cache("layers"),
        )
