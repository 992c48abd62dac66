"""Stack files are parsed and composed by libyaml when PyYAML has it, the limits checked on the composed tree.

The libyaml path must give exactly what the pure-Python loader gives: the same data, the same positions
for every value and key, the same limits, and the same error for text that fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stackforge.errors import UserError
from stackforge.stack import yamlsrc

REPO = Path(__file__).resolve().parents[2]
STACK_FILES = sorted(
    [*REPO.glob("stacks/*.yaml"), *REPO.glob("bench/stacks/*.yaml"), *REPO.glob("overlays/*/overlay.yaml")]
)


def _load_with(monkeypatch, loaders, path: Path):
    monkeypatch.setattr(yamlsrc, "_LOADERS", loaders)
    try:
        return yamlsrc.load_with_positions(path)
    except UserError as exc:
        return str(exc)


def test_libyaml_is_used_when_pyyaml_has_it():
    assert yaml.__with_libyaml__, "the project's PyYAML wheels ship libyaml"
    assert len(yamlsrc._LOADERS) == 2
    assert issubclass(yamlsrc._LOADERS[0], yaml.cyaml.CParser)
    assert yamlsrc._LOADERS[0].__name__ == "_CLimited", "this libyaml limits nesting: it composes too"
    assert yamlsrc._LOADERS[-1] is yamlsrc._SafeLimited


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.name)
def test_both_parsers_give_the_same_data_and_positions(monkeypatch, path):
    fast = _load_with(monkeypatch, yamlsrc._LOADERS[:1], path)
    slow = _load_with(monkeypatch, (yamlsrc._SafeLimited,), path)
    assert fast.data == slow.data
    assert fast.values == slow.values and fast.keys == slow.keys
    assert len(fast.values) > 15  # every stack file holds values (a child stack only what it changes)


@pytest.mark.parametrize(
    "text",
    [
        "a: [1, 2\nb: 3\n",  # unclosed bracket
        "a: 1\n  b: 2\n",  # bad indentation
        "a: " + "[" * 3000 + "]" * 3000 + "\n",  # libyaml stops at its own depth limit first
        "a: &x [1]\nb: *y\n",  # undefined alias
        "a: 1\na: 2\n",  # duplicate key
        "a: " + "[" * 64 + "]" * 64 + "\n",  # one level over MAX_DEPTH (the top mapping is one)
        "a:\n" + "".join("  " * i + "-\n" for i in range(1, 65)),  # the same, in block style
        "a: &x [1]\nb: [" + ", ".join(["*x"] * (yamlsrc.MAX_ALIASES + 1)) + "]\n",  # one alias too many
        "a: &x [" + ", ".join(["1"] * 1000) + "]\nb: [" + ", ".join(["*x"] * 10) + "]\n",  # expands too far
        "a: &x [1, *x]\n",  # alias inside its own anchor
        "a: &x {b: *x}\n",  # the same, in a mapping
        "a: [" + ", ".join(["1"] * yamlsrc.MAX_NODES) + "]\n",  # one value over MAX_NODES
        "a: !!python/object:os.system x\n",  # a tag the safe loader refuses
        "a: !custom x\n",
        "? [a, b]\n: 1\n",  # a key that is not a scalar
        "a: 2001-02-30\n",  # a timestamp Python cannot hold
        "a: 1\n---\nb: 2\n",  # two documents
        "a: &x 1\nb: &x 2\nc: *x\n",  # an anchor defined again
    ],
    ids=[
        "unclosed",
        "indent",
        "deep",
        "alias",
        "duplicate",
        "depth-65",
        "depth-65-block",
        "aliases",
        "alias-nodes",
        "alias-own-sequence",
        "alias-own-mapping",
        "nodes",
        "python-tag",
        "unknown-tag",
        "key",
        "timestamp",
        "documents",
        "anchor-again",
    ],
)
def test_a_fault_is_reported_as_the_python_loader_reports_it(monkeypatch, tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with_libyaml = _load_with(monkeypatch, yamlsrc._LOADERS, path)
    python_only = _load_with(monkeypatch, (yamlsrc._SafeLimited,), path)
    assert isinstance(python_only, str) and "s.yaml:" in python_only
    assert with_libyaml == python_only


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 63 + "]" * 63 + "\n",  # at MAX_DEPTH: the top mapping and 63 lists under it
        "a: &x [1]\nb: [" + ", ".join(["*x"] * yamlsrc.MAX_ALIASES) + "]\n",  # every alias the budget allows
        "a: &x [" + ", ".join(["1"] * 998) + "]\nb: [" + ", ".join(["*x"] * 10) + "]\n",  # 9990 alias nodes
        "a: [" + ", ".join(["1"] * (yamlsrc.MAX_NODES - 3)) + "]\n",  # MAX_NODES values: mapping, key, list, items
        "base: &b {x: 1, y: [2, 3]}\nc:\n  <<: *b\n  z: 4\nd: [*b, *b]\n",  # merge keys and aliases
        "a: !!set {x, y}\nb: !!omap [{k: 1}]\nc: !!binary aGk=\nd: 2001-02-03 04:05:06\ne: 3.10\nf: .inf\n",
        "a: 0x1F\nb: 0o17\nc: 1_000\nd: ~\ne: yes\nf: 'x: y'\ng: |\n  two\n  lines\n",
        "'ümlaut': 'straße'\nb: [é, {ç: 1}]\n",  # columns count characters
        "",  # empty
    ],
    ids=[
        "depth-64",
        "aliases-100",
        "alias-nodes-9990",
        "nodes-20000",
        "merge",
        "tags",
        "scalars",
        "unicode",
        "empty",
    ],
)
def test_text_within_the_limits_reads_the_same(monkeypatch, tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    fast = _load_with(monkeypatch, yamlsrc._LOADERS[:1], path)
    slow = _load_with(monkeypatch, (yamlsrc._SafeLimited,), path)
    assert not isinstance(slow, str), slow
    assert not isinstance(fast, str), fast
    assert fast.data == slow.data and type(fast.data) is type(slow.data)
    assert fast.values == slow.values and fast.keys == slow.keys


def test_libyaml_tree_is_held_to_the_limits_itself():
    """The composed tree is refused where the Python composer refuses, not only by reading it again."""
    over = [
        "a: " + "[" * 64 + "]" * 64 + "\n",
        "a: &x [1, *x]\n",
        "a: [" + ", ".join(["1"] * yamlsrc.MAX_NODES) + "]\n",
        "a: &x [1]\nb: [" + ", ".join(["*x"] * (yamlsrc.MAX_ALIASES + 1)) + "]\n",
    ]
    for text in over:
        with pytest.raises(yamlsrc.Refused):
            yamlsrc._LOADERS[0](text).get_single_node()
        with pytest.raises(yamlsrc.Refused):
            yamlsrc._SafeLimited(text).get_single_node()


def test_copies_of_a_parsed_file_share_no_mutable_value(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("a: &x {b: [1, {c: 2}]}\nd: *x\n")
    first = yamlsrc.load_with_positions(path)
    first.data["a"]["b"][1]["c"] = 3
    first.data["d"]["b"].append(4)
    again = yamlsrc.load_with_positions(path)
    assert again.data == {"a": {"b": [1, {"c": 2}]}, "d": {"b": [1, {"c": 2}]}}
