"""The build context's files have one mode rule and one time (builder/sources/contextfiles.py), whatever the umask, clock,
time zone and checkout time of the host that wrote them: COPY keeps both in the image, and a module imported from a
copied file records its time in its bytecode."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest

from stackforge.builder.context.context import assemble
from stackforge.builder.context.prepare import BaseImage, EngineFacts, prepare_dockerfile
from stackforge.builder.plan.plan import EPOCH_LABEL
from stackforge.builder.plan.render import SOURCE_IMAGES, images_dir, templates_digest
from stackforge.builder.sources import reuse
from stackforge.builder.sources.contextfiles import CONTEXT_TIME, context_time, normalize_tree
from stackforge.builder.sources.sources import SourceInfo
from stackforge.stack.load import load
from tests.fixtures.hostcopy import copy_as_checkout, listing, seconds

REPO = Path(__file__).resolve().parents[2]
CHECKED_OUT = 1546300800  # 2019-01-01: another host's checkout time
BASE_EPOCH = 1_706_933_106  # the base image's creation time: the layer epoch


@contextlib.contextmanager
def another_host(monkeypatch):
    """Umask 077, another time zone and locale (the process's own: os.umask is process-wide)."""
    old = os.umask(0o077)
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    monkeypatch.setenv("LC_ALL", "C")
    time.tzset()
    try:
        yield
    finally:
        os.umask(old)
        monkeypatch.undo()
        time.tzset()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_rule_sets_modes_and_times_and_leaves_links_targets_kept_and_skipped_trees(tmp_path):
    top = tmp_path / "ctx"
    (top / "dir").mkdir(parents=True)
    (top / "dir" / "plain").write_text("a\n")
    (top / "dir" / "script").write_text("#!/bin/sh\n")
    (top / "setid").write_text("x\n")
    (top / "files").mkdir()
    (top / "files" / "declared").write_text("secret\n")
    (top / "mirror").mkdir()
    (top / "mirror" / "wheel").write_text("w\n")
    (top / "link").symlink_to("dir/plain")
    os.chmod(top / "dir" / "plain", 0o600)
    os.chmod(top / "dir" / "script", 0o700)
    os.chmod(top / "setid", 0o4775)
    os.chmod(top / "files" / "declared", 0o600)
    os.chmod(top / "mirror" / "wheel", 0o600)
    os.chmod(top / "dir", 0o700)
    os.utime(top / "mirror" / "wheel", (CHECKED_OUT, CHECKED_OUT))

    normalize_tree(top, mtime=CONTEXT_TIME, skip=["mirror"], keep_modes=["files"])

    assert mode(top) == mode(top / "dir") == mode(top / "files") == 0o755
    assert mode(top / "dir" / "plain") == 0o644
    assert mode(top / "dir" / "script") == 0o755
    assert mode(top / "setid") == 0o755  # the owner may execute it; set-id dropped
    assert mode(top / "files" / "declared") == 0o600  # its mode is declared, kept
    for path in (top, top / "dir", top / "dir" / "plain", top / "files" / "declared", top / "link"):
        assert path.lstat().st_mtime_ns // 10**9 == CONTEXT_TIME, path
    assert top.lstat().st_mtime_ns == CONTEXT_TIME * 10**9  # a directory: the whole second
    assert os.readlink(top / "link") == "dir/plain"
    wheel = (top / "mirror" / "wheel").lstat()  # the mirror's files are linked, never copied into a layer
    assert (stat.S_IMODE(wheel.st_mode), wheel.st_mtime) == (0o600, CHECKED_OUT)


def test_a_changed_file_of_the_same_size_gets_another_time(tmp_path):
    """BuildKit keeps, from the last context of the same directory name, each file whose size, mode and time are
    unchanged: the fraction of a second follows the bytes, so a changed file is sent again."""
    times = []
    for text in ("tag=repro-aaaa\n", "tag=repro-bbbb\n", "tag=repro-aaaa\n"):
        top = tmp_path / str(len(times)) / "context"
        top.mkdir(parents=True)
        (top / "overrides.json").write_text(text)
        normalize_tree(top, mtime=BASE_EPOCH)
        times.append((top / "overrides.json").stat().st_mtime_ns)
    assert times[0] != times[1] and times[0] == times[2]  # other bytes, another time; the same bytes, the same
    assert {t // 10**9 for t in times} == {BASE_EPOCH}


def _other_host_root(tmp_path: Path) -> Path:
    """A repository as a host under umask 077 checked it out in 2019: its stacks and its own images/."""
    root = tmp_path / "other"
    root.mkdir()
    copy_as_checkout(REPO / "stacks", root / "stacks", umask=0o077, mtime=CHECKED_OUT)
    copy_as_checkout(SOURCE_IMAGES, root / "images", umask=0o077, mtime=CHECKED_OUT, ignore=["__pycache__"])
    return root


@pytest.mark.parametrize("stack", ["post2", "example"])
def test_a_context_written_under_umask_077_at_another_time_is_the_same(tmp_path, stack, monkeypatch):
    here = assemble(load(stack, root=REPO), tmp_path / "here", sources=False, base_epoch=BASE_EPOCH)
    with another_host(monkeypatch):
        other_root = _other_host_root(tmp_path)
        assert images_dir(other_root) == other_root / "images"
        assert mode(other_root / "images" / "gate" / "gate.py") == 0o600
        other = assemble(load(stack, root=other_root), tmp_path / "there", sources=False, base_epoch=BASE_EPOCH)

    want = listing(here.context_dir)
    assert listing(other.context_dir) == want
    assert seconds(want) == {("0o644", BASE_EPOCH), ("0o755", BASE_EPOCH)}
    assert here.files_time == other.files_time == BASE_EPOCH
    for rel, _, _ in want:
        a, b = here.context_dir / rel, other.context_dir / rel
        assert a.is_dir() or a.read_bytes() == b.read_bytes(), rel
    # Executable by the rule (apt-layer.sh is 100755 in git), not by the umask.
    if stack == "post2":
        assert mode(other.context_dir / "system" / "apt-layer.sh") == 0o755
        assert mode(other.context_dir / "deps" / "vendor-pins.json") == 0o644


def test_the_context_is_dated_the_layer_epoch_the_labels_name(tmp_path):
    facts = EngineFacts(BaseImage("sha256:" + "d" * 64, "sha256:" + "e" * 64, created="2024-02-03T04:05:06.5Z"), True)
    prepared = prepare_dockerfile(
        load("example", root=REPO), out=tmp_path / "out", sources=False, engine_facts=lambda: facts
    )
    epoch = int(prepared.labels[EPOCH_LABEL])
    assert epoch == BASE_EPOCH and prepared.ctx.files_time == epoch
    assert {t for _, t in seconds(listing(prepared.ctx.context_dir))} == {epoch}
    # A base that records no creation time: the fixed time, never the sources' (or the host's clock).
    assert context_time(None) == context_time(0) == CONTEXT_TIME == 946684800
    bare = assemble(load("example", root=REPO), tmp_path / "bare", sources=False)
    assert {t for _, t in seconds(listing(bare.context_dir))} == {CONTEXT_TIME}


def test_the_templates_digest_names_the_templates_not_the_umask(tmp_path):
    other_root = _other_host_root(tmp_path)
    assert templates_digest(other_root / "images") == templates_digest(SOURCE_IMAGES)
    os.chmod(other_root / "images" / "system" / "apt-layer.sh", 0o600)  # the executable bit is the templates'
    assert templates_digest(other_root / "images") != templates_digest(SOURCE_IMAGES)


class Exporter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, dest: Path) -> SourceInfo:
        self.calls += 1
        (dest / "pkg").mkdir(parents=True)
        (dest / "pkg" / "__init__.py").write_text("X = 1\n")
        (dest / "build.sh").write_text("#!/bin/sh\n")
        os.chmod(dest / "build.sh", 0o700)
        return SourceInfo("markupsafe", "sdist", "markupsafe==3.0.3@sha256:x", series_hash="sha256:s", patches=["p"])


def test_an_exported_tree_is_recorded_normalized_and_reused_under_umask_077(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    loaded, export = load("example", root=root), Exporter()
    bdir = root / "build" / "example"
    with another_host(monkeypatch):
        for _ in range(2):
            staging = bdir / ".context-x.partial"
            reuse.exported(loaded, "markupsafe", staging, bdir / "context", export)
            shutil.rmtree(bdir / "context", ignore_errors=True)
            staging.rename(bdir / "context")
    assert export.calls == 1  # the second round found the recorded tree unchanged
    tree = bdir / "context" / "src" / "markupsafe"
    assert [m for _, m, _ in listing(tree)] == ["0o755", "0o755", "0o755", "0o644"]  # times: the whole context's


_RUN_SCRIPT = re.compile(r"(PYTHONDONTWRITEBYTECODE=1 )?python (-B )?/stackforge/\S*?([A-Za-z_]+)\.py\b")
_SCRIPTS = {p.stem: p for p in SOURCE_IMAGES.rglob("*.py")}


def _imports_a_shipped_module(script: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names & set(_SCRIPTS)


@pytest.mark.parametrize("golden", sorted((REPO / "tests" / "unit" / "golden").glob("dockerfile_*.txt")))
def test_no_build_helper_leaves_bytecode_of_a_copied_module(golden):
    """A module a build step imports from a copied file would be compiled with a timestamp header (the import system
    does not look at SOURCE_DATE_EPOCH): every helper that imports one of stackforge's shipped modules runs with
    ``python -B`` or PYTHONDONTWRITEBYTECODE=1."""
    runs = [m for m in _RUN_SCRIPT.finditer(golden.read_text()) if m.group(3) in _SCRIPTS]
    assert any(_imports_a_shipped_module(_SCRIPTS[m.group(3)]) for m in runs)  # preserve.py imports localver
    for m in runs:
        if _imports_a_shipped_module(_SCRIPTS[m.group(3)]):
            assert m.group(1) or m.group(2), f"{golden.name}: {m.group(0)} would write bytecode into the image"
