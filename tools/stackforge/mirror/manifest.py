"""The mirror's manifest (``mirror.json``), its layout and the static PEP 503 trees, shared by the writer and
the offline build."""

from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from stackforge.errors import UserError
from stackforge.fslock import atomic_write, file_sha256

if TYPE_CHECKING:
    from stackforge.build.plan import PipPhase
    from stackforge.build.resolve import Target

MANIFEST = "mirror.json"
FORMAT = 1
#: what the static tree's pages are named, so pip reads a directory of a file:// index as a page
PAGE = "index.html"
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}")


def empty(stack: str, fingerprint: str) -> dict:
    return {"format": FORMAT, "stack": stack, "fingerprint": fingerprint, "parts": [], "phases": {}}


def read(root: Path, *, required: bool = True) -> dict | None:
    """The manifest of the mirror at ``root`` (None when there is none and it is not ``required``)."""
    path = root / MANIFEST
    if not path.is_file():
        if not required:
            return None
        raise UserError(
            f"{root} is not a mirror: it has no {MANIFEST}",
            file="--mirror",
            fix="make one with: stackforge mirror STACK --to DIR (on a host with network)",
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} cannot be read: {exc}", file="--mirror", fix="make the mirror again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("parts"), list):
        raise UserError(
            f"{path} is not a stackforge mirror manifest (format {FORMAT})",
            file="--mirror",
            fix="make the mirror again with this version of stackforge",
        )
    return data


def write(root: Path, data: dict) -> None:
    data["parts"].sort(key=lambda p: (p["kind"], p["path"]))
    atomic_write(root / MANIFEST, json.dumps(data, indent=2, sort_keys=True) + "\n")


def digest(root: Path) -> str:
    """sha256 of the manifest's bytes: what the build's evidence names."""
    return "sha256:" + file_sha256(root / MANIFEST)


def part(data: dict, path: str) -> dict | None:
    return next((p for p in data["parts"] if p["path"] == path), None)


def add_part(data: dict, record: dict) -> None:
    data["parts"] = [p for p in data["parts"] if p["path"] != record["path"]] + [record]


def checked(root: Path, record: dict | None, rel: str) -> Path:
    """The mirror's file ``rel``, present and matching the sha256 its ``record`` holds (a UserError otherwise)."""
    path = root / rel
    if record is None or not path.is_file() or file_sha256(path) != record["sha256"]:
        raise UserError(
            f"{rel} in the mirror is missing or does not match its sha256 in {MANIFEST}",
            file="--mirror",
            fix="copy the mirror again",
        )
    return path


def index_dir(root: Path, index: str) -> Path:
    return root / "indexes" / index


def phase_key(phase: PipPhase, context_dir: Path, target: Target) -> str:
    """What one pip phase resolves: its index (by name), its flags, the target, and the bytes of its
    requirements and constraints as the build context holds them. The build looks its phases up by this key."""
    h = hashlib.sha256(
        json.dumps(
            {
                "index": phase.index,
                "no_deps": phase.no_deps,
                "require_hashes": phase.require_hashes,
                "target": target.describe(),
            },
            sort_keys=True,
        ).encode()
    )
    for rel in (phase.requirements, phase.constraints):
        h.update(b"\0")
        if rel:
            h.update((context_dir / rel).read_bytes())
    return "sha256:" + h.hexdigest()


def target_phase_key(view, target: Target) -> str:
    """What one target pip phase resolves (``make.PhaseView``): its index, flags, the target, and the bytes
    of its requirements (and the upstream's own constraints they name) and of the vendor constraints."""
    h = hashlib.sha256(
        json.dumps(
            {
                "index": view.index,
                "no_deps": view.no_deps,
                "only_binary": view.only_binary,
                "target": target.describe(),
            },
            sort_keys=True,
        ).encode()
    )
    h.update(b"\0" + view.original + b"\0" + Path(view.constraints).read_bytes())
    for line in Path(view.requirements).read_text().splitlines():
        if line.startswith("-c "):
            h.update(b"\0" + Path(line[3:].strip()).read_bytes())
    return "sha256:" + h.hexdigest()


def project_of(filename: str) -> str | None:
    """The canonical project name of a wheel or sdist file name (None for anything else)."""
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[0])
        if filename.endswith((".tar.gz", ".zip")):
            return str(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return None


def write_simple(index_root: Path, hashes: dict[str, str]) -> None:
    """``simple/`` over ``files/`` (PEP 503): the project list and one page per project, each link relative
    and carrying ``#sha256=`` (``hashes``: file name -> sha256)."""
    files = (
        sorted(p.name for p in (index_root / "files").iterdir() if p.is_file())
        if (index_root / "files").is_dir()
        else []
    )
    projects: dict[str, list[str]] = {}
    for name in files:
        project = project_of(name)
        if project is not None:
            projects.setdefault(canonicalize_name(project), []).append(name)
    simple = index_root / "simple"
    simple.mkdir(parents=True, exist_ok=True)
    head = '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0"></head><body>\n'
    atomic_write(
        simple / PAGE, head + "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects)) + "</body></html>\n"
    )
    for project, names in projects.items():
        (simple / project).mkdir(exist_ok=True)
        links = "".join(
            f'<a href="../../files/{html.escape(n)}#sha256={hashes.get(n) or file_sha256(index_root / "files" / n)}">'
            f"{html.escape(n)}</a>\n"
            for n in names
        )
        atomic_write(simple / project / PAGE, head + links + "</body></html>\n")
