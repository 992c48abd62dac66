"""Hostile inputs to the integrity guarantees: lock files, aliases, publish records, yanked pins,
upstreamed patches and the nightly summary. No engine: the CLI stops before any build, the registry
is the in-process stub, git repositories are real and local.

Every case asserts the exit code or outcome, the message (file:line and the fix) and that nothing
was installed, tagged or overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from stackforge import patches as P
from stackforge.clients.index import IndexFile, ProjectPage
from stackforge.clients.registry import RetryPolicy
from stackforge.errors import BuildFailed, UserError
from stackforge.flows.nightly import NightlyOptions, Row, Summary, bake_not_run, nightly
from stackforge.freshness import newest as freshness
from stackforge.publish.oci import ArchiveImage
from stackforge.publish.publisher import PublishOptions, PublishResult, publish
from stackforge.stack.load import load
from stackforge.stack.scheme import TagScheme
from tests.fixtures.faulty_proxy import BLOB_UPLOAD, Fault, FaultyProxy
from tests.fixtures.gitrepo import build_upstream, make_series
from tests.fixtures.save_archive import layer_tar, save_archive
from tests.fixtures.stack_support import RootSpec
from tests.fixtures.stub_registry import StubRegistry

REPO = Path(__file__).resolve().parents[2]
LOCK_REL = "stacks/locks/example/pypi.txt"
HASH_A, HASH_B = "a" * 64, "b" * 64
FIX = "fix: run: stackforge lock example"


# ------------------------------------------------------------------------------------ locks


@pytest.fixture
def root_spec() -> RootSpec:
    """A copy of the repository's stacks (with the example's lock) and patches."""
    return RootSpec(parts=("stacks", "patches"))


def sf(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, STACKFORGE_CACHE=str(root / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def good_lock() -> str:
    return (REPO / LOCK_REL).read_text()


def line_of(text: str, needle: str) -> int:
    return next(i for i, l in enumerate(text.splitlines(), start=1) if needle in l)


def append(extra: str):
    return lambda text: text + extra


def drop_entry(name: str):
    """Remove ``name``'s entry (its line, hash lines and ``# via`` comment)."""

    def edit(text: str) -> str:
        out, skip = [], False
        for line in text.splitlines(keepends=True):
            if line.startswith(f"{name}=="):
                skip = True
                continue
            if skip and line.startswith("    "):
                continue
            skip = False
            out.append(line)
        return "".join(out)

    return edit


def strip_hashes(name: str):
    def edit(text: str) -> str:
        lines = text.splitlines(keepends=True)
        i = next(i for i, l in enumerate(lines) if l.startswith(f"{name}=="))
        lines[i] = f"{name}==" + lines[i].split("==", 1)[1].split(" ", 1)[0].rstrip("\\\n") + "\n"
        while lines[i + 1].lstrip().startswith("--hash"):
            del lines[i + 1]
        return "".join(lines)

    return edit


