"""A clean build leaves the shared cache mounts to the builds after it: a marker a plain build wrote into the shared
pip cache and ccache is still there after a ``build --no-cache`` of a small stack, which saw none of it (its own
mounts, empty) and removed its own mounts when it ended; the next plain build of the stack reuses every step the
clean build made.

The stack is this run's own (a dependency wheel and a kernel whose names hold a nonce), served from a loopback index,
and its repository carries its own templates: stackforge's, their shared mounts named ``sftest<nonce>-pip`` and
``sftest<nonce>-ccache`` instead of ``stackforge-…``. No other build uses those, so what this test sees of them is
what its own builds did (after any ``--no-cache`` build starts, BuildKit no longer knows which builds hold a shared
mount, and a step starting while another build holds one gets a new, empty mount under the same id).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from stackforge.builder.plan.render import CLEAN_SCOPE, SOURCE_IMAGES
from stackforge.clients.engine import Engine, parse_cache_mounts
from tests.fixtures import buildcache, run_names
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.engine
SHARED = ("pip", "ccache")  # the shared mounts the stack's kernel step names (id=<prefix>-<name>)


def kernel_sdist(out: Path, wheel: Path) -> str:
    """``ccsrc-1.0.tar.gz``: a source tree carrying ``wheel`` (the kernel step copies it out); its sha256."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tf:
        for name, body in (("setup.py", b"print('ccsrc')\n"), (f"wheels/{wheel.name}", wheel.read_bytes())):
            info = tarfile.TarInfo(f"ccsrc-1.0/{name}")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    (out / "ccsrc-1.0.tar.gz").write_bytes(data.getvalue())
    return hashlib.sha256(data.getvalue()).hexdigest()


def stack_yaml(base_image: str, index: str, sha: str, nonce: str, repo: str) -> str:
    # The kernel fails if it sees the shared mounts' marker, and says how many entries its ccache holds.
    marker = f"stackforge-test-{nonce}"
    run = (
        f"test ! -e /root/.cache/ccache/{marker} && test ! -e /root/.cache/pip/{marker} && "
        f"echo own-ccache-{nonce}=$(ls -A /root/.cache/ccache | wc -l) && cp wheels/*.whl /out/wheels/"
    )
    return f"""name: cc
platform: {{os: debian12, python: "3.11"}}
base: {{image: {base_image}, python: python3}}
indexes:
  priv: {{url: "{index}", role: public}}
upstreams:
  ccsrc:
    sdist: {{index: priv, name: ccsrc, version: "1.0", sha256: {sha}}}
kernels:
  kern: {{upstream: ccsrc, run: "{run}"}}
packages:
  ccdep{nonce}: {{version: "1.0", index: priv}}
gate:
  imports:
    - {{module: cckern{nonce}, dist: cckern{nonce}}}
tags:
  local: "{repo}:local"
targets: {{app: {{}}}}
"""


def stackforge(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(REPO)])}
    env["STACKFORGE_CACHE"] = str(root / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert proc.returncode == 0, f"stackforge {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def own_templates(root: Path, prefix: str) -> None:
    """``root/images``: stackforge's templates and image scripts, their cache mounts ``id=<prefix>-…``."""
    shutil.copytree(SOURCE_IMAGES, root / "images", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Dockerfile.j2", "target.j2"):
        path = root / "images" / name
        text = path.read_text()
        assert "id=stackforge-ccache" in text or name == "target.j2"
        path.write_text(text.replace("id=stackforge-", f"id={prefix}-"))


def on_shared_mounts(engine: Engine, base_image: str, where: Path, prefix: str, script: str) -> str:
    """Run ``script`` in a plain build step that mounts the shared caches at /shared/<name>; its log. Nothing is
    exported (the step's command holds the test's nonce: it always runs)."""
    where.mkdir(parents=True)
    mounts = " ".join(f"--mount=type=cache,target=/shared/{name},id={prefix}-{name}" for name in SHARED)
    (where / "Dockerfile").write_text(f"FROM {base_image}\nRUN {mounts} {script}\n")
    rc, log = engine.build(where, where / "Dockerfile", load=False, extra_args=["--output", "type=cacheonly"])
    assert rc == 0, log[-3000:]
    return log


def test_a_clean_build_keeps_the_shared_caches_and_uses_empty_ones_of_its_own(engine, base_image, tmp_path):
    nonce = secrets.token_hex(4)
    marker, prefix = f"stackforge-test-{nonce}", f"sftest{nonce}"
    on_shared_mounts(
        engine,
        base_image,
        tmp_path / "plant",
        prefix,
        f"for d in {' '.join(SHARED)}; do echo {nonce} > /shared/$d/{marker}; done",
    )
    files = tmp_path / "files"
    build_wheel(files, f"ccdep{nonce}", "1.0")
    sha = kernel_sdist(files, build_wheel(tmp_path / "kernel", f"cckern{nonce}", "1.0"))
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    own_templates(root, prefix)
    repo = f"{run_names.NS}/cc{nonce}"
    try:
        with IndexServer(files) as index:
            (root / "stacks" / "cc.yaml").write_text(stack_yaml(base_image, index.url, sha, nonce, repo))
            build = ("build", "cc", "--network", "host", "--ca-bundle", "none")
            clean = stackforge(root, *build, "--no-cache")
            built = (root / "build" / "cc" / "evidence" / "latest" / "Dockerfile").read_text()
            plain = stackforge(root, *build)
    finally:
        kept = on_shared_mounts(
            engine,
            base_image,
            tmp_path / "check",
            prefix,
            f"for d in {' '.join(SHARED)}; do if [ -e /shared/$d/{marker} ]; then echo kept-$d-{nonce}; "
            f"rm /shared/$d/{marker}; fi; done",
        )
        subprocess.run(["docker", "image", "rm", f"{repo}:local"], capture_output=True)
        for name in SHARED:  # the test's own shared mounts
            engine.drop_cache_mounts(f"{prefix}-{name}")
    # The clean build compiled with a ccache of its own, empty, and never saw the shared mounts' marker ...
    assert f"own-ccache-{nonce}=0" in clean.stderr, clean.stderr[-3000:]
    # ... which the shared mounts still hold after it: the builds after it keep their caches.
    for name in SHARED:
        assert f"kept-{name}-{nonce}" in kept, f"the shared {name} cache lost its content:\n{kept[-2000:]}"
    # Every cache mount the clean build named was its own, and it removed them when it ended.
    ids = re.findall(r"--mount=type=cache,[^ ]*?id=([^, ]+)", built)
    scopes = {m.group(0) for i in ids if (m := CLEAN_SCOPE.search(i))}
    assert len(ids) >= 3 and len(scopes) == 1, ids
    assert all(i.startswith(prefix) and i.endswith(*scopes) for i in ids), ids
    listed = subprocess.run(
        ["docker", "buildx", "du", "--verbose", "--filter", "type=exec.cachemount"], capture_output=True, text=True
    ).stdout
    assert not [m for _, m in parse_cache_mounts(listed) if m.endswith(*scopes)]
    # A mount's id is not part of a step's cache key: the plain build after the clean one reran nothing.
    assert buildcache.ran(plain.stderr) == [], buildcache.ran(plain.stderr)
