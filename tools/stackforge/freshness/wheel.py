"""Wheel forensics: what a wheel declares and what its shared objects need, without running anything.

``inspect_wheel(path)`` reads a wheel (a zip) and returns a ``WheelInfo``: name, version and tags from
the file name and ``WHEEL``, the core metadata (``Requires-Dist`` above all), ``RECORD`` checked against
the actual content, and for every ELF file its SONAME, ``DT_NEEDED`` entries and RPATH/RUNPATH, read
with pyelftools. A compiled wheel that declares no ``Requires-Dist`` gets a loud warning: no resolver
can then notice that it was built against a different torch than the one installed next to it.
Members are hashed in chunks; only ELF members (recognised by their first 4 bytes) and the
``*.dist-info`` files are read whole, so a multi-GB torch wheel is inspected in little memory.

``diff_wheels(a, b)`` compares two of them: files added, removed and changed (by the sha256 of the
content, with the ``*.dist-info`` / ``*.data`` directory names normalised so a version bump does not
show every metadata file as removed and re-added), metadata fields that changed, and per shared object
the ``DT_NEEDED`` entries gained and lost.

``resolve_wheel_source(src, cache_dir)`` accepts a local path or an http(s) URL (downloaded once into
``cache_dir`` and checked against a ``#sha256=`` fragment when present).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import IO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import Dynamic, DynamicSection, DynamicSegment, DynamicTag
from elftools.elf.elffile import ELFFile
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from stackforge.clients.index import download, redact
from stackforge.errors import UserError

ELF_MAGIC = b"\x7fELF"
_CHUNK = 1 << 20
_SPOOL_MAX = 8 << 20  # an ELF member larger than this is spooled to a temporary file for pyelftools
_DIST_INFO_RE = re.compile(r"^[^/]+-[^/]+\.dist-info/")
_DATA_RE = re.compile(r"^[^/]+-[^/]+\.data/")


@dataclass
class SharedObject:
    """The dynamic section of one ELF file inside a wheel."""

    path: str
    elf_type: str  # ET_DYN, ET_EXEC, ...
    machine: str
    elf_class: int  # 32 or 64
    soname: str | None
    needed: list[str]
    rpath: list[str]
    runpath: list[str]


@dataclass
class FileEntry:
    path: str
    size: int
    sha256: str  # hex digest of the content as stored in the wheel
    record_hash: str | None = None  # "algo=digest" as RECORD lists it
    record_size: int | None = None


@dataclass
class WheelInfo:
    source: str  # path or redacted URL the wheel came from
    filename: str
    size: int
    sha256: str
    name: str
    version: str
    build: str | None
    tags: list[str]
    metadata: dict[str, list[str]]
    wheel: dict[str, list[str]]
    files: dict[str, FileEntry]
    shared_objects: list[SharedObject]
    record_problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def requires_dist(self) -> list[str]:
        return list(self.metadata.get("Requires-Dist", []))

    @property
    def is_compiled(self) -> bool:
        """True when the wheel ships ELF files or is tagged for a specific ABI or platform."""
        if self.shared_objects:
            return True
        return any(not t.endswith("-none-any") for t in self.tags)

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "filename": self.filename,
            "size": self.size,
            "sha256": self.sha256,
            "name": self.name,
            "version": self.version,
            "build": self.build,
            "tags": self.tags,
            "requires_dist": self.requires_dist,
            "compiled": self.is_compiled,
            "metadata": self.metadata,
            "wheel": self.wheel,
            "record": [asdict(f) for f in self.files.values()],
            "record_problems": self.record_problems,
            "shared_objects": [asdict(s) for s in self.shared_objects],
            "warnings": self.warnings,
        }


def _headers(text: str) -> dict[str, list[str]]:
    msg = HeaderParser().parsestr(text)
    out: dict[str, list[str]] = {}
    for key, value in msg.items():
        out.setdefault(key, []).append(str(value).strip())
    return out


def read_elf(path: str, data: bytes) -> SharedObject | None:
    """Dynamic-section facts of an ELF image, or ``None`` if ``data`` is not ELF."""
    if not data.startswith(ELF_MAGIC):
        return None
    return _read_elf_stream(path, io.BytesIO(data))


def _tag_string(tag: DynamicTag) -> str:
    """The string of a DT_NEEDED, DT_SONAME, DT_RPATH or DT_RUNPATH tag: pyelftools attaches it as the
    attribute named after the tag (``needed``, ``soname``, ...), which its annotations do not declare."""
    value: str = getattr(tag, tag.entry.d_tag[3:].lower())
    return value


def _read_elf_stream(path: str, stream: IO[bytes]) -> SharedObject:
    """Dynamic-section facts of the ELF image in the seekable ``stream`` (which starts with ELF_MAGIC)."""
    try:
        elf = ELFFile(stream)
        soname: str | None = None
        needed: list[str] = []
        rpath: list[str] = []
        runpath: list[str] = []
        dynamic: list[Dynamic] = [s for s in elf.iter_sections() if isinstance(s, DynamicSection)]
        if not dynamic:  # section headers stripped: fall back to the PT_DYNAMIC segment
            dynamic = [s for s in elf.iter_segments() if isinstance(s, DynamicSegment)]
        for dyn in dynamic[:1]:
            for tag in dyn.iter_tags():
                kind = tag.entry.d_tag
                if kind == "DT_NEEDED":
                    needed.append(_tag_string(tag))
                elif kind == "DT_SONAME":
                    soname = _tag_string(tag)
                elif kind == "DT_RPATH":
                    rpath.extend(p for p in _tag_string(tag).split(":") if p)
                elif kind == "DT_RUNPATH":
                    runpath.extend(p for p in _tag_string(tag).split(":") if p)
        return SharedObject(
            path=path,
            elf_type=str(elf.header["e_type"]),
            machine=str(elf.header["e_machine"]),
            elf_class=elf.elfclass,
            soname=soname,
            needed=needed,
            rpath=rpath,
            runpath=runpath,
        )
    except (ELFError, ValueError, KeyError, AttributeError) as exc:
        return SharedObject(
            path=path,
            elf_type=f"unreadable ELF ({exc})",
            machine="?",
            elf_class=0,
            soname=None,
            needed=[],
            rpath=[],
            runpath=[],
        )


def inspect_wheel(path: str | Path, *, source: str | None = None) -> WheelInfo:
    """Read everything ``wheel inspect`` reports from the wheel at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such wheel file", fix="pass a .whl path or an http(s) URL")
    filename = path.name
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise UserError(f"{path}: not a wheel file name ({exc})") from None
    size, sha256 = _file_digest(path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise UserError(f"{path}: not a zip archive, so not a wheel") from None

    files: dict[str, FileEntry] = {}
    shared: list[SharedObject] = []
    dist_info = None
    with zf:
        for member in zf.infolist():
            if member.is_dir():
                continue
            entry, elf = _scan_member(zf, member)
            files[member.filename] = entry
            if member.filename.endswith(".dist-info/METADATA") and member.filename.count("/") == 1:
                dist_info = member.filename.split("/", 1)[0]
            if elf is not None:
                shared.append(elf)
        if dist_info is None:
            raise UserError(f"{path}: no *.dist-info/METADATA in the archive, so not a valid wheel")
        metadata = _headers(zf.read(f"{dist_info}/METADATA").decode("utf-8", "replace"))
        wheel_meta = (
            _headers(zf.read(f"{dist_info}/WHEEL").decode("utf-8", "replace")) if f"{dist_info}/WHEEL" in files else {}
        )
        record_text = (
            zf.read(f"{dist_info}/RECORD").decode("utf-8", "replace") if f"{dist_info}/RECORD" in files else None
        )
        problems = _check_record(zf, files, record_text, f"{dist_info}/RECORD")

    info = WheelInfo(
        source=source or str(path),
        filename=filename,
        size=size,
        sha256=sha256,
        name=(metadata.get("Name") or [str(name)])[0],
        version=str(version),
        build="".join(map(str, build)) or None,
        tags=sorted(str(t) for t in tags),
        metadata=metadata,
        wheel=wheel_meta,
        files=files,
        shared_objects=shared,
        record_problems=problems,
    )
    meta_name = (metadata.get("Name") or [""])[0]
    meta_version = (metadata.get("Version") or [""])[0]
    if meta_version and meta_version != str(version) and meta_version.replace("-", "_") != str(version):
        info.warnings.append(f"METADATA says Version {meta_version}, the file name says {version}")
    if meta_name and canonicalize_name(meta_name) != canonicalize_name(str(name)):
        info.warnings.append(f"METADATA says Name {meta_name}, the file name says {name}")
    if info.is_compiled and not info.requires_dist:
        info.warnings.append(
            "compiled wheel declares NO Requires-Dist: no resolver will stop it from being installed "
            "next to a torch (or any library) it was not built against; check its DT_NEEDED by hand"
        )
    if problems:
        info.warnings.append(f"RECORD does not match the archive ({len(problems)} problem(s))")
    return info


def _file_digest(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _scan_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[FileEntry, SharedObject | None]:
    """Hash one member in chunks; an ELF member (by its first 4 bytes) is also spooled and read with pyelftools.

    Only ELF members are kept whole (in memory up to ``_SPOOL_MAX``, on disk beyond), so a wheel
    of a few GB is inspected in little memory.
    """
    h, size = hashlib.sha256(), 0
    elf = None
    with zf.open(info) as src:
        head = src.read(len(ELF_MAGIC))
        h.update(head)
        size += len(head)
        if head == ELF_MAGIC:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MAX) as spool:
                spool.write(head)
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    spool.write(chunk)
                spool.seek(0)
                elf = _read_elf_stream(info.filename, spool)
        else:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
    return FileEntry(info.filename, size, h.hexdigest()), elf


def _member_record_digest(zf: zipfile.ZipFile, entry: FileEntry, algo: str) -> str:
    """The RECORD form (urlsafe base64, unpadded) of a member's digest, hashed in chunks if not sha256."""
    if algo == "sha256":
        return base64.urlsafe_b64encode(bytes.fromhex(entry.sha256)).rstrip(b"=").decode()
    h = hashlib.new(algo)
    with zf.open(entry.path) as src:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _check_record(zf: zipfile.ZipFile, files: dict[str, FileEntry], record: str | None, record_path: str) -> list[str]:
    if record is None:
        return ["no RECORD file"]
    problems = []
    listed = set()

    for row in csv.reader(io.StringIO(record)):
        if not row or not row[0]:
            continue
        rpath = row[0]
        digest = row[1] if len(row) > 1 else ""
        size = row[2] if len(row) > 2 else ""
        listed.add(rpath)
        entry = files.get(rpath)
        if entry is None:
            problems.append(f"{rpath}: listed in RECORD but not in the archive")
            continue
        entry.record_hash = digest or None
        entry.record_size = int(size) if size.isdigit() else None
        if rpath == record_path:
            continue
        if not digest:
            problems.append(f"{rpath}: RECORD gives no hash")
            continue
        algo, _, value = digest.partition("=")
        if algo not in hashlib.algorithms_available or algo in ("md5", "sha1"):
            problems.append(f"{rpath}: RECORD uses unsupported hash {algo!r}")
            continue
        if _member_record_digest(zf, entry, algo) != value:
            problems.append(f"{rpath}: content does not match the RECORD {algo}")
        if entry.record_size is not None and entry.record_size != entry.size:
            problems.append(f"{rpath}: RECORD size {entry.record_size} but {entry.size} bytes in the archive")
    for p in files:
        if p not in listed and not p.endswith((".dist-info/RECORD.jws", ".dist-info/RECORD.p7s")):
            problems.append(f"{p}: in the archive but not listed in RECORD")
    return problems


def resolve_wheel_source(src: str, cache_dir: str | Path) -> tuple[Path, str]:
    """Return ``(local path, display name)`` for a path or an http(s) URL (downloaded into ``cache_dir``)."""
    if re.match(r"^https?://", src):
        key = hashlib.sha256(redact(src).encode()).hexdigest()[:16]
        local = download(src, Path(cache_dir) / key)
        return local, redact(src)
    return Path(src), src


# --------------------------------------------------------------------------------------------------
# Diff


def _logical(path: str) -> str:
    """Map ``name-version.dist-info/X`` to ``{dist-info}/X`` (same for ``.data``) for comparison."""
    path = _DIST_INFO_RE.sub("{dist-info}/", path)
    return _DATA_RE.sub("{data}/", path)


@dataclass
class NeededChange:
    path: str
    gained: list[str]
    lost: list[str]
    soname: tuple[str | None, str | None] | None = None
    rpath: tuple[list[str], list[str]] | None = None
    runpath: tuple[list[str], list[str]] | None = None


@dataclass
class WheelDiff:
    a: str
    b: str
    added: list[str]
    removed: list[str]
    changed: list[str]
    unchanged: int
    metadata: list[tuple[str, list[str], list[str]]]  # (field, only in a, only in b)
    needed: list[NeededChange]

    @property
    def is_empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.metadata or self.needed)

    def to_json(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "metadata": [{"field": f, "removed": old, "added": new} for f, old, new in self.metadata],
            "shared_objects": [asdict(n) for n in self.needed],
        }


