"""A registry that asks for a login, reached with the login `docker login` keeps in a credential helper: the
registry client (publish, pull, verify) asks the helper named in the docker config, as docker does."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest

from stackforge.clients import credentials
from stackforge.clients.registry import RegistryClient, RegistryError, parse_repository
from tests.fixtures.credential_helper import install_helper
from tests.fixtures.registry import start_registry

pytestmark = pytest.mark.registry
LOGIN = ("publisher", "s3cret-pw")


@pytest.fixture(scope="module")
def locked_registry(tmp_path_factory):
    url, stop = start_registry(tmp_path_factory.mktemp("locked-registry"), login=LOGIN)
    yield url
    stop()


@pytest.fixture
def docker_home(tmp_path, monkeypatch):
    """A docker client config of this test's own, and a PATH that holds its helpers."""
    credentials._ASKED.clear()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("STACKFORGE_REGISTRY_USER", raising=False)
    monkeypatch.delenv("STACKFORGE_REGISTRY_PASSWORD", raising=False)
    (tmp_path / "docker").mkdir()
    yield tmp_path
    credentials._ASKED.clear()


def _push(url: str, tag: str) -> list[str]:
    client = RegistryClient(parse_repository(f"{url}/team/app"))
    config = b"{}"
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    client.upload_blob(digest, len(config), lambda: io.BytesIO(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": len(config)},
        "layers": [],
    }
    client.put_manifest(tag, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    return client.list_tags()


def test_a_push_uses_the_login_of_the_credential_store(locked_registry, docker_home):
    asks = install_helper(docker_home / "bin", "standin", {locked_registry: list(LOGIN)})
    (docker_home / "docker" / "config.json").write_text(
        json.dumps({"credsStore": "standin", "auths": {locked_registry: {}}})
    )
    assert "night-1" in _push(locked_registry, "night-1")
    assert asks.read_text().splitlines() == [f"get {locked_registry}"]


def test_a_host_helper_with_a_wrong_password_is_refused_by_the_registry(locked_registry, docker_home):
    install_helper(docker_home / "bin", "wrong", {locked_registry: [LOGIN[0], "not-it"]})
    (docker_home / "docker" / "config.json").write_text(json.dumps({"credHelpers": {locked_registry: "wrong"}}))
    with pytest.raises(RegistryError):
        _push(locked_registry, "night-2")


def test_without_any_login_the_registry_refuses(locked_registry, docker_home):
    with pytest.raises(RegistryError):
        _push(locked_registry, "night-3")
