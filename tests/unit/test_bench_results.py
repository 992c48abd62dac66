"""bench/results.py: every tracked figure (GOALS) reaches results.json and the table with its id and goal.

No benchmark runs here: the rows are made by hand, as the bench modules make them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import run_all
from bench.results import GOALS, Result, id_problems, missing_ids, table, write

REPO = Path(__file__).resolve().parents[2]
TRACKED = (
    "publish",
    "republish",
    "cold-default",
    "noop",
    "one-patch",
    "list-first",
    "pull",
    "second-host",
    "publish-platforms",
    "build-emulated",
)


def tracked_rows() -> list[Result]:
    return [Result(f"measure {i}", 1.0, 10.0, GOALS[i], "peer", id=i) for i in TRACKED]


def test_the_tracked_ids_have_their_goals():
    assert tuple(GOALS) == TRACKED
    assert GOALS == {
        "publish": 0.3,
        "republish": 0.1,
        "cold-default": 1.15,
        "noop": 1.0,
        "one-patch": 0.5,
        "list-first": 1.25,
        "pull": 1.05,
        "second-host": 0.25,
        "publish-platforms": 0.5,
        "build-emulated": 1.15,
    }


def test_results_json_rows_carry_id_and_goal(tmp_path):
    rows = [*tracked_rows(), Result("reported only", 2.0, 1.0, None, "peer")]
    path = write(rows, tmp_path / "results.json")
    doc = json.loads(path.read_text())
    by_id = {row["id"]: row for row in doc}
    assert set(by_id) == {*TRACKED, None}
    for i in TRACKED:
        assert by_id[i]["goal"] == GOALS[i] and by_id[i]["met"] is True and by_id[i]["ratio"] == 0.1
    assert by_id[None]["goal"] is None and by_id[None]["measure"] == "reported only"
    assert id_problems(rows) == [] and missing_ids(rows) == []


def test_the_table_names_each_row_by_its_id():
    rows = [*tracked_rows(), Result("reported only", 2.0, 1.0, None, "peer")]
    lines = table(rows).splitlines()
    assert lines[0].startswith("| id | measure |")
    for i, line in zip(TRACKED, lines[2:]):
        assert line.startswith(f"| {i} | measure {i} |") and f"≤ {GOALS[i]:g} | yes |" in line
    assert lines[-1].startswith("|  | reported only |") and lines[-1].endswith("report | — |")


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (Result("m", 1, 1, None, "p", id="noop"), "row 'noop' (m) carries no goal; set goal=GOALS['noop'] (≤ 1)"),
        (Result("m", 1, 1, 0.5, "p", id="publish"), "row 'publish' (m) has goal ≤ 0.5, looser than its ≤ 0.3 (GOALS)"),
    ],
)
def test_a_tracked_row_without_its_goal_is_a_problem(row, problem):
    rows = [r for r in tracked_rows() if r.id != row.id] + [row]
    assert id_problems(rows) == [problem]


def test_an_id_on_two_rows_and_a_missing_id_are_named():
    rows = tracked_rows()
    twice = [*rows, Result("again", 1, 1, GOALS["noop"], "p", id="noop")]
    assert id_problems(twice) == ["id 'noop' is on more than one row (the second: 'again')"]
    assert missing_ids([r for r in rows if r.id not in ("second-host", "noop")]) == ["noop", "second-host"]
    assert id_problems([Result("x", 1, 1, None, "p", id="untracked")]) == []  # an untracked id needs no goal


def test_run_all_runs_a_bench_module_added_later(tmp_path):
    for name in ("build_bench", "publish_bench", "later_bench", "results", "repro_check"):
        (tmp_path / f"{name}.py").write_text("")
    assert run_all.modules(tmp_path) == [*run_all.MODULES, "later_bench"]
    assert run_all.modules(REPO / "bench")[: len(run_all.MODULES)] == list(run_all.MODULES)


def test_a_failing_bench_module_is_named_and_the_others_figures_are_still_written(monkeypatch, capsys):
    """One module's failure (an exception or a SystemExit, as a benchmark's failed command raises) does not lose the
    figures the other modules measured: they are printed and written, the failed module named, and the exit is 1."""
    from types import SimpleNamespace

    def broken() -> list[Result]:
        raise SystemExit("nightly exited 1")

    row = Result("measure b", 1.0, 10.0, 0.5, "peer")
    found = {"bench.a_bench": SimpleNamespace(measure=broken), "bench.b_bench": SimpleNamespace(measure=lambda: [row])}
    written: list[list[Result]] = []

    def write(results: list[Result]) -> Path:
        written.append(results)
        return Path("results.json")

    monkeypatch.setattr(run_all, "modules", lambda: ["a_bench", "b_bench"])
    monkeypatch.setattr(run_all.importlib, "import_module", found.__getitem__)
    monkeypatch.setattr(run_all, "write", write)
    assert run_all.main() == 1
    out, err = capsys.readouterr()
    assert written == [[row]] and "| measure b |" in out
    assert "failed (no figures): bench/a_bench.py" in out
    assert "error: bench/a_bench.py failed: SystemExit: nightly exited 1" in err
    found["bench.a_bench"] = SimpleNamespace(measure=lambda: [])
    assert run_all.main() == 0  # every module ran and the figure met its goal


def test_the_sharded_night_is_the_build_benchmarks_stack_on_its_own_platform_with_a_second_target():
    """The shard benchmark's stack is benchpost's keys without its arm64 line (the platform benchmark's), plus a
    cli target: a night of it builds the stack's own line only."""
    import yaml

    from bench import shards_bench

    doc = yaml.safe_load(shards_bench.stack_file())
    source = yaml.safe_load((REPO / "bench" / "stacks" / "benchpost.yaml").read_text(encoding="utf-8"))
    assert "arm64" in source["platforms"] and "platforms" not in doc and "inherits" not in doc
    assert (doc["name"], doc["nightly"]) == ("benchshards", True)
    assert set(doc["targets"]) == {*source["targets"], "cli"} and doc["packages"] == source["packages"]


def test_docs_list_the_tracked_ids_with_their_goals():
    text = (REPO / "docs" / "benchmarks.md").read_text()
    section = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \|.*\| ≤ ([0-9.]+) \|[^|]*\|$", section, re.M)
    assert {i: float(g) for i, g in rows} == GOALS
