"""An inventory read back (a build's evidence, a file named to `diff --inventory`, an image's own record) is read
bounded and typed: a FIFO, a link to /dev/zero, deep or malformed JSON or a wrong shape is one error naming the
file and the field, with no traceback."""

from __future__ import annotations

import json

import pytest

from stackforge.builder.records import inventory
from stackforge.errors import UserError
from tests.fixtures import hostile_files as hf
from tests.fixtures.stack_support import make_root, run_cli

GOOD = {"dists": [{"name": "torch", "version": "2.11.0.post2+musa5.2.0", "index": "mthreads"}], "phases": []}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"dists": {"torch": "2.11"}}, "dists: Input should be a valid list"),
        ({"dists": [{"name": "torch", "version": 2.11}]}, "dists[0].version: Input should be a valid string"),
        ({"dists": [{"version": "1"}]}, "dists[0].name: Field required"),
        (
            {"dists": [], "phases": [{"phase": "pypi", "preserve": "PASS"}]},
            "phases[0].preserve: Input should be a valid list",
        ),
        ({}, "dists: Field required"),
    ],
)
def test_an_inventory_of_the_wrong_shape_names_the_field(data, field):
    with pytest.raises(UserError) as err:
        inventory.parse(json.dumps(data), source="evidence/inventory.json")
    assert err.value.render().startswith(f"error: evidence/inventory.json: inventory: {field}")


@pytest.mark.parametrize("text", hf.HOSTILE_JSON)
def test_json_that_is_no_inventory_is_one_error(text):
    with pytest.raises(UserError) as err:
        inventory.parse(text, source="x.json")
    assert err.value.render().startswith("error: x.json: inventory") and "\n" not in err.value.message


def test_a_good_inventory_reads_as_plain_data():
    data = inventory.parse(json.dumps(GOOD), source="x")
    assert data["dists"][0]["name"] == "torch" and data["dists"][0]["sha256"] is None and data["phases"] == []


@pytest.mark.parametrize(
    ("maker", "said"),
    [("fifo", "not a regular file"), ("zero_link", "symbolic link"), ("deep_json", "nests"), ("not_utf8", "not UTF-8")],
)
def test_diff_inventory_of_a_hostile_file_is_one_error_line(tmp_path, capsys, maker, said):
    root = make_root(tmp_path / "repo")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    bad = hf.SPECIALS[maker](tmp_path / "inventory.json")
    rc, out, err = hf.within(10, run_cli, capsys, root, "diff", "--inventory", str(good), str(bad))
    assert rc != 0 and out == ""
    assert err.startswith(f"error: {bad}: ") and said in err.splitlines()[0] and "Traceback" not in err


def test_an_evidence_directory_whose_inventory_is_a_fifo_does_not_hang(tmp_path):
    hf.fifo(tmp_path / "evidence" / "inventory.json")
    with pytest.raises(UserError, match="FIFO"):
        hf.within(10, inventory.load, str(tmp_path / "evidence"))


def test_names_from_an_inventory_reach_the_terminal_without_escapes():
    evil = {"dists": [{"name": "torch\x1b[2J", "version": "2.11\x1b]0;owned\x07", "index": "\x1b[31mpypi"}]}
    d = inventory.diff({"dists": []}, inventory.parse(json.dumps(evil), source="x"))
    text = inventory.to_text(d)
    assert "\x1b" not in text and "\x07" not in text and text.startswith("+ torch 2.11 (pypi)")
    assert "\\u001b" in d.to_json()  # JSON keeps it, escaped
