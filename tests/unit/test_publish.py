"""The publish algorithm against an in-process registry stub and the fault-injecting proxy.

Images come from ``docker save``-format archives written here (both the legacy and the
OCI-layout flavour), so these tests need no engine; tests/integration/test_publish_real_registry.py
runs the same paths against a real docker-registry and real engine images.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import io
import json
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stackforge.clients.registry import RetryPolicy
from stackforge.errors import BuildFailed, UserError
from stackforge.publish import publisher
from stackforge.publish.oci import OCI_LAYER_GZIP, OCI_LAYER_TAR, ArchiveImage, read_save_stream
from stackforge.stack.scheme import TagScheme, validate_date
from tests.fixtures.faulty_proxy import (
    BLOB_UPLOAD,
    MANIFEST,
    MANIFEST_BY_DIGEST,
    MANIFEST_BY_TAG,
    Fault,
    FaultyProxy,
)
from tests.fixtures.save_archive import add_file, layer_tar, save_archive
from tests.fixtures.stub_registry import StubRegistry, digest_of

PREFIX = "v0.28.0-ph1-5.2.0-torch2.11.0.post2"
SCHEME = TagScheme.from_prefix(PREFIX)
ALIAS = f"{PREFIX}-latest"
DATE = "20260929"
REPO = "mcconline/inference/vllm"
FAST = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.01, total_seconds=10)


# ------------------------------------------------------------------------------ archive helpers


@pytest.fixture
def images(tmp_path):
    """A factory of distinct tiny image archives sharing a base layer."""
    base = layer_tar({"etc/os-release": b"ID=debian\n"})
    made = {}

    def make(name: str, flavour: str = "legacy") -> ArchiveImage:
        path = tmp_path / f"{name}-{flavour}.tar"
        if path not in made:
            made[path] = save_archive(
                path, [base, layer_tar({f"app/{name}.txt": name.encode() * 100})], flavour=flavour
            )
        return ArchiveImage(path)

    return make


@pytest.fixture
def stub():
    with StubRegistry() as reg:
        yield reg


def run(
    address: str,
    image: ArchiveImage,
    tmp_path: Path,
    *,
    date: str = DATE,
    aliases: tuple[str, ...] = (ALIAS,),
    policy: RetryPolicy = FAST,
    layer_cache: Path | bool | None = None,
    settle_seconds: float | None = 0,
    evidence: Path | None = None,
    during_settle: Callable[[publisher.PublishResult], object] | None = None,
) -> publisher.PublishResult:
    options = publisher.PublishOptions(
        policy=policy,
        lock_dir=tmp_path / "locks",
        layer_cache=tmp_path / "layers" if layer_cache is None else layer_cache,
        settle_seconds=settle_seconds,
    )
    return publisher.publish(
        image,
        f"{address}/{REPO}",
        SCHEME,
        date,
        options,
        aliases=aliases,
        evidence=evidence,
        hooks=publisher.PublishHooks(during_settle=during_settle),
    )


def immutable(reg: StubRegistry) -> dict[str, str]:
    return {t: d for t, d in reg.tags.get(REPO, {}).items() if SCHEME.parse(t)}


# ------------------------------------------------------------------------------------ tag scheme


def test_tag_scheme_renders_and_parses():
    assert SCHEME.tag(DATE, 2) == f"{PREFIX}-20260929-r2"
    assert SCHEME.parse(f"{PREFIX}-20260929-r2") == ("20260929", 2)
    for other in [
        f"{PREFIX}-20260929-r0",
        f"{PREFIX}-20260929-r02",
        f"{PREFIX}-2026092-r1",
        ALIAS,
        f"{PREFIX}-20260929-r1-extra",
        f"x{PREFIX}-20260929-r1",
    ]:
        assert SCHEME.parse(other) is None, other
    tags = [SCHEME.tag(DATE, 1), SCHEME.tag(DATE, 3), SCHEME.tag("20260930", 1), ALIAS, "unrelated"]
    assert SCHEME.revisions(tags, DATE) == {1: SCHEME.tag(DATE, 1), 3: SCHEME.tag(DATE, 3)}
    assert SCHEME.newest(tags) == SCHEME.tag("20260930", 1)


def test_tag_scheme_from_render_and_validation():
    s = TagScheme.from_render(lambda d, r: f"vllm-{d}-r{r}-vllm-openai")
    assert (s.head, s.mid, s.tail) == ("vllm-", "-r", "-vllm-openai")
    assert s.tag(DATE, 4) == "vllm-20260929-r4-vllm-openai"
    with pytest.raises(UserError, match="date once"):
        TagScheme.from_render(lambda d, r: f"fixed-r{r}")
    with pytest.raises(UserError, match="not a valid OCI tag"):
        TagScheme.from_prefix("x" * 120).tag(DATE, 1)


def test_validate_date():
    assert validate_date("20260929") == "20260929"
    assert len(validate_date(None)) == 8
    for bad in ["2026-09-29", "20261399", "2026092", "today"]:
        with pytest.raises(UserError, match="YYYYMMDD|invalid publish date"):
            validate_date(bad)


# ------------------------------------------------------------------------------ archive reading


def test_both_save_flavours_give_the_same_deterministic_manifest(tmp_path):
    layers = [layer_tar({"a": b"1"}), layer_tar({"b": b"2" * 5000}), layer_tar({"a": b"1"})]
    save_archive(tmp_path / "legacy.tar", layers, flavour="legacy")
    save_archive(tmp_path / "oci.tar", layers, flavour="oci")
    out = []
    for name in ["legacy.tar", "oci.tar", "legacy.tar"]:
        with open(tmp_path / name, "rb") as fh:
            out.append(read_save_stream(fh, tmp_path / f"work-{len(out)}"))
    assert out[0].digest == out[1].digest == out[2].digest
    img = out[0]
    assert [l.media_type for l in img.layers] == [OCI_LAYER_GZIP] * 3
    assert img.layers[0].digest == img.layers[2].digest  # the repeated (symlinked) layer
    assert len(img.unique_blobs()) == 3  # config + two distinct layers
    assert [l.diff_id for l in img.layers] == [digest_of(l) for l in layers]
    assert gzip.decompress(img.layers[1].path.read_bytes()) == layers[1]
    doc = json.loads(img.manifest)
    assert doc["config"]["digest"] == img.image_id and doc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert img.size == len(img.manifest) + sum(b.size for b in img.unique_blobs())


def test_uncompressed_and_precompressed_layers(tmp_path):
    layer = layer_tar({"f": b"data" * 100})
    save_archive(tmp_path / "a.tar", [layer])
    with open(tmp_path / "a.tar", "rb") as fh:
        img = read_save_stream(fh, tmp_path / "w1", compression="none")
    assert img.layers[0].media_type == OCI_LAYER_TAR and img.layers[0].digest == digest_of(layer)
    gz = gzip.compress(layer, mtime=0)
    save_archive(tmp_path / "b.tar", [layer], flavour="oci", stored=[gz])
    with open(tmp_path / "b.tar", "rb") as fh:
        img = read_save_stream(fh, tmp_path / "w2")
    assert img.layers[0].media_type == OCI_LAYER_GZIP and img.layers[0].digest == digest_of(gz)


def test_a_containerd_store_save_is_read_by_the_index_digest_it_names_the_image_by(tmp_path):
    layers = [layer_tar({"a": b"1"}), layer_tar({"b": b"2" * 5000})]
    stored = [layers[0], gzip.compress(layers[1], mtime=0)]  # a loaded layer as it came, a built one compressed
    index_id = save_archive(tmp_path / "c.tar", layers, flavour="containerd", stored=stored)
    save_archive(tmp_path / "o.tar", layers, flavour="oci")
    with open(tmp_path / "c.tar", "rb") as fh:
        img = read_save_stream(fh, tmp_path / "w1", expected_id=index_id)
    with open(tmp_path / "o.tar", "rb") as fh:
        plain = read_save_stream(fh, tmp_path / "w2")
    assert index_id != img.image_id == plain.image_id  # the config the index names, not the attestation's
    assert [l.diff_id for l in img.layers] == [digest_of(l) for l in layers]  # the compressed one's from the config
    assert img.layers[1].media_type == OCI_LAYER_GZIP and img.layers[1].digest == digest_of(stored[1])
    with open(tmp_path / "c.tar", "rb") as fh, pytest.raises(BuildFailed, match="holds no image with id"):
        read_save_stream(fh, tmp_path / "w3", expected_id=digest_of(b"another image"))


def test_a_compressed_blob_that_is_not_its_name_is_refused(tmp_path):
    layer = layer_tar({"f": b"x" * 100})
    gz = gzip.compress(layer, mtime=0)
    save_archive(tmp_path / "c.tar", [layer], flavour="containerd", stored=[gz])
    with tarfile.open(tmp_path / "c.tar") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]
    with tarfile.open(tmp_path / "bad.tar", "w") as tar:
        for member, data in members:
            if member.name == f"blobs/sha256/{digest_of(gz).split(':')[1]}":
                data = gzip.compress(layer_tar({"f": b"y" * 100}), mtime=0)
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with open(tmp_path / "bad.tar", "rb") as fh, pytest.raises(BuildFailed, match="the export is corrupt"):
        read_save_stream(fh, tmp_path / "w")


def test_corrupt_layer_is_caught(tmp_path):
    layer = layer_tar({"f": b"x"})
    save_archive(tmp_path / "bad.tar", [layer], diff_ids=[digest_of(b"something else")])
    with open(tmp_path / "bad.tar", "rb") as fh, pytest.raises(BuildFailed, match="hashes to"):
        read_save_stream(fh, tmp_path / "w")


def test_archive_without_manifest_is_refused(tmp_path):
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        add_file(tar, "hello.txt", b"hi")
    with open(tmp_path / "x.tar", "rb") as fh, pytest.raises(BuildFailed, match="no manifest.json"):
        read_save_stream(fh, tmp_path / "w")


# -------------------------------------------------------------------------------- the algorithm


def test_r1_then_r2_on_the_same_date_and_r1_on_the_next(stub, images, tmp_path):
    a = run(stub.address, images("a"), tmp_path)
    b = run(stub.address, images("b"), tmp_path)
    c = run(stub.address, images("c"), tmp_path, date="20260930")
    assert (a.status, a.tag) == ("published", SCHEME.tag(DATE, 1))
    assert (b.status, b.tag) == ("published", SCHEME.tag(DATE, 2))
    assert c.tag == SCHEME.tag("20260930", 1)
    assert immutable(stub) == {a.tag: a.digest, b.tag: b.digest, c.tag: c.digest}
    assert len({a.digest, b.digest, c.digest}) == 3
    assert stub.tag_digest(REPO, ALIAS) == c.digest
    assert stub.overwrites == [(REPO, ALIAS, a.digest, b.digest), (REPO, ALIAS, b.digest, c.digest)]
    for r in (a, b, c):
        assert r.verification["tag_digest"] == r.digest == r.verification["pushed_digest"]
        assert r.verification["image_id_matches"] is True
        assert r.image_id == digest_of(stub.blobs[r.image_id])


def test_same_image_again_publishes_nothing(stub, images, tmp_path):
    first = run(stub.address, images("a"), tmp_path)
    stub.requests.clear()
    again = run(stub.address, images("a", flavour="oci"), tmp_path)
    assert again.status == "already-published" and again.tag == first.tag and again.digest == first.digest
    assert again.aliases == {ALIAS: "unchanged"}
    assert [m for m, _ in stub.requests if m in ("PUT", "POST", "DELETE")] == []
    assert immutable(stub) == {first.tag: first.digest}


def test_existing_tags_of_other_images_are_never_overwritten(stub, images, tmp_path):
    other = [
        stub.put_image(REPO, SCHEME.tag(DATE, n), json.dumps({"o": n, "rootfs": {"diff_ids": []}}).encode(), [])
        for n in (1, 2)
    ]
    r = run(stub.address, images("a"), tmp_path)
    assert r.tag == SCHEME.tag(DATE, 3)
    assert immutable(stub) == {SCHEME.tag(DATE, 1): other[0], SCHEME.tag(DATE, 2): other[1], r.tag: r.digest}
    assert [o for o in stub.overwrites if o[1] != ALIAS] == []


def test_revision_is_the_first_free_one_of_the_date(stub, images, tmp_path):
    """A gap left by a deleted tag is reused: r1 and r3 exist, so the next publish is r2, the one after r4."""
    other = {
        n: stub.put_image(REPO, SCHEME.tag(DATE, n), json.dumps({"o": n, "rootfs": {"diff_ids": []}}).encode(), [])
        for n in (1, 3)
    }
    stub.put_image(REPO, SCHEME.tag("20260928", 2), b'{"o":"yesterday","rootfs":{"diff_ids":[]}}', [])  # another date
    a = run(stub.address, images("a"), tmp_path)
    b = run(stub.address, images("b"), tmp_path)
    assert (a.tag, b.tag) == (SCHEME.tag(DATE, 2), SCHEME.tag(DATE, 4))
    assert immutable(stub) == {
        SCHEME.tag(DATE, 1): other[1],
        SCHEME.tag(DATE, 3): other[3],
        a.tag: a.digest,
        b.tag: b.digest,
        SCHEME.tag("20260928", 2): stub.tag_digest(REPO, SCHEME.tag("20260928", 2)),
    }
    assert [o for o in stub.overwrites if o[1] != ALIAS] == []


def test_tag_that_appears_in_a_gap_before_the_check_takes_the_next_free_revision(stub, images, tmp_path):
    """r2 exists; r1 appears between the tag list and the HEAD: r2 is skipped too, r3 is written."""
    stub.put_image(REPO, SCHEME.tag(DATE, 2), b'{"r2":1,"rootfs":{"diff_ids":[]}}', [])
    intruder = {}

    def concurrent(_proxy):
        intruder["d"] = stub.put_image(REPO, SCHEME.tag(DATE, 1), b'{"intruder":1,"rootfs":{"diff_ids":[]}}', [])

    with FaultyProxy(
        stub.address,
        [Fault("hook", MANIFEST_BY_TAG.replace("[^/?]+$", SCHEME.tag(DATE, 1) + "$"), "HEAD", hook=concurrent)],
    ) as proxy:
        r = run(proxy.address, images("a"), tmp_path)
    assert r.tag == SCHEME.tag(DATE, 3)
    assert stub.tag_digest(REPO, SCHEME.tag(DATE, 1)) == intruder["d"]
    assert [e["event"] for e in r.push_log].count("tag-appeared") == 1
    assert [o for o in stub.overwrites if o[1] != ALIAS] == []


def test_tag_that_appears_before_the_check_takes_the_next_revision(stub, images, tmp_path):
    intruder = {}

    def concurrent(_proxy):
        intruder["d"] = stub.put_image(REPO, SCHEME.tag(DATE, 1), b'{"intruder":1,"rootfs":{"diff_ids":[]}}', [])

    with FaultyProxy(
        stub.address,
        [Fault("hook", MANIFEST_BY_TAG.replace("[^/?]+$", SCHEME.tag(DATE, 1) + "$"), "HEAD", hook=concurrent)],
    ) as proxy:
        r = run(proxy.address, images("a"), tmp_path)
    assert r.tag == SCHEME.tag(DATE, 2)
    assert stub.tag_digest(REPO, SCHEME.tag(DATE, 1)) == intruder["d"]
    assert [e["event"] for e in r.push_log].count("tag-appeared") == 1
    assert [o for o in stub.overwrites if o[1] != ALIAS] == []


def test_tag_taken_over_after_the_put_moves_on_to_the_next_revision(stub, images, tmp_path):
    """Another host writes the same tag right after our PUT (no conditional PUT in the API)."""
    tag1 = SCHEME.tag(DATE, 1)
    other = {}

    def overwrite_ours(_proxy):
        other["d"] = stub.put_image(REPO, tag1, b'{"other-host":1,"rootfs":{"diff_ids":[]}}', [])

    with FaultyProxy(stub.address, [Fault("hook", rf"/manifests/{tag1}$", "GET", hook=overwrite_ours)]) as proxy:
        r = run(proxy.address, images("a"), tmp_path)
    assert r.status == "published" and r.tag == SCHEME.tag(DATE, 2)
    assert stub.tag_digest(REPO, tag1) == other["d"]
    assert stub.tag_digest(REPO, ALIAS) == r.digest
    assert "tag-lost" in [e["event"] for e in r.push_log]


def test_publishers_on_one_host_never_race(stub, images, tmp_path):
    """Two publishers, one date, widened HEAD→PUT window: the host lock serialises tagging."""

    def slow_put(repo, tag):
        time.sleep(0.2)

    stub.before_tag_put = slow_put
    imgs = [images("a"), images("b")]
    results: list[Any] = [None, None]
    errors: list[Exception] = []

    def go(i):
        try:
            results[i] = run(stub.address, imgs[i], tmp_path, aliases=())
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r.tag for r in results) == [SCHEME.tag(DATE, 1), SCHEME.tag(DATE, 2)]
    assert stub.overwrites == []
    assert immutable(stub) == {r.tag: r.digest for r in results}


def test_faults_on_blob_and_manifest_uploads_are_retried(stub, images, tmp_path):
    faults = [
        Fault("status", BLOB_UPLOAD, "POST", status=503, times=2),
        Fault("reset", BLOB_UPLOAD + ".+digest=", "PUT"),
        Fault("status", BLOB_UPLOAD + ".+digest=", "PUT", status=429, retry_after="0"),
        Fault("status", MANIFEST_BY_DIGEST, "PUT", status=500),
        Fault("reset", MANIFEST_BY_DIGEST, "PUT"),
        Fault("reset-after-forward", MANIFEST_BY_TAG, "PUT"),  # the tag lands, the answer is lost
    ]
    with FaultyProxy(stub.address, faults) as proxy:
        r = run(proxy.address, images("a"), tmp_path)
        fired = [e.action for e in proxy.fired()]
    assert r.status == "published" and r.tag == SCHEME.tag(DATE, 1)
    assert sorted(fired) == sorted(f.action for f in faults for _ in range(f.times))
    assert immutable(stub) == {r.tag: r.digest}
    assert stub.overwrites == []
    assert sum(1 for e in r.push_log if e["event"] == "retry") >= 7


def test_persistent_upload_failure_leaves_no_tag_and_a_rerun_succeeds(stub, images, tmp_path):
    with FaultyProxy(
        stub.address, [Fault("status", BLOB_UPLOAD + ".+digest=", "PUT", status=503, times=None)]
    ) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path, evidence=tmp_path / "ev")
        assert "no tag was created" in exc.value.message and "gave up after 5 attempt" in exc.value.message
        assert exc.value.exit_code == 1
        assert stub.tags.get(REPO, {}) == {}
        failed = json.loads((tmp_path / "ev" / "publish-failed.json").read_text())
        assert failed["status"] == "failed" and failed["tag_left"] is None and failed["push_log"]
        proxy.clear()
        r = run(proxy.address, images("a"), tmp_path, evidence=tmp_path / "ev")
    assert r.tag == SCHEME.tag(DATE, 1)
    assert json.loads((tmp_path / "ev" / "publish.json").read_text())["status"] == "published"


def complete(reg: StubRegistry, digest: str) -> bool:
    """Whether the registry holds the manifest ``digest`` and every blob it names."""
    body, _ = reg.manifests[digest]
    doc = json.loads(body)
    return all(d["digest"] in reg.blobs for d in [doc["config"], *doc["layers"]])


@pytest.mark.parametrize("action", ["status-mid-body", "reset-mid-body"])
def test_a_blob_upload_broken_in_the_middle_is_started_again(stub, images, tmp_path, action):
    fault = Fault(action, BLOB_UPLOAD + ".+digest=", "PUT", status=500, times=2)
    with FaultyProxy(stub.address, [fault]) as proxy:
        r = run(proxy.address, images("a"), tmp_path)
        assert [e.action for e in proxy.fired()] == [action, action]
    assert r.status == "published" and immutable(stub) == {r.tag: r.digest} and complete(stub, r.digest)


@pytest.mark.parametrize("action", ["status-mid-body", "reset-mid-body"])
def test_blob_uploads_that_always_break_in_the_middle_leave_no_tag_and_a_rerun_completes(
    stub, images, tmp_path, action
):
    with FaultyProxy(stub.address, [Fault(action, BLOB_UPLOAD + ".+digest=", "PUT", times=None)]) as proxy:
        with pytest.raises(BuildFailed, match="no tag was created"):
            run(proxy.address, images("a"), tmp_path)
        assert stub.tags.get(REPO, {}) == {}
        proxy.clear()
        r = run(proxy.address, images("a"), tmp_path)
    assert r.tag == SCHEME.tag(DATE, 1) and immutable(stub) == {r.tag: r.digest} and complete(stub, r.digest)


def test_a_registry_that_dies_between_the_blobs_and_the_manifest_leaves_no_tag_and_a_rerun_completes(
    stub, images, tmp_path
):
    with FaultyProxy(stub.address, [Fault("die", MANIFEST, "PUT")]) as proxy:
        with pytest.raises(BuildFailed, match="no tag was created"):
            run(proxy.address, images("a"), tmp_path, policy=RetryPolicy(attempts=2, base_delay=0.001, total_seconds=5))
        assert proxy.fired("die") and stub.tags.get(REPO, {}) == {} and stub.blobs
        proxy.revive()
        r = run(proxy.address, images("a"), tmp_path)
    assert r.tag == SCHEME.tag(DATE, 1) and immutable(stub) == {r.tag: r.digest} and complete(stub, r.digest)


def test_persistent_failure_while_tagging_leaves_no_tag(stub, images, tmp_path):
    with FaultyProxy(stub.address, [Fault("status", MANIFEST_BY_TAG, "PUT", status=503, times=None)]) as proxy:
        with pytest.raises(BuildFailed, match="no tag was created"):
            run(proxy.address, images("a"), tmp_path)
    assert stub.tags.get(REPO, {}) == {}


def test_rewritten_manifest_is_caught_and_rolled_back(stub, images, tmp_path):
    with FaultyProxy(stub.address, [Fault("rewrite-request", MANIFEST_BY_TAG, "PUT", times=None)]) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path)
    msg = exc.value.message
    assert "manifest digest mismatch" in msg and "Rolled back" in msg and "no tag remains" in msg
    assert stub.tags.get(REPO, {}) == {}  # neither the immutable tag nor the alias


def test_rewritten_manifest_without_deletion_names_the_tag_to_delete(images, tmp_path):
    with (
        StubRegistry(delete_enabled=False) as reg,
        FaultyProxy(reg.address, [Fault("rewrite-request", MANIFEST_BY_TAG, "PUT", times=None)]) as proxy,
    ):
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path)
        tag = SCHEME.tag(DATE, 1)
        assert f"tag {tag} points to" in exc.value.message and "administrator" in exc.value.message
        assert ALIAS not in reg.tags.get(REPO, {})


def test_manifest_rewritten_on_the_way_back_is_not_trusted(stub, images, tmp_path):
    with FaultyProxy(stub.address, [Fault("rewrite-response", MANIFEST_BY_TAG, "GET", times=None)]) as proxy:
        with pytest.raises(BuildFailed, match="cannot be verified"):
            run(proxy.address, images("a"), tmp_path)
    assert ALIAS not in stub.tags.get(REPO, {})


def test_manifest_rewritten_when_pushed_by_digest_is_refused_before_any_tag(stub, images, tmp_path):
    with FaultyProxy(stub.address, [Fault("rewrite-request", MANIFEST_BY_DIGEST, "PUT", times=None)]) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path)
    assert "DIGEST_INVALID" in exc.value.message and "no tag was created" in exc.value.message
    assert stub.tags.get(REPO, {}) == {}


def test_alias_moves_only_forward_and_a_failed_alias_is_completed_by_a_rerun(stub, images, tmp_path):
    a = run(stub.address, images("a"), tmp_path)
    with FaultyProxy(stub.address, [Fault("status", rf"/manifests/{ALIAS}$", "PUT", status=503, times=None)]) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("b"), tmp_path)
    assert "is published and verified" in exc.value.message
    b_tag = SCHEME.tag(DATE, 2)
    assert b_tag in stub.tags[REPO] and stub.tag_digest(REPO, ALIAS) == a.digest
    b = run(stub.address, images("b"), tmp_path)  # the re-run finds r2 and completes the alias
    assert b.status == "already-published" and b.tag == b_tag and b.aliases == {ALIAS: "moved"}
    assert stub.tag_digest(REPO, ALIAS) == b.digest
    old = run(stub.address, images("a"), tmp_path)  # re-publishing the older image moves nothing back
    assert old.status == "already-published" and stub.tag_digest(REPO, ALIAS) == b.digest
    assert old.aliases[ALIAS] == f"not moved: {b_tag} is newer"


def test_alias_that_looks_immutable_is_refused(stub, images, tmp_path):
    with pytest.raises(UserError, match="immutable publish tag"):
        run(stub.address, images("a"), tmp_path, aliases=(SCHEME.tag(DATE, 9),))
    with pytest.raises(UserError, match="not a valid OCI tag"):
        run(stub.address, images("a"), tmp_path, aliases=("bad tag",))


def test_unreachable_registry_is_a_user_error_and_creates_nothing(images, tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(UserError) as exc:
        run(f"127.0.0.1:{port}", images("a"), tmp_path)
    assert exc.value.exit_code == 2 and "connection refused" in exc.value.message
    assert "no tag was created" in exc.value.fix


def test_bad_registry_reference(images, tmp_path):
    for bad in ["http://127.0.0.1:5000/x", "127.0.0.1:5000/UPPER", "nohost/x"]:
        with pytest.raises(UserError):
            options = publisher.PublishOptions(policy=FAST, lock_dir=tmp_path, layer_cache=False)
            publisher.publish(images("a"), bad, SCHEME, DATE, options)


def test_evidence_records_what_was_published(stub, images, tmp_path):
    before, t0 = _dt.datetime.now(_dt.timezone.utc), time.monotonic()
    r = run(stub.address, images("a"), tmp_path, evidence=tmp_path / "evidence")
    elapsed = time.monotonic() - t0
    ev = json.loads((tmp_path / "evidence" / "publish.json").read_text())
    assert ev["repository"] == f"{stub.address}/{REPO}" and ev["tag"] == r.tag and ev["digest"] == r.digest
    assert ev["pinned_reference"] == f"{stub.address}/{REPO}@{r.digest}"
    assert ev["size"] == len(stub.manifests[r.digest][0]) + sum(
        d["size"]
        for d in [json.loads(stub.manifests[r.digest][0])["config"], *json.loads(stub.manifests[r.digest][0])["layers"]]
    )
    assert ev["verification"]["tag_digest"] == r.digest and ev["verification"]["image_id_matches"]
    started = _dt.datetime.strptime(ev["started_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc)
    assert before.replace(microsecond=0) <= started <= before + _dt.timedelta(seconds=elapsed + 1)
    assert 0 < ev["duration_s"] <= elapsed
    events = [e["event"] for e in ev["push_log"]]
    assert events[0] == "start" and events[-1] == "done"
    assert (
        events.index("manifest-by-digest")
        < events.index("tag-written")
        < events.index("tag-reread")
        < events.index("alias")
    )


def test_layer_cache_skips_recompressing_layers_the_registry_holds(stub, images, tmp_path):
    a = run(stub.address, images("a"), tmp_path)
    b = run(stub.address, images("b"), tmp_path)  # shares the base layer with a
    exported = next(e for e in b.push_log if e["event"] == "exported")
    assert exported["layers_already_in_registry"] == 1
    assert next(e for e in a.push_log if e["event"] == "exported")["layers_already_in_registry"] == 0
    with StubRegistry() as fresh:  # a registry without the blob: the cache entry is not trusted, the layer is uploaded
        c = run(fresh.address, images("b"), tmp_path)
        assert c.digest == b.digest
        assert next(e for e in c.push_log if e["event"] == "exported")["layers_already_in_registry"] == 0
    nocache = run(stub.address, images("b"), tmp_path / "other", layer_cache=False)
    assert nocache.status == "already-published" and nocache.digest == b.digest


def test_late_writer_from_another_host_is_caught_by_the_settled_reread(stub, images, tmp_path):
    tag1 = SCHEME.tag(DATE, 1)
    reads = []

    def late_writer(_proxy):
        reads.append(1)
        if len(reads) == 2:  # after our first re-read succeeded: the other host's PUT lands
            stub.put_image(REPO, tag1, b'{"late":1,"rootfs":{"diff_ids":[]}}', [])

    with FaultyProxy(
        stub.address, [Fault("hook", rf"/manifests/{tag1}$", "GET", hook=late_writer, times=None)]
    ) as proxy:
        r = run(proxy.address, images("a"), tmp_path, settle_seconds=0.05)
    events = [e["event"] for e in r.push_log]
    assert r.tag == SCHEME.tag(DATE, 2) and "tag-lost" in events
    assert r.verification["settled_reread"] is True
    assert stub.tag_digest(REPO, tag1) != r.digest and stub.tag_digest(REPO, r.tag) == r.digest


@pytest.mark.parametrize("delay", [0.0, 0.4])
def test_the_default_settle_pause_scales_with_the_measured_head_to_put_time(stub, images, tmp_path, delay):
    """By default the settled re-read comes SETTLE_FACTOR times this publisher's own HEAD→PUT time for the tag
    after the write, with no fixed floor: a registry close by costs milliseconds, one far away (another host's
    gap between its HEAD and its PUT is as long) a pause as long as that."""
    tag1 = SCHEME.tag(DATE, 1)
    slow = [
        Fault("hook", rf"/manifests/{tag1}$", m, hook=lambda _p: time.sleep(delay), times=1) for m in ("HEAD", "PUT")
    ]
    with FaultyProxy(stub.address, slow if delay else []) as proxy:
        r = run(proxy.address, images("a"), tmp_path, settle_seconds=None)
    at = {e["event"]: e for e in r.push_log}
    head_to_put = at["tag-written"]["head_to_put"]
    assert head_to_put >= 2 * delay
    want = publisher.SETTLE_FACTOR * head_to_put
    # Both figures are logged rounded to the millisecond: the product can be off by SETTLE_FACTOR × 0.5 ms + 0.5 ms.
    assert at["settle"]["settle"] == pytest.approx(want, abs=publisher.SETTLE_FACTOR * 0.0005 + 0.0005 + 1e-9)
    assert at["tag-reread-settled"]["t"] - at["tag-written"]["t"] >= want - 0.01
    assert r.verification["settled_reread"] is True and r.verification["settle_seconds"] == at["settle"]["settle"]
    if delay:
        assert want >= publisher.SETTLE_FACTOR * 2 * delay
    else:  # the in-process registry answers in milliseconds: so does the pause
        assert want < 0.25 and at["tag-reread-settled"]["t"] - at["tag-written"]["t"] < 0.5


def test_a_peer_as_slow_as_us_that_writes_the_tag_after_our_reread_is_caught_by_default(stub, images, tmp_path):
    """No settle_seconds given: our HEAD→PUT takes ≥ 0.2 s, a peer on a like link HEADed the tag before our PUT
    landed and writes it 0.3 s after it (after our first re-read). The default pause (SETTLE_FACTOR × our gap)
    outlasts that, so the settled re-read sees the peer's image and this publish moves on to the next revision."""
    tag1 = SCHEME.tag(DATE, 1)
    peer = {}

    def peer_writes_later(_proxy):
        def write():
            peer["d"] = stub.put_image(REPO, tag1, b'{"peer":1,"rootfs":{"diff_ids":[]}}', [])

        timer = threading.Timer(0.3, write)
        timer.start()
        peer["timer"] = timer

    faults = [
        Fault("hook", rf"/manifests/{tag1}$", "PUT", hook=lambda _p: time.sleep(0.2), times=1),
        Fault("hook", rf"/manifests/{tag1}$", "GET", hook=peer_writes_later, times=1),
    ]
    with FaultyProxy(stub.address, faults) as proxy:
        r = run(proxy.address, images("a"), tmp_path, settle_seconds=None)
    peer["timer"].join()
    first = {e["event"]: e for e in reversed(r.push_log)}  # each event's first occurrence: those of r1
    assert first["tag-written"]["tag"] == tag1 and first["tag-written"]["head_to_put"] >= 0.2
    assert first["tag-lost"]["tag"] == tag1 and first["settle"]["settle"] >= publisher.SETTLE_FACTOR * 0.2 - 0.001
    assert r.tag == SCHEME.tag(DATE, 2) and stub.tag_digest(REPO, r.tag) == r.digest
    assert stub.tag_digest(REPO, tag1) == peer["d"]


