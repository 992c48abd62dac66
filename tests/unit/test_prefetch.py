"""The index queries a query command starts from the stack file before the model validates it: only names and
URLs the model's own grammar accepts are asked, and a run whose stack then fails does not wait for them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stackforge.clients.index import ProjectNotFound
from stackforge.freshness import prefetch
from tests.fixtures.index_server import IndexServer

REPO = Path(__file__).resolve().parents[2]


def write_stack(root: Path, name: str, text: str) -> Path:
    (root / "stacks").mkdir(parents=True, exist_ok=True)
    path = root / "stacks" / f"{name}.yaml"
    path.write_text(text)
    return root


def join_prefetch_threads() -> None:
    for t in threading.enumerate():
        if t.name == "stackforge-prefetch":
            t.join(timeout=30)
            assert not t.is_alive()


@pytest.fixture
def index(tmp_path):
    (tmp_path / "empty-index").mkdir()
    with IndexServer(tmp_path / "empty-index") as server:
        yield server


def test_only_names_and_urls_the_model_accepts_are_asked(tmp_path):
    (tmp_path / "empty-index").mkdir()
    with IndexServer(tmp_path / "empty-index", auth=("u", "pw")) as index:
        clients, requests = _evil(index, tmp_path)
    assert sorted(clients) == ["good"]
    good = clients["good"]
    # The credential was split off the URL, as the loader splits it: it goes as basic auth, never in the path.
    assert good.url == f"http://127.0.0.1:{index.port}/simple/" and good.auth == ("u", "pw")
    assert [(r.path, r.authorized) for r in requests] == [("/simple/ok/", True)]


def _evil(index, tmp_path):
    root = write_stack(
        tmp_path / "repo",
        "evil",
        f"""name: evil
indexes:
  good: {{url: "http://u:pw@127.0.0.1:{index.port}/simple/", role: public}}
  ftp: {{url: "ftp://127.0.0.1:{index.port}/simple", role: public}}
  "bad name!": {{url: "http://127.0.0.1:{index.port}/other", role: public}}
packages:
  ok: {{index: good, version: "1.0"}}
  "../../admin": {{index: good, version: "1.0"}}
  "http://elsewhere.example/x": {{index: good, version: "1.0"}}
  "trailing\\n": {{index: good, version: "1.0"}}
  on-ftp: {{index: ftp, version: "1.0"}}
  on-bad: {{index: "bad name!", version: "1.0"}}
  no-index: {{version: "1.0"}}
""",
    )
    early = prefetch.start(root, "evil", [])
    clients = early.clients
    join_prefetch_threads()
    # The document is the loader's as read: the credential is still in the URL, for the loader to split off.
    assert early.document is not None and "u:pw@" in early.document.data["indexes"]["good"]["url"]
    requests = list(index.requests)
    with pytest.raises(ProjectNotFound):
        clients["good"].project("ok")  # an error is not kept: the validated run asks again and reports it
    assert len(index.requests) == len(requests) + 1
    return clients, requests


def test_packages_narrow_the_queries_and_built_for_rules_add_their_for_package(index, tmp_path):
    root = write_stack(
        tmp_path / "repo",
        "narrow",
        """name: narrow
indexes:
  idx: {url: "http://127.0.0.1:%d/simple", role: public}
packages:
  deep-ep: {index: idx, version: "1.0"}
  torch: {index: idx, version: "2.0"}
  other: {index: idx, version: "3.0"}
rules:
  built_for: [{package: deep-ep, for: torch, local: "t{{ for.public }}"}]
"""
        % index.port,
    )
    prefetch.start(root, "narrow", [], packages=["deep-ep", "not-in-the-stack"])
    join_prefetch_threads()
    assert sorted(r.path for r in index.requests) == ["/simple/deep-ep/", "/simple/torch/"]


@pytest.mark.parametrize(
    "text",
    [
        "name: other\n",  # the file names another stack
        "name: broken\ninherits: missing\n",  # a parent that does not exist
        "name: broken\nindexes: [1, 2]\npackages: {x: 1}\n",  # shapes the document reader does not expect
        "- just\n- a list\n",
    ],
)
def test_a_document_the_reader_refuses_or_cannot_use_starts_nothing(tmp_path, text):
    root = write_stack(tmp_path / "repo", "broken", text)
    for name in ("broken", "no-such-stack"):
        early = prefetch.start(root, name, [])
        if early.document is None:
            assert early.clients == {}
        else:  # read, but there is nothing the model's grammar lets it ask
            assert early.clients == {} and not [t for t in threading.enumerate() if t.name == "stackforge-prefetch"]


def test_a_stack_that_fails_validation_exits_without_waiting_for_a_stalled_index(tmp_path):
    """The prefetch threads are daemons: the run reports the invalid stack and exits while the index it asked
    still holds every request (the client's own timeout is 30 s)."""
    (tmp_path / "empty-index").mkdir()
    with IndexServer(tmp_path / "empty-index", delay=120) as stalled:
        root = write_stack(
            tmp_path / "repo",
            "invalid",
            f"""name: invalid
platform: 5
indexes:
  idx: {{url: "http://127.0.0.1:{stalled.port}/simple", role: public}}
packages:
  torch: {{index: idx, version: "2.0"}}
""",
        )
        proc = subprocess.run(
            [sys.executable, "-m", "stackforge", "--root", str(root), "newest", "invalid", "--no-cache"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=dict(os.environ),
        )
        asked = [r.path for r in stalled.requests]
    assert proc.returncode == 2, proc.stderr
    assert "stacks/invalid.yaml:2" in proc.stderr and "platform" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The server records a request once it has answered; none was answered, so none is listed.
    assert asked == []


def test_a_failure_while_planning_the_queries_starts_none_and_keeps_the_document(index, tmp_path, monkeypatch):
    root = write_stack(
        tmp_path / "repo",
        "plain",
        "name: plain\nindexes:\n  idx: {url: 'http://127.0.0.1:%d/simple', role: public}\n"
        "packages:\n  torch: {index: idx, version: '2.0'}\n" % index.port,
    )

    def refuse(*_args, **_kwargs):
        raise RuntimeError("no credential lookup here")

    monkeypatch.setattr(prefetch.credentials, "resolve", refuse)
    early = prefetch.start(root, "plain", [])
    assert early.clients == {} and early.document is not None and not early.document.used
    join_prefetch_threads()
    assert index.requests == []
