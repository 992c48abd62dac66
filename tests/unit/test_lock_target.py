"""``stackforge lock`` for a small stack against a local index over real HTTP (basic auth): the resolution is
for the stack's Python and platform — markers (``platform_machine``, ``python_version``), ``Requires-Python``
and wheel tags — by uv's resolver, without any hook into pip's private modules, and the credential reaches no
command line; ``lock --check`` says whether the checked-in locks are current; an unlocked public phase is
named at build time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stackforge.builder.locks.locks import parse_lock
from stackforge.cli import main as cli
from tests.fixtures.index_server import IndexServer
from tests.fixtures.wheels import build_wheel

PASSWORD = "Tgt-pw 7731"
USER = "lockci"
MANYLINUX = "manylinux_2_17_x86_64.manylinux2014_x86_64"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("target-index")
    build_wheel(
        d,
        "top",
        "1.0",
        requires_dist=[
            'armonly>=1; platform_machine == "aarch64"',
            'x86only>=1; platform_machine == "x86_64"',
            'old>=1; python_version < "3.11"',
        ],
    )
    for name in ("armonly", "x86only", "old"):
        build_wheel(d, name, "1.0")
    for py in ("cp310", "cp311"):  # the wheel for the target's interpreter and platform, and one that is not
        build_wheel(d, "fast", "2.0", python_tag=py, abi_tag=py, platform_tag=MANYLINUX)
        build_wheel(d, "fast", "2.0", python_tag=py, abi_tag=py, platform_tag="manylinux_2_17_aarch64")
    with IndexServer(d, auth=(USER, PASSWORD)) as server:
        yield server


def _root(tmp: Path, server: IndexServer) -> Path:
    root = tmp / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "stacks" / "tiny.yaml").write_text(f"""name: tiny
platform: {{os: ubuntu22.04, python: "3.10", arch: x86_64}}
base: {{image: stackforge/base:bookworm}}
indexes:
  pub: {{url: "{server.url}", role: public, private: true}}
packages:
  top: {{version: "1.0", index: pub}}
  fast: {{version: "2.0", index: pub}}
