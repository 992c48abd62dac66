"""Reproducible digests on the post2-like benchmark stack: two clean builds, one digest.

``python bench/repro_check.py [--json]`` copies bench/stacks and bench/patches into two directories, builds
bench/stacks/benchpost.yaml in each with ``--no-cache`` (one after the other, so at other times), publishes each to
its own repository of a local registry, and prints both digests, both gated image ids and the seconds each step
took. The two builds share the indexes' URLs and every ``--set`` (they are part of the image: the stack files and
overrides travel in it), nothing else.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.build_bench import BENCH, STACK, Side, _own_ccache, _stackforge, build_ours, remove_images, serving  # noqa: E402
from tests.fixtures.registry import start_registry  # noqa: E402

DATE = "20261202"


def measure(echo=print) -> dict:
    out: dict = {"stack": STACK, "builds": []}
    with tempfile.TemporaryDirectory(prefix="stackforge-repro-") as tmp, serving() as urls:
        registry, stop = start_registry(Path(tmp) / "registry")
        sets = [*(f"indexes.{n}.url={u}" for n, u in urls.items()), _own_ccache()]
        sides = [Side("repro", Path(tmp) / name / "checkout", sets) for name in ("first", "second")]
        try:
            for i, side in enumerate(sides):
                shutil.copytree(BENCH / "stacks", side.root / "stacks")
                shutil.copytree(BENCH / "patches", side.root / "patches")
                built = build_ours(side, no_cache=True)
                t0 = time.monotonic()
                run = _stackforge(
                    side, "publish", STACK, "--registry", f"{registry}/side{i}", "--date", DATE, "--json",
                    "--set", f"tags.local={side.tag}",
                )  # fmt: skip
                published, _ = json.JSONDecoder().raw_decode(run.log)  # stdout (the JSON) comes first
                row = {
                    "build_s": round(built.seconds, 1),
                    "publish_s": round(time.monotonic() - t0, 1),
                    "digest": published["digest"],
                    "image_id": published["image_id"],
                    "gated_image_id": published.get("gated_image_id"),
                }
                echo(json.dumps(row))
                out["builds"].append(row)
        finally:
            remove_images(*sides)
            stop()
    digests = {b["digest"] for b in out["builds"]}
    out["one_digest"] = len(digests) == 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(echo=(lambda _line: None) if args.json else print)
    print(json.dumps(result, indent=2) if args.json else f"one digest: {result['one_digest']}")
    return 0 if result["one_digest"] else 1


if __name__ == "__main__":
    sys.exit(main())
