"""Publishing a built stack: the glue between ``stackforge build`` and the publisher.

:func:`publish_stack` takes the local image of a stack and target, finds the build that gated it by
its image id (:func:`check_gated`), derives the repository, tag scheme and aliases from the stack's
``tags:`` templates and publishes under the stack's build-directory lock, with the record beside that
build's evidence (``build/<stack>/evidence/<build-id>/publish.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge import safeio
from stackforge.builder.context.context import build_dir_for
from stackforge.builder.context.prepare import lint_or_fail
from stackforge.builder.records import evidence, sbom, vulns, waivers
from stackforge.builder.run.run import default_target, target_ref
from stackforge.clients.engine import Engine
from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, parse_registry, parse_repository
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import BuildFailed, UserError
from stackforge.fslock import stack_lock
from stackforge.publish import attest, platforms, record
from stackforge.publish.codec import codec
from stackforge.publish.oci import DockerImage
from stackforge.publish.publisher import (
    FAILED_RECORD,
    PUBLISHED_RECORD,
    PublishHooks,
    PublishOptions,
    PublishResult,
    PushLog,
    publish,
    write_evidence,
)
from stackforge.stack import tags as tagsmod
from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.scheme import validate_date
from stackforge.stack.targets import published

if TYPE_CHECKING:
    from stackforge.clients.registry import Repository
    from stackforge.stack.scheme import TagScheme


def check_gated(evidence_dir: Path, stack_name: str, target: str, image_id: str, local_ref: str) -> dict[str, Any]:
    """The local image must be one a ``stackforge build`` of this stack and target gated: the build under the
    evidence root ``evidence_dir`` whose ``result.json`` has this image id (the newest such build)."""
    fix = f"run `stackforge build {stack_name} --target {target}` first (publish only ships gated images)"
    build, every = evidence.find_gated(evidence_dir, image_id, target)
    if build is None and not every:
        raise UserError(
            f"no gated build of {stack_name}/{target}: {evidence_dir} holds no build; nothing was published",
            fix=fix + ", or pass --allow-ungated",
        )
    if build is None:
        gated = [(b, r) for b in reversed(every) if (r := evidence.read_result(b)) and r.get("ok")]
        ours = [(b, r) for b, r in gated if r.get("target") == target]
        if ours:
            seen = f"the newest gated build of {target} ({ours[0][0].name}) produced {ours[0][1].get('image_id')}"
        else:
            newest = evidence.read_result(every[-1]) or {}
            seen = f"the newest build ({every[-1].name}) " + (
                f"failed: {str(newest.get('reason', 'see its evidence')).splitlines()[0]}"
                if not newest.get("ok")
                else f"was for target {newest.get('target')!r}"
            )
        raise BuildFailed(
            f"local image {local_ref} is {image_id}, but no gated build of {stack_name}/{target} in {evidence_dir} "
            f"produced it ({seen}); nothing was published",
            fix=fix,
        )
    result = evidence.read_result(build) or {}
    return {
        "evidence": str(build / evidence.RESULT),
        "build_id": build.name,
        "image_id": result.get("image_id"),
        "tag": result.get("tag"),
    }


def publish_dir(evidence_root: Path, gated: dict[str, Any] | None, image_id: str) -> Path:
    """Where the publish record of ``image_id`` goes: beside the gated build that made it; for an ungated
    publish, the newest gated build of that image if there is one, else the directory holding an earlier
    publish record of that image, else a directory of its own (a build id holding only the record)."""
    if gated is not None:
        return Path(gated["evidence"]).parent
    found, every = evidence.find_gated(evidence_root, image_id)
    if found is not None:
        return found
    for build in reversed(every):
        for name in (PUBLISHED_RECORD, FAILED_RECORD):
            if not (build / name).is_file():  # absent (or a FIFO or device: never opened)
                continue
            data = safeio.read_json(build / name, what="publish record", limit=record.EVIDENCE_LIMIT, root=build)
            if isinstance(data, dict) and image_id in (data.get("image_id"), data.get("gated_image_id")):
                return build
    return evidence.new_build(evidence_root)


def destination(
    loaded: ResolvedStack, registry: str, date: str, target: str | None
) -> tuple[str, Repository, TagScheme, tagsmod.Ref, str]:
    """(target, repository, tag scheme, the first tag's reference, the target's tag suffix) of a stack's
    published image under ``registry``, from the stack's ``tags.publish`` template."""
    reg = parse_registry(registry, what="--registry")
    target = default_target(loaded, target)
    suffix = "" if target == published(loaded.model)[0] else f"-{target}"
    first = tagsmod.publish_ref(loaded, str(reg), date, 1)
    repository = parse_repository(first.repository, what="publish repository", plain_http=reg.scheme == "http")
    scheme = tagsmod.publish_scheme(loaded, str(reg), suffix)
    return target, repository, scheme, first, suffix


