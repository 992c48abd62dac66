"""Publishing for real: engine images, a docker-registry on 127.0.0.1, the fault-injecting proxy, the CLI.

Images are tiny and built by the engine (an imported rootfs plus a BuildKit layer), so a
publish takes well under a second; the library path is the production one.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
import requests

from stackforge.builder.records import evidence as evidence_dirs
from stackforge.clients.registry import RetryPolicy
from stackforge.errors import BuildFailed
from stackforge.publish.oci import DockerImage
from stackforge.stack.scheme import TagScheme
from tests.fixtures import run_names
from tests.fixtures.faulty_proxy import (
    BLOB_UPLOAD,
    MANIFEST_BY_DIGEST,
    MANIFEST_BY_TAG,
    Fault,
    FaultyProxy,
)
from tests.fixtures.publish_call import publish_with
from tests.fixtures.stack_support import RootSpec, repo_root

pytestmark = [pytest.mark.engine, pytest.mark.registry]

DATE = "20260929"
PREFIX = "v0.28.0-ph1-5.2.0-torch2.11.0.post2"  # what stacks/post2.yaml renders
SCHEME = TagScheme.from_prefix(PREFIX)
ALIAS = f"{PREFIX}-latest"
FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05, total_seconds=20)
ACCEPT = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


# ----------------------------------------------------------------------------------- helpers


def docker(*args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["docker", *args], input=input, capture_output=True)
    if proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {proc.stderr.decode()}")
    return proc.stdout.decode().strip()


def rootfs_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory):
    """Four distinct two-layer images built by the engine; removed at the end."""
    run = uuid.uuid4().hex[:8]
    base = f"{run_names.NS}/publish-base:{run}"
    docker("import", "-", base, input=rootfs_tar({"etc/os-release": b"ID=debian\n", "bin/note": b"base"}))
    refs = []
    for i in range(4):
        ctx = tmp_path_factory.mktemp(f"img{i}")
        (ctx / "payload.txt").write_text(f"image {i} of run {run}\n" * 50)
        (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY payload.txt /srv/payload.txt\n")
        ref = f"{run_names.NS}/publish:{run}-{i}"
        docker("buildx", "build", "--load", "-q", "-t", ref, str(ctx))
        refs.append(ref)
    yield refs
    subprocess.run(["docker", "image", "rm", "-f", *refs, base], capture_output=True)


def image_id(ref: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", ref)


@pytest.fixture
def ns():
    return f"t{uuid.uuid4().hex[:10]}"


def tags_of(registry: str, repo: str) -> list[str]:
    """The image tags of ``repo``; the ``sha256-<hex>`` tags holding publish records (the OCI 1.1 fallback
    for a registry without the referrers API) are left out."""
    r = requests.get(f"http://{registry}/v2/{repo}/tags/list", timeout=10)
    if r.status_code == 404:
        return []
    r.raise_for_status()
    return sorted(t for t in r.json().get("tags") or [] if not t.startswith("sha256-"))


def tag_state(registry: str, repo: str, tag: str) -> tuple[str, str]:
    """(manifest digest, config digest = image id) of a tag, read with plain HTTP."""
    r = requests.get(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=10)
    r.raise_for_status()
    return r.headers["Docker-Content-Digest"], r.json()["config"]["digest"]


def lib_publish(address: str, ns: str, ref: str, tmp_path: Path, **kw):
    kw.setdefault("aliases", (ALIAS,))
    kw.setdefault("policy", FAST)
    kw.setdefault("layer_cache", tmp_path / "layers")
    kw.setdefault("settle_seconds", 0.2)
    return publish_with(DockerImage(ref), f"{address}/{ns}/vllm", SCHEME, DATE, lock_dir=tmp_path / "locks", **kw)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A private copy of the stacks, so CLI runs own their build/ directory (one for the module: the shared
    ``root`` of tests/conftest.py is one per test)."""
    return repo_root(tmp_path_factory.mktemp("pubroot"), RootSpec(parts=("stacks", "patches")))


def cli_args(root: Path, registry: str, ref: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stackforge",
        "--root",
        str(root),
        "publish",
        "post2",
        "--registry",
        registry,
        "--date",
        DATE,
        "--set",
        f"tags.local={ref}",
        "--allow-ungated",
        "--out",
        str(out),
        "--retries",
        "4",
        *extra,
    ]


def cli_env(tmp_path: Path, lock_dir: Path | None = None) -> dict[str, str]:
    return dict(
        os.environ, STACKFORGE_CACHE=str(tmp_path / "cache"), STACKFORGE_LOCK_DIR=str(lock_dir or tmp_path / "locks")
    )


