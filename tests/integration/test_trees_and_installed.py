"""Kernel trees, in-tree patch series, post-install patches, installed-environment steps and requirement
rules, built end to end on the post2 stand-ins.

A throw-away repository root holds the real post1/post2 stacks and ``kern``, which inherits post2 and adds
post-install patches, a step and requirement rules. post2 itself declares the plugin's in-tree series and
kernel trees; the platform plugin stand-in (``musa_standins.make_plugin_upstream``) builds only against the
exported vLLM and FlashInfer trees in third_party/, with vLLM patched by the series it carries in
vllm_musa/patches/series, and clones when told to, which fails in the offline kernel stage. The deps stage is
post2's, so BuildKit's cache serves it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import textwrap

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names
from tests.fixtures.listener import Listener
from tests.fixtures.stack_support import make_root

pytestmark = pytest.mark.engine

TAG = run_names.image("kern", "post2")
MATE_PATCH = "patches/installed/mate-dynamo-bool.patch"
FLASH_PATCH = "patches/installed/flash-mla-old.patch"

KERN = f"""\
name: kern
inherits: post2
post_install:
  - {{dist: mate, below: "0.2.8", patch: {MATE_PATCH}}}
  - {{dist: flash_mla, when: "<0.2.6", patch: {FLASH_PATCH}}}
steps:
  mate-aot:
    env:
      MATE_MUSA_ARCH_LIST: "{{{{ platform.gpu_arch | map('musa_arch') | join(',') }}}}"
    run: python -c "import os, mate; open('/opt/venv/mate-aot.txt', 'w').write(os.environ['MATE_MUSA_ARCH_LIST'])"
  net-probe:
    run: python -c "import socket; s = socket.socket(); s.settimeout(3); open('/opt/venv/net-probe.txt', 'w').write(str(s.connect_ex(('127.0.0.1', PROBE_PORT))))"
rules:
  requires:
    - {{name: torch_musa, dist: torch_musa, min: "2.7"}}
    - {{name: Python, command: "python -V", min: "3.11"}}
tags:
  local: "{TAG}"
"""


@pytest.fixture(scope="module")
def probe():
    """What the net-probe step tries to reach on the host's loopback (the build runs with --network host)."""
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def world(standins, tmp_path_factory, probe):
    tmp = tmp_path_factory.mktemp("kern")
    root = make_root(tmp, {"kern.yaml": KERN.replace("PROBE_PORT", str(probe.port))})
    shutil.copytree(mb.REPO / "patches", root / "patches")
    (root / "patches" / "installed").mkdir()
    (root / MATE_PATCH).write_text(ms.mate_patch("0.2.7"))
    (root / FLASH_PATCH).write_text(ms.mate_patch("0.2.5").replace("mate/", "flash_mla/"))
    endpoints = standins.endpoints(standins.specs("post2"))
    return root, standins.overrides(endpoints)


def build(standins, world, stack: str = "kern", *extra: str, label: str) -> mb.Build:
    root, overrides = world
    out = standins.root / "builds" / f"kern-{label}"
    args = ["--root", str(root), "build", stack, "--network", "host", "--out", str(out), *ms.set_args(overrides)]
    args += ms.set_args(extra)
    proc = mb.stackforge(*args, env={"STACKFORGE_CACHE": str(standins.root / "upstream-cache")})
    return mb.Build(stack, args, proc, out, overrides)


@pytest.fixture(scope="module")
def kern(standins, world):
    result = build(standins, world, label="happy")
    assert result.ok, result.describe()
    return result


def run_in(image: str, code: str) -> str:
    return (
        mb.docker("run", "--rm", "--network=none", "--entrypoint", "python", image, "-c", code)
        .stdout.strip()
        .splitlines()[-1]
    )


