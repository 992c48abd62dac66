"""`make nightly` over two stacks against a local registry, one of them failing its gate.

Both stacks inherit the example train; one pins markupsafe 3.0.2 while its kernel stage builds
3.0.3, so its dependency gate fails. The other must be published, the summary must show both,
and make must fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests

from tests.fixtures import musa_builds as mb
from tests.fixtures import run_names

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]


def copy_stacks(dest):
    """The repository's stacks, with none of them nightly: these tests declare their own nightly stacks."""
    shutil.copytree(REPO / "stacks", dest)
    for path in dest.glob("*.yaml"):
        path.write_text(re.sub(r"(?m)^nightly: true\b.*$", "nightly: false", path.read_text()))


DATE = "20260929"


@pytest.fixture(scope="module")
def nightly_run(tmp_path_factory, base_image, registry):
    run = uuid.uuid4().hex[:8]
    root = tmp_path_factory.mktemp("nightly") / "repo"
    root.mkdir()
    copy_stacks(root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    (root / "stacks" / "nightly-good.yaml").write_text(
        f"name: nightly-good\ninherits: example\nnightly: true\n"
        f"indexes:\n  pypi: {{lock: false}}\n"  # the example's lock is its own
        f'tags:\n  local: "{run_names.NS}/nightly-good:{run}"\n'
    )
    (root / "stacks" / "nightly-bad.yaml").write_text(
        f"name: nightly-bad\ninherits: example\nnightly: true\n"
        f"indexes:\n  pypi: {{lock: false}}\n"
        f"packages:\n  markupsafe: {{version: 3.0.2, index: pypi}}\n"
        f'tags:\n  local: "{run_names.NS}/nightly-bad:{run}"\n'
    )
    ns = f"n{run}"
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"), STACKFORGE_LOCK_DIR=str(root / "locks"))
    proc = subprocess.run(
        [
            "make",
            "-C",
            str(REPO),
            "nightly",
            f"ROOT={root}",
            f"REGISTRY={registry}/{ns}",
            f"DATE={DATE}",
            "PYTHON=python3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    yield root, ns, proc
    subprocess.run(["docker", "image", "rm", f"{run_names.NS}/nightly-good:{run}"], capture_output=True)


def test_make_nightly_fails_but_publishes_the_stack_that_passed(nightly_run, registry):
    root, ns, proc = nightly_run
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    text = (root / "build" / "nightly" / DATE / "summary.json").read_text()
    assert str(root) not in text and str(REPO) not in text  # no host path: it travels as a CI artifact
    summary = json.loads(text)
    rows = {r["stack"]: r for r in summary["rows"]}
    assert set(rows) == {"nightly-good", "nightly-bad"} and summary["ok"] is False

    good = rows["nightly-good"]
    assert good["status"] == "published" and good["target"] == "escape"
    assert good["tag"] == f"{registry}/{ns}/stackforge-example:py3.11-markupsafe3.0.3-{DATE}-r1"
    assert good["gate"] == "gate result: 8 PASS, 0 FAIL" and good["duration_s"] > 0
    repo_tags = requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).json()["tags"]
    record_tag = "sha256-" + good["digest"].removeprefix("sha256:")  # the publish record (tag-schema fallback)
    assert sorted(repo_tags) == sorted([good["tag"].rsplit(":", 1)[1], "py3.11-latest", record_tag])
    head = requests.head(
        f"http://{registry}/v2/{ns}/stackforge-example/manifests/{good['tag'].rsplit(':', 1)[1]}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        timeout=10,
    )
    assert head.headers["Docker-Content-Digest"] == good["digest"]
    evidence = root / "build" / "nightly" / DATE / good["evidence"]  # relative to the run directory
    assert not Path(good["evidence"]).is_absolute()
    assert json.loads((evidence / "publish.json").read_text())["digest"] == good["digest"]
    assert json.loads((evidence / "result.json").read_text())["ok"] is True
    # The bake prepared exactly the Dockerfile the build used (same labels, same cache keys).
    assert (root / "build" / "nightly" / DATE / "nightly-good.Dockerfile").read_text() == (
        evidence / "Dockerfile"
    ).read_text()

    bad = rows["nightly-bad"]
    assert bad["status"] == "failed" and bad["stage"] == "gate"
    assert "FAIL import markupsafe expected=3.0.2 found=3.0.3" in bad["reason"]
    assert bad["tag"] is None and bad["digest"] is None and bad["gate"] == "gate result: 8 PASS, 1 FAIL"

    md = (root / "build" / "nightly" / DATE / "summary.md").read_text()
    assert "| nightly-good | escape | published |" in md and "| nightly-bad | escape | FAILED (gate) |" in md
    assert good["digest"] in md


def test_the_bake_shared_the_common_stages(nightly_run):
    root, _, _ = nightly_run
    plan = json.loads((root / "build" / "nightly" / DATE / "bake.json").read_text())
    assert sorted(plan["group"]["default"]["targets"]) == ["nightly-bad-escape", "nightly-good-escape"]
    log = (root / "build" / "nightly" / DATE / "bake.log").read_text()
    # Both stacks have the same base stage: BuildKit runs each of its steps once for both targets.
    vertices: dict[str, set[str]] = {}
    for line in log.splitlines():
        m = re.match(r"^#(\d+) \[(nightly-(?:good|bad)-escape) base \d+/\d+\] (.+)$", line)
        if m:
            vertices.setdefault(m.group(3), set()).add(m.group(1))
    assert vertices, "no base-stage steps in the bake log"
    assert all(len(ids) == 1 for ids in vertices.values()), vertices


def test_a_nightly_to_an_unreachable_registry_stops_in_seconds_without_baking(tmp_path, base_image):
    """The preflight asks the engine, every endpoint and the registry (a push started and cancelled) first."""
    root = tmp_path / "repo"
    copy_stacks(root / "stacks")
    (root / "stacks" / "nightly-good.yaml").write_text(
        "name: nightly-good\ninherits: example\nnightly: true\nindexes:\n  pypi: {lock: false}\n"
        f'tags:\n  local: "{run_names.NS}/nightly-pre:1"\n'
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    out = tmp_path / "night"
    started = time.monotonic()
    proc = mb.stackforge("--root", str(root), "nightly", "--registry", f"127.0.0.1:{closed}/team", "--date", DATE,
                         "--out", str(out), "--no-freshness", "--no-drift", "--set", f"base.image={base_image}")  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert took < 60, f"the preflight took {took:.0f} s"
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["stack"], r["status"], r["stage"]) for r in summary["rows"]] == [("nightly-good", "failed", "preflight")]
    reason = summary["rows"][0]["reason"]
    assert f"registry push 127.0.0.1:{closed}/team/" in reason and "connection refused" in reason
    assert "STACKFORGE_REGISTRY_USER" in reason
    assert summary["bake"] == {"not_run": "the preflight failed"} and not (out / "bake.json").exists()
    assert "nightly: preflight FAILED, nothing is built" in proc.stderr