tags: {{local: "tiny:1"}}
targets: {{app: {{}}}}
""")
    return root


def _cli(capsys, root: Path, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["--root", str(root), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def creds(monkeypatch, tmp_path):
    for name in ("PUB", "PUB2"):
        monkeypatch.setenv(f"STACKFORGE_INDEX_{name}_USERNAME", USER)
        monkeypatch.setenv(f"STACKFORGE_INDEX_{name}_PASSWORD", PASSWORD)
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NETRC", raising=False)


def _spy(monkeypatch) -> list[list[str]]:
    """Every command `stackforge lock` runs, as its argv (through subprocess, or the clients' bounded runner)."""
    from stackforge.clients import proc

    seen: list[list[str]] = []
    real, bounded = subprocess.run, proc.run

    def run(cmd, *a, **kw):
        seen.append([str(c) for c in cmd])
        return real(cmd, *a, **kw)

    def run_bounded(cmd, *a, **kw):
        seen.append([str(c) for c in cmd])
        return bounded(cmd, *a, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(proc, "run", run_bounded)
    return seen


@pytest.mark.parametrize(
    ("sets", "expect", "wheel", "target"),
    [
        (
            [],
            {"fast", "old", "top", "x86only"},
            "cp310-cp310-manylinux_2_17_x86_64",
            "CPython 3.10 on manylinux_2_35_x86_64",
        ),
        (
            ["platform.arch=aarch64", "platform.python=3.11"],
            {"fast", "top", "armonly"},
            "cp311-cp311-manylinux_2_17_aarch64",
            "CPython 3.11 on manylinux_2_35_aarch64",
        ),
    ],
)
def test_the_lock_resolves_markers_and_wheels_for_the_target_with_uv_and_no_pip_hook(
    index, tmp_path, monkeypatch, capsys, creds, sets, expect, wheel, target
):
    root = _root(tmp_path, index)
    seen = _spy(monkeypatch)
    code, out, err = _cli(capsys, root, "lock", "tiny", *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    path = root / "stacks" / "locks" / "tiny" / "pub.txt"
    text = path.read_text()
    lock = parse_lock(path, text)
    # platform_machine and python_version markers are the target's, not this host's (x86_64, CPython 3.11)
    assert set(lock.pins) == expect
    assert lock.via["top"] == {"-r requirements.in"} and lock.via[next(iter(expect - {"fast", "top"}))] == {"top"}
    # one hash: the wheel pip installs for the target, not the other platform's
    chosen = next(index.directory.glob(f"fast-2.0-{wheel}*.whl"))
    import hashlib

    assert lock.pins["fast"][1] == [hashlib.sha256(chosen.read_bytes()).hexdigest()]
    assert f"for {target}, made by `stackforge lock tiny`\n# (uv's resolver against" in text
    # uv resolved it, for the target, without a hook into pip's private modules; the credential is on no argv
    uv = [c for c in seen if c[1:3] == ["pip", "compile"]]
    assert uv and all(c[c.index("--python-version") + 1] == target.split()[1] for c in uv)
    assert not any("pip._vendor" in a or "markers" in a for c in seen for a in c)
    assert not any(PASSWORD in a or PASSWORD.replace(" ", "%20") in a for c in seen for a in c)
    assert PASSWORD not in text + out + err


# --------------------------------------------------------------------------- lock --check

TWO_INDEXES = ["indexes.pub2={url: URL, role: public, private: true}", "packages.armonly={version: '1.0', index: pub2}"]


def _two(server: IndexServer) -> list[str]:
    sets = [s.replace("URL", f'"{server.url}"') for s in TWO_INDEXES]
    return [a for s in sets for a in ("--set", s)]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_lock_check_passes_offline_then_names_each_lock_and_what_moved(index, tmp_path, monkeypatch, capsys, creds):
    root = _root(tmp_path, index)
    two = _two(index)
    assert _cli(capsys, root, "lock", "tiny", *two)[0] == 0
    folder = root / "stacks" / "locks" / "tiny"
    pub = (folder / "pub.txt").read_text()
    assert "# held (the other pins of the stack, which the resolution held at their versions):\n" in pub
    assert "#   armonly==1.0 (index 'pub2')\n" in pub
    before = _snapshot(folder)

    index.reset_log()
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", *two)
    assert code == 0, err
    assert out.splitlines() == ["current: stacks/locks/tiny/pub.txt", "current: stacks/locks/tiny/pub2.txt"]
    assert index.requests == []  # offline: the stack and its lock files are all it reads

    # a pin the public resolution held moved: both locks are named, each with what moved, and the fix
    code, out, err = _cli(capsys, root, "lock", "tiny", "--check", *two, "--set", "packages.armonly.version=2.0")
    assert code == 1
    line = pub.splitlines().index("#   armonly==1.0 (index 'pub2')")  # the line of the `# held` head
    assert (
        f"stale: stacks/locks/tiny/pub.txt:{line}: packages.armonly moved: the resolution held armonly==1.0 "
        "(index 'pub2'), the stack pins 2.0 (index 'pub2')\n  fix: run: stackforge lock tiny"
    ) in err
    assert "stale: stacks/locks/tiny/pub2.txt:" in err and "armonly is pinned at 2.0 but the lock has 1.0" in err
    # the target moved, and a pin of the index itself
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", *two, "--set", "platform.python=3.11")
    assert code == 1 and "the lock was resolved for CPython 3.10 on manylinux_2_35_x86_64, but the stack" in err
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", *two, "--set", "packages.fast.version=2.1")
    assert (
        code == 1 and "stale: stacks/locks/tiny/pub.txt:" in err and "fast is pinned at 2.1 but the lock has 2.0" in err
    )
    # pub2's resolution held fast: its lock moved too
    assert "stale: stacks/locks/tiny/pub2.txt:" in err and "packages.fast moved: the resolution held fast==2.0" in err
    # a lock made before the held pins were recorded cannot be checked: stale, with the fix
    (folder / "pub.txt").write_text("".join(l for l in pub.splitlines(True) if not l.startswith("#   armonly")))
    try:
        code, out, err = _cli(capsys, root, "lock", "--check", "tiny", *two)
    finally:
        (folder / "pub.txt").write_text(pub)
    assert code == 1 and "packages.armonly (armonly==1.0, index 'pub2') is a pin the resolution did not hold" in err
    assert _snapshot(folder).keys() == before.keys()
    assert all(_snapshot(folder)[n][0] == before[n][0] for n in before)  # --check rewrote nothing
    assert index.requests == []


def test_lock_check_bad_input_exits_2(index, tmp_path, capsys, creds):
    root = _root(tmp_path, index)
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", "nosuch")
    assert code == 2 and "no stack named 'nosuch'" in err and "Traceback" not in err
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", "--index", "nope")
    assert code == 2 and "stack 'tiny' has no index 'nope'" in err
    code, out, err = _cli(capsys, root, "lock", "tiny", "tiny")
    assert code == 2 and "add --check to check several" in err
    assert not (root / "stacks" / "locks").exists()


def test_lock_check_of_a_stack_declared_locked_without_its_lock_fails(index, tmp_path, capsys, creds):
    root = _root(tmp_path, index)
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", "--set", "indexes.pub.lock=true")
    assert code == 1
    assert "stale: stacks/locks/tiny/pub.txt: index 'pub' is declared `lock: true` but its lock file is missing" in err


def test_lock_check_fails_a_public_index_with_neither_a_lock_nor_the_reason_it_has_none(index, tmp_path, capsys, creds):
    root = _root(tmp_path, index)
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny")
    assert (code, out) == (1, "")
    assert err == (
        "stale: stacks/locks/tiny/pub.txt: index 'pub' (public) installs without hashes: it has no lock and no "
        "indexes.pub.unlocked reason\n  fix: run: stackforge lock tiny, or declare indexes.pub.unlocked: <why it "
        "cannot be locked> in the stack\n"
    )
    why = "indexes.pub.unlocked=the index's wheels are rebuilt nightly"
    code, out, err = _cli(capsys, root, "lock", "--check", "tiny", "--set", why)
    assert code == 0, err
    assert err == "note: index 'pub' of tiny is unlocked: the index's wheels are rebuilt nightly\n"
    # lint prints the reason; render and build name it in their note
    code, out, err = _cli(capsys, root, "lint", "tiny", "--set", why)
    assert (
        code == 0
        and (
            "note: tiny: index 'pub' installs without hashes (no lock): the index's wheels are rebuilt nightly "
            "(indexes.pub.unlocked)"
        )
        in err.splitlines()
    )
    code, out, err = _cli(capsys, root, "render", "tiny", "--no-sources", "--out", str(tmp_path / "r"), "--set", why)
    assert (
        code == 0
        and (
            "note: index 'pub' of tiny has no lock: its phases install without hashes, because the index's wheels are "
            "rebuilt nightly (indexes.pub.unlocked)"
        )
        in err
    )
    # a lock makes the reason moot; both at once say the opposite and are refused on load
    code, out, err = _cli(capsys, root, "lint", "tiny", "--set", why, "--set", "indexes.pub.lock=true")
    assert code == 2 and "lock: true and unlocked: say the opposite; keep one" in err


def test_post_stacks_say_why_their_public_index_is_unlocked(capsys):
    from tests.fixtures.stack_support import REPO

    code, out, err = _cli(capsys, REPO, "lock", "--check", "post1", "post2")
    assert code == 0, err
    assert [line.split(" is unlocked: ")[0] for line in err.splitlines()] == [
        "note: index 'pypi' of post1",
        "note: index 'pypi' of post2",
    ]
    assert "(GitHub)" in err and "(dl.mthreads.com)" in err
    code, out, err = _cli(capsys, REPO, "lock", "--check", "post2", "--set", "indexes.pypi.unlocked=null")
    assert code == 1 and "stale: stacks/locks/post2/pypi.txt: index 'pypi' (public) installs without hashes" in err


def test_the_checked_in_example_lock_is_current(capsys):
    from tests.fixtures.stack_support import REPO

    code, out, err = _cli(capsys, REPO, "lock", "--check", "example")
    assert (code, out.strip()) == (0, "current: stacks/locks/example/pypi.txt"), err


# --------------------------------------------------------------------------- the unlocked public phase


def test_an_unlocked_public_phase_is_named_at_render_time_not_refused(index, tmp_path, capsys, creds):
    root = _root(tmp_path, index)
    note = "note: index 'pub' of tiny has no lock: its phase installs without hashes (run: stackforge lock tiny)"
    code, out, err = _cli(capsys, root, "render", "tiny", "--no-sources", "--out", str(tmp_path / "r1"))
    assert code == 0, err
    assert err.splitlines().count(note) == 1
    assert _cli(capsys, root, "lock", "tiny")[0] == 0
    code, out, err = _cli(capsys, root, "render", "tiny", "--no-sources", "--out", str(tmp_path / "r2"))
    assert code == 0 and "has no lock" not in err, err


def test_a_query_token_reaches_uv_through_its_environment_not_its_command_line(tmp_path, monkeypatch, capsys):
    d = tmp_path / "files"
    build_wheel(d, "top", "1.0")
    build_wheel(d, "fast", "2.0", python_tag="cp310", abi_tag="cp310", platform_tag=MANYLINUX)
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    with IndexServer(d) as server:
        root = _root(tmp_path, server)
        seen = _spy(monkeypatch)
        token = "s3cr3t-Tok"
        code, out, err = _cli(capsys, root, "lock", "tiny", "--set", f"indexes.pub.url={server.url}?token={token}")
        pages = [r.path for r in server.requests if r.path.startswith("/simple/")]
    assert code == 0, err
    assert pages and all(p.endswith(f"?token={token}") for p in pages)  # every page asked with the token
    text = (root / "stacks" / "locks" / "tiny" / "pub.txt").read_text()
    assert "top==1.0" in text and "fast==2.0" in text
    assert not any(token in a for c in seen for a in c) and token not in text + out + err