def test_a_tag_write_whose_answer_was_lost_still_gets_the_settled_reread(stub, images, tmp_path):
    """The PUT lands but its answer is lost; the retry's HEAD finds our manifest. The HEAD→PUT gap is then
    counted from the first attempt's HEAD, so the pause is not zero and the settled re-read still comes."""
    tag1 = SCHEME.tag(DATE, 1)
    faults = [
        Fault("hook", rf"/manifests/{tag1}$", "HEAD", hook=lambda _p: time.sleep(0.05), times=1),
        Fault("reset-after-forward", rf"/manifests/{tag1}$", "PUT"),
    ]
    with FaultyProxy(stub.address, faults) as proxy:
        r = run(proxy.address, images("a"), tmp_path, settle_seconds=None)
    at = {e["event"]: e for e in r.push_log}
    assert "tag-written" not in at and at["tag-found-written"]["head_to_put"] >= 0.05
    assert at["settle"]["settle"] >= publisher.SETTLE_FACTOR * 0.05 - 0.001
    assert r.verification["settled_reread"] is True and r.tag == tag1 and stub.tag_digest(REPO, tag1) == r.digest


def test_work_that_the_verdict_does_not_decide_fills_the_settle_pause(stub, images, tmp_path):
    """``during_settle`` runs between the first re-read and the settled one, with the result about to be
    reported; the pause sleeps only what is left of ``settle_seconds`` counted from the tag write, and the
    aliases move only after the settled re-read. A failing hook is logged and changes nothing else."""
    seen = []

    def work(provisional):
        seen.append((provisional.tag, provisional.aliases, stub.tag_digest(REPO, ALIAS)))
        time.sleep(0.3)

    r = run(stub.address, images("a"), tmp_path, settle_seconds=0.5, during_settle=work)
    at = {e["event"]: e for e in r.push_log}
    assert seen == [(r.tag, {ALIAS: "moved"}, None)]  # before the alias moved
    assert at["settle-work"]["seconds"] >= 0.3 and at["settle"]["sleep"] <= 0.2 + 0.05
    assert at["tag-reread-settled"]["t"] - at["tag-written"]["t"] >= 0.5
    assert at["alias"]["t"] > at["tag-reread-settled"]["t"]

    def broken(_provisional):
        raise RuntimeError("record store down")

    r2 = run(stub.address, images("b"), tmp_path, settle_seconds=0.05, during_settle=broken)
    failed = [e for e in r2.push_log if e["event"] == "settle-work-failed"]
    assert failed and failed[0]["error"] == "record store down" and r2.aliases == {ALIAS: "moved"}


