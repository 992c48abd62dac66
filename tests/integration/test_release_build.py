"""The release's build, as .github/workflows/release.yml runs it (`python -m build`: the sdist, then the wheel built
from the sdist): both record the commit they were built from, and a tree without git says so instead of guessing."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNBUILT = (".venv", "build", "dist", "__pycache__", "*.egg-info")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commit(text: str) -> str:
    (assign,) = [n for n in ast.parse(text).body if isinstance(n, ast.Assign)]
    assert isinstance(assign.value, ast.Constant)
    return assign.value.value


def _build(source: Path, out: Path, *only: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "build", *only, "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_sdist_and_the_wheel_built_from_it_record_the_commit(tmp_path):
    from stackforge import buildinfo

    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*UNBUILT))
    _build(source, tmp_path / "dist")
    (sdist,) = (tmp_path / "dist").glob("stackforge-*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("stackforge-*.whl")
    dirty = "-dirty" if _git("status", "--porcelain", "--", *buildinfo.BUILD_PATHS) else ""
    want = _git("rev-parse", "HEAD") + dirty
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(f"{sdist.name[: -len('.tar.gz')]}/tools/stackforge/_build_info.py")
        assert member is not None
        assert _commit(member.read().decode()) == want
    with zipfile.ZipFile(wheel) as whl:
        assert _commit(whl.read("stackforge/_build_info.py").decode()) == want
        assert not [n for n in whl.namelist() if n.startswith(("tests/", "setup.py"))]
    assert not (source / "tools" / "stackforge" / "_build_info.py").exists()  # written into the build only


def test_a_tree_without_git_builds_a_wheel_that_says_unknown(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(".git", *UNBUILT))
    _build(source, tmp_path / "dist", "--wheel")
    (wheel,) = (tmp_path / "dist").glob("stackforge-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        assert _commit(whl.read("stackforge/_build_info.py").decode()) == "unknown"
