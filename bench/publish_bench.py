"""Benchmark: `stackforge publish` vs `docker push` of the same image to the same loopback registry, in one run.

The image: FROM stackforge/base:bookworm (two real Debian + CPython layers, ~600 MB) plus a "deps" layer
of seeded files (half random bytes, which no compressor shrinks, half text, as wheels mix compiled
extensions and Python sources) and a small "app" layer whose one file a rebuild changes (the
one-patch rebuild). It carries the labels a stackforge build gives its image (the layer epoch, the base's layer
count), so stackforge publishes it as it publishes a stack's image: the two layers above the base normalized. A fresh ``docker-registry`` on 127.0.0.1 and a fresh layer cache per run, so
nothing is skipped that a first publish would not skip.

Measured back to back:
  docker push            a fresh repository (no layer exists there)
  publish (first)        stackforge to another fresh repository
  re-publish             stackforge again after the one-layer rebuild (same repository); its peer is the first publish
  pull of our zstd image one ~600 MB layer of real files (the base image's root filesystem: ELF binaries and
                         libraries, Python sources and bytecode, text), published by stackforge with zstd and
                         uncompressed, then pulled back PULL_ROUNDS times each, alternating which goes first; its
                         peer is the uncompressed pull, the floor of any codec on this engine (id ``pull``). Also
                         pushed by docker push (gzip) and pulled in every other round, reported beside it.
                         $STACKFORGE_BENCH_PULL_LAYER names another layer tar to pull instead (e.g. an unpacked
                         torch wheel)
The publish goes through :func:`stackforge.publish.publisher.publish` with the engine's image, the code
path ``stackforge publish`` runs after its gate check, with the production defaults (settle re-read
included; the library call has no publish record to prepare in the pause, so the pause is all sleep).
Also reported: the first publish's CPU on this machine (process, dockerd and the registry, which shares the
cores) over the cores, the least time any schedule of that work takes, against docker push; where the first
publish spent its time, and the bounds (``docker save`` seconds, gzip MB/s per core at the level used, loopback
upload MB/s).
Run: PYTHONPATH=tools python bench/publish_bench.py
"""

from __future__ import annotations

import io
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from bench.results import GOALS, Result, gzip_inflater, table, write  # noqa: E402
from stackforge.clients.registry import RegistryClient, parse_repository  # noqa: E402
from stackforge.publish.codec import LEVELS, codec  # noqa: E402
from stackforge.publish.oci import DockerImage  # noqa: E402
from stackforge.publish.publisher import PublishOptions, publish  # noqa: E402
from stackforge.stack.scheme import TagScheme  # noqa: E402
from tests.fixtures.registry import start_registry  # noqa: E402

GZIP_LEVEL = LEVELS["gzip"][2]

BASE = "stackforge/base:bookworm"
SCHEME = TagScheme.from_prefix("bench-")
DATE = "20260101"
WORDS = [
    "import",
    "def",
    "return",
    "self",
    "class",
    "from",
    "none",
    "true",
    "false",
    "for",
    "in",
    "if",
    "else",
    "elif",
    "while",
    "with",
    "as",
    "try",
    "except",
    "raise",
    "yield",
    "lambda",
    "async",
    "await",
    "numpy",
    "torch",
    "tensor",
    "shape",
    "dtype",
    "float",
    "int",
    "str",
    "list",
    "dict",
    "value",
    "key",
    "index",
    "data",
]


def _cpu_of(pid: str) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; NaN when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, OSError, ValueError):
        return float("nan")


def engine_cpu() -> float:
    """CPU seconds dockerd has used so far (docker push compresses there; publish's ``docker save`` runs there)."""
    pids = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    return _cpu_of(pids[0]) if pids else float("nan")


def registry_cpu(config: Path) -> Callable[[], float]:
    """CPU seconds the loopback registry serving ``config`` has used so far (it hashes and stores every blob either
    pusher uploads, on the same cores)."""
    pids = subprocess.run(["pgrep", "-f", f"serve {config}"], capture_output=True, text=True).stdout.split()
    return lambda: _cpu_of(pids[0]) if pids else float("nan")


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def sh(*cmd: str, **kw: Any) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.monotonic() - t0


