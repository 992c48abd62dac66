"""The installed inventory of a built image (written in the image by images/gate/inventory.py): into the
evidence after a build, and compared between two builds or images (`stackforge diff --inventory A B`)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from stackforge import safeio
from stackforge.builder.plan.render import images_dir
from stackforge.builder.plan.requirements import MANIFEST
from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from stackforge.fslock import atomic_write

IMAGE_PATH = "/stackforge/inventory.json"
#: an image's inventory is tens of KiB
MAX_BYTES = 16 << 20

Str = Annotated[str, StringConstraints(strict=True, max_length=4096)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Dist(_Model):
    name: Str
    version: Str
    index: Str | None = None
    phase: Str | None = None
    url: Str | None = None
    sha256: Str | None = None


class Phase(_Model):
    phase: Str
    key: Str | None = None
    index: Str | None = None
    installed: list[Str] = []
    preserve: list[Str] = []


class Inventory(_Model):
    """``inventory.json`` as images/gate/inventory.py writes it: every installed distribution, the pip phases."""

    dists: list[Dist]
    phases: list[Phase] = []
    #: ``uname -m`` where the inventory was taken: the machine of the image's platform (absent in older images)
    machine: str | None = Field(None, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")


def parse(data: bytes | str, *, source: str | Path) -> dict[str, Any]:
    """An inventory from outside the process (an image, a file), bounded and typed, as plain data; a wrong
    shape is one error naming ``source`` and the field."""
    model = safeio.parse_model(Inventory, data, source=source, what="inventory", limit=MAX_BYTES)
    return model.model_dump()


def from_image(engine, ref: str) -> dict | None:
    """The image's inventory (one container run), None when the image has none."""
    proc = engine.cli("run", "--rm", "--network=none", "--entrypoint", "cat", ref, IMAGE_PATH, timeout=300)
    if proc.returncode != 0:
        return None
    return parse(proc.stdout, source=f"{ref}:{IMAGE_PATH}")


def write_evidence(engine, ref: str, context_dir: Path, evidence: Path, data: dict | None = None) -> None:
    """evidence/inventory.json and preserve.txt from the image (``data`` when already read from it);
    requirements.json (what each requirement phase read and dropped) from the build context."""
    data = data if data is not None else from_image(engine, ref)
    if data is not None:
        atomic_write(evidence / "inventory.json", json.dumps(data, indent=2) + "\n")
        lines = [
            line
            for phase in data.get("phases", [])
            for line in [f"# after phase {phase['phase']} ({phase.get('key')})", *phase.get("preserve", [])]
        ]
        atomic_write(evidence / "preserve.txt", "\n".join(lines) + "\n")
    manifest = context_dir / MANIFEST
    if manifest.is_file():
        shutil.copyfile(manifest, evidence / "requirements.json")


def load(spec: str, engine=None) -> dict:
    """An inventory from an evidence directory (a build's, or the evidence root: its ``latest``), a build
    directory, an inventory.json file, or a local image reference."""
    path = Path(spec)
    if os.path.lexists(path) and not path.is_dir():  # a file named: read as it is (a FIFO or a link refused)
        return parse(safeio.read_bytes(path, limit=MAX_BYTES, what="inventory", follow=False), source=path)
    for candidate in (
        path / "inventory.json",
        path / "latest" / "inventory.json",
        path / "evidence" / "latest" / "inventory.json",
        path / "evidence" / "inventory.json",
    ):
        if os.path.lexists(candidate):
            return parse(safeio.read_bytes(candidate, limit=MAX_BYTES, what="inventory"), source=candidate)
    if path.exists():
        raise UserError(f"{spec}: no inventory.json here", fix="pass a build's evidence directory or an image")
    if engine is None:
        engine = Engine()
    if not engine.image_exists(spec):
        raise UserError(
            f"{spec}: neither an evidence directory nor a local image",
            fix="pass build/<stack>/evidence, an inventory.json, or an image in the local engine",
        )
    data = from_image(engine, spec)
    return data if data is not None else taken_from(engine, spec)


def taken_from(engine, ref: str) -> dict:
    """The inventory of an image stackforge did not build (e.g. one built from the fork's Dockerfile): the
    same in-image script, run over what is installed; without pip's records no row names its index."""

    script = images_dir() / "gate" / "inventory.py"
    probe = (
        'py="$(command -v python3 || command -v python)" && "$py" /stackforge-inventory/inventory.py '
        "/nonexistent /tmp/stackforge-inventory.json >/dev/null && cat /tmp/stackforge-inventory.json"
    )
    proc = engine.cli(
        "run",
        "--rm",
        "--network=none",
        "-v",
        f"{script.parent}:/stackforge-inventory:ro",
        "--entrypoint",
        "sh",
        ref,
        "-c",
        probe,
        timeout=300,
    )
    if proc.returncode != 0:
        raise UserError(
            f"{ref}: could not list its installed distributions: "
            + safeio.for_terminal((proc.stderr or proc.stdout or "").strip()[-2000:], lines=False),
            fix="the image needs a Python with importlib.metadata (3.8 or newer) on PATH",
        )
    return parse(proc.stdout, source=f"the inventory script's output in {ref}")


@dataclass
class InventoryDiff:
    added: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)  # {name, before: {...}, after: {...}}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _key(row: dict) -> str:

    return re.sub(r"[-_.]+", "-", row["name"]).lower()


def _facts(row: dict) -> dict:
    return {k: row.get(k) for k in ("version", "index", "sha256")}


def diff(old: dict, new: dict) -> InventoryDiff:
    """Dists added, removed, and changed (version, index or archive hash)."""
    a = {_key(r): r for r in old.get("dists", [])}
    b = {_key(r): r for r in new.get("dists", [])}
    out = InventoryDiff()
    for k in sorted(a.keys() | b.keys()):
        if k not in a:
            out.added.append({"name": b[k]["name"], **_facts(b[k])})
        elif k not in b:
            out.removed.append({"name": a[k]["name"], **_facts(a[k])})
        elif _facts(a[k]) != _facts(b[k]):
            out.changed.append({"name": b[k]["name"], "before": _facts(a[k]), "after": _facts(b[k])})
    return out


def to_text(d: InventoryDiff) -> str:
    def show(f: dict) -> str:
        sha = f" sha256:{f['sha256'][:12]}" if f.get("sha256") else ""
        return f"{f['version']} ({f['index'] or 'no index'}{sha})"

    lines = [f"+ {r['name']} {show(r)}" for r in d.added]
    lines += [f"- {r['name']} {show(r)}" for r in d.removed]
    lines += [f"~ {r['name']} {show(r['before'])} -> {show(r['after'])}" for r in d.changed]
    lines.append(f"{len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed")
    return "\n".join(safeio.for_terminal(line, lines=False) for line in lines) + "\n"  # names from the images