def diff_wheels(a: WheelInfo, b: WheelInfo) -> WheelDiff:
    fa = {_logical(p): e for p, e in a.files.items()}
    fb = {_logical(p): e for p, e in b.files.items()}
    record_key = "{dist-info}/RECORD"
    added = sorted(set(fb) - set(fa))
    removed = sorted(set(fa) - set(fb))
    common = sorted(set(fa) & set(fb))
    changed = [p for p in common if fa[p].sha256 != fb[p].sha256 and p != record_key]
    unchanged = sum(1 for p in common if fa[p].sha256 == fb[p].sha256)

    meta: list[tuple[str, list[str], list[str]]] = []
    base = [("filename tags", a.tags, b.tags), ("name", [a.name], [b.name]), ("version", [a.version], [b.version])]
    for label, va, vb in base:
        if va != vb:
            meta.append((label, [x for x in va if x not in vb], [x for x in vb if x not in va]))
    for label, ma, mb in (("METADATA", a.metadata, b.metadata), ("WHEEL", a.wheel, b.wheel)):
        for key in sorted(set(ma) | set(mb)):
            if key in ("Name", "Version") and label == "METADATA":
                continue
            va, vb = ma.get(key, []), mb.get(key, [])
            if va != vb:
                meta.append((f"{label} {key}", [x for x in va if x not in vb], [x for x in vb if x not in va]))

    sa = {_logical(s.path): s for s in a.shared_objects}
    sb = {_logical(s.path): s for s in b.shared_objects}
    needed = []
    for p in sorted(set(sa) | set(sb)):
        x, y = sa.get(p), sb.get(p)
        na, nb = (x.needed if x else []), (y.needed if y else [])
        change = NeededChange(
            path=p,
            gained=[n for n in nb if n not in na],
            lost=[n for n in na if n not in nb],
        )
        if x and y:
            if x.soname != y.soname:
                change.soname = (x.soname, y.soname)
            if x.rpath != y.rpath:
                change.rpath = (x.rpath, y.rpath)
            if x.runpath != y.runpath:
                change.runpath = (x.runpath, y.runpath)
        if change.gained or change.lost or change.soname or change.rpath or change.runpath:
            needed.append(change)
    return WheelDiff(a.source, b.source, added, removed, changed, unchanged, meta, needed)