# (id, edit of the good lock, text on the offending line, message part)
LOCK_CASES = [
    (
        "extra-package",
        append(f"evil==1.0 \\\n    --hash=sha256:{HASH_A}\n"),
        "evil==1.0",
        "evil is not a pin of index 'pypi' and no pin requires it",
    ),
    (
        "extra-with-forged-requirements-in",
        append(f"evil==1.0 \\\n    --hash=sha256:{HASH_A}\n    # via -r requirements.in\n"),
        "evil==1.0",
        "evil is not a pin of index 'pypi'",
    ),
    (
        "duplicate",
        append(f"IDNA==3.10 \\\n    --hash=sha256:{HASH_B}\n"),
        "IDNA==3.10",
        "idna is listed twice (also on line 4)",
    ),
    (
        "extra-index-url",
        append("--extra-index-url https://evil.example/simple\n"),
        "--extra-index-url",
        "option '--extra-index-url' is not allowed",
    ),
    ("index-url", append("--index-url=https://evil.example/simple\n"), "--index-url", "option '--index-url=https"),
    ("editable-vcs", append("-e git+https://evil.example/x.git#egg=x\n"), "-e git+", "option '-e' is not allowed"),
    ("nested-requirements", append("-r ../../../evil.txt\n"), "-r ../", "option '-r' is not allowed"),
    ("trusted-host", append("--trusted-host evil.example\n"), "--trusted-host", "option '--trusted-host'"),
    ("find-links", append("-f https://evil.example/wheels/\n"), "-f https", "option '-f' is not allowed"),
    (
        "url-requirement",
        append(f"evil @ https://evil.example/evil-1.0.tar.gz --hash=sha256:{HASH_A}\n"),
        "evil @",
        "is a URL or path requirement",
    ),
    (
        "path-requirement",
        append(f"./evil-1.0-py3-none-any.whl --hash=sha256:{HASH_A}\n"),
        "./evil",
        "is a URL or path requirement",
    ),
    (
        "option-after-entry",
        append(f"evil==1.0 --hash=sha256:{HASH_A} --index-url https://evil.example\n"),
        "evil==1.0",
        "'--index-url' after evil==1.0 is not allowed",
    ),
    ("range", append(f"evil>=1.0 --hash=sha256:{HASH_A}\n"), "evil>=1.0", "is not an exact name==version pin"),
    (
        "marker",
        append(f"evil==1.0 ; python_version>'3' --hash=sha256:{HASH_A}\n"),
        "evil==1.0 ;",
        "';' after evil==1.0",
    ),
    ("missing-hash", strip_hashes("packaging"), "packaging==25.0", "packaging==25.0 has no --hash=sha256"),
    (
        "pin-missing-from-lock",
        drop_entry("idna"),
        None,
        "lock file is stale: idna is pinned at 3.10 but the lock does not list it",
    ),
]


