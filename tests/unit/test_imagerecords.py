"""Reading an image's files from its layers' diff directories (clients/layerstore.py ``ImageTree``) with
overlayfs' rules, and the Debian package list read from a dpkg status file (builder/records/sbom.py), checked
against the host's own ``dpkg-query`` on the same file."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from stackforge.builder.records import sbom
from stackforge.clients.layerstore import ImageTree, Unusable


def _layer(root: Path, name: str, files: dict[str, str | None], opaque: tuple[str, ...] = ()) -> Path:
    """A diff directory: ``files`` maps a path to its text, or None for a whiteout (character device 0/0); a
    path ending in ``/`` is a directory."""
    layer = root / name
    layer.mkdir()
    for path, text in files.items():
        target = layer / path.strip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        elif path.endswith("/"):
            target.mkdir(exist_ok=True)
        else:
            target.write_text(text)
    for path in opaque:
        os.setxattr(layer / path.strip("/"), "trusted.overlay.opaque", b"y")
    return layer


@pytest.fixture
def tree(tmp_path) -> ImageTree:
    bottom = _layer(tmp_path, "1", {
        "/etc/keep": "base\n", "/etc/gone": "deleted above\n", "/etc/apt/sources.list": "old\n",
        "/etc/apt/trusted.gpg": "key\n", "/opt/x/file": "under a dir a file replaces\n",
        "/srv/a/checks.txt": "a\n", "/srv/b/checks.txt": "b\n", "/var/gone/deep/file": "under a whiteout\n",
    })  # fmt: skip
    middle = _layer(tmp_path, "2", {"/etc/gone": None, "/opt/x": "now a file\n", "/var/gone": None})
    top = _layer(tmp_path, "3", {
        "/etc/apt/sources.list": "new\n", "/srv/b": None, "/srv/c/checks.txt": "c\n", "/var/gone/": "",
        "/var/gone/fresh": "recreated over the whiteout\n",
    }, opaque=("/etc/apt", "/var/gone"))  # fmt: skip
    return ImageTree([top, middle, bottom])


def test_the_top_layer_that_has_a_file_gives_it(tree):
    assert tree.read("/etc/keep") == b"base\n"
    assert tree.read("/etc/apt/sources.list") == b"new\n"
    assert tree.read("/opt/x") == b"now a file\n"


def test_a_whiteout_a_file_or_an_opaque_directory_hides_what_is_below(tree):
    assert tree.read("/etc/gone") is None and not tree.exists("/etc/gone")
    assert tree.read("/etc/apt/trusted.gpg") is None  # /etc/apt is opaque in the top layer
    assert tree.read("/opt/x/file") is None  # /opt/x is a file in the middle layer
    assert tree.read("/var/gone/deep/file") is None  # /var/gone: a whiteout, then an opaque directory
    assert tree.read("/var/gone/fresh") == b"recreated over the whiteout\n"
    assert tree.read("/nowhere") is None


def test_a_directory_lists_the_union_without_the_hidden_names(tree):
    assert tree.listdir("/etc") == ["apt", "keep"]
    assert tree.listdir("/etc/apt") == ["sources.list"]
    assert tree.listdir("/srv") == ["a", "c"]
    assert tree.listdir("/var/gone") == ["fresh"]
    assert tree.listdir("/opt/x") == [] and tree.listdir("/nowhere") == []


def test_the_files_of_a_directory_are_its_regular_files_in_the_union(tree, tmp_path):
    assert tree.files("/etc") == {"keep": b"base\n"}  # apt is a directory, gone is deleted
    assert tree.files("/srv/c") == {"checks.txt": b"c\n"} and tree.files("/srv/b") == {}
    (tree.layers[0] / "srv" / "c" / "alias").symlink_to("checks.txt")
    assert tree.files("/srv/c") == {"checks.txt": b"c\n"}  # a symlink is left out, as `docker cp` leaves it


def test_what_the_union_cannot_say_by_itself_is_unusable(tmp_path):
    layer = _layer(tmp_path, "1", {"/real/file": "x\n", "/moved/": ""})
    (layer / "link").symlink_to("real")
    (layer / "real" / "alias").symlink_to("file")
    os.setxattr(layer / "moved", "trusted.overlay.redirect", b"/elsewhere")
    tree = ImageTree([layer])
    for path in ("/link/file", "/real/alias", "/moved", "/real/../real/file"):
        with pytest.raises(Unusable):
            tree.read(path)
    with pytest.raises(Unusable):
        tree.listdir("/link")


STATUS = """\
Package: libc6
Status: install ok installed
Priority: optional
Architecture: amd64
Multi-Arch: same
Source: glibc
Version: 2.36-9+deb12u4
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: libc6
Status: install ok installed
Architecture: i386
Multi-Arch: same
Source: glibc (2.36-9+deb12u3)
Version: 2.36-9+deb12u4

