"""Mirrors without an engine: the git part of post2's mirror (stand-in upstreams), read back offline once the
upstreams are gone; the PEP 503 pages; apt chains and the repository index; target phases' constraints; the refusals of an
offline build."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from stackforge.builder.mirror import apt, manifest, offline, toolchains
from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.resolve import Target
from stackforge.clients import upstream as sources
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.flows import mirror as make
from stackforge.fslock import file_sha256
from stackforge.stack.load import fingerprint, load, load_stack
from tests.fixtures import apt_repo
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


def test_apt_chains_run_each_targets_layers_after_the_stacks(tmp_path):
    root = make_root(tmp_path)
    plan = make_plan(load("post1", root=root, overrides=["system.os.install=never"]))
    chains = apt.chains(plan)
    assert [[s.name for s in c] for c in chains] == [["os", "musa", "vllm-omni.media"]]
    never = make_plan(
        load(
            "post1",
            root=root,
            overrides=[
                "system.os.install=never",
                "system.musa.install=never",
                "targets.vllm-omni.system.media.install=never",
            ],
        )
    )
    assert apt.chains(never) == []


def test_the_repository_index_names_each_deb_with_its_hash(tmp_path):
    deb = apt_repo._build_deb(apt_repo.Deb("libmthreads-mtml", "2.4.1-1"), tmp_path / "work", tmp_path)
    control = apt.deb_control(deb)
    assert "Package: libmthreads-mtml\nVersion: 2.4.1-1\n" in control
    repo = tmp_path / "repo"
    repo.mkdir()
    apt.write_index(repo, control + "Filename: pool/x.deb\n")
    packages = (repo / "Packages").read_bytes()
    assert f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages" in (repo / "Release").read_text()
    with pytest.raises(UserError, match="is not a Debian package"):
        (tmp_path / "bad.deb").write_bytes(b"not an archive")
        apt.deb_control(tmp_path / "bad.deb")


def test_a_target_phase_is_constrained_by_the_vendor_pins_and_earlier_repins(tmp_path):
    root = make_root(tmp_path)
    plan = make_plan(load("post1", root=root))
    omni = next(t for t in plan.target_stages if t.name == "vllm-omni")
    tilelang, phase = omni.pip[0], omni.pip[1]
    ctx = tmp_path / "ctx"
    (ctx / "deps").mkdir(parents=True)
    (ctx / "deps/vendor-pins.json").write_text(json.dumps({"torch": "2.9.0+musa", "tilelang_musa": "0.1.8+musa.1"}))
    for ph in omni.pip:
        (ctx / ph.requirements).parent.mkdir(parents=True, exist_ok=True)
        (ctx / ph.requirements).write_text("numpy<2\n-c /stackforge/targets/vllm-omni/omni.upstream-constraints.txt\n")
    (ctx / "targets/vllm-omni/omni.upstream-constraints.txt").write_text("idna<4\n")
    view = manifest.target_phase_view(plan, omni, phase, ctx, tmp_path / "v1")
    assert Path(view.constraints).read_text() == "tilelang-musa==0.1.8+musa.3\ntorch==2.9.0+musa\n"
    assert f"-c {ctx}/targets/vllm-omni/omni.upstream-constraints.txt" in Path(view.requirements).read_text()
    own = manifest.target_phase_view(plan, omni, tilelang, ctx, tmp_path / "v2")
    assert Path(own.constraints).read_text() == "torch==2.9.0+musa\n"  # its own re-pin is no constraint
    target = Target.of(load("post1", root=root).model)
    key = manifest.target_phase_key(view, target)
    again = manifest.target_phase_view(plan, omni, phase, ctx, tmp_path / "v3")  # another directory, the same key
    assert manifest.target_phase_key(again, target) == key
    (ctx / "targets/vllm-omni/omni.upstream-constraints.txt").write_text("idna<3\n")
    assert manifest.target_phase_key(manifest.target_phase_view(plan, omni, phase, ctx, tmp_path / "v4"), target) != key


def test_an_offline_build_refuses_a_mirror_of_other_inputs_and_another_stack(tmp_path):
    root = make_root(tmp_path)
    loaded = load("post1", root=root, overrides=["system.os.install=never"])
    plan = make_plan(loaded)
    data = manifest.empty("post1", fingerprint(loaded.model))
    data["parts"].append({"kind": "base", "path": "base/image.tar", "id": "sha256:" + "0" * 64, "sha256": "x"})
    data["apt"] = {"key": "sha256:other", "layers": [], "files": []}
    staging = tmp_path / "ctx"
    staging.mkdir()
    with pytest.raises(UserError) as exc:
        apt.apply(loaded, plan, tmp_path, data, staging, "fix")
    assert exc.value.message.startswith("system.musa: the mirror holds no apt packages for the system layers")
    kernel = next(k for k in plan.kernels if k.toolchain)
    with pytest.raises(UserError) as exc:
        toolchains.apply(loaded, plan, data, staging, "fix")
    assert exc.value.message == f"kernels.{kernel.name}.toolchain: the mirror holds no toolchain stage of this kernel"
    to = tmp_path / "mirror"
    to.mkdir()
    (to / manifest.MANIFEST).write_text(json.dumps(manifest.empty("post1", fingerprint(loaded.model))))
    other = load("post2", root=root)
    with pytest.raises(UserError) as exc:
        offline.upstream_cache(other, Workspace(lambda: root, mirror=to))
    assert "is the mirror of stack 'post1', not 'post2'" in exc.value.message
    with pytest.raises(UserError) as exc:
        manifest.read(tmp_path)
    assert "has no mirror.json" in exc.value.message


def test_the_mirror_never_writes_into_a_directory_of_other_files_or_its_inputs(tmp_path):
    root = make_root(tmp_path)
    loaded = load("post2", root=root)
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "apt").mkdir()
    (foreign / "apt" / "mine.deb").write_text("keep")
    for to, said in ((foreign, "did not write"), (root / "stacks", "would delete what it reads"), (root, "would delete")):  # fmt: skip
        with pytest.raises(UserError, match=said) as err:
            make.make_mirror(loaded, to, Workspace(lambda: root))
        assert err.value.file == "--to"
    assert (foreign / "apt" / "mine.deb").read_text() == "keep"
