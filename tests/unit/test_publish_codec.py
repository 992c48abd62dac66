"""Layer codecs: zstd blobs that decompress to the layer, the same bytes whatever the core count, levels
refused outside their range, and a publish that writes zstd layers and keeps them apart in the layer cache."""

from __future__ import annotations

import io
import json
import os
import random

import pytest
import zstandard

from stackforge.errors import UserError
from stackforge.publish import codec as codecmod
from stackforge.publish import pgzip
from stackforge.publish.codec import OCI_LAYER_GZIP, OCI_LAYER_ZSTD, codec
from stackforge.publish.oci import ArchiveImage, read_save_stream
from stackforge.publish.publisher import PublishOptions, publish
from stackforge.stack.scheme import TagScheme
from tests.fixtures.save_archive import layer_tar, save_archive
from tests.fixtures.stub_registry import StubRegistry, digest_of

SCHEME = TagScheme.from_prefix("v0.28.0-musa5.2.0")


def sample(size: int = 5 << 20) -> bytes:
    """Half random, half repetitive: something to compress, larger than one zstd job of a small level."""
    rng = random.Random(7)
    return rng.randbytes(size // 2) + b"vllm serve --attention-backend FLASH_ATTN\n" * (size // 84)


def packed(name: str, data: bytes, level: int | None = None, head: bytes = b"") -> tuple[bytes, str]:
    c = codec(name, level)
    assert c is not None
    out = bytearray()
    pool = c.pool()
    try:
        diff = c.compress(io.BytesIO(data), out.extend, pool=pool, head=head)
    finally:
        if pool is not None:
            pool.shutdown()
    return bytes(out), diff


def test_zstd_blob_decompresses_to_the_layer_and_names_its_diff_id():
    data = sample()
    blob, diff = packed("zstd", data[8:], head=data[:8])
    assert blob[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert zstandard.ZstdDecompressor().decompressobj().decompress(blob) == data
    assert diff == digest_of(data)
    assert len(blob) < len(data) * 0.6


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_zstd_gives_the_same_bytes_on_any_core_count(monkeypatch, workers):
    data = sample()
    reference, _ = packed("zstd", data)
    monkeypatch.setattr(pgzip, "workers", lambda: workers)
    assert packed("zstd", data)[0] == reference


def test_levels_change_the_bytes_and_are_checked():
    data = sample(1 << 20)
    assert packed("zstd", data, 1)[0] != packed("zstd", data, 19)[0]
    assert codec("zstd").level == codecmod.LEVELS["zstd"][2] and codec("gzip").level == 2
    assert codec("none") is None
    assert codec("zstd", 3).key == "zstd-3" and codec("gzip", 1).key == "igzip-1" and codec("gzip", 4).key == "pgzip-4"
    assert codec("zstd").media_type == OCI_LAYER_ZSTD and codec("gzip").media_type == OCI_LAYER_GZIP
    for name, level in [("zstd", 0), ("zstd", 20), ("gzip", 10), ("gzip", True)]:
        with pytest.raises(UserError) as err:
            codec(name, level)
        assert f"{name} level" in err.value.message and "from" in (err.value.fix or "")
    with pytest.raises(UserError, match="unknown layer compression 'brotli'"):
        codec("brotli")


def test_a_save_stream_becomes_zstd_layers(tmp_path):
    layers = [layer_tar({"a": b"1"}), layer_tar({"b": os.urandom(1000) + b"2" * 50000})]
    save_archive(tmp_path / "img.tar", layers, flavour="oci")
    made = []
    for i in range(2):
        with open(tmp_path / "img.tar", "rb") as fh:
            made.append(read_save_stream(fh, tmp_path / f"w{i}", compression="zstd"))
    img = made[0]
    assert made[1].digest == img.digest  # deterministic
    assert [layer.media_type for layer in img.layers] == [OCI_LAYER_ZSTD] * 2
    assert [layer.diff_id for layer in img.layers] == [digest_of(layer) for layer in layers]
    assert zstandard.ZstdDecompressor().decompressobj().decompress(img.layers[1].path.read_bytes()) == layers[1]
    doc = json.loads(img.manifest)
    assert {d["mediaType"] for d in doc["layers"]} == {OCI_LAYER_ZSTD}


def test_publish_writes_zstd_layers_and_the_cache_keeps_codecs_apart(tmp_path):
    base = layer_tar({"etc/os-release": b"ID=debian\n" * 200})
    path = tmp_path / "a.tar"
    save_archive(path, [base, layer_tar({"app/a.txt": b"a" * 4000})])
    with StubRegistry() as reg:

        def run(compression: str, repo: str):
            options = PublishOptions(
                compression=compression, layer_cache=tmp_path / "layers", settle_seconds=0, lock_dir=tmp_path / "locks"
            )
            return publish(ArchiveImage(path), f"{reg.address}/{repo}", SCHEME, "20260929", options)

        gz = run("gzip", "team/gz")
        zs = run("zstd", "team/zs")
        again = run("zstd", "team/zs2")
        manifest = json.loads(reg.manifests[zs.digest][0])
    assert gz.digest != zs.digest and again.digest == zs.digest
    exported = next(e for e in zs.push_log if e["event"] == "exported")
    assert exported["layers_already_in_registry"] == 0  # gzip blobs of the same layers are not zstd blobs
    assert {d["mediaType"] for d in manifest["layers"]} == {OCI_LAYER_ZSTD}
