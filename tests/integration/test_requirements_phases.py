"""post2's requirement-file phase, the vendor pins kept through every pip phase, and the installed inventory,
on the real engine from the stand-ins (the happy post2 build is shared with test_post_stacks.py).

vLLM's requirements/common.txt and the plugin's requirements/musa.txt (which includes musa_private.txt, the
vendor wheels) are read from the exported trees; the public stand-in index also serves a plain torch 2.12.0.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

POST2_TAG = run_names.namespaced("vllm-musa:ubuntu22.04_py3.10_musa_runtime_5.2_pytorch_release_2.11.0.post2_musa5.2.0")
PHASES = [
    "mthreads-nodeps",
    "pypi",
    "requirements.vllm-build",
    "requirements.vllm-common",
    "requirements.vllm-transitive",
    "mthreads-deps",
]


def vendor_pins(stack) -> dict[str, str]:
    return {n: p.version for n, p in stack.packages.items() if p.index == "mthreads"}


def test_every_vendor_pin_is_preserved_after_every_phase(post2, standins):
    pins = vendor_pins(standins.stack("post2"))
    assert len(pins) == 16
    text = post2.evidence_lines("preserve.txt")
    blocks: dict[str, list[str]] = {}
    for line in text:
        if line.startswith("# after phase "):
            current = blocks.setdefault(line.split()[3], [])
        else:
            current.append(line)
    # The stack's phases, then the target's (mooncake is in every published target's chain): the inventory
    # is rewritten after a target's phases, so the evidence describes the image that was tagged.
    assert list(blocks) == ["installer", *PHASES, "mooncake/mooncake"]
    # the installer runs before any vendor pin is installed: it checks none
    assert blocks["installer"] == ["preserve result: 0 PASS, 0 FAIL after phase installer"]
    for phase in PHASES:
        assert blocks[phase] == [f"PASS preserve {n} version={v}" for n, v in pins.items()] + [
            f"preserve result: 16 PASS, 0 FAIL after phase {phase}"
        ]
    target = blocks["mooncake/mooncake"]
    assert [f"PASS preserve {n} version={v}" for n, v in pins.items()] == target[:16]
    assert target[16:] == [
        "PASS preserve vllm version=0.28.0",
        "PASS preserve vllm_musa version=0.1.24",
        "preserve result: 18 PASS, 0 FAIL after phase mooncake/mooncake",
    ]
    assert "PASS preserve torch version=2.11.0.post2+musa5.2.0" in text


def test_inventory_names_each_dist_with_its_index_and_archive_hash(post2, standins):
    data = json.loads((post2.evidence / "inventory.json").read_text())
    rows = {r["name"].lower(): r for r in data["dists"]}
    # torch came from the vendor index, with the sha256 of the very wheel the vendor stand-in serves.
    ep = standins.endpoints(standins.specs("post2"))
    wheel = next(ep.dirs["mthreads"].glob("torch-2.11.0.post2+musa5.2.0-*.whl"))
    torch = rows["torch"]
    assert (torch["version"], torch["index"], torch["phase"]) == (
        "2.11.0.post2+musa5.2.0",
        "mthreads",
        "mthreads-nodeps",
    )
    assert torch["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # vLLM's runtime closure came from the public index in the requirement phase, real Requires-Dist included:
    # the plugin's transformers==5.5.3, and huggingface_hub under its cap (2.0.0 is served too)
    for name, version in (
        ("transformers", "5.5.3"),
        ("huggingface-hub", "1.33.0"),
        ("compressed-tensors", "0.13.0"),
        ("mthreads-ml-py", "2.4.1"),
        ("urllib3", "2.5.0"),
    ):
        assert (rows[name]["version"], rows[name]["index"], rows[name]["phase"]) == (
            version,
            "pypi",
            "requirements.vllm-common",
        ), rows[name]
        assert len(rows[name]["sha256"]) == 64
    # vLLM's unpinned numpy stayed on the stack's pin (numpy 2.2.6 is served too): every later phase holds it
    numpy = standins.stack("post2").packages["numpy"].version
    assert (rows["numpy"]["version"], rows["numpy"]["phase"]) == (numpy, "pypi")
    # what the fork's gate imports at any version, from the files that bring them in
    assert rows["uvloop"]["phase"] == "requirements.vllm-common"  # fastapi[standard] -> uvicorn[standard]
    assert rows["pytest"]["phase"] == "requirements.vllm-common"  # the plugin's requirements/test.txt
    assert rows["pycountry"]["phase"] == "requirements.vllm-transitive"  # the plugin's transitive list
    assert rows["tabulate"]["phase"] == "mthreads-deps"  # flashinfer-python's own dependency, nothing else's
    assert rows["setuptools-scm"]["phase"] == "requirements.vllm-build"  # vLLM's build requirements
    assert (rows["pip"]["version"], rows["pip"]["phase"]) == (ms.bundled_pip().version, "installer")
    assert "six" not in rows  # its marker (python_version > '3.11') is false here
    assert rows["vllm"]["index"] is None and rows["vllm"]["version"] == "0.28.0"  # built in the image
    # The plugin's musa_private.txt names the vendor wheels: every line agrees with post2's pin (Version equality:
    # flash_attn_3==0.2.7+musa is the pin 0.2.7+musa), so each is left to the vendor phase, none excepted.
    manifest = json.loads((post2.evidence / "requirements.json").read_text())
    dropped = {d["package"]: d for m in manifest for d in m["dropped"]}
    assert set(dropped) == set(vendor_pins(standins.stack("post2")))
    assert all(
        d["pin"] == vendor_pins(standins.stack("post2"))[n] and d["excepted"] is None for n, d in dropped.items()
    )
    assert dropped["flash_attn_3"]["pin"] == "0.2.7+musa"
    assert {d["where"].rsplit(":", 1)[0] for d in dropped.values()} == {"vllm_musa:requirements/musa_private.txt"}
    # The image holds the same inventory; diff of the build against its image finds nothing.
    proc = mb.stackforge("diff", "--inventory", str(post2.evidence), post2.image)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["0 added, 0 removed, 0 changed"]


def test_an_image_stackforge_did_not_build_is_compared_by_what_it_has_installed(post2):
    """The migration check: a build's inventory against an image without /stackforge/inventory.json (built
    from the fork's Dockerfile, say). Here: the post2 image with its inventory removed."""
    name = run_names.container("foreign-inventory")
    ref = run_names.image("foreign", "inventory")
    mb.docker("rm", "-f", name, check=False)
    mb.docker("run", "--name", name, "--entrypoint", "rm", post2.image, "/stackforge/inventory.json")
    try:
        mb.docker("commit", name, ref)
    finally:
        mb.docker("rm", "-f", name, check=False)
    try:
        proc = mb.stackforge("diff", "--inventory", str(post2.evidence), ref, "--json")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["added"] == [] and data["removed"] == []
        # Same distributions and versions; without pip's records the foreign side names no index or hash.
        assert data["changed"] and all(c["before"]["version"] == c["after"]["version"] for c in data["changed"])
        torch = next(c for c in data["changed"] if c["name"] == "torch")
        assert torch["before"]["index"] == "mthreads" and torch["after"] == {
            "version": torch["before"]["version"],
            "index": None,
            "sha256": None,
        }
    finally:
        mb.docker("rmi", ref, check=False)


