"""The image's SBOM: CycloneDX 1.5 JSON of every installed Python distribution and Debian package.

Python distributions come from the image's inventory (``/stackforge/inventory.json``, or the same script run over
an image stackforge did not build): name, version, the index name that served it and the archive's sha256 when
a pip phase recorded them. Debian packages come from the image's dpkg database (its status file read from the
engine's layer store as ``dpkg-query`` lists it, or ``dpkg-query`` in one container run): binary name, version,
architecture, and the source package and version advisories name. The document is made with
cyclonedx-python-lib and validated against the CycloneDX 1.5 schema; it is deterministic for one image (serial
number from the image id, timestamp from the image's created time), so two builds of the same bytes give the
same SBOM. The image's distribution and release (``ID`` and ``VERSION_ID`` of its os-release) are metadata
properties (``stackforge:os:id``, ``stackforge:os:version_id``): Debian and Ubuntu advisories are per release.

An SBOM read back (one attached to a published image, a file a user names) is read bounded and validated by
:class:`Bom`, the parts of CycloneDX the scan uses: a wrong shape is one error naming the field.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, StringConstraints

from stackforge import safeio
from stackforge.builder.records import inventory
from stackforge.clients import layerstore
from stackforge.clients.containers import isolated
from stackforge.errors import UserError
from stackforge.fslock import atomic_write
from stackforge.osv import Ecosystem, Package
from stackforge.urls import redact_text

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine

MEDIA_TYPE = "application/vnd.cyclonedx+json"
#: one line per package: binary name, version, architecture, source name, source version
DPKG_FORMAT = r"${Package}\t${Version}\t${Architecture}\t${source:Package}\t${source:Version}\n"
PROP = "stackforge"
DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_UPDATES = "/var/lib/dpkg/updates"
#: where an image's dpkg-query is (Debian's own paths; the container path asks the shell's PATH)
DPKG_QUERY = ("/usr/bin/dpkg-query", "/bin/dpkg-query")
#: the os-release file itself (``/etc/os-release`` links to it on Debian and Ubuntu)
OS_RELEASE = "/usr/lib/os-release"
OS_ID, OS_VERSION = f"{PROP}:os:id", f"{PROP}:os:version_id"
#: what an SBOM read back may be: a few MiB for an image's ~1,000 packages
MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    arch: str
    source: str
    source_version: str


def parse_dpkg(text: str) -> list[Deb]:
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 5 or not parts[0]:
            continue
        name, version, arch, source, source_version = parts
        out.append(Deb(name, version, arch, source or name, source_version or version))
    return sorted(out, key=lambda d: (d.name, d.arch))


def dpkg_lines(status: str) -> list[str]:
    """``dpkg-query -W -f sbom.DPKG_FORMAT`` of a dpkg status file: one line per package dpkg knows but has not
    purged (Status ``not-installed``), Package, Version, Architecture, then the source package's name and
    version (``Source: name (version)``; each defaults to the binary's), sorted by name and architecture."""
    rows = []
    for paragraph in status.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t"):
                if key is not None:
                    fields[key] += "\n" + line
                continue
            key, sep, value = line.partition(":")
            if not sep:
                key = None
                continue
            fields[key] = value.strip()
        name = fields.get("Package", "")
        state = fields.get("Status", "").split()
        if not name or (len(state) == 3 and state[2] == "not-installed"):
            continue
        version = fields.get("Version", "")
        source, _, rest = fields.get("Source", "").partition(" ")
        source_version = rest.strip().removeprefix("(").removesuffix(")").strip() if rest.strip() else ""
        arch = fields.get("Architecture", "")
        rows.append((name, arch, f"{name}\t{version}\t{arch}\t{source or name}\t{source_version or version}"))
    return [row for _, _, row in sorted(rows)]


def dpkg_from_tree(tree: layerstore.ImageTree) -> list[str] | None:
    """The :data:`DPKG_FORMAT` lines of an image read from its layers; None when it has no dpkg-query.
    :class:`layerstore.Unusable` when dpkg's journal has entries dpkg-query would merge first."""
    if not any(tree.exists(p) for p in DPKG_QUERY):
        return None
    if tree.listdir(DPKG_UPDATES):
        raise layerstore.Unusable(f"dpkg's journal ({DPKG_UPDATES}) has entries: ask dpkg-query")
    status = tree.read(DPKG_STATUS)
    return dpkg_lines(status.decode("utf-8", errors="replace") if status else "")


def dpkg_of(engine: Engine, ref: str) -> list[Deb]:
    """The image's Debian packages (none when it has no dpkg): from the engine's layer store when it can serve,
    else ``dpkg-query`` in one container run."""
    lines = layerstore.read_image(engine, engine.image_id(ref), lambda tree: dpkg_from_tree(tree) or [])
    if lines is not None:
        return parse_dpkg("\n".join(lines))
    proc = engine.run(isolated(ref, "dpkg-query", "-W", "-f", DPKG_FORMAT), timeout=300)
    return parse_dpkg(proc.stdout) if proc.returncode == 0 else []


def parse_os_release(text: str) -> dict[str, str]:
    """``ID`` and ``VERSION_ID`` of an os-release file (os-release(5)), when each is a plain word."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("ID", "VERSION_ID"):
            value = value.strip().strip("\"'")
            if re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", value):
                out[key] = value
    return out


def os_release_of(engine: Engine, ref: str, image_id: str | None, debs: list[Deb]) -> dict[str, str]:
    """The image's os-release (``ID``, ``VERSION_ID``): from the engine's layer store when it can serve; else,
    only for an Ubuntu image (whose release its packages do not tell), from one container run."""
    data = layerstore.read_image(engine, image_id, lambda tree: tree.read(OS_RELEASE, limit=64 << 10) or b"")
    if data is None and any(d.name == "base-files" and "ubuntu" in d.version for d in debs):
        proc = engine.run(isolated(ref, "cat", "/etc/os-release"), timeout=300)
        data = proc.stdout.encode("utf-8", "replace") if proc.returncode == 0 else b""
    return parse_os_release((data or b"").decode("utf-8", errors="replace"))


def _import_libraries() -> None:
    import cyclonedx.output.json
    import cyclonedx.validation.json  # noqa: F401


def _canonical(value: Any) -> Any:
    """``value`` with JSON Schema's equality made Python's: an integral number is one int (1 == 1.0), a boolean
    stays apart from a number (true != 1), objects compare by their sorted items."""
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("[]", *(_canonical(v) for v in value))
    if isinstance(value, bool) or value is None:
        return ("bool", value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """JSON Schema's ``uniqueItems`` in linear time: jsonschema compares unhashable items (every component and
    dependency object) pairwise, which for an image's ~800 packages is over a second of each build."""
    from jsonschema.exceptions import ValidationError

    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield ValidationError(f"{item!r} is not unique in the array")
                return
            seen.add(key)


