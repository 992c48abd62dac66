"""Stack files are parsed by libyaml when PyYAML has it, under the same Python composer and limits.

The libyaml path must give exactly what the pure-Python loader gives: the same data, the same positions
for every value and key, and the same error for text that fails.
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
    ],
    ids=["unclosed", "indent", "deep", "alias", "duplicate"],
)
def test_a_fault_is_reported_as_the_python_loader_reports_it(monkeypatch, tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with_libyaml = _load_with(monkeypatch, yamlsrc._LOADERS, path)
    python_only = _load_with(monkeypatch, (yamlsrc._SafeLimited,), path)
    assert isinstance(python_only, str) and "s.yaml:" in python_only
    assert with_libyaml == python_only
