"""Hostile offline mirrors: a manifest of another shape, a part whose path or link leads out of the mirror, a
tree holding a link out, a file of other bytes. No engine: the manifest cases run ``stackforge build --offline
--mirror`` (the manifest is read before the engine is asked anything); the others call what the offline build
calls (the upstream cache view, the copy of an index's tree, the checked read of a part) on a real directory,
a real sdist and a real git repository.

Every case asserts the one ``error:`` line naming the manifest file (or the mirror's file) and the field, the
fix, and that nothing outside the mirror was read into the build.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from stackforge.builder.mirror import manifest, offline
from stackforge.clients import upstream as sources
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.stack.load import fingerprint, load
from tests.fixtures.gitrepo import build_upstream
from tests.fixtures.stack_support import RootSpec

SDIST = "markupsafe-3.0.3.tar.gz"
REMAKE = "fix: copy the mirror again, or make it again: stackforge mirror STACK --to DIR"


def sdist_bytes(text: str = "original") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = f"# {text}\n".encode()
        info = tarfile.TarInfo("markupsafe-3.0.3/setup.py")
        info.size, info.mtime = len(data), 0
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(parts=("stacks", "patches"))


@pytest.fixture
def mirror(tmp_path, root, monkeypatch):
    """The example stack (its sdist pin moved to a small real sdist) and a mirror holding that sdist and a pypi
    tree: (loaded stack, mirror directory, manifest, a directory outside the mirror)."""
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    data = sdist_bytes()
    sha = hashlib.sha256(data).hexdigest()
    loaded = load("example", root=root, overrides=[f"upstreams.markupsafe.sdist.sha256={sha}"])
    to = tmp_path / "mirror"
    (to / "sdist").mkdir(parents=True)
    (to / "sdist" / SDIST).write_bytes(data)
    files = to / "indexes" / "pypi" / "files"
    files.mkdir(parents=True)
    (files / "idna-3.10-py3-none-any.whl").write_bytes(b"wheel")
    manifest.write_simple(to / "indexes" / "pypi", {})
    doc = manifest.empty("example", fingerprint(loaded.model))
    doc["parts"] += [
        {"kind": "sdist", "path": f"sdist/{SDIST}", "sha256": sha, "size": len(data), "upstream": "markupsafe"},
        {
            "kind": "file",
            "path": "indexes/pypi/files/idna-3.10-py3-none-any.whl",
            "sha256": hashlib.sha256(b"wheel").hexdigest(),
            "index": "pypi",
        },
    ]
    manifest.write(to, doc)
    outside = tmp_path / "outside"
    outside.mkdir()
    return loaded, to, doc, outside


def export_offline(loaded, to: Path, dest: Path) -> Path:
    """What an offline build does for the sdist upstream: the mirror's cache view, then the offline export."""
    view = offline.upstream_cache(loaded, Workspace(lambda: loaded.root, mirror=to))
    up = loaded.model.upstreams["markupsafe"].sdist
    spec = sources.SdistSpec("https://pypi.org/simple", up.name, up.version, up.sha256)
    return sources.export_sdist(spec, view, dest, offline=True)


def test_the_untouched_mirror_is_read(mirror, tmp_path):
    loaded, to, _, _ = mirror
    tree = export_offline(loaded, to, tmp_path / "src")
    assert (tree / "setup.py").read_text() == "# original\n"
    offline._copy_tree(manifest.read(to), to, "pypi", tmp_path / "ctx" / "pypi")
    assert (tmp_path / "ctx/pypi/files/idna-3.10-py3-none-any.whl").read_bytes() == b"wheel"
    assert (tmp_path / "ctx/pypi/simple/idna/index.html").is_file()


# ------------------------------------------------------------------------------------ sha256


def test_a_tampered_sdist_is_a_sha256_mismatch_naming_the_file_and_both_digests(mirror, tmp_path):
    loaded, to, doc, _ = mirror
    (to / "sdist" / SDIST).unlink()
    (to / "sdist" / SDIST).write_bytes(sdist_bytes("tampered"))
    found = hashlib.sha256(sdist_bytes("tampered")).hexdigest()
    with pytest.raises(UserError) as exc:
        export_offline(loaded, to, tmp_path / "src")
    want = manifest.part(doc, f"sdist/{SDIST}")["sha256"]
    assert exc.value.render().splitlines()[0] == (
        f"error: --mirror: sha256 mismatch: sdist/{SDIST} in the mirror has sha256 {found}, "
        f"but mirror.json records {want}"
    )
    assert "not cached" not in exc.value.message and exc.value.exit_code == 2
    assert exc.value.render().splitlines()[1].startswith(f"  {REMAKE}")
    assert not (tmp_path / "src").exists()


