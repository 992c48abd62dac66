#!/usr/bin/env python3
"""Benchmark: how long `stackforge --help` and `stackforge list` take to start.

Each run is a fresh ``python -m stackforge`` process from byte-compiled modules (bench/bytecode.py), timed
from the outside; the figure is the median of ``repeat`` runs. ``--help`` builds the whole parser and
imports no verb's library; ``list`` prints each stack's description or why it is invalid. Both are held to a
0.25 s budget. ``list`` answers from the rows the previous run stored while the stack files, the ``--set``
values and the validating code are unchanged (stackforge.stack.listing), so its figure is that of a repeated
``list``. The first ``list`` after a change validates every stack, which imports the stack model and the
libraries it validates with (pydantic, PyYAML, packaging): that figure (id ``list-first``) is held to importing
those libraries alone, the floor of any first validation with them. Which modules they are is read from a first
``list`` in the same run (every module it loads from outside the standard library and stackforge), and the two
are timed in alternation, each run of ``list`` with an empty cache but for what is a function of the code alone,
as bytecode is: the stack model's core schema (``schema/``, stack/schemacache.py), written by the run before. A
first ``list`` with no kept schema (the first run after installing or changing stackforge) is timed in the same
alternation, for the note.

    python bench/startup_bench.py [--repeat 31]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bytecode import compiled_env  # noqa: E402
from bench.results import GOALS, Result, table  # noqa: E402

BUDGET_S = 0.25
#: run in a process: a first ``list`` (argv after ``--``), then print every module it loaded from outside the
#: standard library and stackforge, one per line, in the order they were loaded
LOADED_LIBRARIES = """
import io, os, sys, sysconfig
from contextlib import redirect_stdout
from stackforge.cli.main import main
with redirect_stdout(io.StringIO()):
    main(sys.argv[1:])
stdlib = {os.path.realpath(sysconfig.get_path(k)) for k in ("stdlib", "platstdlib")}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    top = name.split(".")[0]
    if not path or top == "stackforge" or top.startswith("_") or name == "sitecustomize":
        continue
    path = os.path.realpath(path)
    if "site-packages" in path.split(os.sep) or not any(path.startswith(d + os.sep) for d in stdlib):
        print(name)
"""


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def _median(argv: list[str], env: dict[str, str], repeat: int) -> float:
    return statistics.median(_time(argv, env) for _ in range(repeat))


def _budget(measure: str, seconds: float, note: str = "", id: str | None = None) -> Result:
    return Result(measure=measure, ours_s=seconds, peer_s=BUDGET_S, goal=1.0, peer="budget", note=note, id=id)


def loaded_libraries(env: dict[str, str], cache: Path) -> list[str]:
    """The modules a first ``stackforge list`` (``cache`` empty) loads from outside the standard library and
    stackforge: pydantic and its parts, PyYAML, packaging."""
    argv = ["-c", LOADED_LIBRARIES, "--root", str(REPO), "list"]
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=REPO, env={**env, "STACKFORGE_CACHE": str(cache)}
    )
    if proc.returncode != 0:
        raise SystemExit(f"listing the libraries a first list loads failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout.split()


def alternating(
    a: list[str], others: list[list[str]], env: dict[str, str], repeat: int, fresh: Path, kept: Path
) -> tuple[float, list[float], float]:
    """Medians of ``repeat`` runs of ``a`` (each with an empty cache under ``fresh`` holding only a copy of
    ``kept`` as its ``schema/``), of each of ``others``, and of ``a`` with an empty cache, taken in alternation so
    that all of them see the same hours of a shared machine."""
    runs: tuple[list[float], list[list[float]], list[float]] = ([], [[] for _ in others], [])
    for i in range(repeat):
        cache = fresh / "kept" / str(i)
        shutil.copytree(kept, cache / "schema")
        runs[0].append(_time(a, {**env, "STACKFORGE_CACHE": str(cache)}))
        for argv, times in zip(others, runs[1]):
            times.append(_time(argv, env))
        runs[2].append(_time(a, {**env, "STACKFORGE_CACHE": str(fresh / "empty" / str(i))}))
    return statistics.median(runs[0]), [statistics.median(t) for t in runs[1]], statistics.median(runs[2])


#: runs of each command: the medians of 7 alternating runs put the ``list-first`` ratio anywhere between 1.05 and 1.45
#: on this 2-core machine (two runs a minute apart, idle); of 31, within 0.04 (three runs: 1.29, 1.29, 1.33)
REPEAT = 31


def measure(repeat: int = REPEAT) -> list[Result]:
    """``stackforge --help`` and a repeated ``stackforge list`` against the budget; a first ``list`` against
    importing the libraries it loads, alone."""
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        env = compiled_env(Path(tmp))
        env["STACKFORGE_CACHE"] = str(Path(tmp) / "cache")
        root = ["-m", "stackforge", "--root", str(REPO)]
        _time([*root, "list"], env)  # stores the rows the repeated list answers from, and the model's schema
        bare = _median(["-c", "pass"], env, repeat)
        model = _median(["-c", "import stackforge.stack.load"], env, repeat)
        libraries = loaded_libraries(env, Path(tmp) / "probe")
        tops = sorted({name.split(".")[0] for name in libraries})
        kept = Path(env["STACKFORGE_CACHE"]) / "schema"
        if not any(kept.glob("*.schema")):
            raise SystemExit(f"the first list kept no schema under {kept}")
        imports = "import " + ", ".join(libraries)
        first, (floor, paused), cold = alternating(
            [*root, "list"], [["-c", imports], ["-c", "import gc; gc.disable(); " + imports]], env, repeat,
            Path(tmp) / "fresh", kept,
        )  # fmt: skip
        return [
            _budget("stackforge --help", _median([*root, "--help"], env, repeat)),
            _budget("stackforge list", _median([*root, "list"], env, repeat), "rows stored by the previous list"),
            Result(
                "stackforge list, first after a change",
                first,
                floor,
                GOALS["list-first"],
                "importing the libraries it loads, alone",
                f"validates every stack ({first / BUDGET_S:.2f} of the {BUDGET_S} s budget); the peer imports the "
                f"{len(libraries)} modules a first list loads from outside the standard library and stackforge "
                f"({', '.join(tops)}), the floor of any first validation with them; importing the stack model "
                f"alone takes {model:.2f} s (the interpreter {bare:.2f} s); stackforge starts with the garbage "
                f"collector paused (__main__.py): the same imports with it paused take {paused:.2f} s "
                f"({first / paused:.2f} of those); medians of {repeat} alternating runs, "
                f"each with the model's schema kept by the run before (with none kept: {cold:.2f} s, "
                f"{cold / floor:.2f} of the peer)",
                id="list-first",
            ),
        ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=REPEAT, help="runs of each command; the median is reported")
    args = ap.parse_args()
    results = measure(args.repeat)
    print(table(results))
    for r in results:
        if r.note:
            print(f"{r.measure}: {r.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
