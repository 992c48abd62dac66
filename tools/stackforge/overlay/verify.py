"""`stackforge verify` of an overlay image: its labels against the overlay directory (declaration, range hash,
changed files, file hashes, base), then the range's files and the overlay's files re-hashed inside the image
with a read-only root."""

from __future__ import annotations

from pathlib import Path

from stackforge.builder.run.verify import Verification
from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from stackforge.overlay import range as ranges
from stackforge.overlay.build import NS, files_digest, fingerprint, layers_extend
from stackforge.overlay.load import check_files, load_overlay


def overlay_of(labels: dict[str, str]) -> str | None:
    return labels.get(NS)


def verify_overlay(v: Verification, root: Path, image: str, labels: dict[str, str], engine: Engine) -> None:
    """Add the overlay's lines to ``v`` (the stack's verification of the same image)."""
    name = labels[NS]
    ov = load_overlay(root, name, where=f"label {NS}")
    want = fingerprint(ov)
    have = labels.get(f"{NS}.fingerprint")
    v.add(have == want, f"overlay {name} declaration label={have or 'missing'} overlay.yaml={want}")
    for upstream in ov.model.patches:
        want = ranges.range_hash(ov, upstream)
        have = labels.get(f"{NS}.range.{upstream}")
        v.add(have == want, f"overlay range.{upstream} label={have or 'missing'} overlays/{name}={want}")
    try:
        check_files(ov)
        v.add(
            labels.get(f"{NS}.files") == files_digest(ov),
            f"overlay files label={labels.get(f'{NS}.files', 'missing')} overlays/{name}={files_digest(ov)}",
        )
    except UserError as err:
        v.add(False, f"overlay files: {err.message}")
    base = ov.model.base
    have = labels.get(f"{NS}.base")
    if base.image is not None:
        v.add(have == base.digest, f"overlay base label={have or 'missing'} overlay.yaml={base.digest}")
    else:
        v.add(
            labels.get(f"{LABEL_STACK}") == base.stack,
            f"overlay base stack={labels.get(LABEL_STACK, 'missing')} overlay.yaml={base.stack}/{base.target}",
        )
    base_id = labels.get(f"{NS}.base.id")
    if base_id and engine.image_exists(base_id):
        v.add(layers_extend(engine, base_id, image), f"overlay layers start with the base image {base_id}")
    else:
        v.lines.append(
            f"note    overlay base image {base_id or '(unlabelled)'} is not in the local engine: layers not compared"
        )
    recheck_in_image(v, engine, image, name)


def recheck_in_image(v: Verification, engine: Engine, image: str, name: str) -> None:
    """The range's files and the overlay's files re-hashed inside the image (``install.py --check``) with a
    read-only root and no network."""
    top = f"/stackforge/overlay/{name}"
    proc = engine.cli(
        "run",
        "--rm",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--network=none",
        "--entrypoint",
        "python",
        image,
        f"{top}/_bin/install.py",
        "--check",
        top,
        timeout=600,
    )
    v.lines.extend(f"  {line}" for line in (proc.stdout + proc.stderr).splitlines() if line.strip())
    v.add(proc.returncode == 0, "overlay range files and files re-hashed inside the image with a read-only root")


LABEL_STACK = NS.rsplit(".", 1)[0] + ".stack"
