"""The jev overlay built on the post2 vllm-openai image of the stand-in session (shared with test_post_stacks):
its range installed in the image's vllm, both ports answering, published immutably to the loopback registry,
verified (also by an operator with the registry alone, from an empty directory); and the bad inputs: a file whose sha256 differs, a base image digest the registry does not hold."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import requests

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
#: the overlay's own local tag, built in the run's namespace (``jev_root``)
TAG = run_names.namespaced("vllm-musa:v0.28.0-torch2.11.0.post2-jev")
DATE = "20270105"
PUBLISHED = f"jev-v0.28.0-5.2.0-torch2.11.0.post2-{DATE}-r1"


def overlay_cmd(standins, post2, verb: str, *extra: str, root: Path):
    args = ["--root", str(root), verb, "post2", "--overlay", "jev", "--out", str(post2.out)]
    env = {"STACKFORGE_CACHE": str(standins.root / "upstream-cache")}
    return mb.stackforge(*args, *extra, *ms.set_args(post2.overrides), env=env)


@pytest.fixture(scope="module")
def jev_root(tmp_path_factory) -> Path:
    """The repository's stacks, patches, overlays and recipes (the jev overlay's local tag in the run's namespace)."""
    return copy_root(tmp_path_factory.mktemp("jev"))


@pytest.fixture(scope="module")
def jev(standins, post2, jev_root):
    mb.docker("image", "rm", "--force", TAG, check=False)
    proc = overlay_cmd(standins, post2, "build", "--network", "host", root=jev_root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == TAG
    return proc


def test_the_range_is_installed_in_the_image_and_labelled(jev, post2):
    evidence = post2.out / "overlays" / "jev" / "evidence" / "latest"
    result = json.loads((evidence / "result.json").read_text())
    assert result["ok"] and result["base"]["image_id"] == post2.image
    assert mb.image_id(TAG) == result["image_id"]
    gate = (evidence / "gate.txt").read_text().splitlines()
    assert [ln.split(" sha256=")[0] for ln in gate if ln.startswith("PASS range")] == [
        "PASS range  vllm/entrypoints/jev/__init__.py",
        "PASS range  vllm/entrypoints/jev/canvas.py",
    ]
    assert any(ln.startswith("PASS import vllm version=0.28.0") for ln in gate), gate
    assert 'PASS probe  jev-canvas result={"canvas_length": 256, "max_denoising_steps": 48} target=overlay-jev' in gate
    changed = json.loads((evidence / "changed.json").read_text())
    assert [f["path"] for f in changed["files"]] == [
        "vllm/entrypoints/jev/__init__.py",
        "vllm/entrypoints/jev/canvas.py",
    ]
    labels = mb.labels_of(TAG)
    assert labels["org.stackforge.overlay"] == "jev"
    assert labels["org.stackforge.overlay.base"] == post2.image
    assert labels["org.stackforge.overlay.range.vllm"].startswith("sha256:")
    assert labels["org.stackforge.stack"] == "post2"  # the base's labels are kept
    assert labels["com.mthreads.vllm.overlay"] == "jev on vllm v0.28.0"
    inspect = json.loads(mb.docker("image", "inspect", TAG).stdout)[0]["Config"]
    assert inspect["Entrypoint"] == ["/opt/jev/entrypoint.sh"]
    assert set(inspect["ExposedPorts"]) == {"8000/tcp", "18011/tcp"}
    assert "CANVAS=256" in inspect["Env"] and "BACKEND=TRITON_ATTN" in inspect["Env"]


def wait_for(url: str, timeout: float = 90) -> requests.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = requests.get(url, timeout=2)
            if reply.status_code == 200:
                return reply
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer 200 within {timeout}s")
        time.sleep(0.5)


def test_both_ports_answer_and_the_entrypoint_forwards_signals(jev):
    name = run_names.container("jev")
    mb.docker("rm", "--force", name, check=False)
    mb.docker(
        "run",
        "-d",
        "--name",
        name,
        "-p",
        "127.0.0.1::8000",
        "-p",
        "127.0.0.1::18011",
        "-e",
        "SERVED_NAME=jev-test",
        TAG,
        "--max-logprobs",
        "32",
    )
    try:
        api = mb.docker("port", name, "8000/tcp").stdout.split()[0]
        interposer = mb.docker("port", name, "18011/tcp").stdout.split()[0]
        direct = wait_for(f"http://{api}/v1/models")
        assert [m["id"] for m in direct.json()["data"]] == ["jev-test"]
        proxied = wait_for(f"http://{interposer}/v1/models")
        assert proxied.json() == direct.json()
        logs = mb.docker("logs", name).stdout + mb.docker("logs", name).stderr
        assert "Using TRITON_ATTN backend" in logs, logs
        started = time.monotonic()
        mb.docker("stop", "--time", "20", name)
        assert time.monotonic() - started < 15  # SIGTERM reached both servers: no kill after the grace period
    finally:
        mb.docker("rm", "--force", name, check=False)


def test_the_recipe_smokes_on_the_jev_image_through_both_ports(jev, tmp_path):
    """recipes/diffusion-gemma.yaml needs the jev overlay: its rows (a chat on the API port, vLLM's backend line,
    the interposer's port) run against the overlay image."""
    out = tmp_path / "smoke"
    proc = mb.stackforge(
        "smoke", "diffusion-gemma", "--image", TAG, "--out", str(out), "--allow-missing-hardware", "--json"
    )
    data = json.loads((out / "smoke.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {r["name"]: r["status"] for r in data["rows"]} == {
        "preflight": "passed",
        "readiness": "passed",
        "generate": "passed",
        "backend": "passed",
        "interposer": "passed",
    }
    assert data["verdict"] == "not-run" and data["hardware"]["allowed_missing"]  # no MUSA device on this host
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["generate"]["details"]["answer"] == "Paris"
    assert rows["backend"]["details"]["backends_in_log"] == ["TRITON_ATTN"]
    assert data["container"]["removed"]


def test_published_immutably_and_verified(jev, standins, post2, registry, jev_root):
    ns = "overlay-jev"
    first = overlay_cmd(standins, post2, "publish", "--registry", f"{registry}/{ns}", "--date", DATE, root=jev_root)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"published: {registry}/{ns}/vllm/vllm-openai:{PUBLISHED}" in first.stdout
    again = overlay_cmd(standins, post2, "publish", "--registry", f"{registry}/{ns}", "--date", DATE, root=jev_root)
    assert again.returncode == 0 and "already published" in again.stdout
    base = f"http://{registry}/v2/{ns}/vllm/vllm-openai"
    tags = requests.get(f"{base}/tags/list", timeout=10).json()["tags"]
    assert [t for t in tags if not t.startswith("sha256-")] == [PUBLISHED]
    # The publish record is attached as an OCI artifact; this registry has no referrers API, so the
    # tag-schema fallback names the image's manifest digest (one record, however often it was published).
    head = requests.head(
        f"{base}/manifests/{PUBLISHED}", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}, timeout=10
    )
    digest = head.headers["Docker-Content-Digest"]
    assert [t for t in tags if t.startswith("sha256-")] == [digest.replace(":", "-")]
    record = json.loads((post2.out / "overlays" / "jev" / "evidence" / "latest" / "publish.json").read_text())
    assert record["overlay"] == "jev" and record["tag"] == PUBLISHED

    verify = mb.stackforge("--root", str(jev_root), "verify", TAG, *ms.set_args(post2.overrides))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    out = verify.stdout
    assert "PASS overlay range.vllm label=sha256:" in out
    assert "PASS overlay layers start with the base image" in out
    assert "PASS overlay range files and files re-hashed inside the image with a read-only root" in out
    assert "PASS file   /opt/jev/entrypoint.sh" in out


def test_the_published_overlay_is_verified_from_the_registry_without_a_checkout(
    jev, standins, post2, registry, tmp_path, jev_root
):
    """An operator with the registry alone verifies the published jev image by its tag, from an empty directory:
    the overlay's labels against its publish record, the embedded overlay.yaml, the range and the files
    re-hashed inside the image, its post2 base, and post2's gate re-run."""
    ns = "overlay-jev"
    published = overlay_cmd(standins, post2, "publish", "--registry", f"{registry}/{ns}", "--date", DATE, root=jev_root)
    assert published.returncode == 0, published.stdout + published.stderr
    ref = f"{registry}/{ns}/vllm/vllm-openai:{PUBLISHED}"
    proc = mb.stackforge("verify", ref, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert "PASS labels  the image's labels equal the record's" in out
    assert "PASS overlay name label=jev record=jev" in out
    assert "PASS overlay base stack=post2 embedded overlay.yaml=post2/vllm-openai" in out
    assert any(l.startswith("PASS overlay /stackforge/overlay/jev/overlay.yaml sha256 image=sha256:") for l in out)
    assert any(l.startswith("PASS overlay declaration of the embedded overlay.yaml=sha256:") for l in out)
    assert any(l.startswith("PASS overlay changed.vllm of the embedded manifest.json=sha256:") for l in out)
    assert any(l.startswith("PASS overlay layers start with the base image sha256:") for l in out)
    assert "PASS overlay range files and files re-hashed inside the image with a read-only root" in out
    assert "PASS gate    re-run inside the image with a read-only root filesystem" in out
    assert not [l for l in out if l.startswith("FAIL")]
    assert out[-1].startswith(f"verified {ref}: digest, record, ") and out[-1].endswith(" — 0 failed")
    assert ", overlay, " in out[-1] and ", read-only gate, " in out[-1]
    assert list(tmp_path.iterdir()) == []  # nothing written where the operator stands


def copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for part in ("stacks", "patches", "overlays", "recipes"):
        shutil.copytree(REPO / part, root / part)
    overlay = root / "overlays" / "jev" / "overlay.yaml"
    local = '  local: "vllm-musa:'
    assert overlay.read_text().count(local) == 1, "overlays/jev/overlay.yaml: tags.local is not vllm-musa:…"
    overlay.write_text(overlay.read_text().replace(local, f'  local: "{run_names.NS}/vllm-musa:'))
    return root


def test_a_file_whose_sha256_differs_builds_nothing(jev, standins, post2, tmp_path):
    root = copy_root(tmp_path)
    (root / "overlays" / "jev" / "files" / "interposer.py").write_text("print('not the reviewed interposer')\n")
    had = mb.image_id(TAG)
    proc = overlay_cmd(standins, post2, "build", "--network", "host", root=root)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = (root / "overlays" / "jev" / "overlay.yaml").read_text().splitlines().index(
        "    sha256: 8ac4d2491b14eb122291acc88db67caed3e9bc971192e1d389c0cd99c4cdce74"
    ) + 1
    assert f"error: overlays/jev/overlay.yaml:{line}:" in proc.stderr, proc.stderr
    assert "files.0.sha256: overlays/jev/files/interposer.py has sha256" in proc.stderr
    assert proc.stdout == "" and mb.image_id(TAG) == had


def test_a_base_digest_that_is_gone_is_refused_and_nothing_published(jev, standins, post2, registry, tmp_path):
    root = copy_root(tmp_path)
    overlay = root / "overlays" / "jev" / "overlay.yaml"
    gone = f"{registry}/overlay-jev/vllm/vllm-openai@sha256:{'0' * 64}"
    text = overlay.read_text().replace("base: {stack: post2, target: vllm-openai}", f"base: {{image: {gone}}}")
    overlay.write_text(text.replace("patches:\n  vllm: {packages: [vllm]}\n", ""))
    shutil.rmtree(root / "overlays" / "jev" / "patches")
    mb.docker("image", "rm", "--force", TAG, check=False)
    before = requests.get(f"http://{registry}/v2/overlay-jev/vllm/vllm-openai/tags/list", timeout=10).json()
    proc = overlay_cmd(standins, post2, "build", "--network", "host", root=root)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = overlay.read_text().splitlines().index(f"base: {{image: {gone}}}") + 1
    assert f"error: overlays/jev/overlay.yaml:{line}:" in proc.stderr, proc.stderr
    assert f"base.image: {gone} does not resolve" in proc.stderr
    assert mb.image_id(TAG) is None
    publish = overlay_cmd(standins, post2, "publish", "--registry", f"{registry}/gone", "--date", DATE, root=root)
    assert publish.returncode != 0 and "nothing was published" in publish.stderr, publish.stderr
    assert requests.get(f"http://{registry}/v2/overlay-jev/vllm/vllm-openai/tags/list", timeout=10).json() == before
    assert requests.get(f"http://{registry}/v2/gone/vllm/vllm-openai/tags/list", timeout=10).status_code == 404
