"""post2 locked with ``stackforge lock`` against the stand-in indexes, then built from its locks.

Every pip phase installs from a lock with ``--require-hashes`` or installs nothing: the vendor wheels, the
public pins with the closure of vLLM's and the plugin's requirement files (``pypi.txt``), and the vendor
wheels' own dependencies (``stacks/locks/post2/mthreads.deps.txt``); the requirement phase runs
``--no-index`` and proves that closure is installed. A changed hash in the dependency lock stops the build
at that phase; a requirement file changed after locking (here by the patch series) stops it before the
engine runs. The stack files and the build code are the production
ones; only the endpoints and the base image are set (as in test_post_stacks.py, whose index servers and
build cache this shares).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def locked(standins, tmp_path_factory):
    """(root, overrides, lock dir): a copy of the repository's stacks and patches with post2's locks."""
    root = tmp_path_factory.mktemp("post2-locked") / "repo"
    for d in ("stacks", "patches"):
        shutil.copytree(mb.REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__", "locks"))
    pip = ms.bundled_pip()
    overrides = standins.overrides(standins.endpoints(standins.specs("post2")))
    overrides.append(f"base.pip={{version: '{pip.version}', sha256: [{pip.key()}]}}")  # the installer, hashed too
    proc = mb.stackforge("--root", str(root), "lock", "post2", *ms.set_args(overrides))
    assert proc.returncode == 0, proc.stderr
    return root, overrides, root / "stacks" / "locks" / "post2"


def _build(standins, root, overrides, label):
    out = standins.root / "builds" / f"locked-{label}"
    args = ["--root", str(root), "build", "post2", "--network", "host", "--out", str(out), *ms.set_args(overrides)]
    args += ["--set", f"tags.local={run_names.NS}/post2-locked:{label}"]  # leaves the stack's own tag to others
    proc = mb.stackforge(*args, env={"STACKFORGE_CACHE": str(standins.root / "upstream-cache")})
    return mb.Build("post2", args, proc, out, list(overrides))


def test_post2_builds_from_its_locks_with_hashes_in_every_phase(standins, locked):
    root, overrides, locks = locked
    build = _build(standins, root, overrides, "ok")
    assert build.ok, build.describe()
    dockerfile = (build.out / "Dockerfile").read_text().replace("\\\n", " ")
    phases = re.findall(r"^RUN .*pip install --index-url \S+ (.*)-r /stackforge/deps/(\S+)$", dockerfile, re.M)
    # (file, hashes required, offline): every phase is hash-checked, or fetches nothing
    assert [(p[1], "--require-hashes" in p[0], "--no-index" in p[0]) for p in phases] == [
        ("installer.txt", True, False),
        ("mthreads.txt", True, False),
        ("pypi.txt", True, False),
        ("requirements/vllm-build.txt", False, True),
        ("requirements/vllm-common.txt", False, True),
        ("requirements/vllm-transitive.txt", False, True),
        ("mthreads.deps.txt", True, False),
    ]
    for name in ("mthreads.txt", "pypi.txt", "mthreads.deps.txt"):
        assert (build.out / "context" / "deps" / name).read_text() == (locks / name).read_text()
    assert "tabulate==" in (locks / "mthreads.deps.txt").read_text()
    # the requirement closure came from the hashed pypi phase; the requirement phase installed nothing and
    # still ran its preserve check
    inventory = json.loads((build.evidence / "inventory.json").read_text())
    dists = {d["name"].lower(): d for d in inventory["dists"]}
    for name in ("transformers", "lark", "huggingface-hub", "click", "mthreads-ml-py"):
        assert (dists[name]["phase"], bool(dists[name]["sha256"])) == ("pypi", True), dists[name]
    phase = next(p for p in inventory["phases"] if p["phase"] == "requirements.vllm-common")
    assert phase["installed"] == [] and "PASS preserve torch version=2.11.0.post2+musa5.2.0" in phase["preserve"]
    show = mb.docker(
        "run", "--rm", "--network=none", "--entrypoint", "python", build.image, "-m", "pip", "show", "tabulate", "torch"
    ).stdout
    assert f"Name: tabulate\nVersion: {ms.PUBLIC_DEPS['tabulate']}" in show
    assert "Name: torch\nVersion: 2.11.0.post2+musa5.2.0" in show  # torchada's `torch` stayed the vendor's


def test_a_changed_hash_in_the_vendor_deps_lock_stops_the_build(standins, locked):
    root, overrides, locks = locked
    path = locks / "mthreads.deps.txt"
    good = path.read_text()
    real = re.search(r"tabulate==\S+ \\\n    --hash=sha256:([0-9a-f]{64})", good).group(1)
    path.write_text(good.replace(real, "0" * 64))
    try:
        build = _build(standins, root, overrides, "badhash")
    finally:
        path.write_text(good)
    assert build.proc.returncode == 1, build.describe()
    assert "DO NOT MATCH THE HASHES" in build.proc.stderr and "tabulate" in build.proc.stderr
    assert "no image was tagged" in build.proc.stderr


def test_a_requirement_file_changed_after_locking_stops_the_build(standins, locked, tmp_path):
    """vLLM's patch series adds a requirement the lock was not made from: refused at the lock's header line,
    before the engine runs, nothing tagged."""
    root, overrides, locks = locked
    with ms.requirement_patched(root, standins.repos["vllm"], tmp_path, "ninja"):
        build = _build(standins, root, overrides, "stale")
    assert build.proc.returncode == 2, build.describe()
    lines = (locks / "pypi.txt").read_text().splitlines()
    line = next(i for i, l in enumerate(lines, 1) if "input vllm/requirements/common.txt" in l)
    assert (
        f"stacks/locks/post2/pypi.txt:{line}: lock file is stale: vllm/requirements/common.txt "
        "(requirements.vllm-common.files[0]) changed since the lock was made" in build.proc.stderr
    )
    assert "fix: run: stackforge lock post2" in build.proc.stderr
    assert mb.image_id(run_names.image("post2-locked", "stale")) is None
