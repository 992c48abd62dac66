"""`stackforge patches …` end to end: a stack whose upstream is a local git repository
made by the tests (standing in for GitHub), and the repository's own series."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from stackforge import patches as P
from stackforge.cli.main import main
from stackforge.clients.git import git
from tests.fixtures.gitrepo import build_scenario, copy_scenario, make_layer

REPO_ROOT = Path(__file__).resolve().parents[2]

STACK = """\
name: demo
description: a stack over a local upstream made by the tests
platform: {{os: debian12, python: "3.11", arch: x86_64}}
base: {{image: stackforge/base:bookworm}}
indexes:
  pypi: {{url: https://pypi.org/simple, role: public}}
upstreams:
  demo:
    git: ../upstream
    tag: v1.0
    commit: {commit}
    patches: patches/demo
packages:
  idna: {{version: "3.10", index: pypi}}
tags:
  local: "demo:1"
  publish: "demo:1-{{{{ date }}}}-r{{{{ revision }}}}"
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli-scenario")
    sc = build_scenario(base)
    root = sc.patches.parents[1]
    (root / "stacks").mkdir()
    (root / "stacks" / "demo.yaml").write_text(STACK.format(commit=sc.v1_0))
    P.write_index(P.read_series(sc.patches))
    return base, sc


@pytest.fixture
def env(template, tmp_path, monkeypatch):
    base, sc = template
    sc = copy_scenario(sc, base, tmp_path)
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    return sc, sc.patches.parents[1]


def run(root: Path, *argv: str, capsys) -> tuple[int, str, str]:
    code = main(["--root", str(root), "patches", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_apply_then_export_round_trip(env, tmp_path, capsys):
    sc, root = env
    code, out, err = run(root, "apply", "demo", capsys=capsys)
    dest = root / "build" / "patches" / "demo" / "demo"
    assert code == 0, err
    assert len(out.splitlines()) == 12 and all(line.startswith("clean") for line in out.splitlines())
    assert f"applied 12 patch(es) in {dest}" in err
    assert git(dest, "rev-list", "--count", f"{sc.v1_0}..HEAD").stdout.strip() == "12"
    code, out, _ = run(root, "export", "demo", "--from", str(dest), "--check", capsys=capsys)
    assert code == 0 and "no byte changed" in out
    code, out, _ = run(root, "export", "--check", capsys=capsys)
    assert code == 0 and "demo/demo: 12 patch(es) re-export byte-identically" in out
    code, _, err = run(root, "apply", "demo", capsys=capsys)
    assert code == 2 and "--force" in err
    code, _, err = run(root, "apply", "demo", "--force", capsys=capsys)  # its own tree: replaced
    assert code == 0, err
    series = sorted(p.name for p in (root / "patches").rglob("*"))
    for inside in (root / "patches", root):  # the series it reads, or the repository holding it
        code, _, err = run(root, "apply", "demo", "--force", "--to", str(inside), capsys=capsys)
        assert code == 2 and "would delete what it reads" in err
    assert sorted(p.name for p in (root / "patches").rglob("*")) == series
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep")
    code, _, err = run(root, "apply", "demo", "--force", "--to", str(notes), capsys=capsys)
    assert code == 2 and "not a tree `stackforge patches apply` made" in err
    assert (notes / "mine.txt").read_text() == "keep"


def test_conflict_prints_patch_file_line_hunk_and_the_resume_command_that_works(env, tmp_path, capsys):
    sc, root = env
    dest = tmp_path / "work"
    code, out, err = run(
        root,
        "apply",
        "demo",
        "--to",
        str(dest),
        "--set",
        f"upstreams.demo.commit={sc.conflict}",
        "--set",
        "upstreams.demo.tag=v1.0-conflict",
        capsys=capsys,
    )
    assert code == 1
    assert "fails" in out and sc.names[4] in out
    resume = f"stackforge patches apply demo --to {dest} --continue"
    for needle in (sc.names[4], "position 5 of 12", "file: src/kernels.c, line 9", "@@ -9,7 +9,7 @@", resume):
        assert needle in err
    assert (dest / P.STATE_FILE).is_file()
    text = (dest / "src" / "kernels.c").read_text()
    (dest / "src" / "kernels.c").write_text(
        re.sub(r"<<<<<<<.*?>>>>>>>[^\n]*\n", "    return musa_kernel_2(x);\n", text, flags=re.S)
    )
    git(dest, "add", "src/kernels.c")
    argv = shlex.split(resume)[2:]  # drop "stackforge patches"
    code, out, err = run(root, *argv, capsys=capsys)
    assert code == 0, err
    assert "resolved" in out and "applied 12 patch(es)" in err
    assert not (dest / P.STATE_FILE).exists()


def test_check_json_and_exit_codes(env, capsys):
    sc, root = env
    code, out, _ = run(root, "check", "demo", "--json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and data["ok"] and [p["status"] for p in data["patches"]] == ["clean"] * 12
    code, out, _ = run(root, "check", "demo", "--commit", sc.conflict, capsys=capsys)
    assert code == 1
    assert f"fails         5/12 {sc.names[4]}" in out and "src/kernels.c" in out
    code, out, _ = run(root, "check", "demo", "--commit", sc.v1_1, capsys=capsys)
    assert code == 0 and "2 upstreamed" in out and "2 offset" in out


def test_upstreamed_with_set_and_drop(env, capsys):
    sc, root = env
    code, out, _ = run(root, "upstreamed", "demo", "--to-commit", sc.v1_1, "--json", capsys=capsys)
    assert code == 0 and [u["name"] for u in json.loads(out)["upstreamed"]] == sc.upstreamed
    code, out, err = run(
        root,
        "upstreamed",
        "demo",
        "--set",
        f"upstreams.demo.commit={sc.v1_1}",
        "--set",
        "upstreams.demo.tag=v1.1",
        "--drop",
        capsys=capsys,
    )
    assert code == 0, err
    assert [line.split()[1] for line in out.splitlines()] == sc.upstreamed
    assert "dropped 2 patch(es)" in err
    assert len(P.read_series(sc.patches).names) == 10
    code, out, _ = run(root, "lint", capsys=capsys)
    assert code == 0
    code, _, err = run(root, "upstreamed", "demo", capsys=capsys)
    assert code == 2 and "--to-commit" in err


def test_export_check_fails_on_a_changed_patch_and_lint_on_a_tracker_id(env, capsys):
    sc, root = env
    p = sc.patches / sc.names[3]
    p.write_text(
        p.read_text().replace(
            "Say how to select the device in the guide.", "Say how to select the device (MUSA-100042)."
        )
    )
    code, out, _ = run(root, "lint", capsys=capsys)
    assert code == 1
    assert re.search(
        rf"{re.escape(sc.names[3])}:\d+: tracker-id: patch {re.escape(sc.names[3])}: internal tracker id 'MUSA-100042' in the commit message",
        out,
    )
    assert "index-stale" in out  # the README names the patch description
    code, out, _ = run(root, "lint", "--json", capsys=capsys)
    data = json.loads(out)
    assert {f["code"] for f in data["findings"]} == {"tracker-id", "index-stale"}
    assert data["count"] == len(data["findings"])
    code, out, _ = run(root, "index", "--check", capsys=capsys)
    assert code == 1 and "out of date" in out
    code, out, _ = run(root, "index", capsys=capsys)
    assert code == 0 and "wrote" in out
    p.write_text(
        p.read_text().replace(
            "+Select the musa device with --device musa.", "+Select the musa device with --device=musa."
        )
    )
    code, out, err = run(root, "export", "demo", "--check", capsys=capsys)
    assert code == 1 and f"changed: patches/demo/{sc.names[3]}" in out


def test_range_diff_hash_renumber_and_overlay(env, tmp_path, capsys):
    sc, root = env
    code, out, _ = run(root, "range-diff", "demo", "--from", sc.v1_0, "--to", sc.v1_1, capsys=capsys)
    assert code == 0
    dropped = [line.split()[1] for line in out.splitlines() if line.startswith("dropped")]
    assert dropped == sc.upstreamed
    code, out, _ = run(root, "hash", str(sc.patches), capsys=capsys)
    assert code == 0 and out.strip() == P.series_hash(sc.patches)
    layer = make_layer(sc, root, "jev")
    run(root, "index", capsys=capsys)
    code, out, _ = run(root, "apply", "demo", "--overlay", "jev", "--to", str(tmp_path / "layered"), capsys=capsys)
    assert code == 0 and out.splitlines()[-1].endswith("[jev]") and "15/15" in out.splitlines()[-1]
    # A hand-inserted base patch pushes the layered range up by one.
    (sc.patches / "0013-Extra-x.patch").write_bytes((sc.patches / sc.names[0]).read_bytes())
    (sc.patches / "series").write_text((sc.patches / "series").read_text() + "0013-Extra-x.patch\n")
    code, out, _ = run(root, "lint", capsys=capsys)
    assert code == 1 and "numbering" in out and "layer jev" in out
    code, out, _ = run(root, "renumber", str(sc.patches), str(layer), capsys=capsys)
    assert code == 0 and "0013-MUSA-diffusion-scheduler.patch -> 0014-MUSA-diffusion-scheduler.patch" in out
    assert [n[:4] for n in P.read_series(layer).names] == ["0014", "0015", "0016"]


def test_the_repository_own_series_lint_and_check(capsys):
    code = main(["--root", str(REPO_ROOT), "patches", "lint"])
    out, err = capsys.readouterr()
    assert code == 0, out
    code = main(["--root", str(REPO_ROOT), "patches", "export", "post1", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "post1: 0 patch(es) re-export byte-identically" in out
