"""A build never fetches an upstream whose pinned commit is already in the cache; --refresh fetches anyway.

post2's upstreams point at copies of the stand-in repositories. After one context assembly fills the cache, the
copies are moved away: the next assembly still works (nothing is asked of the upstream), a refreshing one
fails naming the key, and a pin the cache does not hold is fetched (and fails the same way here).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stackforge.builder.context.context import assemble
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.stack.load import load, load_stack
from tests.fixtures import musa_standins as ms
from tests.fixtures.stack_support import make_root

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return ms.make_upstreams(tmp_path_factory.mktemp("reuse-upstreams"), load_stack("post2", root=REPO))


def test_the_cache_serves_a_pinned_commit_without_the_upstream(tmp_path, repos, monkeypatch, capsys):
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    root = make_root(tmp_path)
    shutil.copytree(REPO / "patches", root / "patches")
    copies = tmp_path / "upstreams"
    sets = []
    for name, repo in repos.items():
        shutil.copytree(repo.path, copies / name)
        sets += [f"upstreams.{name}.git=file://{copies / name}", f"upstreams.{name}.commit={repo.commit}"]
    loaded = load("post2", root=root, overrides=sets)
    first = assemble(loaded, tmp_path / "one", workspace=Workspace(lambda: root))
    assert "(not fetched" not in capsys.readouterr().err
    (copies / "vllm" / "NEWS.md").write_text("a commit the cache has never seen\n")
    ms._git(copies / "vllm", "add", "-A")
    ms._git(copies / "vllm", "commit", "-q", "-m", "later")
    later = ms._git(copies / "vllm", "rev-parse", "HEAD")
    shutil.move(copies, tmp_path / "gone")  # every upstream is unreachable from here on
    second = assemble(loaded, tmp_path / "two", workspace=Workspace(lambda: root))
    err = capsys.readouterr().err
    stack = loaded.model
    for name, repo in repos.items():
        shown = stack.upstreams[name].tag or repo.commit[:12]  # the FlashInfer fork is pinned by commit only
        assert f"{name} {shown}: the pinned commit is in the cache (not fetched; --refresh fetches anyway)" in err
    assert [s.pin for s in second.sources] == [s.pin for s in first.sources]
    with pytest.raises(UserError) as exc:
        assemble(loaded, tmp_path / "three", workspace=Workspace(lambda: root, refresh=True))
    assert exc.value.message.startswith("upstreams.vllm_musa.git: ")  # the carrier is exported first
    # A pin the cache does not hold is fetched, so it fails here too.
    moved = load(
        "post2",
        root=root,
        overrides=[*sets, f"upstreams.vllm.commit={later}", "upstreams.vllm.tag=null"],
    )
    with pytest.raises(UserError) as exc:
        assemble(moved, tmp_path / "four", workspace=Workspace(lambda: root))
    assert exc.value.message.startswith("upstreams.vllm.git: ")
