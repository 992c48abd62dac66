"""Layers rebuilt from the engine's overlay2 layer store are the bytes `docker save` exports, and a layer the
store cannot rebuild exactly sends the publish back to `docker save`.

One image, built by the engine on the Debian rootfs: a COPY layer with a name over 100 bytes, a 3 MiB random
file, an empty file and a symlink; a RUN layer with a non-UTF-8 name, a whiteout (a deleted file of the base), an
opaque directory, a hard link, a setuid file and a FIFO. (The non-UTF-8 name is made by the RUN step: BuildKit 0.14
and later refuse one in a build context, their gRPC messages carrying file names as UTF-8 strings.)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from stackforge.builder.records import imagerecords
from stackforge.clients import layerstore
from stackforge.clients.engine import Engine
from stackforge.publish.oci import ArchiveImage, DockerImage, LayerCache
from stackforge.publish.publisher import PushLog
from tests.fixtures import run_names

pytestmark = [pytest.mark.engine]

ROOTFS = "stackforge/base-rootfs:bookworm"


def docker(*args: str) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {proc.stderr}")
    return proc.stdout.strip()


#: records a build leaves in an image (builder/records/imagerecords.py); the RUN layer deletes target b's and appends
#: to the gate's result
RECORDS = {
    "gate/result.txt": "PASS import torch version=2.14.1\n",
    "gate/abi.txt": "\nabi line\n\n",
    "targets/a/checks.txt": "a: PASS one\n",
    "targets/b/checks.txt": "b: PASS deleted above\n",
    "targets/c/checks.txt": "c: PASS two\n",
    "inventory.json": '{"dists": []}\n',
}


def write_context(ctx: Path, base: str) -> Path:
    """The test image's build context on ``base``."""
    files = ctx / "files"
    files.mkdir()
    (files / ("long-name-" * 15 + ".txt")).write_text("over 100 bytes: a PAX header\n")
    (files / "big.bin").write_bytes(os.urandom(3 << 20))
    (files / "empty").write_bytes(b"")
    (files / "link").symlink_to("big.bin")
    records = ctx / "records"
    for path, text in RECORDS.items():
        (records / path).parent.mkdir(parents=True, exist_ok=True)
        (records / path).write_text(text)
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "COPY files /srv/files\n"
        "COPY records /stackforge\n"
        "RUN rm /etc/issue && rm -rf /etc/apt && mkdir /etc/apt && echo new > /etc/apt/sources.list"
        " && printf 'not a UTF-8 name\\n' > \"$(printf '/srv/files/caf\\351-latin1.txt')\""
        " && ln /srv/files/big.bin /srv/hard && cp /bin/true /srv/suid && chmod 4755 /srv/suid"
        " && mkfifo /srv/fifo && rm -r /stackforge/targets/b && echo late >> /stackforge/gate/result.txt\n"
    )
    return ctx


@pytest.fixture(scope="module")
def image(engine: Engine, base_image: str, tmp_path_factory):
    """(reference, image id) of the test image; removed at the end."""
    base = ROOTFS if engine.image_exists(ROOTFS) else base_image  # the small one when the base build kept it
    ctx = write_context(tmp_path_factory.mktemp("layerstore"), base)
    ref = f"{run_names.NS}/layerstore:{uuid.uuid4().hex[:8]}"
    docker("buildx", "build", "--load", "-q", "-t", ref, str(ctx))
    yield ref, engine.image_id(ref)
    subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)


@pytest.fixture(scope="module")
def saved(engine: Engine, image, tmp_path_factory) -> Path:
    """The image as `docker save` exports it."""
    path = tmp_path_factory.mktemp("saved") / "image.tar"
    with open(path, "wb") as out:
        for chunk in engine.export_image(image[1]):
            out.write(chunk)
    return path


def test_each_layer_rebuilt_from_the_store_is_the_layer_docker_save_exports(engine, image, saved):
    store = layerstore.open_store(engine)
    config = store.config(image[1])
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    with tarfile.open(saved) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(tar.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))  # type: ignore[arg-type]
        assert manifest["config"]["digest"] == image[1]
        for layer, diff_id, chain_id in zip(manifest["layers"], diff_ids, layerstore.chain_ids(diff_ids)):
            exported = tar.extractfile("blobs/sha256/" + layer["digest"].split(":")[1]).read()  # type: ignore[union-attr]
            rebuilt = b"".join(store.layer(diff_id, chain_id).chunks())
            assert hashlib.sha256(rebuilt).hexdigest() == diff_id.split(":")[1]
            assert rebuilt == exported
    top = tarfile.open(fileobj=io.BytesIO(rebuilt))
    names = top.getnames()
    assert "etc/.wh.issue" in names and "etc/apt/.wh..wh..opq" in names and "srv/fifo" in names


