"""A no-op build answered from the record of the last gated build of the same inputs (builder/run/uptodate.py), and
every input change (or engine-side doubt) falling through to the full build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stackforge.builder.run.run as run
from stackforge.builder.plan.render import SOURCE_IMAGES
from stackforge.builder.run import uptodate
from stackforge.cli.main import main

REPO = Path(__file__).resolve().parents[2]
TAG, IMAGE, BASE, BASE_ID = (
    "stackforge-test/example:noop",
    "sha256:" + "a" * 64,
    "stackforge/base:bookworm",
    "sha256:" + "b" * 64,
)
CONFIG = "sha256:" + "c" * 64


@pytest.fixture
def rig(tmp_path, monkeypatch):
    """A repository copy, a fake full build (counts its runs, writes an evidence directory like the real one)
    and a fake engine (tag → image id) for the up-to-date check's one ``docker image inspect``."""
    root = tmp_path / "repo"
    for tree in ("stacks", "patches", "images"):
        source = SOURCE_IMAGES if tree == "images" else REPO / tree
        shutil.copytree(source, root / tree, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    engine = {TAG: IMAGE, BASE: BASE_ID}
    runs: list[str] = []

    def fake_build(loaded, opts, workspace=None):
        evidence = root / "build" / loaded.name / "evidence" / f"20260101T000000Z-{len(runs) + 1:03d}"
        evidence.mkdir(parents=True)
        outcome = run.BuildOutcome(loaded.name, "example", TAG, IMAGE, evidence, ["gate result: 7 PASS, 0 FAIL"], 9.5)
        # as on the containerd store: the label names the base's config, the engine names it by its manifest
        labels = {"org.opencontainers.image.base.name": loaded.model.base.image, "org.stackforge.base.id": CONFIG}
        base = {"image": loaded.model.base.image, "id": CONFIG, "engine_id": BASE_ID}
        (evidence / "inputs.json").write_text(json.dumps({"labels": labels, "base": base}))
        (evidence / "result.json").write_text(
            json.dumps({"ok": True, "image_id": IMAGE, "build_id": evidence.name, "tag": TAG})
        )
        runs.append(evidence.name)
        return outcome

    monkeypatch.setattr(run, "build", fake_build)
    monkeypatch.setattr(
        uptodate,
        "_engine_ids",
        lambda refs, builder=None: [engine[r] for r in refs] if all(r in engine for r in refs) else None,
    )
    return root, engine, runs


def build(capsys, root: Path, *extra: str) -> tuple[str, str]:
    capsys.readouterr()
    assert main(["--root", str(root), "build", "example", "--set", f"tags.local={TAG}", *extra]) == 0
    return capsys.readouterr()


def test_an_identical_build_answers_from_the_record(rig, capsys):
    root, _, runs = rig
    out, err = build(capsys, root)
    assert runs == ["20260101T000000Z-001"] and out == f"{TAG}\n" and "gate result: 7 PASS" in err
    again, note = build(capsys, root)
    assert runs == ["20260101T000000Z-001"] and again == out  # no build, the same stdout
    assert "up to date" in note and "evidence of build 20260101T000000Z-001" in note
    as_json, _ = build(capsys, root, "--json")  # another key: the full build, then its own record
    assert len(runs) == 2 and json.loads(as_json)["image_id"] == IMAGE
    assert build(capsys, root, "--json")[0] == as_json and len(runs) == 2


def test_a_leases_device_uuid_does_not_change_the_answer(rig, capsys, monkeypatch):
    root, _, runs = rig
    build(capsys, root)
    monkeypatch.setenv("STACKFORGE_DEVICE_UUID", "d6a04b9f-fec2-2c87-aa03-a8360298e63b")  # smoke reads it, no build
    _, note = build(capsys, root)
    assert len(runs) == 1 and "up to date" in note
    monkeypatch.setenv("STACKFORGE_KEEP_BUILDS", "3")  # a variable a build does read
    build(capsys, root)
    assert len(runs) == 2


def _edit(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\n# changed\n")


@pytest.mark.parametrize(
    "change",
    [
        "stack byte",
        "patch byte",
        "template byte",
        "lock byte",
        "set value",
        "env var",
        "code mtime",
        "tag moved",
        "base re-tagged",
        "evidence deleted",
        "denied option",
    ],
)
def test_each_input_change_falls_through_to_the_full_build(rig, capsys, monkeypatch, change):
    root, engine, runs = rig
    build(capsys, root)
    extra: list[str] = []
    if change == "stack byte":
        _edit(root / "stacks" / "example.yaml")
    elif change == "patch byte":
        _edit(next((root / "patches" / "markupsafe").glob("*.patch")))
    elif change == "template byte":
        _edit(root / "images" / "Dockerfile.j2")
    elif change == "lock byte":
        _edit(next((root / "stacks" / "locks" / "example").iterdir()))
    elif change == "set value":
        extra = ["--set", "description=another"]
    elif change == "env var":
        monkeypatch.setenv("DOCKER_CONTEXT", "elsewhere")
    elif change == "code mtime":
        module = Path(uptodate.__file__)
        st = module.stat()
        os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        try:
            build(capsys, root)
        finally:
            os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert len(runs) == 2
        return
    elif change == "tag moved":
        engine[TAG] = "sha256:" + "c" * 64
    elif change == "base re-tagged":
        engine[BASE] = "sha256:" + "d" * 64
    elif change == "evidence deleted":
        shutil.rmtree(root / "build" / "example" / "evidence" / runs[0])
    elif change == "denied option":
        extra = ["--refresh"]
    build(capsys, root, *extra)
    assert len(runs) == 2, change
    if change not in ("tag moved", "base re-tagged", "evidence deleted", "denied option"):
        build(capsys, root, *extra)  # the new inputs' own record answers next time
        assert len(runs) == 2, change


def test_a_no_cache_build_always_builds_and_records_for_a_plain_one(rig, capsys):
    """--no-cache (and --refresh) change how a build runs, not what it makes: they never answer from a record,
    and what they built answers the same build without them."""
    root, _, runs = rig
    out, _ = build(capsys, root, "--no-cache")
    build(capsys, root, "--no-cache")
    assert len(runs) == 2  # never answered
    again, note = build(capsys, root)
    assert len(runs) == 2 and again == out and "evidence of build 20260101T000000Z-002" in note
    build(capsys, root, "--refresh")
    assert len(runs) == 3


def test_an_unknown_option_allows_no_answer(rig, capsys):
    root, _, _ = rig
    from stackforge.cli.main import build_parser

    args = build_parser().parse_args(["--root", str(root), "build", "example"])
    assert uptodate.key(args, root, None) is not None
    args.brand_new_option = 1
    assert uptodate.key(args, root, None) is None
    args = build_parser().parse_args(["--root", str(root), "build", "example", "--no-cache"])
    assert uptodate.key(args, root, None) is None


def test_the_answer_imports_no_library(rig, capsys, tmp_path):
    """A fresh interpreter answering a recorded build imports neither the model nor Jinja nor the docker SDK."""
    root, _, _ = rig
    build(capsys, root)
    probe = (
        "import json, sys\n"
        "from stackforge.builder.run import uptodate\n"
        "uptodate._engine_ids = lambda refs, builder=None: [" + repr(IMAGE) + ", " + repr(BASE_ID) + "]\n"
        "from stackforge.cli.main import main\n"
        f"rc = main(['--root', {str(root)!r}, 'build', 'example', '--set', 'tags.local={TAG}'])\n"
        "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "tools")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert proc.stdout.splitlines()[0] == TAG and result["rc"] == 0 and "up to date" in proc.stderr
    heavy = [
        m
        for m in result["modules"]
        if m.split(".")[0] in ("pydantic", "pydantic_core", "jinja2", "docker", "yaml")
        or m.startswith(("stackforge.stack.model", "stackforge.stack.load", "stackforge.clients.engine"))
    ]
    assert heavy == []
