"""Publishing normalizes a stackforge image (one that names its layer epoch): two builds of the same files, made at
other times and listed in another order, publish the same manifest, config and layer digests; other images are
published as they are."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from stackforge.builder.context.prepare import layer_epoch, rfc3339_seconds
from stackforge.clients.upstream import sdist_time
from stackforge.publish.oci import (
    LayerCache,
    PublishedImages,
    normalized_config,
    normalizing,
    read_image,
)
from tests.fixtures.save_archive import save_archive
from tests.fixtures.stub_registry import digest_of

EPOCH = 1_700_000_000
LABELS = {"org.stackforge.epoch": str(EPOCH), "org.opencontainers.image.created": "2023-11-14T22:13:20Z"}
FILES = {"opt/venv/bin/tool": b"#!/bin/sh\necho tool\n", "opt/venv/lib/mod.py": b"x = 1\n", "etc/conf": b"a=b\n"}


def built_layer(when: int, reverse: bool = False, owner: str = "builder") -> bytes:
    """A layer as a build leaves it: its files at the build's time, in the order the filesystem listed them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        names = sorted(FILES, reverse=reverse)
        for d in sorted({n.rsplit("/", 1)[0] for n in names}, reverse=reverse):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime, info.uname = tarfile.DIRTYPE, 0o755, when, owner
            info.pax_headers = {"atime": str(when + 5)}
            tar.addfile(info)
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname = len(FILES[name]), when, 0o644, owner
            tar.addfile(info, io.BytesIO(FILES[name]))
    return buf.getvalue()


