"""Benchmark: stackforge's stage-ordered build vs the naive single-stage Dockerfile, side by side in one run.

The stack is bench/stacks/benchpost.yaml (built with ``--root bench``): post2's shape and cost with public
parts — ~310 MB of vendor wheels (triton, jaxlib, pyarrow) installed --no-deps from one index, ~110 MB of
public pins and the vendor wheels' dependencies from a second, and zstandard compiled from its release
sdist (~35 s on one core) with a two-patch series. The wheels and the sdist are fetched from PyPI once
into build/cache/bench/index/{vendor,public}/ (a second run fetches nothing) and served on loopback by
tests/fixtures/index_server.py, one server per index. The peer, bench/benchpost.naive.Dockerfile, builds
the same content (same pins, same patched source, same gate) from the context ``stackforge render`` writes.

Each measure runs stackforge, then the peer, back to back:
  cold build        --no-cache (layer cache off; stackforge's clean build has empty pip and compiler caches of
                    its own); three rounds, each side in each place once, each side's median
  no-op rebuild     the same build again (after one plain build, not timed, that fills the shared ccache as a
                    user's first build of the stack does)
  one-patch rebuild after a one-line change to the upstream's last patch, right after a neighbour's clean build
                    (``--no-cache``) of the same stack under another name, with another compiler identity;
                    stackforge must re-run no dependency step (checked in BuildKit's plain progress: the steps
                    that ran are noted)
  one-pin change    after moving one public pin (filelock 3.16.1 -> 3.16.0)
Both sides trust the same certificates: the peer passes no CA bundle, so stackforge builds with
``--ca-bundle none`` (its steps then declare no mount of a bundle). Each round of cold builds also builds the
default as shipped (the host's CA bundle bind-mounted into each downloading step from a named build context);
its median against the peer's is held to the same goal (results.json id ``cold-default``).
stackforge builds as it ships: its kernel step compiles through ccache (a BuildKit cache mount the peer
does not have). A cold build (``--no-cache``) compiles everything with an empty ccache of its own and leaves the
shared one as it is; the rebuilds use the shared one, filled by the plain build before them under this run's
compiler identity (``--set tuning.CCACHE_COMPILERCHECK=string:bench-<run>``), and hit where the compiler's input
is unchanged, whatever another stack's clean build did meanwhile. Needs the engine and the base image (``make
base``).
Run alone: python bench/build_bench.py [--json]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench.results import GOALS, Result, table, write  # noqa: E402
from tests.fixtures import buildcache  # noqa: E402
from tests.fixtures.index_server import IndexServer  # noqa: E402

STACK = "benchpost"
NAIVE = BENCH / "benchpost.naive.Dockerfile"
CACHE = REPO / "build" / "cache"
INDEXES = CACHE / "bench" / "index"
PEER = "naive single-stage Dockerfile"
#: the one-pin change: a public pin moved to its previous release (fetched with the rest)
PIN_CHANGE = ("filelock", "3.16.1", "3.16.0")
#: the stackforge under test (``--tools DIR``: another checkout's tools/, e.g. to measure a baseline)
TOOLS = [REPO / "tools"]


@dataclass
class Run:
    seconds: float
    log: str

    def ran(self) -> list[str]:
        """The Dockerfile steps BuildKit executed (not served from its cache), as ``stage: instruction``."""
        return buildcache.ran(self.log, width=60)


@dataclass
class Side:
    """One of the two builds (stackforge or the peer) in its own root, so a patch edit touches one only."""

    who: str
    root: Path
    overrides: list[str]
    runs: dict[str, Run] = field(default_factory=dict)
    images: set[str] = field(default_factory=set)  # every image id a build of this side made

    def built(self, run: Run) -> Run:
        """Remember the image the build just tagged (removed when the benchmark ends)."""
        proc = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", self.tag], capture_output=True, text=True
        )
        if proc.returncode == 0:
            self.images.add(proc.stdout.strip())
        return run

    @property
    def tag(self) -> str:
        return f"stackforge-bench/{self.who}:latest"


#: the neighbour: the same stack under this name, in a root of its own
NEIGHBOUR = "benchneighbour"


def _run(cmd: list[str], **kw) -> Run:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return Run(took, proc.stdout + proc.stderr)


def _stackforge(side: Side, *args: str) -> Run:
    env = dict(os.environ, STACKFORGE_CACHE=str(CACHE), PYTHONPATH=str(TOOLS[0]))
    sets = [a for o in side.overrides for a in ("--set", o)]
    return _run([sys.executable, "-m", "stackforge", "--root", str(side.root), *args, *sets], env=env)


def build_ours(side: Side, no_cache: bool = False, ca_bundle: str = "none", stack: str = STACK) -> Run:
    return side.built(
        _stackforge(
            side,
            "build",
            stack,
            "--network",
            "host",
            "--ca-bundle",
            ca_bundle,
            *(["--no-cache"] if no_cache else []),
            "--set",
            f"tags.local={side.tag}",
        )
    )


def build_peer(side: Side, indexes: dict[str, str], no_cache: bool = False) -> Run:
    # The peer also needs the patched source and the pins on disk: render them (not timed).
    _stackforge(side, "render", STACK)
    cmd = ["docker", "buildx", "build", "--progress=plain", "--load", "--network", "host", "-t", side.tag]
    cmd += ["-f", str(NAIVE), "--build-arg", f"VENDOR_INDEX={indexes['vendor']}/"]
    cmd += ["--build-arg", f"PUBLIC_INDEX={indexes['public']}/"]
    if no_cache:
        cmd.append("--no-cache")
    return side.built(_run(cmd + [str(side.root / "build" / STACK / "context")]))


def remove_images(*sides: Side) -> None:
    """Remove every image the benchmark built (each cold build leaves a ~2 GB image behind otherwise)."""
    ids = sorted({i for side in sides for i in side.images})
    if ids:
        subprocess.run(["docker", "image", "rm", "--force", *ids], capture_output=True)


#: what only the peer's steps say (its indexes come in as build arguments, so its steps do not name the URLs)
PEER_MARKER = '--index-url "$VENDOR_INDEX"'


def forget_records(urls: dict[str, str], echo=print) -> None:
    """Prune the build records this run made (a cold build leaves about 2 GB of them): every record whose step
    names one of this run's index URLs or the peer's index argument, and every record built on one, so the
    benchmarks after this one run on an engine without them."""
    t0 = time.monotonic()
    left = buildcache.forget([*(f"--index-url {url}/" for url in urls.values()), PEER_MARKER])
    echo(f"build bench: its build records pruned in {time.monotonic() - t0:.1f} s ({len(left)} could not be)")


# --------------------------------------------------------------------------- the indexes


def _wanted() -> dict[str, list[str]]:
    """index -> the requirements to fetch into it: the stack's pins, its upstream's sdist, the pin change."""
    from stackforge.stack.load import load_stack

    stack = load_stack(STACK, root=BENCH)
    wanted: dict[str, list[str]] = {name: [] for name in stack.indexes}
    for name, pin in stack.packages.items():
        wanted[pin.index].append(f"{name}=={pin.version}")
    name, _, older = PIN_CHANGE
    wanted[stack.packages[name].index].append(f"{name}=={older}")
    for up in stack.upstreams.values():
        if up.sdist is not None:
            wanted[up.sdist.index].append(f"sdist:{up.sdist.name}=={up.sdist.version}")
    return wanted


#: the wheel platforms of each architecture's indexes
WHEEL_PLATFORMS = {
    "x86_64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "any"),
    "aarch64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "any"),
}


def fetch_indexes(into: Path = INDEXES, arch: str = "x86_64", without: frozenset[str] = frozenset()) -> dict[str, Path]:
    """Fill ``into``/<index>/ (build/cache/bench/index/) from PyPI once, with the wheels of ``arch``, leaving out the
    projects ``without`` names; a marker lists what is there."""
    dirs: dict[str, Path] = {}
    for index, every in _wanted().items():
        reqs = [r for r in every if r.removeprefix("sdist:").split("==")[0] not in without]
        d = into / index
        dirs[index] = d
        marker = d / ".fetched"
        if marker.is_file() and marker.read_text().split() == sorted(reqs):
            continue
        d.mkdir(parents=True, exist_ok=True)
        wheels = [r for r in reqs if not r.startswith("sdist:")]
        sdists = [r.removeprefix("sdist:") for r in reqs if r.startswith("sdist:")]
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d)]
        target = ["--only-binary", ":all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
        target += [a for p in WHEEL_PLATFORMS[arch] for a in ("--platform", p)]
        print(f"fetching {len(reqs)} files for the {index} index into {d} (once)", file=sys.stderr, flush=True)
        for req in wheels:  # one at a time: two versions of one project may be wanted
            subprocess.run([*pip, *target, req], check=True)
        for req in sdists:
            subprocess.run([*pip, "--no-binary", ":all:", req], check=True)
        marker.write_text("\n".join(sorted(reqs)) + "\n")
    return dirs


@contextmanager
def serving() -> Iterator[dict[str, str]]:
    """Both indexes on loopback; yields index name -> URL."""
    dirs = fetch_indexes()
    with IndexServer(dirs["vendor"]) as vendor, IndexServer(dirs["public"]) as public:
        yield {"vendor": vendor.url, "public": public.url}


# --------------------------------------------------------------------------- the edits


def change_patch(root: Path) -> None:
    """A one-line change to the series' last patch (a comment in the Python it adds)."""
    patch = sorted((root / "patches" / "zstandard").glob("*.patch"))[-1]
    text = patch.read_text()
    old = "+        # The image ships the C backend alone"
    assert old in text, patch
    patch.write_text(text.replace(old, f"+        # The image ({uuid.uuid4().hex[:8]}) ships the C backend alone", 1))


