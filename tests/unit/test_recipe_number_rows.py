"""Chat rows with seed, temperature and repeat; numeric and dump rows: the schema (errors name file, line and
fix), recipe lint's reference check, and run_row against fake requests and a stand-in MATE run as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.errors import UserError
from stackforge.recipes.lint import check_repository
from stackforge.recipes.load import load_recipe
from stackforge.recipes.model import Recipe
from stackforge.recipes.numeric import DumpReplay, Tolerance
from stackforge.smoke.checks import dump_row
from stackforge.smoke.numbers import compare, parse_json, parse_mate_log
from stackforge.smoke.report import RowResult
from stackforge.smoke.run import RowContext, run_row
from tests.fixtures import musa_standins as ms

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

BASE = """\
description: rows that sample and compare numbers
image: {stack: post2, target: vllm-openai}
model: {id: Qwen/Qwen3-8B, served_name: qwen3-8b}
ports: {api: 8000}
smoke:
  - name: sampled
    chat: {prompt: "Name three cities.", temperature: 0.8, seed: 7, max_tokens: 16, repeat: 3}
  - name: regression
    numeric:
      run: {argv: [python, -m, mate.regression, --seed, "0"]}
      reference: refs/regression.json
      tolerance: {abs: 1.0e-4}
  - name: replay
    dump:
      run: {argv: [python, -m, mate.regression]}
      tolerance: {rel: 1.0e-6}
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "regression.json").write_text(json.dumps({"gemm.sum": 1.5, "lse.mean": -2.0}))
    return tmp_path


def load(root: Path, text: str, name: str = "r"):
    (root / "recipes" / f"{name}.yaml").write_text(text, encoding="utf-8")
    return load_recipe(root, name)


def problems_of(root: Path, text: str) -> str:
    with pytest.raises(UserError) as info:
        load(root, text)
    err = info.value
    problems = getattr(err, "problems", [err])
    assert all(str(p.file) == "recipes/r.yaml" for p in problems)
    return "\n".join(f"{p.line}: {p.render()}" for p in problems)


# -- schema ---------------------------------------------------------------------------------------------


def test_the_rows_load_typed():
    rows = {r.name: r for r in load_recipe(REPO, str(REPO / "tests/fixtures/recipes/qwen3-8b-mate.yaml")).model.smoke}
    sampled = rows["seeded-sampling"].chat
    assert sampled is not None and (sampled.temperature, sampled.seed, sampled.repeat) == (0.8, 1234, 3)
    assert rows["mate-regression"].kind == "numeric" and rows["mate-dump-replay"].kind == "dump"
    dump = rows["mate-dump-replay"].dump
    assert dump is not None and (dump.level_env, dump.dir_env, dump.level) == ("MATE_LOGLEVEL", "MATE_DUMP_DIR", 10)


@pytest.mark.parametrize(
    ("old", "new", "line", "needle"),
    [
        ("temperature: 0.8, seed: 7", "temperature: 2.5, seed: 7", 7, "less than or equal to 2"),
        ("temperature: 0.8, seed: 7, ", "temperature: 0.8, ", 7, "add a seed"),
        ("seed: 7", "seed: -1", 7, "greater than or equal to 0"),
        ("repeat: 3", "repeat: 50", 7, "less than or equal to 20"),
        (
            '{prompt: "Name three cities.", temperature: 0.8, seed: 7, max_tokens: 16, repeat: 3}',
            '{prompt: "Name three cities."}',
            7,
            "give contains, or repeat >= 2",
        ),
        ("argv: [python, -m, mate.regression, --seed", "argv: [sh, -c, mate.regression, --seed", 10, "is a shell"),
        ("argv: [python, -m, mate.regression]", "argv: [/bin/bash, x]", 15, "is a shell"),
        ("argv: [python, -m, mate.regression]", "argv: []", 15, "at least 1 item"),
        ('--seed, "0"]', "--seed, 0]", 10, "valid string"),
        ("refs/regression.json", "../regression.json", 11, "relative to the repository root"),
        ("refs/regression.json", "refs/regression.txt", 11, "not a .json file"),
        ("tolerance: {abs: 1.0e-4}", "tolerance: {abs: 0}", 12, "give abs, rel or both"),
        ("tolerance: {rel: 1.0e-6}", "tolerance: {rel: 2}", 16, "less than or equal to 1"),
        ("  - name: replay\n", "  - name: replay\n    port: api\n", 13, "drop port"),
        (
            "      tolerance: {rel: 1.0e-6}",
            "      tolerance: {rel: 1.0e-6}\n      level: 5",
            17,
            "greater than or equal",
        ),
    ],
)
def test_bad_values_name_file_line_and_fix(root, old, new, line, needle):
    assert old in BASE
    rendered = problems_of(root, BASE.replace(old, new, 1))
    assert needle in rendered
    assert rendered.startswith(f"{line}:"), rendered


