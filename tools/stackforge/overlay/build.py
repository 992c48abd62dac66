"""Build an overlay image: the base (a stack's target through the normal build path, or a registry image pulled by
digest), then one stage on it that installs the layered range, the files and the entrypoint, gated and labelled.

The order is: load and check the overlay on the host (file hashes, the range's changed files) → resolve the base →
check the base carries the series the range continues → apply the range on the host → render
``images/overlay/Dockerfile.j2`` in the sandbox → ``docker buildx build`` (the install step and the checks are build
steps: a FAIL tags nothing) → the base's layers must be a prefix of the overlay's → evidence in
``build/<stack>/overlays/<name>/evidence/<build-id>/`` (``latest`` names the newest gated one).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import jinja2
from jinja2.sandbox import SecurityError

from stackforge import grammar, progress
from stackforge.builder.context.context import build_dir_for
from stackforge.builder.plan import render as dockerfile_render
from stackforge.builder.plan.plan import BASE_LAYERS_LABEL, EPOCH_LABEL, LABEL_NS
from stackforge.builder.records import evidence as evidence_dirs
from stackforge.builder.run.run import BuildOptions, default_target, failure_reason, recording_interrupts, target_ref
from stackforge.builder.run.run import build as build_stack
from stackforge.builder.sources.contextfiles import context_time, normalize_tree
from stackforge.clients.containers import isolated
from stackforge.clients.engine import Engine, layers_of
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import BuildFailed, UserError
from stackforge.fslock import atomic_write, stack_lock
from stackforge.overlay import range as ranges
from stackforge.overlay.load import OVERLAY_FILE, LoadedOverlay, check_files
from stackforge.publish.stack import check_gated
from stackforge.stack import tags
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack
from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.yamlsrc import Pos

NS = f"{LABEL_NS}.overlay"
TEMPLATE = "overlay/Dockerfile.j2"


@dataclass
class BaseImage:
    """The image the overlay builds FROM: its reference, image id and registry digest (None for a local build)."""

    ref: str
    image_id: str
    digest: str | None
    stack: str | None = None
    target: str | None = None
    layers: int = 0  # how many layers it has: the overlay's publish leaves them as they are

    @property
    def identity(self) -> str:
        """What ``org.stackforge.overlay.base`` records: the pinned digest of a registry base, else the image id."""
        return self.digest or self.image_id


@dataclass
class OverlayOutcome:
    stack: str
    target: str
    overlay: str
    tag: str
    image_id: str | None
    base: dict[str, Any]
    evidence: Path
    gate: list[str] = field(default_factory=list)
    duration_s: float = 0.0


@dataclass(frozen=True)
class _At:
    """A stack model with the overlay's positions, so the stack's template renderer names overlay.yaml."""

    model: Any
    ov: LoadedOverlay

    def position(self, path: tuple) -> Pos:
        return self.ov.pos(path)


def overlay_build_dir(loaded: ResolvedStack, ov: LoadedOverlay, out: Path | None = None) -> Path:
    """``build/<stack>/overlays/<name>/`` (or under ``--out``): the overlay's context, Dockerfile and evidence."""
    return build_dir_for(loaded, out) / "overlays" / ov.name


def check_stack(loaded: ResolvedStack, ov: LoadedOverlay, target: str | None) -> str:
    """The stack and target the overlay is built for; returns the target (the base's, or ``overlay`` for an
    image base). A stack or target other than the overlay's base is an error naming ``base``."""
    base = ov.model.base
    if base.stack is not None:
        if base.stack != loaded.name:
            raise ov.error(
                f"base.stack: overlay {ov.name} layers on stack {base.stack}, not {loaded.name}",
                ("base", "stack"),
                fix=f"run: stackforge build {base.stack} --overlay {ov.name}",
            )
        assert base.target is not None
        if target is not None and target != base.target:
            raise ov.error(
                f"base.target: overlay {ov.name} layers on target {base.target}, not {target}",
                ("base", "target"),
                fix="leave out --target, or change base.target",
            )
        try:
            return default_target(loaded, base.target)
        except UserError as err:
            raise ov.error(f"base.target: {err.message}", ("base", "target"), fix=err.fix) from None
    if target is not None:
        raise UserError(
            f"--target: overlay {ov.name} layers on an image, not a target", file="--target", fix="leave out --target"
        )
    return "overlay"


