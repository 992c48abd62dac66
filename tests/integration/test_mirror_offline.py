"""A mirror of the example stack made from a loopback stand-in of PyPI, then an offline build from it.

The stand-in serves the real files the example pins (the lock's wheels, markupsafe's release sdist). The
example is built online from it (``--network host``), mirrored, and the stand-in is stopped; a listener then
holds its port and another one stands in as the HTTP(S) proxy of the offline stackforge process, so any
request to the old index or to any HTTP endpoint from the host side is recorded. The offline build runs with
``--network=none``: a ``gate.prepare`` step records the network interfaces the engine gave the RUN steps
(only ``lo``). The image's fingerprint and inputs labels equal the online build's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.clients.upstream import SdistSpec, fetch_sdist
from tests.fixtures import run_names
from tests.fixtures.index_server import IndexServer
from tests.fixtures.listener import Listener

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "cache"
pytestmark = pytest.mark.engine
MARKUPSAFE = "722695808f4b6457b320fdc131280796bdceb04ab50fe1795cd540799ebe1698"
#: the RUN steps' network interfaces, as the engine gave them, kept in the image
NET = "gate.prepare=[\"sed -n '3,$p' /proc/net/dev | cut -d: -f1 | tr -d ' ' > /stackforge/net.txt\"]"


def stackforge(root: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "STACKFORGE_CACHE": str(CACHE), **(env or {})},
        timeout=1800,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"stackforge {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def standin_files(dest: Path) -> Path:
    """The real files of the example's pins: the lock's wheels (hash-checked by pip) and markupsafe's sdist."""
    dest.mkdir(parents=True, exist_ok=True)
    lock = REPO / "stacks" / "locks" / "example" / "pypi.txt"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
            "--dest",
            str(dest),
            "-r",
            str(lock),
        ],
        check=True,
        capture_output=True,
    )
    sdist = fetch_sdist(SdistSpec("https://pypi.org/simple", "markupsafe", "3.0.3", MARKUPSAFE), CACHE)
    shutil.copyfile(sdist, dest / sdist.name)
    return dest