@pytest.mark.parametrize("case", LOCK_CASES, ids=[c[0] for c in LOCK_CASES])
def test_hostile_lock_is_refused_with_file_line_and_fix_and_nothing_is_written(root, tmp_path, case):
    _, edit, offending, message = case
    text = edit(good_lock())
    (root / LOCK_REL).write_text(text)
    out = tmp_path / "out"
    proc = sf(root, "render", "example", "--no-sources", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    where = f"{LOCK_REL}:{line_of(text, offending)}" if offending else LOCK_REL
    assert proc.stderr.startswith(f"error: {where}: "), proc.stderr
    assert message in proc.stderr and FIX in proc.stderr
    assert "Traceback" not in proc.stderr
    # Nothing was assembled: no requirements file for pip, no Dockerfile.
    assert not (out / "context").exists() and not (out / "context.partial").exists()
    assert not (out / "Dockerfile").exists()


def test_the_untouched_lock_is_what_pip_gets(root, tmp_path):
    out = tmp_path / "out"
    proc = sf(root, "render", "example", "--no-sources", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    files = [p for p in (out / "context" / "deps").rglob("*") if p.is_file()]
    reqs = [p for p in files if p.read_text() == good_lock()]
    assert len(reqs) == 1
    # The kernel's build environment installs its one pin with the hashes the lock gives it.
    env = (out / "context" / "deps" / "buildenv-markupsafe" / "pypi.txt").read_text().splitlines()
    assert env[0].startswith("setuptools==") and len(env) > 1
    assert all(line.strip() in good_lock() for line in env), env
    assert "--require-hashes" in (out / "Dockerfile").read_text()


@pytest.mark.parametrize("case", LOCK_CASES, ids=[c[0] for c in LOCK_CASES])
def test_lint_reports_the_lock_render_refuses_with_file_line_and_fix(root, case):
    _, edit, offending, message = case
    text = edit(good_lock())
    (root / LOCK_REL).write_text(text)
    proc = sf(root, "lint", "example")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    where = f"{LOCK_REL}:{line_of(text, offending)}" if offending else LOCK_REL
    assert proc.stdout.startswith(f"{where}: lock: "), proc.stdout
    assert message in proc.stdout and f"\n  {FIX}" in proc.stdout
    assert "Traceback" not in proc.stderr and "example: ok" not in proc.stdout
    found = json.loads(sf(root, "lint", "example", "--json").stdout)["stacks"][0]["findings"]
    assert [(f["rule"], f["file"], f["line"]) for f in found] == [
        ("lock", LOCK_REL, line_of(text, offending) if offending else None)
    ]


def link_lock_file(root: Path, outside: Path) -> None:
    (outside / "pypi.txt").write_text(good_lock())
    (root / LOCK_REL).unlink()
    (root / LOCK_REL).symlink_to(outside / "pypi.txt")


def link_lock_dir(root: Path, outside: Path) -> None:
    (outside / "pypi.txt").write_text(good_lock())
    shutil.rmtree(root / "stacks" / "locks" / "example")
    (root / "stacks" / "locks" / "example").symlink_to(outside)


@pytest.mark.parametrize("link", [link_lock_file, link_lock_dir], ids=["file-link", "directory-link"])
def test_a_lock_linked_out_of_stacks_is_refused_by_render_and_lint(root, tmp_path, link):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link(root, outside)
    out = tmp_path / "out"
    render = sf(root, "render", "example", "--no-sources", "--out", str(out))
    assert render.returncode == 2, render.stderr
    assert render.stderr.startswith(f"error: {LOCK_REL}: the lock file resolves (through a symlink) to "), render.stderr
    assert str(outside / "pypi.txt") in render.stderr and "outside" in render.stderr
    assert "fix: replace the link with the lock file itself" in render.stderr and "Traceback" not in render.stderr
    assert not (out / "context").exists() and not (out / "Dockerfile").exists()
    lint = sf(root, "lint", "example")
    assert lint.returncode == 1 and lint.stdout.startswith(f"{LOCK_REL}: lock: the lock file resolves"), lint.stdout


def test_a_lock_linked_inside_stacks_is_read(root, tmp_path):
    kept = root / "stacks" / "locks" / "kept.txt"
    (root / LOCK_REL).rename(kept)
    (root / LOCK_REL).symlink_to("../kept.txt")
    assert sf(root, "lint", "example").returncode == 0
    assert sf(root, "render", "example", "--no-sources", "--out", str(tmp_path / "out")).returncode == 0


def test_lock_writes_no_file_through_a_locks_directory_linked_out_of_stacks(root, tmp_path, monkeypatch):
    from stackforge.builder.locks import locks

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link_lock_dir(root, outside)
    (outside / "pypi.txt").write_text("# the file outside, kept\n")
    monkeypatch.setattr(locks, "lock_public", lambda loaded, index, ws, trees: {index: good_lock()})
    with pytest.raises(UserError) as exc:
        locks.write_locks(load("example", root=root), ["pypi"])
    assert exc.value.file == LOCK_REL and "outside" in exc.value.message
    assert sorted(p.name for p in outside.iterdir()) == ["pypi.txt"]
    assert (outside / "pypi.txt").read_text() == "# the file outside, kept\n"


LOST_LOCK_CASES = [
    ("file-deleted", lambda r: (r / LOCK_REL).unlink()),
    ("directory-deleted", lambda r: shutil.rmtree(r / "stacks" / "locks" / "example")),
]


@pytest.mark.parametrize("case", LOST_LOCK_CASES, ids=[c[0] for c in LOST_LOCK_CASES])
def test_a_lost_lock_fails_lint_render_and_build(root, tmp_path, case):
    _, lose = case
    lose(root)
    lint = sf(root, "lint", "example")
    assert lint.returncode == 1, lint.stdout + lint.stderr
    text = lint.stdout + lint.stderr
    assert f"stacks/example.yaml:{line_of((root / 'stacks/example.yaml').read_text(), 'lock: true')}" in text
    assert f"index 'pypi' is declared `lock: true` but {LOCK_REL} is missing" in text
    assert "fix: run: stackforge lock example" in text
    out = tmp_path / "out"
    render = sf(root, "render", "example", "--no-sources", "--out", str(out))
    build = sf(root, "build", "example", "--set", "tags.local=stackforge-test/lostlock:x", "--no-load")
    for proc in (render, build):  # render lints as build does
        assert proc.returncode == 1 and "fails lint; nothing was built" in proc.stderr
        assert "lock: true" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "context").exists()
    assert not (root / "build" / "example" / "context").exists()


def test_an_index_without_lock_true_and_without_a_lock_builds_unlocked(root):
    (root / LOCK_REL).unlink()
    proc = sf(root, "lint", "example", "--set", "indexes.pypi.lock=false")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ publish

SCHEME = TagScheme.from_prefix("v1")
ALIAS = "stackforge-example-latest"
NAME = "team/example"
FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01, total_seconds=10)


