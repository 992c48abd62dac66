"""The stand-in plugin's contract module (the post2 `contracts` slice) holds what the real module asserts: run here
with pytest against the plugin's staged files and a site whose distributions stand for an image, it passes for an
image that holds the plugin's pins and fails, naming the test and the pin, for one that drifts from them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import facts, standin_slices
from tests.fixtures import musa_standins as ms

MODULE = "tests/test_inplace_porting_contract.py"

#: the image's environment as post2's final stage sets it
ENV = {
    "MTGPU_TARGET": "mp_31",
    "TORCH_MUSA_ARCH_LIST": "31",
    "MATE_MUSA_ARCH_LIST": "3.1",
    "MTHREADS_VISIBLE_DEVICES": "all",
}


def plugin_tree(root: Path) -> None:
    """The plugin's files as the slice stages them (the stand-in plugin's, from the facts)."""
    tree = {**ms.MUSA_REQUIREMENTS, "pyproject.toml": ms.plugin_pyproject("0.1.24")}
    tree["docker/musa.Dockerfile"] = standin_slices.contract_dockerfile()
    tree.update(standin_slices.generated_tests("vllm-musa", set(tree)))
    for rel, text in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def image_site(root: Path, versions: dict[str, str]) -> Path:
    """A site holding each distribution at its version (metadata, and a module for those the gate imports)."""
    site = root / "site"
    for name, version in versions.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for module in ("transformers", "huggingface_hub", "uvloop", "pycountry"):
        (site / module).mkdir(parents=True, exist_ok=True)
        (site / module / "__init__.py").write_text("")
    return site


def post2_versions() -> dict[str, str]:
    """What post2's image holds: the plugin's pins (facts), and the releases the stand-in index serves."""
    out = {name: version for name, (_, version) in facts.plugin_vendor_pins().items()}
    out.update(
        {
            "torchada": "0.1.90",
            "transformers": "5.5.3",
            "huggingface-hub": "1.33.0",
            "fastapi": "0.116.1",
            "pycountry": "24.6.1",
            "uvloop": "0.22.1",
            ms.MOONCAKE[0]: ms.MOONCAKE[1],
            "vllm": "0.28.0",
        }
    )
    return out


def run(tmp_path: Path, versions: dict[str, str], env: dict[str, str] = ENV) -> subprocess.CompletedProcess:
    stage = tmp_path / "slice"
    plugin_tree(stage)
    site = image_site(tmp_path, versions)
    clean = {k: v for k, v in os.environ.items() if k not in ENV and k != "MUSA_VISIBLE_DEVICES"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(stage), MODULE],
        cwd=stage,
        env={**clean, **env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contract_module_passes_for_an_image_that_holds_the_plugins_pins(tmp_path):
    proc = run(tmp_path, post2_versions())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "18 passed" in proc.stdout


@pytest.mark.parametrize(
    "moved, failed, why",
    [
        (
            {"torchada": "0.1.83"},
            ["test_torchada_floor_is_consistent", "test_musa_image_runtime_dependency_contract"],
            "the image holds torchada 0.1.83, which does not meet torchada==0.1.90",
        ),
        (
            {"torch_musa": "2.11.0.post1+musa5.2.0"},
            ["test_musa_image_runtime_dependency_contract"],
            "the image holds torch_musa 2.11.0.post1+musa5.2.0; the plugin pins torch_musa==2.11.0.post2+musa5.2.0",
        ),
        (
            {"torchada": "0.1.90+local"},
            ["test_musa_image_runtime_dependency_contract"],
            "the plugin pins torchada==0.1.90 (an exact-version dist)",
        ),
        ({ms.MOONCAKE[0]: "0.3.12.post1"}, ["test_musa_image_stage_and_optional_component_contract"], "line 241"),
        ({"huggingface-hub": "2.0.0"}, ["test_musa_image_caps_huggingface_hub"], "does not meet huggingface_hub"),
        ({"vllm": "0.28.1"}, ["test_archive_vllm_install_uses_upstream_version_override"], "line 422"),
    ],
)
def test_an_image_that_drifts_from_the_plugin_fails_the_test_that_asserts_it(tmp_path, moved, failed, why):
    proc = run(tmp_path, {**post2_versions(), **moved})
    assert proc.returncode == 1, proc.stdout
    assert sorted(
        line.split("::")[1].split(" ")[0] for line in proc.stdout.splitlines() if line.startswith("FAILED")
    ) == (sorted(failed))
    assert why in proc.stdout
    assert f"{18 - len(failed)} passed" in proc.stdout


def test_a_baked_device_list_and_the_wrong_arch_fail_the_image_tests(tmp_path):
    proc = run(tmp_path, post2_versions(), {**ENV, "MUSA_VISIBLE_DEVICES": "all", "MTGPU_TARGET": "mp_22"})
    assert proc.returncode == 1
    assert (
        "FAILED tests/test_inplace_porting_contract.py::test_musa_image_does_not_bake_a_device_id_list" in proc.stdout
    )
    assert (
        "FAILED tests/test_inplace_porting_contract.py::test_musa_image_stage_and_optional_component_contract"
        in proc.stdout
    )