def test_lint_checks_each_reference_file(root):
    loaded = load(root, BASE)
    assert check_repository_refs(loaded, root) == []
    (root / "refs" / "regression.json").write_text('{"gemm.sum": "1.5"}')
    [err] = check_repository_refs(loaded, root)
    assert "'gemm.sum' is '1.5', not a finite number" in err.message and err.line == 11 and "JSON object" in err.fix
    (root / "refs" / "regression.json").unlink()
    (root / "refs" / "regression.json").symlink_to(root.parent / "outside.json")
    (root.parent / "outside.json").write_text('{"a": 1}')
    [err] = check_repository_refs(loaded, root)
    assert "leads outside the repository" in err.message


def check_repository_refs(loaded, root: Path) -> list[UserError]:
    """Only the reference findings (the stack post2 is not in this temporary repository)."""
    return [e for e in check_repository(loaded, root) if "numeric.reference" in e.message]


# -- chat rows ------------------------------------------------------------------------------------------


def chat_ctx(recipe: Recipe, answers: list[str], calls: list[dict]) -> RowContext:
    def request(method, url, body=None, timeout=300):
        calls.append(body)
        return 200, json.dumps({"choices": [{"message": {"content": answers[len(calls) - 1]}}]})

    return RowContext(recipe, {"api": "127.0.0.1:8000"}, str, request)


def test_repeat_passes_when_every_answer_is_the_same(root):
    recipe = load(root, BASE).model
    calls: list[dict] = []
    result = run_row(recipe.smoke[0], chat_ctx(recipe, ["Beijing river"] * 3, calls))
    assert result.status == "passed", result.reason
    assert [(b["temperature"], b["seed"], b["max_tokens"]) for b in calls] == [(0.8, 7, 16)] * 3
    assert result.details["answers"] == ["Beijing river"] * 3


def test_repeat_fails_naming_the_first_two_answers_that_differ(root):
    recipe = load(root, BASE).model
    result = run_row(recipe.smoke[0], chat_ctx(recipe, ["a b", "a b", "a c"], []))
    assert result.status == "failed"
    assert result.reason == "answers 1 and 3 of 3 differ (seed 7, temperature 0.8): 'a b' vs 'a c'"
    assert result.details["answers"] == ["a b", "a b", "a c"]


def test_greedy_chat_sends_no_seed_and_an_empty_answer_fails(root):
    recipe = load(root, BASE.replace("temperature: 0.8, seed: 7, max_tokens: 16, repeat: 3", "contains: x")).model
    calls: list[dict] = []
    result = run_row(recipe.smoke[0], chat_ctx(recipe, [""], calls))
    assert "seed" not in calls[0] and calls[0]["temperature"] == 0
    assert result.status == "failed" and "answered no message content" in result.reason


def test_contains_is_checked_on_every_answer(root):
    text = BASE.replace("repeat: 3", "repeat: 3, contains: Beijing")
    recipe = load(root, text).model
    result = run_row(recipe.smoke[0], chat_ctx(recipe, ["Beijing", "Paris", "Beijing"], []))
    assert result.status == "failed" and result.reason == "answer 2 does not contain 'Beijing': 'Paris'"


# -- numbers --------------------------------------------------------------------------------------------


def test_parse_json_reads_the_last_line_only():
    assert parse_json('noise\n{"a": 1, "b": -2.5e-3}\n\n') == {"a": 1.0, "b": -0.0025}
    assert "not JSON" in str(parse_json('{"a": 1}\ndone'))
    assert "not a finite number" in str(parse_json('{"a": true}'))
    assert "printed nothing" in str(parse_json(""))