def labels(ref: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "image", "inspect", ref, "--format", "{{json .Config.Labels}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def interfaces(ref: str) -> list[str]:
    return subprocess.run(
        ["docker", "run", "--rm", "--network=none", "--entrypoint", "cat", ref, "/stackforge/net.txt"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.fixture(scope="module")
def offline(tmp_path_factory, base_image):
    tmp = tmp_path_factory.mktemp("mirror")
    root = tmp / "repo"
    root.mkdir()
    for d in ("stacks", "patches"):
        shutil.copytree(REPO / d, root / d)
    files = standin_files(tmp / "pypi")
    mirror = tmp / "mirror"
    server = IndexServer(files).start()
    sets = ["--set", f"indexes.pypi.url={server.url}", "--set", NET]
    tag = run_names.image("mirror", "example")  # the tags are part of the fingerprint: both builds use one
    try:
        stackforge(root, "build", "example", *sets, "--set", f"tags.local={tag}", "--network", "host")
        online = {"labels": labels(tag), "interfaces": interfaces(tag)}
        made = json.loads(stackforge(root, "mirror", "example", "--to", str(mirror), *sets, "--json").stdout)
    finally:
        server.stop()
    asked = len(server.requests)
    old_index, proxy = Listener(server.port), Listener()
    no_network = {
        k: f"http://127.0.0.1:{proxy.port}" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
    }
    no_network.update(no_proxy="", NO_PROXY="")
    try:
        again = json.loads(
            stackforge(root, "mirror", "example", "--to", str(mirror), *sets, "--json", env=no_network).stdout
        )
        build = stackforge(
            root,
            "build",
            "example",
            "--offline",
            "--mirror",
            str(mirror),
            "--no-cache",  # every step runs here, none is taken from an earlier build
            *sets,
            "--set",
            f"tags.local={tag}",
            env=no_network,
        )
    finally:
        old_index.close()
        proxy.close()
    yield {
        "root": root,
        "mirror": mirror,
        "made": made,
        "again": again,
        "build": build,
        "asked": asked,
        "server": server,
        "old_index": old_index.seen,
        "proxy": proxy.seen,
        "online": online,
        "offline": tag,
        "sets": sets,
    }
    subprocess.run(["docker", "image", "rm", "--force", tag], capture_output=True)


def test_the_mirror_holds_every_part_with_its_hash(offline):
    mirror, made = offline["mirror"], offline["made"]
    manifest = json.loads((mirror / "mirror.json").read_text())
    paths = {p["path"]: p for p in manifest["parts"]}
    assert set(paths) == {
        "base/image.tar",
        "sdist/markupsafe-3.0.3.tar.gz",
        "indexes/pypi/files/markupsafe-3.0.3.tar.gz",
        "indexes/pypi/files/idna-3.10-py3-none-any.whl",
        "indexes/pypi/files/packaging-25.0-py3-none-any.whl",
        "indexes/pypi/files/setuptools-80.9.0-py3-none-any.whl",
    }
    lock = (REPO / "stacks" / "locks" / "example" / "pypi.txt").read_text()
    for rel, part in paths.items():
        assert part["size"] == (mirror / rel).stat().st_size
        if rel.endswith(".whl"):
            assert f"--hash=sha256:{part['sha256']}" in lock  # the lock's own hashes
            assert part["source"].startswith(offline["server"].url)
    assert paths["sdist/markupsafe-3.0.3.tar.gz"]["sha256"] == MARKUPSAFE
    base = paths["base/image.tar"]
    assert (
        base["id"]
        == subprocess.run(
            ["docker", "image", "inspect", "stackforge/base:bookworm", "--format", "{{.Id}}"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    page = (mirror / "indexes/pypi/simple/idna/index.html").read_text()
    assert (
        f"../../files/idna-3.10-py3-none-any.whl#sha256={paths['indexes/pypi/files/idna-3.10-py3-none-any.whl']['sha256']}"
        in page
    )
    assert len(made["added"]) == 6


def test_mirroring_again_asks_nothing_and_adds_nothing(offline):
    assert offline["again"]["added"] == [] and offline["again"]["kept"] == 6
    assert offline["again"]["manifest"] == offline["made"]["manifest"]  # the manifest is left as it was
    assert offline["old_index"] == [] and offline["proxy"] == []


def test_offline_build_reaches_no_network_and_keeps_the_fingerprint(offline):
    assert offline["asked"] > 0  # the stand-in served the online build and the mirror, then stopped
    assert offline["old_index"] == [], offline["old_index"]  # nothing asked the old index's port afterwards
    assert offline["proxy"] == [], offline["proxy"]  # nor any HTTP(S) endpoint through the host's proxy settings
    assert interfaces(offline["offline"]) == ["lo"]  # the engine gave the RUN steps no network
    assert len(offline["online"]["interfaces"]) > 1  # the online build's RUN steps had the host's network
    online, built = offline["online"]["labels"], labels(offline["offline"])
    for key in ("org.stackforge.fingerprint", "org.stackforge.inputs", "org.stackforge.base.id"):
        assert built[key] == online[key], key
    evidence = offline["root"] / "build" / "example" / "evidence" / "latest"
    inputs = json.loads((evidence / "inputs.json").read_text())
    assert inputs["mirror"]["manifest"] == offline["made"]["manifest"]
    assert inputs["mirror"]["network"] == "none"
    dockerfile = (evidence / "Dockerfile").read_text()
    assert "--index-url file:///stackforge/mirror/pypi/simple/" in dockerfile
    assert "--index-url http" not in dockerfile  # the labels still name the stack's index, as online
    out = subprocess.run(
        ["docker", "run", "--rm", "-i", offline["offline"]], input="<a & b>", capture_output=True, text=True
    )
    assert out.stdout == "&lt;a &amp; b&gt;"


def test_a_tampered_mirror_is_refused_before_the_engine_runs(offline, tmp_path):
    copy = tmp_path / "mirror"
    subprocess.run(["cp", "-al", str(offline["mirror"]), str(copy)], check=True)
    wheel = copy / "indexes/pypi/files/idna-3.10-py3-none-any.whl"
    data = wheel.read_bytes()
    wheel.unlink()  # a new file: the original mirror keeps its bytes
    wheel.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    proc = stackforge(
        offline["root"],
        "build",
        "example",
        "--offline",
        "--mirror",
        str(copy),
        *offline["sets"],
        "--set",
        f"tags.local={run_names.image('mirror', 'tampered')}",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    tampered = hashlib.sha256(wheel.read_bytes()).hexdigest()
    recorded = hashlib.sha256(data).hexdigest()
    assert (
        f"error: --mirror: sha256 mismatch: indexes/pypi/files/idna-3.10-py3-none-any.whl in the mirror has sha256 "
        f"{tampered}, but mirror.json records {recorded}\n" in proc.stderr
    ), proc.stderr
    # A tampered sdist is that too (not an sdist "not cached" in offline mode), in a checkout with no earlier
    # export of it to reuse.
    wheel.unlink()
    wheel.write_bytes(data)
    sdist = copy / "sdist/markupsafe-3.0.3.tar.gz"
    original = sdist.read_bytes()
    sdist.unlink()
    sdist.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    fresh = tmp_path / "fresh"
    for d in ("stacks", "patches"):
        shutil.copytree(offline["root"] / d, fresh / d)
    proc = stackforge(
        fresh,
        "build",
        "example",
        "--offline",
        "--mirror",
        str(copy),
        *offline["sets"],
        "--set",
        f"tags.local={run_names.image('mirror', 'tampered')}",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "error: --mirror: sha256 mismatch: sdist/markupsafe-3.0.3.tar.gz in the mirror has sha256 "
        f"{hashlib.sha256(sdist.read_bytes()).hexdigest()}, but mirror.json records {MARKUPSAFE}\n" in proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stderr and "not cached" not in proc.stderr
    # Without its lock the pypi phase installs other requirements: the mirror did not resolve those.
    unlocked = tmp_path / "repo"
    shutil.copytree(offline["root"] / "stacks", unlocked / "stacks", ignore=shutil.ignore_patterns("locks"))
    shutil.copytree(offline["root"] / "patches", unlocked / "patches")
    other = stackforge(
        unlocked,
        "build",
        "example",
        "--offline",
        "--mirror",
        str(offline["mirror"]),
        *offline["sets"],
        "--set",
        "indexes.pypi.lock=false",
        check=False,
    )
    assert other.returncode == 2, other.stderr
    assert "indexes.pypi: the mirror holds no resolution of pip phase pypi" in other.stderr
