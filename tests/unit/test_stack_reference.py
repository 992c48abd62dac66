"""The stack-file reference (docs/stack-reference.md) generated from the model: every field listed with its
description, the checked-in page current, and ``stackforge schema --docs --check`` failing on a stale page."""

from __future__ import annotations

import shutil
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from stackforge.cli.main import main
from stackforge.stack import model, reference

REPO = Path(__file__).resolve().parents[2]


def _models_in(annotation) -> set[type[BaseModel]]:
    """Every model class named anywhere inside a type annotation (lists, dicts, unions, Annotated)."""
    found: set[type[BaseModel]] = set()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.add(annotation)
    for arg in typing.get_args(annotation):
        found |= _models_in(arg)
    return found


def _reachable(root: type[BaseModel]) -> set[type[BaseModel]]:
    todo, seen = [root], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for info in cls.model_fields.values():
            todo += _models_in(info.annotation)
    return seen


def test_every_field_of_every_model_is_a_row_of_the_page():
    page = reference.render()
    listed = {(r.owner, r.field) for r in reference.rows()}
    models = _reachable(model.Stack)
    assert {"Stack", "Agree", "Toolchain", "Condition", "AptMirror", "Healthcheck"} <= {m.__name__ for m in models}
    for cls in models:
        for name in cls.model_fields:
            assert (cls.__name__, name) in listed, f"{cls.__name__}.{name} is not in the reference"
    for row in reference.rows():
        assert f"| `{row.path}` |" in page or f"| [`{row.path}`](#{row.path}) |" in page, row.path


def test_every_model_of_the_module_is_reachable_from_the_stack():
    """A model class the Stack does not reach would be missing from the reference."""
    declared = {
        c for c in vars(model).values() if isinstance(c, type) and issubclass(c, model.Strict) and c is not model.Strict
    }
    assert declared - _reachable(model.Stack) == set()


def test_every_field_has_a_description():
    missing = [r.path for r in reference.rows() if not r.description.strip()]
    assert missing == []


def test_rows_name_paths_types_and_defaults():
    by_path = {r.path: r for r in reference.rows()}
    agree_except = by_path["upstreams.<name>.agree.except"]
    assert agree_except.type == "map of `<package>` → string"
    assert agree_except.default == "{}" and "reason" not in agree_except.default
    assert by_path["platform.arch"].type == "`x86_64` or `aarch64`" and by_path["platform.arch"].default == '"x86_64"'
    assert by_path["name"].default == "required" and by_path["packages"].default == "required"
    assert by_path["gate.probes[].expect"].default == "required"
    assert by_path["targets.<name>.from"].owner == "Target"  # the alias, not the Python name from_
    assert by_path["system.<layer>.packages[].line"].type == "string"
    assert by_path["gate"].default == "(the defaults below)"


def test_cells_cannot_break_the_table():
    assert reference._text("a | b <name> `x <y>` *.patch") == "a \\| b &lt;name&gt; `x <y>` \\*.patch"


def test_the_checked_in_reference_is_current():
    assert not reference.generate(REPO, check=True).stale, "run: stackforge schema --docs"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "stacks", tmp_path / "stacks")
    return tmp_path


def test_check_fails_on_a_stale_page_and_docs_rewrites_it(root: Path, capsys):
    assert main(["--root", str(root), "schema", "--docs", "--check"]) == 1  # no page yet
    assert "docs/stack-reference.md: out of date" in capsys.readouterr().out
    assert main(["--root", str(root), "schema", "--docs"]) == 0
    page = root / reference.REFERENCE
    assert page.read_text(encoding="utf-8") == reference.render()
    assert main(["--root", str(root), "schema", "--docs", "--check"]) == 0
    page.write_text(page.read_text(encoding="utf-8").replace("the exact pip release", "a pip"), encoding="utf-8")
    assert main(["--root", str(root), "schema", "--docs", "--check"]) == 1
    out, err = capsys.readouterr()
    assert "out of date" in out and "fix: run: stackforge schema --docs" in err
    assert "a pip" in page.read_text(encoding="utf-8")  # --check writes nothing


def test_check_without_docs_is_an_error(root: Path, capsys):
    assert main(["--root", str(root), "schema", "--check"]) == 2
    assert "--check needs --docs" in capsys.readouterr().err