def test_a_requirement_file_missing_at_the_pinned_commit_fails_before_the_engine(post2, standins):
    before = mb.image_id(POST2_TAG)
    ep = standins.endpoints(standins.specs("post2"))
    build = standins.build(
        "post2",
        [
            *standins.overrides(ep),
            "requirements.vllm-common.files=[{upstream: vllm, path: requirements/tpu.txt}]",
            "upstreams.vllm_musa.contract=null",  # else the contract's lines on vllm-common's files fail lint first
        ],
        label="missing-requirements",
    )
    assert build.proc.returncode == 2, build.describe()
    commit = standins.repos["vllm"].commit
    assert (
        f"requirements.vllm-common.files[0]: requirements/tpu.txt does not exist in upstream vllm at v0.28.0@{commit}"
    ) in build.proc.stderr
    assert mb.image_id(POST2_TAG) == before


def _refused(standins, override: str | list[str], label: str, line: str, pip_says: str):
    """post2 built with more --set values fails in its pip phases with pip's message and our line; nothing tagged."""
    before = mb.image_id(POST2_TAG)
    ep = standins.endpoints(standins.specs("post2"))
    extra = [override] if isinstance(override, str) else override
    build = standins.build("post2", [*standins.overrides(ep), *extra], label=label)
    assert build.proc.returncode == 1, build.describe()
    assert line in build.proc.stderr, build.describe()
    assert pip_says in build.log  # pip's own message is kept
    assert json.loads((build.evidence / "result.json").read_text())["ok"] is False
    assert mb.image_id(POST2_TAG) == before


def test_a_phase_that_would_replace_the_vendor_torch_fails_naming_the_phase_and_the_package(post2, standins):
    # vLLM's kv_connectors.txt asks for lmcache, whose stand-in requires torch>=2.12: the public index serves
    # torch 2.12.0, so only the vendor pins' constraints stand between it and the vendor torch.
    _refused(
        standins,
        "requirements.kv={index: pypi, files: [{upstream: vllm, path: requirements/kv_connectors.txt}]}",
        "replaces-torch",
        "ERROR: pip phase requirements.kv (stack key requirements.kv) would replace a vendor pin (the constraints "
        "hold them): lmcache 0.3.9 depends on torch>=2.12",
        "The conflict is caused by:",
    )
    assert ms.PUBLIC_TORCH == "2.12.0"


def test_a_phase_that_would_move_a_public_pin_fails_naming_the_phase_and_the_pin(post2, standins):
    # The plugin's requirements/common.txt says numpy==1.26 (1.26.0, post2's pin), and the phase reads it as the
    # constraint of vLLM's lines. Pinned at 1.26.4 instead (the public stand-in serves it for the omni target), the
    # pin is a constraint of that phase too: pip refuses. (The agreement rule would name the line first: the stack
    # compares only musa_private.txt here, to reach the phase; an except would say why the stack differs and
    # leave the line out.)
    _refused(
        standins,
        ["packages.numpy.version=1.26.4", "upstreams.vllm_musa.agree.requirements=[requirements/musa_private.txt]"],
        "moves-numpy",
        "ERROR: pip phase requirements.vllm-common (stack key requirements.vllm-common) would move the public pin "
        "numpy==1.26.4 (stack key packages.numpy; the constraints hold it): the phase's constraints ask numpy==1.26",
        "The user requested (constraint) numpy==1.26,==1.26.4",
    )
