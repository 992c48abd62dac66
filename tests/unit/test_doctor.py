"""`stackforge doctor`: every endpoint a stack needs, checked at once against loopback stand-ins.

post2 is pointed (with --set only) at: a stub registry holding the base image, the stand-in git repositories
(file:// URLs, tags included), two simple-index servers serving the first package each index provides, and an
HTTP server with an apt suite. Then single endpoints are broken, one way each, and the table must say which,
why, and how to redirect it. The engine rows are left out (--no-engine): these tests need no engine.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stackforge.stack.load import load_stack
from tests.fixtures import musa_standins as ms
from tests.fixtures.hostile_server import HostileServer, endless, trickle
from tests.fixtures.index_server import IndexServer
from tests.fixtures.stack_support import RootSpec, run_cli
from tests.fixtures.stub_registry import StubRegistry

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-doctor"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return ms.make_upstreams(tmp_path_factory.mktemp("doctor-upstreams"), load_stack("post2", root=REPO))


@pytest.fixture(scope="module")
def registry():
    with StubRegistry() as reg:
        reg.put_image("stand-in/ubuntu", "22.04", b'{"architecture": "amd64", "os": "linux"}', [b"layer"])
        yield reg


def _index_dir(tmp: Path, filename: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / filename).write_bytes(b"not really a wheel")
    return tmp


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("doctor-indexes")
    vendor = IndexServer(_index_dir(tmp / "vendor", "torch-2.11.0-cp310-cp310-linux_x86_64.whl"), auth=("ci", SECRET))
    public = IndexServer(_index_dir(tmp / "public", "torchada-0.1.90-py3-none-any.whl"))
    with vendor, public:
        yield {"mthreads": vendor, "pypi": public}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def apt(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor-apt")
    (root / "dists" / "jammy").mkdir(parents=True)
    (root / "dists" / "jammy" / "Release").write_text("Suite: jammy\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class Silent:
    """A port that accepts connections and never answers; counts how many were open at once."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.open = 0
        self.most = 0
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
                self.open += 1
                self.most = max(self.most, self.open)

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(env={"STACKFORGE_INDEX_MTHREADS_USERNAME": "ci", "STACKFORGE_INDEX_MTHREADS_PASSWORD": SECRET})


def good(repos, registry, indexes, apt) -> list[str]:
    out = [f"base.image={registry.address}/stand-in/ubuntu:22.04", f"system.musa.sources.musa.url={apt}"]
    out += [f"system.os.mirror.to={apt}"]
    out += [f"indexes.{n}.url={s.url}" for n, s in indexes.items()]
    for name, repo in repos.items():
        out += [f"upstreams.{name}.git=file://{repo.path}", f"upstreams.{name}.commit={repo.commit}"]
    return out


def doctor(capsys, root, sets, *extra) -> tuple[int, list[dict], str]:
    args = ["doctor", "post2", "--no-engine", "--timeout", "2", "--json", *extra]
    rc, out, err = run_cli(capsys, root, *args, *[a for s in sets for a in ("--set", s)])
    return rc, json.loads(out) if out.strip() else [], err


def by_check(rows: list[dict]) -> dict[str, dict]:
    return {r["check"]: r for r in rows}


def test_every_endpoint_reachable(capsys, root, repos, registry, indexes, apt):
    rc, rows, err = doctor(capsys, root, good(repos, registry, indexes, apt))
    assert rc == 0, json.dumps(rows, indent=1) + err
    rows_by = by_check(rows)
    assert rows_by["base image"]["detail"].startswith("its registry has it (sha256:")
    assert rows_by["git vllm"]["detail"] == "reachable, tag v0.28.0 present"
    assert rows_by["git flashinfer"]["detail"] == "reachable"  # pinned by commit only
    assert rows_by["index mthreads"]["detail"] == "serves torch (1 files)"  # with the credential from the env
    assert rows_by["index pypi"]["detail"] == "serves torchada (1 files)"
    assert rows_by["apt musa.musa"]["detail"] == "suite jammy (Release)"
    assert rows_by["apt os mirror"]["detail"] == "reachable (HTTP 200)"
    assert [r["status"] for r in rows] == ["ok"] * len(rows) and len(rows) == 9


def test_failures_name_the_key_and_both_spellings_and_never_the_secret(capsys, root, repos, registry, indexes, apt):
    sets = good(repos, registry, indexes, apt) + [
        "system.os.install=never",
        f"indexes.mthreads.url=http://ci:wrong-{SECRET}@127.0.0.1:{indexes['mthreads'].port}/simple",
        f"upstreams.vllm.git=http://127.0.0.1:{closed_port()}/vllm.git",
        "upstreams.vllm_musa.tag=v9.9.9",
        f"system.musa.sources.musa.url=http://127.0.0.1:{closed_port()}/musa/",
        f"base.image={registry.address}/stand-in/ubuntu:20.04",
    ]
    rc, rows, err = doctor(capsys, root, sets)
    assert rc == 1
    rows_by = by_check(rows)
    index = rows_by["index mthreads"]
    assert index["status"] == "fail" and "HTTP 401 (credentials missing or refused)" in index["detail"]
    assert index["set"] == "--set indexes.mthreads.url=<INDEX-URL>"
    assert index["make"] == "make image STACK=post2 ARGS='--set indexes.mthreads.url=<INDEX-URL>'"
    assert rows_by["git vllm"]["status"] == "fail" and rows_by["git vllm"]["key"] == "upstreams.vllm.git"
    assert rows_by["git vllm_musa"]["detail"] == "reachable, but it has no tag v9.9.9"
    apt_row = rows_by["apt musa.musa"]
    assert apt_row["detail"].startswith("cannot reach it: ConnectionError: Connection refused"), apt_row
    assert apt_row["key"] == "system.musa.sources.musa.url"
    assert "has no stand-in/ubuntu:20.04" in rows_by["base image"]["detail"]
    assert rows_by["base image"]["set"] == "--set base.image=<IMAGE>"
    assert rows_by["apt os mirror"]["status"] == "skip"  # install: never needs no mirror
    assert rows_by["git flashinfer"]["status"] == "ok"  # the rest still answered
    # The text table says the same, and no credential is in either.
    rc, out, err = run_cli(
        capsys, root, "doctor", "post2", "--no-engine", "--timeout", "2", *[a for s in sets for a in ("--set", s)]
    )
    assert rc == 1
    assert "redirect: --set upstreams.vllm.git=<URL>" in out
    assert "or: make image STACK=post2 ARGS='--set upstreams.vllm.git=<URL>'" in out
    assert out.splitlines()[-1].startswith("doctor: ") and out.splitlines()[-1].endswith(" failed")
    assert SECRET not in out + err + json.dumps(rows)