def _render(stack: Stack, ov: LoadedOverlay, template: str, path: tuple, **extra: Any) -> str:
    shim = cast(LoadedStack, _At(stack, ov))
    return tags.render_template(shim, template, path, overlay={"name": ov.name}, **extra)


def local_ref(loaded: ResolvedStack, ov: LoadedOverlay) -> str:
    text = _render(loaded.model, ov, ov.model.tags.local, ("tags", "local"))
    return str(tags.checked_ref(cast(LoadedStack, _At(loaded.model, ov)), text, ("tags", "local")))


def publish_ref(loaded: ResolvedStack, ov: LoadedOverlay, registry: str, date: str, revision: int) -> tags.Ref:
    if not ov.model.tags.publish:
        raise ov.error(
            f"overlay {ov.name} declares no tags.publish template",
            ("tags",),
            fix="add tags.publish, e.g. 'vllm:…-{{ overlay.name }}-{{ date }}-r{{ revision }}'",
        )
    text = _render(loaded.model, ov, ov.model.tags.publish, ("tags", "publish"), date=date, revision=revision)
    return tags.checked_ref(
        cast(LoadedStack, _At(loaded.model, ov)), f"{tags.check_registry(registry)}/{text}", ("tags", "publish")
    )


def rendered_labels(loaded: ResolvedStack, ov: LoadedOverlay) -> dict[str, str]:
    return {k: _render(loaded.model, ov, v, ("labels", k)) for k, v in ov.model.labels.items()}


