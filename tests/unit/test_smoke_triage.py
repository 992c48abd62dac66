"""vLLM's EngineDeadError triaged from a smoke's container log: during the shutdown the smoke sent it is
noted; while serving it fails the row it fell in. The log text carries vLLM's real formats (facts/vllm.yaml),
and whole runs go against the stand-in server, stopped with SIGTERM as ``docker stop`` does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stackforge.recipes.load import load_recipe
from stackforge.smoke import triage
from stackforge.smoke.report import SMOKE_JSON, RowResult, SmokeReport
from stackforge.smoke.run import ContainerSpec, HostFacts, SmokeOptions, smoke
from tests.fixtures import facts
from tests.fixtures import standin_vllm_serve as standin
from tests.fixtures.standin_container import StoppableProcess

REPO = Path(__file__).resolve().parents[2]
NO_HARDWARE = HostFacts((), ("runc",))
DEAD = (
    "(APIServer pid=1) ERROR 09-29 06:06:49 [async_llm.py:538] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)


def engine_dead_facts() -> dict:
    return facts.upstream("vllm")["engine_dead"]


def serving_log() -> list[str]:
    """The post2 record's r1: the fork's AttributeError, the API server's EngineDeadError, an HTTP 500."""
    return [
        '(APIServer pid=1) INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "(EngineCore pid=2) ERROR 09-29 05:16:23 [core.py:1348] EngineCore encountered a fatal error.",
        "(EngineCore pid=2) ERROR 09-29 05:16:23 [core.py:1348] AttributeError: 'ChunkedContextMetadata' object has "
        "no attribute 'seq_tot'",
        "(APIServer pid=1) ERROR 09-29 05:16:23 [async_llm.py:538] AsyncLLM output_handler failed.",
        "(APIServer pid=1) ERROR 09-29 05:16:23 [async_llm.py:538] Traceback (most recent call last):",
        "(APIServer pid=1) ERROR 09-29 05:16:23 [async_llm.py:538]     raise EngineDeadError()",
        DEAD.replace("06:06:49", "05:16:23"),
        '(APIServer pid=1) INFO:     127.0.0.1:50002 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
    ]


def test_the_facts_name_the_vllm_files_and_commits_they_were_read_at():
    files = {k: v for k, v in engine_dead_facts().items() if k.startswith("vllm/")}
    assert set(files) >= {
        "vllm/v1/engine/exceptions.py",
        "vllm/v1/engine/async_llm.py",
        "vllm/v1/engine/core_client.py",
    }
    for path, entry in files.items():
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and entry["pinned"] is False, path
        assert entry.get("lines") or entry.get("calls"), path
    assert "AsyncLLM output_handler failed." in files["vllm/v1/engine/async_llm.py"]["calls"][0]


def test_the_pattern_takes_the_exception_line_not_the_source_lines():
    printed = engine_dead_facts()["vllm/v1/engine/exceptions.py"]["printed"][0]
    assert triage.ENGINE_DEAD.search(printed)
    assert triage.ENGINE_DEAD.search(engine_dead_facts()["record"]["serving"][1])  # the record's short form
    for source in ("    raise EngineDeadError()", "    except EngineDeadError:", "class EngineDeadError(Exception):"):
        assert not triage.ENGINE_DEAD.search(source), source
    assert not triage.ENGINE_DEAD.search("Request chatcmpl-3 failed (engine dead).")


def test_an_engine_dead_error_after_the_stop_is_the_shutdown():
    before = ['(APIServer pid=1) INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200 OK'] * 3
    after = [f"(APIServer pid=1) INFO 09-29 06:06:49 {line}" for line in engine_dead_facts()["shutdown_sequence"][:6]]
    log = "\n".join([*before, *after, DEAD, *after[6:]])
    found = triage.find(log, triage.LogMarks({"capital": [0, 3]}, stop=3))
    assert len(found) == 1
    entry = found[0]
    assert entry["phase"] == "shutdown" and entry["row"] is None and entry["line_no"] == 10
    assert entry["line"] == DEAD
    assert entry["after"].endswith("[shutdown] API server: shutdown triggered")
    assert "[shutdown] MPClient: engine manager stopped" in "\n".join(entry["context"])


def test_an_engine_dead_error_before_the_stop_is_serving_and_names_its_row():
    lines = serving_log()
    marks = triage.LogMarks({"capital": [0, 1], "five-turns": [1, len(lines)]}, stop=len(lines))
    (entry,) = triage.find("\n".join(lines), marks)  # the traceback's `raise EngineDeadError()` is no second hit
    assert entry["phase"] == "serving" and entry["row"] == "five-turns" and entry["line_no"] == 7
    context = "\n".join(entry["context"])
    assert "no attribute 'seq_tot'" in context and '"POST /v1/chat/completions HTTP/1.1" 500' in context
    # without a stop (the server exited on its own) every one is serving
    (alone,) = triage.find("\n".join(lines), triage.LogMarks())
    assert alone["phase"] == "serving" and alone["row"] is None