def test_compare_reports_deltas_missing_and_extra():
    result = compare({"a": 1.00005, "b": 2.5, "c": 0.0}, {"a": 1.0, "b": 2.0, "d": 4.0}, Tolerance(abs=1e-4))
    assert not result.ok and result.missing == ["d"] and result.extra == ["c"]
    assert [(r["name"], r["ok"]) for r in result.rows] == [("a", True), ("b", False)]
    assert result.reason("the output") == (
        "1 of 2 value(s) out of tolerance: b 2.5 vs 2 (delta 0.5); missing from the output: d; not in the reference: c"
    )
    assert Tolerance(rel=0.1).allows(105.0, 100.0) and not Tolerance(rel=0.01).allows(105.0, 100.0)


def numeric_ctx(recipe: Recipe, root: Path, output: str, code: int = 0, seen: list | None = None) -> RowContext:
    def run(argv, timeout=120):
        if seen is not None:
            seen.append((list(argv), timeout))
        return code, output

    return RowContext(recipe, {}, str, exec=run, root=root)


def test_numeric_row_passes_within_tolerance(root):
    recipe = load(root, BASE).model
    seen: list = []
    result = run_row(
        recipe.smoke[1], numeric_ctx(recipe, root, 'log\n{"gemm.sum": 1.50004, "lse.mean": -2}', seen=seen)
    )
    assert result.status == "passed", result.reason
    assert seen == [(["python", "-m", "mate.regression", "--seed", "0"], 300)]
    assert [round(v["delta"], 6) for v in result.details["values"]] == [0.00004, 0.0]


def test_numeric_row_fails_out_of_tolerance_naming_the_value(root):
    recipe = load(root, BASE).model
    result = run_row(recipe.smoke[1], numeric_ctx(recipe, root, '{"gemm.sum": 1.6, "lse.mean": -2}'))
    assert result.status == "failed"
    assert result.reason.startswith("1 of 2 value(s) out of tolerance: gemm.sum 1.6 vs 1.5 (delta 0.1")


def test_numeric_row_fails_on_a_missing_name_or_an_exit_code_and_is_not_run_with_no_repository(root):
    recipe = load(root, BASE).model
    missing = run_row(recipe.smoke[1], numeric_ctx(recipe, root, '{"gemm.sum": 1.5}'))
    assert missing.status == "failed" and missing.reason == "missing from the command's output: lse.mean"
    crashed = run_row(recipe.smoke[1], numeric_ctx(recipe, root, "No module named mate.regression", code=1))
    assert crashed.reason == "`python -m mate.regression --seed 0` exited 1: No module named mate.regression"
    nowhere = run_row(recipe.smoke[1], RowContext(recipe, {}, str, exec=lambda argv, timeout=0: (0, "")))
    assert nowhere.status == "not-run" and nowhere.reason.startswith("not checked: no checkout here")
    no_exec = run_row(recipe.smoke[1], RowContext(recipe, {}, str, root=root))
    assert no_exec.status == "failed" and "runs a command in the container" in no_exec.reason


LOGPROBS = BASE.replace(
    '      run: {argv: [python, -m, mate.regression, --seed, "0"]}\n',
    '      logprobs: {prompt: "Name a city.", max_tokens: 4, seed: 3}\n',
)


def logprob_ctx(recipe: Recipe, root: Path, tokens: list[tuple[str, float]], calls: list) -> RowContext:
    def request(method, url, body=None, timeout=300):
        calls.append((url, body))
        content = [{"token": t, "logprob": lp, "bytes": [], "top_logprobs": []} for t, lp in tokens]
        text = "".join(t for t, _ in tokens)
        return 200, json.dumps({"choices": [{"message": {"content": text}, "logprobs": {"content": content}}]})

    return RowContext(recipe, {"api": "127.0.0.1:8000"}, str, request, root=root)


