"""`stackforge test` in the post2 vllm-openai image built from the stand-ins: the image's own python runs the real
pytest (the stand-in index serves the real pytest wheels) in a container with a read-only root, no network, the
slice's files mounted read-only and only the JUnit directory writable."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]

#: A repository slice that probes the container: /tmp is writable, the root and the slice's own files are not,
#: there is no network; the last test writes outside /tmp, so it fails.
PROBES = """\
import socket
from pathlib import Path

import pytest


def test_tmp_is_writable():
    Path("/tmp/stackforge-slice").write_text("ok")


def test_the_slice_files_are_read_only():
    with pytest.raises(OSError):
        Path(__file__).with_name("written.txt").write_text("no")


def test_there_is_no_network():
    with pytest.raises(OSError):
        socket.create_connection(("192.0.2.1", 80), timeout=2)


def test_pytest_is_the_real_release():
    assert pytest.__version__ == "8.4.2"


def test_writes_outside_tmp():
    Path("/var/stackforge-slice").write_text("the root is read-only")
"""

PROBE_SLICE = """
  sandbox:
    description: what the container allows
    files: {paths: [tests/slices/test_probes.py]}
    expect: {passed: 4, failed: 1}
"""


def sets(build) -> list[str]:
    return ms.set_args(build.overrides)


def override(build, key: str) -> str:
    return next(o.split("=", 1)[1] for o in build.overrides if o.startswith(f"{key}="))


def result_of(out: Path, name: str) -> dict:
    return json.loads((out / name / "result.json").read_text())


def test_the_contract_slice_runs_in_the_image(post2, tmp_path):
    out = tmp_path / "ev"
    proc = mb.stackforge("test", "post2", *sets(post2), "--out", str(out), "--json", timeout=900)
    # the record's probes need a MUSA device: not run on this host, so none failed but one did not run
    assert proc.returncode == 3, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["exit_code"] == 3 and [s["slice"] for s in data["slices"]] == ["contracts", "probes"]
    probes = result_of(out, "probes")
    assert (probes["verdict"], probes["docker"]) == ("not-run", [])
    assert probes["reason"] == "not run: this host has no mthreads device (no /dev/mtgpu*)"
    result = result_of(out, "contracts")
    assert result == data["slices"][0]
    assert result["verdict"] == "passed" and result["counts"]["passed"] == 20
    assert result["image_id"] == mb.image_id(result["image"])
    assert result["files"]["upstream"] == "vllm_musa" and result["files"]["commit"] == override(
        post2, "upstreams.vllm_musa.commit"
    )
    junit = ET.parse(out / "contracts" / "junit.xml").getroot()
    names = {c.get("name") for c in junit.iter("testcase")}
    assert len(names) == 20 and "test_mate_027_cohort_is_exactly_pinned" in names
    assert "20 passed" in (out / "contracts" / "pytest.txt").read_text()
    docker = result["docker"]
    assert "--read-only" in docker and "--network=none" in docker  # the slice runs with no network


def test_the_contract_slice_fails_when_a_pin_of_post2_is_moved_away_from_the_plugin(post2, standins, tmp_path):
    """post2 with its torch pin moved back to the post1 train names the image built for that train from the same
    plugin commit (post1's: the tag is derived from the torch pin). The plugin's contract module, staged at that
    commit, holds the image to the plugin's own pins: the post2 train and torchada 0.1.90, which that image does
    not hold. The slice fails, naming the two tests that assert them."""
    post1 = standins.happy("post1")
    assert post1.ok, post1.describe()
    out = tmp_path / "ev"
    moved = "packages.torch.version=2.11.0.post1+musa5.2.0"
    args = ["test", "post2", *sets(post2), "--set", moved, "--slice", "contracts", "--out", str(out)]
    proc = mb.stackforge(*args, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = result_of(out, "contracts")
    assert result["image_id"] == post1.image and result["verdict"] == "failed"
    assert (result["counts"]["passed"], result["counts"]["failed"]) == (18, 2)
    failed = sorted(t["id"] for t in result["tests"] if t["outcome"] == "failed")
    assert failed == [
        "tests/test_inplace_porting_contract.py::test_musa_image_runtime_dependency_contract",
        "tests/test_inplace_porting_contract.py::test_torchada_floor_is_consistent",
    ]
    assert "FAILED   contracts: 18 passed (expected 20), 2 failed (expected 0)" in proc.stdout
    assert (
        "the image holds torchada 0.1.83, which does not meet torchada==0.1.90"
        in (out / "contracts" / "pytest.txt").read_text()
    )


def _root_with_probes(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    shutil.copy(REPO / "stacks" / "post1.yaml", root / "stacks")
    text = (REPO / "stacks" / "post2.yaml").read_text()
    # the slice goes first under post2's `tests:` mapping (keys after it, e.g. `platforms:`, stay where they are)
    assert text.count("\ntests:\n") == 1
    (root / "stacks" / "post2.yaml").write_text(text.replace("\ntests:\n", "\ntests:" + PROBE_SLICE, 1))
    (root / "tests" / "slices").mkdir(parents=True)
    (root / "tests" / "slices" / "test_probes.py").write_text(PROBES)
    for part in ("patches", "overlays"):
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, root / part)
    return root


def test_read_only_root_and_moved_tests_by_image(post2, tmp_path):
    root = _root_with_probes(tmp_path)
    image = post2.image
    out = tmp_path / "ev"
    base = ["--root", str(root), "test", image, *sets(post2), "--slice", "sandbox", "--out", str(out)]
    proc = mb.stackforge(*base, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = result_of(out, "sandbox")
    outcomes = {t["id"]: t["outcome"] for t in result["tests"]}
    assert outcomes["tests/slices/test_probes.py::test_writes_outside_tmp"] == "failed"
    assert {o for t, o in outcomes.items() if not t.endswith("outside_tmp")} == {"passed"}
    assert "Read-only file system" in (out / "sandbox" / "pytest.txt").read_text()
    # the same run against an expectation that says every test passes: exit 1, naming the test that moved
    stack = root / "stacks" / "post2.yaml"
    stack.write_text(stack.read_text().replace("expect: {passed: 4, failed: 1}", "expect: {passed: 5}"))
    proc = mb.stackforge(*base, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED   sandbox: 4 passed (expected 5), 1 failed (expected 0)" in proc.stdout
    assert "tests/slices/test_probes.py::test_writes_outside_tmp" in proc.stdout
    moved = result_of(out, "sandbox")["moved"]
    assert moved["outcomes"]["failed"]["tests"] == ["tests/slices/test_probes.py::test_writes_outside_tmp"]


def test_an_image_of_other_pins_is_refused(post2, tmp_path):
    proc = mb.stackforge("test", post2.image, "--out", str(tmp_path / "ev"), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not an image of stacks/post2.yaml as declared" in proc.stderr
    assert "upstream vllm_musa: the image was built from" in proc.stderr
    assert not (tmp_path / "ev").exists()
