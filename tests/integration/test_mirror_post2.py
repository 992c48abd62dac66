"""post2 mirrored from the stand-ins and built offline: apt layers, target pip phases and the vllm-rs toolchain.

The session's post2 build (``--network host`` against the loopback stand-ins: indexes, git upstreams, the MUSA
apt repository, Debian's archive for the toolchain's protoc and cargo) is the online build. ``stackforge mirror``
then fetches everything post2 needs — every pip phase of the deps stage and of every target, the .debs of the
``musa`` layer (``install: auto`` on a base without ``mcc``: it installs) and of ``vllm-omni``'s media layer, and
the ``toolchain-vllm_rs`` stage built once with network and saved as an image archive — and the build runs from it
with ``--network=none``. Its fingerprint and inputs label are the online build's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = pytest.mark.engine
OFFLINE_TAG = run_names.image("mirror", "post2-offline")


@pytest.fixture(scope="module")
def offline(standins, post2, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mirror-post2")
    mirror, out = tmp / "mirror", tmp / "build"
    sets = ms.set_args(post2.overrides)
    env = {"STACKFORGE_CACHE": str(standins.root / "upstream-cache")}
    made = mb.stackforge("mirror", "post2", "--to", str(mirror), "--network", "host", "--json", *sets, env=env)
    assert made.returncode == 0, made.stderr[-6000:]
    toolchain = json.loads((mirror / "mirror.json").read_text())["toolchains"]["vllm_rs"]["image"]
    left_tagged = mb.image_id(toolchain)  # the mirror keeps the stage in its archive, not in the engine
    online = mb.image_id(post2.tag)
    build = mb.stackforge("build", "post2", "--offline", "--mirror", str(mirror), "--out", str(out), *sets, env=env)
    built = mb.image_id(post2.tag)
    if built and built != online:  # the offline image gets its own name; the session's post2 keeps its tag
        mb.docker("tag", built, OFFLINE_TAG)
        mb.docker("tag", online, post2.tag)
    yield {
        "mirror": mirror,
        "made": json.loads(made.stdout),
        "build": build,
        "out": out,
        "online": online,
        "left_tagged": left_tagged,
    }
    mb.docker("image", "rm", "--force", OFFLINE_TAG, check=False)


def test_the_mirror_holds_debs_toolchain_and_every_phase(offline, post2, standins):
    data = json.loads((offline["mirror"] / "mirror.json").read_text())
    parts = {p["path"]: p for p in data["parts"]}
    debs = {p["package"]: p for p in parts.values() if p["kind"] == "deb"}
    assert {"musa-toolkit-5-2", "libmthreads-mtml", "jq"} <= set(debs)
    assert debs["libmthreads-mtml"]["version"] == "2.4.1-1"  # the line's version, never 2.4.10-1
    packages = (offline["mirror"] / "apt" / "Packages").read_text()
    for p in debs.values():
        assert f"Filename: {p['path'][len('apt/') :]}\nSize: {p['size']}\nSHA256: {p['sha256']}" in packages
    assert data["apt"]["layers"] == ["musa", "vllm-omni.media"]
    tc = data["toolchains"]["vllm_rs"]
    assert offline["left_tagged"] is None, "the mirror left its toolchain image tagged in the engine"
    assert "load the toolchain stage of kernel vllm_rs from the mirror" in offline["build"].stderr
    assert parts["toolchains/vllm_rs.tar"]["id"] == tc["id"] == mb.image_id(tc["image"])
    assert (
        tc["built_from"]["run"].startswith("bash tools/install_protoc.sh")
        and tc["built_from"]["stage"] == "toolchain-vllm_rs"
    )
    assert tc["built_from"]["stack_fingerprint"] == mb.labels_of(post2.tag)["org.stackforge.fingerprint"]
    assert set(tc["built_from"]["uses"]) == {"tools/install_protoc.sh", "rust-toolchain.toml", "rust"}
    # every pip phase: the deps stage's and each target's (mooncake, vllm-omni's re-pin and its omni phase)
    assert {"targets.mooncake.pip.mooncake", "targets.vllm-omni.pip.tilelang", "targets.vllm-omni.pip.omni"} <= set(
        data["phases"]
    )
    assert any(
        f.startswith("mooncake_transfer_engine_musa-") for f in data["phases"]["targets.mooncake.pip.mooncake"]["files"]
    )
    assert any(f.startswith("tilelang_musa-") for f in data["phases"]["targets.vllm-omni.pip.tilelang"]["files"])
    base = parts["base/image.tar"]
    layout = subprocess.run(["tar", "-tf", str(offline["mirror"] / "base/image.tar")], capture_output=True, text=True)
    assert "oci-layout" in layout.stdout.split() and base["id"] == mb.image_id(standins.base_image)


def test_post2_builds_offline_with_the_online_fingerprint(offline, post2):
    build = offline["build"]
    assert build.returncode == 0, build.stderr[-6000:]
    online, built = mb.labels_of(post2.tag), mb.labels_of(OFFLINE_TAG)
    for key in ("org.stackforge.fingerprint", "org.stackforge.inputs", "org.stackforge.base.id"):
        assert built[key] == online[key], key
    evidence = offline["out"] / "evidence" / "latest"
    inputs = json.loads((evidence / "inputs.json").read_text())
    assert inputs["mirror"]["network"] == "none"
    dockerfile = (evidence / "Dockerfile").read_text()
    assert "--index-url http" not in dockerfile and "file:///stackforge/mirror/mthreads/simple/" in dockerfile
    assert "apt-layer.sh --local /stackforge/mirror/apt /stackforge/system/musa.spec" in dockerfile
    tc = json.loads((offline["mirror"] / "mirror.json").read_text())["toolchains"]["vllm_rs"]
    assert f"FROM {tc['image']} AS toolchain-vllm_rs" in dockerfile and "cargo fetch" not in dockerfile
    system = (evidence / "system.txt").read_text()
    assert "layer musa: apt packages from the mirror's repository /stackforge/mirror/apt" in system
    assert "resolved libmthreads-mtml: libmthreads-mtml=2.4.1-1" in system
    assert "PASS probe  vllm-rs result=vllm/vllm-rs is a file" in (evidence / "gate.txt").read_text()


def test_a_changed_toolchain_is_refused_naming_its_key(offline, post2, tmp_path):
    sets = ms.set_args([*post2.overrides, "kernels.vllm_rs.toolchain.env.CARGO_NET_RETRY=3"])
    proc = mb.stackforge(
        "build",
        "post2",
        "--offline",
        "--mirror",
        str(offline["mirror"]),
        "--out",
        str(tmp_path),
        *sets,
        env={"STACKFORGE_CACHE": str(Path(offline["out"]).parent / "cache-unused")},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "kernels.vllm_rs.toolchain: the mirror's toolchain stage was built from other inputs" in proc.stderr
