"""The CA bundle reaches a build as a one-file named context (a bind mount), or as a secret on an old engine."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stackforge.builder.plan import cabundle
from stackforge.builder.plan.secrets import host_inputs
from stackforge.clients.workspace import Workspace
from stackforge.stack.load import load
from tests.fixtures.stack_support import REPO

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "host" / "corp-ca.pem"
    path.parent.mkdir()
    path.write_text(PEM)
    path.chmod(0o600)
    return path


def test_a_named_context_engine_gets_a_directory_with_only_the_bundle(tmp_path, bundle):
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    secrets, contexts = host_inputs(
        load("post2", root=REPO), secrets_dir, True, Workspace.at(REPO, ca_bundle=str(bundle))
    )
    assert [sid for sid, _ in secrets if sid == "cabundle"] == []
    assert contexts == {"stackforge-cabundle": secrets_dir / "stackforge-cabundle"}
    directory = contexts["stackforge-cabundle"]
    assert [p.name for p in directory.iterdir()] == ["ca.pem"]  # BuildKit transfers this one file
    assert (directory / "ca.pem").read_text() == PEM
    # readable by whoever runs the engine's client, whatever the host file's mode
    assert stat.S_IMODE((directory / "ca.pem").stat().st_mode) == 0o644


def test_an_engine_without_named_contexts_gets_the_bundle_as_the_cabundle_secret(tmp_path, bundle):
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    secrets, contexts = host_inputs(
        load("post2", root=REPO), secrets_dir, False, Workspace.at(REPO, ca_bundle=str(bundle))
    )
    assert ("cabundle", bundle) in secrets
    assert contexts == {}
    assert not (secrets_dir / "stackforge-cabundle").exists()


def test_no_bundle_means_no_context_and_no_secret(tmp_path):
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    for named in (True, False):
        secrets, contexts = host_inputs(
            load("post2", root=REPO), secrets_dir, named, Workspace.at(REPO, ca_bundle="none")
        )
        assert [sid for sid, _ in secrets if sid == "cabundle"] == [] and contexts == {}
    assert not (secrets_dir / "stackforge-cabundle").exists()


def test_the_mount_follows_the_bundle_and_the_engine():
    assert cabundle.ca_mount(False) is None and cabundle.ca_mount(False, named_contexts=False) is None
    bind = cabundle.ca_mount(True)
    assert bind is not None and bind.path == "/run/stackforge/ca.pem"
    assert bind.flag == "--mount=type=bind,from=stackforge-cabundle,source=ca.pem,target=/run/stackforge/ca.pem"
    secret = cabundle.ca_mount(True, named_contexts=False)
    assert secret is not None and secret.path == "/run/secrets/cabundle"
    assert secret.flag == "--mount=type=secret,id=cabundle"
