"""Benchmark: a second host rebuilds from the registry what the first host built and published.

The stack is the build benchmark's (bench/stacks/benchpost.yaml, ``--root bench``, its two indexes served on
loopback as bench/build_bench.py serves them): ~420 MB of wheels in three dependency phases and zstandard
compiled in a kernel step. A docker-registry runs on loopback.

  first host   a cold build (``--no-cache``, its own empty ccache) with ``--cache-to inline``, then
               ``stackforge publish`` to the registry twice, gzip layers (the default) and zstd layers (the
               publisher's layer-store path: the image config, with its inline cache, goes as it is)
  second host  for each publish: the built image removed and this build's records pruned from BuildKit's
               cache, then ``stackforge build --registry-cache REF`` naming the published image

The figures (ids ``second-host`` for gzip, ``second-host-zstd``) are the second host's build over the first
host's cold build; goal ≤ 0.25. The second build must re-run no dependency or kernel step (read from BuildKit's
plain progress; the note lists any step that ran) and give the published image's layers; the note also says
where its time went (BuildKit's run and its layer pulls, stackforge's own work).

Pruning: by default only this run's records go (``tests/fixtures/buildcache.forget``: every record whose step
names this run's index URLs — each index is on its own port — and every record built on them), so other builds
on a shared engine keep their cache; ``--prune all`` empties the whole build cache (``docker builder prune -af``)
as a fresh host has it, for a machine that runs nothing else. Needs the engine and the base image.
Run alone: python bench/second_host_bench.py [--json] [--prune all]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.build_bench import CACHE, STACK, serving  # noqa: E402
from bench.results import Result, gzip_inflater, table, write  # noqa: E402
from tests.fixtures import buildcache  # noqa: E402
from tests.fixtures.registry import start_registry  # noqa: E402

ID = "second-host"
GOAL = 0.25
PEER = "cold build (first host)"
DATE = "20260101"
#: the steps that must come from the registry cache: the dependency phases and the kernel
HEAVY = ("deps:", "kernel-")


def _stackforge(root: Path, *args: str) -> tuple[float, str]:
    env = dict(os.environ, STACKFORGE_CACHE=str(CACHE), PYTHONPATH=str(REPO / "tools"))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args], capture_output=True, text=True, env=env
    )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: stackforge {' '.join(args)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return took, proc.stdout + proc.stderr


def _image(ref: str) -> dict | None:
    proc = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def _prune(how: str, urls: dict[str, str]) -> str:
    """Forget this run's build records (or, with ``all``, every record); say what was done."""
    if how == "all":
        subprocess.run(["docker", "builder", "prune", "--all", "--force"], capture_output=True, check=True)
        return "the whole build cache pruned"
    left = buildcache.forget(f"--index-url {url}/ " for url in urls.values())
    if left:
        sys.exit("could not prune this run's build records: " + "; ".join(r.description[:100] for r in left))
    return "this run's build records pruned"


#: a layer BuildKit pulled for the image, and stackforge's own note of the engine run
PULLED = re.compile(r"^#\d+ pulling sha256:[0-9a-f]+ ([\d.]+)s done$")
ENGINE_DONE = re.compile(r"build \S+ with BuildKit \(log: .*\): done in ([\d.]+) s")


def breakdown(log: str, total: float) -> str:
    """Where a rebuild's time went: BuildKit's run (with its slowest layer pull) and stackforge's own work."""
    lines = log.splitlines()
    engine = [float(m.group(1)) for m in (ENGINE_DONE.search(line) for line in lines) if m]
    pulls = [float(m.group(1)) for m in (PULLED.match(line) for line in lines) if m]
    if not engine:
        return "no BuildKit time in the log"
    return (
        f"BuildKit {engine[-1]:.1f} s ({len(pulls)} layers pulled, the slowest {max(pulls, default=0):.1f} s), "
        f"stackforge before and after it {total - engine[-1]:.1f} s"
    )


def _pull(ref: str, local: str, prune: str, urls: dict[str, str]) -> tuple[float, dict | None]:
    """Seconds of a plain ``docker pull`` of ``ref`` into an engine without the image or the build records that
    hold its layers (the rebuild's floor), and the pulled image's layers (``RootFS``)."""
    subprocess.run(["docker", "image", "rm", local], capture_output=True)
    _prune(prune, urls)
    t0 = time.monotonic()
    subprocess.run(["docker", "pull", "-q", ref], capture_output=True, check=True)
    took = time.monotonic() - t0
    layers = (_image(ref) or {}).get("RootFS")
    subprocess.run(["docker", "image", "rm", ref], capture_output=True)
    return took, layers


