"""`make nightly` over two stacks against a local registry, one of them failing its gate.

Both stacks inherit the example train; one pins markupsafe 3.0.2 while its kernel stage builds
3.0.3, so its dependency gate fails. The other is example-multi's (it declares linux/amd64 and linux/arm64): each
line must be built and gated on its platform (arm64 under emulation on an x86_64 host) and both published under one
tag as an index, a row per platform; the summary must show every row, and make must fail. The good stack keeps
example-multi's locks, so its builds are the same steps as test_platforms_build.py's and share BuildKit's cache.
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
def nightly_run(tmp_path_factory, base_image, arm_base_image, registry):
    run = uuid.uuid4().hex[:8]
    root = tmp_path_factory.mktemp("nightly") / "repo"
    root.mkdir()
    copy_stacks(root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    (root / "stacks" / "nightly-good.yaml").write_text(
        f'name: nightly-good\ninherits: example-multi\nnightly: true\ntags:\n  local: "{run_names.NS}/nightly-good:{run}"\n'
    )
    for line in ("", "@arm64"):  # each line's lock, example-multi's as it is: the same bytes, the same build steps
        locks = root / "stacks" / "locks"
        shutil.copytree(locks / f"example-multi{line}", locks / f"nightly-good{line}")
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
    local = f"{run_names.NS}/nightly-good:{run}"
    subprocess.run(["docker", "image", "rm", local, f"{local}-arm64"], capture_output=True)


def index_of(registry: str, repo: str, ref: str) -> requests.Response:
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    return requests.get(f"http://{registry}/v2/{repo}/manifests/{ref}", headers={"Accept": accept}, timeout=10)


def test_make_nightly_fails_but_publishes_the_stack_that_passed(nightly_run, registry):
    root, ns, proc = nightly_run
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    night = root / "build" / "nightly" / DATE
    text = (night / "summary.json").read_text()
    assert str(root) not in text and str(REPO) not in text  # no host path: it travels as a CI artifact
    summary = json.loads(text)
    assert [(r["stack"], r["platform"]) for r in summary["rows"]] == [
        ("nightly-bad", "linux/amd64"),
        ("nightly-good", "linux/amd64"),
        ("nightly-good", "linux/arm64"),
    ]
    assert summary["ok"] is False and summary["counts"]["images"] == {"passed": 2, "failed": 1, "not_run": 0}
    good = {r["platform"]: r for r in summary["rows"] if r["stack"] == "nightly-good"}
    amd, arm = good["linux/amd64"], good["linux/arm64"]

    # one immutable tag for both lines: an OCI index with each line's image; the alias moved with it
    tag = f"{registry}/{ns}/stackforge-example-multi:py3.11-markupsafe3.0.3-{DATE}-r1"
    for row in (amd, arm):
        assert row["status"] == "published" and row["target"] == "escape" and row["tag"] == tag
        assert row["gate"].startswith("gate result: ") and row["gate"].endswith(" PASS, 0 FAIL")
        assert row["duration_s"] > 0 and row["aliases"] == {"py3.11-latest": "moved"}
    repo = f"{ns}/stackforge-example-multi"
    index = index_of(registry, repo, tag.rsplit(":", 1)[1])
    assert index.json()["mediaType"] == "application/vnd.oci.image.index.v1+json"
    listed = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in index.json()["manifests"]}
    assert listed == {"linux/amd64": amd["digest"], "linux/arm64": arm["digest"]}
    assert index_of(registry, repo, "py3.11-latest").headers["Docker-Content-Digest"] == index.headers["Docker-Content-Digest"]  # fmt: skip
    repo_tags = requests.get(f"http://{registry}/v2/{repo}/tags/list", timeout=10).json()["tags"]
    records = ["sha256-" + r["digest"].removeprefix("sha256:") for r in (amd, arm)]  # each image's own record
    assert sorted(repo_tags) == sorted([tag.rsplit(":", 1)[1], "py3.11-latest", *records])

    # each line's evidence under its own name: the arm64 line's gate, read-only gate and inventory ran on aarch64
    assert (amd["evidence"], arm["evidence"]) == ("nightly-good-escape", "nightly-good-escape@arm64")
    evidence = night / arm["evidence"]
    assert (evidence / "gate.txt").read_text().splitlines()[0] == "PASS machine aarch64"
    assert "read-only: PASS machine aarch64" in (evidence / "gate-readonly.txt").read_text()
    assert json.loads((evidence / "inventory.json").read_text())["machine"] == "aarch64"
    record = json.loads((evidence / "publish.json").read_text())
    assert (record["digest"], record["platform"]) == (arm["digest"], "linux/arm64")
    assert record["index"]["digest"] == index.headers["Docker-Content-Digest"]
    assert (night / amd["evidence"] / "gate.txt").read_text().splitlines()[0] == "PASS machine x86_64"
    assert json.loads((night / amd["evidence"] / "result.json").read_text())["ok"] is True
    # The bake (the stack's own line) prepared exactly the Dockerfile the build used (same labels, same cache keys).
    assert (night / "nightly-good.Dockerfile").read_text() == (night / amd["evidence"] / "Dockerfile").read_text()

    (bad,) = [r for r in summary["rows"] if r["stack"] == "nightly-bad"]
    assert bad["status"] == "failed" and bad["stage"] == "gate"
    assert "FAIL import markupsafe expected=3.0.2 found=3.0.3" in bad["reason"]
    assert bad["tag"] is None and bad["digest"] is None and bad["gate"] == "gate result: 8 PASS, 1 FAIL"

    md = (night / "summary.md").read_text()
    assert "| nightly-good | escape | linux/amd64 | published |" in md
    assert "| nightly-good | escape | linux/arm64 | published |" in md
    assert "| nightly-bad | escape | linux/amd64 | FAILED (gate) |" in md
    assert amd["digest"] in md and arm["digest"] in md


def test_the_history_shows_a_row_and_a_page_per_platform(nightly_run, tmp_path):
    root, _, _ = nightly_run
    site = tmp_path / "site"
    proc = mb.stackforge("history", "--nights", str(root / "build" / "nightly"), "--out", str(site),
                         "--registry-check", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (site / "index.html").read_text()
    assert re.search(r"<td>escape</td>\s*<td>linux/arm64</td>\s*<td class=\"status\">published</td>", html)
    pages = sorted(p.name for p in (site / "images").iterdir())
    assert f"{DATE}.nightly-good.escape.linux_2farm64.html" in pages
    assert f"{DATE}.nightly-good.escape.linux_2famd64.html" in pages
    arm = (site / "images" / f"{DATE}.nightly-good.escape.linux_2farm64.html").read_text()
    assert "digest confirmed by the night&#39;s publish record and the registry (its index" in arm


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
