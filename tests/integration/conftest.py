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

import subprocess
from pathlib import Path

import pytest

from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from tests.fixtures import run_share
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
