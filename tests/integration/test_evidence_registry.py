"""Evidence per build and operators without the build host, on the example stack and a loopback registry.

Two builds of one stack in a row keep both evidence sets (``latest`` moves to the second), and the earlier
gated image is still published from its own evidence.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stackforge.build import evidence

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20260929"


def stackforge(root: Path | None, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"), PYTHONPATH=str(REPO / "tools"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", *(["--root", str(root)] if root else []), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=1800,
    )


def image_id(ref: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, base_image):
    """Two builds of the example stack in a row: the first as it is, the second with another description (a
    label, so another image) under another local tag."""
    root = tmp_path_factory.mktemp("evidence") / "repo"
    root.mkdir()
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    token = uuid.uuid4().hex[:8]
    first, second = f"stackforge-test/example:ev1-{token}", f"stackforge-test/example:ev2-{token}"
    a = stackforge(root, "build", "example", "--set", f"tags.local={first}")
    assert a.returncode == 0, a.stderr[-4000:]
    b = stackforge(
        root, "build", "example", "--set", f"tags.local={second}", "--set", f"description=second build {token}"
    )
    assert b.returncode == 0, b.stderr[-4000:]
    yield root, first, second
    subprocess.run(["docker", "image", "rm", first, second], capture_output=True)


def test_two_builds_keep_both_evidence_sets_and_latest_moves(two_builds):
    root, first, second = two_builds
    ev_root = root / "build" / "example" / "evidence"
    builds = evidence.builds(ev_root)
    assert len(builds) == 2
    results = [json.loads((b / "result.json").read_text()) for b in builds]
    assert [r["image_id"] for r in results] == [image_id(first), image_id(second)]
    assert image_id(first) != image_id(second)
    assert [r["build_id"] for r in results] == [b.name for b in builds]
    for b in builds:  # each set is whole
        assert {"inputs.json", "Dockerfile", "build.log", "gate.txt", "result.json"} <= {p.name for p in b.iterdir()}
    assert os.readlink(ev_root / "latest") == builds[1].name


def test_publishing_the_earlier_gated_image_still_works(two_builds, registry):
    root, first, _ = two_builds
    ns = f"ev{uuid.uuid4().hex[:8]}"
    proc = stackforge(root, "publish", "example", "--registry", f"{registry}/{ns}", "--date", DATE,
                      "--set", f"tags.local={first}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    older, newer = evidence.builds(root / "build" / "example" / "evidence")
    record = json.loads((older / "publish.json").read_text())
    assert record["image_id"] == image_id(first) and record["gated_build"]["build_id"] == older.name
    assert not (newer / "publish.json").exists()


def test_an_image_no_gated_build_made_is_refused(two_builds, registry):
    root, first, _ = two_builds
    other = f"stackforge-test/example:evx-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "tag", "stackforge/base:bookworm", other], check=True, capture_output=True)
    try:
        proc = stackforge(root, "publish", "example", "--registry", f"{registry}/evx", "--date", DATE,
                          "--set", f"tags.local={other}")  # fmt: skip
    finally:
        subprocess.run(["docker", "image", "rm", other], capture_output=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no gated build of example/escape" in proc.stderr and "nothing was published" in proc.stderr
