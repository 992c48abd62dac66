"""`stackforge newest` against local indexes serving the stand-in MUSA wheels over HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.cli.main import main
from tests.fixtures.musa_index import POST2_TIMES, build_wheels, index_dirs, serve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_wheels(tmp_path_factory.mktemp("musa-wheels"))


@pytest.fixture
def dirs(built, tmp_path):
    return index_dirs(built, tmp_path / "index")


def sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def run(capsys, *argv):
    code = main(["--root", str(REPO), *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def newest_json(capsys, stack, overrides, *extra):
    code, out, err = run(capsys, "newest", stack, "--json", "--no-cache", *sets(overrides), *extra)
    return code, json.loads(out)


def by_name(data):
    return {p["package"]: p for p in data["packages"]}


def test_post2_is_newest_everywhere(capsys, dirs):
    vendor_dir, _ = dirs
    with serve(*dirs) as (overrides, vendor, public):
        code, data = newest_json(capsys, "post2", overrides)
    assert code == 0, data
    pkgs = by_name(data)
    assert {p["status"] for p in pkgs.values()} == {"newest"}
    torch = pkgs["torch"]
    path = vendor_dir / torch["filename"]
    assert torch["filename"] == "torch-2.11.0.post2+musa5.2.0-cp310-cp310-linux_x86_64.whl"
    assert torch["size"] == path.stat().st_size
    assert torch["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert torch["upload_time"] == "2026-09-23T11:59:00Z"
    assert torch["line"] == "cp310-cp310-linux_x86_64 +musa5.2.0"
    assert pkgs["torchada"]["line"] == "py3-none-any (no local label)"
    (train,) = data["trains"]
    assert train["which"] == "pinned" and train["spread_seconds"] == 60 and not train["far_apart"]
    (bf,) = data["built_for"]
    assert bf["package"] == "deep_ep" and bf["has_build"] and bf["builds_for"] == ["2.11.0.post1"]
    # One page per package, each asked once, JSON first.
    paths = [r.path for r in vendor.requests + public.requests]
    assert len(paths) == len(set(paths)) == len(pkgs)
    assert all(r.content_type == "application/vnd.pypi.simple.v1+json" for r in vendor.requests)


def test_post1_sees_the_post2_train_but_not_the_mp22_line(capsys, dirs):
    with serve(*dirs) as (overrides, *_):
        code, data = newest_json(capsys, "post1", overrides)
        tcode, text, _ = run(capsys, "newest", "post1", "--no-cache", *sets(overrides))
    assert code == tcode == 1
    pkgs = by_name(data)
    moved = {n: p["newest"] for n, p in pkgs.items() if p["status"] == "newer exists"}
    assert moved == {
        "torch": "2.11.0.post2+musa5.2.0",
        "torch_musa": "2.11.0.post2+musa5.2.0",
        "torchvision": "0.26.0.post2+musa5.2.0",
        "torchaudio": "2.11.0.post2+musa5.2.0",
        "torchada": "0.1.90",
    }
    # The aarch64 +musa5.2.1mp22 builds were published after post2 and sort above post1, but are another line.
    assert all("mp22" not in (p["filename"] or "") for p in pkgs.values())
    assert pkgs["deep_ep"]["status"] == "newest"
    assert pkgs["deep_ep"]["newest"] == "1.1.0+musa5.2.0torch2.11.0.post1"
    (bf,) = data["built_for"]
    assert bf["newest_for"] == "2.11.0.post2+musa5.2.0" and bf["has_build_for_newest"] is True
    newest_train = next(t for t in data["trains"] if t["which"] == "newest")
    assert newest_train["members"]["torchaudio"] == "2.11.0.post2+musa5.2.0" and not newest_train["far_apart"]
    assert "torch               2.11.0.post1+musa5.2.0" in text and "newer exists" in text
    assert "published together, within 60 s from 2026-09-23 11:59 UTC" in text


def test_the_mp22_line_is_its_own_line(capsys, dirs):
    aarch64 = ["platform.arch=aarch64", "packages.torch.version=2.11.0.post1+musa5.2.1mp22"]
    with serve(*dirs) as (overrides, *_):
        code, data = newest_json(capsys, "post1", overrides + aarch64, "--package", "torch")
    torch = by_name(data)["torch"]
    assert torch["line"] == "cp310-cp310-linux_aarch64 +musa5.2.1mp22"
    assert torch["status"] == "newest" and torch["newest"] == "2.11.0.post1+musa5.2.1mp22"
    assert code == 0


def test_no_upload_time_means_unknown(capsys, dirs):
    with serve(*dirs, upload_time=False) as (overrides, *_):
        code, data = newest_json(capsys, "post2", overrides)
        _, text, _ = run(
            capsys, "newest", "post2", "--no-cache", *sets(overrides), "--package", "torch", "--package", "torchvision"
        )
    assert code == 0
    assert all(p["upload_time"] is None and p["size"] for p in data["packages"])
    assert data["trains"][0]["spread_seconds"] is None and data["trains"][0]["far_apart"] is False
    assert "unknown" in text.splitlines()[4]
    assert "publish spread unknown (no upload-time for torch, torchvision)" in text


def test_html_only_index(capsys, dirs):
    with serve(*dirs, json=False) as (overrides, *_):
        code, data = newest_json(capsys, "post1", overrides)
    assert code == 1
    assert all("(html)" in d for d in data["indexes"].values())
    pkgs = by_name(data)
    assert pkgs["torch"]["newest"] == "2.11.0.post2+musa5.2.0"
    assert all(p["size"] is None and p["upload_time"] is None and len(p["sha256"]) == 64 for p in pkgs.values())


def test_train_members_published_far_apart(capsys, built, tmp_path):
    late = POST2_TIMES["torchaudio"] + 3 * 86400
    dirs = index_dirs(built, tmp_path / "index", redate={"torchaudio-post2-cp310": late})
    with serve(*dirs) as (overrides, *_):
        code, data = newest_json(capsys, "post2", overrides)
        _, text, _ = run(capsys, "newest", "post2", "--no-cache", *sets(overrides))
    (train,) = data["trains"]
    assert train["far_apart"] and train["spread_seconds"] == 3 * 86400
    assert "published FAR APART, within 3.0 days" in text
    assert code == 0  # a warning, not a stale pin


def test_missing_deep_ep_build(capsys, built, tmp_path):
    dirs = index_dirs(built, tmp_path / "index", deep_ep_post2=False)
    with serve(*dirs) as (overrides, *_):
        code2, data2 = newest_json(capsys, "post2", overrides)
        code1, text1, _ = run(capsys, "newest", "post1", "--no-cache", *sets(overrides))
    assert code2 == 1
    dep = by_name(data2)["deep_ep"]
    assert dep["status"] == "pin missing from index"
    assert data2["built_for"][0]["has_build"] is False
    assert (
        "deep_ep built for torch 2.11.0.post1+musa5.2.0 (+musa5.2.0torch2.11.0.post1): build present; "
        "for the newest torch 2.11.0.post2+musa5.2.0: NO BUILD yet"
    ) in text1
    assert code1 == 1


def test_credentials_from_env_never_printed(capsys, dirs, monkeypatch):
    with serve(*dirs, auth=("mt", "pa55word")) as (_, vendor, public):
        plain = [f"indexes.mthreads.url={vendor.url}", f"indexes.pypi.url={public.url}"]
        code, out, err = run(capsys, "newest", "post2", "--no-cache", *sets(plain))
        assert code == 2
        assert "unknown" in out and "401" in out
        for idx in ("MTHREADS", "PYPI"):
            monkeypatch.setenv(f"STACKFORGE_INDEX_{idx}_USERNAME", "mt")
            monkeypatch.setenv(f"STACKFORGE_INDEX_{idx}_PASSWORD", "pa55word")
        code, out, err = run(capsys, "newest", "post2", "--no-cache", "--json", *sets(plain))
        assert code == 0
        assert "pa55word" not in out + err
        monkeypatch.delenv("STACKFORGE_INDEX_MTHREADS_PASSWORD")
        monkeypatch.delenv("STACKFORGE_INDEX_PYPI_PASSWORD")
        in_url = [f"indexes.mthreads.url={vendor.url_with_auth}", f"indexes.pypi.url={public.url_with_auth}"]
        code, out, err = run(capsys, "newest", "post2", "--no-cache", *sets(in_url))
        assert code == 0 and "pa55word" not in out + err


def test_unreachable_index_is_exit_2(capsys, dirs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with serve(*dirs) as (overrides, *_):
        dead = [overrides[0].split("=")[0] + f"=http://127.0.0.1:{port}/simple", overrides[1]]
        code, data = newest_json(capsys, "post2", dead)
    assert code == 2
    pkgs = by_name(data)
    assert pkgs["torch"]["status"] == "unknown" and "cannot reach" in pkgs["torch"]["note"]
    assert pkgs["torchada"]["status"] == "newest"


def test_disk_cache_revalidates(capsys, dirs, tmp_path, monkeypatch):
    monkeypatch.delenv("STACKFORGE_CACHE", raising=False)  # the default: the repository's build/cache/
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    for name in ("post1", "post2"):
        (root / "stacks" / f"{name}.yaml").write_text((REPO / "stacks" / f"{name}.yaml").read_text())
    with serve(*dirs) as (overrides, vendor, public):
        assert main(["--root", str(root), "newest", "post2", *sets(overrides)]) == 0
        vendor.reset_log()
        assert main(["--root", str(root), "newest", "post2", *sets(overrides)]) == 0
        assert vendor.requests and {r.status for r in vendor.requests} == {304}
    capsys.readouterr()
    assert list((root / "build" / "cache" / "index").glob("*.json"))


def test_cli_process_exit_codes(dirs):
    with serve(*dirs) as (overrides, *_):
        for stack, expected in (("post2", 0), ("post1", 1)):
            proc = subprocess.run(
                [sys.executable, "-m", "stackforge", "newest", stack, "--no-cache", *sets(overrides)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                env=dict(os.environ),
            )
            assert proc.returncode == expected, proc.stderr
            assert "Traceback" not in proc.stderr


def test_pins_missing_from_the_index(capsys, dirs):
    extra = ["packages.triton.version=3.9.9", 'packages.not-on-index={version: "1.0", index: mthreads}']
    with serve(*dirs) as (overrides, *_):
        code, data = newest_json(capsys, "post2", overrides + extra)
    assert code == 1
    pkgs = by_name(data)
    assert pkgs["triton"]["status"] == "pin missing from index"
    assert pkgs["triton"]["newest"] == "3.2.0"  # what the line offers instead
    assert "lists no file of the pinned version" in pkgs["triton"]["note"]
    assert pkgs["not-on-index"]["status"] == "pin missing from index"
    assert "HTTP 404" in pkgs["not-on-index"]["note"]


def test_newest_asks_the_indexes_before_it_imports_the_stack_model(dirs):
    """The queries start from the stack file alone: a process that only starts them gets every page of post2
    without importing the model (pydantic), and asking its clients again sends no request."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from stackforge.freshness import prefetch\n"
        "from stackforge.stack import document\n"
        "clients = prefetch.start(Path(sys.argv[1]), 'post2', sys.argv[2:]).clients\n"
        "packages = document.read(Path(sys.argv[1]), 'post2', sys.argv[2:]).data['packages']\n"
        "for name, pkg in packages.items():\n"
        "    clients[pkg['index']].project(name)\n"
        "print(sorted(clients), len(packages), 'pydantic' in sys.modules, 'stackforge.stack.model' in sys.modules)\n"
    )
    with serve(*dirs) as (overrides, vendor, public):
        proc = subprocess.run(
            [sys.executable, "-c", script, str(REPO), *overrides],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=dict(os.environ),
        )
        paths = [r.path for r in vendor.requests + public.requests]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['mthreads',", "'pypi']", str(len(paths)), "False", "False"], proc.stdout
    assert len(paths) == len(set(paths)) == 18  # one request per package of post2, none asked twice


