"""Series files, names, numbering and the series hash: plain files, no git."""

from __future__ import annotations

import hashlib

import pytest

from stackforge.errors import UserError
from stackforge.patches.series import (
    HISTORY_HEADING,
    Entry,
    Series,
    drop_entries,
    flatten,
    layer_dirs,
    parse_series_text,
    patch_name,
    read_series,
    render_series,
    renumber,
    renumbered,
    sanitize_subject,
    series_hash,
    write_series,
)

SERIES_TEXT = """# header comment

0001-Core-first.patch
# about the second
0002-Core-second.patch   # trailing comment
0003-Docs-third.patch

# footer note
"""


def make_dir(tmp_path, names, text=None):
    d = tmp_path / "patches" / "demo"
    d.mkdir(parents=True)
    for n in names:
        (d / n).write_bytes(f"patch {n}\n".encode())
    (d / "series").write_text(text if text is not None else "\n".join(names) + "\n")
    return d


def test_parse_series_keeps_order_comments_and_lines():
    s = parse_series_text(SERIES_TEXT, dir=__import__("pathlib").Path("x"))
    assert s.names == ["0001-Core-first.patch", "0002-Core-second.patch", "0003-Docs-third.patch"]
    assert [e.line for e in s.entries] == [3, 5, 6]
    assert s.header == ["# header comment", ""]
    assert s.entries[1].lead == ["# about the second"]
    assert s.footer == ["", "# footer note"]
    assert [e.number for e in s.entries] == [1, 2, 3]


def test_render_series_round_trips_apart_from_inline_comments():
    s = parse_series_text(SERIES_TEXT, dir=__import__("pathlib").Path("x"))
    again = parse_series_text(render_series(s), dir=s.dir)
    assert again.names == s.names and again.header == s.header and again.footer == s.footer


def test_entry_with_options_is_an_error_naming_the_line(tmp_path):
    d = make_dir(tmp_path, [], text="# c\n0001-A-b.patch -p1\n")
    with pytest.raises(UserError) as exc:
        read_series(d)
    assert exc.value.line == 2 and str(d / "series") == str(exc.value.file)


def test_missing_series_file_is_a_user_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as exc:
        read_series(tmp_path / "empty")
    assert "no series file" in exc.value.message and exc.value.fix


@pytest.mark.parametrize(
    "subject,expected",
    [
        ("Core: add a musa device kind", "Core-add-a-musa-device-kind"),
        ("MUSA: vllm.utils.diffusion", "MUSA-vllm.utils.diffusion"),
        ("Fix  (weird)   spacing!", "Fix-weird-spacing"),
        ("dots.. and ...more", "dots.-and-.more"),
    ],
)
def test_sanitize_subject_like_format_patch(subject, expected):
    assert sanitize_subject(subject) == expected


def test_patch_name_and_renumbered():
    assert patch_name(7, "Docs: say hello") == "0007-Docs-say-hello.patch"
    assert renumbered("0003-Core-x.patch", 12) == "0012-Core-x.patch"
    assert renumbered("Core-x.patch", 1) == "0001-Core-x.patch"
    assert (
        patch_name(1, "Area: " + "word " * 30 + "end.")
        == "0001-Area-word-word-word-word-word-word-word-word-word-wo.patch"
    )


def test_series_hash_covers_order_and_bytes_not_comments(tmp_path):
    names = ["0001-A-a.patch", "0002-B-b.patch"]
    d = make_dir(tmp_path, names)
    h1 = series_hash(d)
    # The documented construction, recomputed independently: a version line, the layer, then name + sha256 per patch.
    expected = hashlib.sha256(b"stackforge-series-v1\nlayer base\n")
    for name in names:
        expected.update(f"{name} {hashlib.sha256((d / name).read_bytes()).hexdigest()}\n".encode())
    assert h1 == expected.hexdigest()
    assert series_hash(d / "series") == h1
    # Comments do not count.
    (d / "series").write_text("# a comment\n" + "\n".join(names) + "\n# Applied-Upstream: x\n")
    assert series_hash(d) == h1
    # Order counts.
    (d / "series").write_text("\n".join(reversed(names)) + "\n")
    h2 = series_hash(d)
    assert h2 != h1
    (d / "series").write_text("\n".join(names) + "\n")
    # Bytes count.
    (d / names[1]).write_bytes(b"patch changed\n")
    assert series_hash(d) not in (h1, h2)


def test_series_hash_is_sha256_over_a_documented_stream(tmp_path):
    d = make_dir(tmp_path, ["0001-A-a.patch"])
    digest = hashlib.sha256(b"patch 0001-A-a.patch\n").hexdigest()
    expected = hashlib.sha256(b"stackforge-series-v1\nlayer base\n" + f"0001-A-a.patch {digest}\n".encode()).hexdigest()
    assert series_hash(d) == expected


