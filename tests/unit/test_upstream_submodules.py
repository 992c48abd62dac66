"""Upstreams with git submodules (``upstreams.<name>.submodules: true``), with real git repositories.

A superproject records a submodule (which records one of its own) by gitlinks; the build context's export holds
each submodule's files at the commit its gitlink names, the evidence records path, URL and commit, and the
inputs fingerprint follows a moved submodule. A hostile ``.gitmodules`` is refused before anything is fetched
from it; an upstream without ``submodules: true`` exports as before (empty submodule directories, no record).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stackforge.builder.context.context import assemble
from stackforge.builder.mirror import manifest
from stackforge.builder.sources import sources
from stackforge.builder.sources.sources import SourceInfo
from stackforge.clients import submodules
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.flows import mirror as make
from stackforge.stack.load import fingerprint, load
from tests.fixtures.gitrepo import GitRepo
from tests.fixtures.stack_support import make_root, parse_errors, run_cli

STACK = """\
name: subs
description: an upstream with submodules
platform: {os: debian12, python: "3.11", arch: x86_64}
base: {image: "stackforge/base:bookworm", python: python3}
indexes:
  pub: {url: "https://pypi.example/simple", role: public}
packages:
  idna: {version: "3.10", index: pub, import: idna}
gate:
  imports: [{module: idna, dist: idna}]
tags:
  local: "stackforge-test/subs:1"
targets:
  run: {entrypoint: [python3]}
upstreams:
  tool: {git: UPSTREAM, commit: COMMIT}