def test_numeric_row_reads_a_greedy_requests_logprobs(root):
    assert "logprobs:" in LOGPROBS
    (root / "refs" / "regression.json").write_text(json.dumps({"0:Beijing": -0.25, "1: river": -1.5}))
    recipe = load(root, LOGPROBS).model
    calls: list = []
    ok = run_row(recipe.smoke[1], logprob_ctx(recipe, root, [("Beijing", -0.25002), (" river", -1.5)], calls))
    assert ok.status == "passed", ok.reason
    url, body = calls[0]
    assert url.endswith("/v1/chat/completions") and body["logprobs"] is True
    assert (body["temperature"], body["seed"], body["max_tokens"]) == (0, 3, 4)
    moved = run_row(recipe.smoke[1], logprob_ctx(recipe, root, [("Beijing", -0.5), (" river", -1.5)], []))
    assert moved.status == "failed" and moved.reason.startswith("1 of 2 value(s) out of tolerance: 0:Beijing -0.5")
    other = run_row(recipe.smoke[1], logprob_ctx(recipe, root, [("Beijing", -0.25), (" lake", -1.5)], []))
    assert other.reason == "missing from the answer's logprobs: 1: river; not in the reference: 1: lake"


def test_a_numeric_row_reads_exactly_one_source(root):
    both = LOGPROBS.replace("      logprobs:", "      run: {argv: [python]}\n      logprobs:")
    assert "exactly one of run (a command) or logprobs" in problems_of(root, both)
    neither = BASE.replace('      run: {argv: [python, -m, mate.regression, --seed, "0"]}\n', "")
    assert "exactly one of run (a command) or logprobs" in problems_of(root, neither)


# -- dump / replay against the stand-in MATE, run as processes -------------------------------------------


def local_exec(tmp_path: Path, fail: str = ""):
    """An argv run on this host with the stand-in mate package on PYTHONPATH (in place of the container)."""
    pkg = ms.mate_tree(tmp_path / "pkg")
    bin_dir = tmp_path / "bin"  # `python` in this "container" is the test's interpreter
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(PY)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(pkg), "STANDIN_MATE_FAIL": fail}
    env.pop("MATE_LOGLEVEL", None)

    def run(argv, timeout=120):
        proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False)
        return proc.returncode, proc.stdout if proc.returncode == 0 else (proc.stderr or proc.stdout)

    return run


def replay_row(tolerance: dict | None = None) -> DumpReplay:
    return DumpReplay.model_validate(
        {
            "run": {"argv": ["python", "-m", "mate.regression", "--seed", "3"]},
            "tolerance": tolerance or {"abs": 1e-5},
        }
    )


def test_dump_row_replays_each_dump_and_compares_it_with_the_run(tmp_path):
    where = str(tmp_path / "dumps")
    result = dump_row(replay_row(), "replay", local_exec(tmp_path), RowResult("replay", "dump"), where)
    assert result.status == "passed", result.reason
    assert [(d["function"], d["status"]) for d in result.details["dumps"]] == [
        ("gemm", "completed"),
        ("softmax_rows", "completed"),
    ]
    assert result.details["env"] == {"MATE_LOGLEVEL": "10", "MATE_DUMP_DIR": where}
    softmax = result.details["replays"][1]
    assert {v["name"] for v in softmax["values"]} >= {"softmax_rows#1[0].mean", "softmax_rows#1[1].max"}
    assert all(v["delta"] == 0 for r in result.details["replays"] for v in r["values"])


def test_a_replay_that_mate_finds_different_fails(tmp_path):
    run = local_exec(tmp_path, fail="replay-drift:0.01")
    result = dump_row(replay_row(), "replay", run, RowResult("replay", "dump"), str(tmp_path / "d"))
    assert result.status == "failed"
    assert "mate replay --dir" in result.reason and "outputs don't match" in result.reason


def test_a_replay_within_mates_tolerance_but_not_the_rows_fails_naming_the_statistic(tmp_path):
    run = local_exec(tmp_path, fail="replay-drift:0.0005")  # inside torch.allclose(1e-3), outside abs 1e-5
    result = dump_row(replay_row(), "replay", run, RowResult("replay", "dump"), str(tmp_path / "d"))
    assert result.status == "failed"
    assert "differs from the run" in result.reason and "gemm#1.mean" in result.reason
    loose = dump_row(replay_row({"abs": 1e-3}), "r", run, RowResult("r", "dump"), str(tmp_path / "e"))
    assert loose.status == "passed", loose.reason