def test_plugin_builds_from_the_exported_patched_vllm_tree(kern, standins):
    dockerfile = (kern.out / "Dockerfile").read_text()
    assert "COPY --from=src-vllm / /stackforge/src/vllm_musa/third_party/vllm\n" in dockerfile
    assert "COPY --from=src-flashinfer / /stackforge/src/vllm_musa/third_party/flashinfer\n" in dockerfile
    # The plugin saw the series its own tree carries, applied to vLLM on the host; vLLM was built from it too.
    assert run_in(kern.image, "import vllm_musa._vllm_tree as t; print(t.SERIES)") == "vllm-musa patches/vllm 0001"
    assert run_in(kern.image, "import vllm._musa_series as s; print(s.SERIES)") == "vllm-musa patches/vllm 0001"
    # It compiled against the FlashInfer fork's tree, whose Mamba provider replaced the vendor package's.
    assert len(run_in(kern.image, "import vllm_musa._flashinfer as f; print(f.NORM_CU_SHA256)")) == 64
    assert run_in(kern.image, "import flashinfer.mamba as m; print(m.PROVIDER)") == ms.MAMBA_PROVIDER.split('"')[1]
    files = mb.docker(
        "run", "--rm", "--network=none", "--entrypoint", "cat", kern.image, "/stackforge/kernels/files.txt"
    )
    assert (
        "installed kernels.flashinfer_mamba.files.mamba: " in files.stdout
        and "/flashinfer/mamba/ssd_combined.py" in (files.stdout)
    )
    labels = mb.labels_of(kern.image)
    assert labels["org.stackforge.upstream.flashinfer"] == standins.repos["flashinfer"].commit  # pinned by commit only


