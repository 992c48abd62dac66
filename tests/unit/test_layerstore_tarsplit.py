"""The layer-store reader (clients/layerstore.py) on tar-splits written here from real tar files."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from stackforge.clients import layerstore
from stackforge.clients.layerstore import LayerStore, Unusable, chain_ids


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_tar(files: dict[bytes, bytes | None]) -> bytes:
    """A tar of ``files`` (None: a directory), PAX format, with a hard link and a symlink."""
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for raw, data in files.items():
            info = tarfile.TarInfo(os.fsdecode(raw))
            info.mtime = 1700000000
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("srv/hard")
        link.type, link.linkname = tarfile.LNKTYPE, "srv/big.bin"
        tar.addfile(link)
        sym = tarfile.TarInfo("srv/sym")
        sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(sym)
    return buf.getvalue()


def split(tar_bytes: bytes, diff_dir: Path) -> bytes:
    """What the daemon stores for ``tar_bytes``: the tar-split JSON lines (gzip), files extracted to ``diff_dir``."""
    lines, pos = [], 0

    def segment(end: int) -> None:
        nonlocal pos
        if end > pos:
            lines.append({"type": 2, "payload": base64.b64encode(tar_bytes[pos:end]).decode(), "position": len(lines)})
        pos = end

    with tarfile.open(fileobj=io.BytesIO(tar_bytes), encoding="utf-8", errors="surrogateescape") as tar:
        for m in tar.getmembers():
            segment(m.offset_data)
            raw = os.fsencode(m.name)
            entry: dict = {"type": 1, "size": m.size if m.isreg() else 0, "payload": None, "position": len(lines)}
            try:
                entry["name"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                entry["name_raw"] = base64.b64encode(raw).decode()
            lines.append(entry)
            if m.isreg():
                target = diff_dir / os.fsdecode(raw)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar_bytes[m.offset_data : m.offset_data + m.size])
                pos = m.offset_data + m.size
    segment(len(tar_bytes))
    return gzip.compress(b"".join(json.dumps(x).encode() + b"\n" for x in lines))


def store_with(tmp_path: Path, tar_bytes: bytes, parent: str | None = None) -> tuple[LayerStore, str, str]:
    """A data root holding one layer made of ``tar_bytes``; (store, diff id, chain id)."""
    diff_id = sha(tar_bytes)
    chain = chain_ids([parent, diff_id])[1] if parent else diff_id
    files = tmp_path / "overlay2" / "abc123" / "diff"
    files.mkdir(parents=True)
    entry = tmp_path / "image" / "overlay2" / "layerdb" / "sha256" / chain.split(":")[1]
    entry.mkdir(parents=True)
    (entry / "tar-split.json.gz").write_bytes(split(tar_bytes, files))
    (entry / "diff").write_text(diff_id)
    (entry / "cache-id").write_text("abc123")
    return LayerStore(tmp_path), diff_id, chain


FILES = {
    b"srv": None,
    b"srv/app.py": b"print('hello')\n" * 100,
    b"srv/big.bin": os.urandom(3 << 20) + b"tail",
    b"srv/empty": b"",
    b"srv/caf\xe9-latin1.txt": b"not utf-8 name\n",
    b"srv/" + b"long-name-" * 15 + b".txt": b"a name over 100 bytes takes a PAX header\n",
}


def test_rebuilds_the_tar_byte_for_byte(tmp_path):
    tar_bytes = make_tar(FILES)
    store, diff_id, chain = store_with(tmp_path, tar_bytes)
    layer = store.layer(diff_id, chain)
    assert b"".join(layer.chunks()) == tar_bytes


def test_chain_ids_follow_the_layer_store_rule():
    a, b, c = (sha(x) for x in (b"a", b"b", b"c"))
    ids = chain_ids([a, b, c])
    assert ids[0] == a
    assert ids[1] == sha(f"{a} {b}".encode())
    assert ids[2] == sha(f"{ids[1]} {c}".encode())


def test_a_changed_file_changes_the_digest_and_a_resized_one_is_refused(tmp_path):
    tar_bytes = make_tar(FILES)
    store, diff_id, chain = store_with(tmp_path, tar_bytes)
    app = tmp_path / "overlay2" / "abc123" / "diff" / "srv" / "app.py"
    app.write_bytes(app.read_bytes().replace(b"hello", b"HELLO"))
    assert sha(b"".join(store.layer(diff_id, chain).chunks())) != diff_id  # the caller's digest check refuses it
    app.write_bytes(b"shorter")
    with pytest.raises(Unusable, match="app.py is not 1500 bytes"):
        b"".join(store.layer(diff_id, chain).chunks())


def test_refuses_names_that_leave_the_layer_and_unknown_entries(tmp_path):
    store, diff_id, chain = store_with(tmp_path, make_tar({b"srv/x": b"x"}))
    split_path = store.layer(diff_id, chain).tar_split
    for bad, message in (
        ({"type": 1, "name": "../../etc/shadow", "size": 5}, "leaves the layer"),
        ({"type": 7, "payload": None}, "unknown type 7"),
    ):
        split_path.write_bytes(gzip.compress(json.dumps(bad).encode() + b"\n"))
        with pytest.raises(Unusable, match=message):
            b"".join(store.layer(diff_id, chain).chunks())


def test_store_entries_are_checked(tmp_path):
    tar_bytes = make_tar({b"srv/x": b"x"})
    store, diff_id, chain = store_with(tmp_path, tar_bytes)
    with pytest.raises(Unusable, match="holds diff id"):
        store.layer(sha(b"other"), chain)
    with pytest.raises(Unusable, match="cannot read"):
        store.layer(diff_id, sha(b"no such chain"))
    entry = store.root / "image" / "overlay2" / "layerdb" / "sha256" / chain.split(":")[1]
    (entry / "cache-id").write_text("../../etc")
    with pytest.raises(Unusable, match="bad cache-id"):
        store.layer(diff_id, chain)
    (entry / "cache-id").write_text("gone")
    with pytest.raises(Unusable, match="missing or unreadable"):
        store.layer(diff_id, chain)


def test_a_layer_carries_the_size_the_store_records_and_none_it_cannot_read(tmp_path):
    """``size`` orders work only: what the store records beside ``diff`` when it is a number, else 0."""
    store, diff_id, chain = store_with(tmp_path, make_tar({b"srv/x": b"x"}))
    entry = store.root / "image" / "overlay2" / "layerdb" / "sha256" / chain.split(":")[1]
    assert store.layer(diff_id, chain).size == 0  # not recorded
    (entry / "size").write_text("3145728")
    assert store.layer(diff_id, chain).size == 3145728
    for bad in ("-5", "many", ""):
        (entry / "size").write_text(bad)
        assert store.layer(diff_id, chain).size == 0


def test_config_must_hash_to_the_image_id(tmp_path):
    config = b'{"rootfs":{"type":"layers","diff_ids":[]}}'
    content = tmp_path / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    content.mkdir(parents=True)
    (content / sha(config).split(":")[1]).write_bytes(config)
    store = LayerStore(tmp_path)
    assert store.config(sha(config)) == config
    (content / sha(config).split(":")[1]).write_bytes(config + b" ")
    with pytest.raises(Unusable, match="does not hash to the image id"):
        store.config(sha(config))
    with pytest.raises(Unusable, match="not a sha256 digest"):
        store.config("sha256:../../x")


class _Api:
    def __init__(self, base_url: str):
        self.base_url = base_url


class _Client:
    def __init__(self, base_url: str, info: dict):
        self.api, self._info = _Api(base_url), info

    def info(self) -> dict:
        return self._info


class _Engine:
    def __init__(self, base_url: str, info: dict):
        self.client = _Client(base_url, info)

    def sdk(self) -> _Client:
        return self.client


def test_open_store_answers_only_for_a_local_readable_overlay2(tmp_path):
    (tmp_path / "image" / "overlay2" / "layerdb" / "sha256").mkdir(parents=True)
    local = "http+docker://localhost"
    good = {"Driver": "overlay2", "DockerRootDir": str(tmp_path)}
    assert layerstore.open_store(_Engine(local, good)).root == tmp_path
    for url, info, message in (
        ("http://10.0.0.5:2375", good, "not on a local socket"),
        ("http+docker://ssh", good, "not on a local socket"),
        (local, {**good, "Driver": "overlayfs"}, "not overlay2"),
        (local, {**good, "DockerRootDir": str(tmp_path / "elsewhere")}, "not readable"),
        (local, {**good, "DockerRootDir": "relative"}, "not readable"),
    ):
        with pytest.raises(Unusable, match=message):
            layerstore.open_store(_Engine(url, info))


class _CountingEngine(_Engine):
    def __init__(self, base_url: str, info: dict):
        super().__init__(base_url, info)
        self.asked = 0

    def sdk(self) -> _Client:
        self.asked += 1
        return self.client


def test_open_store_asks_each_engine_once_and_a_refusal_again(tmp_path):
    (tmp_path / "image" / "overlay2" / "layerdb" / "sha256").mkdir(parents=True)
    good = {"Driver": "overlay2", "DockerRootDir": str(tmp_path)}
    engine = _CountingEngine("http+docker://localhost", good)
    assert layerstore.open_store(engine) is layerstore.open_store(engine)
    assert engine.asked == 1
    other = _CountingEngine("http+docker://localhost", good)  # another daemon connection is asked itself
    layerstore.open_store(other)
    assert other.asked == 1
    remote = _CountingEngine("http://10.0.0.5:2375", good)
    for _ in range(2):
        with pytest.raises(Unusable):
            layerstore.open_store(remote)
    assert remote.asked == 2


def test_read_image_answers_from_the_tree_or_none_for_the_fallback(tmp_path, monkeypatch):
    opened: list[object] = []

    class _Store:
        def tree(self, image_id: str) -> str:
            if image_id == "sha256:gone":
                raise Unusable("no such image in the store")
            return f"tree of {image_id}"

    def fake_open(engine: object) -> _Store:
        opened.append(engine)
        return _Store()

    monkeypatch.setattr(layerstore, "open_store", fake_open)
    assert layerstore.read_image("engine", "sha256:abc", lambda tree: f"read {tree}") == "read tree of sha256:abc"
    assert layerstore.read_image("engine", None, lambda tree: "never") is None
    assert layerstore.read_image("engine", "", lambda tree: "never") is None
    assert opened == ["engine"]  # no image id: the store is not even opened
    assert layerstore.read_image("engine", "sha256:gone", lambda tree: "never") is None

    def refuses(tree: object) -> str:
        raise Unusable("a symlink on the path")

    assert layerstore.read_image("engine", "sha256:abc", refuses) is None
    assert layerstore.read_image("engine", "sha256:abc", lambda tree: []) == []  # an empty answer is an answer

    def breaks(tree: object) -> str:
        raise OSError("disk gone")

    with pytest.raises(OSError):  # only Unusable means "ask a container"
        layerstore.read_image("engine", "sha256:abc", breaks)
