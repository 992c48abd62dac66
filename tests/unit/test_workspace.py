"""The run's Workspace: root found when first asked, caches, CA bundle, one engine."""

from __future__ import annotations

import argparse

import pytest

from stackforge.cli.options import root_of, workspace_of
from stackforge.clients.workspace import Workspace, ca_bundle_file
from stackforge.errors import UserError


def test_caches_live_under_the_root_unless_the_environment_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("STACKFORGE_CACHE", raising=False)
    ws = Workspace.at(tmp_path)
    assert ws.cache() == tmp_path / "build" / "cache"
    assert ws.cache("index") == tmp_path / "build" / "cache" / "index"
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "elsewhere"))
    assert ws.cache("layers") == tmp_path / "elsewhere" / "layers"


def test_outside_a_repository_the_caches_are_the_users(tmp_path, monkeypatch):
    monkeypatch.delenv("STACKFORGE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def nowhere():
        raise UserError("no stacks/ directory here")

    ws = Workspace(nowhere)
    assert ws.cache("wheels") == tmp_path / "xdg" / "stackforge" / "wheels"
    with pytest.raises(UserError):
        ws.root  # noqa: B018 - a verb that needs the root gets the error


def test_the_ca_bundle_choice(tmp_path, monkeypatch):
    assert ca_bundle_file(None) is None and ca_bundle_file("none") is None
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("STACKFORGE_CA_BUNDLE", str(pem))
    assert Workspace.at(tmp_path).ca_bundle_file() == pem  # "auto" honours the environment
    with pytest.raises(UserError) as err:
        Workspace.at(tmp_path, ca_bundle=str(tmp_path / "missing.pem")).ca_bundle_file()
    assert err.value.file == "--ca-bundle"


def test_one_engine_per_workspace_with_its_builder(tmp_path):
    ws = Workspace.at(tmp_path, builder="remote-bk")
    assert ws.engine is ws.engine and ws.engine.builder == "remote-bk"


def test_a_verb_called_without_main_gets_one_workspace_and_its_root_checks(tmp_path):
    (tmp_path / "stacks").mkdir()
    args = argparse.Namespace(root=str(tmp_path), ca_bundle="none", builder="b")
    ws = workspace_of(args)
    assert workspace_of(args) is ws and (ws.ca_bundle, ws.builder) == ("none", "b")
    assert root_of(args) == tmp_path.resolve()
    missing = argparse.Namespace(root=str(tmp_path / "nope"))
    with pytest.raises(UserError) as err:
        root_of(missing)
    assert "no such directory" in err.value.message and err.value.file == "--root"
