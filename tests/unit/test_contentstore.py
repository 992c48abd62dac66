"""The containerd content store read as the publish's fast path on an engine with the containerd image store: the
image the engine names by its index's digest is the index's one local manifest of the image's platform (attestation
manifests skipped), every small blob checked against its name, every layer's tar given uncompressed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from stackforge.clients import contentstore
from stackforge.clients.contentstore import ContentStore
from stackforge.clients.layerstore import Unusable
from tests.fixtures.save_archive import add_file, layer_tar

AMD64 = ("linux", "amd64", None)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put(root: Path, data: bytes) -> str:
    d = digest(data)
    (root / d.split(":")[1]).write_bytes(data)
    return d


def put_json(root: Path, doc: dict) -> dict:
    data = json.dumps(doc).encode()
    return {"mediaType": doc.get("mediaType", ""), "digest": put(root, data), "size": len(data)}


@pytest.fixture
def store(tmp_path):
    """A content store with an image as BuildKit leaves it on that store: an index of its amd64 manifest (a loaded
    base layer uncompressed, a built one gzip) and an attestation manifest, plus an arm64 manifest not pulled."""
    root = tmp_path / "blobs" / "sha256"
    root.mkdir(parents=True)
    tars = [layer_tar({"etc/base": b"base"}), layer_tar({"opt/app": b"app" * 1000})]
    stored = [tars[0], gzip.compress(tars[1], mtime=0)]
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [digest(t) for t in tars]}}).encode()  # fmt: skip
    layers = [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": put(root, stored[0]), "size": len(stored[0])},
        {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(root, stored[1]),
         "size": len(stored[1])},
    ]  # fmt: skip
    manifest = put_json(root, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"digest": put(root, config), "size": len(config)}, "layers": layers})  # fmt: skip
    statement = b'{"_type": "https://in-toto.io/Statement/v0.1"}'
    attestation = put_json(root, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                  "config": {"digest": put(root, statement), "size": len(statement)}, "layers": []})  # fmt: skip
    arm = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(b"not pulled"), "size": 10}
    index = put_json(root, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {**attestation, "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},
        {**manifest, "platform": {"os": "linux", "architecture": "amd64"}},
        {**arm, "platform": {"os": "linux", "architecture": "arm64"}},
    ]})  # fmt: skip
    return ContentStore((root,)), index["digest"], manifest["digest"], config, tars


def test_the_image_of_an_index_is_its_local_manifest_of_the_platform(store):
    cs, index, manifest, config, tars = store
    for image_id in (index, manifest):  # an index, or a manifest as a single-platform image without attestations
        image = cs.image(image_id, AMD64)
        assert image.config == config and image.config_digest == digest(config)
        assert [b"".join(layer.chunks()) for layer in image.layers] == tars
        assert [layer.compression for layer in image.layers] == [None, "gzip"]
        assert [layer.diff_id for layer in image.layers] == [digest(t) for t in tars]


def test_a_platform_the_engine_did_not_pull_or_another_is_unusable(store):
    cs, index, *_ = store
    with pytest.raises(Unusable, match="holds 0 local manifests of linux/arm64"):
        cs.image(index, ("linux", "arm64", None))
    with pytest.raises(Unusable, match="holds 0 local manifests of linux/ppc64le"):
        cs.image(index, ("linux", "ppc64le", None))


def test_a_blob_that_is_not_its_name_or_missing_is_unusable(store):
    cs, index, manifest, config, _ = store
    (cs.root / digest(config).split(":")[1]).write_bytes(config.replace(b"amd64", b"arm64"))
    with pytest.raises(Unusable, match="does not hash to its name"):
        cs.image(index, AMD64)
    with pytest.raises(Unusable, match="is not in the content store"):
        cs.image(digest(b"no such image"), AMD64)
    with pytest.raises(Unusable, match="is not a sha256 digest"):
        cs.image("sha256:../../etc/passwd", AMD64)


def test_a_layer_of_another_media_type_is_unusable(tmp_path):
    root = tmp_path / "b"
    root.mkdir()
    config = json.dumps({"rootfs": {"diff_ids": [digest(b"x")]}}).encode()
    manifest = put_json(root, {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"digest": put(root, config)},
                               "layers": [{"mediaType": "application/vnd.oci.image.layer.nondistributable.v1.tar",
                                           "digest": digest(b"x")}]})  # fmt: skip
    with pytest.raises(Unusable, match="a layer of media type"):
        ContentStore((root,)).image(manifest["digest"], AMD64)


def test_which_daemons_keep_the_containerd_store():
    assert contentstore.uses_containerd_store({"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]})
    assert not contentstore.uses_containerd_store({"DriverStatus": [["Backing Filesystem", "extfs"]]})
    assert not contentstore.uses_containerd_store({})


class _Client:
    def __init__(self, info: dict, base_url: str = "http+docker://localhost"):
        self._info = info
        self.api = type("Api", (), {"base_url": base_url})()

    def info(self) -> dict:
        return self._info


class _Engine:
    def __init__(self, client: _Client):
        self.client = client

    def sdk(self) -> _Client:
        return self.client


def test_open_store_says_why_it_cannot_serve(tmp_path, monkeypatch):
    monkeypatch.setattr(contentstore, "HOST_CONTAINERD", tmp_path / "no-host-containerd")
    ctrd = {"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]], "DockerRootDir": str(tmp_path)}
    with pytest.raises(Unusable, match="keeps the classic image store"):
        contentstore.open_store(_Engine(_Client({"Driver": "overlay2", "DriverStatus": []})))
    with pytest.raises(Unusable, match="not on a local socket"):
        contentstore.open_store(_Engine(_Client(ctrd, "http://10.0.0.1:2375")))
    with pytest.raises(Unusable, match="is not readable here"):
        contentstore.open_store(_Engine(_Client(ctrd)))
    blobs = tmp_path / "containerd" / "daemon" / "io.containerd.content.v1.content" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    assert contentstore.open_store(_Engine(_Client(ctrd))).root == blobs


# ------------------------------------------------------------------ the config digest both stores agree on


def test_the_config_digest_of_an_index_or_a_manifest_is_its_platforms_config(store):
    """What the classic store names the image by (its image id), read from the containerd store's manifest."""
    cs, index, manifest, config, _ = store
    assert cs.config_digest(index, AMD64) == cs.config_digest(manifest, AMD64) == digest(config)
    with pytest.raises(Unusable, match="holds 0 local manifests of linux/arm64"):
        cs.config_digest(index, ("linux", "arm64", None))
    (cs.root / digest(config).split(":")[1]).write_bytes(config + b" ")
    with pytest.raises(Unusable, match="does not hash to its name"):
        cs.config_digest(index, AMD64)  # the config is read and checked, not only named


