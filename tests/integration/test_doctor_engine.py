"""`stackforge doctor` with the engine: its rows say what the real engine is and can do."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from stackforge.clients.engine import Engine
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.flows import doctor
from stackforge.stack.load import load
from tests.fixtures import musa_builds as mb

pytestmark = pytest.mark.engine


def test_the_engine_rows_name_the_versions_and_the_base_image_is_found_in_the_engine(base_image):
    proc = mb.stackforge(
        "doctor",
        "example",
        "--json",
        "--timeout",
        "5",
        "--set",
        f"base.image={base_image}",
        "--set",
        "indexes.pypi.url=http://127.0.0.1:9/simple",
    )
    rows = {r["check"]: r for r in json.loads(proc.stdout)}
    assert rows["engine"]["status"] == "ok" and rows["engine"]["detail"].startswith("server ")
    assert rows["buildx"]["status"] == "ok" and "BuildKit v" in rows["buildx"]["detail"]
    assert "SOURCE_DATE_EPOCH: " in rows["buildx"]["detail"]
    assert rows["base image"]["detail"] == "present in the engine"
    assert rows["index pypi"]["status"] == "fail" and proc.returncode == 1  # the one endpoint pointed nowhere


def _as_nobody(tmp_path):
    """The real docker CLI run as user nobody (no 'docker' group): the daemon runs, its socket refuses."""
    cli = tmp_path / "docker-as-nobody"
    cli.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups env HOME={tmp_path} docker "$@"\n'
    )
    cli.chmod(0o755)
    return str(cli)


def test_a_user_without_access_to_the_socket_is_told_the_permission_and_its_fix(tmp_path, base_image):
    """Said by the engine client (every verb) and by the doctor, whose base-image row then waits for the engine
    instead of sending the user to --set base.image."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test drops to user nobody with setpriv: run the suite as root (CI does)")
    with pytest.raises(UserError) as caught:
        Engine(docker=_as_nobody(tmp_path)).check()
    assert (
        caught.value.message
        == "this user may not use the Docker daemon's socket /var/run/docker.sock (permission denied)"
    )
    assert "usermod -aG docker" in (caught.value.fix or "") and "DOCKER_HOST" in (caught.value.fix or "")
    ws = Workspace.at(mb.REPO)
    ws.__dict__["engine"] = Engine(docker=_as_nobody(tmp_path))
    rows = {
        r.check: r for r in doctor.diagnose([load("example", overrides=[f"base.image={base_image}"])], ws, timeout=5)
    }
    assert rows["engine"].status == "fail" and rows["engine"].detail.startswith(
        "this user may not use the Docker daemon's socket"
    )
    assert "usermod -aG docker" in rows["engine"].detail
    assert rows["base image"].status == "skip" and rows["base image"].fixes() is None
    assert "the engine does not answer" in rows["base image"].detail