Package: bash
Essential: yes
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b2
Source: bash (5.2.15-2)
Description: GNU Bourne Again SHell

Package: purged
Status: purge ok not-installed
Architecture: amd64

Package: leftover
Status: deinstall ok config-files
Architecture: all
Version: 1:0.9-1
Conffiles:
 /etc/leftover.conf 0123456789abcdef0123456789abcdef

Package: held
Status: hold ok installed
Architecture: all
Source: upstream-src
Version: 2:1.0~rc1-3
"""


def test_the_package_list_is_what_dpkg_query_prints_for_the_same_status_file(tmp_path):
    """The host's dpkg-query, pointed at the same database, is the reference."""
    dpkg_query = shutil.which("dpkg-query")
    assert dpkg_query, "dpkg-query (Debian's dpkg) is needed: this machine's kind has it"
    admin = tmp_path / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    (admin / "status").write_text(STATUS)
    real = subprocess.run(
        [dpkg_query, f"--admindir={admin}", "-W", "-f", sbom.DPKG_FORMAT],
        capture_output=True, text=True, check=True, env={"LC_ALL": "C", "PATH": os.environ["PATH"]},
    ).stdout  # fmt: skip
    ours = sbom.dpkg_lines(STATUS)
    assert ours == sorted(real.splitlines(), key=lambda ln: (ln.split("\t")[0], ln.split("\t")[2]))
    assert len(ours) == 5 and not any(line.startswith("purged\t") for line in ours)
    assert sbom.parse_dpkg("\n".join(ours)) == sbom.parse_dpkg(real)


def test_records_come_from_the_store_and_from_a_container_only_when_it_cannot_serve(tmp_path, monkeypatch):
    from stackforge.builder.records import imagerecords
    from stackforge.clients import layerstore

    gate = imagerecords.GATE_FILES[0]
    served = ImageTree([_layer(tmp_path, "1", {f"{imagerecords.GATE_DIR}/{gate}": "PASS import torch\n\n"})])
    journal = {sbom.DPKG_QUERY[0]: "", sbom.DPKG_STATUS: "", f"{sbom.DPKG_UPDATES}/0001": "an unmerged entry"}
    refusing = ImageTree([_layer(tmp_path, "2", journal)])

    class _Store:
        def tree(self, image_id: str) -> ImageTree:
            if image_id == "sha256:elsewhere":
                raise Unusable("not in this store")
            return served if image_id == "sha256:served" else refusing

    containers: list[str] = []

    def from_container(engine: object, ref: str) -> dict[str, list[str]]:
        containers.append(ref)
        return {"container": [ref]}

    monkeypatch.setattr(layerstore, "open_store", lambda engine: _Store())
    monkeypatch.setattr(imagerecords, "from_container", from_container)
    assert imagerecords.read("engine", "img:served", "sha256:served")[gate] == ["PASS import torch"]
    assert containers == []
    for ref, image_id in (("img:none", None), ("img:elsewhere", "sha256:elsewhere"), ("img:journal", "sha256:j")):
        assert imagerecords.read("engine", ref, image_id) == {"container": [ref]}
    assert containers == ["img:none", "img:elsewhere", "img:journal"]  # the dpkg journal: dpkg-query must merge
