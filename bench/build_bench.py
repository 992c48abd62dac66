"""Benchmark: stackforge's stage-ordered build vs a naive single-stage Dockerfile, in one run.

For each of the two, on the example stack (same pins, same patched upstream, same gate):
  cold       --no-cache (layer cache off; BuildKit cache mounts stay as they are)
  no-op      the same build again
  one patch  after a one-line change to the upstream's patch
Prints the times and the ratios naive/stackforge. Needs the engine and the base image
(`make base`). Run: python bench/build_bench.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAIVE = REPO / "bench" / "naive.Dockerfile"
CA = next((p for p in ("/etc/ssl/certs/ca-certificates.crt",) if Path(p).is_file()), None)


def run(cmd: list[str], **kw) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took


def stackforge(root: Path, *args: str) -> float:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    return run([sys.executable, "-m", "stackforge", "--root", str(root), *args], env=env)


def naive_build(root: Path, tag: str, no_cache: bool = False) -> float:
    # The naive flow also needs the patched source and pins on disk: render them (not timed).
    stackforge(root, "render", "example")
    cmd = ["docker", "buildx", "build", "--progress=plain", "--load", "-t", tag, "-f", str(NAIVE)]
    if CA:
        cmd += ["--secret", f"id=cabundle,src={CA}"]
    if no_cache:
        cmd.append("--no-cache")
    return run(cmd + [str(root / "build" / "example" / "context")])


def change_patch(root: Path) -> None:
    patch = next((root / "patches" / "markupsafe").glob("0001-*.patch"))
    text = patch.read_text()
    patch.write_text(
        text.replace(
            "+# A build that must ship the C speedups",
            f"+# A build ({uuid.uuid4().hex[:8]}) that must ship the C speedups",
            1,
        )
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="stackforge-bench-") as tmp:
        results: dict[str, dict[str, float]] = {"stackforge": {}, "naive": {}}
        for who in ("stackforge", "naive"):
            root = Path(tmp) / who
            shutil.copytree(REPO / "stacks", root / "stacks")
            shutil.copytree(REPO / "patches", root / "patches")
            tag = f"stackforge-bench/{who}:latest"
            if who == "stackforge":
                build = lambda no_cache=False, root=root, tag=tag: stackforge(  # noqa: E731
                    root, "build", "example", "--set", f"tags.local={tag}", *(["--no-cache"] if no_cache else [])
                )
            else:
                build = lambda no_cache=False, root=root, tag=tag: naive_build(root, tag, no_cache)  # noqa: E731
            results[who]["cold"] = build(no_cache=True)
            results[who]["no-op"] = build()
            change_patch(root)
            results[who]["one patch"] = build()
            print(f"{who}: " + ", ".join(f"{k} {v:.1f}s" for k, v in results[who].items()), flush=True)
    print()
    print("| build | stackforge (s) | naive single stage (s) | naive / stackforge |")
    print("| --- | ---: | ---: | ---: |")
    for step in ("cold", "no-op", "one patch"):
        a, b = results["stackforge"][step], results["naive"][step]
        print(f"| {step} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    print(
        "\nstackforge times include its host-side work (lint, context assembly, evidence); the naive "
        "times exclude the render that prepares their context."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