def test_series_hash_missing_patch_names_the_series_line(tmp_path):
    d = make_dir(tmp_path, ["0001-A-a.patch"])
    (d / "series").write_text("0001-A-a.patch\n0002-B-b.patch\n")
    with pytest.raises(UserError) as exc:
        series_hash(d)
    assert exc.value.line == 2 and "0002-B-b.patch" in exc.value.message


def test_series_hash_with_a_layer_differs_from_base_alone(tmp_path):
    base = make_dir(tmp_path, ["0001-A-a.patch"])
    top = tmp_path / "overlays" / "ov" / "patches" / "demo"
    top.mkdir(parents=True)
    (top / "0002-L-l.patch").write_bytes(b"layer\n")
    (top / "series").write_text("0002-L-l.patch\n")
    assert series_hash(base, top) != series_hash(base)


def test_renumber_after_insert_keeps_names_and_bytes(tmp_path):
    names = ["0001-A-a.patch", "0002-B-b.patch", "0003-C-c.patch"]
    d = make_dir(tmp_path, names)
    before = {n.split("-", 1)[1]: (d / n).read_bytes() for n in names}
    # A new patch inserted after the first, numbered by hand like its neighbour.
    (d / "0002-New-thing.patch").write_bytes(b"new\n")
    (d / "series").write_text("# header\n0001-A-a.patch\n0002-New-thing.patch\n0002-B-b.patch\n0003-C-c.patch\n")
    s = read_series(d)
    renames = renumber([s])
    again = read_series(d)
    assert again.names == ["0001-A-a.patch", "0002-New-thing.patch", "0003-B-b.patch", "0004-C-c.patch"]
    assert again.header == ["# header"]
    assert sorted(p.name for p in d.glob("*.patch")) == sorted(again.names)
    assert (d / "0003-B-b.patch").read_bytes() == before["B-b.patch"]
    assert (d / "0004-C-c.patch").read_bytes() == before["C-c.patch"]
    assert [(a.name, b.name) for a, b in renames] == [
        ("0002-B-b.patch", "0003-B-b.patch"),
        ("0003-C-c.patch", "0004-C-c.patch"),
    ]


def test_renumber_runs_on_across_layers(tmp_path):
    base = make_dir(tmp_path, ["0001-A-a.patch", "0003-B-b.patch"])
    top = tmp_path / "top"
    top.mkdir()
    (top / "0009-L-l.patch").write_bytes(b"l\n")
    (top / "series").write_text("0009-L-l.patch\n")
    layers = [read_series(base), read_series(top, layer="ov")]
    renumber(layers)
    assert read_series(base).names == ["0001-A-a.patch", "0002-B-b.patch"]
    assert read_series(top).names == ["0003-L-l.patch"]
    refs = flatten(layers)
    assert [(r.layer, r.position, r.total) for r in refs] == [("base", 1, 3), ("base", 2, 3), ("ov", 3, 3)]


def test_drop_entries_notes_history_and_deletes_files(tmp_path):
    names = ["0001-A-a.patch", "0002-B-b.patch", "0003-C-c.patch"]
    d = make_dir(tmp_path, names)
    s = read_series(d)
    dropped = drop_entries(s, ["0002-B-b.patch"], ["Applied-Upstream: 0002-B-b.patch in upstream commit abc"])
    write_series(s)
    assert dropped == ["0002-B-b.patch"]
    assert not (d / "0002-B-b.patch").exists()
    text = (d / "series").read_text()
    assert HISTORY_HEADING in text and "# Applied-Upstream: 0002-B-b.patch in upstream commit abc" in text
    assert read_series(d).names == ["0001-A-a.patch", "0003-C-c.patch"]
    with pytest.raises(UserError):
        drop_entries(read_series(d), ["0009-X-x.patch"])


def test_layer_dirs_requires_the_overlay_range(tmp_path):
    (tmp_path / "overlays" / "jev" / "patches" / "vllm").mkdir(parents=True)
    dirs = layer_dirs(tmp_path, "vllm", "patches/vllm", ["jev"])
    assert dirs == [
        ("base", tmp_path / "patches" / "vllm"),
        ("jev", tmp_path / "overlays" / "jev" / "patches" / "vllm"),
    ]
    with pytest.raises(UserError) as exc:
        layer_dirs(tmp_path, "vllm", "patches/vllm", ["other"])
    assert "other" in exc.value.message


def test_entry_number_parsing():
    assert Entry("0172-MUSA-vllm.config.vllm.patch", 1).number == 172
    assert Entry("README.md", 1).number is None
    assert len(Series(dir=__import__("pathlib").Path("."))) == 0
