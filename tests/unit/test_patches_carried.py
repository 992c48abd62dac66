"""The patch verbs apply a series another upstream carries (``upstreams.<name>.patches_from``) first, as the
build does: the repository's own series is checked, applied and exported on top of it.

post2 declares the plugin's series (vllm_musa/patches/series, file-name order) under the stand-in
repositories of tests/fixtures/musa_standins.py. The repository's own patches/vllm here holds one patch
made on top of the carried one: it changes the file the carried patch adds, so it applies only when the
carried series went first.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stackforge.stack.load import load_stack
from tests.fixtures import musa_standins as ms
from tests.fixtures.stack_support import RootSpec, run_cli

REPO = Path(__file__).resolve().parents[2]
OWN = "0001-Platform-Name-the-series-release.patch"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return ms.make_upstreams(tmp_path_factory.mktemp("carried-upstreams"), load_stack("post2", root=REPO))


def own_patch(vllm: ms.UpstreamRepo, work: Path) -> str:
    """A patch made on vLLM with the plugin's series applied: it edits the file that series adds."""
    clone = work / "own"
    subprocess.run(["git", "clone", "-q", str(vllm.path), str(clone)], check=True, capture_output=True)
    ms._git(clone, "checkout", "-q", vllm.commit)
    carried = (work / "carried.patch").resolve()
    carried.write_text(ms._series_from(vllm, work, "carried", {ms.SERIES_MARKER: ms.SERIES_MARKER_TEXT}, {}))
    ms._git(clone, "am", "-q", str(carried))
    (clone / ms.SERIES_MARKER).write_text(ms.SERIES_MARKER_TEXT + 'RELEASE = "post2"\n')
    ms._git(clone, "commit", "-q", "-am", "[Platform] Name the series release")
    return ms._git(clone, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index") + "\n"


@pytest.fixture
def root_spec(tmp_path, repos) -> RootSpec:
    return RootSpec(
        parts=("patches",),
        files={f"patches/vllm/{OWN}": own_patch(repos["vllm"], tmp_path), "patches/vllm/series": f"{OWN}\n"},
        env={"STACKFORGE_CACHE": str(tmp_path / "cache")},
    )


def sets(repos, *extra: str) -> list[str]:
    return [a for v in (*ms.upstream_overrides(repos), *extra) for a in ("--set", v)]


def test_check_applies_the_carried_series_first(capsys, root, repos):
    rc, out, err = run_cli(capsys, root, "patches", "check", "post2", "--upstream", "vllm", *sets(repos))
    assert rc == 0, out + err
    assert OWN in out and "clean" in out
    assert ms.PLUGIN_PATCH not in out  # the carried series is the base, not one of the repository's patches


def test_without_the_carried_series_the_own_patch_does_not_apply(capsys, root, repos):
    rc, out, err = run_cli(
        capsys,
        root,
        "patches",
        "check",
        "post2",
        "--upstream",
        "vllm",
        *sets(repos, "upstreams.vllm.patches_from=null"),
    )
    assert rc == 1, out + err
    assert OWN in out + err


def test_apply_then_export_check_writes_only_the_own_series(capsys, root, repos, tmp_path):
    work = tmp_path / "work"
    rc, out, err = run_cli(
        capsys, root, "patches", "apply", "post2", "--upstream", "vllm", "--to", str(work), *sets(repos)
    )
    assert rc == 0, out + err
    assert (work / ms.SERIES_MARKER).read_text().endswith('RELEASE = "post2"\n')
    rc, out, err = run_cli(
        capsys, root, "patches", "export", "post2", "--upstream", "vllm", "--from", str(work), *sets(repos)
    )
    assert rc == 0, out + err
    series = root / "patches" / "vllm"
    assert sorted(p.name for p in series.iterdir() if p.suffix == ".patch") == [OWN]
    exported = (series / OWN).read_text()
    assert f"+++ b/{ms.SERIES_MARKER}" in exported and "new file mode" not in exported  # an edit, on top
    # A fresh apply (carried series, then ours) and export now writes nothing.
    rc, out, err = run_cli(capsys, root, "patches", "export", "post2", "--upstream", "vllm", "--check", *sets(repos))
    assert rc == 0, out + err


def test_a_carrier_without_the_series_directory_names_the_key(capsys, root, repos):
    rc, out, err = run_cli(
        capsys,
        root,
        "patches",
        "check",
        "post2",
        "--upstream",
        "vllm",
        *sets(repos, "upstreams.vllm.patches_from.path=vllm_musa/patches/series-0.29"),
    )
    assert rc == 2, out + err
    assert "upstreams.vllm.patches_from.path: vllm_musa/patches/series-0.29 does not exist in vllm_musa" in err
