"""``stackforge smoke`` without an engine: the stand-in ``vllm serve`` runs as a local process behind the
same :class:`Container` interface the engine's container has, so readiness, rows, a dying server, the
evidence and the missing-hardware rule run for real."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from stackforge.recipes.load import load_recipe
from stackforge.recipes.model import Hardware
from stackforge.smoke import run as smokerun
from stackforge.smoke.report import CONTAINER_LOG, SMOKE_JSON, RowResult, SmokeReport
from stackforge.smoke.run import (
    ContainerSpec,
    HostFacts,
    RowContext,
    SmokeOptions,
    missing_hardware,
    run_row,
    smoke,
    wait_ready,
)
from tests.fixtures import musa_standins as ms

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "fixtures" / "standin_vllm_serve.py"
NO_HARDWARE = HostFacts((), ("runc",))
#: the rows of tests/fixtures/recipes/qwen3-8b-mate.yaml (recipes/qwen3-8b.yaml and the stand-in MATE rows), in order
MATE_RECIPE = REPO / "tests" / "fixtures" / "recipes" / "qwen3-8b-mate.yaml"
QWEN_ROWS = ["capital", "five-turns", "backend", "seeded-sampling", "mate-regression", "mate-dump-replay"]
HARDWARE = HostFacts(("/dev/mtgpu0", "/dev/mtgpu1"), ("mthreads", "runc"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcessContainer:
    """The stand-in server as a local process: the recipe's arguments, then its own loopback port."""

    def __init__(self, spec: ContainerSpec, log: Path, fail: str = ""):
        self.spec, self.log = spec, log
        self.ports = {port: free_port() for port in spec.ports.values()}
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ATTENTION_BACKEND"}
        env.update(spec.env, STANDIN_SERVE_FAIL=fail, PYTHONUNBUFFERED="1")
        port = self.ports[next(iter(spec.ports.values()))]
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, str(STANDIN), *spec.args, "--host", "127.0.0.1", "--port", str(port)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.removed = False
        #: directories a command made in the "container's" /tmp (the dump rows' MATE_DUMP_DIR): a container's
        #: removal takes its filesystem along, so :meth:`remove` deletes them from the host
        self.made: set[str] = set()

    def running(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def logs(self) -> str:
        return self.log.read_text()

    def exec(self, argv: Sequence[str], timeout: float = 120) -> tuple[int, str]:
        if not self.running():
            return 1, "container is not running"
        # the "image": `python` is this interpreter, with the stand-in mate package installed
        image = self.log.parent / "image"
        if not image.is_dir():
            ms.mate_tree(image / "site")
            (image / "bin").mkdir()
            (image / "bin" / "python").symlink_to(sys.executable)
        env = {**os.environ, **self.spec.env, "PYTHONPATH": str(image / "site")}
        env["PATH"] = f"{image / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        self.made |= {a.partition("=")[2] for a in argv if a.startswith("MATE_DUMP_DIR=/tmp/stackforge-dumps-")}
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
        return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stderr

    def address(self, port: int) -> str:
        return f"127.0.0.1:{self.ports[port]}"

    def remove(self) -> None:
        if self.running():
            self.proc.terminate()
        self.proc.wait(timeout=10)
        for made in self.made:
            shutil.rmtree(made, ignore_errors=True)
        self.removed = True


@pytest.fixture
def launcher(tmp_path):
    started: list[ProcessContainer] = []

    def make(fail: str = ""):
        def start(spec: ContainerSpec) -> ProcessContainer:
            c = ProcessContainer(spec, tmp_path / f"server-{len(started)}.log", fail)
            started.append(c)
            return c

        return start

    make.started = started  # type: ignore[attr-defined]
    yield make
    for c in started:
        if c.running():
            c.proc.kill()


def recipe(tmp_path: Path, text: str | None = None):
    if text is None:
        return load_recipe(REPO, str(MATE_RECIPE))
    path = tmp_path / "variant.yaml"
    path.write_text(text)
    return load_recipe(REPO, str(path))


def without_devices(tmp_path: Path, start, loaded=None, **kw):
    """A smoke run on a host without devices, allowed to run anyway (as the tests and CI do)."""
    kw.setdefault("interval", 0.1)
    kw.setdefault("root", REPO)  # a variant recipe in tmp_path reads the repository's reference files
    options = SmokeOptions(allow_missing_hardware=True, **kw)
    return smoke(loaded or recipe(tmp_path), "i", tmp_path / "o", options, launcher=start, facts=NO_HARDWARE)


def qwen_text() -> str:
    return MATE_RECIPE.read_text()


# -- readiness ------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_readiness_waits_until_200():
    clock = FakeClock()
    answers = iter([None, 503, 200])
    ready = wait_ready(lambda: next(answers), lambda: True, 60, clock=clock, sleep=clock.sleep, interval=2)
    assert ready.ok and ready.attempts == 3 and ready.waited_s == 4.0


def test_readiness_times_out_with_the_last_answer():
    clock = FakeClock()
    ready = wait_ready(lambda: 503, lambda: True, 5, clock=clock, sleep=clock.sleep, interval=2)
    assert not ready.ok and ready.waited_s == 5.0
    assert ready.reason == "not ready within 5 s (last answer HTTP 503)"


def test_readiness_stops_at_once_when_the_server_exits():
    clock = FakeClock()
    alive = iter([True, True, False])
    ready = wait_ready(lambda: None, lambda: next(alive), 600, clock=clock, sleep=clock.sleep, interval=1)
    assert not ready.ok and ready.attempts == 2 and ready.waited_s == 2.0
    assert ready.reason == "the server exited before it was ready"


# -- hardware -------------------------------------------------------------------------------------------


def test_missing_hardware_names_what_is_missing():
    hw = Hardware.model_validate({"devices": "mthreads", "count": 1})
    assert missing_hardware(hw, NO_HARDWARE) == "this host has no mthreads device (no /dev/mtgpu*)"
    no_runtime = HostFacts(("/dev/mtgpu0",), ("runc",))
    assert "the engine has no mthreads runtime (docker info lists: runc)" in str(missing_hardware(hw, no_runtime))
    assert missing_hardware(hw, HARDWARE) is None
    assert missing_hardware(Hardware.model_validate({"devices": "none"}), NO_HARDWARE) is None


def test_device_options_live_in_one_place():
    mthreads = smokerun.PLATFORM_OPTIONS["mthreads"]
    assert mthreads is not None and smokerun.PLATFORM_OPTIONS["none"] is None
    assert mthreads.argv() == ["--runtime=mthreads", "--env", "MTHREADS_VISIBLE_DEVICES=all", "--ipc=host"]
    spec = ContainerSpec("n", "img:1", ["m", "--port", "8000"], {"A": "1"}, {"api": 8000}, mthreads)
    argv = spec.argv()
    assert argv[:4] == ["run", "-d", "--name", "n"] and "--runtime=mthreads" in argv
    assert argv[argv.index("--publish") + 1] == "127.0.0.1::8000/tcp"
    assert argv[-4:] == ["img:1", "m", "--port", "8000"]


def test_missing_hardware_records_every_row_not_run_and_starts_nothing(tmp_path, launcher):
    report = smoke(recipe(tmp_path), "img:1", tmp_path / "out", launcher=launcher(), facts=NO_HARDWARE)
    assert launcher.started == []
    assert not report.ok and report.verdict == "not-run"
    data = json.loads((tmp_path / "out" / SMOKE_JSON).read_text())
    assert [r["name"] for r in data["rows"]] == ["preflight", "readiness", *QWEN_ROWS]
    assert {r["status"] for r in data["rows"]} == {"not-run"}
    assert all("no /dev/mtgpu*" in r["reason"] for r in data["rows"])
    assert data["hardware"]["missing"] and data["hardware"]["allowed_missing"] is False
    assert data["ok"] is False and data["error"].endswith("no container was started")
    assert report.exit_code == 3 and data["exit_code"] == 3  # not run: told apart from a failure


def test_the_exit_code_tells_passed_failed_and_not_run_apart():
    def report(*statuses: str) -> SmokeReport:
        return SmokeReport(
            "r", "r.yaml", "img:1", rows=[RowResult(f"r{i}", "chat", status=s) for i, s in enumerate(statuses)]
        )

    assert report("passed", "passed").exit_code == 0
    assert report("passed", "failed", "not-run").exit_code == 1
    assert report("passed", "not-run").exit_code == 3
    assert report().exit_code == 3


# -- whole runs against the stand-in server -------------------------------------------------------------


def test_passing_run_writes_rows_and_log(tmp_path, launcher):
    out = tmp_path / "out"
    report = smoke(
        recipe(tmp_path),
        "img:1",
        out,
        SmokeOptions(allow_missing_hardware=True),
        launcher=launcher(),
        facts=NO_HARDWARE,
    )
    data = json.loads((out / SMOKE_JSON).read_text())
    # Every row passed, but on a host without the declared devices: never a pass, and the exit is 0 as asked.
    assert not report.ok and data["ok"] is False and data["verdict"] == "not-run", report.table()
    assert report.exit_code == 0 and "without the declared hardware" in report.table().splitlines()[-1]
    rows = {r["name"]: r for r in data["rows"]}
    assert list(rows) == ["preflight", "readiness", *QWEN_ROWS]
    for row in data["rows"]:
        assert set(row) == {"name", "kind", "status", "reason", "duration_s", "details"}
        assert row["status"] == "passed" and row["reason"] is None
    assert rows["preflight"]["details"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "no /dev/mtgpu*" in rows["preflight"]["details"]["note"]
    assert rows["capital"]["details"]["answer"] == "Beijing"
    assert rows["five-turns"]["details"]["statuses"] == [200] * 5
    assert rows["backend"]["details"]["line"].endswith("Using FLASH_ATTN backend.")
    assert rows["backend"]["details"]["backends_in_log"] == ["FLASH_ATTN"]
    sampled = rows["seeded-sampling"]["details"]["answers"]
    assert len(sampled) == 3 and len(set(sampled)) == 1 and len(sampled[0].split()) > 1  # sampled, and the same
    assert {v["name"] for v in rows["mate-regression"]["details"]["values"]} == {
        "gemm.sum",
        "gemm.mean",
        "softmax.max",
        "lse.mean",
    }
    assert [d["function"] for d in rows["mate-dump-replay"]["details"]["dumps"]] == ["gemm", "softmax_rows"]
    assert data["hardware"]["allowed_missing"] is True and data["hardware"]["device_options"] == []
    assert data["container"]["docker"][:3] == ["docker", "run", "-d"]
    assert "--attention-backend" in data["container"]["docker"]
    assert "Using FLASH_ATTN backend." in (out / CONTAINER_LOG).read_text()
    assert launcher.started[0].removed


def test_wrong_answer_fails_the_chat_row_only(tmp_path, launcher):
    report = smoke(
        recipe(tmp_path),
        "i",
        tmp_path / "o",
        SmokeOptions(interval=0.1),
        launcher=launcher("wrong-answer"),
        facts=HARDWARE,
    )
    status = {r.name: r.status for r in report.rows}
    assert status == {
        "preflight": "failed",
        "readiness": "passed",
        "capital": "failed",
        "five-turns": "passed",
        "backend": "passed",
        "seeded-sampling": "passed",  # "Nowhere" every time: the same text
        "mate-regression": "passed",
        "mate-dump-replay": "passed",
    }
    capital = next(r for r in report.rows if r.name == "capital")
    assert capital.reason == "the answer does not contain 'Beijing': 'Nowhere'"
    # the host claims devices, but the "container" sees none: the preflight says so
    assert report.rows[0].reason == "0 device(s) visible in the container, the recipe needs 1"


def test_a_server_that_dies_fails_its_row_and_stops_the_run(tmp_path, launcher):
    report = without_devices(tmp_path, launcher("die-after:3"))
    rows = {r.name: r for r in report.rows}
    assert rows["capital"].status == "passed"
    assert rows["five-turns"].status == "failed"
    assert "turn 3 of 5 answered nothing" in str(rows["five-turns"].reason)
    assert "the server exited (code 1) during row 'five-turns'" in str(rows["five-turns"].reason)
    assert "EngineCore died unexpectedly" in str(rows["five-turns"].reason)  # the log's last lines
    assert rows["backend"].status == "not-run" and rows["backend"].reason == (
        "not run: the server exited during row 'five-turns'"
    )
    assert report.verdict == "failed" and launcher.started[0].removed


def test_never_ready_times_out_and_leaves_the_rows_not_run(tmp_path, launcher):
    report = without_devices(tmp_path, launcher("never-ready"), readiness_timeout=1.5, interval=0.2)
    ready = report.rows[1]
    assert ready.status == "failed" and ready.reason == "not ready within 1.5 s (nothing answered)"
    assert [r.status for r in report.rows[2:]] == ["not-run"] * len(QWEN_ROWS)
    assert report.error == "not ready within 1.5 s (nothing answered)"
    assert launcher.started[0].removed and not launcher.started[0].running()
    data = json.loads((tmp_path / "o" / SMOKE_JSON).read_text())
    assert data["rows"][1]["details"]["timeout_s"] == 1.5


def test_backend_row_reads_the_log_not_the_flag(tmp_path, launcher):
    text = qwen_text().replace('regex: "Using FLASH_ATTN backend"', 'regex: "Using TRITON_ATTN backend"')
    report = without_devices(tmp_path, launcher(), recipe(tmp_path, text))
    backend = next(r for r in report.rows if r.name == "backend")
    assert backend.status == "failed"
    assert backend.reason == (
        "no line of the server's log matches 'Using TRITON_ATTN backend'; the log says: Using FLASH_ATTN backend"
    )


def test_env_defaults_and_extra_env_reach_the_server_and_are_recorded_by_name(tmp_path, launcher):
    text = qwen_text() + "env: {VLLM_ATTENTION_BACKEND: {default: TORCH_SDPA, description: the backend}}\n"
    text = text.replace("  --attention-backend: FLASH_ATTN\n", "").replace("FLASH_ATTN backend", "TORCH_SDPA backend")
    report = without_devices(tmp_path, launcher(), recipe(tmp_path, text), env={"HF_TOKEN": "secret-value"})
    assert report.exit_code == 0 and all(r.status == "passed" for r in report.rows), report.table()
    assert report.container["env"] == {"VLLM_ATTENTION_BACKEND": "TORCH_SDPA", "HF_TOKEN": "<set by --env>"}
    assert "secret-value" not in (tmp_path / "o" / SMOKE_JSON).read_text()


# -- single rows ----------------------------------------------------------------------------------------


def test_rows_against_fixed_answers(tmp_path):
    loaded = recipe(tmp_path)
    answers = {
        "/v1/models": (404, '{"error": {"message": "Not Found"}}'),
        "/v1/chat/completions": (200, json.dumps({"choices": [{"message": {"content": "It is beijing."}}]})),
    }
    calls: list[tuple] = []

    def request(method, url, body=None, timeout=300):
        calls.append((method, url, body))
        return answers[url.split("8000", 1)[1]]

    ctx = RowContext(loaded.model, {"api": "127.0.0.1:8000"}, lambda: "x\nINFO Using FLASHMLA backend.\n", request)
    rows = {r.name: r for r in loaded.model.smoke}
    chat = run_row(rows["capital"], ctx)
    assert chat.status == "passed"  # case-insensitive
    assert calls[0][2]["model"] == "qwen3-8b" and calls[0][2]["messages"][0]["role"] == "user"
    turns = run_row(rows["five-turns"], ctx)
    assert turns.status == "passed" and len(calls[-1][2]["messages"]) == 9  # 5 user + 4 assistant
    log = run_row(rows["backend"], ctx)
    assert log.status == "failed" and log.details["backends_in_log"] == ["FLASHMLA"]
    get = load_recipe(REPO, "diffusion-gemma").model.smoke[2]
    ctx2 = RowContext(
        load_recipe(REPO, "diffusion-gemma").model, {"api": "h:1", "interposer": "127.0.0.1:8000"}, str, request
    )
    got = run_row(get, ctx2)
    assert got.status == "failed" and got.reason.startswith("GET /v1/models answered HTTP 404")
    assert calls[-1][1] == "http://127.0.0.1:8000/v1/models"  # the row's own port


def test_parse_env_refuses_bad_names():
    assert smokerun.parse_env(["A_B=x=y"]) == {"A_B": "x=y"}
    for bad in ("1A=x", "A", "A=\x1b[31m"):
        with pytest.raises(Exception) as err:
            smokerun.parse_env([bad])
        assert "--env" in str(err.value)


def test_a_sampler_that_ignores_the_seed_fails_the_repeat_row(tmp_path, launcher):
    report = without_devices(tmp_path, launcher("ignore-seed"))
    rows = {r.name: r for r in report.rows}
    assert rows["capital"].status == "passed"  # greedy: no seed involved
    sampled = rows["seeded-sampling"]
    assert sampled.status == "failed" and sampled.reason.startswith("answers 1 and 2 of 3 differ (seed 1234")
    assert len(set(sampled.details["answers"])) > 1 and report.exit_code == 1


# -- log rows that count, configurations, the post2 matrix's recipes against the stand-in -------------------


def log_result(text: str, **row) -> RowResult:
    from stackforge.recipes.model import LogLine

    return smokerun.log_row(LogLine.model_validate(row), text, RowResult("r", "log"))


def test_log_rows_count_matching_lines_and_name_them():
    log = 'a "POST /v1/chat/completions HTTP/1.1" 200 OK\nb seq_tot here\nc seq_tot again\n'
    none = log_result(log, regex="seq_tot", count=0)
    assert none.status == "failed" and none.details["matches"] == 2
    assert none.reason == (
        "2 lines of the server's log match 'seq_tot', expected no line: b seq_tot here | c seq_tot again"
    )
    assert none.details["lines"] == ["b seq_tot here", "c seq_tot again"]
    assert log_result(log, regex="seq_tot", count=2).status == "passed"
    assert log_result(log, regex="seq_tot", min=1, max=2).status == "passed"
    assert log_result(log, regex="seq_tot", max=1).reason.startswith(
        "2 lines of the server's log match 'seq_tot', expected at most 1 line:"
    )
    assert log_result(log, regex='HTTP/1.1" 500', count=0).status == "passed"
    missing = log_result(log, regex="Using FLASHMLA backend", count=1)
    assert missing.reason == "no line of the server's log matches 'Using FLASHMLA backend', expected exactly 1 line"
    # without a bound: at least one line, as before
    assert log_result(log, regex="seq_tot").status == "passed"
    assert log_result(log, regex="nope").reason == "no line of the server's log matches 'nope'"


def deepseek(tmp_path: Path):
    return load_recipe(REPO, "deepseek-v2-lite")


def test_deepseek_rows_pass_against_the_stand_in(tmp_path, launcher):
    report = without_devices(tmp_path, launcher(), deepseek(tmp_path))
    assert report.exit_code == 0 and all(r.status == "passed" for r in report.rows), report.table()
    rows = {r.name: r for r in report.rows}
    assert rows["backend"].details["backends_in_log"] == ["FLASHMLA"]
    assert rows["chat-200"].details["matches"] == 6 and rows["no-http-500"].details["matches"] == 0
    assert rows["no-seq-tot"].details == {**rows["no-seq-tot"].details, "matches": 0, "lines": []}


def test_deepseek_rows_fail_on_the_records_seq_tot_failure(tmp_path, launcher):
    report = without_devices(tmp_path, launcher("seq-tot"), deepseek(tmp_path))
    rows = {r.name: r for r in report.rows}
    assert report.exit_code == 1 and report.verdict == "failed"
    assert rows["capital"].status == "passed" and rows["backend"].status == "passed"
    # the 4th turn is the first request with 4 user turns: the engine dies and it answers 500, the server stays up
    assert rows["five-turns"].status == "failed"
    assert rows["five-turns"].reason.startswith("turn 4 of 5 answered HTTP 500")
    assert rows["chat-200"].status == "failed" and rows["chat-200"].details["matches"] == 4
    http500 = rows["no-http-500"]
    assert http500.status == "failed" and http500.details["matches"] == 1
    assert '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error' in http500.reason
    seq = rows["no-seq-tot"]
    assert seq.status == "failed" and seq.details["matches"] == 1
    assert seq.reason.startswith("1 line of the server's log match 'seq_tot', expected no line: (EngineCore pid=")
    assert "AttributeError: 'ChunkedContextMetadata' object has no attribute 'seq_tot'" in seq.reason
    log = (tmp_path / "o" / CONTAINER_LOG).read_text()
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in log


def test_a_configuration_changes_the_token_budget_and_is_recorded(tmp_path, launcher):
    loaded = load_recipe(REPO, "nemotron-3.5-mtp6")
    budgets: list[int] = []

    def request(method, url, body=None, timeout=300):
        if body is not None:
            budgets.append(body["max_tokens"])
        return smokerun.http(method, url, body, timeout)

    options = SmokeOptions(allow_missing_hardware=True, interval=0.1, configuration="budget-24")
    report = smoke(loaded, "i", tmp_path / "o", options, launcher=launcher(), facts=NO_HARDWARE, request=request)
    assert budgets == [24] and report.configuration == "budget-24", report.table()
    assert all(r.status == "passed" for r in report.rows), report.table()  # the stand-in answers within any budget
    data = json.loads((tmp_path / "o" / SMOKE_JSON).read_text())
    assert data["configuration"] == "budget-24" and report.table().splitlines()[-1].startswith(
        "smoke nemotron-3.5-mtp6 (budget-24):"
    )
    rows = {r.name: r for r in report.rows}
    assert rows["mtp-lines"].details["matches"] == 2
    budgets.clear()
    default = smoke(
        loaded,
        "i",
        tmp_path / "d",
        SmokeOptions(allow_missing_hardware=True, interval=0.1),
        launcher=launcher(),
        facts=NO_HARDWARE,
        request=request,
    )
    assert budgets == [64] and default.configuration == "budget-64"


def test_qwen_moe_rows_read_the_fused_moe_lookup(tmp_path, launcher, monkeypatch):
    from tests.fixtures.musa_standins import QWEN3_MOE_FP8_CONFIG

    loaded = load_recipe(REPO, "qwen3-30b-a3b-fp8")
    folder = tmp_path / "torchada" / "configs" / "triton_3_2_0"
    folder.mkdir(parents=True)
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(folder))
    missing = without_devices(tmp_path, launcher(), loaded)
    rows = {r.name: r for r in missing.rows}
    assert rows["moe-config"].status == "failed" and rows["no-default-moe-config"].status == "failed"
    assert "Using default MoE config. Performance might be sub-optimal! Config file not found at" in str(
        rows["no-default-moe-config"].reason
    )
    (folder / QWEN3_MOE_FP8_CONFIG).write_text("{}\n")
    found = smoke(
        loaded,
        "i",
        tmp_path / "found",
        SmokeOptions(allow_missing_hardware=True, interval=0.1),
        launcher=launcher(),
        facts=NO_HARDWARE,
    )
    # moe-config-files counts torchada's files with the image's python: the integration test runs it in the image
    assert all(r.status == "passed" for r in found.rows if r.name != "moe-config-files"), found.table()
    line = next(r for r in found.rows if r.name == "moe-config").details["line"]
    assert line.endswith(f"Using configuration from {folder / QWEN3_MOE_FP8_CONFIG} for MoE layer.")


# -- no checkout ----------------------------------------------------------------------------------------


def test_a_recipe_file_outside_any_checkout_runs_and_names_what_it_did_not_check(tmp_path, launcher):
    """An operator holding only a recipe file: the rows run; a numeric row, whose reference file is the
    repository's, is not run and the report says so (not a pass, not a failure: exit 3)."""
    alone = tmp_path / "operator" / "qwen3-8b-mate.yaml"
    alone.parent.mkdir()
    alone.write_text(MATE_RECIPE.read_text())
    loaded = load_recipe(None, str(alone))
    assert loaded.display == str(alone) and smokerun.recipe_repository(loaded) is None
    out = tmp_path / "out"
    options = SmokeOptions(allow_missing_hardware=True, interval=0.1)
    report = smoke(loaded, "img:1", out, options, launcher=launcher(), facts=NO_HARDWARE)
    data = json.loads((out / SMOKE_JSON).read_text())
    status = {r["name"]: (r["status"], r["reason"]) for r in data["rows"]}
    assert status.pop("mate-regression") == (
        "not-run",
        "not checked: no checkout here, and the row's reference file "
        "tests/fixtures/recipes/references/mate-regression.json is read from one "
        "(run smoke in a checkout of the repository, or with --root DIR)",
    )
    assert {s for s, _ in status.values()} == {"passed"}  # every other row ran and passed
    assert data["checkout"] is None
    assert data["not_checked"] == [
        "row mate-regression (reference tests/fixtures/recipes/references/mate-regression.json)"
    ]
    assert report.verdict == "not-run" and report.exit_code == 3
    assert "not checked (no checkout): row mate-regression" in report.table()
    # In a checkout the same file's row is compared, and the report names the checkout.
    inside = smoke(
        loaded,
        "img:1",
        tmp_path / "in",
        SmokeOptions(allow_missing_hardware=True, interval=0.1, root=REPO),
        launcher=launcher(),
        facts=NO_HARDWARE,
    )
    assert inside.exit_code == 0 and inside.not_checked == [] and inside.checkout == str(REPO)


def test_outside_a_checkout_the_recipe_is_a_path_and_the_image_is_named(tmp_path, monkeypatch, capsys):
    from stackforge.cli.main import main

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.delenv("STACKFORGE_ROOT", raising=False)
    alone = tmp_path / "qwen3-8b.yaml"
    alone.write_text((REPO / "recipes" / "qwen3-8b.yaml").read_text())
    assert main(["smoke", "qwen3-8b", "--image", "x:1"]) == 2
    err = capsys.readouterr().err
    assert "no checkout here to find recipe 'qwen3-8b'" in err and "name the recipe by its file's path" in err
    assert main(["smoke", str(alone)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --image: {alone}: no checkout here, so the local tag of its image"), err
    assert "stackforge smoke RECIPE.yaml --image REF" in err
    assert list(empty.iterdir()) == []  # nothing written