# --------------------------------------------------------------------------------------------------
# Text output


def render_inspect(info: WheelInfo) -> str:
    out = []
    for w in info.warnings:
        out.append(f"WARNING: {w}")
    if info.warnings:
        out.append("")
    out.append(f"{info.name} {info.version}")
    out.append(f"  file          {info.filename}")
    if info.source != info.filename:
        out.append(f"  source        {info.source}")
    out.append(f"  size          {info.size} bytes")
    out.append(f"  sha256        {info.sha256}")
    out.append(f"  tags          {', '.join(info.tags)}")
    if info.build:
        out.append(f"  build tag     {info.build}")
    for key in ("Requires-Python",):
        if key in info.metadata:
            out.append(f"  {key:<13} {info.metadata[key][0]}")
    if info.requires_dist:
        out.append("  Requires-Dist")
        out.extend(f"    {r}" for r in info.requires_dist)
    else:
        out.append("  Requires-Dist (none declared)")
    for key in ("Root-Is-Purelib", "Generator"):
        if key in info.wheel:
            out.append(f"  {key:<13} {info.wheel[key][0]}")
    state = "all entries match the content" if not info.record_problems else "PROBLEMS"
    out.append(f"RECORD ({len(info.files)} files, {state})")
    width = max((len(p) for p in info.files), default=10)
    for entry in info.files.values():
        out.append(f"  {entry.path:<{width}}  {entry.size:>12}  sha256:{entry.sha256[:16]}")
    for p in info.record_problems:
        out.append(f"  ! {p}")
    if info.shared_objects:
        out.append(f"shared objects ({len(info.shared_objects)})")
        for so in info.shared_objects:
            out.append(f"  {so.path}  [{so.elf_type}, {so.machine}, ELF{so.elf_class}]")
            out.append(f"    SONAME   {so.soname or '-'}")
            out.append(f"    NEEDED   {', '.join(so.needed) if so.needed else '-'}")
            if so.rpath:
                out.append(f"    RPATH    {':'.join(so.rpath)}")
            if so.runpath:
                out.append(f"    RUNPATH  {':'.join(so.runpath)}")
            if not so.rpath and not so.runpath:
                out.append("    RUNPATH  -")
    else:
        out.append("shared objects (none)")
    return "\n".join(out)


