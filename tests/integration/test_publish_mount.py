"""Skip and cross-repository mount against a real docker-registry: a layer travels at most once per registry.

Images are docker-save archives written by the unit helpers (no engine needed); the registry is the
session's loopback docker-registry, whose blobs are linked per repository as in production.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from stackforge.clients.registry import RetryPolicy
from stackforge.publish.oci import ArchiveImage
from stackforge.publish.publisher import PublishOptions, PublishResult, publish
from stackforge.stack.scheme import TagScheme
from tests.fixtures.save_archive import layer_tar, save_archive

pytestmark = [pytest.mark.registry]

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, total_seconds=20)
SCHEME = TagScheme.from_prefix("m-")


def events(result, name: str) -> list[dict]:
    return [e for e in result.push_log if e["event"] == name]


def test_layers_are_mounted_from_where_this_host_pushed_them_and_never_uploaded_twice(registry, tmp_path: Path):
    ns = f"mnt{uuid.uuid4().hex[:8]}"
    base, app = (layer_tar({f"f{i}": random.Random(i).randbytes(300_000)}) for i in range(2))
    path = tmp_path / "img.tar"
    image_id = save_archive(path, [base, app], flavour="oci")

    def go(repo: str, cache: Path, mount_from: list[str] | None = None) -> PublishResult:
        options = PublishOptions(policy=FAST, lock_dir=tmp_path / "locks", layer_cache=cache, settle_seconds=0,
                                 mount_from=mount_from or ())  # fmt: skip
        return publish(ArchiveImage(path, image_id=image_id), f"{registry}/{ns}/{repo}", SCHEME, "20260101", options)

    first = go("one", tmp_path / "cache")
    layers_of = {e["digest"] for e in events(first, "blob-upload") if e["media_type"].endswith("+gzip")}
    assert len(layers_of) == 2
    # Another repository, same host cache: both layers are mounted from "one", not uploaded (and not compressed).
    second = go("two", tmp_path / "cache")
    assert {e["digest"] for e in events(second, "blob-mounted")} == layers_of
    assert all(e["source"] == f"{ns}/one" for e in events(second, "blob-mounted"))
    assert not [e for e in events(second, "blob-upload") if e["digest"] in layers_of]
    assert next(iter(events(second, "exported")))["layers_already_in_registry"] == 2
    assert second.digest == first.digest
    # A host without that record: told where to mount from, it compresses (same blobs) and mounts instead of uploading.
    third = go("three", tmp_path / "other-cache", mount_from=[f"{ns}/one"])
    assert {e["digest"] for e in events(third, "blob-mounted")} == layers_of | {image_id}  # the config too
    assert not events(third, "blob-upload")
    assert third.digest == first.digest
    # Nothing to mount from: the layers are uploaded.
    fourth = go("four", tmp_path / "third-cache", mount_from=[f"{ns}/nowhere"])
    assert {e["digest"] for e in events(fourth, "blob-upload") if e["digest"] in layers_of} == layers_of
    assert not events(fourth, "blob-mounted")