def _second_host(root: Path, build: tuple[str, ...], ref: str, local: str, prune: str, urls: dict[str, str]):
    """The image removed and the build records pruned, then the build from ``ref``: (seconds, log, note)."""
    subprocess.run(["docker", "image", "rm", local], capture_output=True)
    pruned = _prune(prune, urls)
    seconds, log = _stackforge(root, *build, "--registry-cache", ref)
    ran = buildcache.ran(log)
    heavy = [s for s in ran if s.startswith(HEAVY)]
    note = (
        f"{pruned}, image removed; dependency/kernel steps re-run: {len(heavy)}"
        + (f" ({'; '.join(s[:80] for s in heavy)})" if heavy else "")
        + f"; steps that ran: {len(ran)}; {breakdown(log, seconds)}"
    )
    return seconds, log, note


def measure(echo=print, prune: str = "own") -> list[Result]:
    """The first host's cold build, published twice (gzip, the default, and zstd layers); each publish then
    rebuilt by a "second host". One Result per compression."""
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="stackforge-second-host-") as tmp, serving() as urls:
        root = Path(tmp) / "repo"
        shutil.copytree(BENCH / "stacks", root / "stacks")
        shutil.copytree(BENCH / "patches", root / "patches")
        reg, stop = start_registry(Path(tmp) / "registry")
        local = f"stackforge-bench/second-host-{uuid.uuid4().hex[:8]}:latest"
        sets = [f"indexes.{n}.url={u}" for n, u in urls.items()]
        sets += [f"tuning.CCACHE_COMPILERCHECK=string:bench-{uuid.uuid4().hex[:12]}", f"tags.local={local}"]
        sets = [a for s in sets for a in ("--set", s)]
        build = ("build", STACK, "--network", "host", "--ca-bundle", "none", *sets)
        try:
            cold, _ = _stackforge(root, *build, "--no-cache", "--cache-to", "inline")
            echo(f"first host: cold build {cold:.1f} s")
            published = {}
            for compression in ("gzip", "zstd"):
                pub_s, _ = _stackforge(
                    root, "publish", STACK, "--registry", f"{reg}/{compression}", "--date", DATE,
                    "--compression", compression, *sets,
                )  # fmt: skip
                record = json.loads((root / "build" / STACK / "evidence" / "latest" / "publish.json").read_text())
                published[compression] = (f"{record['repository']}:{record['tag']}", pub_s)
                echo(f"first host: published {published[compression][0]} ({compression}) in {pub_s:.1f} s")
            for compression, (ref, pub_s) in published.items():
                again, _log, note = _second_host(root, build, ref, local, prune, urls)
                rebuilt = (_image(local) or {}).get("RootFS")
                pulled_s, layers = _pull(ref, local, prune, urls)
                same = layers is not None and layers == rebuilt
                note += f"; publish {pub_s:.1f} s; rebuilt layers {'=' if same else '!='} published"
                note += f"; a plain docker pull of it: {pulled_s:.1f} s ({pulled_s / cold:.2f} of the cold build)"
                note += f"; gzip inflated by {gzip_inflater()}" if compression == "gzip" else ""
                echo(f"second host ({compression} layers): {again:.1f} s; {note}")
                name = "second host: build from registry cache" + ("" if compression == "gzip" else ", zstd layers")
                rid = ID if compression == "gzip" else f"{ID}-zstd"
                results.append(Result(name, again, cold, GOAL, PEER, note, id=rid))
        finally:
            subprocess.run(["docker", "image", "rm", local], capture_output=True)
            stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true", help="also write build/bench/results.json")
    parser.add_argument(
        "--prune",
        choices=("own", "all"),
        default="own",
        help="own: forget only this run's build records (default); all: docker builder prune -af",
    )
    args = parser.parse_args()
    results = measure(echo=lambda s: print(s, file=sys.stderr, flush=True), prune=args.prune)
    print(table(results))
    if args.json:
        print(f"written: {write(results)}")
    return 0 if all(r.met for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
