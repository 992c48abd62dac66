"""Layer tars normalized for reproducible digests: the same files in another order, at other times, with other
owner names and pax records give the same bytes; what the layer unpacks to does not change."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from stackforge.publish.normalize import OutOfOrder, key, normalize, stream

EPOCH = 1758800000  # 2025-09-25, a pinned commit's time


def entry(name: str, data: bytes | None = None, **kw) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    if data is not None:
        info.size = len(data)
    for attr, value in kw.items():
        setattr(info, attr, value)
    return info, data


def layer(entries, fmt=tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def normalized(raw: bytes) -> bytes:
    out = io.BytesIO()
    normalize(io.BytesIO(raw), out, EPOCH)
    return out.getvalue()


def tree(raw: bytes) -> dict[str, tuple]:
    """What the layer unpacks to: per name its type, mode, owner ids, link target, xattrs and content."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for info in tar:
            data = tar.extractfile(info).read() if info.isreg() else b""
            xattrs = {k: v for k, v in info.pax_headers.items() if "xattr" in k}
            out[info.name] = (info.type, info.mode, info.uid, info.gid, info.linkname, xattrs, data)
    return out


def ping_pax(when: int, ctime: bool = False) -> dict[str, str]:
    """ping's capability (an xattr, kept) and the access/change times a build host wrote (dropped)."""
    pax = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02", "atime": f"{when}.123"}
    return {**pax, "ctime": f"{when}.456"} if ctime else pax


def build_a(when: int) -> bytes:
    d = tarfile.DIRTYPE
    return layer(
        [
            entry("usr", type=d, mode=0o755, mtime=when),
            entry("usr/bin", type=d, mode=0o755, mtime=when),
            entry("usr/bin/python3", b"\x7fELF python", mode=0o755, mtime=when, uname="root", gname="root"),
            entry("usr/bin/ping", b"\x7fELF ping", mode=0o755, mtime=100, pax_headers=ping_pax(when, ctime=True)),
            entry("opt/venv/.wh..wh..opq", b"", mtime=when),
            entry("opt/venv/lib/a.py", b"print('a')\n", mtime=when, uid=1000, gid=1000, uname="builder"),
        ]
    )


def build_b(when: int) -> bytes:
    """The same files listed in another order, created at another time by a host with other user names."""
    d = tarfile.DIRTYPE
    return layer(
        [
            entry("opt/venv/lib/a.py", b"print('a')\n", mtime=when, uid=1000, gid=1000, uname="ci"),
            entry("usr/bin/ping", b"\x7fELF ping", mode=0o755, mtime=100, pax_headers=ping_pax(when + 1)),
            entry("usr", type=d, mode=0o755, mtime=when),
            entry("opt/venv/.wh..wh..opq", b"", mtime=when),
            entry("usr/bin", type=d, mode=0o755, mtime=when),
            entry("usr/bin/python3", b"\x7fELF python", mode=0o755, mtime=when, uname="", gname="wheel"),
        ]
    )


def test_the_same_files_give_the_same_bytes():
    a, b = build_a(EPOCH + 3600), build_b(EPOCH + 86400)
    assert hashlib.sha256(a).digest() != hashlib.sha256(b).digest()
    assert normalized(a) == normalized(b)
    assert normalized(normalized(a)) == normalized(a)  # normalizing is idempotent


def test_content_is_unchanged_and_times_are_clamped():
    raw = build_a(EPOCH + 3600)
    out = normalized(raw)
    assert tree(out) == tree(raw)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        infos = {i.name: i for i in tar}
    assert [n for n in infos] == sorted(infos, key=key)
    assert infos["usr/bin/python3"].mtime == EPOCH and infos["usr/bin/ping"].mtime == 100  # older files keep theirs
    assert {i.uname for i in infos.values()} == {""} and {i.gname for i in infos.values()} == {""}
    assert set(infos["usr/bin/ping"].pax_headers) == {"SCHILY.xattr.security.capability"}


def test_a_hard_link_whose_target_sorts_later_is_written_the_other_way_round():
    raw = layer(
        [
            entry("z/lib.so.1", b"shared object", mode=0o644, mtime=EPOCH),
            entry("a/lib.so", type=tarfile.LNKTYPE, linkname="z/lib.so.1", mtime=EPOCH),
        ]
    )
    out = normalized(raw)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        infos = list(tar)
        first = tar.extractfile(infos[0]).read()
    assert [(i.name, i.type) for i in infos] == [("a/lib.so", tarfile.REGTYPE), ("z/lib.so.1", tarfile.LNKTYPE)]
    assert first == b"shared object" and infos[1].linkname == "a/lib.so"
    # both names still hold the same bytes when unpacked
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        assert tar.extractfile("z/lib.so.1").read() == b"shared object"


def test_gnu_and_pax_archives_of_the_same_files_agree():
    long = "opt/venv/lib/python3.11/site-packages/" + "very_long_package_name/" * 4 + "module.py"
    files = [entry(long, b"x = 1\n", mtime=EPOCH + 5), entry("etc/hosts", b"127.0.0.1 localhost\n", mtime=EPOCH - 5)]
    gnu = layer(files, fmt=tarfile.GNU_FORMAT)
    pax = layer(list(reversed(files)))
    assert normalized(gnu) == normalized(pax)
    assert tree(normalized(gnu))[long][-1] == b"x = 1\n"


