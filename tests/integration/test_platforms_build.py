"""A platform line built and gated on its own platform: example-multi's linux/arm64 line on this engine, under
emulation when the host is x86_64 (scripts/engine-setup.sh registers the handler), from the arm64 base image
(scripts/base-image.sh --platform linux/arm64). The gate, the read-only gate and the inventory run in the arm64
image and say so (``uname -m`` inside: aarch64); the image's config is arm64 and its target runs. Then both lines
published under one tag to a loopback registry: an OCI index with a manifest per platform, each with its record and
SBOM, the alias moved with the index.

The module runs on both image stores (``image_store``): the first engine's classic store, and a second engine with
the containerd image store, where an image's id is its manifest's or index's digest and publish reads the image
from that store's content store (its layers as stored; ``docker save`` only when the store cannot be read). Emulated builds are slow on a small
host: one build per line and store, shared by the module's tests. The containerd half's builds are clean (a new
engine: no build cache, empty cache mounts); the classic half's come from this engine's cache. The two stores'
images of each line have one config and the same files, each store writing the layers its way. On each store,
``verify --all-platforms --rebuild`` of the index (its copy) builds every line again with no cache and finds the
same config and manifest per platform, so the same index: on the containerd store two clean builds, on the classic
store a clean build against the cached one.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from stackforge.publish import layerdiff
from tests.fixtures import run_names
from tests.fixtures.stack_support import RootSpec, repo_root

REPO = Path(__file__).resolve().parents[2]
DATE = "20261206"
pytestmark = [pytest.mark.engine, pytest.mark.registry]


def stackforge(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(env or os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )


@pytest.fixture(scope="module")
def arm_base(image_store, arm_base_image) -> str:
    """The arm64 base image (built once on the first engine when it is missing, tests/integration/conftest.py;
    loaded into a second engine from there)."""
    image_store.load(arm_base_image)
    return arm_base_image


@pytest.fixture(scope="module")
def builds(tmp_path_factory, image_store, arm_base, base_image):
    """Both lines of example-multi built in one root on the store's engine: (root, tag, {line: outcome}, store)."""
    root = repo_root(tmp_path_factory.mktemp(f"platforms-{image_store.name}"), RootSpec(parts=("stacks", "patches")))
    # one local tag on both stores (each store is its own engine): the image carries its --set values
    # (/stackforge/stack/overrides.json), so a tag of each store's own would make the two stores' images two
    tag = run_names.image("example-multi", "multi")
    outcomes = {}
    env = dict(image_store.env, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    # the two lines at once: the amd64 line's downloads and disk waits beside the arm64 line's emulated compiles (each
    # writes to files, so neither waits on a full pipe)
    to = tmp_path_factory.mktemp(f"platforms-{image_store.name}-logs")
    logs = {line: (to / f"build-{line}.out", to / f"build-{line}.err") for line in ("arm64", "amd64")}
    procs = {}
    for line, (out, err) in logs.items():
        with open(out, "w") as stdout, open(err, "w") as stderr:
            procs[line] = subprocess.Popen([sys.executable, "-m", "stackforge", "--root", str(root), "build",
                                            "example-multi", "--platform", line, "--set", f"tags.local={tag}",
                                            "--json"], stdout=stdout, stderr=stderr, env=env)  # fmt: skip
    try:
        for line, proc in procs.items():
            proc.wait(timeout=3600)
            out, err = (path.read_text(encoding="utf-8", errors="replace") for path in logs[line])
            assert proc.returncode == 0, out + err[-20000:]
            outcomes[line] = json.loads(out)
        yield root, tag, outcomes, image_store
    finally:
        for proc in procs.values():
            if proc.poll() is None:  # a build left when the other failed: stopped as an interrupt stops it
                proc.terminate()
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for outcome in outcomes.values():
            image_store.docker("image", "rm", "-f", outcome["tag"])


@pytest.fixture(scope="module")
def arm_build(builds):
    root, _, outcomes, store = builds
    return root, outcomes["arm64"], store


def test_the_arm64_line_is_built_for_arm64_and_tagged_apart(arm_build):
    root, outcome, store = arm_build
    assert outcome["tag"].endswith("-arm64")  # the line's local tag is its own, beside the stack's
    inspect = json.loads(store.docker("image", "inspect", outcome["tag"], check=True).stdout)[0]
    assert (inspect["Os"], inspect["Architecture"]) == ("linux", "arm64")
    evidence = Path(outcome["evidence"])
    assert evidence.parent.parent == root / "build" / "example-multi@arm64"


def test_the_gates_and_the_inventory_ran_on_arm64(arm_build):
    _, outcome, _ = arm_build
    evidence = Path(outcome["evidence"])
    gate = (evidence / "gate.txt").read_text(encoding="utf-8").splitlines()
    assert gate[0] == "PASS machine aarch64"
    assert "read-only: PASS machine aarch64" in (evidence / "gate-readonly.txt").read_text(encoding="utf-8")
    assert json.loads((evidence / "inventory.json").read_text(encoding="utf-8"))["machine"] == "aarch64"
    assert "PASS probe  speedups-compiled result=compiled" in gate  # the probe ran the arm64 build of the C extension


def test_the_arm64_image_runs_its_target(arm_build):
    _, outcome, store = arm_build
    run = store.docker("run", "--rm", "-i", "--network=none", outcome["tag"], input="<a & b>", timeout=300)
    assert (run.returncode, run.stdout) == (0, "&lt;a &amp; b&gt;"), run.stderr
    machine = store.docker("run", "--rm", "--network=none", "--entrypoint", "uname", outcome["tag"], "-m", timeout=300)
    assert machine.stdout.strip() == "aarch64"


# ------------------------------------------------------------------ one tag, one index


def manifest(registry: str, repo: str, ref: str) -> requests.Response:
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    return requests.get(f"http://{registry}/v2/{repo}/manifests/{ref}", headers={"Accept": accept}, timeout=10)


#: what each store's half of the module published (``publish --json``), by store: the classic half runs first
PUBLISHED: dict[str, dict] = {}


@pytest.fixture(scope="module")
def published(builds, registry):
    root, tag, outcomes, store = builds
    ns = f"{run_names.NS}/{store.name}"
    args = ("publish", "example-multi", "--platform", "all", "--registry", f"{registry}/{ns}", "--date", DATE,
            "--set", f"tags.local={tag}", "--json")  # fmt: skip
    proc = stackforge(root, *args, env=store.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    PUBLISHED[store.name] = json.loads(proc.stdout)
    return root, PUBLISHED[store.name], f"{ns}/stackforge-example-multi", args, store


def test_the_tag_is_an_index_with_a_manifest_per_platform(published, registry):
    _, ev, repo, _, _ = published
    inspect = subprocess.run(
        ["docker", "buildx", "imagetools", "inspect", "--raw", f"{registry}/{repo}:{ev['tag']}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inspect.returncode == 0, inspect.stderr
    index = json.loads(inspect.stdout)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    platforms = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in index["manifests"]}
    assert platforms == {
        "linux/amd64": ev["platforms"]["amd64"]["digest"],
        "linux/arm64": ev["platforms"]["arm64"]["digest"],
    }
    # each platform's manifest is the published form of the image its build gated
    for line, digest in (("amd64", platforms["linux/amd64"]), ("arm64", platforms["linux/arm64"])):
        child = manifest(registry, repo, digest).json()
        assert child["config"]["digest"] == ev["platforms"][line]["image_id"]
        config = requests.get(f"http://{registry}/v2/{repo}/blobs/{child['config']['digest']}", timeout=10).json()
        assert config["architecture"] == line
    assert ev["aliases"] == {"py3.11-latest": "moved"}
    assert manifest(registry, repo, "py3.11-latest").headers["Docker-Content-Digest"] == ev["digest"]


def test_each_platform_has_its_own_record_and_sbom(published):
    root, ev, _, _, store = published
    for line, build in (("amd64", "example-multi"), ("arm64", "example-multi@arm64")):
        latest = root / "build" / build / "evidence" / "latest"
        record = json.loads((latest / "record.json").read_text(encoding="utf-8"))
        assert record["record"]["digest"] == ev["platforms"][line]["digest"]
        assert record["record"]["image_store"] == store.name  # the store the image was built in
        assert record["record"]["tags"] == [ev["tag"], "py3.11-latest"]
        assert record["attached"]["fallback_tag"] == "sha256-" + ev["platforms"][line]["digest"].split(":")[1]
        publish = json.loads((latest / "publish.json").read_text(encoding="utf-8"))
        assert publish["index"]["digest"] == ev["digest"] and publish["platform"] == f"linux/{line}"
        gated = json.loads((latest / "result.json").read_text(encoding="utf-8"))["image_id"]
        assert publish.get("gated_image_id", publish["image_id"]) == gated  # the image this line's gate ran in


def test_the_same_images_publish_the_same_index_once(published, registry):
    root, ev, repo, args, store = published
    again = stackforge(root, *args, env=store.env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["digest"] == ev["digest"]  # the index's bytes depend on its images only
    assert json.loads(again.stdout)["status"] == "already-published"
    tags = requests.get(f"http://{registry}/v2/{repo}/tags/list", timeout=10).json()["tags"]
    assert [t for t in tags if t.startswith("py3.11-markupsafe")] == [ev["tag"]]


def published_image(registry: str, repo: str, digest: str) -> tuple[dict, list[str]]:
    """(config, layer digests) of a published image."""
    m = manifest(registry, repo, digest).json()
    config = requests.get(f"http://{registry}/v2/{repo}/blobs/{m['config']['digest']}", timeout=10).json()
    return config, [layer["digest"] for layer in m["layers"]]


def layer_entries(registry: str, repo: str, digest: str) -> dict[str, layerdiff.Entry]:
    blob = requests.get(f"http://{registry}/v2/{repo}/blobs/{digest}", timeout=60).content
    return layerdiff.entries(gzip.GzipFile(fileobj=io.BytesIO(blob)))


OPAQUE = ".wh..wh..opq"


def encodings(classic: dict[str, layerdiff.Entry], containerd: dict[str, layerdiff.Entry]) -> tuple[list, list]:
    """How two layers that make one change differ: (directories only the classic layer holds, anything else). The
    classic store's differ (overlay2's upper directory) writes every directory a step's container touched (``/etc``,
    where the runtime mounts /etc/hosts and /etc/resolv.conf; ``/tmp``) and an opaque whiteout for a directory
    removed and made again; the containerd store's writes a directory only when its mode or owner changed, and a
    whiteout for each entry removed; each writes a whiteout's own mode and time its way."""
    opaque = {path.removesuffix(OPAQUE).rstrip("/") for path in classic if path.rsplit("/", 1)[-1] == OPAQUE}

    def under_opaque(path: str) -> bool:
        return any(path.startswith(f"{d}/") for d in opaque)

    dirs, other = [], []
    for path in sorted(set(classic) | set(containerd)):
        a, b = classic.get(path), containerd.get(path)
        name = path.rsplit("/", 1)[-1]
        if a == b or (name == OPAQUE and b is None) or (name.startswith(".wh.") and a is None and under_opaque(path)):
            continue
        if name.startswith(".wh.") and a is not None and b is not None and a.content == b.content:
            continue  # one whiteout: its mode, owner and time mean nothing, and the two differs write their own
        if b is None and a is not None and a.type == "directory":
            dirs.append((path, a))
        else:
            other.append(f"/{path}: classic {a}, containerd {b}")
    return dirs, other


def unpacked(tree: dict[str, layerdiff.Entry], layer: dict[str, layerdiff.Entry]) -> dict[str, layerdiff.Entry]:
    """``tree`` with ``layer`` applied as an engine applies it: its whiteouts and opaque directories hide what the
    layers below hold, then its entries are added (a non-directory replaces a directory with all under it)."""

    def drop(path: str) -> None:
        if (tree.pop(path, None) or layerdiff.Entry("", "", "", "", "", 0)).type == "directory":
            for key in [k for k in tree if k.startswith(f"{path}/")]:
                del tree[key]

    for path in layer:
        parent, _, name = path.rpartition("/")
        if name == OPAQUE:
            for key in [k for k in tree if parent and k.startswith(f"{parent}/")]:
                del tree[key]
        elif name.startswith(".wh."):
            drop(f"{parent}/{name[4:]}" if parent else name[4:])
    for path, entry in layer.items():
        if not path.rpartition("/")[2].startswith(".wh."):
            if entry.type != "directory" and path in tree:
                drop(path)
            tree[path] = entry
    return tree


@pytest.mark.parametrize("image_store", ["containerd"], indirect=True)  # once, after the classic half published
def test_the_two_stores_build_one_config_and_the_same_files(published, registry):
    """The containerd half's builds are clean (a new engine: no build cache, no cache mounts); the classic half's
    are this engine's. Each line's image on the two stores has one config (labels, the base by its config digest,
    history, times) but for the layers' diff ids, and its layers hold the same files; the layers encode directories
    and removals each store's way (:func:`encodings`), so the layers' digests differ; the images unpack to one tree
    but for directories' times."""
    _, ev, repo, _, _ = published
    classic = PUBLISHED.get("classic")
    assert classic is not None, "the classic store's half of this module did not publish in this session"
    classic_repo = f"{run_names.NS}/classic/stackforge-example-multi"
    for line in ("amd64", "arm64"):
        (ours, our_layers), (theirs, their_layers) = (
            published_image(registry, repo, ev["platforms"][line]["digest"]),
            published_image(registry, classic_repo, classic["platforms"][line]["digest"]),
        )
        assert {**ours, "rootfs": None} == {**theirs, "rootfs": None}
        assert len(our_layers) == len(their_layers) and our_layers[:2] == their_layers[:2]  # the base's own
        trees: list[dict[str, layerdiff.Entry]] = [{}, {}]
        for i, (a, b) in enumerate(zip(their_layers, our_layers)):
            classic_layer = layer_entries(registry, classic_repo, a)
            layer = classic_layer if a == b else layer_entries(registry, repo, b)
            assert encodings(classic_layer, layer)[1] == [], f"{line} layer {i}"
            unpacked(trees[0], classic_layer)
            unpacked(trees[1], layer)
        # the two images unpack to one tree: the same paths, types, contents, links, modes and owners, and every time
        # but those of the directories the classic store's layers hold again
        timeless = [{p: replace(e, time=0) if e.type == "directory" else e for p, e in t.items()} for t in trees]
        assert timeless[0] == timeless[1], layerdiff.first_entry(timeless[0], timeless[1])


def test_verify_all_platforms_from_an_empty_directory(published, registry, installed_wheel, tmp_path):
    """With the CLI an operator installs from the wheel (tests/integration/conftest.py: installed_wheel)."""
    _, ev, repo, _, store = published
    empty = tmp_path / "empty"
    empty.mkdir()
    ref = f"{registry}/{repo}:{ev['tag']}"
    env = {k: v for k, v in store.env.items() if k not in ("PYTHONPATH", "STACKFORGE_ROOT")}
    env["STACKFORGE_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [str(installed_wheel.cli), "verify", ref, "--all-platforms"],
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"PASS index   {ref} resolves to {ev['digest']}, an index of linux/amd64, linux/arm64"
    assert f"PASS platform linux/arm64 {registry}/{repo}@{ev['platforms']['arm64']['digest']}" in lines
    # each image's record names the index's tag; each image's gate re-ran on its own machine
    assert (
        sum(line.startswith(f"PASS tag     {ev['tag']} (from the record) resolves to the index") for line in lines) == 2
    )
    assert any("PASS machine aarch64" in line for line in lines) and any(
        "PASS machine x86_64" in line for line in lines
    )
    assert lines[-1].startswith(f"verified {ref}: index, 2 platforms, ") and lines[-1].endswith("— 0 failed")


def test_verify_and_pull_pick_one_platform(published, registry):
    root, ev, repo, _, store = published
    ref = f"{registry}/{repo}:{ev['tag']}"
    proc = stackforge(root, "verify", ref, "--platform", "ppc64le", env=store.env)
    assert proc.returncode == 1
    assert "FAIL platform ppc64le: the index holds no image for it (linux/amd64, linux/arm64)" in proc.stdout
    pulled = stackforge(root, "pull", "example-multi", "--registry", f"{registry}/{repo.rsplit('/', 1)[0]}", "--date",
                        DATE, "--platform", "arm64", "--set", "tags.local=unused/x:y", env=store.env)  # fmt: skip
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert f"PASS platform linux/arm64 {registry}/{repo}@{ev['platforms']['arm64']['digest']}" in pulled.stdout
    # the tag names the platform's image it pulled: the engine's id of it is the arm64 image's config digest (the
    # classic store) or manifest digest (the containerd store, whose Docker 28 may describe no architecture for it)
    tagged = store.docker("image", "inspect", "--format", "{{.Id}}", ref, check=True).stdout.strip()
    arm64, amd64 = ev["platforms"]["arm64"], ev["platforms"]["amd64"]
    assert tagged in (arm64["image_id"], arm64["digest"]) and tagged not in (amd64["image_id"], amd64["digest"])


def test_a_copy_of_the_index_verifies_and_each_platform_rebuilds_identical(published, registry):
    """The copy carries each platform's record, so ``verify COPY --all-platforms --rebuild`` checks every platform's
    image there and builds each line again from its record with no cache (its own empty cache mounts; the arm64 line
    under emulation), normalized as the publisher does: the same config and manifest as the index lists, so the
    index, whose bytes are its manifests' (:func:`test_the_same_images_publish_the_same_index_once`), is the same. On
    the containerd store both builds are clean (the published one on a new engine); on the classic store the
    published one came from this engine's cache."""
    root, ev, repo, _, store = published
    dst = f"{registry}/{repo.rsplit('/', 1)[0]}/copied-multi:{ev['tag']}"
    copied = stackforge(root, "copy", f"{registry}/{repo}:{ev['tag']}", dst, env=store.env)
    assert copied.returncode == 0, copied.stdout + copied.stderr
    proc = stackforge(root, "verify", dst, "--all-platforms", "--rebuild", env=store.env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert f"PASS index   {dst} resolves to {ev['digest']}, an index of linux/amd64, linux/arm64" in proc.stdout
    sections = proc.stdout.split("PASS platform ")[1:]
    assert [s.split()[0] for s in sections] == ["linux/amd64", "linux/arm64"]
    for line, section in zip(("amd64", "arm64"), sections):
        assert section.split()[1] == f"{dst.rsplit(':', 1)[0]}@{ev['platforms'][line]['digest']}"
        assert section.count("PASS record  digest=") == 1  # the platform's own record came along
        rebuilt = [text for text in section.splitlines() if text.startswith(("PASS rebuild", "FAIL rebuild"))]
        assert len(rebuilt) == 1, section
        assert rebuilt[0].startswith(f"PASS rebuild identical: config {ev['platforms'][line]['image_id']}, ")
        assert rebuilt[0].endswith("(and the same manifest)"), rebuilt[0]
