"""The operator's install leaves the builder's extras out (uv: `lock`, zstandard: `zstd`): a verb that needs one says
which, with the command that installs it. `stackforge --version` names the commit it was built from."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from stackforge import __version__, buildinfo, extras
from stackforge.clients import pip
from stackforge.errors import UserError
from stackforge.publish import codec
from tests.fixtures.stack_support import RootSpec, repo_root, run_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_uv(monkeypatch, tmp_path):
    """No uv package importable and none on PATH (an empty directory is the whole PATH)."""
    monkeypatch.setitem(sys.modules, "uv", None)  # `import uv` raises ImportError
    (tmp_path / "empty-path").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))


def test_find_uv_without_uv_names_the_lock_extra(no_uv):
    with pytest.raises(UserError) as caught:
        pip.find_uv()
    err = caught.value
    assert "operator's install of stackforge leaves out" in err.message and sys.executable in err.message
    assert err.fix is not None and "pip install 'stackforge[lock]'" in err.fix and "make venv" in err.fix


def test_lock_without_uv_fails_at_once_and_writes_nothing(no_uv, capsys, tmp_path):
    root = repo_root(tmp_path, RootSpec(stacks=("example.yaml",), parts=("stacks/locks",)))
    before = sorted(p.read_bytes() for p in (root / "stacks" / "locks").rglob("*") if p.is_file())
    code, out, err = run_cli(capsys, root, "lock", "example")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: `stackforge lock` resolves with uv's resolver"), err
    assert "pip install 'stackforge[lock]'" in lines[1]
    assert sorted(p.read_bytes() for p in (root / "stacks" / "locks").rglob("*") if p.is_file()) == before
    assert not (root / "build").exists()  # no export, no cache: it stopped before any work


def test_zstd_layers_without_zstandard_name_the_zstd_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)
    assert codec.codec("gzip") is not None  # the default needs nothing more
    with pytest.raises(UserError) as caught:
        codec.codec("zstd")
    assert "zstd layers (--compression zstd) needs the Python package 'zstandard'" in caught.value.message
    assert caught.value.fix is not None and "pip install 'stackforge[zstd]'" in caught.value.fix


def test_need_returns_the_module_when_it_is_there():
    assert extras.need("json", "lock", "reading JSON").loads("[1]") == [1]


def test_the_extras_named_are_the_ones_pyproject_declares():
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    declared: dict[str, list[str]] = {}
    for text in requires("stackforge") or []:
        req = Requirement(text)
        for extra in extras.EXTRAS:
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                declared.setdefault(extra, []).append(f"{req.name}{req.specifier}")
    for extra, requirement in extras.EXTRAS.items():
        assert declared[extra] == [requirement]
        assert f"pipx inject stackforge '{requirement}'" in extras.install_hint(extra)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_version_names_the_checkouts_commit(capsys):
    """The developer's editable install: no recorded file, git asked in the checkout."""
    from stackforge.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    line = capsys.readouterr().out.strip()
    head = _git("rev-parse", "HEAD")
    dirty = "-dirty" if _git("status", "--porcelain", "--", *buildinfo.BUILD_PATHS) else ""
    assert line == f"stackforge {__version__} (commit {head}{dirty})"


def test_a_recorded_commit_wins_and_a_malformed_one_is_unknown(monkeypatch, capsys):
    from stackforge.cli.main import main

    fake = types.ModuleType("stackforge._build_info")
    fake.COMMIT = "a" * 40  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "stackforge._build_info", fake)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"stackforge {__version__} (commit {'a' * 40})\n"  # not the checkout's
    fake.COMMIT = "$(reboot)"  # type: ignore[attr-defined]
    assert buildinfo.recorded() == "unknown"
    assert (
        buildinfo.describe("9.9", buildinfo.recorded())
        == "stackforge 9.9 (commit unknown: built outside a git checkout)"
    )


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    from stackforge.clients.git import checkout_commit

    assert checkout_commit(tmp_path, buildinfo.BUILD_PATHS) is None
    (tmp_path / "inner").mkdir()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert checkout_commit(tmp_path / "inner", buildinfo.BUILD_PATHS) is None  # inside a repository, not its top
    assert checkout_commit(tmp_path, buildinfo.BUILD_PATHS) is None  # a repository without a commit
    assert checkout_commit(REPO, buildinfo.BUILD_PATHS) == _git("rev-parse", "HEAD") + (
        "-dirty" if _git("status", "--porcelain", "--", *buildinfo.BUILD_PATHS) else ""
    )
