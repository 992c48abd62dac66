"""`stackforge doctor --registry R` without a stack, against real registries on loopback: it checks a push to the
repository R names (an upload started and cancelled), with the push credential, and refuses a bare host."""

from __future__ import annotations

import json

import pytest

from stackforge.cli.main import main
from stackforge.clients import credentials
from tests.fixtures.registry import free_port, start_registry

pytestmark = pytest.mark.registry
LOGIN = ("publisher", "doctor-s3cret")


@pytest.fixture(scope="module")
def locked_registry(tmp_path_factory):
    url, stop = start_registry(tmp_path_factory.mktemp("doctor-locked-registry"), login=LOGIN)
    yield url
    stop()


@pytest.fixture(autouse=True)
def no_login(tmp_path, monkeypatch):
    """No credential but what a test sets: an empty docker config, no STACKFORGE_REGISTRY_* variables."""
    credentials._ASKED.clear()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("STACKFORGE_REGISTRY_USER", raising=False)
    monkeypatch.delenv("STACKFORGE_REGISTRY_PASSWORD", raising=False)
    (tmp_path / "docker").mkdir()
    yield
    credentials._ASKED.clear()


def doctor(capsys, tmp_path, *args: str) -> tuple[int, list[dict], str]:
    code = main(["--root", str(tmp_path), "doctor", "--no-engine", "--timeout", "5", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else [], err


def test_an_open_registry_takes_the_push(capsys, tmp_path, registry):
    code, rows, err = doctor(capsys, tmp_path, "--registry", f"{registry}/team/app")
    assert code == 0, err
    (row,) = rows
    assert (row["check"], row["endpoint"], row["status"]) == ("registry push", f"{registry}/team/app", "ok")
    assert "accepts a push" in row["detail"]


def test_a_locked_registry_refuses_without_the_credential_and_takes_it_with_it(
    capsys, tmp_path, locked_registry, monkeypatch
):
    code, rows, _ = doctor(capsys, tmp_path, "--registry", f"{locked_registry}/team")
    assert code == 1
    (row,) = rows
    assert row["status"] == "fail" and "401" in row["detail"], row
    assert "STACKFORGE_REGISTRY_USER" in row["detail"]

    monkeypatch.setenv("STACKFORGE_REGISTRY_USER", LOGIN[0])
    monkeypatch.setenv("STACKFORGE_REGISTRY_PASSWORD", "not-it")
    code, rows, _ = doctor(capsys, tmp_path, "--registry", f"{locked_registry}/team")
    assert code == 1 and rows[0]["status"] == "fail"
    assert "not-it" not in json.dumps(rows)

    monkeypatch.setenv("STACKFORGE_REGISTRY_PASSWORD", LOGIN[1])
    code, rows, err = doctor(capsys, tmp_path, "--registry", f"{locked_registry}/team")
    assert code == 0, (rows, err)
    assert rows[0]["status"] == "ok"
    assert LOGIN[1] not in json.dumps(rows)


def test_a_registry_that_does_not_answer_fails_the_row(capsys, tmp_path):
    closed = free_port()
    code, rows, _ = doctor(capsys, tmp_path, "--registry", f"127.0.0.1:{closed}/team")
    assert code == 1
    assert rows[0]["status"] == "fail" and "refused" in rows[0]["detail"].lower(), rows


def test_a_bare_host_without_a_stack_is_refused(capsys, tmp_path, registry):
    code = main(["--root", str(tmp_path), "doctor", "--no-engine", "--registry", registry])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    first, fix = err.strip().splitlines()
    assert first.startswith("error: --registry: without a stack, doctor checks a push to the repository")
    assert "names no repository" in first
    assert fix.startswith("  fix: ") and "doctor STACK --registry R" in fix


def test_the_table_names_the_registry_under_host(capsys, tmp_path, registry):
    code = main(["--root", str(tmp_path), "doctor", "--no-engine", "--registry", f"{registry}/team"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "host:"
    assert out[1].split()[:3] == ["ok", "registry", "push"] and f"{registry}/team:" in out[1]
    assert out[-1] == "doctor: 1 ok, 0 failed"