def write_context(ctx: Path, deps_mb: int, patch: str) -> None:
    """The build context: seeded deps (the same bytes every run) and the app file ``patch`` changes."""
    rng = random.Random(20260101)
    deps = ctx / "deps"
    deps.mkdir(parents=True, exist_ok=True)
    for i in range(deps_mb // 2):
        (deps / f"ext{i:03d}.so").write_bytes(rng.randbytes(1 << 20))
        lines = (" ".join(rng.choices(WORDS, k=12)) + "\n" for _ in range(20000))
        (deps / f"mod{i:03d}.py").write_text("".join(lines)[: 1 << 20])
    app = ctx / "app"
    app.mkdir(exist_ok=True)
    (app / "server.py").write_text("".join(f"# line {n}\n" for n in range(50000)))
    (app / "PATCH").write_text(patch + "\n")
    # The labels a stackforge build gives its image: the layer epoch and the base's layer count, so the publisher
    # normalizes the layers above the base as it does for a stack's image.
    layers = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{len .RootFS.Layers}}", BASE], capture_output=True, text=True
    ).stdout.strip()
    labels = f"LABEL org.stackforge.epoch=1700000000 org.stackforge.base.layers={layers or 0}\n"
    (ctx / "Dockerfile").write_text(f"FROM {BASE}\n{labels}COPY deps /opt/deps\nCOPY app /opt/app\n")


def build(ctx: Path, tag: str) -> str:
    sh("docker", "build", "-q", "-t", tag, str(ctx), env=dict(os.environ, DOCKER_BUILDKIT="1"))
    return subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True
    ).stdout.strip()


def docker_push(registry: str, image: str, repo: str) -> tuple[float, float]:
    """Seconds and CPU seconds (dockerd) of ``docker push`` to a fresh repository."""
    ref = f"{registry}/{repo}:v"
    sh("docker", "tag", image, ref)
    try:
        cpu = engine_cpu()
        took = sh("docker", "push", "-q", ref)
        return took, engine_cpu() - cpu
    finally:
        subprocess.run(["docker", "image", "rm", ref], capture_output=True)


def sf_publish(
    registry: str, image: str, repo: str, cache: Path, compression: str = "gzip"
) -> tuple[float, float, list[dict[str, Any]]]:
    """Seconds, CPU seconds (this process and dockerd) and the push log of a library publish."""
    t0, cpu = time.monotonic(), engine_cpu() + own_cpu()
    options = PublishOptions(layer_cache=cache, compression=compression)
    res = publish(DockerImage(image), f"{registry}/{repo}", SCHEME, DATE, options)
    return time.monotonic() - t0, engine_cpu() + own_cpu() - cpu, res.push_log


#: rounds of pulls of the zstd and the uncompressed image, alternating which goes first; each one's median is the
#: figure (docker push's gzip image is pulled in every other round, between the two)
PULL_ROUNDS = 6
#: a layer tar to pull instead of the base image's root filesystem (e.g. an unpacked wheel set such as torch)
PULL_LAYER_ENV = "STACKFORGE_BENCH_PULL_LAYER"


@dataclass(frozen=True)
class Pulls:
    zstd_s: float
    gzip_s: float
    zstd_runs: list[float]
    gzip_runs: list[float]
    #: the same layer pulled uncompressed (published with ``--compression none``): what a pull costs with no
    #: decompression at all, the floor any codec can reach on this engine
    plain_runs: list[float]
    publish_s: float
    layer_bytes: int
    layer: str