def test_a_tampered_index_file_is_a_sha256_mismatch(mirror, tmp_path):
    loaded, to, doc, _ = mirror
    wheel = to / "indexes/pypi/files/idna-3.10-py3-none-any.whl"
    wheel.write_bytes(b"other")
    with pytest.raises(UserError) as exc:
        offline._copy_tree(manifest.read(to), to, "pypi", tmp_path / "ctx" / "pypi")
    assert exc.value.message == (
        "sha256 mismatch: indexes/pypi/files/idna-3.10-py3-none-any.whl in the mirror has sha256 "
        f"{hashlib.sha256(b'other').hexdigest()}, but mirror.json records {hashlib.sha256(b'wheel').hexdigest()}"
    )


# ------------------------------------------------------------------------------------ confinement


def sdist_linked_out(to: Path, outside: Path, doc: dict) -> None:
    """The sdist replaced by a link to a file of the same bytes outside the mirror."""
    shutil.move(to / "sdist" / SDIST, outside / SDIST)
    (to / "sdist" / SDIST).symlink_to(outside / SDIST)


def sdist_dir_linked_out(to: Path, outside: Path, doc: dict) -> None:
    shutil.move(to / "sdist" / SDIST, outside / SDIST)
    (to / "sdist").rmdir()
    (to / "sdist").symlink_to(outside)


@pytest.mark.parametrize("link", [sdist_linked_out, sdist_dir_linked_out], ids=["file-link", "directory-link"])
def test_an_sdist_linked_out_of_the_mirror_is_refused(mirror, tmp_path, link):
    loaded, to, doc, outside = mirror
    link(to, outside, doc)
    with pytest.raises(UserError) as exc:
        export_offline(loaded, to, tmp_path / "src")
    assert exc.value.message == (
        f"sdist/{SDIST} in the mirror resolves (through a symlink) to {outside / SDIST}, "
        f"outside the mirror {to.resolve()}"
    )
    assert exc.value.file == "--mirror" and exc.value.fix.startswith(REMAKE[len("fix: ") :])
    assert not (tmp_path / "src").exists()


def test_a_link_out_named_to_forge_a_line_is_shown_escaped(mirror, tmp_path):
    loaded, to, _, outside = mirror
    target = outside / "x\nerror: forged"
    target.write_bytes((to / "sdist" / SDIST).read_bytes())
    (to / "sdist" / SDIST).unlink()
    (to / "sdist" / SDIST).symlink_to(target)
    with pytest.raises(UserError) as exc:
        export_offline(loaded, to, tmp_path / "src")
    assert "\n" not in exc.value.message and "x\\nerror: forged" in exc.value.message


def test_a_manifest_linked_out_of_the_mirror_is_refused(mirror):
    loaded, to, _, outside = mirror
    shutil.move(to / "mirror.json", outside / "mirror.json")
    (to / "mirror.json").symlink_to(outside / "mirror.json")
    with pytest.raises(UserError) as exc:
        manifest.read(to)
    assert exc.value.message.startswith(f"mirror.json in the mirror resolves (through a symlink) to {outside}")


def page_linked_out(simple: Path, outside: Path) -> None:
    (outside / "secret.html").write_text("outside\n")
    (simple / "idna" / "index.html").unlink()
    (simple / "idna" / "index.html").symlink_to(outside / "secret.html")


def project_dir_linked_out(simple: Path, outside: Path) -> None:
    (outside / "index.html").write_text("outside\n")
    shutil.rmtree(simple / "idna")
    (simple / "idna").symlink_to(outside)


def project_dir_linked_inside(simple: Path, outside: Path) -> None:
    """A directory link that stays inside the mirror: a copy would follow it (a loop here), so it is refused."""
    (simple / "loop").symlink_to(simple)