def old_layer() -> bytes:
    """A base layer: its files older than the epoch, kept as they are."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("etc/os-release")
        data = b"ID=debian\n"
        info.size, info.mtime, info.uname = len(data), EPOCH - 1000, "root"
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def publish_ready(tmp_path: Path, name: str, when: int, *, reverse: bool, labels=LABELS, cache=None):
    archive = tmp_path / f"{name}.tar"
    created = f"2026-12-0{1 + (when % 5)}T10:00:0{when % 7}.123456789Z"
    image_id = save_archive(
        archive, [old_layer(), built_layer(when, reverse)], labels=labels, created=created, note="same"
    )
    with open(archive, "rb") as fh:
        img = read_image(fh, tmp_path / f"work-{name}", compression="gzip", cache=cache)
    return image_id, img


def test_two_builds_of_the_same_files_publish_one_digest(tmp_path):
    id_a, a = publish_ready(tmp_path, "a", EPOCH + 3600, reverse=False)
    id_b, b = publish_ready(tmp_path, "b", EPOCH + 7300, reverse=True)
    assert id_a != id_b  # the local images differ (times, order, owners' names) ...
    assert a.digest == b.digest and a.image_id == b.image_id  # ... the published ones do not
    assert [l.digest for l in a.layers] == [l.digest for l in b.layers]
    assert (a.source_id, b.source_id) == (id_a, id_b)
    config = json.loads(a.config.data)
    assert config["created"] == "2023-11-14T22:13:20Z"
    assert {h["created"] for h in config["history"]} == {"2023-11-14T22:13:20Z"}
    assert config["rootfs"]["diff_ids"] == [l.diff_id for l in a.layers]
    # The layers unpack to the same files: build-time stamps clamped to the epoch, older ones kept.
    with tarfile.open(fileobj=a.layers[1].open(), mode="r:gz") as tar:
        got = {m.name: (m.mtime, m.uname, tar.extractfile(m).read() if m.isreg() else None) for m in tar}
    assert {n: v[2] for n, v in got.items() if v[2] is not None} == FILES
    assert {v[0] for v in got.values()} == {EPOCH} and {v[1] for v in got.values()} == {""}
    with tarfile.open(fileobj=a.layers[0].open(), mode="r:gz") as tar:
        assert [m.mtime for m in tar] == [EPOCH - 1000]


def test_an_image_without_a_layer_epoch_is_published_as_it_is(tmp_path):
    id_a, a = publish_ready(tmp_path, "a", EPOCH + 3600, reverse=False, labels={})
    id_b, b = publish_ready(tmp_path, "b", EPOCH + 7300, reverse=True, labels={})
    assert a.image_id == id_a and b.image_id == id_b and a.digest != b.digest
    assert a.source_id is None and a.config.data is not None and json.loads(a.config.data)["created"].startswith("2026")


def test_the_layer_cache_keeps_normalized_blobs_by_the_local_layer_and_epoch(tmp_path):
    cache = LayerCache(tmp_path / "cache", lambda digest, diff_id: True)
    _, first = publish_ready(tmp_path, "a", EPOCH + 3600, reverse=False, cache=cache)
    for blob in first.layers:
        assert blob.source_diff_id is not None and blob.cache_key == blob.source_diff_id
    id_again, again = publish_ready(tmp_path, "b", EPOCH + 3600, reverse=False, cache=cache)
    assert cache.key.endswith(f"-sde{EPOCH}")
    assert all(b.remote for b in again.layers) and again.digest == first.digest
    # Another epoch is another blob: the cache does not answer for it.
    other = LayerCache(tmp_path / "cache", lambda digest, diff_id: True)
    other.scope("sde1")
    assert other.lookup(first.layers[1].source_diff_id) is None


def test_normalizing_reads_the_labels_and_refuses_what_is_not_a_time():
    config = json.dumps({"config": {"Labels": LABELS}}).encode()
    assert normalizing(config).epoch == EPOCH and normalizing(config).created == "2023-11-14T22:13:20Z"
    no_created = json.dumps({"config": {"Labels": {"org.stackforge.epoch": "86400"}}}).encode()
    assert normalizing(no_created).created == "1970-01-02T00:00:00Z"
    for bad in ("", "12a", "-5", "1e9"):
        assert normalizing(json.dumps({"config": {"Labels": {"org.stackforge.epoch": bad}}}).encode()) is None
    assert normalizing(b"not json") is None and normalizing(b"{}") is None


def test_the_normalized_config_does_not_depend_on_key_order():
    a = {"rootfs": {"diff_ids": ["x"], "type": "layers"}, "created": "t1", "history": [{"created": "t1"}]}
    b = {"history": [{"created": "t2"}], "created": "t2", "rootfs": {"type": "layers", "diff_ids": ["y"]}}
    norm = normalizing(json.dumps({"config": {"Labels": LABELS}}).encode())
    assert norm is not None
    same = [normalized_config(json.dumps(d).encode(), ["sha256:" + "1" * 64], norm) for d in (a, b)]
    assert same[0] == same[1]


def test_published_images_remember_what_a_local_image_was_published_as(tmp_path):
    images = PublishedImages(tmp_path / "images", "zstd-3")
    local, digest, config = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64
    assert images.get(local) is None
    images.put(local, digest, config)
    assert images.get(local) == (digest, config)
    assert PublishedImages(tmp_path / "images", "gzip-6").get(local) is None  # another codec, another blob
    (tmp_path / "images" / f"{'a' * 64}.json").write_text('{"zstd-3": {"digest": "x", "config": "y"}}')
    assert images.get(local) is None  # a hint that is not digests is no hint


@pytest.mark.parametrize(
    ("base_created", "sde", "want"),
    [
        ("2024-02-03T04:05:06.123456789Z", 1_700_000_000, 1_706_933_106),
        ("2024-02-03T05:05:06+01:00", None, 1_706_933_106),
        (None, 1_700_000_000, 1_700_000_000),
        ("0001-01-01T00:00:00Z", 1_700_000_000, 1_700_000_000),  # an image that records no time
        ("yesterday", None, None),
    ],
)
def test_the_layer_epoch_is_the_base_images_time_else_the_sources(base_created, sde, want):
    assert layer_epoch(base_created, sde) == want


def test_rfc3339_seconds_takes_what_engines_write():
    assert rfc3339_seconds("1970-01-01T00:01:40Z") == 100
    assert rfc3339_seconds("1970-01-01T00:01:40.999999999Z") == 100
    assert rfc3339_seconds("1970-01-01 00:01:40") is None


def test_an_sdist_upstreams_epoch_is_when_its_release_was_packed(tmp_path):
    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, when in (("pkg-1.0/PKG-INFO", 1_600_000_500), ("pkg-1.0/setup.py", 1_600_000_000)):
            info = tarfile.TarInfo(name)
            info.mtime = when
            tar.addfile(info, io.BytesIO(b""))
    assert sdist_time(archive) == 1_600_000_500


def test_the_base_images_layers_are_published_as_they_are(tmp_path):
    """``org.stackforge.base.layers``: the first N layers are the base's own registry blobs; only those above are
    normalized."""
    labels = {**LABELS, "org.stackforge.base.layers": "1"}
    raw_base = old_layer()
    _, a = publish_ready(tmp_path, "a", EPOCH + 3600, reverse=False, labels=labels)
    _, b = publish_ready(tmp_path, "b", EPOCH + 7300, reverse=True, labels=labels)
    assert a.digest == b.digest
    assert a.layers[0].diff_id == digest_of(raw_base) and a.layers[0].source_diff_id is None
    assert a.layers[1].diff_id != a.layers[1].source_diff_id
    _, all_of_them = publish_ready(tmp_path, "c", EPOCH + 3600, reverse=False)
    assert all_of_them.layers[0].diff_id != digest_of(raw_base)  # without the label the base layer is rewritten too