def alias_tags(loaded: ResolvedStack, registry: str, first: tagsmod.Ref, suffix: str) -> list[str]:
    """The alias tags of a stack's target (``suffix``: its tag suffix) in the publish repository of ``first`` (the
    first tag's reference, :func:`destination`)."""
    reg = parse_registry(registry, what="--registry")
    aliases = []
    for alias in tagsmod.alias_refs(loaded, str(reg)):
        if alias.repository != first.repository:
            raise UserError(
                f"alias {alias} is not in the publish repository {first.repository}",
                fix="aliases name the same repository as tags.publish",
            )
        aliases.append(alias.tag + suffix)
    return aliases


def publish_stack(
    loaded: ResolvedStack,
    registry: str,
    options: PublishOptions | None = None,
    *,
    date: str | None = None,
    target: str | None = None,
    out: Path | None = None,
    allow_ungated: bool = False,
    engine: Engine | None = None,
    workspace: Workspace | None = None,
    move_aliases: bool = True,
) -> PublishResult:
    """Publish the local image that ``stackforge build`` made for ``stack``/``target``, pushed as ``options`` say
    (the layer cache is the workspace's).

    Repository, immutable tag scheme and aliases come from the stack's ``tags:`` templates
    under ``registry``; a target other than the stack's first one gets ``-<target>`` after
    the tag (as its local tag does). The record goes to ``publish.json`` of the gated build that made
    the image (``build/<stack>/evidence/<build-id>/``); the engine (unless ``engine`` is given) and the
    layer cache are the workspace's. ``move_aliases=False``
    publishes the immutable tag only (the nightly moves ``-latest`` after the image's smoke passed, by
    publishing again: the image is found already published and only the aliases move).
    """
    stack, ws = loaded.model, workspace_for(loaded, workspace)
    parse_registry(registry, what="--registry")
    date = validate_date(date)
    try:
        lint_or_fail(loaded)
    except BuildFailed as err:
        raise BuildFailed(
            f"{err.message}\nNothing was published.",
            fix=f"{err.fix}, rebuild, then publish",
            file=err.file,
            line=err.line,
            col=err.col,
            exit_code=err.exit_code,
        ) from None
    target, repository, scheme, first, suffix = destination(loaded, registry, date, target)
    aliases = alias_tags(loaded, registry, first, suffix)
    options = options or PublishOptions()
    # the codec and its level are refused before the engine or the registry is asked anything
    compression = options.compression or stack.tags.compression or "gzip"
    codec(compression, options.level)
    local = target_ref(loaded, target)
    with stack_lock(build_dir_for(loaded, out)):  # no build of this stack replaces its evidence meanwhile
        root = build_dir_for(loaded, out) / "evidence"
        engine = engine or ws.engine
        image = DockerImage(local, engine=engine)
        image.inspect()
        assert image.image_id is not None
        gated = None if allow_ungated else check_gated(root, stack.name, target, image.image_id, local)
        extra = {"stack": stack.name, "target": target, "local_ref": local, "gated_build": gated, "date": date}
        evidence_dir = publish_dir(root, gated, image.image_id)
        scanned = vulnerability_gate(options, evidence_dir, engine, local, loaded.root)
        held = scan_record(scanned) if scanned is not None else None
        if held is not None:
            extra["scan"] = held
        options = replace(options, layer_cache=ws.cache("layers"), compression=compression)
        attacher = record.Attacher(loaded, target, evidence_dir, repository, engine, local, options.policy)
        attacher.scan = scanned.summary() if scanned is not None else None
        signing = _signing(loaded, target, options, evidence_dir, repository, engine, local)
        result = publish(
            image,
            repository,
            scheme,
            date,
            options,
            aliases=aliases if move_aliases and not (held and held["blocking"]) else [],
            engine=engine,
            evidence=evidence_dir,
            extra=extra,
            # the record's work that the verdict does not decide; the signed provenance before any tag
            hooks=PublishHooks(during_settle=attacher.prepare, before_tag=signing),
        )
        attacher.finish(result)
        _attach_sbom(evidence_dir, repository, options, result)
        if scanned is not None:
            result.scan = scanned.summary()
        if held and held["blocking"] and move_aliases:
            result.aliases.update({a: f"not moved: {held['reason']}" for a in aliases})
        return result


