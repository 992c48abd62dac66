"""Refresh the OSV database the nightly scans against: OSV's public per-ecosystem exports, unpacked.

usage: python scripts/osv_refresh.py --out DIR [--ecosystem PyPI --ecosystem Debian --ecosystem Ubuntu] [--base-url URL]
                                     [--max-bytes MIB] [--max-unpacked MIB] [--timeout SECONDS]

For each ecosystem (default PyPI, Debian and Ubuntu) it downloads ``<base-url>/<ECOSYSTEM>/all.zip`` (default base:
https://osv-vulnerabilities.storage.googleapis.com, OSV's bulk export, one ``<ID>.json`` OSV record per entry) and
unpacks it into ``DIR/<ECOSYSTEM>/``: the layout `stackforge scan --osv DIR` and `nightly --osv DIR` read
(tools/stackforge/osv.py). ``DIR/<ECOSYSTEM>/.snapshot`` says where it came from and when (url, etag,
last_modified, fetched, records); the next run sends its ETag, so an export that has not changed is not downloaded
again. ``DIR/<ECOSYSTEM>/osv-snapshot.json`` dates the export for the scan's ``--osv-max-age``: when it was last known
to be OSV's current export (downloaded, or found unchanged).

Everything fetched is checked before it replaces anything: the download and the unpacked records are bounded in
size, each entry is one flat ``<name>.json`` holding a JSON object with an ``id``, and a new snapshot is unpacked
beside the old one and swapped in whole. On any failure the previous snapshot stays as it was, the script prints one
``osv-refresh: error:`` line naming the URL and the fix, and exits 1 (2 on bad arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

DEFAULT_BASE = "https://osv-vulnerabilities.storage.googleapis.com"
#: PyPI for every image's Python distributions, Debian for a Debian image (the example), Ubuntu for post1/post2's
DEFAULT_ECOSYSTEMS = ("PyPI", "Debian", "Ubuntu")
#: what the scan reads for an export's age (docs/publish.md, "The OSV database")
SCAN_SNAPSHOT = "osv-snapshot.json"
#: per ecosystem; OSV's exports are tens of MB compressed, a few hundred MB unpacked
DEFAULT_MAX_MIB, DEFAULT_MAX_UNPACKED_MIB = 1024, 4096
#: one record, as tools/stackforge/osv.py reads at most
MAX_RECORD_BYTES = 4 << 20
MAX_ENTRIES = 2_000_000
ENTRY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\.json")
ECOSYSTEM_RE = re.compile(r"[A-Za-z][A-Za-z0-9.+-]{0,63}")
CHUNK = 1 << 20
WORK_PREFIX = ".osv-refresh."


class Failed(Exception):
    """One line for the user: what failed, and the fix."""


def log(message: str) -> None:
    print(f"osv-refresh: {message}", file=sys.stderr, flush=True)


def check_base(url: str) -> str:
    """``url`` when it is https, or http on a loopback host (a test's server); anything else is refused."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.username or parts.password or parts.query or parts.fragment:  # named without echoing them
        raise ValueError(
            f"--base-url {parts.scheme}://{host}/…: no credentials, query or fragment (OSV's export is public)"
        )
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        raise ValueError(f"--base-url {url!r}: only https (or http on a loopback host) is accepted")
    return url.rstrip("/")


def read_state(path: Path) -> dict[str, str]:
    state: dict[str, str] = {}
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in path.read_text(encoding="utf-8").splitlines()[:32]:
            key, sep, value = line.partition("=")
            if sep and key.isidentifier():
                state[key] = value[:512]
    return state


def write_state(path: Path, state: dict[str, str]) -> None:
    text = "".join(f"{k}={' '.join(str(v).split())}\n" for k, v in state.items())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def download(url: str, dest: Path, etag: str | None, max_bytes: int, deadline: float, timeout: float) -> dict | None:
    """``url`` into ``dest`` (at most ``max_bytes``); its ETag and Last-Modified; None when the server says the
    copy we hold (``etag``) is current."""
    request = urllib.request.Request(url, headers={"User-Agent": "stackforge-osv-refresh"})
    if etag:
        request.add_header("If-None-Match", etag)
    try:
        resp = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 304:
            return None
        raise Failed(
            f"{url}: HTTP {exc.code} {exc.reason}; fix: check --base-url and --ecosystem, retry later"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Failed(f"{url}: {reason}; fix: check the runner's network (and proxy) to the OSV export") from None
    with resp:
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise Failed(f"{url}: {int(declared)} bytes, over the limit of {max_bytes}; fix: raise --max-bytes")
        got = 0
        with open(dest, "wb") as out:
            while chunk := resp.read(CHUNK):
                got += len(chunk)
                if got > max_bytes:
                    raise Failed(f"{url}: more than {max_bytes} bytes, the limit; fix: raise --max-bytes")
                if time.monotonic() > deadline:
                    raise Failed(f"{url}: not downloaded within --timeout; fix: raise --timeout, or retry")
                out.write(chunk)
        return {"etag": resp.headers.get("ETag") or "", "last_modified": resp.headers.get("Last-Modified") or ""}


def unpack(archive: Path, into: Path, url: str, max_unpacked: int) -> int:
    """Every entry of ``archive`` into ``into`` (flat), checked; the number of records."""
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise Failed(f"{url}: not a zip archive ({exc}); fix: retry, the download may have been cut") from None
    total = count = 0
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ENTRIES:
            raise Failed(f"{url}: {len(infos)} entries, over the limit of {MAX_ENTRIES}")
        for info in infos:
            if info.is_dir():
                continue
            name = info.filename
            if not ENTRY_RE.fullmatch(name):
                raise Failed(f"{url}: entry {name[:120]!r} is not a flat <ID>.json; fix: check --base-url")
            if info.file_size > MAX_RECORD_BYTES:
                raise Failed(f"{url}: {name} is {info.file_size} bytes, over a record's limit of {MAX_RECORD_BYTES}")
            with zf.open(info) as src:
                data = src.read(MAX_RECORD_BYTES + 1)  # the declared size may lie: read no more than a record
            if len(data) > MAX_RECORD_BYTES:
                raise Failed(f"{url}: {name} is over a record's limit of {MAX_RECORD_BYTES} bytes")
            total += len(data)
            if total > max_unpacked:
                raise Failed(f"{url}: more than {max_unpacked} bytes unpacked, the limit; fix: raise --max-unpacked")
            try:
                record = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                raise Failed(f"{url}: {name} is not JSON; fix: check --base-url, retry") from None
            if not isinstance(record, dict) or not isinstance(record.get("id"), str):
                raise Failed(f"{url}: {name} is not an OSV record (no id); fix: check --base-url")
            target = into / name
            if target.exists():
                raise Failed(f"{url}: {name} appears twice")
            target.write_bytes(data)
            count += 1
    if count == 0:
        raise Failed(f"{url}: no records; fix: check --ecosystem (OSV's names, e.g. PyPI, Debian)")
    return count


def write_scan_snapshot(directory: Path, ecosystem: str, checked: str, url: str) -> None:
    """``osv-snapshot.json``, which dates the export for the scan's ``--osv-max-age``: when it was last known to be
    OSV's current export (downloaded, or its ETag found unchanged)."""
    data = {"ecosystem": ecosystem, "fetched_at": checked, "source": url}
    tmp = directory / f".{SCAN_SNAPSHOT}.tmp"
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, directory / SCAN_SNAPSHOT)


def refresh(root: Path, ecosystem: str, base: str, max_bytes: int, max_unpacked: int, timeout: float) -> str:
    """One ecosystem's snapshot refreshed in ``root``; what happened, in words."""
    url = f"{base}/{urllib.parse.quote(ecosystem)}/all.zip"
    current = root / ecosystem
    state = read_state(current / ".snapshot") if current.is_dir() else {}
    etag = state.get("etag") if state.get("url") == url else None
    fetched = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    # beside the database, not in it (a scan reads every *.json under it), on its filesystem (one rename swaps)
    work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{root.name}.", dir=root.parent))
    try:
        headers = download(url, work / "all.zip", etag, max_bytes, time.monotonic() + timeout, timeout)
        if headers is None:
            write_state(current / ".snapshot", {**state, "checked": fetched})
            write_scan_snapshot(current, ecosystem, fetched, url)  # confirmed current now: its age starts again
            return f"{ecosystem}: unchanged since {state.get('fetched', '?')} ({state.get('records', '?')} records)"
        records = work / "records"
        records.mkdir()
        count = unpack(work / "all.zip", records, url, max_unpacked)
        write_state(
            records / ".snapshot",
            {"url": url, **headers, "fetched": fetched, "checked": fetched, "records": str(count)},
        )
        write_scan_snapshot(records, ecosystem, fetched, url)
        if current.exists():
            os.replace(current, work / "previous")
        try:
            os.replace(records, current)
        except OSError:
            if (work / "previous").exists():
                os.replace(work / "previous", current)
            raise
        return f"{ecosystem}: {count} records from {url}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="osv_refresh.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the OSV database directory (--osv DIR)")
    parser.add_argument("--ecosystem", action="append", help="OSV ecosystem (repeatable; default PyPI and Debian)")
    parser.add_argument("--base-url", default=DEFAULT_BASE, help="where <ECOSYSTEM>/all.zip is (default %(default)s)")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_MIB, metavar="MIB", help="download limit")
    parser.add_argument("--max-unpacked", type=int, default=DEFAULT_MAX_UNPACKED_MIB, metavar="MIB")
    parser.add_argument("--timeout", type=float, default=1800, metavar="SECONDS", help="per ecosystem")
    args = parser.parse_args(argv)
    try:
        base = check_base(args.base_url)
        ecosystems = list(dict.fromkeys(args.ecosystem or DEFAULT_ECOSYSTEMS))
        for eco in ecosystems:
            if not ECOSYSTEM_RE.fullmatch(eco):
                raise ValueError(f"--ecosystem {eco!r} is not an OSV ecosystem name (e.g. PyPI, Debian)")
        if min(args.max_bytes, args.max_unpacked) < 1 or args.timeout <= 0:
            raise ValueError("--max-bytes, --max-unpacked and --timeout must be positive")
    except ValueError as exc:
        log(f"error: {exc}")
        return 2
    root = args.out
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".refresh.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one refresh of a directory at a time
            for stale in root.parent.glob(f"{WORK_PREFIX}{root.name}.*"):  # a refresh that was killed
                shutil.rmtree(stale, ignore_errors=True)
            for eco in ecosystems:
                try:
                    log(refresh(root, eco, base, args.max_bytes << 20, args.max_unpacked << 20, args.timeout))
                except Failed as exc:
                    kept = (
                        f"{eco}'s previous snapshot in {root / eco} is kept"
                        if (root / eco).is_dir()
                        else f"there is no snapshot of {eco} in {root}"
                    )
                    log(f"error: {exc}; {kept}")
                    return 1
    except OSError as exc:
        log(f"error: {root}: {exc.strerror or exc}; fix: --out must be a writable directory")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
