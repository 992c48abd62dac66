"""The patch series against real git repositories made by the tests.

The scenario (tests/fixtures/gitrepo.py): an upstream with history tagged v1.0,
a 12-patch series on it written by plain ``git format-patch``; v1.1 carries
patch 3 (cherry-picked) and patch 6 (inside a bigger commit); a branch rewrites
the line patch 5 changes; another edits a context line of patch 10.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge import patches as P
from stackforge.clients.git import BASE_REF, git
from stackforge.clients.upstream import export_upstream
from stackforge.errors import UserError
from stackforge.patches.apply import read_note
from stackforge.patches.patchfile import parse_patch
from tests.fixtures.gitrepo import (
    LAYER_CHANGES,
    SERIES_CHANGES,
    build_scenario,
    copy_scenario,
    git_env,
    make_layer,
)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("scenario")
    scenario = build_scenario(base)
    P.write_index(P.read_series(scenario.patches))
    return base, scenario


@pytest.fixture
def sc(template, tmp_path):
    base, scenario = template
    return copy_scenario(scenario, base, tmp_path)


def root_of(sc) -> Path:
    return sc.patches.parents[1]


def target(sc, commit=None, tag="v1.0", overlays=()):
    return P.make_target(
        "demo", sc.spec(commit, tag), root=root_of(sc), cache_dir=root_of(sc).parent / "cache", overlays=overlays
    )


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.patch"))}


def log_subjects(repo: Path, rng: str) -> list[str]:
    return git(repo, "log", "--reverse", "--format=%s", rng).stdout.splitlines()


def test_clean_apply_gives_one_commit_per_patch_with_author_and_date(sc, tmp_path):
    dest = tmp_path / "applied"
    report = P.apply_to(target(sc), dest)
    assert report.ok and [r.status for r in report.results] == ["clean"] * 12
    assert git(dest, "rev-parse", BASE_REF).stdout.strip() == sc.v1_0
    assert git(dest, "rev-parse", "HEAD~12").stdout.strip() == sc.v1_0
    assert log_subjects(dest, f"{sc.v1_0}..HEAD") == [f"{a}: {s}" for a, s, *_ in SERIES_CHANGES]
    for i, r in enumerate(report.results):
        pf = parse_patch(sc.patches / r.name)
        author = git(dest, "log", "-1", "--format=%an <%ae>|%aD", r.commit).stdout.strip()
        assert author == f"{pf.author}|{pf.date}"
        assert read_note(dest, r.commit) == ("base", sc.names[i])
    assert not (dest / P.STATE_FILE).exists()
    assert git(dest, "status", "--porcelain").stdout == ""


def test_conflicting_patch_names_patch_file_line_hunk_and_resumes(sc, tmp_path):
    dest = tmp_path / "applied"
    resume = f"stackforge patches apply demo --to {dest} --continue"
    report = P.apply_to(target(sc, sc.conflict, tag="v1.0-conflict"), dest, resume=resume)
    failed = report.failed
    assert [r.name for r in failed] == [sc.names[4]]
    r = failed[0]
    hunk = parse_patch(sc.patches / sc.names[4]).hunks[0]
    assert (r.position, r.total, r.layer) == (5, 12, "base")
    assert r.diagnosis.file == "src/kernels.c"
    assert r.diagnosis.line == hunk.old_start
    assert r.diagnosis.hunk_number == 1 and r.diagnosis.hunk == hunk.text()
    assert "src/kernels.c" in r.diagnosis.conflicts
    assert [x.status for x in report.results[5:]] == ["not-run"] * 7
    err = P.failure_error(report, resume)
    text = err.render()
    for needle in (
        sc.names[4],
        "position 5 of 12",
        "src/kernels.c",
        f"line {hunk.old_start}",
        hunk.header,
        "-    return x * 3;",
        resume,
    ):
        assert needle in text
    assert err.exit_code == 1 and err.line == hunk.patch_line
    # The tree is marked, never presented as done.
    state = json.loads((dest / P.STATE_FILE).read_text())
    assert state["failed"] == sc.names[4] and state["resume"] == resume
    assert (dest / ".git" / "rebase-apply").is_dir()
    assert len(log_subjects(dest, f"{sc.conflict}..HEAD")) == 4
    kernels = (dest / "src" / "kernels.c").read_text()
    assert "<<<<<<<" in kernels
    assert git(dest, "status", "--porcelain", "--ignored", P.STATE_FILE).stdout.startswith("!!")
    # Resolve by hand, stage, continue: the rest of the series applies.
    resolved = re.sub(r"<<<<<<<.*?>>>>>>>[^\n]*\n", "    return musa_kernel_2(x) + 1;\n", kernels, flags=re.S)
    (dest / "src" / "kernels.c").write_text(resolved)
    git(dest, "add", "src/kernels.c")
    done = P.continue_apply(dest)
    assert done.ok and len(done.results) == 12
    assert done.results[4].status == "resolved"
    assert [x.status for x in done.results[5:]] == ["clean"] * 7
    assert log_subjects(dest, f"{sc.conflict}..HEAD") == [f"{a}: {s}" for a, s, *_ in SERIES_CHANGES]
    assert not (dest / P.STATE_FILE).exists()
    # Exporting the resolved tree changes the resolved patch, and later patches of the same file only.
    plan, changes = P.export_series(dest, P.load_layers([("base", sc.patches)]), check=True)
    assert_ripple(changes, sc.names[4], sc, "src/kernels.c")


def assert_ripple(changes, first: str, sc, file: str) -> None:
    """The edited patch changes first; after it only patches of the same file (their index lines name its blobs)."""
    assert changes and all(c.kind == "changed" for c in changes)
    assert changes[0].path.name == first
    same_file = [n for n, ch in zip(sc.names, SERIES_CHANGES) if ch[3] == file]
    later = [c.path.name for c in changes[1:] if c.path.name != "README.md"]
    assert set(later) <= set(same_file[same_file.index(first) + 1 :])


def test_abort_and_skip_after_a_failure(sc, tmp_path):
    dest = tmp_path / "applied"
    report = P.apply_to(target(sc, sc.conflict, tag="v1.0-conflict"), dest)
    assert report.failed
    skipped = P.continue_apply(dest, skip=True)
    assert skipped.ok and skipped.results[4].status == "skipped"
    assert len(log_subjects(dest, f"{sc.conflict}..HEAD")) == 11
    dest2 = tmp_path / "applied2"
    P.apply_to(target(sc, sc.conflict, tag="v1.0-conflict"), dest2)
    P.abort_apply(dest2)
    assert not (dest2 / P.STATE_FILE).exists() and not (dest2 / ".git" / "rebase-apply").exists()
    assert len(log_subjects(dest2, f"{sc.conflict}..HEAD")) == 4
    with pytest.raises(UserError):
        P.continue_apply(dest2)


def test_continue_after_the_user_finished_the_patch_with_git(sc, tmp_path):
    dest = tmp_path / "applied"
    P.apply_to(target(sc, sc.conflict, tag="v1.0-conflict"), dest)
    text = (dest / "src" / "kernels.c").read_text()
    (dest / "src" / "kernels.c").write_text(
        re.sub(r"<<<<<<<.*?>>>>>>>[^\n]*\n", "    return musa_kernel_2(x);\n", text, flags=re.S)
    )
    git(dest, "add", "src/kernels.c")
    git(dest, "am", "--continue")
    done = P.continue_apply(dest)
    assert done.ok and done.results[4].status == "resolved"
    assert read_note(dest, done.results[4].commit) == ("base", sc.names[4])
    assert len(log_subjects(dest, f"{sc.conflict}..HEAD")) == 12


def test_apply_refuses_a_non_empty_destination_without_force(sc, tmp_path):
    dest = tmp_path / "applied"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(UserError) as exc:
        P.apply_to(target(sc), dest)
    assert "--force" in exc.value.fix
    with pytest.raises(UserError) as exc:  # --force replaces only a tree apply made
        P.apply_to(target(sc), dest, force=True)
    assert "is not a tree `stackforge patches apply` made" in exc.value.message
    assert (dest / "keep.txt").read_text() == "mine"
    made = tmp_path / "made"
    assert P.apply_to(target(sc), made).ok
    with pytest.raises(UserError) as exc:
        P.apply_to(target(sc), made)
    assert "--force" in exc.value.fix
    assert P.apply_to(target(sc), made, force=True).ok


def test_check_classifies_each_patch(sc):
    engine = {n for n, ch in zip(sc.names, SERIES_CHANGES) if ch[3] == "src/engine.py"}
    rep = P.check(target(sc), commit=sc.v1_1)
    status = {r.name: r.status for r in rep.results}
    assert {n for n, s in status.items() if s == "upstreamed"} == set(sc.upstreamed)
    details = {r.name: r.detail for r in rep.results}
    assert "(Engine: cap batch size on musa)" in details[sc.names[2]]
    assert "(Config: dtype defaults and a README note)" in details[sc.names[5]]
    assert {n for n, s in status.items() if s == "offset"} == engine - set(sc.upstreamed)
    assert {n for n, s in status.items() if s == "clean"} == set(sc.names) - engine - set(sc.upstreamed)
    assert not rep.failed
    rep = P.check(target(sc), commit=sc.context)
    assert [r.name for r in rep.results if r.status == "3-way"] == [sc.names[9]]
    rep = P.check(target(sc), commit=sc.conflict)
    assert [r.name for r in rep.results if r.status == "fails"] == [sc.names[4]]
    assert all(r.status == "clean" for r in rep.results if r.name != sc.names[4])
    data = json.loads(json.dumps(rep.to_json()))
    assert data["ok"] is False and data["patches"][4]["diagnosis"]["file"] == "src/kernels.c"


def test_upstream_bump_reports_both_upstreamed_patches_and_drop_removes_exactly_them(sc):
    t = target(sc)
    found = P.find_upstreamed(t, sc.v1_1)
    assert [u.name for u in found] == sc.upstreamed
    by = {u.name: u for u in found}
    cherry = by[sc.names[2]]
    assert "patch-id" in cherry.how and cherry.commit_subject == "Engine: cap batch size on musa"
    folded = by[sc.names[5]]
    assert folded.how == "no changes" and folded.commit_subject == "Config: dtype defaults and a README note"
    assert git(sc.upstream.path, "merge-base", "--is-ancestor", folded.commit, sc.v1_1).returncode == 0
    before = digests(sc.patches)
    kept = [n for n in sc.names if n not in sc.upstreamed]
    renames = P.drop_upstreamed(t, found, sc.v1_1)
    after = P.read_series(sc.patches)
    assert len(after.names) == 10
    assert [n.split("-", 1)[1] for n in after.names] == [n.split("-", 1)[1] for n in kept]
    assert [n[:4] for n in after.names] == [f"{i:04d}" for i in range(1, 11)]
    assert sorted(p.name for p in sc.patches.glob("*.patch")) == sorted(after.names)
    for old, new in zip(kept, after.names):
        assert hashlib.sha256((sc.patches / new).read_bytes()).hexdigest() == before[old]
    first_dropped = sc.names.index(sc.upstreamed[0])
    assert len(renames) == len(kept) - first_dropped  # everything after the first dropped patch moved down
    text = (sc.patches / "series").read_text()
    for u in found:
        assert f"# Applied-Upstream: {u.name} ({u.subject}): in upstream commit {u.commit}" in text
    assert P.lint_repository(root_of(sc)) == []
    # The trimmed series applies on the new pin with nothing left upstreamed.
    rep = P.check(target(sc, sc.v1_1, tag="v1.1"))
    assert rep.ok and {r.status for r in rep.results} <= {"clean", "offset"}


def test_unchanged_series_re_exports_byte_identically(sc, tmp_path):
    before = {p.name: p.read_bytes() for p in sc.patches.iterdir()}
    dest = tmp_path / "applied"
    P.apply_to(target(sc), dest)
    plan, changes = P.export_series(dest, P.load_layers([("base", sc.patches)]))
    assert changes == []
    assert {p.name: p.read_bytes() for p in sc.patches.iterdir()} == before
    assert [p.name for p in plan.patches] == sc.names
    assert P.export_check(target(sc)) == []


def test_export_check_fails_on_a_hand_edited_patch(sc):
    p = sc.patches / sc.names[1]
    p.write_text(p.read_text().replace("+    value = x + 1  # musa backend", "+    value = x + 1  # musa backend v2"))
    changes = P.export_check(target(sc))
    assert_ripple(changes, sc.names[1], sc, "src/engine.py")
    patch_change = changes[0]
    # The blob id of the edited postimage no longer matches: the re-export rewrites the index line.
    assert re.search(r"^[-+]index [0-9a-f]{40}\.\.[0-9a-f]{40}", patch_change.diff, re.M)


def test_renumber_after_inserting_a_commit_keeps_names_and_bytes(sc, tmp_path):
    dest = tmp_path / "applied"
    P.apply_to(target(sc), dest)
    before = digests(sc.patches)
    header = (sc.patches / "series").read_text().splitlines()[0]
    # Insert a commit after the 4th patch with an interactive rebase (notes follow the rewritten commits).
    editor = (
        f'{sys.executable} -c "import sys; p=sys.argv[1]; l=open(p).read().splitlines(True); '
        "i=[k for k,x in enumerate(l) if x.startswith('pick')][3]; "
        "l.insert(i+1, 'exec sh -c \\'printf \\\"musa = True\\\\\\\\n\\\" > src/musa_flag.py && git add src/musa_flag.py && "
        'git commit -q -m \\"Core: add a musa flag\\" -m \\"A flag other modules can test.\\"\\\'\\\\n\'); open(p,\'w\').writelines(l)"'
    )
    env = git_env(author=("Dev 13", "dev13@fork.example"))
    env["GIT_SEQUENCE_EDITOR"] = editor
    proc = subprocess.run(
        ["git", "-C", str(dest), "rebase", "-q", "-i", sc.v1_0], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert (dest / "src" / "musa_flag.py").read_text() == "musa = True\n"
    plan, changes = P.export_series(dest, P.load_layers([("base", sc.patches)]))
    new = P.read_series(sc.patches).names
    inserted = "0005-Core-add-a-musa-flag.patch"
    assert new[:4] == sc.names[:4] and new[4] == inserted
    assert [n.split("-", 1)[1] for n in new[5:]] == [n.split("-", 1)[1] for n in sc.names[4:]]
    assert [n[:4] for n in new] == [f"{i:04d}" for i in range(1, 14)]
    for old, renamed in zip(sc.names[4:], new[5:]):
        assert hashlib.sha256((sc.patches / renamed).read_bytes()).hexdigest() == before[old]
    assert sorted(p.name for p in sc.patches.glob("*.patch")) == sorted(new)
    assert (sc.patches / "series").read_text().splitlines()[0] == header
    kinds = {c.path.name: c.kind for c in changes}
    assert kinds[inserted] == "added" and kinds[sc.names[-1]] == "removed" and kinds["series"] == "changed"
    # The inserted patch is named exactly as git format-patch names it.
    out = tmp_path / "fp"
    commit = plan.patches[4].commit
    subprocess.run(
        ["git", "-C", str(dest), "format-patch", "-q", "-o", str(out), "--start-number", "5", "-1", commit],
        check=True,
        env=git_env(),
    )
    assert [p.name for p in out.iterdir()] == [inserted]
    assert P.lint_repository(root_of(sc)) == []
    # And the new series re-exports byte-identically from a fresh apply.
    assert P.export_check(target(sc)) == []


def test_lint_flags_a_tracker_id_added_in_a_worked_tree(sc, tmp_path):
    dest = tmp_path / "applied"
    P.apply_to(target(sc), dest)
    engine = dest / "src" / "engine.py"
    text = engine.read_text().replace(
        "    value = x + 3\n",
        "    value = x + 3\n    # workaround for a driver bug, see MUSA-100042\n    limit = 8  \n",
    )
    engine.write_text(text)
    git(dest, "commit", "-q", "-a", "-m", "Engine: work around a driver bug", "-m", "Tracked as MUSA-100042.")
    P.export_series(dest, P.load_layers([("base", sc.patches)]))
    name = "0013-Engine-work-around-a-driver-bug.patch"
    assert P.read_series(sc.patches).names[-1] == name
    findings = [f for f in P.lint_repository(root_of(sc)) if f.patch == name]
    comment_line = text.splitlines().index("    # workaround for a driver bug, see MUSA-100042") + 1
    got = sorted((f.code, f.source_file or "", f.source_line or 0) for f in findings)
    assert got == sorted(
        [
            ("tracker-id", "src/engine.py", comment_line),
            ("tracker-id", "", 0),
            ("trailing-whitespace", "src/engine.py", comment_line + 1),
        ]
    )
    patch_lines = (sc.patches / name).read_text().splitlines()
    for f in findings:
        rendered = f.render()
        assert name in rendered and f"{f.file}:{f.line}" in rendered
        assert ("MUSA-100042" in patch_lines[f.line - 1]) == (f.code == "tracker-id")


def test_layered_range_on_top(sc, tmp_path):
    root = root_of(sc)
    layer_dir = make_layer(sc, root, "jev")
    P.write_index(P.read_series(layer_dir, layer="jev"))
    layer_names = P.read_series(layer_dir).names
    assert [n[:4] for n in layer_names] == ["0013", "0014", "0015"]
    assert P.lint_repository(root) == []
    t = target(sc, overlays=["jev"])
    assert [s.layer for s in t.layers] == ["base", "jev"]
    dest = tmp_path / "applied"
    report = P.apply_to(t, dest)
    assert report.ok and [(r.layer, r.position) for r in report.results][-3:] == [("jev", 13), ("jev", 14), ("jev", 15)]
    assert log_subjects(dest, f"{sc.v1_0}..HEAD")[-3:] == [f"{a}: {s}" for a, s, *_ in LAYER_CHANGES]
    assert "[jev]" in P.summary_lines(report)[-1]
    # Both layers re-export byte-identically, each into its own directory.
    plan, changes = P.export_series(dest, t.layers, check=True)
    assert changes == []
    assert [p.layer for p in plan.patches] == ["base"] * 12 + ["jev"] * 3
    assert P.export_check(t) == []
    assert P.series_hash(sc.patches, layer_dir) != P.series_hash(sc.patches)
    # Without the base patch it builds on, the layer's first patch fails and the report names the layer.
    series = sc.patches / "series"
    original = series.read_text()
    series.write_text(original.replace(sc.names[1] + "\n", ""))
    broken = P.check(target(sc, overlays=["jev"]))
    fails = broken.failed
    assert [(r.name, r.layer) for r in fails] == [(layer_names[0], "jev")]
    assert "in layer jev" in P.failure_message(fails[0])
    series.write_text(original)
    # After a pin bump drops two base patches, the layered range is renumbered to follow the base.
    found = P.find_upstreamed(target(sc, overlays=["jev"]), sc.v1_1)
    assert [u.name for u in found] == sc.upstreamed
    P.drop_upstreamed(target(sc, overlays=["jev"]), found, sc.v1_1)
    assert [n[:4] for n in P.read_series(layer_dir).names] == ["0011", "0012", "0013"]
    assert [n[5:] for n in P.read_series(layer_dir).names] == [n[5:] for n in layer_names]
    assert P.lint_repository(root) == []
    rep = P.check(target(sc, sc.v1_1, tag="v1.1", overlays=["jev"]))
    assert rep.ok and [r.layer for r in rep.results].count("jev") == 3


def test_range_diff_between_pins(sc):
    t = target(sc)
    entries, raw = P.range_diff(t, sc.v1_0, sc.v1_1)
    status = {e.name: e.status for e in entries}
    assert {n for n, s in status.items() if s == "dropped"} == set(sc.upstreamed)
    assert {n for n, s in status.items() if s == "unchanged"} == set(sc.names) - set(sc.upstreamed)
    assert raw.strip()
    entries, _ = P.range_diff(t, sc.v1_0, sc.context)
    changed = [e for e in entries if e.status == "changed"]
    assert [e.name for e in changed] == [sc.names[9]]
    assert "/* cold */" in changed[0].interdiff
    assert all(e.status == "unchanged" for e in entries if e.name != sc.names[9])
    entries, _ = P.range_diff(t, sc.v1_0, sc.conflict)
    assert [(e.name, e.status) for e in entries if e.status != "unchanged"] == [(sc.names[4], "fails-new")]


def test_apply_series_on_an_exported_tree_for_the_build(sc, tmp_path):
    spec = sc.spec()
    cache = tmp_path / "cache"
    tree = export_upstream(spec, cache, tmp_path / "tree")
    assert not (tree / ".git").exists()
    paths = [sc.patches / n for n in sc.names]
    report = P.apply_series(tree, paths)
    assert report.ok and len(report.results) == 12 and (tree / ".git").is_dir()
    tree2 = export_upstream(spec, cache, tmp_path / "tree2")
    results = P.apply_to_export(tree2, sc.patches)
    assert [r.name for r in results] == sc.names
    assert not (tree2 / ".git").exists()
    assert "device = 'musa'" in (tree2 / "src" / "config.py").read_text()
    assert "extras = {'musa': ['torch_musa']}" in (tree2 / "setup.py").read_text()
    bad = export_upstream(sc.spec(sc.conflict, tag="v1.0-conflict"), cache, tmp_path / "tree3")
    with pytest.raises(UserError) as exc:
        P.apply_series(bad, paths)
    assert sc.names[4] in exc.value.message and "src/kernels.c" in exc.value.message
    assert exc.value.file == str(paths[4])


def test_git_environment_of_the_user_does_not_change_exported_bytes(sc, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[format]\n\tsignature = custom\n\tnumbered = true\n[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n\talgorithm = histogram\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    assert P.export_check(target(sc)) == []
    assert os.environ["GIT_CONFIG_GLOBAL"].endswith(".gitconfig")
