"""Parallel gzip and concurrent blob transfer: deterministic blobs, manifest order kept, nothing pushed twice."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from stackforge.clients.registry import RetryPolicy
from stackforge.publish import pgzip
from stackforge.publish.oci import ArchiveImage
from stackforge.publish.publisher import PublishOptions, publish
from stackforge.stack.scheme import TagScheme
from tests.fixtures.save_archive import layer_tar, save_archive
from tests.fixtures.stub_registry import StubRegistry

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01, total_seconds=10)
BLOCK = 64 << 10


def _gz(data: bytes, *, workers: int | None, level: int = 4, block: int = BLOCK) -> tuple[bytes, str]:
    out = io.BytesIO()
    if workers is None:
        diff = pgzip.compress(io.BytesIO(data), out.write, level=level, block=block)
    else:
        with ThreadPoolExecutor(workers) as pool:
            diff = pgzip.compress(io.BytesIO(data), out.write, level=level, block=block, pool=pool)
    return out.getvalue(), diff


@pytest.mark.parametrize("level", [2, 4])  # ISA-L, zlib
@pytest.mark.parametrize("size", [0, 1, BLOCK, 3 * BLOCK, 3 * BLOCK + 12345])
def test_parallel_gzip_is_deterministic_and_round_trips(size, level):
    rng = random.Random(size)
    data = b"".join(
        rng.randbytes(4096) if i % 3 == 0 else b"def f(x): return x\n" * 215 for i in range(size // 4096 + 1)
    )
    data = data[:size]
    blobs = {_gz(data, workers=w, level=level) for w in (None, 1, 2, 5)}
    assert len(blobs) == 1, "the blob depends on the number of workers"
    blob, diff_id = blobs.pop()
    assert gzip.decompress(blob) == data
    assert diff_id == "sha256:" + hashlib.sha256(data).hexdigest()
    assert blob[:4] == b"\x1f\x8b\x08\x00" and blob[4:8] == b"\0\0\0\0"  # no name, mtime 0
    assert _gz(data, workers=2, level=level + 1)[0] != blob or size < 64  # the level is part of the blob


def test_blocks_are_primed_with_the_previous_window():
    """Repetition across a block boundary still compresses: block n+1 sees block n's last 32 KiB."""
    unit = random.Random(7).randbytes(16 << 10)
    blob, _ = _gz(unit * 16, workers=2)  # four blocks
    assert len(blob) < 1.5 * len(unit)  # blocks 2-4 refer back into the window instead of storing 16 KiB again


def test_uploads_finishing_out_of_order_keep_the_manifest_order(tmp_path):
    rng = random.Random(3)
    sizes = [900_000, 10, 300_000, 5, 600_000, 70_000]
    layers = [layer_tar({f"l{i}/data": rng.randbytes(n)}) for i, n in enumerate(sizes)]
    path = tmp_path / "img.tar"
    image_id = save_archive(path, layers, flavour="oci")
    with StubRegistry() as reg:
        options = PublishOptions(
            policy=FAST, lock_dir=tmp_path / "locks", layer_cache=tmp_path / "cache", settle_seconds=0
        )
        res = publish(ArchiveImage(path, image_id=image_id), f"{reg.address}/many/layers", TagScheme.from_prefix("t-"),
                      "20260101", options)  # fmt: skip
        doc = json.loads(reg.manifests[res.digest][0])
        got = [hashlib.sha256(gzip.decompress(reg.blobs[d["digest"]])).hexdigest() for d in doc["layers"]]
    assert got == [hashlib.sha256(layer).hexdigest() for layer in layers]
    uploaded = [e["digest"] for e in res.push_log if e["event"] == "blob-upload"]
    assert len(uploaded) == len(set(uploaded)) == len(layers) + 1  # each layer and the config, once


def test_a_republish_reads_only_the_layers_the_registry_lacks(tmp_path):
    """OCI layout: a layer whose cached blob the registry holds is skipped by name, not compressed again."""
    base, app1, app2 = (layer_tar({f"f{i}": random.Random(i).randbytes(200_000)}) for i in range(3))
    one, two = tmp_path / "one.tar", tmp_path / "two.tar"
    id1, id2 = save_archive(one, [base, app1], flavour="oci"), save_archive(two, [base, app2], flavour="oci")
    options = PublishOptions(policy=FAST, lock_dir=tmp_path / "locks", layer_cache=tmp_path / "cache", settle_seconds=0)
    with StubRegistry() as reg:
        dest = f"{reg.address}/app/one"
        publish(ArchiveImage(one, image_id=id1), dest, TagScheme.from_prefix("t-"), "20260101", options)
        res = publish(ArchiveImage(two, image_id=id2), dest, TagScheme.from_prefix("t-"), "20260101", options)
    exported = next(e for e in res.push_log if e["event"] == "exported")
    assert exported["layers_already_in_registry"] == 1
    uploads = [e["size"] for e in res.push_log if e["event"] == "blob-upload"]
    assert len(uploads) == 2  # the changed layer and the config


@pytest.mark.parametrize("seed", range(6))
def test_blocks_cut_any_chunking_into_whole_blocks(seed):
    """Chunks of any sizes (empty ones, ones longer than a block) give the same blocks, and the same blob, as the
    whole input read from a file."""
    rng = random.Random(seed)
    data = rng.randbytes(rng.choice([0, BLOCK, 3 * BLOCK, 3 * BLOCK + rng.randrange(1, BLOCK)]))
    chunks, at = [], 0
    while at < len(data):
        n = rng.choice([0, 1, 511, 4096, BLOCK - 1, BLOCK, 2 * BLOCK + 7])
        chunks.append(data[at : at + n])
        at += n
    pieces = list(pgzip.blocks(iter(chunks), BLOCK))
    assert b"".join(pieces) == data
    assert all(len(p) == BLOCK for p in pieces[:-1]) and len(pieces[-1]) < BLOCK
    assert len(pieces) == len(data) // BLOCK + 1  # the last is empty when the input is a whole number of blocks
    out = io.BytesIO()
    with ThreadPoolExecutor(2) as pool:
        diff = pgzip.compress_chunks(iter(chunks), out.write, level=2, block=BLOCK, pool=pool)
    assert (out.getvalue(), diff) == _gz(data, workers=2, level=2)
