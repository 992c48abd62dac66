"""The mirror's manifest (``mirror.json``), its layout and the static PEP 503 trees, shared by the writer and
the offline build."""

from __future__ import annotations

import hashlib
import html
import json
import os
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

from stackforge.builder.plan.requirements import VENDOR_PINS
from stackforge.errors import UserError, printable
from stackforge.fslock import atomic_write, file_sha256
from stackforge.grammar import bad_char

if TYPE_CHECKING:
    from stackforge.builder.plan.phases import PipPhase
    from stackforge.builder.plan.resolve import Target

MANIFEST = "mirror.json"
FORMAT = 1
#: what the static tree's pages are named, so pip reads a directory of a file:// index as a page
PAGE = "index.html"
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}")


def empty(stack: str, fingerprint: str) -> dict:
    return {"format": FORMAT, "stack": stack, "fingerprint": fingerprint, "parts": [], "phases": {}}


#: what makes the mirror again, or restores a copy of it
REMAKE = "copy the mirror again, or make it again: stackforge mirror STACK --to DIR (on a host with network)"
HEX64 = re.compile(r"[0-9a-f]{64}")
KINDS = ("git", "sdist", "file", "base", "deb", "apt-index", "toolchain")
#: the string fields a part of each kind must have (the build reads them)
REQUIRED = {"base": ("image", "id"), "toolchain": ("image", "id")}


def read(root: Path, *, required: bool = True) -> dict | None:
    """The manifest of the mirror at ``root`` (None when there is none and it is not ``required``), every field
    the build reads checked (:func:`validate`): a manifest of another shape is a UserError naming the field."""
    path = root / MANIFEST
    if not path.is_file():
        if not required:
            return None
        raise UserError(
            f"{root} is not a mirror: it has no {MANIFEST}",
            file="--mirror",
            fix="make one with: stackforge mirror STACK --to DIR (on a host with network)",
        )
    inside(root, MANIFEST)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(
            f"{printable(path)} cannot be read: {printable(exc)}", file="--mirror", fix="make the mirror again"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("parts"), list):
        raise UserError(
            f"{path} is not a stackforge mirror manifest (format {FORMAT})",
            file="--mirror",
            fix="make the mirror again with this version of stackforge",
        )
    validate(data, path)
    return data


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _relative(value: object) -> bool:
    """A path inside the mirror as the manifest writes it: relative, '/'-separated, no '.', '..' or empty part."""
    return (
        isinstance(value, str)
        and bool(value)
        and "\\" not in value
        and bad_char(value) is None
        and all(p not in ("", ".", "..") for p in value.split("/"))
    )


def _file_name(value: object) -> bool:
    """One path segment (apt's archive names hold '%3a' and the like, so no stricter grammar)."""
    return _relative(value) and "/" not in str(value)