def cli(root: Path, registry: str, ref: str, out: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_args(root, registry, ref, out, *extra), capture_output=True, text=True, env=cli_env(tmp_path), timeout=300
    )


# ------------------------------------------------------------------------------------- tests


def test_r1_then_r2_on_one_date_and_the_repull_gives_the_same_image_id(registry, images, ns, tmp_path):
    repo = f"{ns}/vllm"
    a = lib_publish(registry, ns, images[0], tmp_path, verify_pull=True, evidence=tmp_path / "ev")
    b = lib_publish(registry, ns, images[1], tmp_path, verify_pull=True)
    assert (a.tag, b.tag) == (SCHEME.tag(DATE, 1), SCHEME.tag(DATE, 2))
    assert tags_of(registry, repo) == sorted([a.tag, b.tag, ALIAS])
    for result, ref in ((a, images[0]), (b, images[1])):
        digest, config = tag_state(registry, repo, result.tag)
        assert digest == result.digest and config == image_id(ref) == result.image_id
        assert result.verification["pull"]["identical"] is True
        assert result.verification["pull"]["image_id"] == image_id(ref)
    assert tag_state(registry, repo, ALIAS)[0] == b.digest
    evidence = json.loads((tmp_path / "ev" / "publish.json").read_text())
    assert evidence["tag"] == a.tag and evidence["digest"] == a.digest and evidence["size"] > 0
    assert evidence["verification"]["pull"]["identical"] is True and evidence["push_log"]


@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_a_node_without_the_image_pulls_it_back_identical(registry, engine, ns, tmp_path, compression):
    """Remove the local image after publishing, pull by tag and by digest: same image id, layers verified by the engine."""
    ref = f"{run_names.NS}/publish-pull:{ns}"
    docker("import", "-", ref, input=rootfs_tar({"srv/data": f"{ns} {compression}".encode() * 1000}))
    local_id = image_id(ref)
    r = lib_publish(registry, ns, ref, tmp_path, compression=compression, aliases=())
    assert r.verification["layers_present"] == 1
    manifest = requests.get(
        f"http://{registry}/v2/{ns}/vllm/manifests/{r.digest}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        timeout=30,
    ).json()
    suffix = {"gzip": "+gzip", "zstd": "+zstd", "none": ""}[compression]
    assert [d["mediaType"] for d in manifest["layers"]] == [f"application/vnd.oci.image.layer.v1.tar{suffix}"]
    docker("image", "rm", ref)
    pulled = f"{registry}/{ns}/vllm"
    try:
        docker("pull", f"{pulled}:{r.tag}")
        assert image_id(f"{pulled}:{r.tag}") == local_id
        docker("image", "rm", f"{pulled}:{r.tag}")
        docker("pull", f"{pulled}@{r.digest}")
        assert image_id(f"{pulled}@{r.digest}") == local_id
    finally:
        subprocess.run(["docker", "image", "rm", "-f", local_id], capture_output=True)


def test_a_tag_pushed_by_docker_is_never_overwritten(registry, images, ns, tmp_path):
    repo = f"{ns}/vllm"
    foreign = f"{registry}/{repo}:{SCHEME.tag(DATE, 1)}"
    docker("tag", images[2], foreign)
    try:
        docker("push", foreign)
    finally:
        docker("image", "rm", foreign)
    before = tag_state(registry, repo, SCHEME.tag(DATE, 1))
    r = lib_publish(registry, ns, images[0], tmp_path)
    assert r.tag == SCHEME.tag(DATE, 2)
    assert tag_state(registry, repo, SCHEME.tag(DATE, 1)) == before
    assert before[1] == image_id(images[2])
    again = lib_publish(registry, ns, images[2], tmp_path)  # the docker-pushed image is recognised by its image id
    assert again.status == "already-published" and again.tag == SCHEME.tag(DATE, 1)


def test_republishing_the_same_image_creates_nothing(registry, images, ns, tmp_path):
    with FaultyProxy(registry) as proxy:
        first = lib_publish(proxy.address, ns, images[0], tmp_path)
        proxy.log.clear()
        again = lib_publish(proxy.address, ns, images[0], tmp_path)
        writes = [e for e in proxy.log if e.method in ("PUT", "POST", "PATCH", "DELETE")]
    assert again.status == "already-published" and (again.tag, again.digest) == (first.tag, first.digest)
    assert writes == []
    assert tags_of(registry, f"{ns}/vllm") == sorted([first.tag, ALIAS])


