"""Registry credentials found as docker finds them: STACKFORGE_REGISTRY_*, then the docker config's credential
helper for the host (credHelpers), its credsStore, its auths; proxies and CA bundle from the environment."""

from __future__ import annotations

import base64
import json
import os

import pytest

from stackforge import netread
from stackforge.clients import credentials
from stackforge.errors import UserError
from tests.fixtures.credential_helper import install_helper

HOST = "registry.example.com:5000"


@pytest.fixture(autouse=True)
def _fresh():
    credentials._ASKED.clear()
    yield
    credentials._ASKED.clear()


def _config(tmp_path, **data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def _env(tmp_path, **extra):
    return {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", **extra}


def _auth(user, password):
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_host_helper_comes_before_the_store_and_auths(tmp_path):
    install_helper(tmp_path / "bin", "ecr", {HOST: ["AWS", "from-ecr"]})
    install_helper(tmp_path / "bin", "pass", {HOST: ["me", "from-pass"]})
    cfg = _config(tmp_path, credHelpers={HOST: "ecr"}, credsStore="pass", auths={HOST: _auth("me", "from-auths")})
    assert credentials.for_registry(HOST, env=_env(tmp_path), docker_config=cfg) == ("AWS", "from-ecr")


def test_the_store_serves_every_host_and_is_asked_with_docker_s_server_keys(tmp_path):
    asks = install_helper(tmp_path / "bin", "desktop", {f"https://{HOST}": ["me", "s3cret"]})
    cfg = _config(tmp_path, credsStore="desktop", auths={HOST: {}})
    assert credentials.for_registry(HOST, env=_env(tmp_path), docker_config=cfg) == ("me", "s3cret")
    assert asks.read_text().splitlines() == [f"get {HOST}", f"get https://{HOST}"]
    credentials.for_registry(HOST, env=_env(tmp_path), docker_config=cfg)
    assert len(asks.read_text().splitlines()) == 2  # asked once per run


def test_a_helper_that_holds_nothing_leaves_the_auths_entry(tmp_path):
    install_helper(tmp_path / "bin", "desktop", {})
    cfg = _config(tmp_path, credsStore="desktop", auths={HOST: _auth("me", "old")})
    assert credentials.for_registry(HOST, env=_env(tmp_path), docker_config=cfg) == ("me", "old")
    assert credentials.for_registry("other.example.com", env=_env(tmp_path), docker_config=cfg) is None


def test_the_environment_comes_first(tmp_path):
    cfg = _config(tmp_path, credsStore="missing-helper")
    env = _env(tmp_path, STACKFORGE_REGISTRY_USER="ci", STACKFORGE_REGISTRY_PASSWORD="token")
    assert credentials.for_registry(HOST, env=env, docker_config=cfg) == ("ci", "token")


def test_a_named_helper_that_is_not_installed_says_where_it_is_named(tmp_path):
    cfg = _config(tmp_path, credHelpers={HOST: "gcr"})
    with pytest.raises(UserError) as caught:
        credentials.for_registry(HOST, env=_env(tmp_path), docker_config=cfg)
    assert (
        caught.value.message
        == f"{cfg} names the credential helper 'gcr' for {HOST}, and docker-credential-gcr is not on PATH"
    )
    assert "STACKFORGE_REGISTRY_USER" in (caught.value.fix or "")


def test_an_identity_token_is_refused_with_the_way_around(tmp_path):
    install_helper(tmp_path / "bin", "desktop", {HOST: ["<token>", "refresh-token"]})
    cfg = _config(tmp_path, credsStore="desktop")
    with pytest.raises(UserError, match="identity token") as caught:
        credentials.for_registry(HOST, env=_env(tmp_path), docker_config=cfg)
    assert "refresh-token" not in caught.value.render()


def test_proxies_and_ca_bundle_come_from_the_environment_but_never_for_loopback():
    env = {
        "HTTPS_PROXY": "http://proxy.internal:3128",
        "NO_PROXY": "internal.example.com",
        "REQUESTS_CA_BUNDLE": "/ca.pem",
    }
    assert netread.environment_settings("https://registry.example.com/v2/", env) == {
        "proxies": {"https": "http://proxy.internal:3128"},
        "verify": "/ca.pem",
    }
    assert netread.environment_settings("https://r.internal.example.com/v2/", env)["proxies"] == {}
    assert netread.environment_settings("http://127.0.0.1:5000/v2/", {"http_proxy": "http://p:1"})["proxies"] == {}
    assert netread.environment_settings("https://registry.example.com/v2/", {}) == {"proxies": {}, "verify": True}
