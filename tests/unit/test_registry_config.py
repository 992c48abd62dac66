"""The image config a manifest names, read from a registry (``RegistryClient.config_blob`` / ``config_of``): by a
sha256 digest and a declared size within the limit, the bytes checked against both, a JSON object. Whatever else a
manifest or a registry gives is a ``MalformedAnswer`` — for ``verify --rebuild``, the overlay check and the publisher
alike — never a crash and never an unbounded read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackforge.clients.registry import CONFIG_LIMIT, MalformedAnswer, RegistryClient, RetryPolicy, parse_repository
from stackforge.flows.rebuild import rebuild
from tests.fixtures.stub_registry import StubRegistry, digest_of

REPO = "team/x"
CONFIG = json.dumps({"os": "linux", "architecture": "amd64", "rootfs": {"diff_ids": []}}).encode()


def client_of(reg: StubRegistry) -> RegistryClient:
    return RegistryClient(parse_repository(f"{reg.address}/{REPO}"), policy=RetryPolicy(attempts=1))


def manifest_of(client: RegistryClient, digest: str) -> dict:
    got = client.get_manifest(digest)
    assert got is not None
    return got.json()


def test_the_config_a_manifest_names_is_read_and_checked():
    with StubRegistry() as reg:
        client = client_of(reg)
        doc = manifest_of(client, reg.put_image(REPO, "t", CONFIG, [b"layer"]))
        assert client.config_blob(doc) == (digest_of(CONFIG), CONFIG)
        assert client.config_of(doc) == json.loads(CONFIG)


@pytest.mark.parametrize(
    "config, words",
    [
        (None, "no config blob"),
        ("sha256:" + "a" * 64, "no config blob"),
        ({"digest": "sha256:../../etc"}, "no config blob"),
        ({"digest": "md5:" + "a" * 32, "size": 3}, "no config blob"),
        ({"digest": "sha256:" + "a" * 64}, "no size"),
        ({"digest": "sha256:" + "a" * 64, "size": "12"}, "no size"),
        ({"digest": "sha256:" + "a" * 64, "size": True}, "no size"),
        ({"digest": "sha256:" + "a" * 64, "size": CONFIG_LIMIT + 1}, "not within"),
        ({"digest": "sha256:" + "a" * 64, "size": -1}, "not within"),
    ],
)
def test_a_manifest_that_names_no_readable_config_asks_the_registry_nothing(config, words):
    with StubRegistry() as reg:
        client = client_of(reg)
        with pytest.raises(MalformedAnswer, match=words):
            client.config_of({"config": config} if config is not None else {"layers": []})
        assert reg.requests == []


@pytest.mark.parametrize(
    "served, words",
    [
        (b"[1, 2, 3]", "is not a JSON object"),
        (b"\xff\xfe not json", "is not valid JSON"),
    ],
)
def test_a_config_blob_that_is_no_json_object_is_malformed(served, words):
    with StubRegistry() as reg:
        client = client_of(reg)
        doc = manifest_of(client, reg.put_image(REPO, "t", served, [b"layer"]))
        with pytest.raises(MalformedAnswer, match=words):
            client.config_of(doc)


def test_other_bytes_under_the_config_digest_are_malformed():
    with StubRegistry() as reg:
        client = client_of(reg)
        doc = manifest_of(client, reg.put_image(REPO, "t", CONFIG, [b"layer"]))
        reg.blobs[digest_of(CONFIG)] = CONFIG.replace(b"amd64", b"arm64")  # same size, other bytes
        with pytest.raises(MalformedAnswer, match="served other bytes"):
            client.config_of(doc)


def test_verify_rebuild_reports_a_config_it_cannot_read_as_a_failed_line(tmp_path):
    """Before anything is loaded or built: the record, the checkout and the engine are not touched."""
    with StubRegistry() as reg:
        client = client_of(reg)
        lines = rebuild(None, tmp_path / "none", client, "sha256:" + "b" * 64, {"config": {"digest": 7}}, None)  # type: ignore[arg-type]
    assert len(lines) == 1 and lines[0][0] is False
    assert (
        lines[0][1].startswith("rebuild the published image's config cannot be read: ") and "no config" in lines[0][1]
    )
    assert not Path(tmp_path / "none").exists()