def render_diff(d: WheelDiff) -> str:
    out = [f"--- {d.a}", f"+++ {d.b}"]
    if d.is_empty:
        out.append("no differences (file contents, metadata and shared-object dependencies are identical)")
        return "\n".join(out)
    out.append(
        f"files: {len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed, "
        f"{d.unchanged} identical (by sha256; RECORD not counted)"
    )
    out.extend(f"  + {p}" for p in d.added)
    out.extend(f"  - {p}" for p in d.removed)
    out.extend(f"  ~ {p}" for p in d.changed)
    if d.metadata:
        out.append("metadata:")
        for key, old, new in d.metadata:
            out.append(f"  {key}")
            out.extend(f"    - {v}" for v in old)
            out.extend(f"    + {v}" for v in new)
    if d.needed:
        out.append("shared objects:")
        for n in d.needed:
            out.append(f"  {n.path}")
            out.extend(f"    NEEDED + {x}" for x in n.gained)
            out.extend(f"    NEEDED - {x}" for x in n.lost)
            if n.soname:
                out.append(f"    SONAME {n.soname[0] or '-'} -> {n.soname[1] or '-'}")
            if n.rpath:
                out.append(f"    RPATH {':'.join(n.rpath[0]) or '-'} -> {':'.join(n.rpath[1]) or '-'}")
            if n.runpath:
                out.append(f"    RUNPATH {':'.join(n.runpath[0]) or '-'} -> {':'.join(n.runpath[1]) or '-'}")
    else:
        out.append("shared objects: no DT_NEEDED / SONAME / RPATH changes")
    return "\n".join(out)


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=False)
