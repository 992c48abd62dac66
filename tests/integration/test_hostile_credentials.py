"""A private index that requires HTTP basic auth: the host-side sdist fetch, ``stackforge lock`` (uv)
and ``stackforge newest`` take its credential from each source the README names (userinfo in the URL,
``STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD``, ``~/.netrc``) through the one resolver, and without it they
fail with a message that names the 401 and the fix. The password is never printed, never written into a
lock, and a git upstream's credential reaches git as a header, not on its command line or in its errors.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stackforge.cli import main as cli
from stackforge.clients import upstream as upstreams
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.stack.load import load
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_tiny_sdist, build_wheel

PASSWORD = "Cnry-pw 4418"  # a space: the netrc and every path must carry it intact
USER = "ci"


@pytest.fixture(scope="module")
def private_index(tmp_path_factory):
    files = tmp_path_factory.mktemp("private-files")
    build_wheel(files, "tinypkg", "1.0")
    sha = build_tiny_sdist(files)
    root = tmp_path_factory.mktemp("repo")
    (root / "stacks").mkdir()
    with IndexServer(files, auth=(USER, PASSWORD)) as server:
        (root / "stacks" / "tiny.yaml").write_text(f"""name: tiny
platform: {{os: debian12, python: "3.11"}}
base: {{image: stackforge/base:bookworm}}
indexes:
  priv: {{url: "{server.url}", role: public, private: true}}
upstreams:
  tinysrc:
    sdist: {{index: priv, name: tinysrc, version: "1.0", sha256: {sha}}}
packages:
  tinypkg: {{version: "1.0", index: priv}}