def test_publish_export_skips_docker_save_and_matches_it(engine, image, saved, tmp_path):
    log = PushLog()
    from_store = DockerImage(image[0]).prepare(tmp_path / "store", compression="gzip", log=log)
    events = [e["event"] for e in log.events]
    assert "export-from-layer-store" in events and "export-from-layer-store-refused" not in events
    from_save = ArchiveImage(saved).prepare(tmp_path / "save", compression="gzip", log=PushLog())
    assert from_store.image_id == from_save.image_id == image[1]
    assert [b.digest for b in from_store.layers] == [b.digest for b in from_save.layers]
    assert from_store.digest == from_save.digest
    # rebuilt largest first (the sizes the store records), the manifest in the image's own order all the same
    store = layerstore.open_store(engine)
    diff_ids = json.loads(store.config(image[1]))["rootfs"]["diff_ids"]
    sizes = [store.layer(d, c).size for d, c in zip(diff_ids, layerstore.chain_ids(diff_ids))]
    rebuilt = [e["index"] for e in log.events if e["event"] == "layer-rebuilt"]
    assert sizes[0] > 1 << 20 and sizes[1] >= 3 << 20  # the base's files; the COPY of a 3 MiB file
    assert rebuilt == sorted(range(len(diff_ids)), key=lambda i: -sizes[i])
    assert rebuilt != sorted(rebuilt)  # this image's layers are not largest first already (its base's second is)


def test_a_layer_the_store_rebuilds_wrong_falls_back_to_docker_save(engine, image, tmp_path, monkeypatch):
    """A copy of the store whose top layer has one byte changed (same size): the rebuilt layer's digest is
    refused, the publish log says so, and the export from `docker save` gives the same image."""
    real = layerstore.open_store(engine)
    config = real.config(image[1])
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    fake = tmp_path / "root"
    (fake / "image").mkdir(parents=True)
    (fake / "image" / "overlay2").symlink_to(real.root / "image" / "overlay2")
    (fake / "overlay2").mkdir()
    layers = [real.layer(d, c) for d, c in zip(diff_ids, layerstore.chain_ids(diff_ids))]
    for layer in layers[:-1]:
        (fake / "overlay2" / layer.files.parent.name).symlink_to(layer.files.parent)
    top = fake / "overlay2" / layers[-1].files.parent.name

    def special(d: str, names: list[str]) -> list[str]:  # whiteouts and FIFOs: no payload to copy
        return [
            n for n in names if not any(f(os.path.join(d, n)) for f in (os.path.islink, os.path.isfile, os.path.isdir))
        ]

    shutil.copytree(
        layers[-1].files, top / "diff", symlinks=True, ignore=special
    )  # whiteouts and FIFOs have no payload
    sources = top / "diff" / "etc" / "apt" / "sources.list"
    sources.write_bytes(sources.read_bytes().replace(b"new", b"NEW"))
    monkeypatch.setattr(layerstore, "open_store", lambda _engine: layerstore.LayerStore(fake))

    # Lower layers are in the registry already (a stub cache), so only the top two are rebuilt.
    good = DockerImage(image[0]).prepare(tmp_path / "good", compression="gzip", log=PushLog())
    cache = LayerCache(tmp_path / "cache", lambda digest, diff_id: diff_id in diff_ids[:-2])
    for b in good.layers:
        cache.record(b.diff_id, b.digest, b.size)  # type: ignore[arg-type]
    log = PushLog()
    again = DockerImage(image[0]).prepare(tmp_path / "again", compression="gzip", log=log, cache=cache)
    refused = [e for e in log.events if e["event"] == "export-from-layer-store-refused"]
    assert len(refused) == 1 and f"not {diff_ids[-1]}" in refused[0]["reason"], log.events
    assert refused[0]["then"] == "docker save"
    assert again.digest == good.digest


#: what the engine's init layer puts in every container, over the image's own files
CONTAINER_INIT = {"etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab"}


