"""The one bounded reader of outside input: special files, links, sizes, nesting, encodings, shapes, names that
become paths, what a container wrote, output directories and terminal text."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from stackforge import safeio
from stackforge.errors import UserError
from stackforge.safeio import Malformed
from tests.fixtures import hostile_files as hf


@pytest.mark.parametrize("maker", ["fifo", "zero_link"])
def test_special_files_are_refused_at_once(tmp_path, maker):
    path = hf.SPECIALS[maker](tmp_path / "summary.json")
    with pytest.raises(Malformed, match="not a regular file") as err:
        hf.within(5, safeio.read_bytes, path, limit=1 << 20, what="summary")
    assert err.value.exit_code == 1 and str(path) in err.value.render()


def test_a_directory_or_missing_file_is_one_error(tmp_path):
    with pytest.raises(Malformed, match="not a regular file|directory"):
        safeio.read_bytes(tmp_path, limit=10)
    with pytest.raises(Malformed, match="does not exist"):
        safeio.read_bytes(tmp_path / "absent", limit=10)


def test_the_size_cap_is_counted_while_reading(tmp_path):
    path = hf.huge(tmp_path / "big.json", 5 << 20)
    with pytest.raises(Malformed, match=r"larger than 1048576 bytes"):
        safeio.read_bytes(path, limit=1 << 20)
    small = tmp_path / "small"
    small.write_bytes(b"x" * 100)
    assert safeio.read_bytes(small, limit=100) == b"x" * 100
    with pytest.raises(Malformed):
        safeio.read_bytes(small, limit=99)


def test_links_refused_or_confined(tmp_path):
    root = tmp_path / "night"
    link = hf.link_out(root / "evidence" / "inventory.json")
    with pytest.raises(Malformed, match="leads out of"):
        safeio.read_bytes(link, limit=1 << 20, root=root)
    with pytest.raises(Malformed, match="symbolic link"):
        safeio.read_bytes(link, limit=1 << 20, follow=False)
    inner = root / "real.json"
    inner.write_text("{}")
    (root / "alias.json").symlink_to(inner)
    assert safeio.read_bytes(root / "alias.json", limit=10, root=root) == b"{}"  # a link inside its root is fine


def test_text_that_is_not_utf8_is_named_with_its_offset(tmp_path):
    path = hf.not_utf8(tmp_path / "bad.json")
    with pytest.raises(Malformed, match=r"not UTF-8 text \(byte 13"):
        safeio.read_text(path, limit=100)
    with pytest.raises(Malformed, match="not UTF-8"):
        safeio.read_json(path)


def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path):
    path = hf.deep_json(tmp_path / "deep.json")
    with pytest.raises(Malformed, match=r"nests 100000 levels deep \(the limit is 64\)"):
        safeio.read_json(path)
    assert safeio.depth(b'{"a": [1, {"b": "[[[[[["}]}') == 3  # brackets inside strings do not count
    assert safeio.depth(rb'["\"[[[", [[]]]') == 3


@pytest.mark.parametrize("text", ["{", '{"a": 1,}', '{"a": NaN}', '{"a": Infinity}'])
def test_bad_json_is_one_error_line(text):
    with pytest.raises(Malformed) as err:
        safeio.parse_json(text, source="summary.json", what="summary")
    assert err.value.render().startswith("error: summary.json: summary is not JSON")
    assert "\n" not in err.value.message


def test_json_over_its_cap_is_refused_before_parsing():
    with pytest.raises(Malformed, match="larger than 10 bytes"):
        safeio.parse_json(b'{"a": "0123456789"}', source="x", limit=10)


class Row(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    digest: str
    size: int


class Doc(BaseModel):
    model_config = ConfigDict(strict=True)
    rows: list[Row]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([], "(the document)"),
        ({"rows": "x"}, "rows"),
        ({"rows": [{"digest": "sha256:a", "size": "12"}]}, "rows[0].size"),
        ({"rows": [{"digest": "d", "size": 1}, {"digest": 5, "size": 1}]}, "rows[1].digest"),
    ],
)
def test_a_wrong_shape_names_the_field(data, field):
    with pytest.raises(Malformed) as err:
        safeio.validate(Doc, data, source="night/summary.json", what="summary")
    assert err.value.render().startswith(f"error: night/summary.json: summary: {field}:")


def test_load_model_reads_and_validates(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{"rows": [{"digest": "d", "size": 3}]}')
    assert safeio.load_model(Doc, path).rows[0].size == 3


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "../x.yaml",
        "a/../../x",
        "a//b",
        "./a",
        "",
        "a\nb",
        "a\\..\\b",
        "x\x00y",
        None,
        5,
        "a/" * 600 + "b",
    ],
)
def test_names_from_data_that_would_leave_their_root(name):
    with pytest.raises(Malformed, match="name"):
        safeio.relative_name(name, what="stack file", source="REF")


def test_good_names_stay_where_they_are_put(tmp_path):
    assert str(safeio.relative_name("locks/post2.yaml")) == "locks/post2.yaml"
    path = safeio.write_confined(tmp_path, "locks/post2+x.yaml", "text")
    assert path == tmp_path / "locks" / "post2+x.yaml" and path.read_text() == "text"


def test_no_write_through_a_link(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / "locks").symlink_to(outside)
    with pytest.raises(Malformed, match="symbolic link"):
        safeio.write_confined(root, "locks/x.yaml", "evil")
    (root / "file.yaml").symlink_to(outside / "target")
    safeio.write_confined(root, "file.yaml", "replaced")  # the link is replaced, not followed
    assert not (root / "file.yaml").is_symlink() and (root / "file.yaml").read_text() == "replaced"
    with pytest.raises(Malformed, match="symbolic link"):
        safeio.confined(root, "locks")
    assert list(outside.iterdir()) == []


def test_output_dir_refuses_its_inputs_and_what_it_did_not_make(tmp_path):
    nights = tmp_path / "nights"
    (nights / "20261201").mkdir(parents=True)
    (nights / "20261201" / "summary.json").write_text("{}")
    for out in (nights, tmp_path):
        with pytest.raises(UserError, match="writing it would delete what it reads"):
            safeio.OutputDir(out, "history").check([nights])
    with pytest.raises(UserError, match="did not write"):  # a night's own directory is not the site's
        safeio.OutputDir(nights / "20261201", "history").check([nights])
    other = tmp_path / "site"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match="did not write"):
        with safeio.OutputDir(other, "history").staging([nights]):
            pass
    assert (other / "mine.txt").read_text() == "keep"
    # inside the input is allowed (the site under the nights), and a marked directory is replaced
    site = nights / "site"
    for text in ("first", "second"):
        with safeio.OutputDir(site, "history").staging([nights]) as staging:
            (staging / "index.html").write_text(text)
        assert (site / "index.html").read_text() == text and (site / safeio.OUTPUT_MARK).exists()
    assert (nights / "20261201" / "summary.json").exists()
    assert [p.name for p in site.parent.iterdir() if p.name.startswith(".")] == []


def test_output_dir_keeps_the_old_one_when_writing_fails(tmp_path):
    site = tmp_path / "site"
    with safeio.OutputDir(site, "history").staging() as staging:
        (staging / "index.html").write_text("good")
    with pytest.raises(RuntimeError):
        with safeio.OutputDir(site, "history").staging() as staging:
            (staging / "index.html").write_text("half")
            raise RuntimeError("boom")
    assert (site / "index.html").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_output_verb_names_the_verb_whose_mark_a_directory_carries(tmp_path):
    site, night, plain = tmp_path / "site", tmp_path / "night", tmp_path / "plain"
    with safeio.OutputDir(site, "history").staging() as staging:
        (staging / "index.html").write_text("x")
    safeio.OutputDir(night, "nightly").claim()
    plain.mkdir()
    assert [safeio.output_verb(p) for p in (site, night, plain, tmp_path / "absent")] == [
        "history",
        "nightly",
        None,
        None,
    ]
    (plain / safeio.OUTPUT_MARK).write_text("someone else wrote this\n")
    hf.fifo(tmp_path / "fifo" / safeio.OUTPUT_MARK)
    hf.link_out(tmp_path / "linked" / safeio.OUTPUT_MARK, site / safeio.OUTPUT_MARK)
    assert [safeio.output_verb(tmp_path / d) for d in ("plain", "fifo", "linked")] == [None, None, None]


def test_terminal_text_loses_its_escape_sequences():
    evil = "GHSA-1\x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b[2J\x1b[31mred\x1b[0m\x07\x08 line\u2028two\nok\ttab"
    assert safeio.for_terminal(evil) == "GHSA-1link red line two\nok\ttab".replace(" line two", " linetwo")
    assert safeio.for_terminal("a\nb\tc", lines=False) == "a b c"
    assert safeio.for_terminal("PASS digest  r/x:t", lines=False) == "PASS digest  r/x:t"  # verify's columns stay
    assert safeio.clean_tree({"k\x1b[1m": ["v\x9b2J", 3]}) == {"k": ["v2J", 3]}


def test_an_error_quoting_outside_text_reaches_the_terminal_without_escape_sequences(tmp_path, capsys):
    from stackforge.cli.main import main

    nights = tmp_path / "no\x1b]0;owned\x07\x1b[2Jwhere"
    assert main(["history", "--nights", str(nights), "--out", str(tmp_path / "site")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\x1b" not in err and "\x07" not in err


def test_a_model_is_validated_by_one_adapter_made_once():
    safeio.validate(Doc, {"rows": []}, source="a")
    before = safeio._adapter.cache_info().hits
    assert safeio.validate(Doc, {"rows": [{"digest": "d", "size": 1}]}, source="b").rows[0].size == 1
    assert safeio._adapter.cache_info().hits == before + 1
    with pytest.raises(Malformed, match="rows"):
        safeio.validate(Doc, {"rows": "x"}, source="c")  # the kept adapter refuses as a new one does


def test_few_brackets_cannot_nest_deep_and_many_are_counted():
    shallow = '{"a": "' + "[" * 200 + '"}'  # brackets in a string: over the cap in number, not in depth
    assert safeio.parse_json(shallow, source="x") == {"a": "[" * 200}
    with pytest.raises(Malformed, match="nests 65 levels deep"):
        safeio.parse_json("[" * 65 + "]" * 65, source="x")
    assert safeio.parse_json("[" * 64 + "]" * 64, source="x") is not None