@pytest.fixture
def stub():
    with StubRegistry() as reg:
        yield reg


@pytest.fixture
def images(tmp_path):
    base = layer_tar({"etc/os-release": b"ID=debian\n"})

    def make(name: str) -> ArchiveImage:
        path = tmp_path / f"{name}.tar"
        if not path.exists():
            save_archive(path, [base, layer_tar({f"app/{name}.txt": name.encode() * 50})])
        return ArchiveImage(path)

    return make


def pub(address: str, image: ArchiveImage, tmp_path: Path, date: str, evidence: Path | None = None) -> PublishResult:
    options = PublishOptions(
        policy=FAST, lock_dir=tmp_path / "locks", layer_cache=tmp_path / "layers", settle_seconds=0
    )
    return publish(image, f"{address}/{NAME}", SCHEME, date, options, aliases=(ALIAS,), evidence=evidence)


def backwards_by_date(stub, images, tmp_path):
    newer = pub(stub.address, images("a"), tmp_path, "20260929")
    older = pub(stub.address, images("b"), tmp_path, "20260901")
    return newer, older


def into_a_gap(stub, images, tmp_path):
    pub(stub.address, images("a"), tmp_path, "20260929")
    r2 = pub(stub.address, images("b"), tmp_path, "20260929")
    newer = pub(stub.address, images("c"), tmp_path, "20260929")
    del stub.tags[NAME][r2.tag]  # r2 deleted: a gap below r3
    gap = pub(stub.address, images("d"), tmp_path, "20260929")
    assert gap.tag == r2.tag
    return newer, gap


ALIAS_CASES = [("older-date", backwards_by_date), ("gap-below-newer", into_a_gap)]


@pytest.mark.parametrize("case", ALIAS_CASES, ids=[c[0] for c in ALIAS_CASES])
def test_alias_never_moves_backwards(stub, images, tmp_path, case):
    _, scenario = case
    newer, late = scenario(stub, images, tmp_path)
    assert late.status == "published" and late.tag in stub.tags[NAME]  # the immutable tag is written
    assert late.aliases == {ALIAS: f"not moved: {newer.tag} is newer"}
    assert stub.tag_digest(NAME, ALIAS) == newer.digest
    assert "alias-kept" in [e["event"] for e in late.push_log]
    again = pub(stub.address, images("x"), tmp_path, "20261001")  # a newer date moves it
    assert again.aliases == {ALIAS: "moved"} and stub.tag_digest(NAME, ALIAS) == again.digest


def test_failed_publish_keeps_the_successful_record(stub, images, tmp_path):
    ev = tmp_path / "evidence"
    ok = pub(stub.address, images("a"), tmp_path, "20260929", evidence=ev)
    before = (ev / "publish.json").read_bytes()
    tags_before = dict(stub.tags[NAME])
    with FaultyProxy(
        stub.address, [Fault("status", BLOB_UPLOAD + ".+digest=", "PUT", status=503, times=None)]
    ) as proxy:
        with pytest.raises(BuildFailed) as exc:
            pub(proxy.address, images("b"), tmp_path, "20260929", evidence=ev)
    assert exc.value.exit_code == 1 and "no tag was created" in exc.value.message
    assert (ev / "publish.json").read_bytes() == before
    assert json.loads(before)["digest"] == ok.digest
    failed = json.loads((ev / "publish-failed.json").read_text())
    assert failed["status"] == "failed" and failed["tag_left"] is None and "503" in json.dumps(failed["push_log"])
    assert stub.tags[NAME] == tags_before  # nothing tagged, the alias untouched
    assert not [p for p in ev.iterdir() if p.name.endswith(".tmp")]
    again = pub(stub.address, images("b"), tmp_path, "20260929", evidence=ev)
    assert json.loads((ev / "publish.json").read_text())["digest"] == again.digest
    assert not (ev / "publish-failed.json").exists()