"""


def gitlink(repo: GitRepo, path: str, commit: str) -> None:
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{commit},{path}")


def commit(repo: GitRepo, message: str) -> str:
    """Commit the index as it is (``GitRepo.commit`` adds the work tree, which has no gitlinks)."""
    repo.git("add", "--", *(p for p in ("setup.py", "lib.py", "leaf.txt", ".gitmodules") if (repo.path / p).exists()))
    repo.git("commit", "-q", "--no-verify", "-m", message, date=repo.next_date())
    return repo.head()


def gitmodules(repo: GitRepo, entries: dict[str, str]) -> None:
    repo.write(".gitmodules", "".join(f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n' for p, u in entries.items()))


class Upstreams:
    """``leaf`` (a submodule of ``lib``), ``lib`` (a submodule of ``tool`` at vendor/lib) and ``tool``."""

    def __init__(self, base: Path):
        self.leaf = GitRepo.init(base / "leaf")
        self.leaf.write("leaf.txt", "leaf v1\n")
        self.leaf_v1 = self.leaf.commit("leaf v1")
        self.lib = GitRepo.init(base / "lib")
        self.lib.write("lib.py", "VERSION = 1\n")
        gitmodules(self.lib, {"deps/leaf": "../leaf"})  # relative to lib's URL
        gitlink(self.lib, "deps/leaf", self.leaf_v1)
        self.lib_v1 = commit(self.lib, "lib v1")
        self.lib.write("lib.py", "VERSION = 2\n")
        self.lib_v2 = commit(self.lib, "lib v2")
        self.lib.git("checkout", "-q", "--detach", self.lib_v1)  # v2 is reachable from main only
        self.tool = GitRepo.init(base / "tool")
        self.tool.write("setup.py", "print('tool')\n")
        gitmodules(self.tool, {"vendor/lib": f"file://{self.lib.path}"})
        gitlink(self.tool, "vendor/lib", self.lib_v1)
        self.v1 = commit(self.tool, "tool with lib v1")

    def move_lib(self) -> str:
        """A tool commit whose only change is the submodule moving to lib v2."""
        gitlink(self.tool, "vendor/lib", self.lib_v2)
        return commit(self.tool, "lib v2")


@pytest.fixture
def ups(tmp_path):
    return Upstreams(tmp_path / "upstreams")


def stack_root(tmp_path: Path, ups: Upstreams, commit: str | None = None) -> Path:
    text = STACK.replace("UPSTREAM", f"file://{ups.tool.path}").replace("COMMIT", commit or ups.v1)
    return make_root(tmp_path, {"subs.yaml": text})


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))


def build(root: Path, out: Path, overrides: list[str] | None = None):
    loaded = load("subs", root=root, overrides=["upstreams.tool.submodules=true", *(overrides or [])])
    return assemble(loaded, out, workspace=Workspace(lambda: root))


def test_the_export_holds_each_submodule_at_its_recorded_commit(tmp_path, ups):
    root = stack_root(tmp_path, ups)
    ctx = build(root, tmp_path / "out")
    tree = ctx.context_dir / "src" / "tool"
    assert (tree / "setup.py").read_text() == "print('tool')\n"
    assert (tree / "vendor" / "lib" / "lib.py").read_text() == "VERSION = 1\n"  # not lib's newest commit
    assert (tree / "vendor" / "lib" / "deps" / "leaf" / "leaf.txt").read_text() == "leaf v1\n"
    assert not (tree / "vendor" / "lib" / ".git").exists()
    (info,) = ctx.sources
    assert info.submodules == [
        {"path": "vendor/lib", "url": f"file://{ups.lib.path}", "commit": ups.lib_v1},
        {"path": "vendor/lib/deps/leaf", "url": f"file://{ups.leaf.path}", "commit": ups.leaf_v1},
    ]
    assert info.record()["submodules"] == info.submodules  # what the evidence's inputs.json lists


def test_a_moved_submodule_changes_the_inputs_fingerprint(tmp_path, ups):
    first = build(stack_root(tmp_path / "a", ups), tmp_path / "a" / "out")
    moved = ups.move_lib()
    second = build(stack_root(tmp_path / "b", ups, moved), tmp_path / "b" / "out")
    assert (second.context_dir / "src" / "tool" / "vendor" / "lib" / "lib.py").read_text() == "VERSION = 2\n"
    assert second.sources[0].submodules[0]["commit"] == ups.lib_v2
    assert first.inputs_fingerprint() != second.inputs_fingerprint()
    # The same superproject pin with another submodule commit recorded is another input, too.
    second.sources = [SourceInfo(**{**first.sources[0].record(), "submodules": second.sources[0].submodules})]
    assert second.sources[0].pin == first.sources[0].pin
    assert first.inputs_fingerprint() != second.inputs_fingerprint()


def test_without_submodules_true_the_export_and_its_record_are_as_before(tmp_path, ups):
    root = stack_root(tmp_path, ups)
    loaded = load("subs", root=root)
    assert "submodules" not in loaded.model.upstreams["tool"].model_dump(exclude_none=True)
    assert fingerprint(load("subs", root=root, overrides=["upstreams.tool.submodules=false"]).model) == fingerprint(
        loaded.model
    )
    shutil.move(ups.lib.path, tmp_path / "gone")  # nothing is fetched from the submodule's URL
    ctx = assemble(loaded, tmp_path / "out", workspace=Workspace(lambda: root))
    tree = ctx.context_dir / "src" / "tool"
    assert (tree / "vendor" / "lib").is_dir() and not any((tree / "vendor" / "lib").iterdir())
    (info,) = ctx.sources
    assert info.submodules == [] and "submodules" not in info.record()
    assert info.record() == {
        "name": "tool",
        "kind": "git",
        "pin": ups.v1,
        "commit_time": info.commit_time,
        "series_hash": None,
        "patches": [],
    }


def test_submodules_on_an_sdist_upstream_are_refused_at_the_key(tmp_path, capsys):
    root = make_root(tmp_path)
    shutil.copy(Path(__file__).resolve().parents[2] / "stacks" / "example.yaml", root / "stacks" / "example.yaml")
    rc, _, err = run_cli(capsys, root, "show", "example", "--set", "upstreams.markupsafe.submodules=true")
    assert rc == 2
    assert "upstreams.markupsafe.submodules: a release sdist has no submodules to fetch" in err


@pytest.mark.parametrize(
    ("url", "path", "reason"),
    [
        ("ext::sh -c touch% /tmp/pwned", "vendor/lib", "is an option or a transport helper"),
        ("--upload-pack=touch /tmp/pwned", "vendor/lib", "is an option or a transport helper"),
        ("-uhelper", "vendor/lib", "is an option or a transport helper"),
        ("../../../../../../../../../../../../../x", "vendor/lib", "climbs above"),
        ("LIB", "../../x", "is not a plain path inside the tree"),
        ("LIB", ".git/hooks", "is not a plain path inside the tree"),
        ("LIB", "/etc", "is not a relative path inside the tree"),
    ],
)
def test_a_hostile_gitmodules_is_refused_naming_the_upstream_and_the_path(tmp_path, ups, capsys, url, path, reason):
    marker = Path("/tmp/pwned")
    had = marker.exists()
    gitmodules(ups.tool, {path: url.replace("LIB", f"file://{ups.lib.path}")})
    hostile = commit(ups.tool, "hostile .gitmodules")
    root = stack_root(tmp_path, ups, hostile)
    rc, _, err = run_cli(
        capsys, root, "render", "subs", "--out", str(tmp_path / "out"), "--set", "upstreams.tool.submodules=true"
    )
    assert rc == 2, err
    (e,) = parse_errors(err)
    assert e["file"] == "--set upstreams.tool.submodules=true"  # where submodules: true was set
    assert e["message"].startswith(f"upstreams.tool.submodules: submodule {path}: "), e
    assert reason in e["message"]
    assert "drop submodules: true" in e["fix"]
    assert "Traceback" not in err
    assert marker.exists() == had
    assert not (tmp_path / "out" / "context").exists()  # nothing half-written


def test_a_remote_upstream_may_not_name_a_local_submodule(tmp_path):
    with pytest.raises(UserError) as exc:
        submodules.collect(
            "tool", _repo_with(tmp_path, {"vendor/lib": "/etc/secrets"}), "HEAD", "https://git.example/tool", _never
        )
    assert "is a path on this host, but the upstream is remote" in exc.value.message


def test_a_submodule_commit_its_url_does_not_serve_is_refused(tmp_path, ups, capsys):
    gitlink(ups.tool, "vendor/lib", "1" * 40)
    broken = commit(ups.tool, "a submodule commit nobody published")
    root = stack_root(tmp_path, ups, broken)
    rc, _, err = run_cli(
        capsys, root, "render", "subs", "--out", str(tmp_path / "out"), "--set", "upstreams.tool.submodules=true"
    )
    assert rc == 2
    (e,) = parse_errors(err)
    assert e["message"].startswith(
        f"upstreams.tool.submodules: submodule vendor/lib: its commit {'1' * 40} cannot be fetched from "
        f"file://{ups.lib.path}: "
    )
    assert "pin a commit whose submodule commits are published" in e["fix"]


def test_a_gitlink_without_a_gitmodules_entry_is_refused(tmp_path):
    repo = _repo_with(tmp_path, {})
    gitlink(repo_obj := GitRepo(repo), "vendor/x", "2" * 40)
    commit(repo_obj, "link only")
    with pytest.raises(UserError, match=r"submodule vendor/x: .* \.gitmodules gives no URL for it"):
        submodules.collect("tool", repo, "HEAD", str(repo), _never)


def test_the_mirror_carries_the_submodules_and_an_offline_export_reads_them(tmp_path, ups, monkeypatch):
    root = stack_root(tmp_path, ups)
    loaded = load("subs", root=root, overrides=["upstreams.tool.submodules=true"])
    to, ws = tmp_path / "mirror", Workspace(lambda: root)
    data = manifest.empty("subs", fingerprint(loaded.model))
    make._git(loaded, to, data, ws)
    (part,) = data["parts"]
    assert part["submodules"] == [
        {"path": "vendor/lib", "url": f"file://{ups.lib.path}", "commit": ups.lib_v1},
        {"path": "vendor/lib/deps/leaf", "url": f"file://{ups.leaf.path}", "commit": ups.leaf_v1},
    ]
    manifest.write(to, data)
    for repo in (ups.tool, ups.lib, ups.leaf):  # every upstream is unreachable from here on
        shutil.move(repo.path, tmp_path / "gone" / repo.path.name)
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "empty-cache"))
    tree = tmp_path / "offline" / "src" / "tool"  # the build's export of the upstream, read from the mirror
    info = sources.export_source(loaded, "tool", tree, Workspace(lambda: root, mirror=to))
    assert (tree / "vendor" / "lib" / "deps" / "leaf" / "leaf.txt").read_text() == "leaf v1\n"
    assert info.submodules == part["submodules"]
    before = data["parts"][0]["sha256"]
    make._git(loaded, to, data, ws)  # again, offline: every commit is there, nothing is fetched
    assert data["parts"][0]["sha256"] == before


def test_a_submodule_declared_update_none_is_left_out_as_git_clone_recursive_does(tmp_path):
    repo = GitRepo(_repo_with(tmp_path, {}))
    repo.write(".gitmodules", '[submodule "docs"]\n\tpath = docs\n\turl = https://git.example/docs\n\tupdate = none\n')
    gitlink(repo, "docs", "3" * 40)
    commit(repo, "docs is not fetched")
    assert submodules.collect("tool", repo.path, "HEAD", "https://git.example/tool", _never) == []


@pytest.mark.parametrize(
    ("raw", "base", "want"),
    [
        ("../cutlass.git", "https://git.example/org/tool.git", "https://git.example/org/cutlass.git"),
        ("./sub", "https://git.example/org/tool", "https://git.example/org/tool/sub"),
        ("../../other/x.git", "https://git.example/org/tool", "https://git.example/other/x.git"),
        ("../../../x", "https://git.example/org/tool", None),  # above the host
        ("../x", "git@git.example:org/tool.git", "git@git.example:org/x"),
        ("../x", "file:///srv/git/tool", "file:///srv/git/x"),
        ("../a/../../x", "https://git.example/org/tool", None),
        ("https://elsewhere.example/y.git", "https://git.example/org/tool", "https://elsewhere.example/y.git"),
    ],
)
def test_relative_submodule_urls_resolve_against_the_upstream_as_git_resolves_them(raw, base, want):
    assert submodules.resolve_url(raw, base) == want


def test_a_credential_in_gitmodules_is_not_recorded(tmp_path):
    repo = _repo_with(tmp_path, {"vendor/x": "https://user:s3cret@git.example/x.git"})
    GitRepo(repo).git("update-index", "--add", "--cacheinfo", f"160000,{'4' * 40},vendor/x")
    commit(GitRepo(repo), "with a token")
    seen = []

    def fetch(url: str, commit: str, path: str) -> Path:
        seen.append(url)
        raise UserError("not fetched here")

    with pytest.raises(UserError, match="not fetched here"):
        submodules.collect("tool", repo, "HEAD", "https://git.example/tool", fetch)
    assert seen == ["https://git.example/x.git"]  # dropped: the resolver gives a credential


def _repo_with(tmp_path: Path, entries: dict[str, str]) -> Path:
    repo = GitRepo.init(tmp_path / "super")
    repo.write("setup.py", "a\n")
    if entries:
        gitmodules(repo, entries)
    commit(repo, "super")
    return repo.path


def _never(url: str, commit: str, path: str) -> Path:
    raise AssertionError(f"fetched {url}")