@pytest.mark.parametrize(
    "link, message",
    [
        (page_linked_out, "indexes/pypi/simple/idna/index.html in the mirror resolves (through a symlink) to "),
        (project_dir_linked_out, "indexes/pypi/simple/idna in the mirror resolves (through a symlink) to "),
        (project_dir_linked_inside, "indexes/pypi/simple/loop in the mirror is a link to a directory"),
    ],
    ids=["page-link", "project-directory-link", "directory-link-loop"],
)
def test_an_index_tree_with_a_link_out_is_not_copied_into_the_build(mirror, tmp_path, link, message):
    loaded, to, _, outside = mirror
    link(to / "indexes/pypi/simple", outside)
    dest = tmp_path / "ctx" / "pypi"
    with pytest.raises(UserError) as exc:
        offline._copy_tree(manifest.read(to), to, "pypi", dest)
    assert exc.value.message.startswith(message), exc.value.message
    assert exc.value.file == "--mirror" and exc.value.fix
    assert not (dest / "simple").exists()  # nothing of the tree (or of what it links to) was copied


def test_a_base_archive_linked_out_is_refused_before_it_is_loaded(mirror):
    _, to, _, outside = mirror
    (outside / "image.tar").write_bytes(b"archive")
    (to / "base").mkdir()
    (to / "base" / "image.tar").symlink_to(outside / "image.tar")
    rec = {"kind": "base", "path": "base/image.tar", "sha256": hashlib.sha256(b"archive").hexdigest()}
    with pytest.raises(UserError) as exc:
        manifest.checked(to, rec, "base/image.tar")
    assert exc.value.message.startswith("base/image.tar in the mirror resolves (through a symlink) to ")


@pytest.fixture
def git_mirror(tmp_path, root, monkeypatch):
    """The example stack with its upstream as a git repository, and a mirror holding that repository."""
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    up = build_upstream(tmp_path / "upstream")
    commit = up.git("rev-parse", "v1.0^{commit}").strip()
    overrides = [
        "upstreams.markupsafe.sdist=null",
        f"upstreams.markupsafe.git={up.path}",
        "upstreams.markupsafe.tag=v1.0",
        f"upstreams.markupsafe.commit={commit}",
    ]
    loaded = load("example", root=root, overrides=overrides)
    to = tmp_path / "mirror"
    (to / "git").mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", "--bare", str(up.path), str(to / "git" / "markupsafe.git")], check=True)
    manifest.write(to, manifest.empty("example", fingerprint(loaded.model)))
    return loaded, to, tmp_path / "outside"


def test_the_untouched_git_mirror_is_read(git_mirror):
    loaded, to, _ = git_mirror
    view = offline.upstream_cache(loaded, Workspace(lambda: loaded.root, mirror=to))
    up = loaded.model.upstreams["markupsafe"]
    spec = sources.UpstreamSpec(git=up.git, tag=up.tag, commit=up.commit, name="markupsafe")
    assert sources.fetch_upstream(spec, view, root=loaded.root, offline=True).is_dir()


def repo_linked_out(repo: Path, outside: Path) -> str:
    shutil.move(repo, outside)
    repo.symlink_to(outside)
    return f"git/markupsafe.git in the mirror resolves (through a symlink) to {outside}"


def ref_linked_out(repo: Path, outside: Path) -> str:
    outside.mkdir()
    (outside / "packed-refs").write_text((repo / "packed-refs").read_text())
    (repo / "packed-refs").unlink()
    (repo / "packed-refs").symlink_to(outside / "packed-refs")
    return "git/markupsafe.git/packed-refs in the mirror resolves (through a symlink) to "


def alternates(repo: Path, outside: Path) -> str:
    (repo / "objects" / "info").mkdir(parents=True, exist_ok=True)
    (repo / "objects" / "info" / "alternates").write_text(f"{outside}/objects\n")
    return "git/markupsafe.git in the mirror borrows objects from elsewhere (objects/info/alternates)"


@pytest.mark.parametrize("escape", [repo_linked_out, ref_linked_out, alternates], ids=lambda f: f.__name__)
def test_a_git_mirror_reaching_out_of_the_mirror_is_refused(git_mirror, escape):
    loaded, to, outside = git_mirror
    message = escape(to / "git" / "markupsafe.git", outside)
    with pytest.raises(UserError) as exc:
        offline.upstream_cache(loaded, Workspace(lambda: loaded.root, mirror=to))
    assert exc.value.message.startswith(message), exc.value.message
    assert exc.value.file == "--mirror"


