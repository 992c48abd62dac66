"""The example stack built for real with BuildKit: gate lines, labels, tag, layer caching, a failing pin."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.fixtures import run_names

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.engine


def make_root(tmp: Path) -> Path:
    """A private copy of the repository's stacks and patches, so each test owns its build/ dir."""
    root = tmp / "repo"
    root.mkdir()
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    return root


def stackforge(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"stackforge {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def steps(log: str) -> dict[str, bool]:
    """BuildKit plain progress → {"[stage n/m] INSTRUCTION": cached?}."""
    names: dict[str, str] = {}
    cached: dict[str, bool] = {}
    for line in log.splitlines():
        m = re.match(r"^#(\d+) (\[[^\]]+\] .*)$", line)
        if m and m.group(1) not in names:
            names[m.group(1)] = m.group(2)
            cached.setdefault(m.group(2), False)
        m = re.match(r"^#(\d+) CACHED$", line)
        if m and m.group(1) in names:
            cached[names[m.group(1)]] = True
    return cached


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


def image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory, base_image):
    root = make_root(tmp_path_factory.mktemp("example"))
    tag = run_names.image("example", "built")
    proc = stackforge(root, "build", "example", "--set", f"tags.local={tag}")
    return root, tag, proc


def test_example_image_is_gated_labelled_and_tagged(built):
    root, tag, proc = built
    assert proc.stdout.strip().splitlines()[-1] == tag
    result = json.loads((root / "build" / "example" / "evidence" / "latest" / "result.json").read_text())
    assert docker("image", "inspect", tag, "--format", "{{.Id}}").strip() == result["image_id"]  # the tag names it
    gate = (root / "build" / "example" / "evidence" / "latest" / "gate.txt").read_text().splitlines()
    assert gate[0] == f"PASS machine {platform.machine()}"  # the gate ran on this host's architecture
    assert re.fullmatch(r"PASS python +version=3\.11\.\d+ platform=3\.11", gate[1]), gate[1]
    assert gate[2:] == [
        "PASS import setuptools version=80.9.0",
        "PASS import packaging  version=25.0",
        "PASS import idna       version=3.10",
        "PASS import markupsafe version=3.0.3",
        "PASS probe  speedups-compiled result=compiled",
        "PASS pip    check      No broken requirements found.",
        "gate result: 8 PASS, 0 FAIL",
    ]
    readonly = (root / "build" / "example" / "evidence" / "latest" / "gate-readonly.txt").read_text()
    assert "read-only: gate result: 5 PASS, 0 FAIL" in readonly  # the machine and four imports
    labels = json.loads(docker("image", "inspect", tag, "--format", "{{json .Config.Labels}}"))
    assert labels["org.stackforge.pin.setuptools"] == "80.9.0"
    assert labels["org.stackforge.pin.idna"] == "3.10"
    assert labels["org.stackforge.stack"] == "example"
    assert labels["org.opencontainers.image.version"] == "3.0.3"
    assert labels["org.opencontainers.image.base.name"] == "stackforge/base:bookworm"
    # The local base has no registry digest: its image id is recorded, no manifest digest is invented.
    assert "org.opencontainers.image.base.digest" not in labels
    assert (
        labels["org.stackforge.base.id"]
        == docker("image", "inspect", "stackforge/base:bookworm", "--format", "{{.Id}}").strip()
    )
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", labels["org.stackforge.series.markupsafe"])
    inputs = json.loads((root / "build" / "example" / "evidence" / "latest" / "inputs.json").read_text())
    assert labels["org.stackforge.fingerprint"] == inputs["fingerprint"]
    assert labels["org.stackforge.inputs"] == inputs["inputs_fingerprint"]
    assert set(inputs["locks"]) == {"pypi"}
    # An sdist upstream's time is when its release was packed (its newest member); the layer epoch is the base
    # image's creation time, and every stage that runs a step declares it as SOURCE_DATE_EPOCH.
    created = _dt.datetime.fromtimestamp(inputs["source_date_epoch"], _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert labels["org.opencontainers.image.created"] == created and created.startswith("2025-")
    base_created = docker("image", "inspect", "stackforge/base:bookworm", "--format", "{{.Created}}").strip()
    epoch = int(labels["org.stackforge.epoch"])
    assert _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") == base_created[:19]
    dockerfile = (root / "build" / "example" / "Dockerfile").read_text()
    assert f"ARG SOURCE_DATE_EPOCH={epoch}\n" in dockerfile
    # The patch is in the image: the build fails without compiled speedups, and the target runs.
    out = subprocess.run(["docker", "run", "--rm", "-i", tag], input="<a & b>", capture_output=True, text=True)
    assert out.stdout == "&lt;a &amp; b&gt;"
    evidence = sorted(p.name for p in (root / "build" / "example" / "evidence" / "latest").iterdir())
    for name in ("Dockerfile", "build.log", "gate.txt", "inputs.json", "result.json"):
        assert name in evidence


def test_build_prints_only_the_result_on_stdout(built):
    root, tag, proc = built
    assert proc.stdout == f"{tag}\n"  # `$(stackforge build example)` is the tag
    assert re.search(r"^#\d+ \[", proc.stderr, re.M), proc.stderr[-2000:]  # BuildKit's plain log
    assert "stackforge: resolve base image stackforge/base:bookworm" in proc.stderr
    assert f"stackforge: build {tag} with BuildKit" in proc.stderr
    again = stackforge(root, "build", "example", "--set", f"tags.local={tag}", "--json")
    outcome = json.loads(again.stdout)
    assert outcome["tag"] == tag and outcome["stack"] == "example" and outcome["gate"][-1].startswith("gate result:")
    assert re.search(r"^#\d+ ", again.stderr, re.M)


def test_a_no_op_rebuild_answers_from_the_record_and_a_patch_edit_builds(built):
    root, tag, proc = built
    evidence = root / "build" / "example" / "evidence"
    before = sorted(p.name for p in evidence.iterdir())
    image = docker("image", "inspect", tag, "--format", "{{.Id}}").strip()
    again = stackforge(root, "build", "example", "--set", f"tags.local={tag}")
    assert again.stdout == proc.stdout  # what the full build printed
    assert "up to date" in again.stderr and not re.search(r"^#\d+ ", again.stderr, re.M)  # no BuildKit run
    assert sorted(p.name for p in evidence.iterdir()) == before  # no new evidence directory
    patch = next((root / "patches" / "markupsafe").glob("0001-*.patch"))
    text = patch.read_text()
    patch.write_text(text.replace("+# A build that must ship", f"+# A build ({uuid.uuid4().hex[:8]}) that must ship"))
    try:
        edited = stackforge(root, "build", "example", "--set", f"tags.local={tag}")
        assert "up to date" not in edited.stderr and re.search(r"^#\d+ ", edited.stderr, re.M)
        assert docker("image", "inspect", tag, "--format", "{{.Id}}").strip() != image
    finally:
        patch.write_text(text)
    # The original inputs again: the record's tag now names another image, so the build runs (from cache).
    back = stackforge(root, "build", "example", "--set", f"tags.local={tag}")
    assert "up to date" not in back.stderr and back.stdout == proc.stdout
    assert docker("image", "inspect", tag, "--format", "{{.Id}}").strip() == image


def test_verify_checks_labels_pins_and_reruns_the_gate(built):
    root, tag, _ = built
    ok = stackforge(root, "verify", tag, "--set", f"tags.local={tag}")
    lines = ok.stdout.splitlines()
    assert "PASS pin     idna       label=3.10 stack=3.10" in lines
    assert any(l.startswith("PASS fingerprint") for l in lines)
    assert "  PASS probe  speedups-compiled result=compiled" in lines
    # one line of what it checked, the last: the kinds, the pins by name, the gate's lines, the record's none
    assert lines[-1].startswith(f"verified {tag} against example: labels, ") and lines[-1].endswith(" — 0 failed")
    pins = len({l.split()[2] for l in lines if l.startswith("PASS pin ")})
    assert f", {pins} pins, " in lines[-1] and ", fingerprint, gate " in lines[-1]
    assert ", read-only gate, tests: none recorded, smoke: none recorded — " in lines[-1]
    # Checked against another declaration, the pins and the fingerprint disagree: exit 1, each named.
    bad = stackforge(
        root, "verify", tag, "--set", f"tags.local={tag}", "--set", "packages.idna.version=3.9", check=False
    )
    assert bad.returncode == 1
    assert "FAIL pin     idna       label=3.10 stack=3.9" in bad.stdout
    assert "FAIL import idna       expected=3.9 found=3.10" in bad.stdout
    assert bad.stdout.splitlines()[-1].startswith(f"NOT verified {tag} against example: labels, ")
    assert bad.stdout.splitlines()[-1].endswith("— 3 failed") and " pins (FAILED)" in bad.stdout


def test_patch_change_reruns_src_and_kernels_but_not_deps(built, tmp_path):
    root, tag, _ = built
    patch = next((root / "patches" / "markupsafe").glob("0001-*.patch"))
    text = patch.read_text()
    assert "+# A build that must ship the C speedups" in text
    # A change never built before (BuildKit's cache outlives this test), same line count.
    token = uuid.uuid4().hex[:8]
    patch.write_text(
        text.replace("+# A build that must ship the C speedups", f"+# A build ({token}) that must ship the C speedups")
    )
    stackforge(root, "build", "example", "--set", f"tags.local={tag}-2")
    log = (root / "build" / "example" / "evidence" / "latest" / "build.log").read_text()
    result = steps(log)
    deps = {
        k: v
        for k, v in result.items()
        if k.startswith(("[deps ", "[base ", "[buildenv-markupsafe ")) and re.search(r"\] (RUN|COPY) ", k)
    }
    assert deps and all(deps.values()), f"dependency steps re-ran after a patch change: {deps}"
    # The kernel builds in its own environment (build_requires: [setuptools]), which a patch leaves as it was.
    assert any(k.startswith("[buildenv-markupsafe ") and "pip install" in k for k in deps), deps
    # The image's history names deps' steps, never the build environment's or the kernel's.
    history = subprocess.run(
        ["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", f"{tag}-2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "preserve.py --phase pypi" in history and "buildenv-markupsafe" not in history, history
    assert "MARKUPSAFE_REQUIRE_SPEEDUPS" not in history, history
    # The gate's own steps, never the read-only gate's that runs beside it on the same parent.
    assert "python /stackforge/gate/gate.py /stackforge/gate/gate.json" in history, history
    assert "gate.py --read-only" not in history and "/stackforge/gate/inventory.py" in history, history
    rerun = [k for k, v in result.items() if not v]
    assert any(k.startswith("[src-markupsafe ") for k in rerun), rerun
    assert any(k.startswith("[kernel-markupsafe ") and " RUN " in f" {k} " for k in rerun), rerun
    # The patch changed a comment of setup.py, which no wheel file carries, and the kernel builds its wheel with
    # SOURCE_DATE_EPOCH (the layer epoch): the same wheel, byte for byte, so nothing after the kernel re-runs.
    installed = [k for k in result if k.startswith("[gate-env ") and "pip install --no-index" in k]
    gate = [k for k in result if k.startswith("[gate ") and "gate.py" in k]
    assert installed and gate and all(result[k] for k in installed + gate), result


def test_stale_lock_stops_before_the_build(built):
    root, _, _ = built
    bad = run_names.image("example", "stale")
    proc = stackforge(
        root, "build", "example", "--set", f"tags.local={bad}", "--set", "packages.idna.version=3.9", check=False
    )
    assert proc.returncode == 2
    errors = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("stackforge: "))  # progress
    line = next(
        i
        for i, l in enumerate((root / "stacks/locks/example/pypi.txt").read_text().splitlines(), 1)
        if l.startswith("idna==")
    )
    assert errors.startswith(f"error: stacks/locks/example/pypi.txt:{line}: lock file is stale: idna is pinned at 3.9")
    assert "fix: run: stackforge lock example" in proc.stderr
    assert not image_exists(bad)


def test_hash_mismatch_fails_the_build_and_tags_nothing(built):
    root, _, _ = built
    bad = run_names.image("example", "badhash")
    lock = root / "stacks" / "locks" / "example" / "pypi.txt"
    good = lock.read_text()
    first = re.search(r"idna==3\.10 \\\n    --hash=sha256:([0-9a-f]{64})", good).group(1)
    second = re.findall(r"--hash=sha256:([0-9a-f]{64})", good.split("idna==3.10", 1)[1])[1]
    lock.write_text(good.replace(first, "0" * 64).replace(second, "1" * 64))
    try:
        proc = stackforge(root, "build", "example", "--set", f"tags.local={bad}", check=False)
    finally:
        lock.write_text(good)
    assert proc.returncode == 1
    assert "DO NOT MATCH THE HASHES" in proc.stderr
    assert "no image was tagged" in proc.stderr
    assert not image_exists(bad)


def test_pin_that_does_not_match_the_install_fails_and_tags_nothing(built):
    root, tag, _ = built
    bad = run_names.image("example", "mismatch")
    # This case changes the public pins, so it runs without the lock file (and says so: lock=false).
    shutil.rmtree(root / "stacks" / "locks" / "example")
    if image_exists(bad):
        docker("image", "rm", "-f", bad)
    # markupsafe pinned at 3.0.2 from PyPI, but the kernel stage builds and installs 3.0.3 over it.
    proc = stackforge(
        root,
        "build",
        "example",
        "--set",
        f"tags.local={bad}",
        "--set",
        "indexes.pypi.lock=false",
        "--set",
        "packages.markupsafe={version: 3.0.2, index: pypi}",
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAIL import markupsafe expected=3.0.2 found=3.0.3" in proc.stderr
    assert "no image was tagged" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not image_exists(bad)
