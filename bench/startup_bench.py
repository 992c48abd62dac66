#!/usr/bin/env python3
"""Benchmark: how long `stackforge --help` and `stackforge list` take to start, against a 0.25 s budget.

Each run is a fresh ``python -m stackforge`` process from byte-compiled modules (bench/bytecode.py), timed
from the outside; the figure is the median of ``repeat`` runs. ``--help`` builds the whole parser and
imports no verb's library. ``list`` prints each stack's description or why it is invalid; it answers from
the rows the previous run stored while the stack files, the ``--set`` values and the validating code are
unchanged (stackforge.stack.listing), so its figure is that of a repeated ``list``. The first ``list``
after a change validates every stack, which imports the stack model (pydantic): that is the third figure,
each run with an empty cache, and the note says what importing the model alone costs and how much of that
is the libraries' own import, which only validating with other libraries could take away.

    python bench/startup_bench.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bytecode import compiled_env  # noqa: E402
from bench.results import Result, table  # noqa: E402

BUDGET_S = 0.25
#: what the stack model and loader import from outside the project: a first validation's floor
VALIDATING_LIBRARIES = (
    "import pydantic.main, pydantic.fields, pydantic.functional_validators, pydantic.plugin._loader, "
    "yaml, packaging.requirements"
)


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def _median(argv: list[str], env: dict[str, str], repeat: int, fresh_cache: Path | None = None) -> float:
    runs = []
    for i in range(repeat):
        run_env = env if fresh_cache is None else {**env, "STACKFORGE_CACHE": str(fresh_cache / str(i))}
        runs.append(_time(argv, run_env))
    return statistics.median(runs)


def _budget(measure: str, seconds: float, note: str = "", id: str | None = None) -> Result:
    return Result(measure=measure, ours_s=seconds, peer_s=BUDGET_S, goal=1.0, peer="budget", note=note, id=id)


def measure(repeat: int = 7) -> list[Result]:
    """``stackforge --help``, a repeated ``stackforge list`` and a first ``list``, each against the budget."""
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        env = compiled_env(Path(tmp))
        env["STACKFORGE_CACHE"] = str(Path(tmp) / "cache")
        root = ["-m", "stackforge", "--root", str(REPO)]
        _time([*root, "list"], env)  # stores the rows the repeated list answers from
        bare = _median(["-c", "pass"], env, repeat)
        model = _median(["-c", "import stackforge.stack.load"], env, repeat)
        libraries = _median(["-c", VALIDATING_LIBRARIES], env, repeat)
        return [
            _budget("stackforge --help", _median([*root, "--help"], env, repeat)),
            _budget("stackforge list", _median([*root, "list"], env, repeat), "rows stored by the previous list"),
            _budget(
                "stackforge list, first after a change",
                _median([*root, "list"], env, repeat, fresh_cache=Path(tmp) / "fresh"),
                f"validates every stack: importing the stack model alone takes {model:.2f} s, of which the "
                f"libraries it validates with (pydantic, pyyaml, packaging) take {libraries:.2f} s: the floor "
                f"of any first validation on this machine (the interpreter {bare:.2f} s)",
                id="list-first",
            ),
        ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs of each command; the median is reported")
    args = ap.parse_args()
    results = measure(args.repeat)
    print(table(results))
    for r in results:
        if r.note:
            print(f"{r.measure}: {r.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
