"""``stackforge lock`` for a small stack against a local index over real HTTP (basic auth): the resolution is
for the stack's Python and platform — markers (``platform_machine``, ``python_version``), ``Requires-Python``
and wheel tags — by uv's resolver, without any hook into pip's private modules, and the credential reaches no
command line; ``lock --check`` says whether the checked-in locks are current; an unlocked public phase is
named at build time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stackforge.build.locks import parse_lock
from stackforge.cli import main as cli
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_wheel

PASSWORD = "Tgt-pw 7731"
USER = "lockci"
MANYLINUX = "manylinux_2_17_x86_64.manylinux2014_x86_64"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("target-index")
    build_wheel(
        d,
        "top",
        "1.0",
        requires_dist=[
            'armonly>=1; platform_machine == "aarch64"',
            'x86only>=1; platform_machine == "x86_64"',
            'old>=1; python_version < "3.11"',
        ],
    )
    for name in ("armonly", "x86only", "old"):
        build_wheel(d, name, "1.0")
    for py in ("cp310", "cp311"):  # the wheel for the target's interpreter and platform, and one that is not
        build_wheel(d, "fast", "2.0", python_tag=py, abi_tag=py, platform_tag=MANYLINUX)
        build_wheel(d, "fast", "2.0", python_tag=py, abi_tag=py, platform_tag="manylinux_2_17_aarch64")
    with IndexServer(d, auth=(USER, PASSWORD)) as server:
        yield server


def _root(tmp: Path, server: IndexServer) -> Path:
    root = tmp / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "stacks" / "tiny.yaml").write_text(f"""name: tiny
platform: {{os: ubuntu22.04, python: "3.10", arch: x86_64}}
base: {{image: stackforge/base:bookworm}}
indexes:
  pub: {{url: "{server.url}", role: public, private: true}}
packages:
  top: {{version: "1.0", index: pub}}
  fast: {{version: "2.0", index: pub}}
tags: {{local: "tiny:1"}}
targets: {{app: {{}}}}
""")
    return root


def _cli(capsys, root: Path, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["--root", str(root), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def creds(monkeypatch, tmp_path):
    monkeypatch.setenv("STACKFORGE_INDEX_PUB_USERNAME", USER)
    monkeypatch.setenv("STACKFORGE_INDEX_PUB_PASSWORD", PASSWORD)
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NETRC", raising=False)


def _spy(monkeypatch) -> list[list[str]]:
    """Every command `stackforge lock` runs, as its argv."""
    seen: list[list[str]] = []
    real = subprocess.run

    def run(cmd, *a, **kw):
        seen.append([str(c) for c in cmd])
        return real(cmd, *a, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    return seen


@pytest.mark.parametrize(
    ("sets", "expect", "wheel", "target"),
    [
        (
            [],
            {"fast", "old", "top", "x86only"},
            "cp310-cp310-manylinux_2_17_x86_64",
            "CPython 3.10 on manylinux_2_35_x86_64",
        ),
        (
            ["platform.arch=aarch64", "platform.python=3.11"],
            {"fast", "top", "armonly"},
            "cp311-cp311-manylinux_2_17_aarch64",
            "CPython 3.11 on manylinux_2_35_aarch64",
        ),
    ],
)
def test_the_lock_resolves_markers_and_wheels_for_the_target_with_uv_and_no_pip_hook(
    index, tmp_path, monkeypatch, capsys, creds, sets, expect, wheel, target
):
    root = _root(tmp_path, index)
    seen = _spy(monkeypatch)
    code, out, err = _cli(capsys, root, "lock", "tiny", *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    path = root / "stacks" / "locks" / "tiny" / "pub.txt"
    text = path.read_text()
    lock = parse_lock(path, text)
    # platform_machine and python_version markers are the target's, not this host's (x86_64, CPython 3.11)
    assert set(lock.pins) == expect
    assert lock.via["top"] == {"-r requirements.in"} and lock.via[next(iter(expect - {"fast", "top"}))] == {"top"}
    # one hash: the wheel pip installs for the target, not the other platform's
    chosen = next(index.directory.glob(f"fast-2.0-{wheel}*.whl"))
    import hashlib

    assert lock.pins["fast"][1] == [hashlib.sha256(chosen.read_bytes()).hexdigest()]
    assert f"for {target}, made by `stackforge lock tiny`\n# (uv's resolver against" in text
    # uv resolved it, for the target, without a hook into pip's private modules; the credential is on no argv
    uv = [c for c in seen if c[1:3] == ["pip", "compile"]]
    assert uv and all(c[c.index("--python-version") + 1] == target.split()[1] for c in uv)
    assert not any("pip._vendor" in a or "markers" in a for c in seen for a in c)
    assert not any(PASSWORD in a or PASSWORD.replace(" ", "%20") in a for c in seen for a in c)
    assert PASSWORD not in text + out + err