def fingerprint(ov: LoadedOverlay) -> str:
    """sha256 of the overlay's declaration (every value, the files' declared hashes included)."""
    blob = json.dumps(ov.model.model_dump(mode="json", by_alias=True), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def files_digest(ov: LoadedOverlay) -> str:
    """One digest over the files the overlay copies (dest, sha256, mode, in order)."""
    text = "".join(f"{f.dest} {f.sha256} {f.mode}\n" for _, f in ov.file_entries())
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def resolve_base(
    loaded: ResolvedStack,
    ov: LoadedOverlay,
    engine: Engine,
    opts: BuildOptions,
    *,
    reuse: bool,
    workspace: Workspace,
    echo: Callable[[str], None] | None,
) -> BaseImage:
    """Build the base target through the normal build path (or, with ``reuse``, take the image its last gated
    build made), or pull the pinned base image by digest; a digest that no longer resolves names ``base.image``."""
    base = ov.model.base
    if base.image is not None:
        if not engine.image_exists(base.image):
            with progress.step(f"pull base image {base.image}"):
                proc = engine.pull(base.image, timeout=1800)
            if proc.returncode != 0:
                detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise ov.error(
                    f"base.image: {base.image} does not resolve: the registry has no image with digest {base.digest} "
                    f"({detail[0][-300:]}); nothing was built",
                    ("base", "image"),
                    fix="pin a digest the registry holds (the publish evidence's `pinned:` line), or layer on "
                    "{stack, target}",
                )
        attrs = engine.image_attrs(base.image)
        return BaseImage(base.image, str(attrs.get("Id")), base.digest, layers=len(layers_of(attrs)))
    assert base.target is not None
    if reuse:
        ref = target_ref(loaded, base.target)
        image_id = engine.image_id(ref)
        if image_id is None:
            raise ov.error(
                f"base.target: no local image {ref}: the base was never built here",
                ("base", "target"),
                fix=f"build it: stackforge build {loaded.name} --target {base.target} (or drop --reuse-base)",
            )
        check_gated(build_dir_for(loaded, opts.out) / "evidence", loaded.name, base.target, image_id, ref)
    else:
        outcome = build_stack(loaded, replace(opts, target=base.target, load=True), engine, echo, workspace=workspace)
        ref, image_id = outcome.tag, str(outcome.image_id)
    return BaseImage(ref, image_id, None, loaded.name, base.target, len(engine.image_layers(image_id)))


def check_base_series(
    loaded: ResolvedStack, ov: LoadedOverlay, base_labels: dict[str, str], base: BaseImage, workspace: Workspace
) -> None:
    """A range continues the base's series: the base image must carry the stack's pin and series of each
    upstream the overlay layers a range on (its ``org.stackforge.upstream.*`` and ``series.*`` labels)."""
    for upstream in ov.model.patches:
        if upstream not in loaded.model.upstreams:
            raise ov.error(
                f"patches.{upstream}: stack {loaded.name} has no upstream {upstream!r}",
                ("patches", upstream),
                fix=f"name one of: {', '.join(loaded.model.upstreams)}",
            )
        stack_label = base_labels.get(f"{LABEL_NS}.stack")
        if stack_label != loaded.name:
            raise ov.error(
                f"base: the base image {base.ref} was built from stack {stack_label or '(none: not a stackforge image)'}"
                f", not {loaded.name}, so the range of {upstream} has no known series to continue",
                ("base",),
                fix=f"layer the range on a {loaded.name} image (base: {{stack: {loaded.name}, target: …}})",
            )
        pin = loaded.model.upstreams[upstream].pin
        have_pin = base_labels.get(f"{LABEL_NS}.upstream.{upstream}")
        want = ranges.base_series_hash(loaded, upstream, workspace)
        have = base_labels.get(f"{LABEL_NS}.series.{upstream}")
        if have_pin != pin or have != want:
            raise ov.error(
                f"patches.{upstream}: the base image {base.ref} carries {upstream} {have_pin} with series {have}, but "
                f"stack {loaded.name} pins {pin} with series {want}: the range would not continue the series the "
                "image holds",
                ("patches", upstream),
                fix=f"rebuild the base (stackforge build {loaded.name} --overlay {ov.name}), or pin the base image "
                "built from this series",
            )


def write_context(
    loaded: ResolvedStack,
    ov: LoadedOverlay,
    ctx: Path,
    images: Path,
    *,
    workspace: Workspace,
    base_epoch: int | None = None,
) -> tuple[dict, dict[str, list[ranges.Changed]]]:
    """The overlay's build context: ``overlay/`` (manifest, patched files, scripts, checks, overlay.yaml; it
    becomes /stackforge/overlay/<name>/) and ``files/`` (the declared files with their modes), each entry with
    the context's mode and time (``builder/sources/contextfiles.py``; ``base_epoch``: the base image's layer epoch)."""
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "overlay" / "range").mkdir(parents=True)
    changed: dict[str, list[ranges.Changed]] = {}
    for upstream in ov.model.patches:
        with progress.step(f"apply the {upstream} range of overlay {ov.name} on the host"):
            changed[upstream] = ranges.apply_range(loaded, ov, upstream, ctx / "overlay" / "range", workspace=workspace)
    data = ranges.manifest(ov, changed)
    data["extra"] = [{"dest": f.dest, "sha256": f.sha256, "mode": f.mode} for _, f in ov.file_entries()]
    atomic_write(ctx / "overlay" / "manifest.json", ranges.manifest_text(data))
    bin_dir = ctx / "overlay" / "_bin"
    bin_dir.mkdir()
    for src in (
        images / "overlay" / "install.py",
        images / "targets" / "checks.py",
        images / "gate" / "gate.py",
        images / "gate" / "localver.py",
    ):
        shutil.copyfile(src, bin_dir / src.name)
    checks = [c.model_dump() for c in ov.model.checks if _wanted(loaded.model, c.when)]
    atomic_write(ctx / "overlay" / "checks.json", json.dumps(checks, indent=2) + "\n")
    shutil.copyfile(ov.dir / OVERLAY_FILE, ctx / "overlay" / OVERLAY_FILE)
    (ctx / "files").mkdir()
    for at, f in ov.file_entries():
        key = "-".join(map(str, at))
        shutil.copyfile(ov.dir / f.src, ctx / "files" / key)
        os.chmod(ctx / "files" / key, int(f.mode, 8))
    normalize_tree(ctx, mtime=context_time(base_epoch), keep_modes=["files"])  # declared files keep their modes
    return data, changed


def _wanted(stack: Stack, when: dict[str, str]) -> bool:
    options = {n: o.value for n, o in stack.options.items()}
    return all(options.get(k) == v for k, v in when.items())


