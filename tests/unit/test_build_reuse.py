"""The rebuild skips (builder/sources/reuse.py): an upstream's patched tree and the image's records are reused only
when their inputs fingerprint (and the tree's digest, or the image id) prove them the same."""

from __future__ import annotations

import shutil
from pathlib import Path

from stackforge.builder.sources import reuse
from stackforge.builder.sources.sources import SourceInfo
from stackforge.stack.load import load

REPO = Path(__file__).resolve().parents[2]


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    return root


class Exporter:
    """Stands in for the export: writes a tree and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, dest: Path) -> SourceInfo:
        self.calls += 1
        (dest / "pkg").mkdir(parents=True)
        (dest / "setup.py").write_text("print('setup')\n")
        (dest / "pkg" / "__init__.py").write_text(f"EXPORT = {self.calls}\n")
        return SourceInfo("markupsafe", "sdist", "markupsafe==3.0.3@sha256:x", series_hash="sha256:s", patches=["p"])


def _round(root: Path, export: Exporter, overrides: list[str] | None = None, refresh: bool = False) -> SourceInfo:
    """One context assembly: export into a staging directory, then swap it in as the build's context."""
    loaded = load("example", root=root, overrides=overrides or [])
    bdir = root / "build" / "example"
    staging = bdir / ".context-x.partial"
    info = reuse.exported(loaded, "markupsafe", staging, bdir / "context", export, refresh=refresh)
    shutil.rmtree(bdir / "context", ignore_errors=True)
    staging.rename(bdir / "context")
    return info


def test_an_unchanged_upstream_is_not_exported_again(tmp_path):
    root, export = _root(tmp_path), Exporter()
    first = _round(root, export)
    second = _round(root, export)
    assert export.calls == 1
    assert second == first
    tree = root / "build" / "example" / "context" / "src" / "markupsafe"
    assert (tree / "pkg" / "__init__.py").read_text() == "EXPORT = 1\n"


def test_a_changed_patch_exports_again(tmp_path):
    root, export = _root(tmp_path), Exporter()
    _round(root, export)
    patch = next((root / "patches" / "markupsafe").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("+# A build that", "+# One build that", 1))
    _round(root, export)
    assert export.calls == 2


def test_a_changed_pin_exports_again(tmp_path):
    root, export = _root(tmp_path), Exporter()
    _round(root, export)
    _round(root, export, overrides=["upstreams.markupsafe.sdist.sha256=" + "ab" * 32])
    assert export.calls == 2


def test_a_tree_changed_since_its_record_is_exported_again(tmp_path):
    root, export = _root(tmp_path), Exporter()
    _round(root, export)
    tree = root / "build" / "example" / "context" / "src" / "markupsafe"
    (tree / "setup.py").write_text("print('edited by hand')\n")
    _round(root, export)
    assert export.calls == 2
    assert (tree / "setup.py").read_text() == "print('setup')\n"


def test_refresh_exports_again(tmp_path):
    root, export = _root(tmp_path), Exporter()
    _round(root, export)
    _round(root, export, refresh=True)
    assert export.calls == 2


def test_the_export_code_is_part_of_the_fingerprint(tmp_path, monkeypatch):
    root, export = _root(tmp_path), Exporter()
    _round(root, export)
    monkeypatch.setattr(reuse, "_code_digest", lambda: "another stackforge")
    _round(root, export)
    assert export.calls == 2


class Reader:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"result.txt": ["PASS import  markupsafe", "gate result: PASS"], "inventory.json": ["{}"]}


def test_image_records_are_read_once_per_image_and_inputs(tmp_path):
    read = Reader()
    first = reuse.image_files("sha256:aaa", "sha256:in1", tmp_path, read)
    assert reuse.image_files("sha256:aaa", "sha256:in1", tmp_path, read) == first
    assert read.calls == 1
    reuse.image_files("sha256:bbb", "sha256:in1", tmp_path, read)  # another image: read it
    assert read.calls == 2
    reuse.image_files("sha256:bbb", "sha256:in2", tmp_path, read)  # other inputs: read again
    assert read.calls == 3
    reuse.image_files(None, "sha256:in2", tmp_path, read)  # no image id: nothing to key on
    assert read.calls == 4
