"""Session fixtures for integration tests: a real engine, the local base image, a registry.

A test that needs the engine FAILS when it is missing (with the fix), it never skips:
tests marked ``@pytest.mark.engine`` get the ``engine`` fixture automatically.
``standins`` is the MUSA stand-in session the post1/post2 modules share; other fixtures belong in their
own test modules.

Names: every image, tag and container the session creates is under its own namespace (tests/fixtures/run_names.py),
so two runs share one engine. A ``docker`` shim first on PATH records each docker command line of the run; at its
end the run's images and containers are removed, and the session FAILS when a command created a name outside the
namespace (the terminal summary lists them; tests/fixtures/run_share.py).

Parallel runs: each pytest-xdist worker has a session of its own (a module's tests and its module fixtures stay in
one worker: ``--dist loadfile``). What costs minutes to make is made once for the run and shared by the workers
through tests/fixtures/run_share.py: the stand-in wheels, upstreams, indexes and apt repository, and the stand-in
builds' layers (one worker builds under a run-wide lock, the others' same build is then answered from the cache).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from tests.fixtures import run_names, run_share
from tests.fixtures.registry import start_registry

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The locally built stand-in for the vendor (MUSA) base image; see scripts/base-image.sh.
BASE_IMAGE = run_share.BASE_IMAGE


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("engine") and "engine" not in item.fixturenames:
            item.fixturenames.insert(0, "engine")


@pytest.fixture(scope="session")
def engine() -> Engine:
    """A checked :class:`Engine`; fails the test (never skips) when dockerd/buildx are missing."""
    eng = Engine()
    try:
        eng.check()
    except UserError as err:
        pytest.fail(f"build engine not usable: {err.render()}", pytrace=False)
    return eng


@pytest.fixture(scope="session")
def base_image(engine: Engine) -> str:
    """Reference of the local base image, built once by scripts/base-image.sh if missing."""
    if not engine.image_exists(BASE_IMAGE):
        proc = subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / "base-image.sh"), BASE_IMAGE],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            pytest.fail(f"scripts/base-image.sh {BASE_IMAGE} failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    assert engine.image_exists(BASE_IMAGE), f"{BASE_IMAGE} missing after scripts/base-image.sh"
    return BASE_IMAGE


#: The arm64 base image of the arm64 platform lines (example-multi's), built by scripts/base-image.sh for linux/arm64.
ARM_BASE_IMAGE = "stackforge/base:bookworm-arm64"


@pytest.fixture(scope="session")
def arm_base_image(base_image: str) -> str:
    """The arm64 base image on the first engine: built once (debootstrap's foreign stage, the second under
    emulation; the script's lock, a no-op when the image is there) when it is missing."""
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "base-image.sh"), "--platform", "linux/arm64"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/base-image.sh --platform linux/arm64 failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False
        )
    return ARM_BASE_IMAGE


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """``host:port`` of a docker-registry on 127.0.0.1 (filesystem storage), stopped at session end: one per process
    (it starts in about a second, and the repository names a worker's modules push to stay that worker's)."""
    try:
        url, stop = start_registry(tmp_path_factory.mktemp("registry"))
    except UserError as err:
        pytest.fail(f"registry not usable: {err.render()}", pytrace=False)
    run_share.registry_started(url)
    try:
        yield url
    finally:
        stop()


@pytest.fixture(scope="session")
def standins(tmp_path_factory, base_image):
    """The MUSA stand-in session every post1/post2 module shares: indexes, git upstreams and the apt
    repository on loopback, and the builds made from them (tests/fixtures/musa_builds.py)."""
    from tests.fixtures import musa_builds as mb

    return mb.session(tmp_path_factory.getbasetemp(), base_image)


@pytest.fixture(scope="session")
def post2(standins):
    """post2's vllm-openai image built once from the stand-ins (a module may define its own ``post2``)."""
    build = standins.happy("post2")
    assert build.ok, build.describe()
    return build


@dataclass(frozen=True)
class ImageStore:
    """The engine a store-parametrized test runs on: ``env`` is what its stackforge and docker commands run with
    (the first engine's, or ``DOCKER_HOST`` at a second engine with the containerd image store)."""

    name: str  # classic | containerd
    env: dict[str, str]
    second: object | None = None  # the second engine (tests/fixtures/second_engine.SecondEngine), containerd only

    def docker(self, *args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kw)

    def load(self, image: str) -> None:
        """Make ``image`` of the first engine present in this one (a no-op on the first engine)."""
        if self.second is not None and self.docker("image", "inspect", image).returncode != 0:
            self.second.load(image)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def containerd_store(tmp_path_factory, base_image):
    """A second dockerd with the containerd image store (scripts/second-engine.sh start --store containerd), the base
    image loaded; started once per session by the first module that asks, stopped and its data root deleted at the
    end (its images and build cache go with it)."""
    from tests.fixtures import second_engine as se

    name = "c" + hashlib.sha256(run_names.NS.encode()).hexdigest()[:7]  # this worker's, beside its classic one
    engine = se.start(tmp_path_factory.mktemp("containerd-store-config"), store="containerd", name=name)
    try:
        store = ImageStore("containerd", engine.bound_env(), engine)
        info = store.docker("info", "--format", "{{json .DriverStatus}}")
        assert "io.containerd.snapshotter" in info.stdout, info.stdout + info.stderr
        store.load(base_image)
        yield store
    finally:
        stopped = engine.stop()
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.fixture(scope="module", params=["classic", "containerd"])
def image_store(request) -> ImageStore:
    """The few modules whose behaviour differs by image store (export for publish, multi-platform images, verify)
    run once on each: the first engine's (classic) store and a second engine's containerd store."""
    if request.param == "classic":
        return ImageStore("classic", dict(os.environ))
    return request.getfixturevalue("containerd_store")


@dataclass(frozen=True)
class InstalledWheel:
    cli: Path  # its ``stackforge`` executable
    empty_site_mb: int  # the virtual environment's site-packages before the install


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    """stackforge as an operator installs it: a wheel built from this checkout (its git metadata copied too, so the
    build records the commit), installed with its dependencies in a fresh virtual environment (no editable install,
    no PYTHONPATH, none of the builder's extras). Built once per session for the modules that run the installed CLI."""
    import sys

    def du_mb(path: Path) -> int:
        out = subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])

    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO_ROOT, source, symlinks=True,
                    ignore=shutil.ignore_patterns(".venv", "build", "__pycache__", "*.egg-info"))  # fmt: skip
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("stackforge-*.whl")
    venv = tmp / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True, timeout=300)
    empty = du_mb(next(venv.glob("lib/python3*/site-packages")))
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return InstalledWheel(venv / "bin" / "stackforge", empty)