# ------------------------------------------------------------- failures after the tag was written


def _config_of(reg: StubRegistry, tag: str) -> tuple[str, list[str]]:
    doc = json.loads(reg.manifests[reg.tags[REPO][tag]][0])
    return doc["config"]["digest"], [layer["digest"] for layer in doc["layers"]]


def _break_after_tag_put(reg: StubRegistry, tag: str, how: str):
    """A hook for the re-read of ``tag``: the registry's storage loses or corrupts blobs right after the PUT."""

    def hook(_proxy):
        if tag not in reg.tags.get(REPO, {}):
            return
        config, layers = _config_of(reg, tag)
        with reg.lock:
            if how == "corrupt-config":
                reg.blobs[config] = b'{"corrupted": true}'
            else:
                for layer in layers:
                    reg.blobs.pop(layer, None)

    return hook


@pytest.mark.parametrize(
    "how, needle", [("corrupt-config", "does not hash to the image id"), ("lose-layers", "the registry lacks layer(s)")]
)
def test_blob_failures_after_tagging_roll_the_tag_back(stub, images, tmp_path, how, needle):
    tag = SCHEME.tag(DATE, 1)
    with FaultyProxy(
        stub.address, [Fault("hook", rf"/manifests/{tag}$", "GET", hook=_break_after_tag_put(stub, tag, how))]
    ) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path, evidence=tmp_path / "ev")
    msg = exc.value.message
    assert needle in msg and "Rolled back" in msg and tag in msg
    assert stub.tags.get(REPO, {}) == {}  # neither the immutable tag nor the alias
    failed = json.loads((tmp_path / "ev" / "publish-failed.json").read_text())
    assert failed["status"] == "failed" and failed["tag_left"] is None
    assert "rolled-back" in [e["event"] for e in failed["push_log"]]


