"""What the smoke checks before it trusts a run: the overlay a recipe needs is the image's (refused before any
container starts), and the devices the container sees are the lease's (the preflight compares uuids)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stackforge.errors import UserError
from stackforge.recipes.load import load_recipe
from stackforge.smoke import device_uuid
from stackforge.smoke.run import ContainerSpec, HostFacts, SmokeOptions, smoke
from tests.fixtures.standin_container import StoppableProcess

REPO = Path(__file__).resolve().parents[2]
NO_HARDWARE = HostFacts((), ("runc",))
LEASE = "d6a04b9f-fec2-2c87-aa03-a8360298e63b"  # the post2 record's card
OTHER = "0c1d2e3f-0000-1111-2222-333344445555"


class LabelEngine:
    """An engine whose only answer is the image's labels (``docker image inspect --format {{json .Config.Labels}}``)."""

    def __init__(self, labels: dict[str, str] | None):
        self.labels = labels
        self.calls: list[tuple[str, str]] = []

    def inspect_image(self, ref: str, template: str, *, timeout: float = 30) -> subprocess.CompletedProcess:
        self.calls.append((ref, template))
        return subprocess.CompletedProcess([ref], 0, json.dumps(self.labels), "")


def refuse(tmp_path: Path, labels: dict[str, str] | None) -> UserError:
    started = []
    with pytest.raises(UserError) as err:
        smoke(
            load_recipe(REPO, "diffusion-gemma"),
            "release:1",
            tmp_path / "o",
            engine=LabelEngine(labels),
            launcher=lambda spec: started.append(spec),  # type: ignore[arg-type,func-returns-value]
            facts=NO_HARDWARE,
        )
    assert started == [] and not (tmp_path / "o").exists()  # nothing started, no evidence written
    return err.value


def test_a_recipe_that_needs_an_overlay_refuses_an_image_without_its_label(tmp_path):
    err = refuse(tmp_path, {"org.stackforge.stack": "post2"})
    text = (REPO / "recipes" / "diffusion-gemma.yaml").read_text().splitlines()
    assert err.exit_code == 2 and err.file == "recipes/diffusion-gemma.yaml"
    assert text[err.line - 1].strip() == "overlay: jev" and text[err.line - 2].strip() == "needs:"
    assert "needs.overlay is 'jev', but the image release:1 carries no org.stackforge.overlay label" in err.message
    assert "stackforge build post2 --overlay jev" in str(err.fix) and "--image" in str(err.fix)
    other = refuse(tmp_path, {"org.stackforge.overlay": "other"})
    assert "carries overlay 'other'" in other.message
    assert "carries no org.stackforge.overlay label" in refuse(tmp_path, None).message  # an image with no labels


def test_the_overlays_own_image_goes_on(tmp_path):
    engine = LabelEngine({"org.stackforge.overlay": "jev", "org.stackforge.stack": "post2"})
    report = smoke(load_recipe(REPO, "diffusion-gemma"), "jev:1", tmp_path / "o", engine=engine, facts=NO_HARDWARE)
    assert report.verdict == "not-run" and report.exit_code == 3  # the host has no device: nothing started
    assert len(engine.calls) == 1


def test_a_recipe_without_an_overlay_reads_no_labels(tmp_path):
    engine = LabelEngine(None)
    smoke(load_recipe(REPO, "qwen3-8b"), "img:1", tmp_path / "o", engine=engine, facts=NO_HARDWARE)
    assert engine.calls == []


# -- the device uuid -----------------------------------------------------------------------------------------


def test_the_lease_uuids_come_from_the_flag_else_the_env():
    assert device_uuid.expected([f"{LEASE},{OTHER}", LEASE], env={}) == (LEASE, OTHER)
    assert device_uuid.expected([], env={"STACKFORGE_DEVICE_UUID": f" {LEASE} "}) == (LEASE,)
    assert device_uuid.expected([OTHER], env={"STACKFORGE_DEVICE_UUID": LEASE}) == (OTHER,)  # the flag wins
    assert device_uuid.expected([], env={}) == ()
    with pytest.raises(UserError) as err:
        device_uuid.expected([], env={"STACKFORGE_DEVICE_UUID": "d6a0 4b9f"})
    assert err.value.file == "STACKFORGE_DEVICE_UUID" and "is not a device uuid" in err.value.message
    with pytest.raises(UserError) as err:
        device_uuid.expected(["$(reboot)"], env={})
    assert err.value.file == "--device-uuid"


def run(tmp_path: Path, visible: list[str], source: str | None, uuids: tuple[str, ...]):
    """A smoke whose container (the stand-in server) reports ``visible`` uuids from its preflight."""
    facts = {"python": "3.10.12", "versions": {}, "devices": ["/dev/mtgpu0"] if visible else [], "uuids": visible}
    preflight = json.dumps({**facts, "uuid_source": source})
    tmp_path.mkdir(parents=True, exist_ok=True)

    def start(spec: ContainerSpec) -> StoppableProcess:
        return StoppableProcess(spec, tmp_path / "server.log", preflight=preflight)

    options = SmokeOptions(allow_missing_hardware=True, interval=0.1, device_uuids=uuids)
    return smoke(load_recipe(REPO, "qwen3-8b"), "img:1", tmp_path / "o", options, launcher=start, facts=NO_HARDWARE)


def test_the_preflight_passes_when_the_container_sees_the_leased_device(tmp_path):
    report = run(tmp_path, [f"GPU-{LEASE.upper()}"], "mthreads-gmi -q", (LEASE,))
    pre = report.rows[0]
    assert pre.status == "passed", pre.reason
    assert pre.details["uuid_check"] == {
        "expected": [LEASE],
        "visible": [f"GPU-{LEASE.upper()}"],
        "source": "mthreads-gmi -q",
        "matched": True,
    }
    assert report.exit_code == 0  # every row passed (without the declared hardware, as allowed)


def test_the_preflight_fails_naming_both_when_the_uuids_differ(tmp_path):
    report = run(tmp_path, [OTHER], "torch.musa.get_device_properties(i).uuid", (LEASE,))
    pre = report.rows[0]
    assert pre.status == "failed" and report.exit_code == 1
    assert pre.reason == (
        f"the container's visible device uuid(s) {OTHER} differ from the lease's {LEASE} "
        "(read by torch.musa.get_device_properties(i).uuid)"
    )
    # two leased cards, one visible: the scoping is not what was granted
    two = run(tmp_path / "two", [LEASE], "mthreads-gmi -q", (LEASE, OTHER))
    assert two.rows[0].status == "failed" and f"{LEASE}, {OTHER}" in str(two.rows[0].reason)


def test_without_a_device_the_uuid_could_not_be_compared_and_that_is_no_pass(tmp_path):
    report = run(tmp_path, [], None, (LEASE,))
    pre = report.rows[0]
    assert pre.status == "not-run"
    assert pre.reason == (
        f"not run: the device uuid could not be compared: the container shows no device uuid (expected {LEASE})"
    )
    assert pre.details["uuid_check"]["visible"] == []
    assert all(r.status == "passed" for r in report.rows[1:])  # the other rows still ran
    assert report.verdict == "not-run" and report.exit_code == 3