def vulnerability_gate(
    options: PublishOptions, evidence_dir: Path, engine: Engine, local: str, root: Path | None = None
) -> vulns.ScanReport | None:
    """The scan of the build's SBOM against ``options.trust.osv`` (None without it), with the repository's waivers
    (``root``'s stacks/waivers.yaml). A database that cannot give a verdict (missing, empty, too old, not
    covering the image) is an error before anything is pushed."""
    if options.trust.osv is None:
        return None
    vulns.check_level(options.trust.fail_on)
    max_age = vulns.parse_max_age(options.trust.osv_max_age or vulns.DEFAULT_MAX_AGE)
    path = evidence_dir / sbom.EVIDENCE
    text = (
        safeio.read_bytes(path, limit=sbom.MAX_BYTES, what="SBOM", follow=False)
        if path.is_file()
        else sbom.of_image(engine, local)
    )
    return vulns.scan_sbom(
        text,
        local,
        options.trust.osv,
        options.trust.fail_on,
        source=path,
        max_age=max_age,
        waivers=waivers.load_repository(root),
    )


def scan_record(report: vulns.ScanReport) -> dict[str, Any]:
    """The scan as ``publish.json`` carries it: the verdict's fields (as the nightly summary has them), the
    database, every finding's line, the blocking ids and the reason no alias moves."""
    summary = report.summary()
    return {
        "verdict": summary["verdict"],
        "blocked": summary["blocked"],
        "waived": summary["waived"],
        "snapshots": summary["database"],
        "waivers": summary["waivers"],
        "database": report.database,
        "records": report.records,
        "fail_on": report.fail_on,
        "findings": [j.line(report.fail_on) for j in report.judged()],
        "blocking": [f.id for f in report.blocking],
        "reason": report.reason,
    }


def _attach_sbom(evidence_dir: Path, repository: Repository, options: PublishOptions, result: PublishResult) -> None:
    """The build's SBOM (``sbom.cdx.json`` of its evidence) attached to the published image."""
    path = evidence_dir / "sbom.cdx.json"
    if not path.is_file():
        return
    client = RegistryClient(repository, policy=options.policy or RetryPolicy())
    try:
        attest.attach_sbom(client, result.digest, path.read_bytes())
    except RegistryError as exc:
        raise BuildFailed(
            f"{result.reference} is published, but its SBOM could not be attached: {exc}",
            fix="re-run the same publish: the image is found already published and the SBOM is attached",
        ) from None


def _signing(
    loaded: ResolvedStack,
    target: str,
    options: PublishOptions,
    evidence_dir: Path,
    repository: Repository,
    engine: Engine,
    local: str,
) -> attest.Signing | None:
    """The provenance signer of this publish (None without ``options.trust.sign_key``); the key is read now, so a bad
    key fails before anything is pushed."""
    if options.trust.sign_key is None:
        return None
    from stackforge.publish import provenance

    provenance.signer(options.trust.sign_key)

    def unsigned() -> dict[str, Any]:
        labels = engine.image_labels(local)
        data = record.details(loaded, evidence_dir, labels)
        data["stack_files"] = {n: e.model_dump() for n, e in data["stack_files"].items()}
        gated = engine.image_id(local)  # the image the gate ran in; the published id may be its normalized form
        head = {"stack": loaded.model.name, "target": target, "gated_image_id": gated}
        return {**head, **{k: v for k, v in data.items() if k != "gate"}}

    inputs_file = evidence_dir / "inputs.json"
    inputs = (
        safeio.read_json(inputs_file, what="build inputs", limit=record.EVIDENCE_LIMIT) if inputs_file.exists() else {}
    )
    if not isinstance(inputs, dict):
        raise safeio.Malformed("build inputs: not a JSON object", file=inputs_file)
    client = RegistryClient(repository, policy=options.policy or RetryPolicy())
    return attest.Signing(options.trust.sign_key, unsigned, inputs, client, evidence_dir)


@dataclass
class PlatformsResult:
    """A publish of every platform line under one tag: the index's result, and each platform's image (by digest,
    under that tag through the index) with its own record, signature and SBOM."""

    index: PublishResult
    platforms: dict[str, PublishResult]

    def evidence(self) -> dict[str, Any]:
        return {
            **self.index.evidence(),
            "platforms": {
                name: {"digest": r.digest, "image_id": r.image_id, "pinned_reference": f"{r.repository}@{r.digest}"}
                for name, r in self.platforms.items()
            },
        }


