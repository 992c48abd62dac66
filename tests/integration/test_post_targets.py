"""The fork's target chain of the real post2 stack, built from the stand-ins (shares test_post_stacks' session).

mooncake and final are intermediate targets (publish: false), vllm-openai builds on them, vllm-omni is a
child of vllm-openai with its own apt layer, upstream, offline wheel, pip phases under the installed vendor
dists and a declared re-pin, and default is an alias of vllm-openai. Only endpoints, the base image and the
omni media package list are overridden (tests/fixtures/musa_standins.py ``overrides``).
"""

from __future__ import annotations

import json

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

TAG = run_names.namespaced("vllm-musa:ubuntu22.04_py3.11_musa_runtime_5.2_pytorch_release_2.11.0.post2_musa5.2.0")


@pytest.fixture(scope="module")
def openai(standins):
    build = standins.happy("post2")
    assert build.ok, build.describe()
    return build


@pytest.fixture(scope="module")
def omni(standins, openai):
    ep = standins.endpoints(standins.specs("post2"))
    build = standins.build("post2", standins.overrides(ep), "--target", "vllm-omni", label="post2-omni")
    assert build.ok, build.describe()
    return build


def run(image: str, *argv: str) -> str:
    return mb.docker("run", "--rm", "--network=none", "--entrypoint", argv[0], image, *argv[1:]).stdout


def phase_lines(image: str, record: str) -> list[str]:
    """The preserve lines of one phase, from the record the phase left in the image."""
    return json.loads(run(image, "cat", f"/stackforge/reports/{record}"))["preserve"]


def test_omni_keeps_every_vendor_pin_but_the_declared_repin(omni, standins):
    stack = standins.stack("post2", omni.overrides)
    vendor = {n: p.version for n, p in stack.packages.items() if stack.indexes[p.index].role == "vendor"}
    tilelang = phase_lines(omni.image, "target-vllm-omni-01-tilelang.json")
    # The constraints come from the image: the vendor dists, then the build's own wheels (the omni wheel too).
    want = {
        **vendor,
        "tilelang_musa": ms.TILELANG_REPIN,
        "vllm": "0.28.0",
        "vllm_musa": "0.1.24",
        "vllm_omni": "0.28.0+musa",
    }
    assert tilelang[:-1] == [f"PASS preserve {n} version={v}" for n, v in want.items()]
    omni_lines = phase_lines(omni.image, "target-vllm-omni-02-omni.json")
    assert omni_lines[:-1] == tilelang[:-1]  # the re-pinned tilelang is held at its new version
    assert omni_lines[-1] == f"preserve result: {len(want)} PASS, 0 FAIL after phase vllm-omni/omni"
    versions = json.loads(
        run(
            omni.image,
            "python",
            "-c",
            (
                "import json; from importlib.metadata import version as v; "
                "print(json.dumps({n: v(n) for n in ('torch', 'tilelang-musa', 'numpy', 'opencv-python', 'vllm-omni')}))"
            ),
        )
    )
    assert versions == {
        "torch": vendor["torch"],
        "tilelang-musa": ms.TILELANG_REPIN,
        "numpy": "1.26.4",
        "opencv-python": "4.11.0.86",
        "vllm-omni": "0.28.0+musa",
    }