def test_the_files_read_from_the_store_are_what_a_container_of_the_image_sees(engine, image):
    """Every directory listing and regular file under /etc, /srv and /stackforge (a whiteout, an opaque
    directory, a non-UTF-8 name, hard links) as `docker cp` copies them out of a container of the image; and
    the build records, the Debian package list included, as the container run prints them."""
    tree = layerstore.open_store(engine).tree(image[1])
    cid = docker("create", image[0], "true")
    try:
        for top in ("etc", "srv", "stackforge"):
            copied = subprocess.run(["docker", "cp", f"{cid}:/{top}", "-"], capture_output=True, check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(copied)) as tar:
                children: dict[str, list[str]] = {}
                members = [m for m in tar.getmembers() if m.name not in CONTAINER_INIT]
                for m in members:
                    parent, _, name = m.name.rpartition("/")
                    if parent:
                        children.setdefault(parent, []).append(name)
                checked = 0
                for m in members:
                    if m.isdir():
                        listed = [n for n in tree.listdir("/" + m.name) if f"{m.name}/{n}" not in CONTAINER_INIT]
                        assert listed == sorted(children.get(m.name, []), key=os.fsencode), m.name
                    elif m.isreg():
                        assert tree.read("/" + m.name) == tar.extractfile(m).read(), m.name  # type: ignore[union-attr]
                        checked += 1
                assert checked >= 3
    finally:
        docker("rm", "-f", cid)
    assert tree.read("/etc/issue") is None and tree.listdir("/etc/apt") == ["sources.list"]
    assert tree.listdir("/stackforge/targets") == ["a", "c"]

    layers = imagerecords.from_tree(layerstore.open_store(engine).tree(image[1]))
    assert layers == imagerecords.from_container(engine, image[0])
    assert layers["result.txt"] == ["PASS import torch version=2.14.1", "late"]
    assert layers["checks.txt"] == ["a: PASS one", "c: PASS two"] and layers["abi.txt"] == ["abi line"]
    assert len(layers[imagerecords.DPKG]) > 50 and any(line.startswith("libc6\t") for line in layers[imagerecords.DPKG])


# ------------------------------------------------------------------ the containerd image store


@pytest.fixture(scope="module")
def containerd_image(containerd_store, base_image, tmp_path_factory):
    """The same image built on a second engine with the containerd image store: (reference, its engine)."""
    ctx = write_context(tmp_path_factory.mktemp("contentstore"), base_image)
    ref = f"{run_names.NS}/contentstore:{uuid.uuid4().hex[:8]}"
    built = containerd_store.docker("buildx", "build", "--load", "-q", "-t", ref, str(ctx))
    assert built.returncode == 0, built.stderr
    yield ref, Engine(env=containerd_store.env)
    containerd_store.docker("image", "rm", "-f", ref)


def test_on_the_containerd_store_publish_reads_the_content_store_and_matches_docker_save(containerd_image, tmp_path):
    """No layer store there: the export reads the image's blobs from containerd's content store (the store names
    the image by its index's digest; the config is the index's amd64 manifest's) and gives what `docker save` of
    that store gives, itself read through the index."""
    ref, engine = containerd_image
    image_id = engine.image_id(ref)
    log = PushLog()
    fast = DockerImage(ref, engine=engine).prepare(tmp_path / "fast", compression="gzip", log=log)
    events = [e["event"] for e in log.events]
    assert "export-from-content-store" in events and "export-from-layer-store-refused" not in events, log.events
    saved = tmp_path / "saved.tar"
    with open(saved, "wb") as out:
        for chunk in engine.export_image(image_id):
            out.write(chunk)
    from_save = ArchiveImage(saved, image_id=image_id).prepare(tmp_path / "save", compression="gzip", log=PushLog())
    assert image_id != fast.image_id == from_save.image_id  # the config digest, not the store's name of the image
    assert [b.diff_id for b in fast.layers] == json.loads(fast.config.data or b"")["rootfs"]["diff_ids"]
    assert fast.digest == from_save.digest
    rebuilt = [e["index"] for e in log.events if e["event"] == "layer-rebuilt"]
    sizes = [b.size for b in fast.layers]  # ours, where the store's blobs ordered the work: the largest is clear here
    assert sorted(rebuilt) == list(range(len(fast.layers))) and rebuilt != sorted(rebuilt)
    assert sizes[rebuilt[0]] == max(sizes)
    # the build records: no layer store to read them from, so a container of the image prints them
    records = imagerecords.read(engine, ref, image_id)
    assert records["result.txt"] == ["PASS import torch version=2.14.1", "late"]
    assert records[imagerecords.CHECKS] == ["a: PASS one", "c: PASS two"]