def test_a_run_that_writes_no_dump_fails(tmp_path):
    result = dump_row(replay_row(), "r", local_exec(tmp_path, "no-dump"), RowResult("r", "dump"), str(tmp_path / "d"))
    assert result.status == "failed" and "wrote no Level-10 dump" in result.reason and "MATE_LOGLEVEL" in result.reason


def test_the_mate_log_parser_reads_the_real_shape(tmp_path):
    code, text = local_exec(tmp_path)(["python", "-m", "mate.regression"], timeout=60)  # MATE_LOGLEVEL unset: no log
    assert code == 0 and "no MATE output statistics" in str(parse_mate_log(text)) and parse_json(text)
    code, text = subprocess_with_level(tmp_path)
    stats = parse_mate_log(text)
    assert isinstance(stats, dict) and stats["gemm#1.nan_count"] == 0.0
    assert set(stats) >= {"gemm#1.min", "gemm#1.max", "gemm#1.mean", "softmax_rows#1[1].mean"}
    assert "no MATE output statistics" in str(parse_mate_log("Output value:\n  3\n"))


def subprocess_with_level(tmp_path: Path) -> tuple[int, str]:
    pkg = ms.mate_tree(tmp_path / "pkg5")
    env = {**os.environ, "PYTHONPATH": str(pkg), "MATE_LOGLEVEL": "5"}
    proc = subprocess.run([PY, "-m", "mate.regression"], env=env, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout


def mate_call(function: str, mean: float) -> str:
    """One @mate_api call as MATE logs it at level >= 5 (mate/api_logging.py)."""
    return (
        f"{'=' * 80}\n[2026-12-02 10:00:00] MATE API Call: {function}\n{'-' * 80}\nOutput value:\n  Tensor(\n"
        f"    shape=(2,)\n    min=0.000000\n    max=1.000000\n    mean={mean:.6f}\n    nan_count=0\n    inf_count=0\n"
        f"  )\n{'=' * 80}\n"
    )


def test_each_dump_is_compared_with_its_own_call_of_the_run():
    dumps = ["20261202_100000_001_pid7_gemm_call0001", "20261202_100000_002_pid7_gemm_call0002"]
    replayed = {dumps[0]: 0.25, dumps[1]: 0.75}
    status = {"value": "completed"}

    def run(argv, timeout=120):
        if argv[-2:] == ["--seed", "3"]:
            return 0, mate_call("gemm", 0.25) + mate_call("gemm", 0.75) + '{"x": 1}\n'
        if "list-dumps" in argv:
            lines = [f"  {d}: gemm [{status['value'] if d == dumps[1] else 'completed'}]" for d in dumps]
            return 0, f"Found 2 dumps in {argv[-1]}:\n" + "\n".join(lines) + "\n"
        dump = argv[-1].rsplit("/", 1)[1]
        return (
            0,
            f"Replaying single dump: {argv[-1]}\n{mate_call('gemm', replayed[dump])}✅ Replay passed - outputs match!\n",
        )

    ok = dump_row(replay_row(), "r", run, RowResult("r", "dump"), "/tmp/d")
    assert ok.status == "passed", ok.reason
    assert [v["name"] for r in ok.details["replays"] for v in r["values"] if v["name"].endswith("mean")] == [
        "gemm#1.mean",
        "gemm#2.mean",
    ]
    replayed[dumps[1]] = 0.25  # the second call's replay gives the first call's numbers
    swapped = dump_row(replay_row(), "r", run, RowResult("r", "dump"), "/tmp/d")
    assert swapped.status == "failed" and "gemm#2.mean 0.25 vs 0.75" in swapped.reason
    status["value"] = "inputs_saved"  # the process died inside the call: MATE saved only its inputs
    unfinished = dump_row(replay_row(), "r", run, RowResult("r", "dump"), "/tmp/d")
    assert unfinished.reason == f"dump(s) without outputs (the call did not complete): {dumps[1]}"