def test_faults_on_blob_and_manifest_uploads_are_retried(registry, images, ns, tmp_path):
    faults = [
        Fault("status", BLOB_UPLOAD, "POST", status=503, times=2),
        Fault("reset", BLOB_UPLOAD + ".+digest=", "PUT"),
        Fault("status", BLOB_UPLOAD + ".+digest=", "PUT", status=429, retry_after="0"),
        Fault("status", MANIFEST_BY_DIGEST, "PUT", status=502),
        Fault("reset", MANIFEST_BY_TAG, "PUT"),
        Fault("reset-after-forward", MANIFEST_BY_TAG, "PUT"),
    ]
    with FaultyProxy(registry, faults) as proxy:
        r = lib_publish(proxy.address, ns, images[1], tmp_path)
        fired = proxy.fired()
    assert len(fired) == 7
    assert r.status == "published" and r.tag == SCHEME.tag(DATE, 1)
    assert tags_of(registry, f"{ns}/vllm") == sorted([r.tag, ALIAS])
    assert tag_state(registry, f"{ns}/vllm", r.tag) == (r.digest, image_id(images[1]))


def test_persistent_faults_leave_no_tag_and_a_rerun_completes(registry, images, ns, tmp_path):
    with FaultyProxy(registry, [Fault("status", BLOB_UPLOAD + ".+digest=", "PUT", status=503, times=None)]) as proxy:
        with pytest.raises(BuildFailed, match="no tag was created"):
            lib_publish(proxy.address, ns, images[0], tmp_path)
        assert tags_of(registry, f"{ns}/vllm") == []
        proxy.clear()
        proxy.add(Fault("reset", MANIFEST_BY_TAG, "PUT", times=None))
        with pytest.raises(BuildFailed, match="no tag was created"):
            lib_publish(proxy.address, ns, images[0], tmp_path)
        assert tags_of(registry, f"{ns}/vllm") == []
        proxy.clear()
        r = lib_publish(proxy.address, ns, images[0], tmp_path)
    assert r.tag == SCHEME.tag(DATE, 1)
    assert tags_of(registry, f"{ns}/vllm") == sorted([r.tag, ALIAS])