def _layer_tar(tmp: Path, run: str) -> tuple[Path, str]:
    """The tar to import as the pulled layer, plus a file unique to this run, and what it holds."""
    given = os.environ.get(PULL_LAYER_ENV)
    rootfs = tmp / "rootfs.tar"
    if given:
        shutil.copyfile(given, rootfs)
        what = f"{Path(given).name} (${PULL_LAYER_ENV})"
    else:
        cid = subprocess.run(["docker", "create", BASE, "true"], capture_output=True, text=True).stdout.strip()
        try:
            sh("docker", "export", "-o", str(rootfs), cid)
        finally:
            subprocess.run(["docker", "rm", cid], capture_output=True)
        what = f"the root filesystem of {BASE}"
    with tarfile.open(rootfs, "a") as tar:
        data = f"pull benchmark {run}\n".encode()
        info = tarfile.TarInfo(f"bench-{run}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return rootfs, what


def pull_rounds(registry: str, tmp: Path, run: str, cache: Path, rounds: int = PULL_ROUNDS) -> Pulls:
    """One layer (the base image's root filesystem, or $STACKFORGE_BENCH_PULL_LAYER, plus a file unique to this run)
    imported as an image no build cache or other image refers to, so removing the image removes the layer.
    stackforge publishes it with zstd and uncompressed (the floor: a pull with no decompression at all), ``docker
    push`` with gzip; each is then pulled back by its reference into an engine that lacks it, the zstd and the
    uncompressed one ``rounds`` times, alternating which goes first, the gzip one between them in every other
    round; each pull after ``sync`` (so one pull's write-back does not land in the next) and followed by removing
    the image."""
    rootfs, what = _layer_tar(tmp, run)
    image = f"stackforge-bench/pull:{run}"
    sh("docker", "import", str(rootfs), image)
    gzip_ref = f"{registry}/bench/pull-docker-{run}:v"
    zstd_ref = f"{registry}/bench/pull-sfz-{run}:{SCHEME.tag(DATE, 1)}"  # a fresh repository: revision 1
    plain_ref = f"{registry}/bench/pull-sfn-{run}:{SCHEME.tag(DATE, 1)}"
    try:
        docker_push(registry, image, f"bench/pull-docker-{run}")
        published, _, _ = sf_publish(registry, image, f"bench/pull-sfz-{run}", cache, compression="zstd")
        sf_publish(registry, image, f"bench/pull-sfn-{run}", cache, compression="none")
    finally:
        subprocess.run(["docker", "image", "rm", image], capture_output=True)
    runs: dict[str, list[float]] = {ref: [] for ref in (zstd_ref, gzip_ref, plain_ref)}
    for i in range(rounds):
        pair = [zstd_ref, plain_ref] if i % 2 == 0 else [plain_ref, zstd_ref]
        for ref in pair[:1] + ([gzip_ref] if i % 2 else []) + pair[1:]:
            subprocess.run(["sync"], check=False)
            runs[ref].append(sh("docker", "pull", "-q", ref))
            subprocess.run(["docker", "image", "rm", ref], capture_output=True)
    size = rootfs.stat().st_size
    rootfs.unlink()
    return Pulls(
        statistics.median(runs[zstd_ref]),
        statistics.median(runs[gzip_ref]),
        runs[zstd_ref],
        runs[gzip_ref],
        runs[plain_ref],
        published,
        size,
        what,
    )


def phases(log: list[dict[str, Any]]) -> str:
    """Where a publish spent its time, from its push log."""
    at = {e["event"]: e["t"] for e in reversed(log)}
    end = log[-1]["t"]
    source = (
        "layer store"
        if "export-from-layer-store" in at and "export-from-layer-store-refused" not in at
        else "docker save"
    )
    reread = at.get("tag-reread", end)
    parts = [
        ("preflight", 0.0, at.get("export", 0.0)),
        (f"export ({source}) + compress", at.get("export", 0.0), at.get("exported", 0.0)),
        ("upload tail", at.get("exported", 0.0), at.get("manifest-by-digest", 0.0)),
        ("tag + first re-read", at.get("manifest-by-digest", 0.0), reread),
        ("settle", reread, at.get("tag-reread-settled", reread)),
        ("aliases + rest", at.get("tag-reread-settled", reread), end),
    ]
    rebuilt = sum(e.get("seconds", 0.0) for e in log if e["event"] == "layer-rebuilt")
    slept = sum(e.get("sleep", 0.0) for e in log if e["event"] == "settle")
    return ", ".join(f"{name} {b - a:.2f} s" for name, a, b in parts) + (
        f" (layers rebuilt + compressed {rebuilt:.2f} s; settle slept {slept:.2f} s)"
    )


def bounds(registry: str, image: str) -> str:
    """docker save seconds, the gzip codec's MB/s per CPU-second at the publish level, loopback upload MB/s."""
    import docker

    t0, n = time.monotonic(), 0
    for chunk in docker.from_env().api.get_image(image, chunk_size=1 << 20):
        n += len(chunk)
    save = time.monotonic() - t0
    sample = bytearray()
    for root in ("/usr/lib/python3.11", "/usr/lib/x86_64-linux-gnu", "/usr/share"):
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                try:
                    sample += Path(dirpath, f).read_bytes()[: 4 << 20]
                except OSError:
                    continue
                if len(sample) >= 64 << 20:
                    break
            if len(sample) >= 64 << 20:
                break
    data = bytes(sample[: 64 << 20])
    packed = io.BytesIO()
    c0 = time.process_time()
    codec("gzip").compress(io.BytesIO(data), packed.write)  # type: ignore[union-attr]  # one thread: per core
    gz = len(data) / 1e6 / (time.process_time() - c0)
    ratio = packed.tell() / len(data)
    blob = random.Random(1).randbytes(128 << 20)
    digest = "sha256:" + __import__("hashlib").sha256(blob).hexdigest()
    client = RegistryClient(parse_repository(f"{registry}/bench/upload-{uuid.uuid4().hex[:6]}"))
    t0 = time.monotonic()
    client.upload_blob(digest, len(blob), lambda: __import__("io").BytesIO(blob))
    up = len(blob) / 1e6 / (time.monotonic() - t0)
    return (
        f"docker save {n / 1e6:.0f} MB in {save:.1f} s; gzip level {GZIP_LEVEL} {gz:.0f} MB/s per core "
        f"(ratio {ratio:.2f}, {os.cpu_count()} cores); loopback upload {up:.0f} MB/s"
    )


#: cores this process may run on (the registry and dockerd share them)
CORES = len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Work:
    """CPU seconds of a push on this machine: ours (process, dockerd and registry), docker push's (dockerd and
    registry), and the registry's part of ours."""

    ours: float
    push: float
    registry: float


def measure(deps_mb: int = 60) -> list[Result]:
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="stackforge-pubbench-") as tmp:
        ctx, cache = Path(tmp) / "ctx", Path(tmp) / "layers"
        registry, stop = start_registry(Path(tmp) / "registry")
        tags = [f"stackforge-bench/publish:{run}-1", f"stackforge-bench/publish:{run}-2"]
        try:
            write_context(ctx, deps_mb, "patch 1")
            build(ctx, tags[0])
            served = registry_cpu(Path(tmp) / "registry" / "config.yml")
            r0 = served()
            push1, push1_cpu = docker_push(registry, tags[0], f"bench/docker-{run}")
            r1 = served()
            first, first_cpu, log1 = sf_publish(registry, tags[0], f"bench/sf-{run}", cache)
            work = Work(first_cpu + served() - r1, push1_cpu + r1 - r0, served() - r1)
            (ctx / "app" / "PATCH").write_text("patch 2\n")
            build(ctx, tags[1])
            push2, _ = docker_push(registry, tags[1], f"bench/docker-{run}")
            again, again_cpu, log2 = sf_publish(registry, tags[1], f"bench/sf-{run}", cache)
            uploaded = sum(1 for e in log2 if e["event"] == "blob-uploaded")
            limits = bounds(registry, tags[0])
            pulls = pull_rounds(registry, Path(tmp), run, cache)
        finally:
            stop()
            subprocess.run(["docker", "image", "rm", *tags], capture_output=True)
    size = f"FROM {BASE} + {deps_mb} MB seeded deps (half random) + app layer"
    return [
        Result(
            "publish (first)",
            first,
            push1,
            GOALS["publish"],
            "docker push",
            f"{size}; CPU s (ours: process + dockerd; docker push: dockerd) {first_cpu:.1f} vs {push1_cpu:.1f}; "
            f"{phases(log1)}; bounds: {limits}",
            id="publish",
        ),
        Result(
            "publish (first), its work on every core",
            work.ours / CORES,
            push1,
            None,
            "docker push",
            f"the CPU the first publish took on this machine, the registry's included ({work.ours:.1f} s, of which "
            f"the registry {work.registry:.1f} s), over its {CORES} cores: no schedule of that work finishes sooner; "
            f"docker push's: {work.push:.1f} s",
        ),
        Result(
            "re-publish after one-patch rebuild",
            again,
            first,
            GOALS["republish"],
            "first publish",
            f"{uploaded} blob(s) uploaded (config + changed layer); CPU s {again_cpu:.1f}; {phases(log2)}; "
            f"docker push of the same took {push2:.1f} s",
            id="republish",
        ),
        Result(
            "pull of our zstd image",
            pulls.zstd_s,
            statistics.median(pulls.plain_runs),
            GOALS["pull"],
            "docker pull of the same layer uncompressed",
            f"{pulls.layer} imported as one {pulls.layer_bytes / 1e6:.0f} MB layer, pulled into an engine without it; "
            f"stackforge published it with zstd (level {LEVELS['zstd'][2]}, {pulls.publish_s:.1f} s) and "
            f"uncompressed, the floor of any codec; medians of {len(pulls.zstd_runs)} alternating pulls each: zstd "
            + ", ".join(f"{t:.1f}" for t in pulls.zstd_runs)
            + " s; uncompressed "
            + ", ".join(f"{t:.1f}" for t in pulls.plain_runs)
            + " s",
            id="pull",
        ),
        Result(
            "pull of our zstd image, against gzip",
            pulls.zstd_s,
            pulls.gzip_s,
            None,
            "docker pull of docker push's gzip image",
            f"the same layer pushed by docker push (gzip), pulled {len(pulls.gzip_runs)} times between the others: "
            + ", ".join(f"{t:.1f}" for t in pulls.gzip_runs)
            + f" s; the uncompressed pull's median / gzip's {statistics.median(pulls.plain_runs) / pulls.gzip_s:.2f}"
            + "; gzip inflated by "
            + gzip_inflater(),
        ),
    ]


def main() -> int:
    results = measure()
    print(table(results))
    for r in results:
        print(f"- {r.measure}: {r.note}")
    write(results, REPO / "build" / "bench" / "publish.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
