"""The local index server over real HTTP, read by our client and by pip itself."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from stackforge.clients.index import IndexClient, IndexQueryError, ProjectNotFound
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
JSON_V1 = "application/vnd.pypi.simple.v1+json"
POST1 = datetime(2026, 8, 12, 9, 30, tzinfo=timezone.utc).timestamp()
POST2 = datetime(2026, 9, 23, 11, 59, tzinfo=timezone.utc).timestamp()


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("wheels")
    for v, when in [("2.11.0.post1+musa5.2.0", POST1), ("2.11.0.post2+musa5.2.0", POST2)]:
        for py in ("cp310", "cp312"):
            whl = build_wheel(d / "torch", "torch", v, python_tag=py, abi_tag=py, platform_tag="linux_x86_64")
            os.utime(whl, (when, when))
    build_wheel(d, "flashinfer-python", "0.2.7", requires_python=">=3.9")
    return d


def test_json_page_carries_pep700_fields(wheel_dir):
    with IndexServer(wheel_dir) as srv:
        r = requests.get(f"{srv.url}/torch/", headers={"Accept": JSON_V1})
        assert r.headers["Content-Type"] == JSON_V1
        data = r.json()
        assert data["meta"]["api-version"] == "1.1"
        assert data["versions"] == ["2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0"]
        f = next(x for x in data["files"] if x["filename"].startswith("torch-2.11.0.post2+musa5.2.0-cp310"))
        path = wheel_dir / "torch" / f["filename"]
        assert f["size"] == path.stat().st_size
        assert f["hashes"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert f["upload-time"] == "2026-09-23T11:59:00.000000Z"  # the mtime set above
        assert f["yanked"] is False
        blob = requests.get(srv.base_url + f["url"])
        assert blob.status_code == 200 and blob.content == path.read_bytes()


def test_negotiation_html_only_and_switches(wheel_dir):
    with IndexServer(wheel_dir) as srv:
        assert requests.get(f"{srv.url}/torch/").headers["Content-Type"] == "text/html"  # Accept: */*
        assert requests.get(f"{srv.url}/torch/", headers={"Accept": None}).headers["Content-Type"] == "text/html"
        both = f"{JSON_V1}, application/vnd.pypi.simple.v1+html"
        assert requests.get(f"{srv.url}/torch/", headers={"Accept": both}).headers["Content-Type"] == JSON_V1
        q = requests.get(f"{srv.url}/torch/", headers={"Accept": f"text/html;q=0.9, {JSON_V1};q=0.5"})
        assert q.headers["Content-Type"] == "text/html"
        assert requests.get(f"{srv.url}/torch/", params={"format": JSON_V1}).headers["Content-Type"] == JSON_V1
        assert requests.get(f"{srv.url}/torch/", headers={"Accept": "image/png"}).status_code == 406
        srv.upload_time = False
        srv.size = False
        data = requests.get(f"{srv.url}/torch/", headers={"Accept": JSON_V1}).json()
        assert data["meta"]["api-version"] == "1.0"
        assert all("upload-time" not in f and "size" not in f for f in data["files"])
        srv.hashes = False
        assert all(
            f["hashes"] == {} for f in requests.get(f"{srv.url}/torch/", headers={"Accept": JSON_V1}).json()["files"]
        )
        assert all(f.sha256 is None for f in IndexClient(srv.url).project("torch").files)
        srv.json = False
        assert "#sha256=" not in requests.get(f"{srv.url}/torch/").text
        srv.hashes = True
        r = requests.get(f"{srv.url}/torch/", headers={"Accept": JSON_V1})
        assert r.headers["Content-Type"] == "text/html" and "#sha256=" in r.text


def test_redirects_404_and_root(wheel_dir):
    with IndexServer(wheel_dir) as srv:
        r = requests.get(f"{srv.url}/FlashInfer_Python", allow_redirects=False)
        assert r.status_code == 301 and r.headers["Location"] == "/simple/flashinfer-python/"
        assert requests.get(f"{srv.url}/FlashInfer_Python").status_code == 200
        assert requests.get(f"{srv.url}/nope/").status_code == 404
        root = requests.get(f"{srv.url}/", headers={"Accept": JSON_V1}).json()
        assert [p["name"] for p in root["projects"]] == ["flashinfer-python", "torch"]


def test_client_reads_json_and_html_alike(wheel_dir):
    with IndexServer(wheel_dir, yanked={"flashinfer_python-0.2.7-py3-none-any.whl": "bad build"}) as srv:
        j = IndexClient(srv.url).project("torch")
        h = IndexClient(srv.url, prefer_json=False).project("torch")
        assert j.format == "json" and h.format == "html"
        assert [f.filename for f in j.files] == [f.filename for f in h.files]
        assert [f.sha256 for f in j.files] == [f.sha256 for f in h.files]
        assert all(f.upload_time is not None and f.size for f in j.files)
        assert all(f.upload_time is None and f.size is None for f in h.files)
        assert IndexClient(srv.url).project("flashinfer_python").files[0].yanked == "bad build"
        for prefer_json in (True, False):
            (fi,) = IndexClient(srv.url, prefer_json=prefer_json).project("flashinfer-python").files
            assert fi.requires_python == ">=3.9"
        with pytest.raises(ProjectNotFound):
            IndexClient(srv.url).project("nope")


def test_cache_revalidates_with_etags(wheel_dir, tmp_path):
    with IndexServer(wheel_dir) as srv:
        first = IndexClient(srv.url, cache_dir=tmp_path)
        assert not first.project("torch").from_cache
        second = IndexClient(srv.url, cache_dir=tmp_path)
        page = second.project("torch")
        assert page.from_cache and second.stats == {"requests": 1, "not_modified": 1}
        assert [r.status for r in srv.requests] == [200, 304]
        # A new upload changes the page: the cache must not hide it.
        build_wheel(
            wheel_dir / "torch",
            "torch",
            "2.11.0.post3+musa5.2.0",
            python_tag="cp310",
            abi_tag="cp310",
            platform_tag="linux_x86_64",
        )
        try:
            third = IndexClient(srv.url, cache_dir=tmp_path).project("torch")
            assert not third.from_cache
            assert any("post3" in f.filename for f in third.files)
        finally:
            for p in (wheel_dir / "torch").glob("*post3*"):
                p.unlink()


def test_basic_auth_and_no_leak(wheel_dir):
    with IndexServer(wheel_dir, auth=("ci", "hunter2")) as srv:
        with pytest.raises(IndexQueryError) as err:
            IndexClient(srv.url).project("torch")
        assert "401" in err.value.message
        assert IndexClient(srv.url, auth=("ci", "hunter2")).project("torch").files
        client = IndexClient(srv.url_with_auth)
        assert client.project("torch").files
        assert "hunter2" not in client.display_url and "hunter2" not in client.project("torch").url
        with pytest.raises(IndexQueryError) as err:
            IndexClient(srv.url_with_auth.replace("hunter2", "wrong")).project("torch")
        assert "wrong" not in err.value.render()


def test_netrc_credentials(wheel_dir, tmp_path, monkeypatch):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login ci password hunter2\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with IndexServer(wheel_dir, auth=("ci", "hunter2")) as srv:
        assert IndexClient(srv.url).project("torch").files


def test_process_mode_serves_pip(wheel_dir, tmp_path):
    env = {**os.environ, "TEST_INDEX_AUTH": "ci:hunter2"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fixtures.index_server",
            "--dir",
            str(wheel_dir),
            "--port",
            "0",
            "--auth-env",
            "TEST_INDEX_AUTH",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("serving http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        url = line.split()[1].replace("http://", "http://ci:hunter2@")
        target = [
            "--python-version",
            "3.10",
            "--platform",
            "linux_x86_64",
            "--implementation",
            "cp",
            "--abi",
            "cp310",
            "--only-binary",
            ":all:",
        ]
        pip = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check"]
        out = subprocess.run(
            pip + ["index", "versions", "torch", "--index-url", url, *target],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "torch (2.11.0.post2+musa5.2.0)" in out.stdout
        assert "2.11.0.post1+musa5.2.0" in out.stdout
        dl = subprocess.run(
            pip
            + [
                "download",
                "--no-deps",
                "-d",
                str(tmp_path),
                "--index-url",
                url,
                *target,
                "torch==2.11.0.post2+musa5.2.0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert dl.returncode == 0, dl.stderr
        got = tmp_path / "torch-2.11.0.post2+musa5.2.0-cp310-cp310-linux_x86_64.whl"
        assert got.read_bytes() == (wheel_dir / "torch" / got.name).read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_concurrent_queries_overlap(tmp_path):
    names = [f"pkg{i}" for i in range(8)]
    for n in names:
        build_wheel(tmp_path, n, "1.0")
    with IndexServer(tmp_path, delay=0.3) as srv:
        start = time.monotonic()
        pages = IndexClient(srv.url, max_workers=8).projects(names)
        elapsed = time.monotonic() - start
    assert [p.name for p in pages.values()] == names
    # One after another this takes 8 x 0.3 s; at once, about 0.3 s.
    assert elapsed < 1.2, f"{elapsed:.2f} s: the requests did not overlap"
    assert len(srv.requests) == 8