# ------------------------------------------------------------------------------------ yanked pins

T_YANKED = datetime(2026, 1, 1, tzinfo=timezone.utc)
T_GOOD = datetime(2026, 2, 1, tzinfo=timezone.utc)


def wheel(name: str, version: str, tags: str, sha: str, when: datetime, yanked: bool | str = False) -> IndexFile:
    fn = f"{name}-{version}-{tags}.whl"
    return IndexFile(fn, f"https://idx.example/{fn}", {"sha256": sha}, 10, when, yanked)


class FakeClient:
    display_url = "https://idx.example/simple"

    def __init__(self, files: list[IndexFile]):
        self.files = files

    def project(self, name: str) -> ProjectPage:
        return ProjectPage(name, f"https://idx.example/simple/{name}/", self.files, "json")


YANKED_CASES = [
    # (id, files of idna 3.10, expected pinned sha256, pinned yanked?, note part)
    (
        "yanked-and-good",
        [
            wheel("idna", "3.10", "py2.py3-none-any", HASH_A, T_YANKED, "broken"),
            wheel("idna", "3.10", "py3-none-any", HASH_B, T_GOOD),
        ],
        HASH_B,
        False,
        None,
    ),
    (
        "only-yanked",
        [wheel("idna", "3.10", "py3-none-any", HASH_A, T_YANKED, "broken metadata")],
        HASH_A,
        True,
        "the pinned version is available only yanked (broken metadata)",
    ),
]


@pytest.mark.parametrize("case", YANKED_CASES, ids=[c[0] for c in YANKED_CASES])
def test_newest_reports_the_file_pip_would_install(case):
    _, files, sha, yanked, note = case
    stack = load("example", root=REPO)
    report = freshness.newest(stack, packages=["idna"], clients={"pypi": FakeClient(files)})
    data = report.packages[0].to_json()
    assert data["pinned_sha256"] == sha and data["pinned_yanked"] is yanked
    assert data["pinned_upload_time"].startswith((T_YANKED if yanked else T_GOOD).strftime("%Y-%m-%d"))
    assert data["status"] == "newest"
    if note:
        assert note in data["note"] and note in report.render()
    else:
        assert "yanked" not in data["note"]


# ------------------------------------------------------------------------------------ upstreamed patches

WHITESPACE_CHANGE = [
    (
        "Engine",
        "cap step one",
        "Cap the first step.",
        "src/engine.py",
        "    value = x + 1\n",
        "    value = min(x + 1, 64)\n",
    )
]


@pytest.fixture
def whitespace_upstreamed(tmp_path):
    repo = build_upstream(tmp_path / "upstream")
    v1_0 = repo.head()
    patches = tmp_path / "repo" / "patches" / "demo"
    names = make_series(repo, v1_0, patches, WHITESPACE_CHANGE)
    repo.replace(
        "src/engine.py", "    value = x + 1\n", "    value = min( x + 1,  64 )\n"
    )  # same change, other spacing
    carrier = repo.commit("Engine: cap the first step (upstream style)")
    repo.tag("v1.1")
    from stackforge.clients.upstream import UpstreamSpec

    spec = UpstreamSpec(git=str(repo.path), tag="v1.0", commit=v1_0, patches=str(patches), name="demo")
    target = P.make_target("demo", spec, root=tmp_path / "repo", cache_dir=tmp_path / "cache")
    return target, names[0], carrier, patches