def _validator() -> Any:
    """The library's CycloneDX 1.5 schema validator (its schema, the schemas it refers to, its format checks),
    with :func:`_unique_items` for ``uniqueItems``."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from jsonschema import validators

    library = JsonStrictValidator(SchemaVersion.V1_5)._validator
    linear = validators.extend(type(library), {"uniqueItems": _unique_items})
    return linear(library.schema, registry=library._registry, format_checker=library.format_checker)


def warm() -> threading.Thread:
    """Import the document's libraries in a background thread, for a build to call while the engine runs: the
    schema validator's import (jsonschema's format checkers compile their grammars) takes most of a second,
    which :func:`document` then does not wait for. Python's import lock makes a later import wait for this one."""
    thread = threading.Thread(target=_import_libraries, name="sbom-import", daemon=True)
    thread.start()
    return thread


def document(
    image: str,
    image_id: str,
    created: str | None,
    dists: list[dict],
    debs: list[Deb],
    os_release: dict[str, str] | None = None,
) -> str:
    """The CycloneDX 1.5 JSON text (validated) for an image, what it has installed and its os-release."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.dependency import Dependency
    from cyclonedx.output.json import JsonV1Dot5
    from packageurl import PackageURL

    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"stackforge:sbom:{image_id}"))
    bom.metadata.timestamp = _timestamp(created)
    root = Component(name=image, type=ComponentType.CONTAINER, version=image_id, bom_ref="image")
    bom.metadata.component = root
    release = os_release or {}
    if release.get("ID") and release.get("VERSION_ID"):
        bom.metadata.properties.update(
            [Property(name=OS_ID, value=release["ID"]), Property(name=OS_VERSION, value=release["VERSION_ID"])]
        )
    parts = []
    for d in dists:
        props = [Property(name=f"{PROP}:{k}", value=redact_text(str(d[k]))) for k in ("index", "phase") if d.get(k)]
        sha = d.get("sha256")
        parts.append(
            Component(
                type=ComponentType.LIBRARY,
                name=d["name"],
                version=d["version"],
                purl=PackageURL(type="pypi", name=canonicalize_name(d["name"]), version=d["version"]),
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha)] if sha else [],
                properties=props,
                bom_ref=f"pypi:{canonicalize_name(d['name'])}",
            )
        )
    for deb in debs:
        parts.append(
            Component(
                type=ComponentType.LIBRARY,
                name=deb.name,
                version=deb.version,
                purl=PackageURL(
                    type="deb",
                    namespace="debian",
                    name=deb.name,
                    version=deb.version,
                    qualifiers={"arch": deb.arch, "upstream": f"{deb.source}@{deb.source_version}"},
                ),
                properties=[
                    Property(name=f"{PROP}:deb:source", value=deb.source),
                    Property(name=f"{PROP}:deb:source_version", value=deb.source_version),
                ],
                bom_ref=f"deb:{deb.name}:{deb.arch}",
            )
        )
    bom.components.update(parts)
    # What Bom.register_dependency(root, parts) records, without its scan of every record per part.
    bom.dependencies.update(
        [Dependency(ref=root.bom_ref, dependencies=[Dependency(ref=p.bom_ref) for p in parts])]
        + [Dependency(ref=p.bom_ref) for p in parts]
    )
    text = JsonV1Dot5(bom).output_as_string(indent=2)
    problem = next(_validator().iter_errors(json.loads(text)), None)
    if problem is not None:  # pragma: no cover - the library wrote what its own schema refuses
        raise UserError(f"the SBOM of {image} is not valid CycloneDX 1.5: {problem.message}")
    return text


EVIDENCE = "sbom.cdx.json"


def write_evidence(
    engine: Engine, ref: str, image_id: str, evidence: Path, installed: dict, dpkg_lines: list[str]
) -> Path:
    """``sbom.cdx.json`` in the build's evidence, from the records the build read out of the image (its inventory
    and its dpkg-query lines): no container runs for it."""
    created = engine.image_created(image_id)
    debs = parse_dpkg("\n".join(dpkg_lines))
    release = os_release_of(engine, ref, image_id, debs)
    text = document(ref, image_id, created, installed.get("dists", []), debs, release)
    atomic_write(evidence / EVIDENCE, text + "\n")
    return evidence / EVIDENCE


def of_image(engine: Engine, ref: str) -> str:
    """The SBOM of a local image: its inventory and dpkg database."""
    from stackforge.clients.engine import NoSuchImage

    try:
        attrs = engine.image_attrs(ref)
    except NoSuchImage:
        raise UserError(
            f"image {ref!r} is not in the local engine", file="IMAGE", fix=f"docker pull {ref} first"
        ) from None
    data = inventory.from_image(engine, ref) or inventory.taken_from(engine, ref)
    debs = dpkg_of(engine, ref)
    image_id = str(attrs.get("Id"))
    release = os_release_of(engine, ref, image_id, debs)
    return document(ref, image_id, attrs.get("Created"), data.get("dists", []), debs, release)


# -- an SBOM read back ------------------------------------------------------------------------------------

Str = Annotated[str, StringConstraints(strict=True, max_length=4096)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class BomProperty(_Model):
    name: Str
    value: Str | None = None


class BomComponent(_Model):
    name: Str
    version: Str
    purl: Str | None = None
    properties: list[BomProperty] = []

    def prop(self, name: str) -> str | None:
        return next((p.value for p in self.properties if p.name == name), None)


class BomMetadata(_Model):
    properties: list[BomProperty] = []


class Bom(_Model):
    """A CycloneDX JSON document, the parts the scan and ``verify`` read: every component with its name,
    version and purl."""

    bomFormat: Literal["CycloneDX"]
    specVersion: Str
    metadata: BomMetadata | None = None
    components: list[BomComponent] = []  # none listed: the scan says there is nothing to scan

    def prop(self, name: str) -> str | None:
        return next((p.value for p in self.metadata.properties if p.name == name), None) if self.metadata else None


def read(data: bytes | str, *, source: str | Path) -> Bom:
    """An SBOM from outside (attached to an image, or a file), bounded and typed; ``source`` names it in errors."""
    return safeio.parse_model(Bom, data, source=source, what="CycloneDX SBOM", limit=MAX_BYTES)


def load(path: Path) -> Bom:
    """A CycloneDX SBOM file a user names (``scan --sbom FILE``)."""
    return read(safeio.read_bytes(path, limit=MAX_BYTES, what="SBOM file"), source=path)


def distribution(bom: Bom) -> Ecosystem | None:
    """The distribution and release the SBOM's Debian packages come from: its os-release properties, else its
    ``base-files`` package (Debian's version starts with the release: ``12.4+deb12u5``; Ubuntu's names
    ``ubuntu`` and not its release); None when it has neither."""
    os_id, version = bom.prop(OS_ID), bom.prop(OS_VERSION)
    if os_id == "debian" and version and re.fullmatch(r"\d{1,3}", version):
        return Ecosystem("Debian", version)
    if os_id == "ubuntu" and version and re.fullmatch(r"\d{2}\.\d{2}", version):
        return Ecosystem("Ubuntu", version)
    base = next((c for c in bom.components if c.name == "base-files" and (c.purl or "").startswith("pkg:deb/")), None)
    if base is None:
        return None
    if "ubuntu" in base.version:
        return Ecosystem("Ubuntu")
    first = re.match(r"(\d{1,3})(?:[.+~]|$)", base.version)
    return Ecosystem("Debian", first.group(1)) if first else None


def packages(bom: Bom | str, source: str | Path = "SBOM") -> list[Package]:
    """The packages an SBOM lists, as the vulnerability scan names them: PyPI by name and version; Debian and
    Ubuntu by source package and version, in the ecosystem of the image's release (``Debian:12``; ``Debian``
    when the SBOM does not tell the distribution)."""
    if isinstance(bom, str):
        bom = read(bom, source=source)
    distro = str(distribution(bom) or "Debian")
    out = []
    for c in bom.components:
        purl = c.purl or ""
        if purl.startswith("pkg:pypi/"):
            out.append(Package("PyPI", c.name, c.version))
        elif purl.startswith("pkg:deb/"):
            source_name = c.prop(f"{PROP}:deb:source") or c.name
            version = c.prop(f"{PROP}:deb:source_version") or c.version
            out.append(Package(distro, source_name, version))
    return sorted(set(out), key=lambda p: (p.ecosystem, p.name, p.version))


def _timestamp(created: str | None) -> _dt.datetime:
    """The image's created time to the second (the engine writes it with nanoseconds, in UTC)."""
    try:
        return _dt.datetime.strptime(str(created)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
