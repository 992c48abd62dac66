"""Upstream fetch and export: a bare mirror checked against the pinned tag, and a release sdist
from a real (local) PEP 503 index checked against its sha256."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from stackforge.clients import upstream as up
from stackforge.errors import UserError
from tests.fixtures.gitrepo import build_upstream
from tests.fixtures.index_server import IndexServer


@pytest.fixture
def repo(tmp_path):
    return build_upstream(tmp_path / "upstream")


def spec_for(repo, commit=None, tag="v1.0"):
    return up.UpstreamSpec(git=str(repo.path), tag=tag, commit=commit or repo.git("rev-parse", "v1.0^{commit}").strip())


def test_fetch_creates_a_mirror_and_verifies_an_annotated_tag(repo, tmp_path):
    cache = tmp_path / "cache"
    spec = spec_for(repo)
    mirror = up.fetch_upstream(spec, cache)
    assert mirror == up.mirror_path(str(repo.path.resolve()), cache)
    assert mirror.is_dir() and (mirror / "HEAD").is_file()
    assert repo.git("cat-file", "-t", "v1.0").strip() == "tag"  # annotated: peeled to the commit
    assert up.peeled_tag(mirror, "v1.0") == spec.commit
    assert up.commit_time(mirror, spec.commit) == int(repo.git("log", "-1", "--format=%ct", spec.commit))


def test_lightweight_tag_and_file_url(repo, tmp_path):
    commit = repo.head()
    repo.tag("light", annotated=False)
    spec = up.UpstreamSpec(git=f"file://{repo.path}", tag="light", commit=commit)
    mirror = up.fetch_upstream(spec, tmp_path / "cache")
    assert up.peeled_tag(mirror, "light") == commit


def test_tag_pointing_elsewhere_names_tag_expected_and_actual(repo, tmp_path):
    first = repo.git("rev-list", "--max-parents=0", "HEAD").strip()
    tagged = repo.git("rev-parse", "v1.0^{commit}").strip()
    with pytest.raises(UserError) as exc:
        up.fetch_upstream(spec_for(repo, commit=first), tmp_path / "cache")
    msg = exc.value.message
    assert "v1.0" in msg and first in msg and tagged in msg
    assert tagged in exc.value.fix


def test_unknown_commit_and_unknown_tag(repo, tmp_path):
    with pytest.raises(UserError) as exc:
        up.fetch_upstream(spec_for(repo, commit="1" * 40), tmp_path / "cache")
    assert "1" * 40 in exc.value.message and "not in" in exc.value.message
    with pytest.raises(UserError) as exc:
        up.fetch_upstream(spec_for(repo, tag="v9.9"), tmp_path / "cache")
    assert "v9.9" in exc.value.message and "does not exist" in exc.value.message


def test_second_fetch_updates_the_same_mirror(repo, tmp_path):
    cache = tmp_path / "cache"
    m1 = up.fetch_upstream(spec_for(repo), cache)
    repo.write("NEWS", "v1.1\n")
    new = repo.commit("News")
    repo.tag("v1.1")
    m2 = up.fetch_upstream(spec_for(repo, commit=new, tag="v1.1"), cache)
    assert m1 == m2 and up.peeled_tag(m2, "v1.1") == new
    assert len(list((cache / "git").iterdir())) == 1


def test_offline_uses_only_the_cache(repo, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as exc:
        up.fetch_upstream(spec_for(repo), cache, offline=True)
    assert "offline" in exc.value.message
    up.fetch_upstream(spec_for(repo), cache)
    assert up.fetch_upstream(spec_for(repo), cache, offline=True).is_dir()


def test_unreachable_upstream_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as exc:
        up.fetch_upstream(up.UpstreamSpec(git=str(tmp_path / "nope"), tag="v1", commit="a" * 40), tmp_path / "cache")
    assert "does not exist" in exc.value.message


def test_export_writes_exactly_the_pinned_tree(repo, tmp_path):
    spec = spec_for(repo)
    dest = up.export_upstream(spec, tmp_path / "cache", tmp_path / "tree")
    assert not (dest / ".git").exists()
    listed = sorted(repo.git("ls-tree", "-r", "--name-only", spec.commit).split())
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == listed
    for rel in listed:
        assert (dest / rel).read_bytes() == subprocess.run(
            ["git", "-C", str(repo.path), "show", f"{spec.commit}:{rel}"], capture_output=True, check=True
        ).stdout
    with pytest.raises(UserError):
        up.export_upstream(spec, tmp_path / "cache", dest)


# --- release sdists ------------------------------------------------------------------------


def make_sdist(directory: Path, name="demo_pkg", version="1.2.0", extra: dict[str, bytes] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        "setup.py": b"from setuptools import setup\nsetup()\n",
        f"src/{name}/__init__.py": b"VALUE = 1\n",
    }
    files.update(extra or {})
    out = directory / f"{name}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        for rel, data in files.items():
            info = tarfile.TarInfo(rel if rel.startswith("../") else f"{name}-{version}/{rel}")
            info.size = len(data)
            info.mtime = 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return out


def test_sdist_found_on_a_simple_index_checked_unpacked_and_cached(tmp_path):
    sd = make_sdist(tmp_path / "index")
    make_sdist(tmp_path / "index", version="1.3.0")
    digest = hashlib.sha256(sd.read_bytes()).hexdigest()
    with IndexServer(tmp_path / "index") as index:
        spec = up.SdistSpec(index.url, "Demo.Pkg", "1.2.0", digest)
        dest = up.export_sdist(spec, tmp_path / "cache", tmp_path / "tree")
        assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
            "PKG-INFO",
            "setup.py",
            "src/demo_pkg/__init__.py",
        ]
        assert (dest / "PKG-INFO").read_text().endswith("Version: 1.2.0\n")
        files_asked = [r for r in index.requests if r.path.startswith("/files/")]
        assert len(files_asked) == 1
        # Cached by its hash: the second export does not download again.
        up.export_upstream(up.UpstreamSpec(sdist=spec), tmp_path / "cache", tmp_path / "tree2")
        assert len([r for r in index.requests if r.path.startswith("/files/")]) == 1
    assert up.export_sdist(spec, tmp_path / "cache", tmp_path / "tree3", offline=True).is_dir()


def test_sdist_hash_mismatch_names_expected_and_actual(tmp_path):
    sd = make_sdist(tmp_path / "index")
    actual = hashlib.sha256(sd.read_bytes()).hexdigest()
    wrong = "0" * 64
    with IndexServer(tmp_path / "index") as index:
        with pytest.raises(UserError) as exc:
            up.export_sdist(up.SdistSpec(index.url, "demo_pkg", "1.2.0", wrong), tmp_path / "cache", tmp_path / "tree")
        assert wrong in exc.value.message and actual in exc.value.message
        with pytest.raises(UserError) as exc:
            up.export_sdist(up.SdistSpec(index.url, "demo_pkg", "9.9.9", actual), tmp_path / "cache", tmp_path / "t2")
        assert "demo_pkg-9.9.9.tar.gz" in exc.value.message
    assert not (tmp_path / "tree").exists() or not any((tmp_path / "tree").iterdir())


def test_sdist_with_an_escaping_member_is_refused(tmp_path):
    sd = make_sdist(tmp_path / "index", extra={"../evil.txt": b"x"})
    with pytest.raises(UserError) as exc:
        up.unpack_sdist(sd, tmp_path / "tree")
    assert "evil" in exc.value.message
    assert not (tmp_path / "evil.txt").exists()


def test_sdist_from_a_file_index(tmp_path):
    sd = make_sdist(tmp_path / "files")
    page = tmp_path / "simple" / "demo-pkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="file://{sd}#sha256=x">{sd.name}</a>')
    spec = up.SdistSpec(
        f"file://{tmp_path / 'simple'}", "demo-pkg", "1.2.0", hashlib.sha256(sd.read_bytes()).hexdigest()
    )
    assert (up.export_sdist(spec, tmp_path / "cache", tmp_path / "tree") / "setup.py").is_file()