def test_blob_failure_after_tagging_without_deletion_names_the_tag_to_delete(images, tmp_path):
    tag = SCHEME.tag(DATE, 1)
    with (
        StubRegistry(delete_enabled=False) as reg,
        FaultyProxy(
            reg.address,
            [Fault("hook", rf"/manifests/{tag}$", "GET", hook=_break_after_tag_put(reg, tag, "lose-layers"))],
        ) as proxy,
    ):
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path, evidence=tmp_path / "ev")
        msg = exc.value.message
        assert "the registry lacks layer(s)" in msg
        assert f"tag {tag} points to" in msg and "administrator" in msg
        assert ALIAS not in reg.tags.get(REPO, {})
        assert json.loads((tmp_path / "ev" / "publish-failed.json").read_text())["tag_left"] == tag


def test_roll_back_never_removes_another_tag_of_the_same_manifest(stub, images, tmp_path):
    """The image was published on an earlier date; deleting its manifest by digest would drop that tag too."""
    earlier = run(stub.address, images("a"), tmp_path, date="20260928")
    tag = SCHEME.tag(DATE, 1)

    def lose_config(_proxy):
        if tag in stub.tags.get(REPO, {}):
            stub.blobs[_config_of(stub, tag)[0]] = b"{}"

    with FaultyProxy(stub.address, [Fault("hook", rf"/manifests/{tag}$", "GET", hook=lose_config)]) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path)
    msg = exc.value.message
    assert f"tag {tag}" in msg and "administrator" in msg and earlier.tag in msg
    assert stub.tag_digest(REPO, earlier.tag) == earlier.digest  # the earlier publish is untouched
    assert stub.tag_digest(REPO, ALIAS) == earlier.digest
    assert stub.tag_digest(REPO, tag) == earlier.digest  # left for the administrator, as the message says


