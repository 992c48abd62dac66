"""Kernel toolchains of a mirror: the ``toolchain-<kernel>`` stage, built once with network, as an image archive.

A toolchain step (``kernels.<k>.toolchain.run``: protoc, rustup, ``cargo fetch``) is no package: it installs with
network. :func:`mirror_toolchains` builds the stage online from the stack's own Dockerfile (as ``build`` renders
it), saves it as ``toolchains/<kernel>.tar`` (the engine keeps no tag of it) and records in ``mirror.json`` the image id and what the stage was
built from (the stack's fingerprint, the base image, each pip phase's key, the system layers, the step's run
line, environment and PATH, the sha256 of each file it ``uses``, the templates). An offline build whose inputs
give the same key loads the archive (:func:`load`) and its Dockerfile starts the stage ``FROM`` that image
instead of running the step (:func:`apply`); other inputs are refused naming the kernel's key. The image's
inputs fingerprint is the online build's: the templates and the stack are the same, only the rendered stage is.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from stackforge import progress
from stackforge.builder.mirror import manifest
from stackforge.builder.plan import resolve
from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.render import images_dir, templates_digest
from stackforge.builder.plan.secrets import host_inputs
from stackforge.clients import credentials
from stackforge.clients.engine import Engine, save_image
from stackforge.digests import tree_digest
from stackforge.errors import UserError
from stackforge.fslock import file_sha256
from stackforge.stack.load import LoadedStack, fingerprint

DIR = "toolchains"
REPOSITORY = "stackforge-mirror/toolchain"


def built_from(loaded: LoadedStack, plan, kernel, context_dir: Path, base_id: str) -> dict:
    """What the ``toolchain-<kernel>`` stage is built from (the stages before it and its own step)."""
    target = resolve.Target.of(loaded.model)
    tc = kernel.toolchain
    return {
        "stage": f"toolchain-{kernel.name}",
        "stack_fingerprint": fingerprint(loaded.model),
        "base": base_id,
        "phases": {ph.name: manifest.phase_key(ph, context_dir, target) for ph in plan.phases},
        "system": [hashlib.sha256(st.spec.encode()).hexdigest() for st in plan.system],
        "run": tc.run,
        "env": tc.env,
        "path": tc.path_prefix,
        "uses": {u: tree_digest(context_dir / "src" / kernel.upstream / u) for u in tc.uses},
        "templates": templates_digest(images_dir(loaded.root)),
    }


def _key(record: dict) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def mirror_toolchains(
    loaded: LoadedStack, prepared, to: Path, data: dict, ws, network: str | None, base_id: str
) -> None:
    """Build (or keep) the toolchain stage of every selected kernel that has one, and save it in the mirror."""
    ctx = prepared.ctx
    engine: Engine = ws.engine
    kept: dict = {}
    for k in ctx.plan.kernels:
        if k.toolchain is None:
            continue
        record = built_from(loaded, ctx.plan, k, ctx.context_dir, base_id)
        want = _key(record)
        rel = f"{DIR}/{k.name}.tar"
        have = data.get("toolchains", {}).get(k.name)
        part = manifest.part(data, rel)
        if have and have["key"] == want and part and (to / rel).is_file():
            kept[k.name] = have
            continue
        # A name of this process alone: two mirrors on one engine never tag or remove each other's stage.
        scratch = f"{REPOSITORY}:{loaded.name}-{k.name}-building-{os.getpid()}-{os.urandom(3).hex()}"
        with credentials.private_dir("stackforge-secrets-") as secrets_dir:
            secrets, contexts = host_inputs(loaded, secrets_dir, engine.supports_named_contexts(), ws)
            with progress.step(f"build the toolchain stage of kernel {k.name} (toolchain-{k.name}) with network"):
                result = engine.build(
                    ctx.context_dir,
                    ctx.dockerfile,
                    target=f"toolchain-{k.name}",
                    tags=[scratch],
                    build_args=prepared.build_args,
                    secrets=secrets,
                    contexts=contexts,
                    load=True,
                    on_line=progress.note if os.environ.get("STACKFORGE_MIRROR_LOG") else None,
                    extra_args=[f"--network={network}"] if network else [],
                )
        if result.returncode != 0:
            tail = "\n".join(result.log.strip().splitlines()[-15:])
            raise UserError(
                f"kernels.{k.name}.toolchain: the mirror could not build its toolchain stage:\n{tail}",
                fix="check the toolchain's endpoints (stackforge doctor) and the mirror's --network",
            )
        image_id = engine.image_id(scratch)
        assert image_id is not None
        ref = f"{REPOSITORY}:{loaded.name}-{k.name}-{image_id.split(':')[-1][:12]}"[: len(REPOSITORY) + 129]
        engine.cli("tag", scratch, ref, timeout=60, check=True)
        engine.remove_image(scratch)
        out = to / rel
        try:
            save_image(engine, ref, out, f"the toolchain stage of kernel {k.name} ({image_id})")
        finally:
            engine.remove_image(ref)  # the archive holds it; an offline build loads it from there
        manifest.add_part(
            data,
            {
                "kind": "toolchain",
                "path": rel,
                "kernel": k.name,
                "image": ref,
                "id": image_id,
                "sha256": file_sha256(out),
                "size": out.stat().st_size,
                "source": f"stage toolchain-{k.name}, built by stackforge mirror",
            },
        )
        kept[k.name] = {"key": want, "image": ref, "id": image_id, "built_from": record}
    data["toolchains"] = kept


def _record(loaded: LoadedStack, data: dict, kernel: str, fix: str) -> dict:
    rec = data.get("toolchains", {}).get(kernel)
    if rec is None:
        raise UserError(
            f"kernels.{kernel}.toolchain: the mirror holds no toolchain stage of this kernel", file="--mirror", fix=fix
        )
    return rec


def apply(loaded: LoadedStack, plan, data: dict, staging: Path, fix: str) -> None:
    """Each toolchain stage from the mirror's image, when the mirror built it from the same inputs."""
    base = manifest.part(data, "base/image.tar")
    for k in plan.kernels:
        if k.toolchain is None:
            continue
        rec = _record(loaded, data, k.name, fix)
        now = built_from(loaded, plan, k, staging, base["id"] if base else "")
        if rec["key"] != _key(now):
            changed = sorted(key for key in now if now[key] != rec.get("built_from", {}).get(key))
            raise UserError(
                f"kernels.{k.name}.toolchain: the mirror's toolchain stage was built from other inputs "
                f"(changed: {', '.join(changed)})",
                file="--mirror",
                fix=fix,
            )
        k.toolchain.image = rec["image"]


def load(loaded: LoadedStack, root: Path, data: dict, engine: Engine, fix: str) -> None:
    """The toolchain images the build needs, loaded from the mirror's archives when the engine lacks them."""

    for k in make_plan(loaded).kernels:
        if k.toolchain is None:
            continue
        rec = _record(loaded, data, k.name, fix)
        if engine.image_id(rec["image"]) == rec["id"]:
            continue
        path = manifest.checked(root, manifest.part(data, f"{DIR}/{k.name}.tar"), f"{DIR}/{k.name}.tar")
        with progress.step(f"load the toolchain stage of kernel {k.name} from the mirror"):
            engine.cli("load", "--input", str(path), timeout=3600, check=True)
        if engine.image_id(rec["image"]) != rec["id"]:
            raise UserError(
                f"kernels.{k.name}.toolchain: {rec['image']} loaded from the mirror is not {rec['id']}",
                file="--mirror",
                fix="copy the mirror again",
            )
