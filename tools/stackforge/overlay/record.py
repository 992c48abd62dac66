"""The publish record of an overlay image, and what ``stackforge verify REF`` checks of an overlay with no checkout.

An overlay image carries its definition: ``/stackforge/overlay/<name>/`` holds ``overlay.yaml`` as built and
``manifest.json`` (every file the range changed, with its hash, and the overlay's files with hash and mode); the
base's ``/stackforge/stack/`` and labels are inherited. Its record (the stack record's keys, the stack part read
from the image: the base's stack files, pins and fingerprint) adds ``overlay``: the name, the declaration's
fingerprint, ``overlay.yaml`` (sha256 and text), the base (reference, image id, registry digest or the stack and
target it was built from), each range's hash and changed-files digest, and the files digest.

:func:`check_ref` compares every ``org.stackforge.overlay*`` label with the record, recomputes the fingerprint and
files digest from the embedded ``overlay.yaml`` and each changed-files digest from ``manifest.json``, checks the
base the labels name (a registry base: the registry holds that digest and the image's layers start with its
layers; a stack base: the image carries that stack; its image id compared when the engine has it) and re-hashes
the range's files and the overlay's files inside the image with a read-only root. A range's own hash (over its
patches, which the image does not hold) is checked against the record only, and the line says so.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge import safeio
from stackforge.builder.context import embed
from stackforge.builder.context.embed import load_embedded
from stackforge.builder.plan.plan import LABEL_NS
from stackforge.builder.run.verify import Verification
from stackforge.clients.engine import image_files
from stackforge.clients.registry import RegistryClient, RegistryError, split_ref
from stackforge.errors import UserError, printable
from stackforge.overlay import range as ranges
from stackforge.overlay.build import NS, files_digest, fingerprint, layers_extend
from stackforge.overlay.load import OVERLAY_FILE, LoadedOverlay
from stackforge.overlay.model import OVERLAY_NAME, Overlay
from stackforge.overlay.verify import recheck_in_image
from stackforge.publish import record as records
from stackforge.publish.record_schema import GateResults, OverlayPart, PublishRecord
from stackforge.stack.load import StackInvalid, load_model

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine
    from stackforge.publish.publisher import PublishResult

MANIFEST = "manifest.json"
LABEL_STACK = f"{LABEL_NS}.stack"
FINGERPRINT = f"{LABEL_NS}.fingerprint"
PIN = f"{LABEL_NS}.pin."


def image_dir(name: str) -> str:
    return f"/stackforge/overlay/{name}"


def make(
    target: str, evidence_dir: Path, published: PublishResult, labels: dict[str, str], engine: Engine, local_ref: str
) -> PublishRecord:
    """The record of an overlay publish: the stack record's keys (the stack part as the image carries it) and
    ``overlay``."""

    name = labels[NS]
    stack_files = image_files(engine, local_ref, embed.IMAGE_DIR) if embed.LABEL in labels else {}
    options: dict[str, Any] = {}
    if stack_files and labels.get(LABEL_STACK):
        with tempfile.TemporaryDirectory(prefix="stackforge-record-") as tmp:
            loaded = load_embedded(stack_files, labels[LABEL_STACK], Path(tmp))
            options = {n: o.value for n, o in loaded.model.options.items()}
    definition = image_files(engine, local_ref, image_dir(name)).get(OVERLAY_FILE, b"")
    inputs_file = evidence_dir / "inputs.json"  # the gated build's inputs (an ungated publish may have none)
    inputs = safeio.read_json(inputs_file, what="build inputs", limit=records.EVIDENCE_LIMIT) if inputs_file.exists() else {}  # fmt: skip
    prefix = f"{NS}."
    return PublishRecord(
        **records.head(labels.get(LABEL_STACK, ""), target, published),
        stack_files=records.stack_files(stack_files),
        overrides=safeio.parse_json(
            stack_files[embed.OVERRIDES], source=f"{embed.IMAGE_DIR}/{embed.OVERRIDES}", what="overrides"
        )
        if embed.OVERRIDES in stack_files
        else [],
        pins={k[len(PIN) :]: v for k, v in labels.items() if k.startswith(PIN)},
        options=options,
        fingerprint=labels.get(FINGERPRINT, ""),
        inputs_fingerprint=labels.get(f"{LABEL_NS}.inputs"),
        labels=dict(labels),
        gate=GateResults(gate=records._lines(evidence_dir / "gate.txt"), abi=[], readonly=[]),
        smoke=records.smoke_results(evidence_dir),
        tests=records.test_results(evidence_dir),
        build_id=evidence_dir.name,
        overlay=OverlayPart(
            name=name,
            fingerprint=labels.get(f"{NS}.fingerprint", ""),
            definition=records.file_entry(definition),
            base=inputs.get("base")
            or {
                "identity": labels.get(f"{NS}.base"),
                "image_id": labels.get(f"{NS}.base.id"),
                "ref": labels.get(f"{NS}.base.ref"),
            },
            ranges={k[len(prefix) + 6 :]: v for k, v in labels.items() if k.startswith(f"{prefix}range.")},
            changed={k[len(prefix) + 8 :]: v for k, v in labels.items() if k.startswith(f"{prefix}changed.")},
            files=labels.get(f"{NS}.files", ""),
        ),
    )


def expected_labels(overlay: OverlayPart) -> dict[str, str]:
    """The ``org.stackforge.overlay*`` labels the record's ``overlay`` says the image carries."""
    base = overlay.base
    out: dict[str, Any] = {
        NS: overlay.name,
        f"{NS}.fingerprint": overlay.fingerprint,
        f"{NS}.files": overlay.files,
        f"{NS}.base": base.get("identity"),
        f"{NS}.base.id": base.get("image_id"),
        f"{NS}.base.ref": base.get("ref"),
    }
    for kind, values in (("range", overlay.ranges), ("changed", overlay.changed)):
        for upstream, value in values.items():
            out[f"{NS}.{kind}.{upstream}"] = value
    return {k: str(v) if v is not None else "" for k, v in out.items()}


