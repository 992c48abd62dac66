"""Mirrors without an engine: the git part of post2's mirror (stand-in upstreams), read back offline once the
upstreams are gone; the PEP 503 pages; the refusals of an offline build."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stackforge.build import sources
from stackforge.build.plan import make_plan
from stackforge.errors import UserError
from stackforge.fslock import file_sha256
from stackforge.mirror import make, manifest, offline
from stackforge.stack.load import fingerprint, load, load_stack
from stackforge.workspace import Workspace
from tests.fixtures import musa_standins as ms
from tests.fixtures.stack_support import make_root

REPO = Path(__file__).resolve().parents[2]


def test_git_upstreams_are_mirrored_and_read_back_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    root = make_root(tmp_path)
    upstreams = tmp_path / "upstreams"
    repos = ms.make_upstreams(upstreams, load_stack("post2", root=REPO))
    pins = [(f"upstreams.{n}.git=file://{r.path}", f"upstreams.{n}.commit={r.commit}") for n, r in repos.items()]
    loaded = load("post2", root=root, overrides=[s for pair in pins for s in pair])
    stack, ws, to = loaded.model, Workspace(lambda: root), tmp_path / "mirror"
    data = manifest.empty(stack.name, fingerprint(stack))
    make._git(loaded, to, data, ws)
    parts = {p["upstream"]: p for p in data["parts"]}
    assert set(parts) == set(repos)
    for name, repo in repos.items():
        up = stack.upstreams[name]
        assert parts[name]["commit"] == repo.commit and parts[name]["source"] == f"file://{repo.path}"
        assert make._holds(to / "git" / f"{name}.git", up.tag, repo.commit)
    assert "mirror vllm v" in capsys.readouterr().err
    make._git(loaded, to, data, ws)  # again: every pin is there, nothing is pushed
    assert "mirror vllm" not in capsys.readouterr().err
    manifest.write(to, data)
    shutil.move(upstreams, tmp_path / "gone")  # every upstream is unreachable from here on
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "empty-cache"))
    view = offline.upstream_cache(loaded, Workspace(lambda: root, mirror=to))
    for name, repo in repos.items():
        up = stack.upstreams[name]
        spec = sources.UpstreamSpec(git=up.git, tag=up.tag, commit=up.commit, name=name)
        repo_dir = sources.fetch_upstream(spec, view, root=root, offline=True)
        tree = sources.export_commit(repo_dir, repo.commit, tmp_path / "export" / name)
        assert any(tree.iterdir())


def test_pages_link_each_file_with_its_hash(tmp_path):
    files = tmp_path / "pypi" / "files"
    files.mkdir(parents=True)
    (files / "Foo_Bar-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (files / "foo_bar-1.0.tar.gz").write_bytes(b"sdist")
    (files / "notes.txt").write_text("not a distribution")
    manifest.write_simple(tmp_path / "pypi", {})
    assert (tmp_path / "pypi/simple/index.html").read_text().count("<a ") == 1
    page = (tmp_path / "pypi/simple/foo-bar/index.html").read_text()
    wheel = file_sha256(files / "Foo_Bar-1.0-py3-none-any.whl")
    assert f'href="../../files/Foo_Bar-1.0-py3-none-any.whl#sha256={wheel}"' in page
    assert "foo_bar-1.0.tar.gz#sha256=" in page and "notes.txt" not in page


def test_an_offline_build_refuses_what_a_mirror_cannot_hold_and_another_stack(tmp_path):
    root = make_root(tmp_path)
    loaded = load("post1", root=root)
    keys = [item["key"] for item in make.not_mirrored(loaded)]
    assert "system.os" in keys and "system.musa" in keys
    assert any(k.startswith("kernels.") and k.endswith(".toolchain") for k in keys) == any(
        k.toolchain for k in make_plan(loaded).kernels
    )
    to = tmp_path / "mirror"
    to.mkdir()
    (to / manifest.MANIFEST).write_text(json.dumps(manifest.empty("post1", fingerprint(loaded.model))))
    with pytest.raises(UserError) as exc:
        offline.refuse_unmirrored(loaded, to)
    assert exc.value.message.startswith("system.os: cannot be built offline: apt packages are not mirrored")
    other = load("post2", root=root)
    with pytest.raises(UserError) as exc:
        offline.upstream_cache(other, Workspace(lambda: root, mirror=to))
    assert "is the mirror of stack 'post1', not 'post2'" in exc.value.message
    with pytest.raises(UserError) as exc:
        manifest.read(tmp_path)
    assert "has no mirror.json" in exc.value.message
