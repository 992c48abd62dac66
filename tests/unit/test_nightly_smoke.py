"""The nightly's smoke step and pin freshness: the build, publish and smoke are stand-in callables, the
decisions (when aliases move, what the row and the summary say) are the nightly's own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stackforge.flows.nightly import NightlyRun, Row, Summary, _one
from stackforge.flows.nightly_smoke import NightlyRecipes, freshness_line, nightly_recipes, smoke_image
from stackforge.publish.publisher import PublishOptions
from stackforge.recipes.load import load_recipe
from stackforge.smoke.report import RowResult, SmokeReport
from stackforge.smoke.run import SmokeOptions
from stackforge.stack.load import load

REPO = Path(__file__).resolve().parents[2]
LATEST = "registry.test/x/vllm:v0.28.0-latest"


def report(recipe: str, statuses: list[str]) -> SmokeReport:
    rep = SmokeReport(recipe, f"recipes/{recipe}.yaml", "img")
    rep.rows = [
        RowResult(f"row{i}", "chat", s, None if s == "passed" else f"row{i} went {s}") for i, s in enumerate(statuses)
    ]
    return rep


class Fakes:
    def __init__(self, tmp_path: Path, smoke_statuses: list[str]):
        self.tmp_path, self.smoke_statuses = tmp_path, smoke_statuses
        self.published: list[bool] = []  # move_aliases of each publish call
        self.smoked: list[tuple[str, str, Path, dict]] = []
        self.said: list[str] = []  # the nightly's stderr lines

    def build(self, stack, opts, **kw):
        kw["echo"]("#7 [deps 2/5] RUN pip install …")  # a line of the engine's log, as the real build streams it
        evidence = self.tmp_path / "evidence"
        evidence.mkdir(exist_ok=True)
        (evidence / "result.json").write_text("{}")
        return SimpleNamespace(evidence=evidence, gate=["gate result: 9 PASS, 0 FAIL"])

    def publish(self, stack, registry, *, move_aliases=True, **kw):
        self.published.append(move_aliases)
        return SimpleNamespace(
            status="published" if len(self.published) == 1 else "already-published",
            reference="registry.test/x/vllm:v0.28.0-20260929-r1",
            digest="sha256:" + "a" * 64,
            aliases={LATEST: "moved"} if move_aliases else {},
        )

    def smoke(self, recipe, image, outdir, **kw):
        self.smoked.append((recipe.name, image, outdir, kw))
        outdir.mkdir(parents=True)
        (outdir / "smoke.json").write_text("{}")
        return report(recipe.name, self.smoke_statuses)

    def run(self, recipes: NightlyRecipes) -> NightlyRun:
        return NightlyRun(
            registry="registry.test/x",
            date="20260929",
            publishing=PublishOptions(),
            workspace=None,  # type: ignore[arg-type]
            engine=SimpleNamespace(image_id=lambda ref: "sha256:" + "b" * 64),
            outdir=self.tmp_path / "nightly",
            echo=self.said.append,
            build=self.build,
            options=lambda **kw: kw,
            publish=self.publish,
            smoke=self.smoke,
            recipes=recipes,
            smoking=SmokeOptions(allow_missing_hardware=True),
        )


def qwen_recipes() -> NightlyRecipes:
    return NightlyRecipes({("post2", "vllm-openai"): [load_recipe(REPO, "qwen3-8b")]})


def test_checked_in_nightly_recipes_by_image():
    found = nightly_recipes(REPO)
    assert [r.name for r in found.of("post2", "vllm-openai")] == ["qwen3-8b"]  # diffusion-gemma needs an overlay
    assert found.invalid == {}


def test_latest_moves_after_the_smoke_passed(tmp_path):
    fakes = Fakes(tmp_path, ["passed", "passed"])
    row = _one(fakes.run(qwen_recipes()), load("post2"), "vllm-openai")
    assert fakes.published == [False, True]  # the immutable tag first, the aliases after the smoke
    assert row.status == "published" and row.ok and row.smoke == "passed"
    assert row.smoke_recipes == {"qwen3-8b": "passed"} and row.aliases == {LATEST: "moved"}
    name, image, outdir, kw = fakes.smoked[0]
    assert image.startswith("vllm-musa:") and kw["options"].allow_missing_hardware is True
    assert outdir == tmp_path / "evidence" / "smoke" / "qwen3-8b"
    # the smoke evidence travels with the row's evidence copy
    assert not Path(row.evidence).is_absolute()  # relative to the run directory
    assert (tmp_path / "nightly" / row.evidence / "smoke" / "qwen3-8b" / "smoke.json").is_file()


@pytest.mark.parametrize(("statuses", "verdict"), [(["passed", "failed"], "failed"), (["not-run"], "not-run")])
def test_a_smoke_that_did_not_pass_keeps_latest_where_it_was(tmp_path, statuses, verdict):
    fakes = Fakes(tmp_path, statuses)
    row = _one(fakes.run(qwen_recipes()), load("post2"), "vllm-openai")
    assert fakes.published == [False]  # never published with its aliases
    assert row.status == verdict and row.stage == "smoke" and not row.ok and row.smoke == verdict
    assert row.tag == "registry.test/x/vllm:v0.28.0-20260929-r1"  # the immutable tag stays published
    assert row.aliases == {"*": f"not moved: smoke {verdict}"}
    assert f"smoke {verdict} (qwen3-8b: row" in str(row.reason) and "its aliases were not moved" in str(row.reason)
    summary = Summary("20260929", "registry.test/x", rows=[row])
    md = summary.markdown()
    shown = "FAILED" if verdict == "failed" else "NOT RUN"
    assert f"| {shown} (smoke) | `{row.tag}` |" in md and f"| {verdict}; * not moved: smoke {verdict} |" in md
    assert summary.verdict == verdict and summary.exit_code == (1 if verdict == "failed" else 3)


def test_an_image_without_a_nightly_recipe_moves_latest_at_once(tmp_path):
    fakes = Fakes(tmp_path, ["failed"])
    row = _one(fakes.run(NightlyRecipes()), load("post2"), "vllm-omni")
    assert fakes.published == [True] and fakes.smoked == []
    assert row.ok and row.smoke == "none" and row.aliases == {LATEST: "moved"}
    md = Summary("20260929", "r", rows=[row]).markdown()
    assert "| no nightly recipe; v0.28.0-latest moved |" in md


def test_smoke_image_names_the_first_failed_row(tmp_path):
    recipes = [load_recipe(REPO, "qwen3-8b")]
    verdict = smoke_image(
        recipes, "img", tmp_path, lambda r, i, o, **kw: report(r.name, ["passed", "failed"]), SmokeOptions()
    )
    assert verdict.verdict == "failed" and not verdict.moves_aliases
    assert verdict.reason == "qwen3-8b: row1 failed: row1 went failed"


def test_freshness_in_summary_json_and_markdown():
    summary = Summary("20260929", "r", rows=[Row("post2", "vllm-openai", "published")])
    summary.freshness = {
        "post2": {
            "newest": False,
            "newer": [{"package": "torch", "pinned": "2.11.0.post2+musa5.2.0", "newest": "2.12.0+musa5.2.0"}],
            "trains_moved": ["torch"],
            "unknown": [],
            "error": None,
        },
        "post1": {"newest": True, "newer": [], "trains_moved": [], "unknown": [], "error": None},
    }
    md = summary.markdown()
    assert "| post2 | no | train moved: torch; newer: torch 2.11.0.post2+musa5.2.0 → 2.12.0+musa5.2.0 |" in md
    assert "| post1 | yes |  |" in md
    assert json.loads(json.dumps(summary.to_json()))["freshness"]["post1"]["newest"] is True
    assert freshness_line("x", {"error": "index down"}) == "| x | unknown | index down |"


def test_a_smoke_that_passed_without_the_hardware_moves_no_alias(tmp_path):
    fakes = Fakes(tmp_path, ["passed", "passed"])

    def without_hardware(recipe, image, outdir, **kw):
        rep = fakes.smoke(recipe, image, outdir, **kw)
        rep.hardware = {"missing": "this host has no mthreads device (no /dev/mtgpu*)", "allowed_missing": True}
        return rep

    run = dataclasses.replace(fakes.run(qwen_recipes()), smoke=without_hardware)
    row = _one(run, load("post2"), "vllm-openai")
    assert row.smoke == "not-run" and not row.ok and fakes.published == [False]
    assert row.aliases == {"*": "not moved: smoke not-run"}
    assert "every row passed without the declared hardware (this host has no mthreads device" in str(row.reason)


def test_the_engine_log_of_each_build_streams_with_its_stack_and_target(tmp_path):
    fakes = Fakes(tmp_path, ["passed"])
    _one(fakes.run(qwen_recipes()), load("post2"), "vllm-openai")
    assert "[post2/vllm-openai] #7 [deps 2/5] RUN pip install …" in fakes.said


def night(*rows: Row) -> Summary:
    return Summary("20260929", "registry.test/x", rows=list(rows))


def smoked(stack: str, status: str, recipes: dict[str, str]) -> Row:
    verdict = "passed" if status == "published" else status
    return Row(stack, "vllm-openai", status, stage=None if status == "published" else "smoke", smoke=verdict,
               smoke_recipes=recipes)  # fmt: skip


def test_a_night_where_nothing_ran_is_not_green():
    summary = night(smoked("post2", "not-run", {"qwen3-8b": "not-run"}), smoked("post1", "not-run", {"q": "not-run"}))
    assert not summary.ok and summary.verdict == "not-run" and summary.exit_code == 3
    assert summary.counts() == {
        "images": {"passed": 0, "failed": 0, "not_run": 2},
        "smoke": {"passed": 0, "failed": 0, "not_run": 2},
    }
    md = summary.markdown()
    assert "— 0 of 2 passed, 0 failed, 2 not run in" in md and "Smoke recipes: 0 passed, 0 failed, 2 not run." in md
    doc = json.loads(json.dumps(summary.to_json()))
    assert doc["ok"] is False and doc["verdict"] == "not-run" and doc["counts"]["images"]["not_run"] == 2


def test_passed_failed_and_not_run_are_counted_apart_per_recipe_and_in_totals():
    summary = night(
        smoked("post2", "failed", {"qwen3-8b": "failed", "dsv2": "not-run", "nemotron": "passed"}),
        smoked("post1", "published", {"qwen3-8b": "passed"}),
        smoked("post3", "not-run", {"qwen3-8b": "not-run"}),
        Row("mate", "vllm-openai", "published", smoke="none"),
    )
    assert summary.verdict == "failed" and summary.exit_code == 1
    assert summary.counts() == {
        "images": {"passed": 2, "failed": 1, "not_run": 1},
        "smoke": {"passed": 2, "failed": 1, "not_run": 2},
    }
    md = summary.markdown()
    assert "— 2 of 4 passed, 1 failed, 1 not run in" in md and "Smoke recipes: 2 passed, 1 failed, 2 not run." in md
    assert "| failed (qwen3-8b failed, dsv2 not-run, nemotron passed) |" in md  # each recipe's verdict
    assert "| NOT RUN (smoke) |" in md and "| passed |" in md and "| no nightly recipe |" in md


def test_the_nightly_hands_the_leases_device_uuids_to_each_smoke(tmp_path):
    fakes = Fakes(tmp_path, ["passed"])
    lease = ("d6a04b9f-fec2-2c87-aa03-a8360298e63b",)
    run = dataclasses.replace(
        fakes.run(qwen_recipes()), smoking=SmokeOptions(allow_missing_hardware=True, device_uuids=lease)
    )
    _one(run, load("post2"), "vllm-openai")
    assert fakes.smoked[0][3]["options"].device_uuids == ("d6a04b9f-fec2-2c87-aa03-a8360298e63b",)


@pytest.mark.parametrize(("statuses", "status"), [(["passed"], "published"), (["failed"], "failed")])
def test_a_shard_smokes_but_never_moves_an_alias(tmp_path, statuses, status):
    """A shard (move_aliases=False) publishes the immutable tag, smokes where its runner has the devices and keeps
    the verdict in its row; the merge moves the aliases for the whole night."""
    fakes = Fakes(tmp_path, statuses)
    run = dataclasses.replace(fakes.run(qwen_recipes()), move_aliases=False)
    row = _one(run, load("post2"), "vllm-openai")
    assert fakes.published == [False] and len(fakes.smoked) == 1  # no second publish to move aliases
    assert row.status == status and row.smoke == statuses[0] and row.aliases == {}
    assert row.tag == "registry.test/x/vllm:v0.28.0-20260929-r1"
    without = dataclasses.replace(Fakes(tmp_path / "b", ["passed"]).run(NightlyRecipes()), move_aliases=False)
    (tmp_path / "b").mkdir()
    plain = _one(without, load("post2"), "vllm-omni")
    assert plain.smoke == "none" and plain.aliases == {}
