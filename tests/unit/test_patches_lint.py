"""Patch parsing and lint findings over hand-made series directories (no git)."""

from __future__ import annotations

import json
from pathlib import Path

from stackforge.patches.index import render_index, write_index
from stackforge.patches.lint import (
    DEFAULT_TRACKER_PATTERN,
    lint_layers,
    lint_repository,
    lint_series,
)
from stackforge.patches.patchfile import parse_patch
from stackforge.patches.series import read_series

ZERO = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
BLOB_A = "a" * 40
BLOB_B = "b" * 40


def patch_text(
    subject: str, body: str, file: str, added: list[str], *, start: int = 10, context=("ctx 1", "ctx 2")
) -> str:
    n_old = len(context)
    n_new = len(context) + len(added)
    lines = [
        ZERO,
        "From: Dev <dev@example.org>",
        "Date: Mon, 2 Feb 2026 10:02:00 +0800",
        f"Subject: {subject}",
        "",
    ]
    if body:
        lines += body.split("\n") + [""]
    lines += [
        f"diff --git a/{file} b/{file}",
        f"index {BLOB_A}..{BLOB_B} 100644",
        f"--- a/{file}",
        f"+++ b/{file}",
        f"@@ -{start},{n_old} +{start},{n_new} @@",
        f" {context[0]}",
        *[f"+{a}" for a in added],
        f" {context[1]}",
    ]
    return "\n".join(lines) + "\n"


def make_series(root: Path, patches: dict[str, str], name: str = "demo", index: bool = True) -> Path:
    d = root / "patches" / name
    d.mkdir(parents=True)
    for fname, text in patches.items():
        (d / fname).write_text(text)
    (d / "series").write_text("# the demo series\n" + "\n".join(patches) + "\n")
    if index:
        write_index(read_series(d))
    return d


def codes(findings):
    return sorted(f.code for f in findings)


# --- parsing ------------------------------------------------------------------------


def test_parse_patch_headers_body_hunks_and_line_numbers(tmp_path):
    text = patch_text(
        "[PATCH] Engine: pick =?UTF-8?q?m=C3=BCsa?= backend",
        "Why this is needed.\n\nSecond paragraph.\n\nSigned-off-by: Dev <dev@example.org>",
        "src/engine.py",
        ["    a = 1", "    b = 2"],
        start=20,
    )
    p = tmp_path / "0001-Engine-x.patch"
    p.write_text(text)
    pf = parse_patch(p)
    assert pf.from_line == ZERO
    assert pf.subject == "Engine: pick müsa backend"
    assert pf.subject_line == 4
    assert pf.description == "Why this is needed.\n\nSecond paragraph."
    assert pf.summary == "Why this is needed."
    assert [t for _, t in pf.trailers] == ["Signed-off-by: Dev <dev@example.org>"]
    assert pf.touched_files() == ["src/engine.py"]
    added = pf.added_lines()
    assert [(a.file, a.line, a.text) for a in added] == [
        ("src/engine.py", 21, "    a = 1"),
        ("src/engine.py", 22, "    b = 2"),
    ]
    # patch_line points at the "+" line in the .patch file.
    lines = text.splitlines()
    assert lines[added[0].patch_line - 1] == "+    a = 1"
    h = pf.hunks[0]
    assert (h.old_start, h.old_len, h.new_start, h.new_len) == (20, 2, 20, 4)
    assert h.preimage == ["ctx 1", "ctx 2"]


def test_parse_folded_subject_and_new_and_deleted_files(tmp_path):
    text = "\n".join(
        [
            ZERO,
            "From: Dev <d@e>",
            "Date: x",
            "Subject: Build: a subject that",
            " continues here",
            "",
            "Body.",
            "",
            "diff --git a/new.txt b/new.txt",
            "new file mode 100644",
            f"index {'0' * 40}..{BLOB_B}",
            "--- /dev/null",
            "+++ b/new.txt",
            "@@ -0,0 +1,2 @@",
            "+one",
            "+two",
            "diff --git a/old.txt b/old.txt",
            "deleted file mode 100644",
            f"index {BLOB_A}..{'0' * 40}",
            "--- a/old.txt",
            "+++ /dev/null",
            "@@ -1 +0,0 @@",
            "-gone",
            "",
        ]
    )
    p = tmp_path / "p.patch"
    p.write_text(text)
    pf = parse_patch(p)
    assert pf.subject == "Build: a subject that continues here"
    assert [(f.old_path, f.new_path) for f in pf.files] == [(None, "new.txt"), ("old.txt", None)]
    assert [(a.file, a.line) for a in pf.added_lines()] == [("new.txt", 1), ("new.txt", 2)]
    assert pf.hunks[1].file == "old.txt"