def test_manifest_rewritten_on_the_way_back_leaves_no_tag(stub, images, tmp_path):
    with FaultyProxy(stub.address, [Fault("rewrite-response", MANIFEST_BY_TAG, "GET", times=None)]) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("a"), tmp_path)
        assert "cannot be verified" in exc.value.message and "Rolled back" in exc.value.message
        assert stub.tags.get(REPO, {}) == {}
        proxy.clear()
        r = run(proxy.address, images("a"), tmp_path)  # the re-run publishes it afresh
    assert r.status == "published" and r.tag == SCHEME.tag(DATE, 1)


def test_a_stack_that_fails_lint_is_refused_before_the_engine_or_registry(tmp_path):
    from stackforge.publish.stack import publish_stack
    from stackforge.stack.load import load

    root = Path(__file__).resolve().parents[2]
    stack = load("post2", root=root, overrides=["packages.torchvision.version=0.26.0.post1+musa5.2.0"])
    with pytest.raises(BuildFailed) as exc:
        publish_stack(stack, "127.0.0.1:9/x", date=DATE, out=tmp_path)  # nothing listens on port 9: never contacted
    msg = exc.value.message
    assert msg.startswith("stack 'post2' fails lint") and "torchvision" in msg and "Nothing was published." in msg
    assert exc.value.exit_code == 1 and "rebuild, then publish" in exc.value.fix