def test_omni_checks_labels_source_fix_and_layers(omni, standins):
    assert run(omni.image, "cat", "/stackforge/targets/mooncake/checks.txt").splitlines() == [
        "PASS probe  mooncake result=mooncake-transfer-engine-musa 0.3.13 target=mooncake"
    ]
    assert run(omni.image, "cat", "/stackforge/targets/vllm-omni/checks.txt").splitlines() == [
        "PASS probe  vllm-omni result=0.28.0+musa target=vllm-omni",
        "PASS probe  numpy-override result=numpy<2 target=vllm-omni",
        "PASS probe  media-imports result=av cv2 soundfile cv2=4.11 target=vllm-omni",
    ]
    # The same records, every target the image went through, are in the evidence.
    assert omni.evidence_lines("checks.txt") == [
        "PASS probe  mooncake result=mooncake-transfer-engine-musa 0.3.13 target=mooncake",
        "PASS probe  vllm-omni result=0.28.0+musa target=vllm-omni",
        "PASS probe  numpy-override result=numpy<2 target=vllm-omni",
        "PASS probe  media-imports result=av cv2 soundfile cv2=4.11 target=vllm-omni",
    ]
    labels = mb.labels_of(omni.image)
    commit = standins.repos["vllm_omni"].commit
    assert labels["com.mthreads.vllm-omni.revision"] == commit
    assert labels["com.mthreads.vllm-omni.ref"] == "v0.28.0"
    assert labels["org.stackforge.upstream.vllm_omni"] == f"v0.28.0@{commit}"
    assert labels["org.stackforge.repin.tilelang-musa"] == ms.TILELANG_REPIN
    assert labels["org.stackforge.pin.tilelang_musa"] == "0.1.12+musa.2"  # the stack's pin; the parent keeps it
    assert "org.stackforge.repin.tilelang-musa" not in mb.labels_of(TAG)
    out = run(
        omni.image,
        "sh",
        "-c",
        "cat /stackforge/targets/vllm-omni/upstreams.txt; "
        "grep -c 'from strenum import StrEnum' /vllm-workspace/vllm-omni/vllm_omni/diffusion/data.py; "
        "ls /vllm-workspace/vllm-omni/vllm_omni/diffusion/__pycache__ | grep -c '^data'; "
        "dpkg-query -W -f '${Package}\\n' jq; test ! -e /stackforge/src; echo no-build-tree; pwd",
    )
    assert out.splitlines() == [
        f"vllm_omni v0.28.0@{commit} /vllm-workspace/vllm-omni",
        "1",
        "1",
        "jq",
        "no-build-tree",
        "/vllm-workspace",
    ]


def test_default_is_vllm_openai_and_intermediate_targets_are_never_tagged(openai, standins):
    ep = standins.endpoints(standins.specs("post2"))
    # The same overrides as the vllm-openai build (BUILD_VLLM_RS on): an alias is the same image.
    default = standins.build("post2", list(openai.overrides), "--target", "default", label="post2-default")
    assert default.ok, default.describe()
    assert default.tag == f"{TAG}-default"
    assert default.image == openai.image
    inspect = json.loads(mb.docker("image", "inspect", openai.image).stdout)[0]["Config"]
    assert inspect["Entrypoint"] == ["vllm", "serve"] and inspect["Env"].count("MTHREADS_VISIBLE_DEVICES=all") == 1
    mooncake = standins.build("post2", standins.overrides(ep), "--target", "mooncake", label="post2-mooncake")
    assert mooncake.proc.returncode == 2
    assert "target 'mooncake' of stack 'post2' is publish: false" in mooncake.proc.stderr
    assert mb.image_id(f"{TAG}-mooncake") is None and mb.image_id(f"{TAG}-final") is None
    plan = mb.stackforge("bake", "post2", "--print", "--json")
    assert plan.returncode == 0, plan.stderr
    names = sorted(json.loads(plan.stdout)["target"])
    assert names == ["post2-default", "post2-vllm-omni", "post2-vllm-openai"]


def test_a_child_phase_replacing_a_vendor_pin_without_repin_fails_naming_it(omni, standins):
    ep = standins.endpoints(standins.specs("post2"))
    before = mb.image_id(f"{TAG}-vllm-omni")
    bad = standins.build(
        "post2",
        [*standins.overrides(ep), "targets.vllm-omni.pip.tilelang.repin=false"],
        "--target",
        "vllm-omni",
        label="post2-omni-norepin",
    )
    assert bad.proc.returncode != 0
    assert (
        "ERROR: pip phase vllm-omni/tilelang (stack key targets.vllm-omni.pip.tilelang) would replace a vendor "
        "pin (the constraints hold them): the phase requests tilelang-musa==0.1.8+musa.3"
    ) in bad.proc.stderr
    assert mb.image_id(f"{TAG}-vllm-omni") == before == omni.image