# --- lint -----------------------------------------------------------------------------


def test_clean_series_has_no_findings(tmp_path):
    make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text("Core: one", "Why one.", "src/a.py", ["x = 1  # plain comment"]),
            "0002-Docs-two.patch": patch_text("Docs: two", "Why two.", "docs/guide.md", ["More text."]),
        },
    )
    assert lint_repository(tmp_path) == []


def test_tracker_id_in_added_comment_doc_and_message(tmp_path):
    d = make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text(
                "Core: one", "Why one.", "src/a.py", ["x = 1", "# see MUSA-100042 for the story"]
            ),
            "0002-Docs-two.patch": patch_text("Docs: two", "Why two.", "docs/guide.md", ["Tracked as MUSA-100042."]),
            "0003-Kernels-three.patch": patch_text(
                "Kernels: three (MUSA-100042)",
                "Fixes MUSA-100042.",
                "csrc/k.cu",
                ["int k = 1; // MUSA-100042", "/* MUSA-100042 */"],
            ),
            "0004-Core-code.patch": patch_text("Core: code", "Only code.", "src/b.py", ["NAME = 'MUSA-100042'"]),
        },
    )
    findings = [f for f in lint_repository(tmp_path) if f.code == "tracker-id"]
    where = sorted((f.patch, f.source_file or "(message)", f.source_line or 0) for f in findings)
    assert where == [
        ("0001-Core-one.patch", "src/a.py", 12),
        ("0002-Docs-two.patch", "docs/guide.md", 11),
        ("0003-Kernels-three.patch", "(message)", 0),  # subject
        ("0003-Kernels-three.patch", "(message)", 0),  # body
        ("0003-Kernels-three.patch", "csrc/k.cu", 11),
        ("0003-Kernels-three.patch", "csrc/k.cu", 12),
    ]
    # Code that is not a comment is not flagged; every finding names the .patch file and a line in it.
    assert not any(f.patch == "0004-Core-code.patch" for f in findings)
    for f in findings:
        assert f.file.endswith(f.patch) and f.line
        text = (d / f.patch).read_text().splitlines()[f.line - 1]
        assert "MUSA-100042" in text
    rendered = findings[0].render()
    assert "MUSA-100042" in rendered and findings[0].patch in rendered


def test_tracker_pattern_is_configurable(tmp_path):
    make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text(
                "Core: one", "Why one.", "src/a.py", ["# ticket ABC-12", "# see MUSA-100042"]
            ),
        },
    )
    default = [f for f in lint_repository(tmp_path) if f.code == "tracker-id"]
    assert len(default) == 1
    custom = [f for f in lint_repository(tmp_path, tracker_pattern=r"\bABC-\d+\b") if f.code == "tracker-id"]
    assert len(custom) == 1 and "ABC-12" in custom[0].message
    assert DEFAULT_TRACKER_PATTERN


def test_python_docstring_lines_count_as_comments(tmp_path):
    make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text(
                "Core: one", "Why.", "src/a.py", ['"""Helper.', "", "Tracked in MUSA-100042.", '"""', "y = 2"]
            ),
        },
    )
    findings = [f for f in lint_repository(tmp_path) if f.code == "tracker-id"]
    assert [(f.source_file, f.source_line) for f in findings] == [("src/a.py", 13)]


def test_trailing_whitespace_subject_description_and_form(tmp_path):
    no_body = patch_text("Core: one", "", "src/a.py", ["x = 1   "])
    not_zero = patch_text("Core: two", "Why.", "src/b.py", ["y = 2"]).replace(
        ZERO, "From 1234567890123456789012345678901234567890 Mon Sep 17 00:00:00 2001"
    )
    short_index = patch_text("Core: three", "Why.", "src/c.py", ["z = 3"]).replace(
        f"index {BLOB_A}..{BLOB_B}", "index aaaaaaa..bbbbbbb"
    )
    signed = patch_text("Core: four", "Why.", "src/d.py", ["w = 4"]) + "-- \n2.39.5\n"
    make_series(
        tmp_path,
        {
            "0001-Core-one.patch": no_body,
            "0002-Core-two.patch": not_zero,
            "0003-Core-three.patch": short_index,
            "0004-Core-four.patch": signed,
        },
    )
    fs = lint_repository(tmp_path)
    by = {(f.code, f.patch) for f in fs}
    assert ("trailing-whitespace", "0001-Core-one.patch") in by
    assert ("no-description", "0001-Core-one.patch") in by
    assert ("not-export-form", "0002-Core-two.patch") in by
    assert ("not-export-form", "0003-Core-three.patch") in by
    assert ("not-export-form", "0004-Core-four.patch") in by
    ws = next(f for f in fs if f.code == "trailing-whitespace")
    assert (ws.source_file, ws.source_line) == ("src/a.py", 11)