def test_offline_steps_get_no_network_and_created_is_the_layer_epoch(kern, probe, standins):
    """The engine takes RUN --network=none: a step that tries the host's loopback (the build itself runs with
    --network host) reaches nothing; the image carries no created label (the fork's contract), and its config's
    times are the layer epoch (the base image's creation time), which a rebuild from cache gives again."""
    from stackforge.clients.engine import Engine

    engine = Engine()
    assert engine.supports_run_network() and engine.supports_source_date_epoch(), engine.buildkit_version()
    assert "RUN --network=none export PIP_NO_INDEX=1" in (kern.out / "Dockerfile").read_text()
    assert run_in(kern.image, "print(open('/opt/venv/net-probe.txt').read())") != "0"  # connect_ex: refused
    assert probe.seen == []
    # post1's created_label: false (the plugin's image contract forbids the label): no created label at all
    assert "org.opencontainers.image.created" not in mb.labels_of(kern.image)
    config_created = mb.docker("image", "inspect", "--format", "{{.Created}}", kern.image).stdout.strip()
    layer_epoch = int(mb.labels_of(kern.image)["org.stackforge.epoch"])
    base_created = mb.docker("image", "inspect", "--format", "{{.Created}}", standins.base_image).stdout.strip()
    assert base_created.startswith(
        _dt.datetime.fromtimestamp(layer_epoch, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    )
    assert config_created.startswith(base_created[:19]), (config_created, base_created)


def test_the_same_inputs_give_the_same_image(kern, standins, world):
    """A second build of the same inputs (from BuildKit's cache) gives the same image config, so the same id:
    nothing in it depends on when it was built."""
    again = build(standins, world, label="again")
    assert again.ok, again.describe()
    assert again.image == kern.image


def test_in_tree_series_hash_is_labelled(kern, world):
    labels = mb.labels_of(kern.image)
    inputs = json.loads((kern.evidence / "inputs.json").read_text())
    vllm = next(u for u in inputs["upstreams"] if u["name"] == "vllm")
    assert vllm["patches"] == [ms.PLUGIN_PATCH]  # the carried series; the repository's own patches/vllm is empty
    assert labels["org.stackforge.series.vllm"] == vllm["series_hash"]


def test_a_series_file_listing_the_same_patches_builds_the_same_tree(kern, standins, world):
    """order: series (a carrier with a series file) applies the same patches: same series hash, same image."""
    listed = build(
        standins,
        world,
        "kern",
        "upstreams.vllm.patches_from.path=patches/vllm",
        "upstreams.vllm.patches_from.order=series",
        label="by-series",
    )
    assert listed.ok, listed.describe()
    assert (
        mb.labels_of(listed.image)["org.stackforge.series.vllm"]
        == mb.labels_of(kern.image)["org.stackforge.series.vllm"]
    )
    assert not (listed.out / "context" / ".series").exists()  # written for the export only


def test_post_install_patch_applied_when_the_version_matches_and_skipped_otherwise(kern, world):
    root, _ = world
    labels = mb.labels_of(kern.image)
    mate = hashlib.sha256((root / MATE_PATCH).read_bytes()).hexdigest()
    flash = hashlib.sha256((root / FLASH_PATCH).read_bytes()).hexdigest()
    assert labels["org.stackforge.postinstall.mate"] == f"sha256:{mate}:applied"
    assert labels["org.stackforge.postinstall.flash_mla"] == f"sha256:{flash}:skipped"
    assert run_in(kern.image, "import mate; print(mate.DYNAMO_BOOL_AUGASSIGN_FIXED)") == "True"
    assert run_in(kern.image, "import flash_mla; print(hasattr(flash_mla, 'DYNAMO_BOOL_AUGASSIGN_FIXED'))") == "False"
    gate = kern.evidence_lines("gate.txt")
    assert f"PASS patch  mate applied version=0.2.7 (<0.2.8) sha256={mate} files=mate/__init__.py" in gate
    assert f"PASS patch  flash_mla skipped version=0.2.7+musa (not <0.2.6) sha256={flash}" in gate


def test_step_runs_with_env_derived_from_the_platform(kern):
    assert run_in(kern.image, "print(open('/opt/venv/mate-aot.txt').read())") == "3.1"
    assert "MATE_MUSA_ARCH_LIST=3.1; \\\n    python -c" in (kern.out / "Dockerfile").read_text()


def test_requires_rules_pass_in_the_gate(kern):
    gate = kern.evidence_lines("gate.txt")
    assert "PASS requires torch_musa version=2.11.0.post2+musa5.2.0 min=2.7" in gate
    assert any(line.startswith("PASS requires Python version=3.11.") and line.endswith(" min=3.11") for line in gate)
    assert gate[-1].endswith(" 0 FAIL")


def test_a_failing_requires_rule_fails_the_gate_and_tags_nothing(standins, world, kern):
    before = mb.image_id(TAG)
    failed = build(
        standins,
        world,
        "kern",
        'rules.requires=[{name: MUSA Toolkit, command: "python -V", min: "4.3.6"}]',
        label="requires-fails",
    )
    assert failed.proc.returncode == 1, failed.describe()
    assert "FAIL requires MUSA Toolkit min=4.3.6 found=3.11." in failed.proc.stderr
    assert mb.image_id(TAG) == before  # the tag still names the last gated image


def test_plugin_without_the_tree_cannot_fetch_vllm(standins, world, kern):
    failed = build(
        standins,
        world,
        "kern",
        "kernels.vllm_musa.trees={}",
        "kernels.vllm_musa.env.SKIP_THIRD_PARTY=0",
        f"tags.local={run_names.image('kern', 'no-tree')}",
        label="no-tree",
    )
    assert failed.proc.returncode == 1, failed.describe()
    assert "third_party/vllm: cloning into it failed" in failed.log
    assert "transport 'https' not allowed" in failed.log
    assert mb.image_id(run_names.image("kern", "no-tree")) is None


def test_plugin_told_to_patch_again_fails_strictly(standins, world, kern):
    """Without VLLM_MUSA_NO_BUILD_PATCH=1 the plugin applies its series to a tree the host already patched."""
    failed = build(
        standins,
        world,
        "kern",
        "kernels.vllm_musa.env.VLLM_MUSA_NO_BUILD_PATCH=0",
        f"tags.local={run_names.image('kern', 'patched-twice')}",
        label="patched-twice",
    )
    assert failed.proc.returncode == 1, failed.describe()
    assert f"MUSA build patch: failed (strict) {ms.PLUGIN_PATCH}" in failed.log
    assert mb.image_id(run_names.image("kern", "patched-twice")) is None


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "patches/vllm-0.29",
            "upstreams.vllm.patches_from.path: patches/vllm-0.29 does not exist in vllm_musa at v0.1.24@",
        ),
        ("patches/vllm-0.27", "upstreams.vllm.patches_from (vllm_musa:patches/vllm-0.27): "),
    ],
)
def test_bad_in_tree_series_names_the_key(standins, world, path, message):
    root, _ = world
    (root / "stacks" / "kern-bad.yaml").write_text(
        textwrap.dedent(f"""\
        name: kern-bad
        inherits: kern
        upstreams:
          vllm:
            patches_from: {{upstream: vllm_musa, path: {path}}}
        tags:
          local: {run_names.image("kern", "bad")}
        """)
    )
    failed = build(standins, world, "kern-bad", label=f"bad-{path.rsplit('/', 1)[1]}")
    assert failed.proc.returncode == 2, failed.describe()
    assert "kern-bad.yaml:5:" in failed.proc.stderr and message in failed.proc.stderr, failed.proc.stderr
    assert mb.image_id(run_names.image("kern", "bad")) is None
