"""What the records ran by hand, declared as test slices: the post2 record's targeted probes (*_like device
injection, the DeepEP Buffer) as a slice that needs a MUSA device — not run on a host without one, exit 3 — and a
slice of the DiffusionGemma recipe on the jev overlay's read knobs; and the :jev range's numbering as the record
gives it, which the recipe and the overlay name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from stackforge.clients.workspace import Workspace
from stackforge.smoke import slices
from stackforge.smoke.run import HostFacts
from stackforge.stack.load import load
from tests.fixtures import facts
from tests.fixtures.stack_support import REPO

#: modules the probes import, each a stand-in that lets pytest collect them on a host without torch
STUBS = {"torch": "", "torchada": "", "torch_musa": "", "deep_ep": ""}


def test_the_records_probes_are_a_slice_that_needs_a_musa_device():
    loaded = load("post2", root=REPO)
    probes = loaded.model.tests["probes"]
    assert (probes.hardware.devices, probes.hardware.count) == ("mthreads", 1)
    assert not probes.nightly  # the nightly runs only slices that need no device
    seeds = facts.seeds()["probes"]
    for path in probes.files.paths:  # each module cites the record's probe it is
        text = (REPO / path).read_text()
        assert any(p["at"].split(":")[0] in text for p in seeds.values()), path


def test_the_declared_count_is_the_count_pytest_collects(tmp_path):
    for module, text in STUBS.items():
        (tmp_path / f"{module}.py").write_text(text)
    probes = load("post2", root=REPO).model.tests["probes"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *probes.files.paths],
        cwd=REPO,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{probes.expect['passed']} tests collected" in proc.stdout


class NoEngine:
    """An engine the slice must not reach: a not-run slice starts no container."""

    def __getattr__(self, name):
        raise AssertionError(f"the engine was asked for {name}")


def test_on_a_host_without_a_musa_device_the_probes_are_not_run_and_exit_3(tmp_path):
    loaded = load("post2", root=REPO)
    [ref] = [r for r in slices.declared(loaded) if r.name == "probes"]
    where = slices.SliceTarget("img:probes", "sha256:" + "a" * 64, tmp_path / "probes")
    result = slices.run_slice(loaded, ref, where, Workspace.at(REPO), facts=HostFacts((), ()), engine=NoEngine())
    assert (result.verdict, result.exit_code) == ("not-run", 3)
    assert result.reason == "not run: this host has no mthreads device (no /dev/mtgpu*)"
    assert result.docker == [] and (tmp_path / "probes" / "result.json").is_file()


def _overlay_range(dest: Path) -> Path:
    """The jev overlay's range applied to an empty tree: the vllm.entrypoints.jev package it adds."""
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    series = REPO / "overlays" / "jev" / "patches" / "vllm"
    for name in (series / "series").read_text().split():
        if not name.startswith("#") and name.endswith(".patch"):
            subprocess.run(["git", "apply", str(series / name)], cwd=dest, check=True)
    return dest


def test_the_diffusiongemma_recipes_slice_holds_the_jev_ranges_read_knobs(tmp_path):
    loaded = load("post2", root=REPO)
    [ref] = [r for r in slices.declared(loaded, "jev") if r.name == "diffusion-gemma.knobs"]
    assert ref.owner == "diffusion-gemma" and ref.target == "vllm-openai" and ref.slice.hardware.devices == "none"
    assert not [r for r in slices.declared(loaded) if r.owner == "diffusion-gemma"]  # only an image with the overlay
    tree = _overlay_range(tmp_path / "range")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ref.slice.files.paths],
        cwd=REPO,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{ref.slice.expect['passed']} passed" in proc.stdout


def test_the_jev_ranges_numbering_is_the_records_and_the_recipe_and_overlay_name_it():
    jev = facts.seeds()["jev"]
    first, last, count = jev["range"]["first"], jev["range"]["last"], jev["range"]["count"]
    assert int(last) - int(first) + 1 == count == jev["series"]["entries"] - jev["series"]["base_entries"]
    assert jev["base_last"]["name"].startswith(f"{int(first) - 1:04d}-")  # the range numbers on from the base
    for number, entry in jev["files"].items():
        assert int(first) <= int(number) <= int(last) and re.fullmatch(rf"{number}-MUSA-[\w.-]+\.patch", entry["name"])
    named = f"{first}-{last}"
    recipe = (REPO / "recipes" / "diffusion-gemma.yaml").read_text()
    assert f"(patches {named})" in recipe
    assert f"entries {named}" in (REPO / "overlays" / "jev" / "README.md").read_text()
    assert jev["read_tests"]["paths"] == "unknown"  # why the recipe declares no slice of them