def test_endpoints_are_checked_at_once_each_with_its_timeout(capsys, root, repos, registry, indexes, apt):
    silent = Silent()
    try:
        url = f"http://127.0.0.1:{silent.port}"
        sets = good(repos, registry, indexes, apt) + [
            f"indexes.mthreads.url={url}/a/simple",
            f"indexes.pypi.url={url}/b/simple",
            f"system.musa.sources.musa.url={url}/musa/",
        ]
        rc, rows, _ = doctor(capsys, root, sets)
    finally:
        silent.close()
    assert rc == 1
    timed_out = [r for r in rows if r["status"] == "fail" and "timed out" in r["detail"]]
    assert sorted(r["check"] for r in timed_out) == ["apt musa.musa", "index mthreads", "index pypi"]
    assert silent.most == 3  # all three were waiting at the same time, not one timeout after the other


def test_a_server_that_trickles_or_never_ends_is_failed_within_the_timeout(capsys, root, repos, registry, indexes, apt):
    routes = {
        r"/a/": trickle("application/vnd.pypi.simple.v1+json", every=0.3),
        r"/b/": endless("application/vnd.pypi.simple.v1+json"),
        r"/musa/": trickle("text/plain", every=0.3, headers_too=True),
    }
    with HostileServer(routes, lifetime=40) as bad:
        sets = good(repos, registry, indexes, apt) + [
            f"indexes.mthreads.url={bad.url}/a/simple",
            f"indexes.pypi.url={bad.url}/b/simple",
            f"system.musa.sources.musa.url={bad.url}/musa/",
        ]
        started = time.monotonic()
        rc, rows, _ = doctor(capsys, root, sets)
        elapsed = time.monotonic() - started
    assert rc == 1 and elapsed < 8, elapsed  # --timeout 2 per check, all at once; the server goes on for 20 s
    failed = {r["check"]: r["detail"] for r in rows if r["status"] == "fail"}
    assert sorted(failed) == ["apt musa.musa", "index mthreads", "index pypi"], failed
    assert "timed out" in failed["index mthreads"] and "timed out" in failed["apt musa.musa"]
    assert "larger than" in failed["index pypi"] or "timed out" in failed["index pypi"]
    assert all(r["seconds"] <= 2 + 1 for r in rows)


def test_a_bad_stack_is_exit_2(capsys, root):
    rc, out, err = run_cli(capsys, root, "doctor", "no-such-stack", "--no-engine")
    assert rc == 2 and "no-such-stack" in err


def test_a_build_that_cannot_fetch_an_upstream_names_the_key_and_the_redirect(root, repos, tmp_path, monkeypatch):
    from stackforge.builder.context.context import assemble
    from stackforge.errors import UserError
    from stackforge.stack.load import load

    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    url = f"http://127.0.0.1:{closed_port()}/vllm.git"
    sets = [
        v
        for name, repo in repos.items()
        for v in (f"upstreams.{name}.git={repo.path}", f"upstreams.{name}.commit={repo.commit}")
    ]
    loaded = load("post2", root=root, overrides=[*sets, f"upstreams.vllm.git={url}"])
    with pytest.raises(UserError) as exc:
        assemble(loaded, tmp_path / "out")
    err = exc.value
    assert err.message.startswith("upstreams.vllm.git: ") and str(err.file).startswith("--set upstreams.vllm.git=")
    assert "make image STACK=post2 ARGS='--set upstreams.vllm.git=<URL>'" in err.fix
    assert "stackforge doctor post2" in err.fix


def test_a_registry_probe_outlasts_one_reset_connection():
    """The base image's registry resets the probe's first connection (a load balancer's hiccup) and answers the
    second: the check passes, one transient fault is not a failed check."""
    from stackforge.flows.doctor import registry_digest

    digest = "sha256:" + "ab" * 32
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(1)
            if len(connections) == 1:  # the first connection: reset (RST, not an orderly close)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
                continue
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nDocker-Content-Digest: " + digest.encode() + b"\r\n"
                b"Content-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n"
            )
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        port = listener.getsockname()[1]
        assert registry_digest(f"127.0.0.1:{port}/stand-in/ubuntu:22.04", timeout=10) == digest
        assert len(connections) == 2
    finally:
        listener.close()
