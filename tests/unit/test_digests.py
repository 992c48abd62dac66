"""The one tree digest and the one code fingerprint (stackforge/digests.py): each change a check relies on
changes the digest, and what it leaves out does not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stackforge import digests
from stackforge.digests import code_fingerprint, tree_digest


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "tree"
    (top / "pkg" / "__pycache__").mkdir(parents=True)
    (top / "pkg" / "mod.py").write_text("X = 1\n")
    (top / "pkg" / "__pycache__" / "mod.cpython.pyc").write_bytes(b"\0compiled")
    (top / "run.sh").write_text("echo hi\n")
    (top / "run.sh").chmod(0o644)
    (top / "empty").mkdir()
    (top / "link").symlink_to("pkg/mod.py")
    return top


def test_the_same_tree_has_the_same_digest(tree, tmp_path):
    first = tree_digest(tree)
    assert first.startswith("sha256:") and tree_digest(tree) == first
    os.utime(tree / "run.sh", ns=(1, 1))  # times are not content
    assert tree_digest(tree) == first


def test_a_byte_changes_the_digest(tree):
    before = tree_digest(tree)
    (tree / "pkg" / "mod.py").write_text("X = 2\n")
    assert tree_digest(tree) != before


def test_a_mode_change_changes_the_digest(tree):
    before = tree_digest(tree)
    (tree / "run.sh").chmod(0o755)
    assert tree_digest(tree) != before


def test_a_symlink_target_change_changes_the_digest(tree):
    before = tree_digest(tree)
    (tree / "link").unlink()
    (tree / "link").symlink_to("run.sh")
    assert tree_digest(tree) != before


def test_a_renamed_file_changes_the_digest(tree):
    before = tree_digest(tree)
    (tree / "run.sh").rename(tree / "start.sh")
    assert tree_digest(tree) != before


def test_an_empty_directory_is_part_of_the_tree(tree):
    before = tree_digest(tree)
    (tree / "empty").rmdir()
    assert tree_digest(tree) != before


def test_a_file_under_a_skipped_directory_is_left_out(tree):
    before = tree_digest(tree, skip=("__pycache__",))
    (tree / "pkg" / "__pycache__" / "mod.cpython.pyc").write_bytes(b"\0recompiled")
    (tree / "pkg" / "__pycache__" / "other.pyc").write_bytes(b"\0new")
    assert tree_digest(tree, skip=("__pycache__",)) == before
    assert tree_digest(tree) != tree_digest(tree, skip=("__pycache__",))  # not skipped unless asked


def test_following_links_hashes_what_they_point_to(tree, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("one\n")
    (tree / "out").symlink_to(outside)
    plain, followed = tree_digest(tree), tree_digest(tree, follow_links=True)
    outside.write_text("two\n")
    assert tree_digest(tree) == plain  # a link is its target's name
    assert tree_digest(tree, follow_links=True) != followed  # followed: the bytes behind it


def test_following_a_link_that_leads_back_up_ends(tree):
    (tree / "pkg" / "up").symlink_to("..")
    (tree / "dangling").symlink_to("nowhere")
    (tree / "a").mkdir()
    (tree / "b").mkdir()
    (tree / "a" / "to_b").symlink_to("../b")  # a cycle through two links
    (tree / "b" / "to_a").symlink_to("../a")
    first = tree_digest(tree, follow_links=True)
    assert tree_digest(tree, follow_links=True) == first
    (tree / "b" / "to_a").unlink()
    (tree / "b" / "to_a").symlink_to("../pkg")
    assert tree_digest(tree, follow_links=True) != first


def test_the_code_fingerprint_sees_a_module_touched(tmp_path, monkeypatch):
    pkg = tmp_path / "stackforge"
    (pkg / "builder").mkdir(parents=True)
    (pkg / "builder" / "reuse.py").write_text("A = 1\n")
    (pkg / "cli.py").write_text("B = 1\n")
    monkeypatch.setattr(digests, "PACKAGE", pkg)
    whole, narrow = code_fingerprint(), code_fingerprint(within=("builder",))
    assert whole != narrow
    st = (pkg / "cli.py").stat()
    os.utime(pkg / "cli.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert code_fingerprint() != whole
    assert code_fingerprint(within=("builder",)) == narrow  # outside the narrower set
    (pkg / "builder" / "reuse.py").write_text("A = 22\n")
    assert code_fingerprint(within=("builder",)) != narrow


def test_the_code_fingerprint_names_its_libraries():
    assert code_fingerprint(("json",)) != code_fingerprint()
    assert code_fingerprint(("no_such_library_here",)) != code_fingerprint()
