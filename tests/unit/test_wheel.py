"""Wheel inspect/diff on pure-Python wheels (the ELF cases, which need gcc, are in integration)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from stackforge.errors import UserError
from stackforge.freshness.wheel import (
    diff_wheels,
    inspect_wheel,
    render_diff,
    render_inspect,
)
from tests.fixtures.wheels import build_wheel, wheel_filename


def test_fixture_wheel_is_valid_and_reproducible(tmp_path):
    a = build_wheel(tmp_path / "a", "flashinfer-python", "0.2.7", requires_dist=["torch"], requires_python=">=3.10")
    b = build_wheel(tmp_path / "b", "flashinfer-python", "0.2.7", requires_dist=["torch"], requires_python=">=3.10")
    assert a.name == "flashinfer_python-0.2.7-py3-none-any.whl"
    assert a.read_bytes() == b.read_bytes()
    info = inspect_wheel(a)
    assert info.name == "flashinfer-python" and info.version == "0.2.7"
    assert info.tags == ["py3-none-any"]
    assert info.requires_dist == ["torch"]
    assert info.metadata["Requires-Python"] == [">=3.10"]
    assert info.wheel["Root-Is-Purelib"] == ["true"]
    assert info.record_problems == [] and info.warnings == []
    assert not info.is_compiled
    assert info.sha256 == hashlib.sha256(a.read_bytes()).hexdigest()
    assert set(info.files) == {
        "flashinfer_python/__init__.py",
        "flashinfer_python-0.2.7.dist-info/METADATA",
        "flashinfer_python-0.2.7.dist-info/WHEEL",
        "flashinfer_python-0.2.7.dist-info/RECORD",
    }


def test_local_label_survives_in_names():
    assert (
        wheel_filename("torch", "2.11.0.post2+musa5.2.0", "cp310", "cp310", "linux_x86_64")
        == "torch-2.11.0.post2+musa5.2.0-cp310-cp310-linux_x86_64.whl"
    )


def test_platform_wheel_without_requires_dist_gets_the_loud_warning(tmp_path):
    whl = build_wheel(
        tmp_path, "torch", "2.11.0.post2+musa5.2.0", python_tag="cp310", abi_tag="cp310", platform_tag="linux_x86_64"
    )
    info = inspect_wheel(whl)
    assert info.is_compiled
    assert any("NO Requires-Dist" in w for w in info.warnings)
    assert render_inspect(info).startswith("WARNING: compiled wheel declares NO Requires-Dist")


def _rewrite(src, dst, change):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = change(item.filename, zin.read(item))
            if data is not None:
                zout.writestr(item, data)


def test_record_is_checked_against_the_content(tmp_path):
    whl = build_wheel(
        tmp_path / "src", "mate", "0.2.7", files={"mate/__init__.py": "X = 1\n", "mate/ops.py": "Y = 2\n"}
    )
    tampered = tmp_path / whl.name

    def change(name, data):
        if name == "mate/__init__.py":
            return b"X = 2\n"
        if name == "mate/ops.py":
            return None  # dropped from the archive, still in RECORD
        return data

    _rewrite(whl, tampered, change)
    with zipfile.ZipFile(tampered, "a") as zf:
        zf.writestr("mate/extra.py", "Z = 3\n")
    info = inspect_wheel(tampered)
    problems = "\n".join(info.record_problems)
    assert "mate/__init__.py: content does not match the RECORD sha256" in problems
    assert "mate/ops.py: listed in RECORD but not in the archive" in problems
    assert "mate/extra.py: in the archive but not listed in RECORD" in problems
    assert any("RECORD does not match" in w for w in info.warnings)


def test_not_a_wheel_is_a_user_error(tmp_path):
    bad = tmp_path / "x-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(UserError, match="not a zip"):
        inspect_wheel(bad)
    with pytest.raises(UserError, match="no such wheel"):
        inspect_wheel(tmp_path / "missing-1.0-py3-none-any.whl")


def test_diff_normalises_dist_info_and_reports_metadata(tmp_path):
    common = {"torchada/__init__.py": "import torch\n", "torchada/_patch.py": "A = 1\n", "torchada/old.py": "gone\n"}
    a = build_wheel(tmp_path, "torchada", "0.1.83", files=common, requires_dist=["torch"])
    newer = dict(common)
    newer.pop("torchada/old.py")
    newer["torchada/_patch.py"] = "A = 2\n"
    newer["torchada/configs/new.json"] = "{}\n"
    b = build_wheel(tmp_path, "torchada", "0.1.90", files=newer, requires_dist=["torch>=2.11"])
    d = diff_wheels(inspect_wheel(a), inspect_wheel(b))
    assert d.added == ["torchada/configs/new.json"]
    assert d.removed == ["torchada/old.py"]
    assert d.changed == ["torchada/_patch.py", "{dist-info}/METADATA"]
    assert d.unchanged == 2  # __init__.py and WHEEL; RECORD is never counted
    fields = {f: (old, new) for f, old, new in d.metadata}
    assert fields["version"] == (["0.1.83"], ["0.1.90"])
    assert fields["METADATA Requires-Dist"] == (["torch"], ["torch>=2.11"])
    assert d.needed == []
    text = render_diff(d)
    assert "+ torchada/configs/new.json" in text and "- torchada/old.py" in text


def test_identical_wheels_diff_empty(tmp_path):
    a = build_wheel(tmp_path / "a", "triton", "3.2.0")
    b = build_wheel(tmp_path / "b", "triton", "3.2.0")
    d = diff_wheels(inspect_wheel(a), inspect_wheel(b))
    assert d.is_empty
    assert "no differences" in render_diff(d)


def _b64(digest: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _big_wheel(tmp_path, big: int):
    """A wheel whose members uncompress to ``big`` bytes each (zeros: the file itself stays small).

    One plain data file and one "shared object" (ELF magic, then zeros: pyelftools cannot read
    it, which the report says), both written in chunks so the test itself stays small.
    """
    whl = tmp_path / "torch-2.11.0-cp310-cp310-linux_x86_64.whl"
    chunk = b"\0" * (1 << 20)
    members = {"torch/data.bin": b"", "torch/lib/libbig.so": b"\x7fELF"}
    record = []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, head in members.items():
            h = hashlib.sha256(head)
            with zf.open(name, "w", force_zip64=True) as out:
                out.write(head)
                left = big - len(head)
                while left:
                    piece = chunk[: min(left, len(chunk))]
                    out.write(piece)
                    h.update(piece)
                    left -= len(piece)
            record.append(f"{name},sha256={_b64(h.digest())},{big}")
        meta = b"Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n"
        zf.writestr("torch-2.11.0.dist-info/METADATA", meta)
        record.append(f"torch-2.11.0.dist-info/METADATA,sha256={_b64(hashlib.sha256(meta).digest())},{len(meta)}")
        record.append("torch-2.11.0.dist-info/RECORD,,")
        zf.writestr("torch-2.11.0.dist-info/RECORD", "\n".join(record) + "\n")
    return whl


def test_inspect_streams_large_members(tmp_path):
    """Memory stays far below one member's size: members are hashed in chunks, not read whole."""
    import tracemalloc

    big = 48 << 20
    whl = _big_wheel(tmp_path, big)
    tracemalloc.start()
    try:
        info = inspect_wheel(whl)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak >> 20} MiB for {big >> 20} MiB members"
    assert info.files["torch/data.bin"].size == big == info.files["torch/lib/libbig.so"].size
    assert info.files["torch/data.bin"].sha256 == hashlib.sha256(b"\0" * big).hexdigest()
    assert info.record_problems == []
    (so,) = info.shared_objects
    assert so.path == "torch/lib/libbig.so" and so.elf_type.startswith("unreadable ELF")
    assert info.size == whl.stat().st_size and info.sha256 == hashlib.sha256(whl.read_bytes()).hexdigest()


def test_record_hashes_other_than_sha256_are_checked(tmp_path):
    whl = build_wheel(
        tmp_path / "src", "mate", "0.2.7", files={"mate/__init__.py": "X = 1\n", "mate/ops.py": "Y = 2\n"}
    )
    out = tmp_path / whl.name

    def change(name, data):
        if name.endswith("/RECORD"):
            rows = []
            for line in data.decode().splitlines():
                path = line.split(",")[0]
                if path == "mate/__init__.py":
                    line = f"{path},sha384={_b64(hashlib.sha384(b'X = 1' + bytes([10])).digest())},6"
                elif path == "mate/ops.py":
                    line = f"{path},sha512={_b64(hashlib.sha512(b'wrong').digest())},6"
                rows.append(line)
            return ("\n".join(rows) + "\n").encode()
        return data

    _rewrite(whl, out, change)
    problems = inspect_wheel(out).record_problems
    assert problems == ["mate/ops.py: content does not match the RECORD sha512"]