def test_the_validated_run_takes_a_prefetched_client_only_when_it_asks_the_same_way(dirs, tmp_path):
    from stackforge.freshness import lines, prefetch
    from stackforge.stack.load import load

    with serve(*dirs) as (overrides, vendor, public):
        started = prefetch.start(REPO, "post2", overrides)
        early = started.clients
        loaded = load("post2", root=REPO, overrides=overrides, read=started.document)
        assert started.document is not None and started.document.used  # the loader took it; the file was read once
        same = lines.clients_for(loaded, None, reuse=early)
        assert same["mthreads"] is early["mthreads"] and same["pypi"] is early["pypi"]
        # The public index with a credential the prefetch did not see: only that client is made again.
        assert early["pypi"].credential is None
        other = [overrides[0], f"indexes.pypi.url={public.url.replace('http://', 'http://someone:pw@')}"]
        changed = lines.clients_for(load("post2", root=REPO, overrides=other), None, reuse=early)
        assert changed["mthreads"] is early["mthreads"] and changed["pypi"] is not early["pypi"]
        assert changed["pypi"].auth == ("someone", "pw")
        # Another cache directory: neither is the same client.
        cached = lines.clients_for(load("post2", root=REPO, overrides=overrides), tmp_path, reuse=early)
        assert all(cached[name] is not early[name] for name in early)
