"""SIGTERM and SIGINT during ``stackforge build``: the engine's process group is stopped, the netrc secret
is removed, ``result.json`` records the interruption and the command exits 143 / 130 with one line.

A tiny stack whose private index requires HTTP basic auth (the password is a fresh canary, given in the
URL) and whose kernel step runs ``sleep 60``; the signal is sent once the engine runs that step.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stackforge.builder.plan.render import SOURCE_IMAGES
from stackforge.builder.records import evidence as evidence_dirs
from tests.fixtures import run_names
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_tiny_sdist, build_wheel

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]


def _processes_with(needle: str) -> list[str]:
    """Command lines (from /proc) of running processes that mention ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and int(entry.name) != os.getpid() and "-m pytest" not in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def _files_holding(root: Path, canary: bytes, since: float) -> list[str]:
    """Files under ``root`` changed since ``since`` (small enough to read) that contain ``canary``."""
    hits = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
                if not path.is_file() or st.st_size > 4 << 20 or max(st.st_mtime, st.st_ctime) < since:
                    continue
                if canary in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                continue
    return hits


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_build_stops_the_engine_and_leaves_no_secret(tmp_path, base_image, signum):
    started = time.time()
    files = tmp_path / "files"
    build_wheel(files, "tinypkg", "1.0")
    sha = build_tiny_sdist(files)
    password = "CANARYsig" + secrets.token_hex(10)
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "images").symlink_to(SOURCE_IMAGES)
    tag = f"{run_names.NS}/sig-{secrets.token_hex(4)}"
    with IndexServer(files, auth=("ci", password)) as server:
        (root / "stacks" / "sig.yaml").write_text(f"""name: sig
platform: {{os: debian12, python: "3.11"}}
base: {{image: {base_image}, python: python3}}
indexes:
  priv: {{url: "{server.url}", role: public, private: true}}
upstreams:
  tinysrc:
    sdist: {{index: priv, name: tinysrc, version: "1.0", sha256: {sha}}}
kernels:
  slow: {{upstream: tinysrc, run: "sleep 60 && echo {tag}"}}
packages:
  tinypkg: {{version: "1.0", index: priv}}
tags: {{local: "{tag}:1"}}
targets: {{app: {{}}}}
""")
        out = tmp_path / "out"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "tools"), str(REPO)]),
            "STACKFORGE_CACHE": str(tmp_path / "cache"),
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stackforge",
                "--root",
                str(root),
                "build",
                "sig",
                "--network",
                "host",
                "--no-cache",
                "--out",
                str(out),
                "--set",
                f"indexes.priv.url={server.url_with_auth}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            lines = []
            deadline = time.monotonic() + 240
            for line in proc.stderr:  # BuildKit's log is on stderr: wait until it runs the sleeping kernel step
                lines.append(line)
                if "sleep 60" in line and line.startswith("#"):
                    break
                assert time.monotonic() < deadline, "".join(lines[-30:])
            else:
                pytest.fail("the build ended before its kernel step ran:\n" + "".join(lines[-30:]))
            mine = [c for c in _processes_with(str(out / "context")) if "buildx" in c]  # not another run's
            assert mine, "no buildx process of this build while it runs:\n" + "".join(lines[-40:])
            time.sleep(1)
            proc.send_signal(signum)
            rest, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1].startswith(f"error: interrupted by {name}; the engine was stopped"), err
    assert "Traceback" not in err
    result = json.loads((evidence_dirs.newest(out / "evidence") / "result.json").read_text())
    assert result["status"] == "interrupted" and result["signal"] == name and result["ok"] is False
    leftover = [
        p
        for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("stackforge-secrets-*")
        if any(password.encode() in f.read_bytes() for f in p.rglob("*") if f.is_file())
    ]
    assert leftover == []
    assert _files_holding(Path("/tmp"), password.encode(), started) == []
    assert _files_holding(out, password.encode(), 0) == []
    deadline = time.monotonic() + 20  # BuildKit kills the cancelled step's container asynchronously
    while (_processes_with(tag) or _processes_with(str(out / "context"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(str(out / "context")) == []  # no buildx client left
    assert _processes_with(tag) == []  # and no step of the cancelled build
    assert password not in "".join(lines) + rest + err
    images = subprocess.run(["docker", "image", "ls", "-q", tag], capture_output=True, text=True).stdout
    assert images.strip() == ""  # nothing was tagged