def render_dockerfile(ov: LoadedOverlay, view: dict, root: Path | None) -> str:
    """``images/overlay/Dockerfile.j2`` rendered in the sandbox (the stack template's filters)."""
    env = dockerfile_render._env(root)
    try:
        text = env.render_limited(env.get_template(TEMPLATE), {"o": view})
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(
            f"invalid overlay template: {exc.message}",
            file=f"images/{TEMPLATE}",
            line=exc.lineno,
            fix="fix the template's {{ … }} / {% … %} syntax",
        ) from None
    except (jinja2.TemplateError, SecurityError, ValueError, TypeError) as exc:
        raise UserError(
            f"cannot render images/{TEMPLATE} for overlay {ov.name}: {exc}",
            file=ov.display,
            fix="values must be single lines of printable text",
        ) from None
    lines = [ln.rstrip() for ln in text.split("\n")]
    return "\n".join(ln for i, ln in enumerate(lines) if ln or (i and lines[i - 1])).strip() + "\n"


def template_view(
    loaded: ResolvedStack,
    ov: LoadedOverlay,
    base: BaseImage,
    data: dict,
    labels: dict[str, str],
    run_network: bool = False,
) -> dict:
    reason = grammar.check_image_ref(base.ref)
    if reason:
        raise UserError(
            f"base image reference: {reason}",
            **ov.pos(("base",)).as_error_kwargs(),
            fix="the base's local tag comes from the stack's tags.local",
        )
    m = ov.model
    return {
        "name": ov.name,
        "display": ov.display,
        "fingerprint": fingerprint(ov),
        "base_ref": base.ref,
        "has_range": bool(data["files"]),
        "changed": len(data["files"]),
        "packages_text": ", ".join(data["packages"]),
        "files": [{"key": "-".join(map(str, at)), "dest": f.dest} for at, f in ov.file_entries()],
        "env": {k: v.default for k, v in m.env.items()},
        "checks": bool([c for c in m.checks if _wanted(loaded.model, c.when)]),
        "ports": list(m.ports.values()),
        "labels": labels,
        "entrypoint": [m.entrypoint.dest] if m.entrypoint is not None else None,
        "offline": "--network=none " if run_network else "",  # the engine takes RUN --network=none
    }


def overlay_labels(
    loaded: ResolvedStack,
    ov: LoadedOverlay,
    base: BaseImage,
    changed: dict[str, list[ranges.Changed]],
    rendered: dict[str, str] | None = None,
) -> dict[str, str]:
    """The overlay image's labels: its own (``rendered``, when the build rendered them already), then stackforge's."""
    out = {
        NS: ov.name,
        f"{NS}.base": base.identity,
        f"{NS}.base.id": base.image_id,
        f"{NS}.base.ref": base.ref,
        f"{NS}.fingerprint": fingerprint(ov),
        f"{NS}.files": files_digest(ov),
        # the base's layers are published as they are (a registry base's own blobs; a local base's, which the
        # overlay's verify compares with the base image): the publisher normalizes only the overlay's layers
        BASE_LAYERS_LABEL: str(base.layers),
    }
    for upstream, items in changed.items():
        out[f"{NS}.range.{upstream}"] = ranges.range_hash(ov, upstream)
        out[f"{NS}.changed.{upstream}"] = ranges.changed_digest(items)
    return {**(rendered_labels(loaded, ov) if rendered is None else rendered), **out}


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def read_records(engine: Engine, ref: str, name: str) -> dict[str, list[str]]:
    """The install and check records the build left in the image (one container run)."""
    top = f"/stackforge/overlay/{name}"
    script = "; ".join(
        f'if [ -f {top}/{n} ]; then echo "==> {n}"; cat {top}/{n}; fi' for n in ("install.txt", "checks.txt")
    )
    proc = engine.run(isolated(ref, "sh", "-c", script), timeout=300)
    out: dict[str, list[str]] = {}
    current = None
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        if line.startswith("==> "):
            current = out.setdefault(line[4:], [])
        elif current is not None and line.strip():
            current.append(line)
    return out


def layers_extend(engine: Engine, base_id: str, ref: str) -> bool:
    """Whether the image's layers start with every layer of the base (it was built FROM that base)."""
    base = engine.image_layers(base_id)
    mine = engine.image_layers(ref)
    return bool(base) and mine[: len(base)] == base


