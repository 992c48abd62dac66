"""`stackforge wheel inspect|diff` on wheels with real ELF shared objects compiled by gcc."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile

import pytest

from stackforge.cli.main import main
from stackforge.freshness.wheel import diff_wheels, inspect_wheel
from tests.fixtures.index_server import IndexServer
from tests.fixtures.musa_index import DEEP_EP_FILES, DEEP_EP_NEEDED, DEEP_EP_SO
from tests.fixtures.wheels import SharedLib, build_wheel

TAGS = {"python_tag": "cp310", "abi_tag": "cp310", "platform_tag": "linux_x86_64"}


def readelf_dynamic(data: bytes, tmp_path) -> dict[str, list[str]]:
    """Ground truth from binutils, to check that pyelftools reads what readelf reads."""
    so = tmp_path / "probe.so"
    so.write_bytes(data)
    out = subprocess.run(["readelf", "-d", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    for kind, value in re.findall(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+\S+.*?\[(.*)\]", out):
        found.setdefault(kind, []).append(value)
    return found


@pytest.fixture(scope="module")
def deep_ep(tmp_path_factory):
    if not shutil.which("gcc") or not shutil.which("readelf"):
        pytest.fail("gcc and readelf (binutils) are needed: apt-get install gcc binutils", pytrace=False)
    d = tmp_path_factory.mktemp("deep_ep")
    out = {}
    for which in ("post1", "post2"):
        out[which] = build_wheel(
            d,
            "deep_ep",
            f"1.1.0+musa5.2.0torch2.11.0.{which}",
            files=DEEP_EP_FILES,
            shared_libs=[SharedLib(DEEP_EP_SO, needed=DEEP_EP_NEEDED[which], runpath="$ORIGIN/../torch/lib")],
            **TAGS,
        )
    return out


def test_inspect_reads_soname_needed_and_paths_like_readelf(tmp_path):
    whl = build_wheel(
        tmp_path,
        "torch_musa",
        "2.11.0.post2+musa5.2.0",
        files={"torch_musa/__init__.py": ""},
        shared_libs=[
            SharedLib(
                "torch_musa/lib/libmusa_kernels.so",
                needed=["libmusart.so.5", "libc.so.6"],
                soname="libmusa_kernels.so",
                runpath="$ORIGIN:/usr/local/musa/lib",
            ),
            SharedLib(
                "torch_musa/lib/libmusa_python.so.2",
                needed=["libmusa_kernels.so"],
                soname="libmusa_python.so.2",
                rpath="$ORIGIN",
            ),
        ],
        requires_dist=["torch==2.11.0.post2+musa5.2.0"],
        **TAGS,
    )
    info = inspect_wheel(whl)
    assert info.warnings == []  # compiled, but it does declare Requires-Dist
    by_path = {s.path: s for s in info.shared_objects}
    assert set(by_path) == {"torch_musa/lib/libmusa_kernels.so", "torch_musa/lib/libmusa_python.so.2"}
    with zipfile.ZipFile(whl) as zf:
        for path, so in by_path.items():
            truth = readelf_dynamic(zf.read(path), tmp_path)
            assert so.needed == truth["NEEDED"]
            assert [so.soname] == truth["SONAME"]
            assert ":".join(so.runpath) == ":".join(truth.get("RUNPATH", []))
            assert ":".join(so.rpath) == ":".join(truth.get("RPATH", []))
            assert so.elf_type == "ET_DYN" and so.machine == "EM_X86_64" and so.elf_class == 64
    assert by_path["torch_musa/lib/libmusa_kernels.so"].runpath == ["$ORIGIN", "/usr/local/musa/lib"]
    assert by_path["torch_musa/lib/libmusa_python.so.2"].rpath == ["$ORIGIN"]


def test_inspect_cli_text_and_json(deep_ep, capsys):
    assert main(["wheel", "inspect", str(deep_ep["post2"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("WARNING: compiled wheel declares NO Requires-Dist")
    assert "Requires-Dist (none declared)" in out
    assert f"  {DEEP_EP_SO}  [ET_DYN, EM_X86_64, ELF64]" in out
    assert "    NEEDED   " + ", ".join(DEEP_EP_NEEDED["post2"]) in out
    assert "    RUNPATH  $ORIGIN/../torch/lib" in out
    assert "all entries match the content" in out

    assert main(["wheel", "inspect", "--json", str(deep_ep["post1"])]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert "NO Requires-Dist" in captured.err
    assert data["version"] == "1.1.0+musa5.2.0torch2.11.0.post1"
    assert data["tags"] == ["cp310-cp310-linux_x86_64"]
    assert data["requires_dist"] == [] and data["compiled"] is True
    (so,) = data["shared_objects"]
    assert so["needed"] == DEEP_EP_NEEDED["post1"]
    assert {r["path"] for r in data["record"]} >= set(DEEP_EP_FILES) | {DEEP_EP_SO}


def test_diff_finds_only_the_so_and_its_needed_changes(deep_ep, capsys):
    d = diff_wheels(inspect_wheel(deep_ep["post1"]), inspect_wheel(deep_ep["post2"]))
    assert d.added == [] and d.removed == []
    # The Python sources are byte-identical; the .so differs, and METADATA carries the new version.
    assert d.changed == [DEEP_EP_SO, "{dist-info}/METADATA"]
    (change,) = d.needed
    assert change.path == DEEP_EP_SO
    assert change.gained == ["libmusa_kernels.so", "libdl.so.2", "librt.so.1", "libmlx5.so.1"]
    assert change.lost == ["libpython3.10.so.1.0"]
    assert change.runpath is None and change.soname is None

    assert main(["wheel", "diff", str(deep_ep["post1"]), str(deep_ep["post2"])]) == 1
    out = capsys.readouterr().out
    assert "files: 0 added, 0 removed, 2 changed, 4 identical" in out
    assert "NEEDED + libmlx5.so.1" in out and "NEEDED - libpython3.10.so.1.0" in out
    assert main(["wheel", "diff", "--json", str(deep_ep["post1"]), str(deep_ep["post1"])]) == 0
    assert json.loads(capsys.readouterr().out)["shared_objects"] == []


def test_inspect_by_url_downloads_and_checks_the_hash(deep_ep, tmp_path, capsys, monkeypatch):
    from stackforge.clients.index import IndexClient

    monkeypatch.chdir(tmp_path)  # no repository here: the download goes to a temporary cache
    serve_dir = tmp_path / "idx"
    serve_dir.mkdir()
    shutil.copy2(deep_ep["post2"], serve_dir)
    with IndexServer(serve_dir, auth=("u", "s3cret")) as srv:
        f = IndexClient(srv.url_with_auth).project("deep_ep").files[0]
        url = (
            f"http://u:s3cret@127.0.0.1:{srv.port}/files/{deep_ep['post2'].name.replace('+', '%2B')}#sha256={f.sha256}"
        )
        assert main(["wheel", "inspect", "--json", url]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["sha256"] == f.sha256
        assert "s3cret" not in data["source"] and data["source"].startswith("http://***@127.0.0.1")
        bad = url.split("#")[0] + "#sha256=" + "0" * 64
        assert main(["wheel", "inspect", bad]) == 2
        err = capsys.readouterr().err
        assert "sha256 mismatch" in err and "s3cret" not in err


def test_a_shared_object_spooled_to_disk_reads_the_same(deep_ep, monkeypatch):
    """Large ELF members go through a temporary file instead of memory; the report is the same."""
    import stackforge.freshness.wheel as wheelmod

    in_memory = inspect_wheel(deep_ep["post2"]).to_json()
    monkeypatch.setattr(wheelmod, "_SPOOL_MAX", 1)  # every ELF member rolls over to disk
    rolled = []
    real = wheelmod.tempfile.SpooledTemporaryFile

    def spy(*args, **kwargs):
        spool = real(*args, **kwargs)
        rolled.append(spool)
        return spool

    monkeypatch.setattr(wheelmod.tempfile, "SpooledTemporaryFile", spy)
    on_disk = inspect_wheel(deep_ep["post2"]).to_json()
    assert rolled and all(s._rolled for s in rolled)  # type: ignore[attr-defined]
    assert on_disk == in_memory and on_disk["shared_objects"][0]["needed"] == DEEP_EP_NEEDED["post2"]