def walked(when: int) -> bytes:
    """A layer as an engine writes it: a directory walk (a directory, what it holds, then its next sibling), so
    ``pkg/`` and its files come before ``pkg.py``, though ``/`` sorts after ``.``."""
    d = tarfile.DIRTYPE
    return layer(
        [
            entry("opt", type=d, mode=0o755, mtime=when),
            entry("opt/pkg", type=d, mode=0o755, mtime=when),
            entry("opt/pkg/__init__.py", b"", mtime=when, uname="builder"),
            entry("opt/pkg/lib.so", b"\x7fELF", mode=0o755, mtime=when),
            entry("opt/pkg.py", b"import pkg\n", mtime=when, pax_headers={"atime": f"{when}.5"}),
            entry("opt/pkg2", type=tarfile.LNKTYPE, linkname="opt/pkg/lib.so", mtime=when),
        ]
    )


def streamed(raw: bytes) -> bytes:
    out = io.BytesIO()
    stream(io.BytesIO(raw), out, EPOCH)
    return out.getvalue()


def test_a_walked_layer_streams_to_the_same_bytes_as_the_sorting_path():
    raw = walked(EPOCH + 60)
    assert streamed(raw) == normalized(raw) == streamed(walked(EPOCH + 7200))
    assert tree(streamed(raw)) == tree(raw)


def test_a_layer_out_of_walk_order_is_refused_by_the_stream():
    d = tarfile.DIRTYPE
    for entries in (
        [entry("b", b"", mtime=EPOCH), entry("a", b"", mtime=EPOCH)],  # out of order
        [entry("a", type=d, mtime=EPOCH), entry("a.py", b"", mtime=EPOCH), entry("a/x", b"", mtime=EPOCH)],
        [entry("a", b"1", mtime=EPOCH), entry("a", b"2", mtime=EPOCH)],  # a name twice
        [entry("a", type=tarfile.LNKTYPE, linkname="b", mtime=EPOCH), entry("b", b"x", mtime=EPOCH)],  # link ahead
    ):
        with pytest.raises(OutOfOrder):
            streamed(layer(entries))


def test_whiteouts_sort_where_the_name_they_delete_would():
    d = tarfile.DIRTYPE
    raw = layer(
        [
            entry("sp", type=d, mtime=EPOCH),
            entry("sp/pkg", type=d, mtime=EPOCH),
            entry("sp/pkg/.wh..wh..opq", b"", mtime=EPOCH),  # the directory's opaque marker, before its entries
            entry("sp/pkg/__init__.py", b"", mtime=EPOCH),
            entry("sp/.wh.pkg-1.0.dist-info", b"", mtime=EPOCH),  # deletes sp/pkg-1.0.dist-info
            entry("sp/pkg-2.0.dist-info", type=d, mtime=EPOCH),
        ]
    )
    assert streamed(raw) == normalized(raw)
    assert [k for k in map(key, ["sp/pkg/.wh..wh..opq", "sp/.wh.pkg-1.0.dist-info"])] == [
        (b"sp", b"pkg", b""),
        (b"sp", b"pkg-1.0.dist-info"),
    ]


def _piped_in_thread(produce, path):
    """Run ``oci._piped`` in a thread, so a hang is a failed test rather than a stuck run: (result, error, stuck)."""
    import threading

    from stackforge.publish.codec import codec
    from stackforge.publish.oci import _piped

    got: dict[str, object] = {}

    def run():
        try:
            got["blob"] = _piped(produce, path, codec("gzip"), None)
        except BaseException as exc:  # handed to the test
            got["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    return got.get("blob"), got.get("error"), worker.is_alive()


def test_a_piped_layer_is_compressed_whole_and_named_by_what_the_producer_wrote(tmp_path):
    import gzip

    data = bytes(range(256)) * (12 << 12)  # 12 MiB: more than the hand-over queue holds at once

    def produce(out):
        for at in range(0, len(data), 70_000):  # writes that are not whole pieces
            out.write(data[at : at + 70_000])

    blob, error, stuck = _piped_in_thread(produce, tmp_path / "layer.gz")
    assert not stuck and error is None
    assert gzip.decompress((tmp_path / "layer.gz").read_bytes()) == data
    assert blob.diff_id == "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_producer_that_fails_fails_the_layer_after_the_compressor_ends(tmp_path):
    def produce(out):
        out.write(b"x" * (3 << 20))
        raise OutOfOrder("b")

    blob, error, stuck = _piped_in_thread(produce, tmp_path / "layer.gz")
    assert not stuck and blob is None and isinstance(error, OutOfOrder)


def test_a_compressor_that_stops_reading_does_not_leave_the_producer_waiting(tmp_path):
    """The blob cannot be written (its directory is missing): the producer, blocked on a full queue, gets a broken
    pipe and ends, and the compressor's own error is what the caller sees."""
    seen: list[BaseException] = []

    def produce(out):
        try:
            for _ in range(64):
                out.write(b"y" * (1 << 20))
        except BaseException as exc:
            seen.append(exc)
            raise

    blob, error, stuck = _piped_in_thread(produce, tmp_path / "missing" / "layer.gz")
    assert not stuck, "the producer waits for a reader that has gone"
    assert isinstance(error, FileNotFoundError) and blob is None
    assert seen and isinstance(seen[0], BrokenPipeError)