tags: {{local: "tiny:1"}}
targets: {{app: {{}}}}
""")
        yield server, root


def _source(kind: str, server: IndexServer, home: Path, monkeypatch, password: str = PASSWORD) -> list[str]:
    """Give the credential from one source; returns the --set overrides for it."""
    for var in ("USERNAME", "PASSWORD"):
        monkeypatch.delenv(f"STACKFORGE_INDEX_PRIV_{var}", raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("STACKFORGE_CACHE", str(home / "cache"))
    if kind == "url":
        return [f"indexes.priv.url={server.url_with_auth.replace(PASSWORD.replace(' ', '%20'), password)}"]
    if kind == "env":
        monkeypatch.setenv("STACKFORGE_INDEX_PRIV_USERNAME", USER)
        monkeypatch.setenv("STACKFORGE_INDEX_PRIV_PASSWORD", password)
    if kind == "netrc":
        netrc = home / ".netrc"
        netrc.write_text(f'machine 127.0.0.1 login {USER} password "{password}"\n')
        netrc.chmod(0o600)
    return []


SOURCES = ["url", "env", "netrc"]


def _cli(capsys, root: Path, *argv: str) -> tuple[int, str]:
    code = cli.main(["--root", str(root), *argv])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("kind", SOURCES)
def test_sdist_fetch_uses_the_credential(private_index, tmp_path, monkeypatch, kind):
    server, root = private_index
    sets = _source(kind, server, tmp_path, monkeypatch)
    loaded = load("tiny", root, sets)
    stack = loaded.model
    up = stack.upstreams["tinysrc"].sdist
    spec = upstreams.SdistSpec(stack.indexes["priv"].url, up.name, up.version, up.sha256)
    server.reset_log()
    # the credential comes with the stack (what its URL carried, its index's variables, netrc), handed to the fetch
    credential = loaded.credentials.for_index("priv")
    path = upstreams.fetch_sdist(spec, Workspace.at(root).cache(), credential=credential)
    assert path.name == "tinysrc-1.0.tar.gz"
    downloads = [r for r in server.requests if r.path.startswith("/files/")]
    assert downloads and all(r.authorized and r.status == 200 for r in downloads)


@pytest.mark.parametrize("kind", [*SOURCES, "none"])
def test_sdist_fetch_without_or_with_a_wrong_credential_fails_clearly(private_index, tmp_path, monkeypatch, kind):
    server, root = private_index
    wrong = "Wrong-" + PASSWORD.replace(" ", "")
    sets = (
        _source(kind, server, tmp_path, monkeypatch, password=wrong)
        if kind != "none"
        else _source("none", server, tmp_path, monkeypatch)
    )
    loaded = load("tiny", root, sets)
    stack = loaded.model
    up = stack.upstreams["tinysrc"].sdist
    with pytest.raises(UserError) as err:
        upstreams.fetch_sdist(
            upstreams.SdistSpec(stack.indexes["priv"].url, up.name, up.version, up.sha256),
            Workspace.at(root).cache(),
            credential=loaded.credentials.for_index("priv"),
        )
    text = err.value.render()
    assert "401" in text and "STACKFORGE_INDEX_<NAME>_USERNAME" in text, text
    assert wrong not in text and PASSWORD not in text


@pytest.mark.parametrize("kind", SOURCES)
def test_lock_uses_the_credential_and_writes_none(private_index, tmp_path, monkeypatch, capsys, kind):
    server, root = private_index
    sets = _source(kind, server, tmp_path, monkeypatch)
    code, text = _cli(capsys, root, "lock", "tiny", *[a for s in sets for a in ("--set", s)])
    assert code == 0, text
    lock = (root / "stacks" / "locks" / "tiny" / "priv.txt").read_text()
    assert "tinypkg==1.0" in lock and "--hash=sha256:" in lock
    for leak in (PASSWORD, PASSWORD.replace(" ", "%20")):
        assert leak not in lock and leak not in text


def test_lock_without_a_credential_fails_clearly(private_index, tmp_path, monkeypatch, capsys):
    server, root = private_index
    _source("none", server, tmp_path, monkeypatch)
    code, text = _cli(capsys, root, "lock", "tiny")
    assert code == 2
    assert "uv could not resolve index 'priv'" in text and "credentials" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("kind", SOURCES)
def test_newest_uses_the_credential(private_index, tmp_path, monkeypatch, capsys, kind):
    server, root = private_index
    sets = _source(kind, server, tmp_path, monkeypatch)
    code, text = _cli(capsys, root, "newest", "tiny", "--json", "--no-cache", *[a for s in sets for a in ("--set", s)])
    assert PASSWORD not in text and PASSWORD.replace(" ", "%20") not in text
    data = json.loads(text[text.index("{") :])
    # The index answered: the pin's release was read from it (a 401 would leave no upload time or hash).
    (row,) = data["packages"]
    assert row["pinned_sha256"] and row["pinned_upload_time"], row
    assert code in (0, 1), text


def test_newest_without_a_credential_says_401(private_index, tmp_path, monkeypatch, capsys):
    server, root = private_index
    _source("none", server, tmp_path, monkeypatch)
    code, text = _cli(capsys, root, "newest", "tiny", "--no-cache")
    assert code == 2 and "401" in text


# --------------------------------------------------------------------------- git upstreams


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_GET(self):
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
        self.send_response(403)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def git_server():
    _Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", _Recorder.seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("form", ["userinfo", "token-user", "query-token"])
def test_git_upstream_credential_goes_as_a_header_and_never_into_an_error(git_server, tmp_path, form):
    base, seen = git_server
    secret = "GitCnry" + form.replace("-", "")
    url = {
        "userinfo": f"{base.replace('http://', f'http://ci:{secret}@')}/org/repo.git",
        "token-user": f"{base.replace('http://', f'http://{secret}@')}/org/repo.git",
        "query-token": f"{base}/org/repo.git?private_token={secret}",
    }[form]
    spec = upstreams.UpstreamSpec(git=url, tag="v1", commit="0" * 40)
    with pytest.raises(UserError) as err:
        upstreams.fetch_upstream(spec, tmp_path / "cache")
    text = err.value.render()
    assert secret not in text and "Traceback" not in text
    assert "cannot fetch upstream" in text and "127.0.0.1" in text and "/org/repo.git" in text
    assert seen, "git never reached the server"
    if form == "query-token":
        assert any(f"private_token={secret}" in r["path"] for r in seen)
    else:
        user = "ci" if form == "userinfo" else secret
        password = secret if form == "userinfo" else ""
        header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        assert all(r["authorization"] == header for r in seen)
    for config in (tmp_path / "cache").rglob("config"):
        assert secret not in config.read_text()  # the mirror's remote is the clean URL
