"""Benchmark: a night split into two shards on two engines plus the merge, against the same night in one process.

The night is the build benchmark's stack on its own platform with a second target (``benchshards``:
bench/stacks/benchpost.yaml without its arm64 line, ~420 MB of wheels in three dependency phases and zstandard compiled in a kernel step, plus a ``cli`` target on the
same stages), its two indexes served on loopback as the build benchmark serves them (every RUN step on the host's
network, ``--network host``: both engines reach them under the same URL, so a RUN line and its cache key are the
same on both), a docker-registry on loopback. With ``--network`` the nightly builds without its shared bake (a bake
file does not carry the RUN steps' network on this buildx): both nights alike.

  one process  ``stackforge nightly`` on the shared engine: one bake of both targets, each built, gated and
               published
  sharded      ``nightly --plan --shards 2`` splits the targets; shard 1 on the shared engine, then shard 2 on a
               second engine of this host (scripts/second-engine.sh, ``--builder``: empty, as a new build host is,
               its base image loaded untimed), which imports shard 1's published image as its registry cache; then
               ``nightly --merge``

Each night is cold: its indexes on ports of their own and a ccache nonce of its own, so no step of one night's
cache keys matches the other's. The figures:

``shards-work``  the BuildKit work of the sharded night (both shards' bakes and builds: the seconds the engines
                 solved) over the one-process night's; goal ≤ 1.1: the shared registry cache carries the stages both
                 targets need, so the second shard re-runs no dependency phase or kernel (the note says which steps
                 it ran, and the hosts' whole times, publishing included)
``shards-merge`` the merge over the sharded night as a CI runs it (the plan, the longer shard, the merge: shards in
                 parallel); goal ≤ 0.05

Needs the engine, the base image and root (the second engine). The build records both nights made on the shared
engine are pruned afterwards (tests/fixtures/buildcache.forget: the records naming this run's index URLs), the
images removed, the second engine purged. Run alone: python bench/shards_bench.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.build_bench import CACHE, STACK, serving  # noqa: E402
from bench.results import Result, table, write  # noqa: E402
from tests.fixtures import buildcache  # noqa: E402
from tests.fixtures import second_engine as se  # noqa: E402
from tests.fixtures.registry import start_registry  # noqa: E402

NIGHT = "benchshards"
DATE = "20260102"
BASE = "stackforge/base:bookworm"
WORK_GOAL = 1.1
MERGE_GOAL = 0.05
#: the steps the shared cache must carry to the second shard: the dependency phases and the kernel
HEAVY = ("deps:", "kernel-")


def stack_file() -> str:
    """``benchshards``: the build benchmark's stack (its file's keys, not ``inherits``: a child cannot drop a line)
    without its arm64 line, which is the platform benchmark's (an emulated build takes the better part of an hour
    and its wheels are served by that benchmark only), plus a ``cli`` target on the same stages."""
    doc = yaml.safe_load((BENCH / "stacks" / f"{STACK}.yaml").read_text(encoding="utf-8"))
    doc.pop("platforms", None)
    doc.update(name=NIGHT, nightly=True)
    doc["targets"] = {**doc.get("targets", {}), "cli": {"entrypoint": ["python", "-m", "zstandard"]}}
    return yaml.safe_dump(doc, sort_keys=False)


class Night:
    """One night's runs: each stackforge command of it, its seconds and output."""

    def __init__(self, root: Path, registry: str, urls: dict[str, str], name: str):
        self.root, self.registry, self.urls, self.name = root, f"{registry}/{name}", urls, name
        self.local = f"stackforge-bench/shards-{uuid.uuid4().hex[:8]}:{name}"
        sets = [f"indexes.{n}.url={u}" for n, u in urls.items()]
        sets += [f"tuning.CCACHE_COMPILERCHECK=string:shards-{uuid.uuid4().hex[:12]}", f"tags.local={self.local}"]
        self.sets = [a for s in sets for a in ("--set", s)]
        self.seconds: dict[str, float] = {}

    def run(self, step: str, *args: str, cache: Path = CACHE, env: dict[str, str] | None = None) -> str:
        run_env = dict(os.environ, STACKFORGE_CACHE=str(cache), PYTHONPATH=str(REPO / "tools"), **(env or {}))
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "stackforge", "--root", str(self.root), *args, *self.sets],
                              capture_output=True, text=True, env=run_env)  # fmt: skip
        self.seconds[step] = time.monotonic() - t0
        if proc.returncode != 0:
            sys.exit(f"failed: stackforge {' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        return proc.stdout


def engine_seconds(summary_dir: Path) -> float:
    """The seconds BuildKit solved for a night: each bake (a sharded night's, per shard) and each row's build (its
    evidence's result.json)."""
    summary = json.loads((summary_dir / "summary.json").read_text())
    bake = summary.get("bake") or {}
    bakes = [b for b in (bake.get("shards") or {}).values()] if "shards" in bake else [bake]
    total = sum(float(b.get("duration_s") or 0) for b in bakes if isinstance(b, dict))
    for row in summary["rows"]:
        result = summary_dir / (row.get("evidence") or "-") / "result.json"
        if result.is_file():
            total += float(json.loads(result.read_text()).get("duration_s") or 0)
    return total


def second_log(night: Path, target: str) -> str:
    """The build log of the night's row of ``target`` (its evidence, as the merge unpacked it)."""
    summary = json.loads((night / "summary.json").read_text())
    (row,) = [r for r in summary["rows"] if r["target"] == target]
    log = night / (row.get("evidence") or "-") / "build.log"
    return log.read_text() if log.is_file() else ""


def _repo(tmp: Path) -> Path:
    root = tmp / "repo"
    shutil.copytree(BENCH / "stacks", root / "stacks")
    shutil.copytree(BENCH / "patches", root / "patches")
    (root / "stacks" / f"{NIGHT}.yaml").write_text(stack_file())
    return root


def measure(echo=print) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="stackforge-shards-bench-") as tmp_name:
        tmp = Path(tmp_name)
        registry, stop_registry = start_registry(tmp / "registry")
        engine = se.start(tmp / "docker")
        urls_seen: list[str] = []
        locals_made: list[str] = []
        try:
            t0 = time.monotonic()
            engine.load(BASE)
            echo(f"shards bench: second engine {engine.builder} up, base image loaded in {time.monotonic() - t0:.1f} s")
            # RUN steps on the host's network: both engines reach the loopback indexes under the same URL, so the
            # RUN lines, and their cache keys, are the same on both hosts
            common = ["--no-freshness", "--no-drift", "--ca-bundle", "none", "--network", "host"]
            # the same night in one process, on the shared engine
            with serving() as urls:
                urls_seen += urls.values()
                echo(f"shards bench: one process, indexes {', '.join(urls.values())}")
                one = Night(_repo(tmp / "one"), registry, urls, "one")
                locals_made.append(one.local)
                out = tmp / "one-night"
                one.run("night", "nightly", NIGHT, "--registry", one.registry, "--date", DATE, "--out", str(out), *common)  # fmt: skip
                one_engine = engine_seconds(out)
                echo(f"shards bench: one process: {one.seconds['night']:.1f} s, BuildKit {one_engine:.1f} s")
            # the night in two shards on two engines, then the merge
            with serving() as urls:
                urls_seen += urls.values()
                echo(f"shards bench: sharded, indexes {', '.join(urls.values())}")
                first = Night(_repo(tmp / "first"), registry, urls, "sharded")
                second = Night(_repo(tmp / "second"), registry, urls, "sharded")
                second.sets = first.sets  # one night: the same inputs on both hosts
                locals_made.append(first.local)
                text = first.run("plan", "nightly", "--plan", "--json", "--shards", "2", NIGHT, "--registry",
                                 first.registry, "--date", DATE)  # fmt: skip
                plan = json.loads(text)
                shard_of = {s["units"][0]["target"]: s["id"] for s in plan["shards"]}
                first.run("shard", "nightly", "--shard", shard_of["zstd"], "--registry", first.registry, "--date", DATE,
                          "--out", str(tmp / "shard-1"), *common)  # fmt: skip
                second.run("shard", "nightly", "--shard", shard_of["cli"], "--registry", first.registry, "--date", DATE,
                           "--out", str(tmp / "shard-2"), "--builder", engine.builder, *common,
                           cache=tmp / "second-host-cache", env={"DOCKER_CONFIG": str(engine.docker_config)})  # fmt: skip
                merged = tmp / "sharded-night"
                first.run("merge", "nightly", "--merge", "--registry", first.registry, "--date", DATE, "--out", str(merged))  # fmt: skip
                sharded_engine = engine_seconds(merged)
                ran = buildcache.ran(second_log(merged, "cli"))
                heavy = [s for s in ran if s.startswith(HEAVY)]
                verdict = json.loads((merged / "summary.json").read_text())["verdict"]
        finally:
            stopped = engine.stop()
            stop_registry()
            for ref in locals_made:  # first: a record an image still uses cannot be pruned
                subprocess.run(["docker", "image", "rm", ref, f"{ref}-cli"], capture_output=True)
            left = buildcache.forget(f"--index-url {url}/" for url in urls_seen)
            echo(f"shards bench: second engine stopped ({stopped.returncode}); this run's build records pruned"
                 + (f" ({len(left)} could not be)" if left else ""))  # fmt: skip
        hosts = first.seconds["shard"] + second.seconds["shard"]
        night_ci = first.seconds["plan"] + max(first.seconds["shard"], second.seconds["shard"]) + first.seconds["merge"]
        note = (
            f"one process {one.seconds['night']:.1f} s; shards {first.seconds['shard']:.1f} s + "
            f"{second.seconds['shard']:.1f} s on their hosts ({hosts / one.seconds['night']:.2f} of one process, "
            f"publishing included); the second shard re-ran {len(heavy)} dependency/kernel steps"
            + (f" ({'; '.join(s[:80] for s in heavy)})" if heavy else "")
            + f", {len(ran)} steps in all; merged verdict {verdict}"
        )
        echo(f"shards bench: {note}")
        return [
            Result(
                "sharded night: BuildKit work of two shards on two engines",
                sharded_engine,
                one_engine,
                WORK_GOAL,
                "the same night in one process",
                note,
                id="shards-work",
            ),
            Result(
                "sharded night: the merge",
                first.seconds["merge"],
                night_ci,
                MERGE_GOAL,
                "the sharded night (plan, the longer shard, merge)",
                f"merge {first.seconds['merge']:.1f} s",
                id="shards-merge",
            ),
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true", help="also write build/bench/results.json")
    args = parser.parse_args()
    results = measure(echo=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(results))
    if args.json:
        print(f"written: {write(results)}")
    return 0 if all(r.met for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