def test_apply_fails_the_row_and_a_death_between_rows_fails_the_run():
    lines = serving_log()
    report = SmokeReport("r", "r.yaml", "img", rows=[RowResult("capital", "chat"), RowResult("five-turns", "turns")])
    for row in report.rows:
        row.passed()
    triage.apply(report, "\n".join(lines), triage.LogMarks({"capital": [0, 1], "five-turns": [1, 8]}, stop=8))
    turns = report.rows[1]
    assert turns.status == "failed" and turns.details["engine_dead"] == 7
    assert turns.reason.startswith("vLLM's EngineDeadError while serving (container.log line 7):")
    assert "no attribute 'seq_tot'" in turns.reason
    assert report.verdict == "failed" and report.exit_code == 1
    assert report.to_json()["engine_dead"][0]["phase"] == "serving"

    between = SmokeReport("r", "r.yaml", "img", rows=[RowResult("capital", "chat")])
    between.rows[0].passed()
    triage.apply(between, "\n".join(lines), triage.LogMarks({"capital": [0, 1]}, stop=8))
    assert between.rows[0].status == "passed"  # it fell in no row: the run fails
    assert not between.ok and between.verdict == "failed" and between.exit_code == 1
    assert "EngineDeadError while serving (container.log line 7, between the rows)" in between.table()
    assert between.table().splitlines()[-1] == (
        "smoke r: failed — vLLM's EngineDeadError while serving (container.log line 7)"
    )


def test_the_stand_in_prints_vllms_shutdown_sequence_with_the_facts_lines():
    facts_lines = engine_dead_facts()["shutdown_sequence"]
    printed = standin.shutdown_lines(dead=False)
    messages = [line.split("] ", 1)[-1] if "] " in line else line.split(") ", 1)[-1] for line in facts_lines]
    found = [next(i for i, p in enumerate(printed) if p.endswith(m)) for m in messages]
    assert found == sorted(found)  # the facts' order
    assert not any(triage.ENGINE_DEAD.search(p) for p in printed)
    dead = standin.shutdown_lines(dead=True)
    hit = next(i for i, p in enumerate(dead) if triage.ENGINE_DEAD.search(p))
    assert dead[hit].endswith(engine_dead_facts()["vllm/v1/engine/exceptions.py"]["printed"][0])
    assert dead[hit - 7].endswith("[shutdown] MPClient: engine manager stopped")  # after the force kill, as in r2


# -- whole runs against the stand-in server --------------------------------------------------------------------


@pytest.fixture
def launcher(tmp_path):
    started: list[StoppableProcess] = []

    def make(fail: str = ""):
        def start(spec: ContainerSpec) -> StoppableProcess:
            c = StoppableProcess(spec, tmp_path / f"server-{len(started)}.log", fail)
            started.append(c)
            return c

        return start

    make.started = started  # type: ignore[attr-defined]
    yield make
    for c in started:
        if c.running():
            c.proc.kill()


def run(tmp_path: Path, start) -> SmokeReport:
    options = SmokeOptions(allow_missing_hardware=True, interval=0.1)
    return smoke(load_recipe(REPO, "qwen3-8b"), "img:1", tmp_path / "o", options, launcher=start, facts=NO_HARDWARE)


def test_a_clean_stop_logs_vllms_shutdown_and_nothing_is_triaged(tmp_path, launcher):
    report = run(tmp_path, launcher())
    assert report.exit_code == 0 and report.engine_dead == [], report.table()
    assert launcher.started[0].stopped and launcher.started[0].removed
    log = (tmp_path / "o" / "container.log").read_text().splitlines()
    stop = report.log_marks["stop"]
    assert any("[shutdown] API server: shutdown triggered" in line for line in log[stop:])
    assert not any("[shutdown]" in line for line in log[:stop])
    assert list(report.log_marks["rows"]) == ["capital", "five-turns", "backend", "seeded-sampling"]


def test_an_engine_dead_error_during_shutdown_is_noted_and_the_run_passes(tmp_path, launcher):
    report = run(tmp_path, launcher("dead-on-shutdown"))
    assert report.exit_code == 0 and all(r.status == "passed" for r in report.rows), report.table()
    (entry,) = report.engine_dead
    assert entry["phase"] == "shutdown" and entry["line_no"] > report.log_marks["stop"]
    assert entry["line"].endswith("EngineCore encountered an issue. See stack trace (above) for the root cause.")
    # the whole logged traceback, and vLLM's shutdown lines ahead of it
    assert any(line.endswith("[shutdown] MPClient: engine manager stopped") for line in entry["context"])
    data = json.loads((tmp_path / "o" / SMOKE_JSON).read_text())
    assert data["engine_dead"] == [entry] and data["log_marks"]["stop"] == report.log_marks["stop"]
    noted = [line for line in report.table().splitlines() if line.startswith("NOTED")]
    assert len(noted) == 1 and "EngineDeadError during shutdown" in noted[0] and "not a failure" in noted[0]


def test_an_engine_that_dies_while_serving_fails_its_row_with_the_lines(tmp_path, launcher):
    report = run(tmp_path, launcher("engine-dead:2"))
    rows = {r.name: r for r in report.rows}
    assert rows["capital"].status == "passed"
    turns = rows["five-turns"]
    assert turns.status == "failed" and turns.reason.startswith("turn 1 of 5 answered HTTP 500")
    assert "the server exited (code 1) during row 'five-turns'" in turns.reason
    assert "vLLM's EngineDeadError while serving (container.log line" in turns.reason
    assert "RuntimeError: stand-in failure mode engine-dead" in turns.reason  # the lines around it
    assert rows["backend"].status == "not-run"
    (entry,) = report.engine_dead
    assert entry["phase"] == "serving" and entry["row"] == "five-turns"
    assert any(line.endswith("RuntimeError: stand-in failure mode engine-dead") for line in entry["context"])
    assert report.verdict == "failed" and report.exit_code == 1