def test_series_and_directory_agree_both_ways(tmp_path):
    d = make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text("Core: one", "Why.", "a.py", ["x = 1"]),
            "0002-Core-two.patch": patch_text("Core: two", "Why.", "b.py", ["y = 1"]),
        },
    )
    (d / "0003-Core-stray.patch").write_text(patch_text("Core: stray", "Why.", "c.py", ["z"]))
    (d / "series").write_text("0001-Core-one.patch\n0002-Core-two.patch\n0001-Core-one.patch\n0004-Core-gone.patch\n")
    fs = lint_series(read_series(d), start=1)
    got = {(f.code, f.patch, f.line) for f in fs if f.code in ("unlisted-patch", "duplicate-entry", "missing-patch")}
    assert got == {
        ("unlisted-patch", "0003-Core-stray.patch", None),
        ("duplicate-entry", "0001-Core-one.patch", 3),
        ("missing-patch", "0004-Core-gone.patch", 4),
    }


def test_numbering_must_be_contiguous_and_names_well_formed(tmp_path):
    d = make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text("Core: one", "Why.", "a.py", ["x"]),
            "0003-Core-three.patch": patch_text("Core: three", "Why.", "b.py", ["y"]),
            "badname.patch": patch_text("Core: bad", "Why.", "c.py", ["z"]),
        },
    )
    fs = lint_series(read_series(d), start=1)
    numbering = [f for f in fs if f.code == "numbering"]
    assert [(f.patch, f.line) for f in numbering] == [("0003-Core-three.patch", 3)]
    assert "0002" in numbering[0].message
    assert [f.patch for f in fs if f.code == "bad-name"] == ["badname.patch"]


def test_layered_range_numbering_continues_after_the_base(tmp_path):
    make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text("Core: one", "Why.", "a.py", ["x"]),
            "0002-Core-two.patch": patch_text("Core: two", "Why.", "b.py", ["y"]),
        },
    )
    top = tmp_path / "overlays" / "jev" / "patches" / "demo"
    top.mkdir(parents=True)
    (top / "0004-MUSA-layered.patch").write_text(patch_text("MUSA: layered", "Why.", "c.py", ["z"]))
    (top / "series").write_text("0004-MUSA-layered.patch\n")
    write_index(read_series(top, layer="jev"))
    fs = lint_repository(tmp_path)
    assert [(f.code, f.layer, f.patch) for f in fs] == [("numbering", "jev", "0004-MUSA-layered.patch")]
    assert "0003" in fs[0].message and "layer jev" in fs[0].render()
    (top / "0004-MUSA-layered.patch").rename(top / "0003-MUSA-layered.patch")
    (top / "series").write_text("0003-MUSA-layered.patch\n")
    write_index(read_series(top, layer="jev"))
    assert lint_repository(tmp_path) == []
    assert lint_layers([read_series(tmp_path / "patches" / "demo"), read_series(top, layer="jev")]) == []


def test_index_is_generated_and_checked(tmp_path):
    d = make_series(
        tmp_path,
        {
            "0001-Core-one.patch": patch_text(
                "Core: one | pipe", "First line of why.\nstill first paragraph.\n\nMore.", "a.py", ["x"]
            )
        },
        index=False,
    )
    assert [f.code for f in lint_repository(tmp_path)] == ["index-missing"]
    s = read_series(d)
    text = render_index(s)
    assert (
        "| 0001 | [0001-Core-one.patch](0001-Core-one.patch) | Core: one \\| pipe | First line of why. still first paragraph. |"
        in text
    )
    assert "do not edit" in text
    write_index(s)
    assert lint_repository(tmp_path) == []
    (d / "README.md").write_text(text + "hand edit\n")
    assert [f.code for f in lint_repository(tmp_path)] == ["index-stale"]


def test_series_comments_are_checked_for_tracker_ids(tmp_path):
    d = make_series(tmp_path, {"0001-Core-one.patch": patch_text("Core: one", "Why.", "a.py", ["x"])})
    (d / "series").write_text("# see MUSA-100042\n0001-Core-one.patch\n")
    fs = lint_repository(tmp_path)
    assert [(f.code, f.line) for f in fs] == [("tracker-id", 1)]
    assert json.dumps([f.to_json() for f in fs])


def test_missing_series_file_is_a_finding(tmp_path):
    (tmp_path / "patches" / "orphan").mkdir(parents=True)
    fs = lint_repository(tmp_path)
    assert [f.code for f in fs] == ["no-series"]
