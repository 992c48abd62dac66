"""scripts/osv_refresh.py against a real HTTP server on loopback serving OSV-export zips made from the fixture
records: the snapshot lands in the layout osv.py reads, an unchanged export is not fetched again, and a download
that is too large, a hostile entry or a non-record fails with one line and leaves the previous snapshot as it was."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stackforge import osv

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "osv_refresh.py"
FIXTURES = REPO / "tests" / "fixtures" / "osv"


def export(ecosystem: str, extra: dict[str, bytes] | None = None) -> bytes:
    """The fixture records of ``ecosystem`` as OSV's all.zip holds them: flat ``<ID>.json`` entries."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted((FIXTURES / ecosystem).glob("*.json")):
            zf.writestr(path.name, path.read_bytes())
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()


#: an Ubuntu record in OSV's shape (the fixtures have none: post1/post2's images are Ubuntu)
UBUNTU = json.dumps({
    "id": "UBUNTU-CVE-2024-0001", "modified": "2026-11-30T00:00:00Z",
    "affected": [{"package": {"ecosystem": "Ubuntu:22.04:LTS", "name": "openssl"},
                  "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "3.0.2-0ubuntu1.18"}]}]}],
}).encode()  # fmt: skip


class Export:
    """A loopback server of ``/<ECOSYSTEM>/all.zip`` with an ETag; it records the requests it answered."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {
            "/PyPI/all.zip": export("PyPI"),
            "/Debian/all.zip": export("Debian"),
            "/Ubuntu/all.zip": export("Ubuntu", {"UBUNTU-CVE-2024-0001.json": UBUNTU}),
        }
        self.seen: list[tuple[str, str | None]] = []
        self.declare_length = True  # without it, HTTP/1.0's end of the connection ends the body
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.seen.append((self.path, self.headers.get("If-None-Match")))
                body = owner.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                tag = f'"{len(body)}-{hash(body) & 0xFFFF:x}"'
                if self.headers.get("If-None-Match") == tag:
                    self.send_response(304)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/zip")
                if owner.declare_length:
                    self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", tag)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    srv = Export()
    yield srv
    srv.close()


def refresh(out: Path, base: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--base-url", base, *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_snapshot_lands_in_the_layout_the_scan_reads(server, tmp_path):
    db = tmp_path / "osv"
    proc = refresh(db, server.url, "--ecosystem", "PyPI", "--ecosystem", "Debian")
    assert proc.returncode == 0, proc.stderr
    for eco in ("PyPI", "Debian"):
        assert sorted(p.name for p in (db / eco).glob("*.json") if p.name != "osv-snapshot.json") == sorted(
            p.name for p in (FIXTURES / eco).glob("*.json")
        )
        state = dict(line.split("=", 1) for line in (db / eco / ".snapshot").read_text().splitlines())
        assert state["url"] == f"{server.url}/{eco}/all.zip" and state["etag"] and state["fetched"].endswith("Z")
        assert state["records"] == str(len(list((FIXTURES / eco).glob("*.json"))))
    loaded = osv.load(db)
    assert loaded.count == osv.load(FIXTURES).count > 0  # the same records, the withdrawn one skipped by both
    for eco in ("PyPI", "Debian"):  # each export dated for the scan's --osv-max-age, by the file the scan reads
        ((name, fetched_at),) = loaded.families[eco].snapshots
        assert name.endswith("osv-snapshot.json") and fetched_at.tzinfo is not None
    assert ("PyPI", "pip") in loaded.records and ("Debian", "openssl") in loaded.records
    assert [p.name for p in tmp_path.iterdir()] == ["osv"]  # no work directory left beside it
    assert f"osv-refresh: PyPI: 2 records from {server.url}/PyPI/all.zip" in proc.stderr.splitlines()


def test_an_unchanged_export_is_not_downloaded_again(server, tmp_path):
    db = tmp_path / "osv"
    assert refresh(db, server.url, "--ecosystem", "PyPI").returncode == 0
    before = snapshot(db / "PyPI")
    proc = refresh(db, server.url, "--ecosystem", "PyPI")
    assert proc.returncode == 0, proc.stderr
    assert "PyPI: unchanged since" in proc.stderr
    (first, none), (again, etag) = server.seen
    assert first == again == "/PyPI/all.zip" and none is None and etag  # the second asked with the first's ETag
    after = snapshot(db / "PyPI")
    dated = (".snapshot", "osv-snapshot.json")
    assert {k: v for k, v in after.items() if k not in dated} == {k: v for k, v in before.items() if k not in dated}
    assert b"checked=" in after[".snapshot"]
    assert osv.load(db).families["PyPI"].snapshots  # an export confirmed unchanged is dated again


@pytest.mark.parametrize(
    ("entry", "data", "said"),
    [
        ("../evil.json", b'{"id": "X"}', "is not a flat <ID>.json"),
        ("sub/GHSA-1.json", b'{"id": "X"}', "is not a flat <ID>.json"),
        ("README.md", b"hello", "is not a flat <ID>.json"),
        ("GHSA-2.json", b"not json", "is not JSON"),
        ("GHSA-3.json", b'{"summary": "no id"}', "is not an OSV record (no id)"),
        ("GHSA-4.json", b"[1, 2]", "is not an OSV record (no id)"),
    ],
)
def test_a_bad_entry_fails_and_keeps_the_previous_snapshot(server, tmp_path, entry, data, said):
    db = tmp_path / "osv"
    assert refresh(db, server.url).returncode == 0
    before = snapshot(db)
    server.files["/PyPI/all.zip"] = export("PyPI", {entry: data})
    proc = refresh(db, server.url)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"osv-refresh: error: {server.url}/PyPI/all.zip: ") and said in line, line
    assert line.endswith(f"PyPI's previous snapshot in {db / 'PyPI'} is kept")
    assert snapshot(db) == before
    assert not (tmp_path / "evil.json").exists() and not (db / "evil.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["osv"]


@pytest.mark.parametrize("declared", [True, False])
def test_a_download_over_the_limit_fails_without_a_partial_database(server, tmp_path, declared):
    """Refused on its Content-Length when the server says it, else when the bytes read pass the limit."""
    server.declare_length = declared
    server.files["/Debian/all.zip"] = export("Debian") + b"\0" * (2 << 20)  # over 1 MiB on the wire
    db = tmp_path / "osv"
    proc = refresh(db, server.url, "--max-bytes", "1")
    assert proc.returncode == 1
    said = "bytes, over the limit of 1048576" if declared else "more than 1048576 bytes, the limit"
    assert f"{server.url}/Debian/all.zip: " in proc.stderr and said in proc.stderr, proc.stderr
    assert "fix: raise --max-bytes; there is no snapshot of Debian" in proc.stderr
    assert not (db / "Debian").exists()
    assert (db / "PyPI").is_dir()  # the ecosystem before it was refreshed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["osv"]


def test_unpacked_records_over_the_limit_fail(server, tmp_path):
    pad = {f"PAD-{i}.json": json.dumps({"id": f"PAD-{i}", "details": "x" * 100_000}).encode() for i in range(12)}
    server.files["/PyPI/all.zip"] = export("PyPI", pad)  # compresses to a few KiB, unpacks to over 1 MiB
    proc = refresh(tmp_path / "osv", server.url, "--ecosystem", "PyPI", "--max-unpacked", "1")
    assert proc.returncode == 1
    assert "more than 1048576 bytes unpacked, the limit; fix: raise --max-unpacked" in proc.stderr
    assert not (tmp_path / "osv" / "PyPI").exists()


def test_a_missing_export_and_a_bad_base_are_one_line_each(server, tmp_path):
    proc = refresh(tmp_path / "osv", server.url, "--ecosystem", "Nope")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"osv-refresh: error: {server.url}/Nope/all.zip: HTTP 404 Not Found; fix: check --base-url and --ecosystem, "
        f"retry later; there is no snapshot of Nope in {tmp_path / 'osv'}"
    )
    for base in ("http://example.com", "ftp://127.0.0.1/x", "https://user:pw@example.com"):
        proc = refresh(tmp_path / "osv", base)
        assert proc.returncode == 2 and proc.stderr.startswith("osv-refresh: error: --base-url"), proc.stderr
        assert "pw" not in proc.stderr
    proc = refresh(tmp_path / "osv", server.url, "--ecosystem", "../etc")
    assert proc.returncode == 2 and "is not an OSV ecosystem name" in proc.stderr


def test_by_default_every_ecosystem_the_stacks_images_hold_is_fetched(server, tmp_path):
    """PyPI for the Python distributions, Debian for the example's image, Ubuntu for post1's and post2's."""
    assert refresh(tmp_path / "osv", server.url).returncode == 0
    assert [path for path, _ in server.seen] == ["/PyPI/all.zip", "/Debian/all.zip", "/Ubuntu/all.zip"]
    assert osv.load(tmp_path / "osv").families["Ubuntu"].snapshots
