"""Benchmark: publishing a two-platform index vs `docker push` of both images + `docker buildx imagetools create`.

The images: one per platform, FROM the platform's local base (stackforge/base:bookworm and
stackforge/base:bookworm-arm64, each two real Debian + CPython layers, ~600 MB) plus a "deps" layer of seeded files
(half random bytes, half text) and a small "app" layer, with the labels a stackforge build gives its image (the layer
epoch, the base's layer count), so stackforge publishes them as it publishes a stack line's image. Only COPY steps:
the arm64 image builds without emulation. A fresh ``docker-registry`` on 127.0.0.1, a fresh repository for each side
and a fresh layer cache, so nothing is skipped that a first publish would not skip.

Measured back to back, after one read of both images (``docker save`` to nowhere) so neither side finds them
colder in the page cache than the other:
  peer   docker push of the amd64 image and of the arm64 image (two tags), then `docker buildx imagetools create`
         of the index over them under a third tag
  ours   what `stackforge publish STACK --platform all` runs after its gate checks: each image pushed by digest
         (``publish(..., tag_it=False)``), then the index tagged with the first free -rN, re-read, settled and checked
         (``publish/platforms.publish_index``)
Goal (results.json id ``publish-platforms``): ours ≤ 0.5 of the peer.
Run alone: python bench/platforms_bench.py (the arm64 base: scripts/base-image.sh --platform linux/arm64)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from bench.publish_bench import DATE, SCHEME, sh, write_context  # noqa: E402
from bench.results import GOALS, Result, table, write  # noqa: E402
from stackforge.clients.registry import RegistryClient, parse_repository  # noqa: E402
from stackforge.publish.oci import DockerImage  # noqa: E402
from stackforge.publish.platforms import Child, publish_index  # noqa: E402
from stackforge.publish.publisher import PublishOptions, publish  # noqa: E402
from tests.fixtures.registry import start_registry  # noqa: E402

BASES = {"linux/amd64": "stackforge/base:bookworm", "linux/arm64": "stackforge/base:bookworm-arm64"}


def build(ctx: Path, base: str, platform: str, tag: str) -> None:
    """The bench image of ``platform`` on ``base``: publish_bench's context with its FROM and labels for this base."""
    write_context(ctx, 60, "patch 1")
    layers = subprocess.run(["docker", "image", "inspect", "--format", "{{len .RootFS.Layers}}", base],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    labels = f"LABEL org.stackforge.epoch=1700000000 org.stackforge.base.layers={layers or 0}\n"
    (ctx / "Dockerfile").write_text(f"FROM {base}\n{labels}COPY deps /opt/deps\nCOPY app /opt/app\n")
    sh("docker", "buildx", "build", "--load", "-q", "--platform", platform, "-t", tag, str(ctx))


def peer(registry: str, images: dict[str, str], repo: str) -> float:
    """docker push of each image, then imagetools create of the index over them: seconds."""
    t0 = time.monotonic()
    refs = []
    for platform, image in images.items():
        ref = f"{registry}/{repo}:v-{platform.split('/')[1]}"
        sh("docker", "tag", image, ref)
        try:
            sh("docker", "push", "-q", ref)
        finally:
            subprocess.run(["docker", "image", "rm", ref], capture_output=True)
        refs.append(ref)
    sh("docker", "buildx", "imagetools", "create", "-t", f"{registry}/{repo}:v", *refs)
    return time.monotonic() - t0


def ours(registry: str, images: dict[str, str], repo: str, cache: Path) -> tuple[float, str]:
    """Each image pushed by digest, then the index published under the first free -rN: seconds, index digest."""
    t0 = time.monotonic()
    options = PublishOptions(layer_cache=cache)
    children = []
    for platform, image in images.items():
        res = publish(DockerImage(image), f"{registry}/{repo}", SCHEME, DATE, options, tag_it=False)
        event = next(e for e in reversed(res.push_log) if e["event"] == "pushed-by-digest")
        children.append(Child(platform, res.digest, int(event["size"]), str(event["media_type"])))
    client = RegistryClient(parse_repository(f"{registry}/{repo}"))
    index = publish_index(children, client, SCHEME, DATE)
    return time.monotonic() - t0, index.digest


def measure() -> list[Result]:
    run = uuid.uuid4().hex[:8]
    missing = [
        b for b in BASES.values() if subprocess.run(["docker", "image", "inspect", b], capture_output=True).returncode
    ]
    if missing:
        sys.exit(f"missing base image(s) {', '.join(missing)}: scripts/base-image.sh [--platform linux/arm64]")
    images = {p: f"stackforge-bench/platforms:{run}-{p.split('/')[1]}" for p in BASES}
    with tempfile.TemporaryDirectory(prefix="stackforge-platbench-") as tmp:
        registry, stop = start_registry(Path(tmp) / "registry")
        try:
            for platform, tag in images.items():
                build(Path(tmp) / f"ctx-{platform.split('/')[1]}", BASES[platform], platform, tag)
            # both sides then read them warm (to stdout: `docker save -o` renames a temporary file over its output)
            subprocess.run(["docker", "save", *images.values()], stdout=subprocess.DEVNULL, check=True)
            theirs = peer(registry, images, f"bench/docker-{run}")
            mine, digest = ours(registry, images, f"bench/sf-{run}", Path(tmp) / "layers")
        finally:
            stop()
            subprocess.run(["docker", "image", "rm", *images.values()], capture_output=True)
    return [
        Result(
            "publish a two-platform index",
            mine,
            theirs,
            GOALS["publish-platforms"],
            "docker push ×2 + imagetools create",
            f"linux/amd64 and linux/arm64, each FROM its base + 60 MB seeded deps + app layer; index {digest[:19]}…",
            id="publish-platforms",
        )
    ]


if __name__ == "__main__":
    results = measure()
    print(table(results))
    print(f"written: {write(results)}")
