"""An index that gives no answer is said once, with its cause and the redirect, by `newest` and `bump`; every
package on it points at that one line instead of repeating the connection error."""

from __future__ import annotations

import socket

import pytest

from stackforge.clients.index import IndexQueryError, IndexUnreachable
from stackforge.freshness import bump, lines, newest
from stackforge.freshness.lines import load_catalog
from stackforge.stack.load import load


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead(closed_port, tmp_path):
    url = f"http://127.0.0.1:{closed_port}/simple"
    return load("post2", overrides=[f"indexes.mthreads.url={url}", f"indexes.pypi.url={url}/public"]), tmp_path


def test_newest_names_each_unreachable_index_once(dead):
    loaded, cache = dead
    report = newest.newest(loaded, cache_dir=cache)
    text = report.render()
    assert text.count("connection refused") == 2  # one line per index, none per package
    assert "redirect: --set indexes.mthreads.url=<URL>" in text and "redirect: --set indexes.pypi.url=<URL>" in text
    assert "Max retries" not in text and "ConnectionError" not in text
    assert all(p.status == "unknown" and p.note.startswith("cannot reach index") for p in report.packages)
    on_mthreads = [p.name for p in report.packages if p.index == "mthreads"]
    assert f"  {', '.join(on_mthreads)}: cannot reach index 'mthreads' (its line above)" in text.splitlines()


def test_bump_says_why_once_per_index(dead):
    loaded, cache = dead
    catalog, _ = load_catalog(loaded, list(loaded.model.packages), cache_dir=cache)
    plan = bump.plan_bump(loaded.model, catalog, new_name="post3")
    torch = next(p for p in plan.problems if p.startswith("train torch"))
    assert torch.endswith(
        "index 'mthreads' is unreachable (connection refused); redirect: --set indexes.mthreads.url=<URL>"
    )
    assert len(torch) < 300


def test_an_index_that_answers_for_some_packages_keeps_each_message(dead):
    """Not "unreachable": a 404 or a bad page is about one package, and stays with it."""
    loaded, cache = dead
    catalog, _ = load_catalog(loaded, ["torch", "torch_musa"], cache_dir=cache)
    assert lines.unreachable(catalog, ["torch", "torch_musa"]) == "connection refused"
    catalog.pages["torch"] = IndexQueryError("HTTP 500 from the index")
    assert isinstance(catalog.pages["torch_musa"], IndexUnreachable)
    assert lines.unreachable(catalog, ["torch", "torch_musa"]) is None
