"""What a file mount costs a RUN step on this engine: N trivial steps, built with --no-cache, with no mount, with
the file as a BuildKit secret, and with it bind-mounted from the build context and from a named build context.

Each variant is built ROUNDS times, alternating; the figure is each one's median wall time, and the cost per
step is (variant - none) / N. This is how docs/build.md measured the wait that made the CA bundle a bind mount.
Needs the engine and the base image (``make base``). Run alone: python bench/mount_wait.py [--steps N] [--rounds R]
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

BASE = "stackforge/base:bookworm"
BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
MOUNTS = {
    "none": "",
    "secret": "--mount=type=secret,id=ca ",
    "bind (build context)": "--mount=type=bind,source=ca.pem,target=/run/stackforge/ca.pem ",
    "bind (named context)": "--mount=type=bind,from=ca,source=ca.pem,target=/run/stackforge/ca.pem ",
}


def dockerfile(mount: str, steps: int) -> str:
    return f"FROM {BASE}\n" + "".join(f"RUN {mount}echo step {i} > /s{i}\n" for i in range(steps))


def build_seconds(work: Path, name: str, steps: int) -> float:
    (work / "Dockerfile").write_text(dockerfile(MOUNTS[name], steps))
    cmd = ["docker", "buildx", "build", "--progress=plain", "--no-cache", "--output", "type=cacheonly"]
    cmd += ["--secret", f"id=ca,src={work / 'ca.pem'}", "--build-context", f"ca={work / 'named'}", str(work)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{name}: the build failed:\n{proc.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in MOUNTS}
    with tempfile.TemporaryDirectory(prefix="stackforge-mount-wait-") as tmp:
        work = Path(tmp)
        (work / "named").mkdir()
        shutil.copyfile(BUNDLE, work / "ca.pem")
        shutil.copyfile(BUNDLE, work / "named" / "ca.pem")
        for _ in range(args.rounds):
            for name in MOUNTS:
                times[name].append(build_seconds(work, name, args.steps))
    none = statistics.median(times["none"])
    print(f"| {args.steps} RUN steps, --no-cache | median (s) | per step vs none (s) | runs (s) |")
    print("| --- | ---: | ---: | --- |")
    for name, runs in times.items():
        median = statistics.median(runs)
        each = ", ".join(f"{t:.2f}" for t in runs)
        print(f"| {name} | {median:.2f} | {(median - none) / args.steps:+.2f} | {each} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