def build_overlay(
    loaded: ResolvedStack,
    ov: LoadedOverlay,
    opts: BuildOptions | None = None,
    engine: Engine | None = None,
    echo: Callable[[str], None] | None = None,
    *,
    reuse_base: bool = False,
    workspace: Workspace | None = None,
) -> OverlayOutcome:
    """Build the overlay ``ov`` on its base (see the module docstring); nothing is tagged on any failure."""
    opts = opts or BuildOptions()
    echo = echo or _stderr_line
    ws = workspace_for(loaded, workspace)
    started = time.monotonic()
    target = check_stack(loaded, ov, opts.target)
    # On the host, before anything is built: the files' hashes, the range's changed files, the tags.
    check_files(ov)
    for upstream in ov.model.patches:
        ranges.changed_paths(ov, upstream)
    ref = local_ref(loaded, ov)
    own_labels = rendered_labels(loaded, ov)  # the overlay's templates render (or refuse) before the base is built
    engine = engine or ws.engine
    info = engine.check()
    base = resolve_base(loaded, ov, engine, opts, reuse=reuse_base, workspace=ws, echo=echo)
    base_labels = engine.image_labels(base.ref)
    if ov.model.patches:
        check_base_series(loaded, ov, base_labels, base, ws)
    odir = overlay_build_dir(loaded, ov, opts.out)
    with stack_lock(odir, timeout=opts.lock_timeout):
        images = dockerfile_render.images_dir(loaded.root)
        epoch = str(base_labels.get(EPOCH_LABEL) or "")
        data, changed = write_context(
            loaded, ov, odir / "context", images, workspace=ws, base_epoch=int(epoch) if epoch.isdigit() else None
        )
        labels = overlay_labels(loaded, ov, base, changed, own_labels)
        dockerfile = odir / "Dockerfile"
        atomic_write(
            dockerfile,
            render_dockerfile(
                ov, template_view(loaded, ov, base, data, labels, engine.supports_run_network()), loaded.root
            ),
        )
        evidence_dirs.keep_builds(opts.keep_builds)
        evidence = evidence_dirs.new_build(odir / "evidence")
        atomic_write(evidence / "Dockerfile", dockerfile.read_bytes())
        atomic_write(evidence / "changed.json", ranges.manifest_text(data))
        base_record = asdict(base) | {"identity": base.identity}
        atomic_write(
            evidence / "inputs.json",
            json.dumps(
                {
                    "overlay": ov.name,
                    "stack": loaded.name,
                    "target": target,
                    "tag": ref,
                    "base": base_record,
                    "fingerprint": fingerprint(ov),
                    "labels": labels,
                    "changed": data,
                    "engine": asdict(info),
                    "time": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
                indent=2,
            )
            + "\n",
        )
        had = engine.image_id(ref)
        with recording_interrupts(engine, evidence, ref, had, started):
            with progress.step(f"build overlay {ov.name} as {ref} (log: {evidence / 'build.log'})"):
                result = engine.build(
                    odir / "context",
                    dockerfile,
                    tags=[ref],
                    load=True,
                    no_cache=opts.no_cache,
                    on_line=echo,
                    log_file=evidence / "build.log",
                    extra_args=[f"--network={opts.network}"] if opts.network else [],
                )
        reason = None
        if result.returncode != 0:
            reason = failure_reason(result.log)
        elif not layers_extend(engine, base.image_id, ref):
            reason = f"the built image's layers do not start with the base image {base.image_id}'s"
        if reason is not None:
            now = engine.image_id(ref)
            if now is not None and now != had:  # never leave a tag pointing at an unchecked image
                engine.remove_image(ref, force=True)
            atomic_write(
                evidence / "result.json",
                json.dumps({"ok": False, "reason": reason, "target": target, "build_id": evidence.name}, indent=2),
            )
            evidence_dirs.finish(evidence, ok=False, keep=opts.keep_builds)
            raise BuildFailed(
                f"{loaded.name} --overlay {ov.name}: {reason}\n  (no image was tagged; log: {evidence / 'build.log'})",
                fix="read the FAIL/ERROR lines above",
            )
        image_id = engine.image_id(ref)
        records = read_records(engine, ref, ov.name)
        gate = records.get("install.txt", []) + records.get("checks.txt", [])
        atomic_write(evidence / "gate.txt", "\n".join(gate) + "\n")
        outcome = OverlayOutcome(
            loaded.name,
            target,
            ov.name,
            ref,
            image_id,
            base_record,
            evidence,
            gate,
            round(time.monotonic() - started, 1),
        )
        atomic_write(
            evidence / "result.json",
            json.dumps(
                {"ok": True, **asdict(outcome), "evidence": str(evidence), "build_id": evidence.name},
                indent=2,
                default=str,
            ),
        )
        evidence_dirs.finish(evidence, ok=True, keep=opts.keep_builds)
    return outcome