def test_a_publisher_killed_mid_push_leaves_no_tag_and_the_rerun_succeeds(registry, images, root, ns, tmp_path):
    with FaultyProxy(registry, [Fault("stall", BLOB_UPLOAD + ".+digest=", "PUT")]) as proxy:
        out = tmp_path / "out"
        proc = subprocess.Popen(
            cli_args(root, f"{proxy.address}/{ns}", images[3], out),
            env=cli_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            assert proxy.stalled.wait(timeout=120), "the publisher never reached a blob upload"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        proxy.release()
        assert proc.returncode == -signal.SIGKILL
        assert tags_of(registry, f"{ns}/vllm") == []
        rerun = cli(root, f"{proxy.address}/{ns}", images[3], out, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    tag = SCHEME.tag(DATE, 1)
    assert f"published: {registry.split(':')[0]}" in rerun.stdout and tag in rerun.stdout
    assert tags_of(registry, f"{ns}/vllm") == sorted([tag, ALIAS])
    evidence = json.loads((evidence_dirs.newest(out / "evidence") / "publish.json").read_text())
    assert evidence["status"] == "published" and evidence["tag"] == tag and evidence["stack"] == "post2"


@pytest.mark.parametrize("hosts", ["one-host", "two-hosts"])
def test_two_publishers_racing_on_one_date(registry, images, root, ns, tmp_path, hosts):
    """Both see no tag for the date; the proxy holds every tag PUT for 0.5 s to widen the race window.

    On one host the publish lock serialises tagging: no tag is ever written twice. Publishers on two
    hosts (separate locks) may write one tag both; the one whose write was replaced notices and
    takes the next revision. Either way the end is two distinct revisions, each with its own image.
    """

    def hold(_proxy):
        time.sleep(0.5)

    with FaultyProxy(registry, [Fault("hook", MANIFEST_BY_TAG, "PUT", hook=hold, times=None)]) as proxy:
        procs = []
        for i in (0, 1):
            locks = tmp_path / ("locks" if hosts == "one-host" else f"locks-{i}")
            procs.append(
                subprocess.Popen(
                    cli_args(root, f"{proxy.address}/{ns}", images[i], tmp_path / f"out{i}", "--json"),
                    env=cli_env(tmp_path, lock_dir=locks),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=300) for p in procs]
        tag_puts = [e for e in proxy.log if e.method == "PUT" and SCHEME.parse(e.path.rsplit("/", 1)[1])]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr
    results = [json.loads(stdout) for stdout, _ in outs]
    tags = sorted(r["tag"] for r in results)
    assert tags == [SCHEME.tag(DATE, 1), SCHEME.tag(DATE, 2)]
    for r, ref in zip(results, images[:2]):
        assert tag_state(registry, f"{ns}/vllm", r["tag"]) == (r["digest"], image_id(ref))
    written = [e.path.rsplit("/", 1)[1] for e in tag_puts]
    if hosts == "one-host":
        assert sorted(written) == tags  # each immutable tag written exactly once
    elif written.count(tags[0]) == 2:  # the race happened: the replaced writer noticed and moved on
        lost = [r for r in results if any(e["event"] == "tag-lost" for e in r["push_log"])]
        assert len(lost) == 1 and lost[0]["tag"] == tags[1]


def test_a_proxy_that_rewrites_the_manifest_is_caught(registry, images, root, ns, tmp_path):
    with FaultyProxy(registry, [Fault("rewrite-request", MANIFEST_BY_TAG, "PUT", times=None)]) as proxy:
        proc = cli(root, f"{proxy.address}/{ns}", images[0], tmp_path / "out", tmp_path)
    assert proc.returncode == 1
    assert "manifest digest mismatch" in proc.stderr and "Rolled back" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert tags_of(registry, f"{ns}/vllm") == []
    evidence = json.loads((evidence_dirs.newest(tmp_path / "out" / "evidence") / "publish-failed.json").read_text())
    assert evidence["status"] == "failed" and "mismatch" in evidence["error"] and evidence["tag_left"] is None

    with FaultyProxy(registry, [Fault("rewrite-response", MANIFEST_BY_TAG, "GET", times=None)]) as proxy:
        proc = cli(root, f"{proxy.address}/{ns}", images[0], tmp_path / "out", tmp_path)
    assert proc.returncode == 1 and "cannot be verified" in proc.stderr
    assert ALIAS not in tags_of(registry, f"{ns}/vllm")


def test_bad_input_is_a_clear_error_with_no_tag(registry, images, root, ns, tmp_path):
    closed = FaultyProxy(registry).start()
    dead = closed.address
    closed.stop()  # nothing listens there any more
    proc = cli(root, f"{dead}/{ns}", images[0], tmp_path / "out", tmp_path, "--retries", "2")
    assert proc.returncode == 2
    assert f"registry {dead} is not usable" in proc.stderr and "connection refused" in proc.stderr
    assert "Traceback" not in proc.stderr

    for bad in (f"http://{registry}/{ns}", f"{registry}/{ns.upper()}", f"{registry}/{ns}:tag", "mcconline/inference"):
        proc = cli(root, bad, images[0], tmp_path / "out", tmp_path)
        assert proc.returncode == 2, bad
        assert proc.stderr.startswith("error: ") and "fix:" in proc.stderr and "Traceback" not in proc.stderr

    proc = subprocess.run(
        [a for a in cli_args(root, f"{registry}/{ns}", images[0], tmp_path / "nobuild") if a != "--allow-ungated"],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
    )
    assert proc.returncode == 2 and "no gated build" in proc.stderr
    assert tags_of(registry, f"{ns}/vllm") == []


def _older_date(registry, ns, images, tmp_path):
    newer = lib_publish(registry, ns, images[0], tmp_path)
    older = publish_with(
        DockerImage(images[1]),
        f"{registry}/{ns}/vllm",
        SCHEME,
        "20260901",
        aliases=(ALIAS,),
        policy=FAST,
        lock_dir=tmp_path / "locks",
        layer_cache=tmp_path / "layers",
        settle_seconds=0.2,
    )
    return newer, older


def _gap_below_a_newer_revision(registry, ns, images, tmp_path):
    lib_publish(registry, ns, images[0], tmp_path)
    r2 = lib_publish(registry, ns, images[1], tmp_path)
    newer = lib_publish(registry, ns, images[2], tmp_path)
    gone = requests.delete(f"http://{registry}/v2/{ns}/vllm/manifests/{r2.digest}", timeout=10)
    assert gone.status_code == 202, gone.text
    gap = lib_publish(registry, ns, images[3], tmp_path)
    assert gap.tag == r2.tag
    return newer, gap


@pytest.mark.parametrize("scenario", [_older_date, _gap_below_a_newer_revision], ids=["older-date", "gap-below-newer"])
def test_alias_never_moves_back_on_a_real_registry(registry, images, ns, tmp_path, scenario):
    newer, late = scenario(registry, ns, images, tmp_path)
    repo = f"{ns}/vllm"
    assert late.status == "published" and late.tag in tags_of(registry, repo)
    assert late.aliases == {ALIAS: f"not moved: {newer.tag} is newer"}
    assert tag_state(registry, repo, ALIAS)[0] == newer.digest