def publish_platforms(
    loaded: ResolvedStack,
    registry: str,
    options: PublishOptions | None = None,
    *,
    date: str | None = None,
    target: str | None = None,
    out: Path | None = None,
    allow_ungated: bool = False,
    engine: Engine | None = None,
    workspace: Workspace | None = None,
    move_aliases: bool = True,
) -> PlatformsResult:
    """Publish every platform line of the stack under one immutable tag: each line's gated image (``build STACK
    --platform LINE``) pushed by digest with its signed provenance, then an OCI image index over them tagged with
    the first free ``-rN`` of the date, then each image's record and SBOM attached to it. The aliases move with the
    index, only when every platform passed (gated, pushed, not blocked by the vulnerability gate); a line that
    fails leaves no tag. ``out``: the own line's build directory (another line's is ``<out>@<line>``)."""
    stack, ws = loaded.model, workspace_for(loaded, workspace)
    reg = parse_registry(registry, what="--registry")
    date = validate_date(date)
    lines = loaded.platform_lines()
    for line in lines.values():
        try:
            lint_or_fail(line)
        except BuildFailed as err:
            raise BuildFailed(
                f"{err.message}\nNothing was published.",
                fix=f"{err.fix}, rebuild, then publish",
                file=err.file,
                line=err.line,
                col=err.col,
                exit_code=err.exit_code,
            ) from None
    target, repository, scheme, first, suffix = destination(loaded, registry, date, target)
    aliases = []
    for alias in tagsmod.alias_refs(loaded, str(reg)):
        if alias.repository != first.repository:
            raise UserError(
                f"alias {alias} is not in the publish repository {first.repository}",
                fix="aliases name the same repository as tags.publish",
            )
        aliases.append(alias.tag + suffix)
    options = options or PublishOptions()
    compression = options.compression or stack.tags.compression or "gzip"
    codec(compression, options.level)
    options = replace(options, layer_cache=ws.cache("layers"), compression=compression)
    engine = engine or ws.engine
    pushed: list[tuple[str, ResolvedStack, PublishResult, Path, dict[str, Any], Any, dict | None]] = []
    blocked: list[str] = []
    for name, line in lines.items():
        child, evidence_dir, extra, attacher, held = _push_by_digest(
            loaded, line, target, date, repository, scheme, options, engine, out, allow_ungated
        )
        if held is not None and held["blocking"]:
            blocked.append(f"{name}: {held['reason']}")
        pushed.append((name, line, child, evidence_dir, extra, attacher, held))
    children = [platforms.Child(line.line.oci, r.digest, *_pushed_manifest(r))  # type: ignore[union-attr]
                for _, line, r, *_ in pushed]  # fmt: skip
    client = RegistryClient(repository, policy=options.policy or RetryPolicy())
    index = platforms.publish_index(
        children,
        client,
        scheme,
        date,
        aliases=tuple(aliases) if move_aliases and not blocked else (),
        lock_dir=options.lock_dir,
        settle_seconds=options.settle_seconds,
        log=PushLog(echo=options.echo),
        description=f"{stack.name}/{target} for {', '.join(c.platform for c in children)}",
    )
    if blocked and move_aliases:
        index.aliases.update({a: f"not moved: {'; '.join(blocked)}" for a in aliases})
    results: dict[str, PublishResult] = {}
    for name, _line, child, evidence_dir, extra, attacher, _held in pushed:
        final = replace(child, status=index.status, tag=index.tag, aliases=dict(index.aliases), scan=attacher.scan)
        attacher.finish(final)
        _attach_sbom(evidence_dir, repository, options, final)
        write_evidence(evidence_dir, {**extra, **final.evidence(), "index": {"digest": index.digest,
                                                                          "reference": index.reference}})  # fmt: skip
        results[name] = final
    return PlatformsResult(index, results)