class _NoEngine:
    """An engine that fails the test if it is asked anything."""

    def __getattr__(self, name):
        raise AssertionError(f"the engine was asked for {name}")


@pytest.mark.parametrize("overlay", [False, True])
@pytest.mark.parametrize(
    ("compression", "level", "words"),
    [("gzip", 12, "gzip level 12 is not 1-9"), ("zstd", 0, "zstd level 0 is not 1-19"), ("br", None, "'br'")],
)
def test_a_bad_codec_or_level_is_refused_before_the_engine_or_registry(tmp_path, overlay, compression, level, words):
    """A codec or level the publisher cannot use is refused before the local image is looked up (so the error is
    the flag's, not a missing image's) and before the registry is contacted."""
    from stackforge.overlay.load import load_overlay
    from stackforge.overlay.publish import publish_overlay
    from stackforge.publish.stack import publish_stack
    from stackforge.stack.load import load

    root = Path(__file__).resolve().parents[2]
    stack = load("post2", root=root)
    options = publisher.PublishOptions(compression=compression, level=level)
    with pytest.raises(UserError) as exc:
        if overlay:
            publish_overlay(stack, load_overlay(root, "jev"), "127.0.0.1:9/x", options, date=DATE, out=tmp_path,
                            engine=_NoEngine())  # fmt: skip
        else:
            publish_stack(stack, "127.0.0.1:9/x", options, date=DATE, out=tmp_path, engine=_NoEngine())
    assert words in exc.value.message and exc.value.fix
    assert not any(tmp_path.rglob("*.json"))  # no publish record was begun