def oci_save(root: Path, index_digest: str, big: bytes) -> bytes:
    """A containerd store's ``docker save`` of the image named ``index_digest``: every blob of ``root`` under
    blobs/sha256/, a layer larger than any manifest first, then index.json."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_file(tar, "blobs/sha256/" + digest(big).split(":")[1], big)
        for blob in sorted(root.iterdir()):
            add_file(tar, f"blobs/sha256/{blob.name}", blob.read_bytes())
        add_file(tar, "index.json", json.dumps({"manifests": [{"digest": index_digest}]}).encode())
        add_file(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    return buf.getvalue()


class _SavingClient(_Client):
    """A remote engine with the containerd store (its content store is not here) that exports ``saved``."""

    def __init__(self, saved: bytes, fail: Exception | None = None):
        super().__init__({"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}, "http://10.0.0.1:2375")
        self.asked: list[str] = []

        def get_image(image: str, chunk_size: int = 2 << 20):
            self.asked.append(image)
            if fail is not None:
                raise fail
            return (saved[i : i + 1000] for i in range(0, len(saved), 1000))

        self.api.get_image = get_image  # type: ignore[attr-defined]


def test_without_its_content_store_the_config_digest_is_read_from_the_export(store):
    cs, index, _, config, _ = store
    big = b"\0" * (contentstore._SMALL + 1)  # a layer: read past, never kept
    client = _SavingClient(oci_save(cs.root, index, big))
    assert contentstore.config_digest(_Engine(client), index, AMD64) == digest(config)
    assert client.asked == [index]
    saved = contentstore.saved_blobs(io.BytesIO(oci_save(cs.root, index, big)))
    assert digest(big).split(":")[1] not in saved.blobs and saved.holds(digest(config))


def test_a_remote_engine_exports_an_image_once_for_each_platform(store, tmp_path):
    """What an export told is remembered by (digest, platform): a digest names the image's bytes, so its config is
    the same on every engine and at every later build; a memo that is not well formed is not believed."""
    cs, index, _, config, _ = store
    client = _SavingClient(oci_save(cs.root, index, b"layer"))
    memo = tmp_path / "engine"
    for _ in range(3):
        assert contentstore.config_digest(_Engine(client), index, AMD64, memo) == digest(config)
    assert client.asked == [index]  # exported once
    with pytest.raises(Unusable, match="holds 0 local manifests of linux/arm64"):
        contentstore.config_digest(_Engine(client), index, ("linux", "arm64", None), memo)
    assert client.asked == [index, index]  # another platform is another question
    (memo / contentstore.MEMO).write_text(json.dumps({f"{index.split(':')[1]} linux/amd64": "sha256:forged"}))
    assert contentstore.config_digest(_Engine(client), index, AMD64, memo) == digest(config)
    assert client.asked == [index] * 3  # a malformed entry is asked again, and replaced
    assert json.loads((memo / contentstore.MEMO).read_text()) == {f"{index.split(':')[1]} linux/amd64": digest(config)}
    assert contentstore.config_digest(_Engine(client), index, AMD64) == digest(config)
    assert client.asked == [index] * 4  # no memo: no remembering
    (memo / contentstore.MEMO).unlink()
    os.mkfifo(memo / contentstore.MEMO)  # a FIFO where the memo was: refused by the bounded reader, never waited on
    assert contentstore.config_digest(_Engine(client), index, AMD64, memo) == digest(config)
    assert client.asked == [index] * 5


def test_an_export_that_lies_or_fails_is_unusable(store):
    cs, index, _, config, _ = store
    forged = oci_save(cs.root, index, b"layer").replace(b'"architecture": "amd64"', b'"architecture": "arm64"')
    with pytest.raises(Unusable, match="not on a local socket.*does not hash to its name"):
        contentstore.config_digest(_Engine(_SavingClient(forged)), index, AMD64)
    with pytest.raises(Unusable, match="exporting it failed: gone"):
        contentstore.config_digest(_Engine(_SavingClient(b"", fail=OSError("gone"))), index, AMD64)
    with pytest.raises(Unusable, match="export is unreadable"):
        contentstore.saved_blobs(io.BytesIO(b"not a tar" * 100))
