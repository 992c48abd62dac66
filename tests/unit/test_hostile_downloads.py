"""A hostile index cannot make the host-side sdist fetch write outside the download cache."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from stackforge.clients import upstream
from stackforge.errors import UserError

DATA = b"not really a tarball, but the pinned bytes\n"
SHA = hashlib.sha256(DATA).hexdigest()


def fetch(monkeypatch, tmp_path, file_url: str):
    """fetch_sdist against an index whose page links ``file_url``; returns (result or error, files written)."""
    monkeypatch.setattr(
        upstream, "find_sdist", lambda index, name, version, workspace=None, credential=None: (file_url, None)
    )
    monkeypatch.setattr(
        upstream, "_download", lambda url, dest, sha256, *_a: dest.parent.mkdir(parents=True) or dest.write_bytes(DATA)
    )
    monkeypatch.setattr(upstream, "sdist_index_url", lambda sdist: "https://index.example/simple")
    sdist = SimpleNamespace(name="markupsafe", version="3.0.2", sha256=SHA, index="pypi")
    cache = tmp_path / "root" / "cache"
    try:
        result: object = upstream.fetch_sdist(sdist, cache)
    except UserError as err:
        result = err
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    return result, written, cache


@pytest.mark.parametrize(
    "served",
    [
        "..%2F..%2F..%2Fescape.tar.gz",
        "%2E%2E%2F%2E%2E%2Fescape.tar.gz",
        "markupsafe-3.0.2%2F..%2F..%2Fescape.tar.gz",
        "%2Fetc%2Fescape.tar.gz",
        "..",
        "markupsafe-3.0.2.tar.gz%00.sh",
        "markupsafe-3.0.2%0A.tar.gz",
        ".hidden.tar.gz",
        "markupsafe-3.0.2.zip",
    ],
    ids=[
        "dotdot-encoded",
        "dots-encoded",
        "name-then-dotdot",
        "absolute",
        "bare-dotdot",
        "nul",
        "newline",
        "hidden",
        "not-tar-gz",
    ],
)
def test_an_unsafe_served_file_name_is_refused_and_nothing_is_written(monkeypatch, tmp_path, served):
    result, written, _ = fetch(monkeypatch, tmp_path, f"https://index.example/files/{served}")
    assert isinstance(result, UserError), result
    assert "unsafe file name" in result.message and "markupsafe==3.0.2" in result.message
    assert "one path segment" in (result.fix or "")
    assert written == []


def test_a_plain_file_name_is_kept_in_the_cache(monkeypatch, tmp_path):
    result, written, cache = fetch(monkeypatch, tmp_path, "https://index.example/files/markupsafe-3.0.2.tar.gz")
    assert result == cache / "sdist" / SHA / "markupsafe-3.0.2.tar.gz"
    assert written == [f"root/cache/sdist/{SHA}/markupsafe-3.0.2.tar.gz"]