def test_check_and_upstreamed_agree_on_a_whitespace_variant(whitespace_upstreamed):
    target, name, carrier, patches = whitespace_upstreamed
    series_before = (patches / "series").read_text()
    found = P.find_upstreamed(target, carrier)
    assert [(u.name, u.commit) for u in found] == [(name, carrier)]
    report = P.check(target, commit=carrier)
    (result,) = report.results
    assert result.status == "upstreamed" and not report.failed and report.ok
    assert carrier[:12] in result.detail and "upstream style" in result.detail
    assert (patches / "series").read_text() == series_before  # check and upstreamed (no --drop) change nothing


# ------------------------------------------------------------------------------------ nightly summary

NOT_RUN_CASES = [
    (
        "every-stack-failed-lint",
        [Row("a", "*", "failed", stage="lint"), Row("b", "*", "failed", stage="lint")],
        [],
        True,
        "every stack failed lint",
    ),
    ("every-stack-failed-to-load", [Row("a", "*", "failed", stage="load")], [], True, "every stack failed to load"),
    (
        "mixed",
        [Row("a", "*", "failed", stage="load"), Row("b", "*", "failed", stage="lint")],
        [],
        True,
        "every stack failed to load or lint",
    ),
    ("nothing-selected", [], [], True, "no stack selected"),
    ("no-bake", [], ["stack"], False, "--no-bake was given"),
]


@pytest.mark.parametrize("case", NOT_RUN_CASES, ids=[c[0] for c in NOT_RUN_CASES])
def test_summary_says_why_the_bake_did_not_run(case):
    _, rows, loaded, use_bake, why = case
    assert bake_not_run(rows, loaded, use_bake) == why
    md = Summary(date="20260929", registry="r.example/t", rows=rows, bake={"not_run": why}).markdown()
    assert f"Bake: not run: {why}." in md and "None" not in md


def test_nightly_whose_stacks_all_fail_lint_says_so_and_builds_nothing(root, tmp_path):
    (root / "stacks" / "lostlock.yaml").write_text("name: lostlock\ninherits: example\nnightly: true\n")
    out = tmp_path / "nightly"
    summary = nightly(
        root, "127.0.0.1:9/team", NightlyOptions(date="20260929", stacks=["lostlock"], out=out, echo=lambda line: None)
    )
    assert not summary.ok and [(r.stack, r.stage) for r in summary.rows] == [("lostlock", "lint")]
    assert "stacks/locks/lostlock/pypi.txt is missing" in summary.rows[0].reason
    md = (out / "summary.md").read_text()
    assert "Bake: not run: every stack failed lint." in md and "exit None" not in md
    assert json.loads((out / "summary.json").read_text())["bake"] == {"not_run": "every stack failed lint"}
    assert not (root / "build" / "lostlock").exists() and not (out / "bake.json").exists()


def test_nightly_reports_a_tampered_lock_as_that_stacks_lint_failure(root, tmp_path):
    (root / LOCK_REL).write_text(good_lock() + f"evil==1.0 \\\n    --hash=sha256:{HASH_A}\n")
    out = tmp_path / "nightly"
    summary = nightly(
        root, "127.0.0.1:9/team", NightlyOptions(date="20260929", stacks=["example"], out=out, echo=lambda line: None)
    )
    assert not summary.ok and [(r.stack, r.stage) for r in summary.rows] == [("example", "lint")]
    assert "evil is not a pin of index 'pypi'" in summary.rows[0].reason
    assert not (root / "build" / "example").exists() and not (out / "bake.json").exists()


