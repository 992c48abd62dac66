"""Credential helpers and the docker config as hostile input: a helper that never answers or answers endlessly is
stopped, a failing helper's output (which may hold the password) is never shown, a helper name with a path runs
nothing, and a docker config that is a FIFO, a device, huge or of the wrong shape is one error naming it."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from stackforge.clients import credentials
from stackforge.clients.containers import RunSpec
from stackforge.errors import UserError
from tests.fixtures import hostile_files as hf

HOST = "registry.example.com:5000"
SECRET = "hunter2-very-secret"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    credentials._ASKED.clear()
    monkeypatch.setattr(credentials, "HELPER_SECONDS", 3.0)
    yield
    credentials._ASKED.clear()


def _helper(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / f"docker-credential-{name}"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return path


def _ask(tmp_path: Path, config: dict | None = None, cfg: Path | None = None):
    if cfg is None:
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(config))
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    out: dict = {}

    def go():
        try:
            out["value"] = credentials.for_registry(HOST, env=env, docker_config=cfg)
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the resolver still waits"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_helper_that_never_answers_is_stopped(tmp_path):
    _helper(tmp_path / "bin", "slow", "time.sleep(600)")
    with pytest.raises(UserError, match=r"gave no answer .* within 3 s \(stopped\)"):
        _ask(tmp_path, {"credsStore": "slow"})


def test_a_helper_that_answers_endlessly_is_stopped(tmp_path):
    _helper(tmp_path / "bin", "endless", "while True: sys.stdout.write('x' * 65536)")
    with pytest.raises(UserError, match=r"printed more than 1048576 bytes"):
        _ask(tmp_path, {"credsStore": "endless"})


def test_a_failing_helper_s_output_is_never_shown(tmp_path):
    _helper(tmp_path / "bin", "leaky", f"print('login failed for user me with password {SECRET}', file=sys.stderr)\n"
            f"print('{SECRET}')\nsys.exit(3)")  # fmt: skip
    with pytest.raises(UserError) as err:
        _ask(tmp_path, {"credsStore": "leaky"})
    shown = err.value.render()
    assert SECRET not in shown and "exit 3" in shown and "not shown" in shown


def test_a_malformed_answer_is_not_shown_either(tmp_path):
    _helper(tmp_path / "bin", "odd", f'print(\'{{"Username": 5, "Secret": "{SECRET}"}}\')')
    with pytest.raises(UserError, match="no Username and Secret") as err:
        _ask(tmp_path, {"credsStore": "odd"})
    assert SECRET not in err.value.render()


@pytest.mark.parametrize("name", ["../../tmp/evil", "/bin/sh", "a b", "x;rm", ""])
def test_a_helper_name_is_a_bare_name(tmp_path, name):
    ran = tmp_path / "ran"
    evil = _helper(tmp_path / "bin", "x", f"open({str(ran)!r}, 'w').write('ran')")
    (tmp_path / "tmp").mkdir()
    os.symlink(evil, tmp_path / "tmp" / "evil")
    config = {"credHelpers": {HOST: name}} if name else {"credsStore": name, "auths": {}}
    if name:
        with pytest.raises(UserError, match="not a bare name"):
            _ask(tmp_path, config)
    else:
        assert _ask(tmp_path, config) is None  # an empty store is no store, as for docker
    assert not ran.exists()


@pytest.mark.parametrize("maker", ["fifo", "zero_link", "deep_json", "not_utf8"])
def test_a_docker_config_that_is_not_a_file_of_json_is_one_error(tmp_path, maker):
    cfg = hf.SPECIALS[maker](tmp_path / "config.json")
    with pytest.raises(UserError) as err:
        _ask(tmp_path, cfg=cfg)
    assert str(cfg) in err.value.render() and "DOCKER_CONFIG" in (err.value.fix or "")


def test_a_huge_docker_config_is_refused(tmp_path):
    cfg = hf.huge(tmp_path / "config.json", 64 << 20)
    with pytest.raises(UserError, match="larger than"):
        _ask(tmp_path, cfg=cfg)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"auths": []}, "auths"),
        ({"auths": {HOST: {"auth": 5}}}, f"auths.{HOST}.auth"),
        ({"credHelpers": {HOST: ["pass"]}}, f"credHelpers.{HOST}"),
        ({"credsStore": {"a": 1}}, "credsStore"),
    ],
)
def test_a_docker_config_of_the_wrong_shape_names_the_field(tmp_path, config, field):
    with pytest.raises(UserError) as err:
        _ask(tmp_path, config)
    assert f": {field}:" in err.value.message


def test_a_bad_auth_entry_is_anonymous_not_a_crash(tmp_path):
    assert _ask(tmp_path, {"auths": {HOST: {"auth": "%%%not base64"}}}) is None


def test_a_huge_netrc_is_refused(tmp_path, monkeypatch):
    netrc = hf.huge(tmp_path / "netrc", 8 << 20)
    monkeypatch.setenv("NETRC", str(netrc))
    with pytest.raises(UserError, match="larger than"):
        credentials.netrc_credentials("example.com")
    fifo = hf.fifo(tmp_path / "netrc2")
    monkeypatch.setenv("NETRC", str(fifo))
    assert credentials.netrc_credentials("example.com") is None


@pytest.mark.parametrize("maker", ["fifo", "zero_link"])
def test_the_docker_cli_is_not_run_on_a_config_it_would_hang_on(tmp_path, maker):
    from stackforge.clients.engine import Engine

    hf.SPECIALS[maker](tmp_path / "config.json")
    ran = tmp_path / "ran"
    docker = _helper(tmp_path / "bin", "unused", "")  # any program: it must not be started
    docker.write_text(f"#!/bin/sh\ntouch {ran}\n")
    engine = Engine(docker=str(docker), env={"PATH": os.environ["PATH"], "DOCKER_CONFIG": str(tmp_path)})
    for call in (lambda: engine.cli("version"), lambda: engine.run_output(RunSpec("img:1"), timeout=5)):
        with pytest.raises(UserError, match="docker config is") as err:
            hf.within(10, call)
        assert "DOCKER_CONFIG" in (err.value.fix or "")
    assert not ran.exists()
