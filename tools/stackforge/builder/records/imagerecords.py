"""The records a build leaves in its image, read back once after the build: the gate's reports, the target
checks' lines, the inventory, the system record and the image's Debian packages.

Two ways give the same sections (``{section: [non-empty lines]}``):

- :func:`from_tree` reads the files straight from the engine's overlay2 layer store
  (:meth:`clients.layerstore.LayerStore.tree`), and lists the Debian packages from ``/var/lib/dpkg/status``
  as ``dpkg-query -W -f sbom.DPKG_FORMAT`` would (:func:`sbom.dpkg_lines`). No container starts: the first
  container of a freshly pulled or built image costs the engine most of a second here.
- :func:`from_container` runs one container (``--network=none``) that prints them; it serves any engine.

:func:`read` takes the layer store when the engine's is local, overlay2 and readable, and the container
otherwise (or when the store holds something it will not interpret, e.g. a symlink on a record's path).
"""

from __future__ import annotations

from typing import Any

from stackforge.builder.plan import system
from stackforge.builder.records import inventory, sbom
from stackforge.clients import layerstore

GATE_FILES = ("result.txt", "abi.txt", "readonly.txt")
GATE_DIR = "/stackforge/gate"
#: the target checks' records (images/targets/checks.py), one per target stage the image went through
CHECKS = "checks.txt"
TARGETS_DIR = "/stackforge/targets"
#: the other records a build leaves in the image: section -> image path
RECORDS = {"inventory.json": inventory.IMAGE_PATH, "system.txt": system.EVIDENCE}
#: the image's Debian packages as sbom.DPKG_FORMAT lists them
DPKG = "dpkg.txt"
SECTIONS = (*GATE_FILES, CHECKS, *RECORDS, DPKG)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def read(engine: Any, ref: str, image_id: str | None) -> dict[str, list[str]]:
    """The records of image ``ref`` (id ``image_id``): from the layer store when it can serve, else from a
    container."""
    records = layerstore.read_image(engine, image_id, from_tree)
    return from_container(engine, ref) if records is None else records


def from_tree(tree: layerstore.ImageTree) -> dict[str, list[str]]:
    """The records, read from the image's files in the layer store (:class:`layerstore.Unusable` when it cannot)."""
    out: dict[str, list[str]] = {}

    def add(section: str, path: str) -> None:
        data = tree.read(path)
        if data is not None:
            out.setdefault(section, []).extend(_lines(data.decode("utf-8", errors="replace")))

    for name in GATE_FILES:
        add(name, f"{GATE_DIR}/{name}")
    for target in tree.listdir(TARGETS_DIR):
        add(CHECKS, f"{TARGETS_DIR}/{target}/{CHECKS}")
    for name, path in RECORDS.items():
        add(name, path)
    debs = sbom.dpkg_from_tree(tree)
    if debs is not None:
        out[DPKG] = debs
    return out


def from_container(engine: Any, ref: str) -> dict[str, list[str]]:
    """The records, printed by one container run of ``ref``."""
    script = "; ".join(f'if [ -f {GATE_DIR}/{n} ]; then echo "==> {n}"; cat {GATE_DIR}/{n}; fi' for n in GATE_FILES)
    script += f'; for f in {TARGETS_DIR}/*/{CHECKS}; do if [ -f "$f" ]; then echo "==> {CHECKS}"; cat "$f"; fi; done'
    script += "".join(
        f'; if [ -f {path} ]; then echo "==> {name}"; cat {path}; echo; fi' for name, path in RECORDS.items()
    )
    script += (
        f"; if command -v dpkg-query >/dev/null; then echo '==> {DPKG}'; dpkg-query -W -f '{sbom.DPKG_FORMAT}'; fi"
    )
    proc = engine.cli("run", "--rm", "--network=none", "--entrypoint", "sh", ref, "-c", script, timeout=300)
    out: dict[str, list[str]] = {}
    current = None
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        if line.startswith("==> ") and line[4:] in SECTIONS:
            current = out.setdefault(line[4:], [])
        elif current is not None and line.strip():
            current.append(line)
    return out
