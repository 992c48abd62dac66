"""A second host reuses the first's work through the registry: a small stack built with ``--registry-cache`` and
published; then its image gone and its records pruned from BuildKit's cache (a host that never built it); the
rebuild with the same ``--registry-cache`` takes the dependency phase and the kernel from the published image's
inline cache and re-runs neither.

The stack is this run's own (a dependency wheel and a kernel whose names hold a nonce), so its records are only
this test's and pruning them leaves the other builds' caches on the engine alone (tests/fixtures/buildcache.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import requests

from stackforge.builder.plan.render import SOURCE_IMAGES
from tests.fixtures import buildcache, run_names
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
DATE = "20260101"
pytestmark = pytest.mark.engine


def kernel_sdist(out: Path, wheel: Path) -> str:
    """``rcsrc-1.0.tar.gz``: a source tree carrying ``wheel`` (the kernel step copies it out); its sha256."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tf:
        for name, body in (("setup.py", b"print('rcsrc')\n"), (f"wheels/{wheel.name}", wheel.read_bytes())):
            info = tarfile.TarInfo(f"rcsrc-1.0/{name}")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    path = out / "rcsrc-1.0.tar.gz"
    path.write_bytes(data.getvalue())
    return hashlib.sha256(data.getvalue()).hexdigest()


def stack_yaml(base_image: str, index: str, sha: str, nonce: str, repo: str) -> str:
    return f"""name: rc
platform: {{os: debian12, python: "3.11"}}
base: {{image: {base_image}, python: python3}}
indexes:
  priv: {{url: "{index}", role: public}}
upstreams:
  rcsrc:
    sdist: {{index: priv, name: rcsrc, version: "1.0", sha256: {sha}}}
kernels:
  kern: {{upstream: rcsrc, run: "echo kernel-{nonce} && sleep 2 && cp wheels/*.whl /out/wheels/"}}
packages:
  rcdep{nonce}: {{version: "1.0", index: priv}}
gate:
  imports:
    - {{module: rckern{nonce}, dist: rckern{nonce}}}
tags:
  local: "{repo}:local"
  publish: "{repo}:1-{{{{ date }}}}-r{{{{ revision }}}}"
  aliases: ["{repo}:latest"]
targets: {{app: {{}}}}
"""


def stackforge(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(REPO)])}
    env["STACKFORGE_CACHE"] = str(root / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert proc.returncode == 0 or not check, (
        f"stackforge {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc


def test_a_second_host_rebuilds_from_the_published_images_cache(tmp_path, base_image, registry):
    nonce = secrets.token_hex(4)
    files = tmp_path / "files"
    build_wheel(files, f"rcdep{nonce}", "1.0")
    sha = kernel_sdist(files, build_wheel(tmp_path / "kernel", f"rckern{nonce}", "1.0"))
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "images").symlink_to(SOURCE_IMAGES)
    repo = f"{run_names.NS}/rc{nonce}"
    ns = f"rc{nonce}"
    alias = f"{registry}/{ns}/{repo}:latest"
    with IndexServer(files) as index:
        (root / "stacks" / "rc.yaml").write_text(stack_yaml(base_image, index.url, sha, nonce, repo))
        build = ("build", "rc", "--network", "host", "--ca-bundle", "none", "--registry-cache", alias)
        first = stackforge(root, *build)
        # The first host: nothing to import yet (the build goes on), the image carries its cache inline.
        inspect = ["docker", "image", "inspect", f"{repo}:local"]
        config = json.loads(subprocess.run(inspect, capture_output=True, text=True, check=True).stdout)[0]
        first_ran = buildcache.ran(first.stderr)
        assert any(f"kernel-{nonce}" in s for s in first_ran) and any("preserve.py" in s for s in first_ran), first_ran
        evidence = root / "build" / "rc" / "evidence" / "latest"
        assert json.loads((evidence / "cache.json").read_text()) == {"from": [alias], "to": "inline"}
        published = stackforge(root, "publish", "rc", "--registry", f"{registry}/{ns}", "--date", DATE)
        assert f"{registry}/{ns}/{repo}" in published.stdout
        image_id = json.loads((evidence / "publish.json").read_text())["image_id"]  # what a pull gives

        # The second host: no image of the stack, none of its build records.
        subprocess.run(["docker", "image", "rm", f"{repo}:local"], capture_output=True, check=True)
        # This run's steps: the kernel's (its command holds the nonce), the dependency phase's (it names this
        # run's index, on its own port) and every step built on them.
        left = buildcache.forget([f"kernel-{nonce}", f"--index-url {index.url}/ "])
        assert left == [], [r.description for r in left]

        second = stackforge(root, *build)
        # An export of every stage needs an engine that exports cache; the classic store's builder refuses it.
        refused = stackforge(root, *build[:-2], "--cache-to", f"{registry}/{ns}/cache:max", check=False)
    log = second.stderr
    assert f"importing cache manifest from {alias}" in log
    assert buildcache.ran(log) == [], "steps re-ran:\n" + "\n".join(buildcache.ran(log))
    hits = buildcache.cached(log)
    assert any(f"kernel-{nonce}" in s for s in hits) and any("preserve.py" in s for s in hits), hits
    # The second host's image has the published layers (the publisher normalized those above the base).
    rebuilt = subprocess.run(["docker", "image", "inspect", f"{repo}:local"], capture_output=True, text=True)
    blob = requests.get(f"http://{registry}/v2/{ns}/{repo}/blobs/{image_id}", timeout=30)
    published_layers = blob.json()["rootfs"]["diff_ids"]
    assert rebuilt.returncode == 0 and json.loads(rebuilt.stdout)[0]["RootFS"]["Layers"] == published_layers
    assert published_layers[:2] == config["RootFS"]["Layers"][:2]  # the base's own layers, as they were
    # the gate ran on the first host; its verdict came with the image's layers
    assert any("PASS" in line and f"rckern{nonce}" in line for line in log.splitlines()), log[-3000:]
    if "containerd-snapshotter" in _driver_status():  # this engine exports every stage
        assert refused.returncode == 0, refused.stderr[-2000:]
    else:
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "cannot export build cache" in refused.stderr and "containerd image store" in refused.stderr


def _driver_status() -> str:
    """The engine's storage driver status (``io.containerd.snapshotter.v1`` on the containerd image store)."""
    proc = subprocess.run(["docker", "info", "--format", "{{json .DriverStatus}}"], capture_output=True, text=True)
    return proc.stdout.replace("io.containerd.snapshotter", "containerd-snapshotter")