def test_a_manifest_whose_blobs_the_registry_briefly_does_not_see_is_put_again(stub, images, tmp_path):
    """Another publisher pushing the same blob can make the registry answer MANIFEST_BLOB_UNKNOWN for a blob it
    accepted: the publisher looks at its blobs again and repeats the PUT, a bounded number of times."""
    brief = [Fault("status", MANIFEST_BY_DIGEST, "PUT", status=400, code="MANIFEST_BLOB_UNKNOWN", times=2)]
    with FaultyProxy(stub.address, brief) as proxy:
        r = run(proxy.address, images("a"), tmp_path)
    assert r.status == "published" and r.tag == SCHEME.tag(DATE, 1)
    seen = [e for e in r.push_log if e["event"] == "manifest-blob-unknown"]
    assert [e["attempt"] for e in seen] == [1, 2] and all(e["missing"] == [] for e in seen)
    assert immutable(stub) == {r.tag: r.digest}

    lasting = [Fault("status", MANIFEST_BY_DIGEST, "PUT", status=400, code="MANIFEST_BLOB_UNKNOWN", times=None)]
    with FaultyProxy(stub.address, lasting) as proxy:
        with pytest.raises(BuildFailed) as exc:
            run(proxy.address, images("b"), tmp_path)
        puts = [e for e in proxy.log if e.method == "PUT" and "/manifests/sha256:" in e.path]
    assert len(puts) == publisher.BLOB_UNKNOWN_ATTEMPTS
    assert "MANIFEST_BLOB_UNKNOWN" in exc.value.message and "no tag was created" in exc.value.message
    assert immutable(stub) == {r.tag: r.digest}