def change_pin(root: Path) -> None:
    name, now, older = PIN_CHANGE
    path = root / "stacks" / f"{STACK}.yaml"
    text = path.read_text()
    new = re.sub(rf"^(  {name}: +\{{version: ){re.escape(now)}\b", rf"\g<1>{older}", text, count=1, flags=re.M)
    assert new != text, f"{name} {now} not found in {path}"
    path.write_text(new)


# --------------------------------------------------------------------------- the benchmark


#: the rounds of cold builds (ours as shipped, ours --ca-bundle none, the peer), each its order: every side in
#: every place once, and ``none`` the last stackforge build; each figure is a median
ROUND_ORDERS = (("default", "none", "naive"), ("none", "naive", "default"), ("naive", "default", "none"))
COLD_ROUNDS = len(ROUND_ORDERS)

MEASURES = (
    # measure, goal, what the ours side runs before it, what the peer side runs before it
    ("cold build", 1.15),
    ("no-op rebuild", GOALS["noop"]),
    ("one-patch rebuild", GOALS["one-patch"]),
    ("one-pin change", 1.0),
)
#: the tracked figures' ids (bench/results.GOALS) by measure
IDS = {"no-op rebuild": "noop", "one-patch rebuild": "one-patch"}


#: the default build (the host's CA bundle bind-mounted into each downloading step) is held to the cold goal too
DEFAULT_COLD_GOAL = 1.15