@pytest.mark.parametrize("where", ["sdist", "indexes/pypi/files"])
def test_mirror_writes_nothing_through_a_link_out_of_the_mirror(root, tmp_path, where):
    to, outside = tmp_path / "mirror", tmp_path / "outside"
    outside.mkdir()
    (to / where).parent.mkdir(parents=True)
    (to / where).symlink_to(outside)
    proc = stackforge(root, "mirror", "example", "--to", str(to))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: --to: {where} in the mirror resolves (through a symlink) to {outside}, outside the mirror {to}",
        "  fix: remove the link, or choose another --to directory; a mirror holds its files, no link out of it",
    ]
    assert list(outside.iterdir()) == [] and not (to / "mirror.json").exists()


# ------------------------------------------------------------------------------------ manifest shapes

HEX = "a" * 64


def edit_part(**fields):
    def edit(doc: dict) -> None:
        doc["parts"][0].update(fields)
        for k, v in fields.items():
            if v is ...:
                del doc["parts"][0][k]

    return edit


def setter(key: str, value):
    def edit(doc: dict) -> None:
        doc[key] = value

    return edit


# (id, edit of the manifest, the field and what it holds, what it should be)
SHAPE_CASES = [
    ("part-without-path", edit_part(path=...), "parts[0].path is null", "a relative path inside the mirror"),
    ("part-not-an-object", setter("parts", ["sdist/x.tar.gz"]), 'parts[0] is "sdist/x.tar.gz"', "an object"),
    ("part-path-dotdot", edit_part(path="../outside/x.tar.gz"), 'parts[0].path is "../outside/x.tar.gz"', "no '..'"),
    ("part-path-absolute", edit_part(path="/etc/passwd"), 'parts[0].path is "/etc/passwd"', "a relative path"),
    ("part-sha256-number", edit_part(sha256=123), "parts[0].sha256 is 123", "a sha256 (64 lowercase hex"),
    ("part-kind-unknown", edit_part(kind="script"), 'parts[0].kind is "script"', "one of git, sdist"),
    ("part-size-text", edit_part(size="big"), 'parts[0].size is "big"', "a number of bytes"),
    ("part-image-list", edit_part(image=["x"]), 'parts[0].image is ["x"]', "a string"),
    ("base-without-id", edit_part(kind="base", path="base/image.tar", image="i"), "parts[0].id is null", "a string"),
    ("phases-list", setter("phases", []), "phases is []", "an object"),
    ("phase-without-key", setter("phases", {"pypi": {"files": []}}), "phases.pypi.key is null", "a string"),
    ("phase-without-files", setter("phases", {"pypi": {"key": "k"}}), "phases.pypi.files is null", "file names"),
    ("phase-file-path", setter("phases", {"pypi": {"key": "k", "files": ["../x"]}}), "phases.pypi.files", "names"),
    ("apt-files-path", setter("apt", {"key": "k", "files": ["a/../../b"]}), "apt.files is", "a list of file names"),
    ("toolchain-not-object", setter("toolchains", {"k": "x"}), 'toolchains.k is "x"', "an object"),
    ("toolchain-id-number", setter("toolchains", {"k": {"key": "k", "image": "i", "id": 1}}), "toolchains.k.id", ""),
    ("phase-name-newline", setter("phases", {"p\nerror: forged": 1}), "phases.p\\nerror: forged is 1", "an object"),
    ("path-newline", edit_part(path="sdist/x\nerror: forged"), 'parts[0].path is "sdist/x\\nerror: forged"', "a rel"),
    ("stack-number", setter("stack", 5), "stack is 5", "a string"),
    ("fingerprint-missing", setter("fingerprint", None), "fingerprint is null", "a string"),
]


def stackforge(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, STACKFORGE_CACHE=str(root / "cache")),
    )


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_a_manifest_of_another_shape_is_refused_naming_the_file_and_field(root, tmp_path, case):
    _, edit, field, want = case
    to = tmp_path / "mirror"
    to.mkdir()
    doc = manifest.empty("example", "sha256:" + HEX)
    doc["parts"].append({"kind": "sdist", "path": "sdist/x.tar.gz", "sha256": HEX, "size": 1})
    edit(doc)
    (to / "mirror.json").write_text(json.dumps(doc))
    proc = stackforge(root, "build", "example", "--offline", "--mirror", str(to), "--set", "tags.local=sf-test/m:x")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    head, fix = proc.stderr.splitlines()  # one error line and its fix: nothing in the manifest forges a line
    assert head.startswith(f"error: {to / 'mirror.json'}: {field}"), proc.stderr
    assert want in head and fix.startswith(f"  {REMAKE}")
    assert not (root / "build").exists() and not (root / "cache").exists()
