"""`make bench`: every benchmark module, one table, build/bench/results.json.

Runs ``measure()`` of each module below, prints bench/results.table and writes build/bench/results.json
through bench/results.write. MODULES run first, in their order; any other ``bench/*_bench.py`` (a benchmark
added since, e.g. the second-host rebuild) runs after them, so a new module needs no edit here. Exit 1 when
a figure misses its goal, a tracked figure (bench/results.GOALS) lacks its goal or a module fails (it is named,
and the other modules' figures are still printed and written); a tracked id no module measured is named, not
failed (its module may not exist yet).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.results import Result, id_problems, missing_ids, table, write  # noqa: E402

MODULES = ("build_bench", "newest_bench", "startup_bench", "publish_bench", "second_host_bench")


def modules(bench: Path = REPO / "bench") -> list[str]:
    """MODULES, then every other ``*_bench.py`` of ``bench`` by name."""
    found = sorted(p.stem for p in bench.glob("*_bench.py"))
    return [*MODULES, *(name for name in found if name not in MODULES)]


def main() -> int:
    results: list[Result] = []
    failed: list[str] = []
    for name in modules():
        print(f"--- bench/{name}.py", file=sys.stderr, flush=True)
        try:
            results += importlib.import_module(f"bench.{name}").measure()
        except (Exception, SystemExit) as exc:  # the other modules' figures are still reported and written
            failed.append(name)
            print(f"error: bench/{name}.py failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    print(table(results))
    print(
        "\nWall-clock seconds on this machine (shared cores make them noisy); each ratio is ours / peer "
        "measured back to back in one run."
    )
    problems = id_problems(results)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    missing = missing_ids(results)
    if missing:
        print(f"not measured (no module gives the row): {', '.join(missing)}")
    print(f"written: {write(results)}")
    if failed:
        print(f"failed (no figures): {', '.join(f'bench/{n}.py' for n in failed)}")
    return 0 if all(r.met for r in results) and not problems and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