def _own_ccache() -> str:
    """A compiler identity no build has used (``CCACHE_COMPILERCHECK``, part of the kernel step): a plain build
    under it compiles everything, and fills the shared ccache for the rebuilds under it."""
    return f"tuning.CCACHE_COMPILERCHECK=string:bench-{uuid.uuid4().hex[:12]}"


def cold_rounds(ours: Side, default: Side, peer: Side, urls: dict[str, str]) -> tuple[Run, Run, Run, str]:
    """COLD_ROUNDS rounds of three cold builds: stackforge as shipped, stackforge ``--ca-bundle none`` and the
    peer, in ROUND_ORDERS. Each side takes each place once, since a build's place in a round moved its time by
    up to 14 s here, and a compile's time varies by a few seconds from one build to the next on a shared
    machine; each side's figure is its median build of the same hours. Each of ours is a clean build: it
    compiles with an empty ccache of its own.
    Returns the medians (``none``, as shipped, the peer) and a note with every time."""
    runs: dict[str, list[Run]] = {"default": [], "none": [], "naive": []}
    build = {
        "default": lambda: build_ours(default, no_cache=True, ca_bundle="auto"),
        "none": lambda: build_ours(ours, no_cache=True),
        "naive": lambda: build_peer(peer, urls, no_cache=True),
    }
    for order in ROUND_ORDERS:
        for who in order:
            runs[who].append(build[who]())

    def median(side: list[Run]) -> Run:
        return sorted(side, key=lambda r: r.seconds)[len(side) // 2]

    times = "; ".join(f"{who} {', '.join(f'{r.seconds:.1f}' for r in side)} s" for who, side in runs.items())
    note = f"medians of {COLD_ROUNDS} rounds, each side in each place once: {times}"
    return median(runs["none"]), median(runs["default"]), median(runs["naive"]), note


def neighbour_root(side: Side) -> None:
    """The neighbour's root: the benchmark's stack renamed NEIGHBOUR (another stack to the engine and its
    caches), and its patches."""
    (side.root / "stacks").mkdir(parents=True)
    text = (BENCH / "stacks" / f"{STACK}.yaml").read_text()
    renamed = re.sub(rf"^name: {STACK}$", f"name: {NEIGHBOUR}", text, count=1, flags=re.M)
    assert renamed != text, "the bench stack's name line moved"
    (side.root / "stacks" / f"{NEIGHBOUR}.yaml").write_text(renamed)
    shutil.copytree(BENCH / "patches", side.root / "patches")


def measure(echo=print) -> list[Result]:
    """Every measure, stackforge then the peer, back to back; one Result per measure."""
    with tempfile.TemporaryDirectory(prefix="stackforge-bench-") as tmp, serving() as urls:
        sets = [f"indexes.{n}.url={u}" for n, u in urls.items()]
        ours, peer = (Side(who, Path(tmp) / who, [*sets, _own_ccache()]) for who in ("stackforge", "naive"))
        default = Side("stackforge-ca", Path(tmp) / "stackforge-ca", [*sets, _own_ccache()])
        for side in (ours, peer, default):
            shutil.copytree(BENCH / "stacks", side.root / "stacks")
            shutil.copytree(BENCH / "patches", side.root / "patches")
        neighbour = Side("neighbour", Path(tmp) / "neighbour", [*sets, _own_ccache()])
        neighbour_root(neighbour)
        try:
            return _measure(ours, peer, default, neighbour, urls, echo)
        finally:
            remove_images(ours, peer, default, neighbour)
            forget_records(urls, echo)


def _measure(ours: Side, peer: Side, default: Side, neighbour: Side, urls: dict[str, str], echo) -> list[Result]:
    results: list[Result] = []
    for name, goal in MEASURES:
        note = ""
        if name == "no-op rebuild":
            # A user's first build of the stack is a plain one: it fills the shared ccache (a clean build's ccache
            # is its own, and goes with it). Under the cold builds' compiler identity every step would come from
            # their layers, so under a new one: the kernel compiles.
            ours.overrides[-1] = _own_ccache()
            first = build_ours(ours)
            echo(f"first plain build (not timed): {first.seconds:.1f} s")
        elif name == "one-patch rebuild":
            change_patch(ours.root)
            change_patch(peer.root)
            # Right before it, a neighbour's clean build: another stack, another compiler identity.
            other = build_ours(neighbour, no_cache=True, stack=NEIGHBOUR)
            note = f"right after a neighbour's clean build of another stack ({other.seconds:.0f} s); "
        elif name == "one-pin change":
            change_pin(ours.root)
            change_pin(peer.root)
        if name == "cold build":
            a, default.runs[name], b, note = cold_rounds(ours, default, peer, urls)
            ours.runs[name], peer.runs[name] = a, b
        else:
            a = ours.runs[name] = build_ours(ours)
            b = peer.runs[name] = build_peer(peer, urls)
        if name == "one-patch rebuild":
            ran = a.ran()
            deps = [s for s in ran if s.startswith("deps:")]
            stages = sorted({s.split(":", 1)[0] for s in ran})
            note += f"stages that ran: {', '.join(stages)}; dependency steps re-run: {len(deps)}"
            if deps:
                note += " (" + "; ".join(deps) + ")"
        elif name in ("no-op rebuild", "one-pin change"):
            stages = sorted({s.split(":", 1)[0] for s in a.ran()})
            note = f"stages that ran: {', '.join(stages) or 'none'}"
        results.append(Result(name, a.seconds, b.seconds, goal, PEER, note, id=IDS.get(name)))
        echo(f"{name}: stackforge {a.seconds:.1f} s, naive {b.seconds:.1f} s  {note}")
    shipped, b = default.runs["cold build"], peer.runs["cold build"]
    name = "cold build, host CA bundle mounted"
    note = "the default --ca-bundle auto, in the cold build's rounds; the peer's cold build"
    results.append(Result(name, shipped.seconds, b.seconds, DEFAULT_COLD_GOAL, PEER, note, id="cold-default"))
    echo(f"{name}: stackforge {shipped.seconds:.1f} s, naive {b.seconds:.1f} s (cold build)")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", action="store_true", help="also write build/bench/results.json")
    parser.add_argument("--tools", type=Path, help="measure the stackforge in this tools/ directory")
    args = parser.parse_args()
    if args.tools:
        TOOLS[0] = args.tools.resolve()
    results = measure(echo=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(results))
    print(
        "\nTimes are wall-clock seconds on a machine whose 2 cores are shared with other work: noisy; compare the ratios."
    )
    if args.json:
        print(f"written: {write(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
