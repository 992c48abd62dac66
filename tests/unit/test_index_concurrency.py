"""The index client under concurrency: the pages and errors are those of one-by-one queries, in the order
asked; one session per index reuses its connections; a page is fetched once however many threads ask."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from stackforge.clients.index import JSON_V1, POOL_SIZE, IndexClient, IndexQueryError, ProjectNotFound
from stackforge.freshness.lines import fetch_pages


class _Index:
    """A PEP 691 index on loopback: ``projects`` name → versions; a project asked for later answers sooner
    (``delays``), so concurrent answers arrive out of order. Records each request and its client port."""

    def __init__(self, projects: dict[str, list[str]], delays: dict[str, float] | None = None) -> None:
        self.projects = projects
        self.delays = delays or {}
        self.seen: list[tuple[str, int]] = []
        lock = threading.Lock()
        index = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.strip("/").split("/")[-1]
                with lock:
                    index.seen.append((name, self.client_address[1]))
                time.sleep(index.delays.get(name, 0.0))
                if name not in index.projects:
                    body, status = b"not found", 404
                else:
                    files = [
                        {
                            "filename": f"{name}-{v}-py3-none-any.whl",
                            "url": f"/files/{name}-{v}-py3-none-any.whl",
                            "hashes": {"sha256": f"{i:064x}"},
                            "size": 100 + i,
                            "upload-time": f"2026-01-0{1 + i % 9}T00:00:00Z",
                        }
                        for i, v in enumerate(index.projects[name])
                    ]
                    body = json.dumps({"name": name, "meta": {"api-version": "1.1"}, "files": files}).encode()
                    status = 200
                self.send_response(status)
                self.send_header("Content-Type", JSON_V1 if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def connections(self) -> set[int]:
        return {port for _, port in self.seen}


@pytest.fixture
def indexes():
    names_a = [f"alpha{i}" for i in range(10)]
    names_b = [f"beta{i}" for i in range(8)]
    a = _Index(
        {n: ["1.0", f"1.{i + 1}"] for i, n in enumerate(names_a)}, {n: 0.01 * (10 - i) for i, n in enumerate(names_a)}
    )
    b = _Index({n: ["2.0"] for n in names_b}, {n: 0.01 * (8 - i) for i, n in enumerate(names_b)})
    yield a, b
    a.close()
    b.close()


def _stack(packages: dict[str, str]):
    return SimpleNamespace(packages={n: SimpleNamespace(index=i) for n, i in packages.items()})


def _summary(result) -> list:
    """What a caller sees of each answer: the page's files, or the error's class and message."""
    out = []
    for name, page in result.items():
        if isinstance(page, IndexQueryError):
            out.append((name, type(page).__name__, page.message, page.fix))
        else:
            out.append(
                (
                    name,
                    page.name,
                    page.url,
                    page.format,
                    [(f.filename, f.url, f.sha256, f.size, f.upload_time) for f in page.files],
                )
            )
    return out


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/simple"


def test_concurrent_pages_are_the_one_by_one_pages_in_the_order_asked(indexes):
    a, b = indexes
    dead = _dead_url()
    packages = {n: "a" for n in a.projects} | {n: "b" for n in b.projects}
    packages |= {"gone": "a", "lost": "dead"}
    order = sorted(packages, key=lambda n: (len(n) % 3, n))  # interleave the indexes
    stack = _stack(packages)

    def clients():
        return {
            "a": IndexClient(a.url, credential=None),
            "b": IndexClient(b.url, credential=None),
            "dead": IndexClient(dead, credential=None),
        }

    one_by_one = {}
    sequential = clients()
    for n in order:
        try:
            one_by_one[n] = sequential[packages[n]].project(n)
        except IndexQueryError as exc:
            one_by_one[n] = exc
    concurrent = fetch_pages(stack, order, clients())
    assert list(concurrent) == order
    assert _summary(concurrent) == _summary(one_by_one)
    assert isinstance(concurrent["gone"], ProjectNotFound)
    assert concurrent["gone"].message == f"{a.url}/gone/: no such project on this index (HTTP 404)"
    assert concurrent["lost"].message.startswith(f"cannot reach {dead}/lost/: ConnectionError")
    assert isinstance(concurrent["alpha3"], type(one_by_one["alpha3"]))


def test_the_pages_are_fetched_together_not_one_after_another(indexes):
    a, b = indexes
    for idx in (a, b):
        idx.delays = dict.fromkeys(idx.projects, 0.2)
    packages = {n: "a" for n in a.projects} | {n: "b" for n in b.projects}
    clients = {"a": IndexClient(a.url, credential=None), "b": IndexClient(b.url, credential=None)}
    start = time.monotonic()
    pages = fetch_pages(_stack(packages), list(packages), clients)
    elapsed = time.monotonic() - start
    assert not any(isinstance(p, IndexQueryError) for p in pages.values())
    # 18 pages of 0.2 s each: one after another 3.6 s; one round, as every page has its own thread here.
    assert elapsed < 1.8, elapsed


def test_one_session_per_index_reuses_its_connections(indexes):
    a, _ = indexes
    client = IndexClient(a.url, credential=None, max_workers=4)
    names = list(a.projects)
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(client.project, names))
    assert len(a.seen) == len(names)
    assert len(a.connections) <= 4 < len(names)
    # Connections are bounded by the pool even when more threads ask at once.
    other = IndexClient(a.url, credential=None, max_workers=1)
    a.seen.clear()
    more = [f"absent{i}" for i in range(POOL_SIZE + 8)]
    a.delays |= dict.fromkeys(more, 0.1)

    def ask(name):
        with pytest.raises(ProjectNotFound):
            other.project(name)

    with ThreadPoolExecutor(max_workers=len(more)) as pool:
        list(pool.map(ask, more))
    assert len(a.seen) == len(more) and len(a.connections) <= POOL_SIZE


def test_a_page_asked_for_by_many_threads_at_once_is_fetched_once(indexes):
    a, _ = indexes
    a.delays["alpha1"] = 0.3
    client = IndexClient(a.url, credential=None)
    with ThreadPoolExecutor(max_workers=8) as pool:
        pages = list(pool.map(lambda _: client.project("Alpha1"), range(8)))
    assert [name for name, _ in a.seen] == ["alpha1"]
    assert all(p is pages[0] for p in pages)
    assert client.project("alpha1") is pages[0] and len(a.seen) == 1


def test_a_failed_fetch_fails_every_waiter_and_is_asked_again_later(indexes):
    a, _ = indexes
    a.delays["missing"] = 0.3
    client = IndexClient(a.url, credential=None)

    def ask(_):
        try:
            return client.project("missing")
        except ProjectNotFound as exc:
            return exc.message

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(ask, range(6)))
    assert answers == [f"{a.url}/missing/: no such project on this index (HTTP 404)"] * 6
    assert len(a.seen) == 1
    with pytest.raises(ProjectNotFound):
        client.project("missing")
    assert len(a.seen) == 2
