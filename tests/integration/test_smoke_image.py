"""`stackforge smoke` against the post2 vllm-openai image built from the stand-ins: the image's own
`vllm serve` answers over HTTP in a real container; the failure modes come from STANDIN_SERVE_FAIL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import musa_builds as mb

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]


#: recipes/qwen3-8b.yaml plus MATE rows whose regression command only the stand-in MATE wheel has
MATE_RECIPE = str(REPO / "tests" / "fixtures" / "recipes" / "qwen3-8b-mate.yaml")


def recipe_rows(path: str) -> list:
    from stackforge.recipes.load import load_recipe

    return load_recipe(REPO, path).model.smoke


def run(image: str, out: Path, *extra: str, recipe: str = MATE_RECIPE):
    proc = mb.stackforge(
        "smoke", recipe, "--image", image, "--allow-missing-hardware", "--out", str(out), *extra, timeout=600
    )
    data = json.loads((out / "smoke.json").read_text()) if (out / "smoke.json").is_file() else None
    return proc, data


def gone(name: str) -> bool:
    return mb.docker("container", "inspect", name, check=False).returncode != 0


def test_passing_run(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "ok", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == data
    # Every row ran and passed; on this host without the devices that is never the verdict "passed".
    assert not data["ok"] and data["verdict"] == "not-run"
    assert data["image"] == post2.image and data["image_id"] == post2.image  # by id: another module may move the tag
    assert [(r["name"], r["status"]) for r in data["rows"]] == [
        ("preflight", "passed"),
        ("readiness", "passed"),
        ("capital", "passed"),
        ("five-turns", "passed"),
        ("backend", "passed"),
        ("seeded-sampling", "passed"),
        ("mate-regression", "passed"),
        ("mate-dump-replay", "passed"),
    ]
    pre = data["rows"][0]["details"]
    # versions from the image's own python: the stand-ins carry the stack's pins
    assert pre["versions"]["torch"] == "2.11.0.post2+musa5.2.0" and pre["versions"]["vllm"] == "0.28.0"
    assert pre["devices"] == [] and "ran without the declared hardware" in pre["note"]
    assert data["rows"][2]["details"]["answer"] == "Beijing"
    assert data["rows"][4]["details"]["backends_in_log"] == ["FLASH_ATTN"]
    # the image's own sampler, MATE regression and mate replay, each run inside the container
    answers = data["rows"][5]["details"]["answers"]
    assert len(answers) == 3 and len(set(answers)) == 1 and len(answers[0].split()) > 1
    assert all(v["ok"] for v in data["rows"][6]["details"]["values"]) and data["rows"][6]["details"]["exit_code"] == 0
    replay = data["rows"][7]["details"]
    assert replay["env"]["MATE_LOGLEVEL"] == "10" and replay["env"]["MATE_DUMP_DIR"].startswith(
        "/tmp/stackforge-dumps-"
    )
    assert [(d["function"], d["status"]) for d in replay["dumps"]] == [
        ("gemm", "completed"),
        ("softmax_rows", "completed"),
    ]
    assert all(r["exit_code"] == 0 and "Replay passed" in r["output_tail"] for r in replay["replays"])
    assert data["hardware"]["missing"] and data["hardware"]["allowed_missing"]
    log = (tmp_path / "ok" / "container.log").read_text()
    assert "Using FLASH_ATTN backend." in log and "POST /v1/chat/completions" in log
    assert gone(data["container"]["name"]) and data["container"]["removed"]


def test_without_the_hardware_nothing_runs(post2, tmp_path):
    out = tmp_path / "hw"
    proc = mb.stackforge("smoke", "qwen3-8b", "--image", post2.image, "--out", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr  # not run: apart from a failure
    assert "no /dev/mtgpu*" in proc.stderr and "--allow-missing-hardware" in proc.stderr
    data = json.loads((out / "smoke.json").read_text())
    assert {r["status"] for r in data["rows"]} == {"not-run"} and data["container"] == {}


def test_wrong_answer_fails_the_chat_row(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "wrong", "--env", "STANDIN_SERVE_FAIL=wrong-answer")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = {r["name"]: r["status"] for r in data["rows"]}
    assert status["capital"] == "failed" and status["five-turns"] == "passed" and status["backend"] == "passed"
    assert "FAILED   capital" in proc.stdout and "does not contain 'Beijing': 'Nowhere'" in proc.stdout
    assert data["container"]["env"] == {"STANDIN_SERVE_FAIL": "<set by --env>"}
    assert gone(data["container"]["name"])


def test_never_ready_times_out_and_removes_the_container(post2, tmp_path):
    proc, data = run(
        post2.image, tmp_path / "slow", "--env", "STANDIN_SERVE_FAIL=never-ready", "--readiness-timeout", "4"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ready = data["rows"][1]
    assert ready["status"] == "failed" and ready["reason"].startswith("not ready within 4 s")
    assert [r["status"] for r in data["rows"][2:]] == ["not-run"] * 6
    assert "never-ready" in (tmp_path / "slow" / "container.log").read_text()
    assert gone(data["container"]["name"])


def test_a_server_that_dies_is_reported(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "dies", "--env", "STANDIN_SERVE_FAIL=die-after:2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["capital"]["status"] == "passed"
    assert rows["five-turns"]["status"] == "failed"
    assert "the server exited (code 1) during row 'five-turns'" in rows["five-turns"]["reason"]
    assert "EngineCore died unexpectedly" in rows["five-turns"]["reason"]
    assert rows["backend"]["status"] == "not-run"
    assert data["container"]["exit_code"] == 1 and gone(data["container"]["name"])


def test_backend_row_fails_when_the_log_shows_another_backend(post2, tmp_path):
    text = (REPO / "recipes" / "qwen3-8b.yaml").read_text()
    assert 'regex: "Using FLASH_ATTN backend"' in text
    variant = tmp_path / "qwen3-8b-triton.yaml"
    variant.write_text(text.replace('regex: "Using FLASH_ATTN backend"', 'regex: "Using TRITON_ATTN backend"'))
    proc, data = run(post2.image, tmp_path / "backend", recipe=str(variant))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = {r["name"]: r["status"] for r in data["rows"]}
    backend = next(r for r in data["rows"] if r["name"] == "backend")
    assert backend["status"] == "failed"
    assert backend["reason"].endswith("the log says: Using FLASH_ATTN backend")
    assert [n for n, s in status.items() if s != "passed"] == ["backend"]


def test_a_sampler_that_ignores_the_seed_fails_the_repeat_row(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "seed", "--env", "STANDIN_SERVE_FAIL=ignore-seed")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert [n for n, r in rows.items() if r["status"] != "passed"] == ["seeded-sampling"]
    assert rows["seeded-sampling"]["reason"].startswith("answers 1 and 2 of 3 differ (seed 1234, temperature 0.8)")
    assert "FAILED   seeded-sampling" in proc.stdout


def test_numbers_that_moved_fail_the_numeric_and_replay_rows(post2, tmp_path):
    # every MATE output moves by 0.01 (the reference no longer holds); a replay moves by another 0.0005: inside
    # mate replay's own torch.allclose(1e-3), outside the row's abs 1e-5
    fail = "STANDIN_MATE_FAIL=drift:0.01,replay-drift:0.0005"
    proc, data = run(post2.image, tmp_path / "drift", "--env", fail)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert [n for n, r in rows.items() if r["status"] != "passed"] == ["mate-regression", "mate-dump-replay"]
    assert rows["mate-regression"]["reason"].startswith("4 of 4 value(s) out of tolerance: gemm.sum 8.61773 vs 7.97773")
    assert "differs from the run" in rows["mate-dump-replay"]["reason"]
    assert all(r["exit_code"] == 0 for r in rows["mate-dump-replay"]["details"]["replays"])  # mate itself passed


def test_the_build_kept_the_targets_reports_and_healthcheck(post2):
    records = json.loads((post2.evidence / "reports.json").read_text())
    assert [(r["name"], r["target"], r["exit_code"]) for r in records] == [
        ("mate-config", "vllm-openai", 0),
        ("versions", "vllm-openai", 0),
    ]
    config = json.loads((post2.evidence / "reports" / "mate-config.txt").read_text())
    assert config["mate_version"] == "0.2.7" and config["torch_version"] == "2.11.0.post2+musa5.2.0"
    assert "vllm==0.28.0" in (post2.evidence / "reports" / "versions.txt").read_text().splitlines()
    health = json.loads(mb.docker("image", "inspect", "--format", "{{json .Config.Healthcheck}}", post2.image).stdout)
    assert health["Test"] == ["CMD", "python", "-m", "mate", "check"]
    assert health["Interval"] == 60 * 10**9 and health["Retries"] == 3
    # the image's own check passes without devices (MUSA not available is a warning)
    check = mb.docker("run", "--rm", "--network=none", "--entrypoint", "python", post2.image, "-m", "mate", "check")
    assert "Installation OK" in check.stdout and "MUSA not available" in check.stdout


def test_deepseek_rows_pass_in_the_image(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "dsv2", recipe="deepseek-v2-lite")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert all(r["status"] == "passed" for r in data["rows"]), proc.stdout
    assert rows["backend"]["details"]["backends_in_log"] == ["FLASHMLA"]
    assert rows["chat-200"]["details"]["matches"] == 6
    assert rows["no-http-500"]["details"]["matches"] == 0 and rows["no-seq-tot"]["details"]["matches"] == 0


def test_deepseek_rows_fail_on_the_seq_tot_engine_death(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "seq", "--env", "STANDIN_SERVE_FAIL=seq-tot", recipe="deepseek-v2-lite")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["five-turns"]["status"] == "failed" and "turn 4 of 5 answered HTTP 500" in rows["five-turns"]["reason"]
    assert rows["no-http-500"]["status"] == "failed"
    assert '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error' in rows["no-http-500"]["reason"]
    seq = rows["no-seq-tot"]
    assert seq["status"] == "failed" and seq["details"]["matches"] >= 1
    assert "AttributeError: 'ChunkedContextMetadata' object has no attribute 'seq_tot'" in seq["reason"]
    assert "EngineDeadError" in (tmp_path / "seq" / "container.log").read_text()
    assert gone(data["container"]["name"])


def test_qwen_moe_rows_find_torchadas_config_in_the_image(post2, tmp_path):
    """The image's torchada sets VLLM_TUNED_CONFIG_FOLDER at import; the fused-MoE lookup finds the FP8 config."""
    proc, data = run(post2.image, tmp_path / "qwen-moe", recipe="qwen3-30b-a3b-fp8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    moe = next(r for r in data["rows"] if r["name"] == "moe-config")
    assert "/torchada/triton/autotune/fused_moe/configs/triton_3_2_0/E=128,N=768," in moe["details"]["line"]
    # probe B: the record's counts, read in the image by the recipe's own command
    files = next(r for r in data["rows"] if r["name"] == "moe-config-files")
    assert files["status"] == "passed"
    assert {v["name"]: v["value"] for v in files["details"]["values"]} == {
        "space_free": 100,
        "spaced": 41,
        "files": 141,
        "aliases_identical": 41,
    }


def test_nemotron_runs_its_second_configuration(post2, tmp_path):
    out = tmp_path / "nemotron"
    proc, data = run(post2.image, out, "--configuration", "budget-24", recipe="nemotron-3.5-mtp6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data["configuration"] == "budget-24" and "smoke nemotron-3.5-mtp6 (budget-24):" in proc.stdout
    assert {r["name"]: r["status"] for r in data["rows"]}["mtp-lines"] == "passed"


# -- verdicts: vLLM's EngineDeadError, the overlay a recipe needs, the lease's device uuid ---------------------


def test_the_stop_is_marked_and_vllms_shutdown_follows_it(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "stop")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "stop" / "container.log").read_text().splitlines()
    stop = data["log_marks"]["stop"]
    assert 0 < stop < len(log) and not any("[shutdown]" in line for line in log[:stop])
    after = log[stop:]  # `docker stop`'s SIGTERM reached the image's `vllm serve` (PID 1)
    assert any(line.endswith("[shutdown] API server: shutdown triggered") for line in after), after
    assert any(line.endswith("INFO:     Application shutdown complete.") for line in after)
    assert data["engine_dead"] == [] and list(data["log_marks"]["rows"]) == [r.name for r in recipe_rows(MATE_RECIPE)]


def test_an_engine_dead_error_during_the_shutdown_is_noted_and_passes(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "r2", "--env", "STANDIN_SERVE_FAIL=dead-on-shutdown")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {r["status"] for r in data["rows"]} == {"passed"}
    (entry,) = data["engine_dead"]
    assert entry["phase"] == "shutdown" and entry["row"] is None and entry["line_no"] > data["log_marks"]["stop"]
    assert entry["line"].endswith(
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause."
    )
    assert any(line.endswith("[shutdown] MPClient: engine manager stopped") for line in entry["context"])
    noted = [line for line in proc.stdout.splitlines() if line.startswith("NOTED")]
    assert len(noted) == 1 and "EngineDeadError during shutdown" in noted[0] and "not a failure" in noted[0]


def test_an_engine_that_dies_while_serving_fails_its_row_with_the_lines(post2, tmp_path):
    proc, data = run(post2.image, tmp_path / "r1", "--env", "STANDIN_SERVE_FAIL=engine-dead:2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["capital"]["status"] == "passed" and rows["backend"]["status"] == "not-run"
    turns = rows["five-turns"]
    assert turns["status"] == "failed" and turns["reason"].startswith("turn 1 of 5 answered HTTP 500")
    assert "vLLM's EngineDeadError while serving (container.log line" in turns["reason"]
    assert "RuntimeError: stand-in failure mode engine-dead" in turns["reason"]  # the engine's own error beside it
    (entry,) = data["engine_dead"]
    assert entry["phase"] == "serving" and entry["row"] == "five-turns" and turns["details"]["engine_dead"]
    assert "EngineDeadError while serving" in proc.stdout and data["verdict"] == "failed"


def test_a_recipe_that_needs_an_overlay_refuses_the_release_image(post2, tmp_path):
    out = tmp_path / "jev"
    proc = mb.stackforge(
        "smoke", "diffusion-gemma", "--image", post2.image, "--allow-missing-hardware", "--out", str(out)
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: recipes/diffusion-gemma.yaml:" in proc.stderr
    assert "needs.overlay is 'jev', but the image" in proc.stderr and "carries no org.stackforge.overlay label" in (
        proc.stderr
    )
    assert "stackforge build post2 --overlay jev" in proc.stderr
    assert not out.exists() and "smoke: start" not in proc.stderr  # refused before any container started


def test_the_preflight_cannot_compare_a_uuid_without_a_device(post2, tmp_path):
    lease = "d6a04b9f-fec2-2c87-aa03-a8360298e63b"
    proc, data = run(post2.image, tmp_path / "uuid", "--device-uuid", lease)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # not run: never a pass
    pre = data["rows"][0]
    assert pre["status"] == "not-run" and "the device uuid could not be compared" in pre["reason"]
    assert pre["details"]["uuid_check"] == {"expected": [lease], "visible": [], "source": None}
    bad = mb.stackforge("smoke", "qwen3-8b", "--image", post2.image, "--device-uuid", "not a uuid")
    assert bad.returncode == 2 and "error: --device-uuid: 'not a uuid' is not a device uuid" in bad.stderr


def test_a_recipe_file_outside_any_checkout(post2, tmp_path):
    """An operator holding only a recipe file smokes an image from an empty directory: the rows run against the
    image, the numeric row (its reference file is the repository's) is named as not checked, and the evidence goes
    to ./smoke/<image id>/<recipe>/."""
    alone = tmp_path / "operator" / "qwen3-8b-mate.yaml"
    alone.parent.mkdir()
    alone.write_text(Path(MATE_RECIPE).read_text())
    here = tmp_path / "empty"
    here.mkdir()
    proc = mb.stackforge(
        "smoke",
        str(alone),
        "--image",
        post2.image,
        "--allow-missing-hardware",
        cwd=here,
        env={"STACKFORGE_ROOT": ""},
        timeout=600,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr  # nothing failed; one row was not checked
    out = here / "smoke" / post2.image.removeprefix("sha256:")[:12] / "qwen3-8b-mate"
    rel = out.relative_to(here).as_posix()
    written = sorted(p.relative_to(here).as_posix() for p in here.rglob("*") if p.is_file())
    assert written == [f"{rel}/container.log", f"{rel}/smoke.json"]  # the evidence, and nothing else
    data = json.loads((out / "smoke.json").read_text())
    assert data["checkout"] is None and data["image_id"] == post2.image
    assert data["not_checked"] == [
        "row mate-regression (reference tests/fixtures/recipes/references/mate-regression.json)"
    ]
    status = {r["name"]: r["status"] for r in data["rows"]}
    assert status.pop("mate-regression") == "not-run"
    assert set(status.values()) == {"passed"}, status
    assert "not checked (no checkout): row mate-regression" in proc.stdout
    assert f"evidence: {out}" in proc.stdout
    assert gone(data["container"]["name"])
