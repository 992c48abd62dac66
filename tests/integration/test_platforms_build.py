"""A platform line built and gated on its own platform: example-multi's linux/arm64 line on this engine, under
emulation when the host is x86_64 (scripts/engine-setup.sh registers the handler), from the arm64 base image
(scripts/base-image.sh --platform linux/arm64). The gate, the read-only gate and the inventory run in the arm64
image and say so (``uname -m`` inside: aarch64); the image's config is arm64 and its target runs.

Emulated builds are slow on a small host: one build, shared by the module's tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import run_names
from tests.fixtures.stack_support import RootSpec, repo_root

REPO = Path(__file__).resolve().parents[2]
ARM_BASE = "stackforge/base:bookworm-arm64"
pytestmark = pytest.mark.engine


def stackforge(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )


@pytest.fixture(scope="module")
def arm_base() -> str:
    """The arm64 base image (built once on the engine, under the script's lock, when it is missing)."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "base-image.sh"), "--platform", "linux/arm64"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ARM_BASE


@pytest.fixture(scope="module")
def arm_build(tmp_path_factory, arm_base):
    root = repo_root(tmp_path_factory.mktemp("platforms"), RootSpec(parts=("stacks", "patches")))
    tag = run_names.image("example-multi", "arm")
    proc = stackforge(root, "build", "example-multi", "--platform", "arm64", "--set", f"tags.local={tag}", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcome = json.loads(proc.stdout)
    yield root, outcome
    subprocess.run(["docker", "image", "rm", "-f", outcome["tag"]], capture_output=True)


def test_the_arm64_line_is_built_for_arm64_and_tagged_apart(arm_build):
    root, outcome = arm_build
    assert outcome["tag"].endswith("-arm64")  # the line's local tag is its own, beside the stack's
    inspect = json.loads(subprocess.run(["docker", "image", "inspect", outcome["tag"]], capture_output=True,
                                        text=True, check=True).stdout)[0]  # fmt: skip
    assert (inspect["Os"], inspect["Architecture"]) == ("linux", "arm64")
    evidence = Path(outcome["evidence"])
    assert evidence.parent.parent == root / "build" / "example-multi@arm64"


def test_the_gates_and_the_inventory_ran_on_arm64(arm_build):
    _, outcome = arm_build
    evidence = Path(outcome["evidence"])
    gate = (evidence / "gate.txt").read_text(encoding="utf-8").splitlines()
    assert gate[0] == "PASS machine aarch64"
    assert "read-only: PASS machine aarch64" in (evidence / "gate-readonly.txt").read_text(encoding="utf-8")
    assert json.loads((evidence / "inventory.json").read_text(encoding="utf-8"))["machine"] == "aarch64"
    assert "PASS probe  speedups-compiled result=compiled" in gate  # the probe ran the arm64 build of the C extension


def test_the_arm64_image_runs_its_target(arm_build):
    _, outcome = arm_build
    run = subprocess.run(
        ["docker", "run", "--rm", "-i", "--network=none", outcome["tag"]],
        input="<a & b>",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (run.returncode, run.stdout) == (0, "&lt;a &amp; b&gt;"), run.stderr
    machine = subprocess.run(
        ["docker", "run", "--rm", "--network=none", "--entrypoint", "uname", outcome["tag"], "-m"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert machine.stdout.strip() == "aarch64"
