"""`make bench`: every benchmark module, one table, build/bench/results.json.

Runs ``measure()`` of each module below, prints bench/results.table and writes build/bench/results.json
through bench/results.write. Exit 1 when a figure misses its goal.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.results import Result, table, write  # noqa: E402

MODULES = ("build_bench", "newest_bench", "startup_bench", "publish_bench", "second_host_bench")


def main() -> int:
    results: list[Result] = []
    for name in MODULES:
        module = importlib.import_module(f"bench.{name}")
        print(f"--- bench/{name}.py", file=sys.stderr, flush=True)
        results += module.measure()
    print(table(results))
    print(
        "\nWall-clock seconds on this machine (shared cores make them noisy); each ratio is ours / peer "
        "measured back to back in one run."
    )
    print(f"written: {write(results)}")
    return 0 if all(r.met for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
