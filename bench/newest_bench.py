#!/usr/bin/env python3
"""Benchmark: `stackforge newest post2` versus `pip index versions NAME` once per package.

Both run, in one invocation of this script, against the same two local indexes (vendor + public,
tests/fixtures/index_server.py over real HTTP on 127.0.0.1) serving the stand-in wheels of the MUSA
trains (tests/fixtures/musa_index.py: the post1 and post2 train, the aarch64 mp22 line, deep_ep,
torchada, every other pin of post2). That is the peer a person would use today: one `pip index versions`
per pinned package, one after another, each pointed at the package's own index and at the stack's
target (cp310, linux_x86_64), with no HTTP cache for either side.

Each side is a fresh process per run (stackforge: one process for the whole stack; pip: one per
package), both from byte-compiled modules (bench/bytecode.py). Both must succeed: stackforge must exit 0
(post2 is the newest) and every pip call must find the package. ``--delay`` adds a per-request latency at
the server to model a remote index. ``measure()`` gives the figure for ``make bench``: 50 ms per request,
stackforge at most 0.05 x pip's time (20 x faster).

    python bench/newest_bench.py [--repeat 3] [--delay 0.0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
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
from stackforge.stack.load import load_stack  # noqa: E402
from tests.fixtures.musa_index import build_wheels, index_dirs, serve  # noqa: E402

GOAL = 0.05  # stackforge takes at most this fraction of pip's time: 20 x faster

PIP_TARGET = [
    "--python-version",
    "3.10",
    "--platform",
    "linux_x86_64",
    "--implementation",
    "cp",
    "--abi",
    "cp310",
    "--only-binary",
    ":all:",
]


def time_stackforge(overrides: list[str], env: dict[str, str] | None = None) -> float:
    argv = [sys.executable, "-m", "stackforge", "--root", str(REPO), "newest", "post2", "--no-cache"]
    for o in overrides:
        argv += ["--set", o]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"stackforge newest post2 exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def time_pip(packages: list[tuple[str, str]]) -> float:
    t0 = time.perf_counter()
    for name, url in packages:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "--isolated",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "index",
            "versions",
            name,
            "--index-url",
            url,
            *PIP_TARGET,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0 or name.lower().replace("_", "-") not in proc.stdout.lower().replace("_", "-"):
            raise SystemExit(f"pip index versions {name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - t0


def run(repeat: int, delay: float) -> dict:
    """Both sides ``repeat`` times, back to back, against the same two indexes with ``delay`` per request."""
    with tempfile.TemporaryDirectory(prefix="newest-bench-") as tmp:
        env = compiled_env(Path(tmp))
        built = build_wheels(Path(tmp) / "wheels")
        dirs = index_dirs(built, Path(tmp) / "index")
        with serve(*dirs, delay=delay) as (overrides, vendor, public):
            stack = load_stack("post2", root=REPO, overrides=overrides)
            urls = {"mthreads": vendor.url, "pypi": public.url}
            packages = [(name, urls[pkg.index]) for name, pkg in stack.packages.items()]
            ours, pips = [], []
            for _ in range(repeat):
                ours.append(time_stackforge(overrides, env))
                pips.append(time_pip(packages))
            requests_seen = len(vendor.requests) + len(public.requests)
    return {
        "packages": len(packages),
        "repeat": repeat,
        "delay_s": delay,
        "stackforge_newest_s": round(statistics.median(ours), 3),
        "pip_index_versions_s": round(statistics.median(pips), 3),
        "ratio": round(statistics.median(pips) / statistics.median(ours), 1),
        "runs": {"stackforge": [round(x, 3) for x in ours], "pip": [round(x, 3) for x in pips]},
        "index_requests": requests_seen,
        "cpus": os.cpu_count(),
    }


def measure(delay: float = 0.05, repeat: int = 3) -> list[Result]:
    """``stackforge newest post2`` against ``pip index versions`` once per pin, ``delay`` s per request."""
    r = run(repeat, delay)
    return [
        Result(
            measure=f"newest post2, {delay * 1000:g} ms per request",
            ours_s=r["stackforge_newest_s"],
            peer_s=r["pip_index_versions_s"],
            goal=GOAL,
            peer=f"pip index versions × {r['packages']}",
            note=f"median of {repeat}; {r['index_requests']} index requests in all",
        )
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side; the median is reported")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds of latency the index adds to each request")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--table", action="store_true", help="print the figure of measure(--delay) as make bench does")
    args = ap.parse_args()
    if args.table:
        print(table(measure(args.delay, args.repeat)))
        return 0
    result = run(args.repeat, args.delay)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['packages']} packages of post2, local indexes, request delay {args.delay} s, "
            f"median of {args.repeat} runs"
        )
        print(f"stackforge newest post2 (one process, concurrent):   {result['stackforge_newest_s']:.3f} s")
        print(
            f"pip index versions NAME x {result['packages']} (sequential):      {result['pip_index_versions_s']:.3f} s"
        )
        print(f"ratio (pip / stackforge):                             {result['ratio']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