def validate(data: dict, path: Path) -> None:
    """Every field of a manifest the build and ``mirror`` read has the type (and form) stackforge writes: a
    UserError naming ``path`` and the first field that does not, so no manifest can make them fail on a
    KeyError or reach a file outside the mirror."""

    def bad(field: str, value: object, want: str) -> UserError:
        shown = json.dumps(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return UserError(f"{field} is {shown}, not {want}", file=str(path), fix=REMAKE)

    for key in ("stack", "fingerprint"):
        if not isinstance(data.get(key), str):
            raise bad(key, data.get(key), "a string")
    for i, part in enumerate(data["parts"]):
        where = f"parts[{i}]"
        if not isinstance(part, dict):
            raise bad(where, part, "an object (kind, path, sha256, ...)")
        if part.get("kind") not in KINDS:
            raise bad(f"{where}.kind", part.get("kind"), "one of " + ", ".join(KINDS))
        if not _relative(part.get("path")):
            raise bad(f"{where}.path", part.get("path"), "a relative path inside the mirror (no '..')")
        if not isinstance(part.get("sha256"), str) or not HEX64.fullmatch(part["sha256"]):
            raise bad(f"{where}.sha256", part.get("sha256"), "a sha256 (64 lowercase hex digits)")
        if "size" in part and (not isinstance(part["size"], int) or isinstance(part["size"], bool)):
            raise bad(f"{where}.size", part["size"], "a number of bytes")
        for key in ("index", "image", "id", "kernel", "upstream"):
            if (key in part or key in REQUIRED.get(part["kind"], ())) and not isinstance(part.get(key), str):
                raise bad(f"{where}.{key}", part.get(key), "a string")
    phases = data.get("phases")
    if not isinstance(phases, dict):
        raise bad("phases", phases, "an object (phase name -> resolution)")
    for name, phase in phases.items():
        where = f"phases.{printable(name)}"
        if not isinstance(phase, dict):
            raise bad(where, phase, "an object (key, index, files)")
        if not isinstance(phase.get("key"), str):
            raise bad(f"{where}.key", phase.get("key"), "a string")
        if not (_is_str_list(phase.get("files")) and all(map(_file_name, phase["files"]))):
            raise bad(f"{where}.files", phase.get("files"), "a list of file names")
    if "apt" in data:
        rec = data["apt"]
        if not isinstance(rec, dict):
            raise bad("apt", rec, "an object (key, layers, files)")
        if not isinstance(rec.get("key"), str):
            raise bad("apt.key", rec.get("key"), "a string")
        if not (_is_str_list(rec.get("files")) and all(map(_file_name, rec["files"]))):
            raise bad("apt.files", rec.get("files"), "a list of file names")
    kernels = data.get("toolchains", {})
    if not isinstance(kernels, dict):
        raise bad("toolchains", kernels, "an object (kernel -> toolchain stage)")
    for name, rec in kernels.items():
        where = f"toolchains.{printable(name)}"
        if not isinstance(rec, dict):
            raise bad(where, rec, "an object (key, image, id, built_from)")
        for key in ("key", "image", "id"):
            if not isinstance(rec.get(key), str):
                raise bad(f"{where}.{key}", rec.get(key), "a string")
        if not isinstance(rec.get("built_from", {}), dict):
            raise bad(f"{where}.built_from", rec["built_from"], "an object")


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


def _link_fix(flag: str) -> str:
    again = REMAKE if flag == "--mirror" else "remove the link, or choose another --to directory"
    return again + "; a mirror holds its files, no link out of it"


def inside(root: Path, rel: str, flag: str = "--mirror") -> Path:
    """``root / rel``, refused when it resolves (through a symlink) outside the mirror (given by ``flag``)."""
    path = root / rel
    real, top = path.resolve(), root.resolve()
    if not real.is_relative_to(top):
        raise UserError(
            f"{printable(rel)} in the mirror resolves (through a symlink) to {printable(real)}, outside the mirror "
            f"{printable(top)}",
            file=flag,
            fix=_link_fix(flag),
        )
    return path


def inside_tree(root: Path, rel: str, flag: str = "--mirror") -> Path:
    """The directory ``root / rel``, refused when it or anything in it resolves outside the mirror, or when it
    holds a link to a directory (which a copy would follow)."""
    top = inside(root, rel, flag)
    for dirpath, dirnames, filenames in os.walk(top.resolve()):
        for name in dirnames + filenames:
            entry = Path(dirpath) / name
            if entry.is_symlink():
                here = str(entry.relative_to(root.resolve()))
                inside(root.resolve(), here, flag)
                if entry.is_dir():
                    raise UserError(
                        f"{printable(here)} in the mirror is a link to a directory", file=flag, fix=_link_fix(flag)
                    )
    return top


def checked(root: Path, record: dict | None, rel: str) -> Path:
    """The mirror's file ``rel``, inside the mirror, present and matching the sha256 its ``record`` holds (a
    UserError otherwise: a file of other bytes is reported as a sha256 mismatch, with both digests)."""
    path = inside(root, rel)
    if record is None or not path.is_file():
        raise UserError(
            f"{printable(rel)} in the mirror is missing or has no record in {MANIFEST}", file="--mirror", fix=REMAKE
        )
    found = file_sha256(path)
    if found != record["sha256"]:
        raise UserError(
            f"sha256 mismatch: {printable(rel)} in the mirror has sha256 {found}, but {MANIFEST} records "
            f"{record['sha256']}",
            file="--mirror",
            fix=REMAKE + " (the file was changed or damaged)",
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


BASE = "base/image.tar"


class PhaseView:
    """A target's pip phase as the mirror resolves it on the host: its requirements with the image paths of
    the context's files made host paths, and the constraints the image writes before it (every vendor pin, with
    the re-pins of the phases before it)."""

    def __init__(self, ph, original: bytes, requirements: Path, constraints: Path):
        self.original = original  # the requirements as the context holds them
        self.name, self.key, self.index, self.index_url = ph.key, ph.key, ph.index, ph.index_url
        self.no_deps, self.only_binary, self.require_hashes = ph.no_deps, ph.only_binary, False
        self.requirements, self.constraints = str(requirements), str(constraints)


def target_phase_view(plan, t, ph, context_dir: Path, tmp: Path) -> PhaseView:
    pins = json.loads((context_dir / VENDOR_PINS).read_text())
    by_name = {x.name: x for x in plan.target_stages}
    line: list = []
    cur = t
    while cur is not None:
        line = [cur, *line]
        cur = by_name.get(cur.parent)
    for stage in line:
        for earlier in stage.pip:
            if earlier is ph:
                break
            for r in earlier.repin:
                name, version = r.split("==", 1)
                pins = {n: v for n, v in pins.items() if canonicalize_name(n) != canonicalize_name(name)}
                pins[name] = version
    own = {canonicalize_name(r.split("==", 1)[0]) for r in ph.repin}
    tmp.mkdir(parents=True, exist_ok=True)
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items()) if canonicalize_name(n) not in own))
    requirements = tmp / "requirements.txt"
    original = (context_dir / ph.requirements).read_bytes()
    requirements.write_text(original.decode().replace(" /stackforge/targets/", f" {context_dir}/targets/"))
    return PhaseView(ph, original, requirements, constraints)
