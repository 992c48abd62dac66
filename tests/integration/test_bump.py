"""`stackforge bump` against the local indexes: post1 → post2 must reproduce the checked-in post2 pins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stackforge.builder.context import prepare
from stackforge.cli.main import main
from stackforge.stack.load import load, load_stack
from tests.fixtures.musa_index import build_wheels, index_dirs, serve
from tests.fixtures.stack_support import RootSpec

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_wheels(tmp_path_factory.mktemp("musa-wheels"))


@pytest.fixture
def root_spec() -> RootSpec:
    """A repository with only post1: the bump has to produce post2 by itself."""
    return RootSpec(stacks=("post1.yaml",))


def sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def test_bump_post1_reproduces_the_checked_in_post2(built, root, tmp_path, capsys):
    dirs = index_dirs(built, tmp_path / "index")
    with serve(*dirs) as (overrides, *_):
        code = main(["--root", str(root), "bump", "post1", "--name", "post2", "--no-cache", *sets(overrides)])
    out = capsys.readouterr().out
    assert code == 0, out
    written = root / "stacks" / "post2.yaml"
    ours, theirs = yaml.safe_load(written.read_text()), yaml.safe_load((REPO / "stacks" / "post2.yaml").read_text())
    assert ours["inherits"] == "post1"
    assert ours["packages"] == theirs["packages"]
    assert ours["description"] == theirs["description"]
    new, checked_in = load("post2", root=root), load_stack("post2", root=REPO)
    assert {n: p.version for n, p in new.model.packages.items()} == {
        n: p.version for n, p in checked_in.packages.items()
    }
    assert prepare.lint(new) == []
    assert "wrote stacks/post2.yaml (lint: ok)" in out
    # The pin table of the move, from `stackforge diff`.
    assert "| package | before | after | note |" in out
    assert "| torch | 2.11.0.post1+musa5.2.0 | 2.11.0.post2+musa5.2.0 |" in out
    assert "| deep_ep | 1.1.0+musa5.2.0torch2.11.0.post1 | 1.1.0+musa5.2.0torch2.11.0.post2 |" in out
    assert "move torchada: 0.1.83 -> 0.1.90 (minimum 0.1.90 with torch_musa >= 2.11.0.post2)" in out
    assert main(["--root", str(root), "lint", "post2"]) == 0


def test_bump_reports_the_missing_deep_ep_build_and_writes_nothing(built, root, tmp_path, capsys):
    dirs = index_dirs(built, tmp_path / "index", deep_ep_post2=False)
    with serve(*dirs) as (overrides, *_):
        code = main(["--root", str(root), "bump", "post1", "--name", "post2", "--no-cache", *sets(overrides)])
    cap = capsys.readouterr()
    assert code == 1
    assert (
        "missing: deep_ep: no build for torch 2.11.0.post2+musa5.2.0 on index 'mthreads' "
        "(wanted local label +musa5.2.0torch2.11.0.post2, cp310-cp310-linux_x86_64); "
        "builds exist for torch 2.11.0.post1"
    ) in cap.err
    assert not (root / "stacks" / "post2.yaml").exists()


def test_bump_only_post1_on_the_index_moves_nothing(built, root, tmp_path, capsys):
    dirs = index_dirs(built, tmp_path / "index", post2=False, deep_ep_post2=False, torchada=("0.1.83",))
    with serve(*dirs) as (overrides, *_):
        code = main(["--root", str(root), "bump", "post1", "--name", "post2", "--no-cache", *sets(overrides)])
    out = capsys.readouterr().out
    assert code == 0
    assert "train torch is already at its newest coherent release" in out
    assert "nothing to move; no file written" in out
    assert not (root / "stacks" / "post2.yaml").exists()


def test_dry_run_and_refusing_to_overwrite(built, root, tmp_path, capsys):
    dirs = index_dirs(built, tmp_path / "index")
    with serve(*dirs) as (overrides, *_):
        argv = ["--root", str(root), "bump", "post1", "--name", "post2", "--no-cache", *sets(overrides)]
        assert main([*argv, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "name: post2\ninherits: post1\n" in out and "torchada:    {version: 0.1.90}" in out
        assert not (root / "stacks" / "post2.yaml").exists()
        (root / "stacks" / "post2.yaml").write_text("# someone else's\n")
        assert main(argv) == 2
        assert "already exists" in capsys.readouterr().err
        assert (root / "stacks" / "post2.yaml").read_text() == "# someone else's\n"
        assert main([*argv, "--force"]) == 0
        assert "deep_ep:" in (root / "stacks" / "post2.yaml").read_text()