def _definition(text: bytes, name: str) -> LoadedOverlay:
    """The embedded ``overlay.yaml`` parsed and validated as an overlay (no files needed: the hashes it declares
    are what the fingerprint and the files digest cover)."""
    with tempfile.TemporaryDirectory(prefix="stackforge-overlay-") as tmp:
        path = Path(tmp) / OVERLAY_FILE
        path.write_bytes(text)
        display = f"{image_dir(name)}/{OVERLAY_FILE}"
        model, values, keys = load_model(Overlay, path, display, "an overlay", "overlays/README.md")
        return LoadedOverlay(name, Path(tmp), display, model, values, keys)


def _diff_ids(client: RegistryClient, manifest: dict[str, Any]) -> list[str] | None:
    config = manifest.get("config") if isinstance(manifest, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
        return None
    doc = client.config_of(manifest)
    rootfs = doc.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    return [str(d) for d in diff_ids] if isinstance(diff_ids, list) else []


def _check_registry_base(v: Verification, ref: str, client: RegistryClient, manifest: dict[str, Any]) -> None:
    repo, digest = split_ref(ref)
    base_client = RegistryClient(repo, policy=client.policy)
    try:
        got = base_client.get_manifest(digest)
        if got is None or got.digest != digest:
            v.add(False, f"overlay base {ref}: the registry " + ("holds no such image" if got is None else
                  f"served bytes with digest {got.digest}"))  # fmt: skip
            return
        v.add(True, f"overlay base {ref} is in the registry")
        base_ids, ids = _diff_ids(base_client, got.json()), _diff_ids(client, manifest)
    except (RegistryError, UserError, ValueError) as exc:
        v.add(False, f"overlay base {ref}: {getattr(exc, 'message', exc)}")
        return
    if not base_ids or ids is None:
        v.lines.append(f"note    overlay base {ref} is not a single image manifest: layers not compared")
        return
    v.add(ids[: len(base_ids)] == base_ids,
          f"overlay layers start with the {len(base_ids)} layers of the base {ref} (config diff_ids, from the registry)")  # fmt: skip


def check_ref(
    v: Verification,
    rec: PublishRecord,
    labels: dict[str, str],
    engine: Engine,
    pinned: str,
    client: RegistryClient,
    manifest: dict[str, Any],
) -> None:
    """Add the overlay lines of ``verify REF`` to ``v`` (see the module)."""

    overlay = rec.overlay
    name = labels.get(NS)
    if overlay is None or name is None:
        v.add(False, f"overlay the image's label {NS}={name or 'missing'} but the record "
              + ("describes no overlay" if overlay is None else f"describes overlay {overlay.name}")
              + ": the record does not describe this image; refused")  # fmt: skip
        return
    before = v.failed
    want = expected_labels(overlay)
    have = {k: val for k, val in labels.items() if k == NS or k.startswith(f"{NS}.")}
    for key in sorted(set(want) | set(have)):
        short = "name" if key == NS else key[len(NS) + 1 :]
        v.add(have.get(key) == want.get(key), f"overlay {short} label={have.get(key) or 'missing'} record={want.get(key) or 'missing'}")  # fmt: skip
    if not OVERLAY_NAME.match(name) or v.failed > before:
        v.add(False, "overlay the labels disagree with the record: the image is not the overlay the record describes; refused")  # fmt: skip
        return
    files = image_files(engine, pinned, image_dir(name))
    text = files.get(OVERLAY_FILE)
    defined = overlay.definition.sha256
    v.add(text is not None and embed.digest(text) == defined,
          f"overlay {image_dir(name)}/{OVERLAY_FILE} sha256 image={embed.digest(text) if text is not None else 'missing'} record={defined}")  # fmt: skip
    if text is None:
        return
    try:
        ov = _definition(text, name)
    except (UserError, StackInvalid) as err:
        v.add(False, f"overlay {image_dir(name)}/{OVERLAY_FILE} is not a valid overlay: {getattr(err, 'message', err)}")
        return
    v.add(fingerprint(ov) == labels.get(f"{NS}.fingerprint"),
          f"overlay declaration of the embedded {OVERLAY_FILE}={fingerprint(ov)} label={labels.get(f'{NS}.fingerprint')}")  # fmt: skip
    v.add(files_digest(ov) == labels.get(f"{NS}.files"),
          f"overlay files of the embedded {OVERLAY_FILE}={files_digest(ov)} label={labels.get(f'{NS}.files')}")  # fmt: skip
    try:
        changed = safeio.parse_json(files.get(MANIFEST, b"{}"), source=f"{image_dir(name)}/{MANIFEST}").get("files", [])
        items = [ranges.Changed(**item) for item in changed]
    except safeio.Malformed as exc:
        v.add(False, f"overlay {image_dir(name)}/{MANIFEST} is unreadable: {exc.message}")
        items = []
    except (ValueError, TypeError, AttributeError) as exc:
        v.add(False, f"overlay {image_dir(name)}/{MANIFEST} is unreadable: {printable(exc)[:200]}")
        items = []
    for upstream in sorted(ov.model.patches):
        digest = ranges.changed_digest([c for c in items if c.upstream == upstream])
        label = labels.get(f"{NS}.changed.{upstream}")
        v.add(digest == label, f"overlay changed.{upstream} of the embedded {MANIFEST}={digest} label={label}")
        v.lines.append(f"note    overlay range.{upstream} (a hash over the range's patches, which the image does not "
                       "hold) checked against the record only; `stackforge verify IMAGE` in a checkout re-hashes it")  # fmt: skip
    base = ov.model.base
    if base.image is not None:
        v.add(labels.get(f"{NS}.base") == base.digest,
              f"overlay base label={labels.get(f'{NS}.base')} embedded {OVERLAY_FILE}={base.digest}")  # fmt: skip
        _check_registry_base(v, base.image, client, manifest)
    else:
        v.add(labels.get(LABEL_STACK) == base.stack,
              f"overlay base stack={labels.get(LABEL_STACK, 'missing')} embedded {OVERLAY_FILE}={base.stack}/{base.target}")  # fmt: skip
        base_id = labels.get(f"{NS}.base.id")
        if base_id and engine.image_exists(base_id):
            v.add(layers_extend(engine, base_id, pinned), f"overlay layers start with the base image {base_id}")
        else:
            v.lines.append(f"note    overlay base image {base_id or '(unlabelled)'} (built from stack {base.stack}) is "
                           "not in the local engine: layers not compared; its stack is checked below")  # fmt: skip
    recheck_in_image(v, engine, pinned, name)
