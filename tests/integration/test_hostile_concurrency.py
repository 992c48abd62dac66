"""Two real builds of one stack at once: the second waits for the first, and the evidence left in
build/<stack>/evidence/ is one build's, whole (result, inputs and Dockerfile agree with the image)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.fixtures import run_names

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.engine

TINY = """\
name: tiny
description: one pin, no upstreams
platform: {os: debian12, python: "3.11", arch: x86_64}
base: {image: stackforge/base:bookworm, python: python3}
indexes:
  pypi: {url: "https://pypi.org/simple", role: public}
packages:
  idna: {version: "3.10", index: pypi}
targets:
  run: {entrypoint: [python3]}
"""


def start(root: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    return subprocess.Popen(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


def test_two_builds_of_one_stack_at_once(tmp_path, base_image):
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "stacks" / "tiny.yaml").write_text(TINY)
    tag = f"{run_names.NS}/tiny:{uuid.uuid4().hex[:12]}"
    procs = {
        d: start(root, "build", "tiny", "--set", f"tags.local={tag}", "--set", f"description=build {d}")
        for d in ("A", "B")
    }
    try:
        done = {d: (p.communicate(timeout=900), p.returncode) for d, p in procs.items()}
        for d, ((out, err), rc) in done.items():
            assert rc == 0, f"build {d} exited {rc}:\n{out}\n{err}"
            assert "Traceback" not in err and out.strip().splitlines()[-1] == tag
        waited = [d for d, ((_, err), _) in done.items() if "waiting for another stackforge on" in err]
        assert len(waited) == 1, "exactly one build waits for the other"
        last = waited[0]  # it ran second, so build/tiny/ holds its build

        evidence = root / "build" / "tiny" / "evidence" / "latest"
        result = json.loads((evidence / "result.json").read_text())
        inputs = json.loads((evidence / "inputs.json").read_text())
        image_id = docker("image", "inspect", "--format", "{{.Id}}", tag)
        labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", tag))
        assert result["ok"] and result["image_id"] == image_id
        assert inputs["overrides"] == [f"tags.local={tag}", f"description=build {last}"]
        assert inputs["inputs_fingerprint"] == labels["org.stackforge.inputs"]
        assert inputs["fingerprint"] == labels["org.stackforge.fingerprint"]
        dockerfile = (evidence / "Dockerfile").read_text()
        assert dockerfile == (root / "build" / "tiny" / "Dockerfile").read_text()
        assert inputs["inputs_fingerprint"] in dockerfile and inputs["fingerprint"] in dockerfile
        assert not [p.name for p in (root / "build" / "tiny").rglob("*") if p.name.endswith((".tmp", ".partial"))]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
