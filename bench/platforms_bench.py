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
         (``PublishOptions(tag_it=False)``), then the index tagged with the first free -rN, re-read, settled and checked
         (``publish/platforms.publish_index``)
Goal (results.json id ``publish-platforms``): ours ≤ 0.5 of the peer.

And the emulated arm64 build (id ``build-emulated``, goal ≤ 1.15): the build benchmark's stack
(bench/stacks/benchpost.yaml) built for its arm64 line under emulation, ``stackforge build benchpost --platform
arm64`` (as shipped but ``--ca-bundle none``, as the build benchmark's peer trusts the same certificates; its own
empty ccache), against ``docker buildx build --platform linux/arm64`` of bench/benchpost.naive.Dockerfile FROM the
arm64 base, from the context ``stackforge render benchpost --platform arm64`` writes (not timed). The aarch64 wheels
are fetched from PyPI once into build/cache/bench/index-arm64/{vendor,public}/ and served on loopback, on ports of
this run: no step of either build is in the engine's cache, and no ``--no-cache`` build resets the shared cache
mounts. One build each (an emulated cold build takes minutes): ours first, then the peer. The line leaves out
triton (3.1.0 has no aarch64 wheel); the rest is the build benchmark's content.
Run alone: python bench/platforms_bench.py [--only publish|build] (the arm64 base: scripts/base-image.sh --platform
linux/arm64; the emulator: scripts/engine-setup.sh)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from bench import build_bench as bb  # noqa: E402
from bench.publish_bench import DATE, SCHEME, sh, write_context  # noqa: E402
from bench.results import GOALS, Result, table, write  # noqa: E402
from stackforge.clients.registry import RegistryClient, parse_repository  # noqa: E402
from stackforge.publish.oci import DockerImage  # noqa: E402
from stackforge.publish.platforms import Child, publish_index  # noqa: E402
from stackforge.publish.publisher import PublishOptions, publish  # noqa: E402
from tests.fixtures.index_server import IndexServer  # noqa: E402
from tests.fixtures.registry import start_registry  # noqa: E402

BASES = {"linux/amd64": "stackforge/base:bookworm", "linux/arm64": "stackforge/base:bookworm-arm64"}
#: the aarch64 wheels of the build benchmark's indexes
ARM_INDEXES = bb.CACHE / "bench" / "index-arm64"


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


def _bases() -> None:
    missing = [
        b for b in BASES.values() if subprocess.run(["docker", "image", "inspect", b], capture_output=True).returncode
    ]
    if missing:
        sys.exit(f"missing base image(s) {', '.join(missing)}: scripts/base-image.sh [--platform linux/arm64]")


def measure(only: str | None = None) -> list[Result]:
    _bases()
    return [
        *(measure_build() if only in (None, "build") else []),
        *(measure_publish() if only in (None, "publish") else []),
    ]


# --------------------------------------------------------------------------- the emulated arm64 build


def measure_build() -> list[Result]:
    dirs = bb.fetch_indexes(ARM_INDEXES, "aarch64", without=frozenset({"triton"}))
    with (
        tempfile.TemporaryDirectory(prefix="stackforge-armbench-") as tmp,
        IndexServer(dirs["vendor"]) as vendor,
        IndexServer(dirs["public"]) as public,
    ):
        urls = {"vendor": vendor.url, "public": public.url}
        sets = [f"indexes.{n}.url={u}" for n, u in urls.items()]
        ours = bb.Side("stackforge-arm64", Path(tmp) / "ours", [*sets, bb._own_ccache()])
        peer = bb.Side("naive-arm64", Path(tmp) / "naive", list(sets))
        for side in (ours, peer):
            shutil.copytree(bb.BENCH / "stacks", side.root / "stacks")
            shutil.copytree(bb.BENCH / "patches", side.root / "patches")
        naive = Path(tmp) / "naive-arm64.Dockerfile"
        text = bb.NAIVE.read_text()
        assert "\nFROM stackforge/base:bookworm\n" in text, bb.NAIVE
        naive.write_text(text.replace("\nFROM stackforge/base:bookworm\n", f"\nFROM {BASES['linux/arm64']}\n", 1))
        try:
            mine = bb._stackforge(ours, "build", bb.STACK, "--platform", "arm64", "--network", "host",
                                  "--ca-bundle", "none", "--set", f"tags.local={ours.tag}")  # fmt: skip
            ours.images.add(_image_id(f"{ours.tag}-arm64"))
            bb._stackforge(peer, "render", bb.STACK, "--platform", "arm64")
            cmd = ["docker", "buildx", "build", "--progress=plain", "--platform", "linux/arm64", "--load",
                   "--network", "host", "-t", peer.tag, "-f", str(naive),
                   "--build-arg", f"VENDOR_INDEX={urls['vendor']}/", "--build-arg", f"PUBLIC_INDEX={urls['public']}/",
                   str(peer.root / "build" / f"{bb.STACK}@arm64" / "context")]  # fmt: skip
            theirs = peer.built(bb._run(cmd))
        finally:
            bb.remove_images(ours, peer)
            bb.forget_records(urls)
    steps = len(mine.ran())
    return [
        Result(
            "emulated arm64 build of the benchmark stack",
            mine.seconds,
            theirs.seconds,
            GOALS["build-emulated"],
            "buildx --platform linux/arm64, naive Dockerfile",
            f"cold (this run's index ports), one build each, ours first; {steps} steps of ours ran, "
            f"{len(bb.buildcache.cached(mine.log))} came from the engine's cache; without triton (no aarch64 wheel)",
            id="build-emulated",
        )
    ]


def _image_id(ref: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


# --------------------------------------------------------------------------- the two-platform index


def measure_publish() -> list[Result]:
    run = uuid.uuid4().hex[:8]
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", choices=("publish", "build"), help="one of the two measures")
    results = measure(parser.parse_args().only)
    print(table(results))
    print(f"written: {write(results)}")