def _push_by_digest(
    loaded: ResolvedStack,
    line: ResolvedStack,
    target: str,
    date: str,
    repository: Repository,
    scheme: TagScheme,
    options: PublishOptions,
    engine: Engine,
    out: Path | None,
    allow_ungated: bool,
) -> tuple[PublishResult, Path, dict[str, Any], record.Attacher, dict[str, Any] | None]:
    """One platform line's gated image pushed by digest with its signed provenance (no tag): (the push's result, the
    gated build's evidence directory, the record's extra keys, its attacher, the scan's hold or None)."""
    assert line.line is not None
    local = target_ref(line, target)
    build_dir = build_dir_for(line) if out is None else Path(f"{out}{line.line.suffix}")
    with stack_lock(build_dir):  # no build of this line replaces its evidence meanwhile
        root = build_dir / "evidence"
        image = DockerImage(local, engine=engine)
        image.inspect()
        assert image.image_id is not None
        gated = None if allow_ungated else check_gated(root, loaded.model.name, target, image.image_id, local)
        extra = {"stack": loaded.model.name, "target": target, "platform": line.line.oci, "local_ref": local,
                 "gated_build": gated, "date": date}  # fmt: skip
        evidence_dir = publish_dir(root, gated, image.image_id)
        scanned = vulnerability_gate(options, evidence_dir, engine, local, loaded.root)
        held = scan_record(scanned) if scanned is not None else None
        if held is not None:
            extra["scan"] = held
        attacher = record.Attacher(line, target, evidence_dir, repository, engine, local, options.policy)
        attacher.scan = scanned.summary() if scanned is not None else None
        signing = _signing(line, target, options, evidence_dir, repository, engine, local)
        platform = line.line.oci
        hooks = PublishHooks(before_tag=signing,
                             listed=lambda client: platforms.listed_children(client, scheme, date, platform))  # fmt: skip
        child = publish(image, repository, scheme, date, options, engine=engine, hooks=hooks, tag_it=False)
    return child, evidence_dir, extra, attacher, held


def push_line(
    line: ResolvedStack,
    registry: str,
    options: PublishOptions | None = None,
    *,
    of: ResolvedStack,
    date: str | None = None,
    target: str | None = None,
    engine: Engine | None = None,
    workspace: Workspace | None = None,
    move_aliases: bool = False,
) -> PublishResult:
    """One platform line of stack ``of`` pushed by digest into the stack's repository, as :func:`publish_platforms`
    pushes each line — its gated image, signed provenance, its own record and SBOM attached — and no tag: the index
    over every line is tagged later (a sharded night's merge, :func:`platforms.publish_index`). The result's status
    is ``pushed``; its record names no tag yet (unless a tag of the date already holds the index over it:
    :func:`named_by_index`) and ``publish.json`` of the build's evidence says what was pushed."""
    assert not move_aliases, "a line pushed by digest moves no alias: the index's publish does"
    assert line.line is not None
    ws = workspace_for(of, workspace)
    date = validate_date(date)
    try:
        lint_or_fail(line)
    except BuildFailed as err:
        raise BuildFailed(f"{err.message}\nNothing was published.", fix=f"{err.fix}, rebuild, then publish",
                          file=err.file, line=err.line, col=err.col, exit_code=err.exit_code) from None  # fmt: skip
    target, repository, scheme, _, _ = destination(of, registry, date, target)
    options = options or PublishOptions()
    compression = options.compression or of.model.tags.compression or "gzip"
    codec(compression, options.level)
    options = replace(options, layer_cache=ws.cache("layers"), compression=compression)
    engine = engine or ws.engine
    child, evidence_dir, extra, attacher, _held = _push_by_digest(
        of, line, target, date, repository, scheme, options, engine, None, False
    )
    final = replace(child, scan=attacher.scan)
    client = RegistryClient(repository, policy=options.policy or RetryPolicy())
    attacher.finish(named_by_index(final, client, scheme, date, line.line.oci))
    _attach_sbom(evidence_dir, repository, options, final)
    write_evidence(evidence_dir, {**extra, **final.evidence()})
    return final


def named_by_index(
    pushed: PublishResult, client: RegistryClient, scheme: TagScheme, date: str, platform: str
) -> PublishResult:
    """What the record of a line pushed by digest describes: ``pushed`` (no tag), or, when a tag of ``date`` already
    holds the index listing it for ``platform`` (a shard re-run after the merge), ``pushed`` under that tag — the
    newest record is the one ``verify`` reads, and it names the tag the merge's record named."""
    try:
        tag = platforms.listing_tag(client, scheme, date, pushed.digest, platform)
    except RegistryError as exc:
        raise BuildFailed(f"{pushed.repository}@{pushed.digest} is pushed, but the tags of {date} cannot be read: {exc}",
                          fix="check the registry, then re-run the same shard") from None  # fmt: skip
    return replace(pushed, tag=tag) if tag else pushed


def _pushed_manifest(result: PublishResult) -> tuple[int, str]:
    """(byte size, media type) of the image manifest a platform's push wrote by digest (its push log says)."""
    for event in reversed(result.push_log):
        if event.get("event") == "pushed-by-digest":
            return int(event["size"]), str(event["media_type"])
    raise BuildFailed(f"the push of {result.digest} recorded no manifest")