def test_the_publish_verb_builds_the_options_once_from_its_flags(monkeypatch, capsys):
    """``stackforge publish`` turns its flags into one PublishOptions and passes it to publish_stack."""
    from types import SimpleNamespace

    from stackforge.cli import publish as verb
    from stackforge.cli.main import main

    seen: dict = {}

    def fake_publish_stack(loaded, registry, options, **kw):
        seen.update(kw, registry=registry, options=options)
        return SimpleNamespace(evidence=lambda: {"status": "published"})

    monkeypatch.setattr(verb, "publish_stack", fake_publish_stack)
    root = Path(__file__).resolve().parents[2]
    argv = ["--root", str(root), "publish", "example", "--registry", "127.0.0.1:9/x", "--compression", "none"]
    assert main([*argv, "--verify-pull", "--retries", "2", "--date", DATE, "--json"]) == 0
    options = seen["options"]
    assert isinstance(options, publisher.PublishOptions) and options.compression == "none" and options.verify_pull
    assert options.policy is not None and options.policy.attempts == 2 and options.echo is verb.stderr_echo
    assert seen["registry"] == "127.0.0.1:9/x" and seen["date"] == DATE and seen["allow_ungated"] is False
    assert json.loads(capsys.readouterr().out) == {"status": "published"}


def test_the_same_image_with_other_build_cache_records_is_already_published(stub, tmp_path):
    """Two hosts build one image from each other's registry cache: the same layers and config, each with its own
    inline cache records (moby.buildkit.cache.v0). The second publish finds the first's tag: no new revision."""
    layers = [layer_tar({"etc/os-release": b"ID=debian\n"}), layer_tar({"app/a.txt": b"a" * 100})]
    first_host = save_archive(tmp_path / "one.tar", layers, config_extra={"moby.buildkit.cache.v0": "W3sib25lIjox"})
    second_host = save_archive(tmp_path / "two.tar", layers, config_extra={"moby.buildkit.cache.v0": "W3sidHdvIjoy"})
    assert first_host != second_host  # two image ids
    first = run(stub.address, ArchiveImage(tmp_path / "one.tar"), tmp_path)
    again = run(stub.address, ArchiveImage(tmp_path / "two.tar"), tmp_path / "second-host")
    assert again.status == "already-published" and (again.tag, again.digest) == (first.tag, first.digest)
    assert again.image_id == first.image_id  # what a pull of the tag gives
    assert again.verification["same_content"] is True and again.verification["image_id_matches"] is False
    assert immutable(stub) == {first.tag: first.digest}
    # another layer is another image: the next revision
    other = [layers[0], layer_tar({"app/a.txt": b"b" * 100})]
    save_archive(tmp_path / "three.tar", other, config_extra={"moby.buildkit.cache.v0": "W3sib25lIjox"})
    third = run(stub.address, ArchiveImage(tmp_path / "three.tar"), tmp_path / "third")
    assert third.status == "published" and third.tag == SCHEME.tag(DATE, 2)


def test_a_line_pushed_again_with_other_build_cache_records_is_the_child_the_index_lists(stub, tmp_path):
    """A line pushed by digest again (a shard re-run after the merge, on another host): the same layers and config
    but BuildKit's cache records. The push reports the child the date's index lists for the platform instead of a
    new manifest, so the index over the lines is the one already tagged, not a new revision; a line that differs in
    a layer is pushed as a new image; a child listed for another platform is not taken."""
    from stackforge.clients.registry import RegistryClient, parse_repository
    from stackforge.publish import platforms

    layers = [layer_tar({"etc/os-release": b"ID=debian\n"}), layer_tar({"app/a.txt": b"a" * 100})]
    save_archive(tmp_path / "one.tar", layers, config_extra={"moby.buildkit.cache.v0": "W3sib25lIjox"})
    save_archive(tmp_path / "two.tar", layers, config_extra={"moby.buildkit.cache.v0": "W3sidHdvIjoy"})
    client = RegistryClient(parse_repository(f"{stub.address}/{REPO}"), policy=FAST)

    def push(archive: str, platform: str, work: Path) -> publisher.PublishResult:
        options = publisher.PublishOptions(policy=FAST, lock_dir=tmp_path / "locks", layer_cache=work / "layers")
        listed = lambda c: platforms.listed_children(c, SCHEME, DATE, platform)  # noqa: E731
        image = ArchiveImage(tmp_path / archive)
        hooks = publisher.PublishHooks(listed=listed)
        return publisher.publish(image, f"{stub.address}/{REPO}", SCHEME, DATE, options, hooks=hooks, tag_it=False)

    def index(child: publisher.PublishResult) -> publisher.PublishResult:
        event = next(e for e in reversed(child.push_log) if e["event"] == "pushed-by-digest")
        kid = platforms.Child("linux/amd64", child.digest, int(event["size"]), str(event["media_type"]))
        return platforms.publish_index([kid], client, SCHEME, DATE, lock_dir=tmp_path / "locks", settle_seconds=0)

    first = push("one.tar", "linux/amd64", tmp_path / "a")
    assert first.status == "pushed" and "already_pushed" not in first.verification
    tagged = index(first)
    assert tagged.status == "published" and tagged.tag == SCHEME.tag(DATE, 1)
    manifests = set(stub.manifests)

    again = push("two.tar", "linux/amd64", tmp_path / "b")
    assert (again.status, again.digest, again.verification) == ("pushed", first.digest, {"already_pushed": True})
    assert again.image_id == first.image_id  # the config a pull of the child gives
    assert set(stub.manifests) == manifests  # no manifest written
    assert [e["event"] for e in again.push_log].count("already-pushed") == 1
    reindexed = index(again)
    assert (reindexed.status, reindexed.tag, reindexed.digest) == ("already-published", tagged.tag, tagged.digest)

    elsewhere = push("two.tar", "linux/arm64", tmp_path / "c")  # the index lists the child for amd64 only
    assert elsewhere.status == "pushed" and elsewhere.digest != first.digest
    assert "already_pushed" not in elsewhere.verification

    save_archive(tmp_path / "three.tar", [layers[0], layer_tar({"app/a.txt": b"b" * 100})])
    other = push("three.tar", "linux/amd64", tmp_path / "d")
    assert other.status == "pushed" and other.digest not in (first.digest, elsewhere.digest)
    assert "already_pushed" not in other.verification