def test_a_pip_compile_lock_with_transitive_dependencies_is_accepted(root, tmp_path):
    """Packages no pin names are admitted only through pip-compile's `# via` chain back to a pin."""

    def entry(name, version, via):
        return f"{name}=={version} \\\n    --hash=sha256:{HASH_A}\n" + "".join(f"    {v}\n" for v in via)

    lock = (
        "# made by `stackforge lock example`\n"
        + entry("certifi", "2025.1.31", ["# via requests"])
        + entry("charset-normalizer", "3.4.1", ["# via", "#   requests"])
        + entry("idna", "3.10", ["# via", "#   -r requirements.in", "#   requests"])
        + entry("packaging", "25.0", ["# via -r requirements.in"])
        + entry("requests", "2.32.3", ["# via -r requirements.in"])
        + entry("urllib3", "2.3.0", ["# via requests"])
        + entry("zstandard", "0.23.0", ["# via urllib3"])  # two steps from the pin
        + "\n# The following packages are considered to be unsafe in a requirements file:\n"
        + entry("setuptools", "80.9.0", ["# via -r requirements.in"])
    )
    (root / LOCK_REL).write_text(lock)
    add = ["--set", "packages.requests={version: 2.32.3, index: pypi}"]
    out = tmp_path / "out"
    proc = sf(root, "render", "example", "--no-sources", "--out", str(out), *add)
    assert proc.returncode == 0, proc.stderr
    assert any(p.read_text() == lock for p in (out / "context" / "deps").iterdir())
    # The same lock without the pin that leads to them: every package of the chain is refused.
    proc = sf(root, "render", "example", "--no-sources", "--out", str(tmp_path / "out2"))
    assert proc.returncode == 2 and f"{LOCK_REL}:2: certifi is not a pin of index 'pypi'" in proc.stderr


def test_an_interrupted_publish_keeps_the_successful_record_and_says_what_it_left(stub, images, tmp_path):
    """SIGTERM arrives while the manifest is being pushed: the publish stops, leaves no tag, records
    ``interrupted`` in publish-failed.json, and the earlier publish.json stays as it was."""
    import signal

    from stackforge.signals import Interrupted, handle_signals

    ev = tmp_path / "evidence"
    pub(stub.address, images("a"), tmp_path, "20260929", evidence=ev)
    before, tags_before = (ev / "publish.json").read_bytes(), dict(stub.tags[NAME])
    kill = Fault("hook", r"/manifests/sha256:", "PUT", hook=lambda proxy: os.kill(os.getpid(), signal.SIGTERM))
    with FaultyProxy(stub.address, [kill]) as proxy, pytest.raises(Interrupted) as exc, handle_signals():
        pub(proxy.address, images("b"), tmp_path, "20260929", evidence=ev)
    assert exc.value.exit_code == 143 and kill.hits == 1
    rendered = exc.value.render()
    assert rendered.startswith("error: interrupted by SIGTERM; publish stopped: no tag was created")
    assert "publish-failed.json" in rendered
    assert (ev / "publish.json").read_bytes() == before and stub.tags[NAME] == tags_before
    failed = json.loads((ev / "publish-failed.json").read_text())
    assert failed["status"] == "interrupted" and failed["tag_left"] is None
    assert failed["error"] == "interrupted by SIGTERM; no tag was created"
    assert not [p for p in ev.iterdir() if p.name.endswith(".tmp")]


def test_an_interrupted_nightly_writes_its_summary_with_the_undecided_rows(root, tmp_path, monkeypatch):
    """SIGTERM while the bake runs: the summary is written, every stack and target not decided is
    ``interrupted``, and the command says where the summary is."""
    import signal

    from stackforge.builder.run import bake as bakemod
    from stackforge.clients.engine import Engine
    from stackforge.signals import Interrupted

    monkeypatch.setattr(Engine, "check", lambda self: None)

    def bake_interrupted(*args, **kwargs):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(bakemod, "bake", bake_interrupted)
    out = tmp_path / "nightly"
    with pytest.raises(Interrupted) as exc:
        nightly(
            root,
            "127.0.0.1:9/team",
            NightlyOptions(date="20260929", stacks=["example"], out=out, echo=lambda line: None, preflight=False),
        )
    assert exc.value.render().endswith(f"nothing more was published (summary: {out / 'summary.md'})")
    data = json.loads((out / "summary.json").read_text())
    assert data["ok"] is False and data["bake"] == {"not_run": "interrupted by SIGTERM"}
    assert [(r["stack"], r["target"], r["status"], r["stage"]) for r in data["rows"]] == [
        ("example", "escape", "interrupted", "bake")
    ]
    md = (out / "summary.md").read_text()
    assert (
        "| example | escape | linux/amd64 | INTERRUPTED (bake) |" in md
        and "Bake: not run: interrupted by SIGTERM." in md
    )
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
