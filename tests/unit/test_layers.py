"""The floors of the package (scripts/layers.py): the real tree keeps them, and an import that runs up or
sideways is caught wherever it sits."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "layers.py"


def _layers():
    spec = importlib.util.spec_from_file_location("layers", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["layers"] = module
    spec.loader.exec_module(module)
    return module


layers = _layers()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "stackforge"
    shutil.copytree(REPO / "tools" / "stackforge", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_the_package_keeps_its_floors():
    assert [str(v) for v in layers.check(REPO / "tools" / "stackforge")] == []


def test_every_unit_of_the_package_is_on_a_floor():
    package = REPO / "tools" / "stackforge"
    units = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    units |= {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    assert units == {u for floor in layers.FLOORS for u in floor}


def test_an_upward_import_at_module_level_fails(tree: Path):
    _append(tree / "stack" / "rules.py", "\nfrom stackforge.builder import run  # noqa\n")
    found = layers.check(tree)
    assert [(v.path.name, v.source, v.target) for v in found] == [("rules.py", "stack", "builder")]
    assert "up from floor 2 to 4" in str(found[0])


def test_an_upward_import_inside_a_function_fails(tree: Path):
    _append(
        tree / "clients" / "git.py", "\n\ndef _late():\n    from stackforge.publish import record\n    return record\n"
    )
    found = layers.check(tree)
    assert [(v.source, v.target) for v in found] == [("clients", "publish")]


def test_a_sideways_import_between_steps_of_one_floor_fails(tree: Path):
    _append(tree / "publish" / "record.py", "\nfrom stackforge.freshness import lines  # noqa\n")
    assert [(v.source, v.target, v.why) for v in layers.check(tree)] == [
        ("publish", "freshness", "sideways on floor 5")
    ]


def test_a_relative_upward_import_fails(tree: Path):
    _append(tree / "patches" / "series.py", "\nfrom ..flows import nightly  # noqa\n")
    assert [(v.source, v.target) for v in layers.check(tree)] == [("patches", "flows")]


def test_annotations_only_imports_do_not_count(tree: Path):
    _append(tree / "clients" / "git.py", "\nif TYPE_CHECKING:\n    from stackforge.builder.plan.plan import Plan\n")
    assert layers.check(tree) == []


def test_a_new_unit_must_be_placed_on_a_floor(tree: Path):
    (tree / "plugins").mkdir()
    (tree / "plugins" / "__init__.py").write_text("")
    assert next(v.why for v in layers.check(tree)).startswith("a unit on no floor")


def test_the_script_exits_non_zero_and_names_the_file(tree: Path):
    _append(tree / "errors.py", "\nfrom stackforge.stack import model  # noqa\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tree)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "errors.py:" in proc.stdout and "errors imports stack: up from floor 0 to 2" in proc.stdout


def test_every_room_of_builder_is_on_a_floor_and_every_module_in_a_room():
    builder = REPO / "tools" / "stackforge" / "builder"
    rooms = {p.name for p in builder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert rooms == {room for floor in layers.ROOMS["builder"] for room in floor}
    assert [p.name for p in builder.glob("*.py")] == ["__init__.py"]


def test_the_architecture_page_lists_the_rooms_as_the_check_does():
    """docs/architecture.md's table of builder/'s rooms gives each room the floor scripts/layers.py gives it."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("### Rooms of builder/", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([a-z_]+)/` \|", section, re.M)
    assert sorted((int(floor), room) for floor, room in rows) == sorted(
        (i, room) for i, floor in enumerate(layers.ROOMS["builder"]) for room in floor
    )


def test_an_upward_import_between_rooms_of_builder_fails(tree: Path):
    _append(tree / "builder" / "plan" / "render.py", "\nfrom stackforge.builder.run import gate  # noqa\n")
    found = layers.check(tree)
    assert [(v.path.name, v.source, v.target) for v in found] == [("render.py", "builder.plan", "builder.run")]
    assert "up from room floor 0 to 5 of builder/" in str(found[0])


def test_a_relative_upward_import_between_rooms_inside_a_function_fails(tree: Path):
    _append(
        tree / "builder" / "locks" / "locks.py",
        "\n\ndef _late():\n    from ..context import prepare\n    return prepare\n",
    )
    assert [(v.source, v.target) for v in layers.check(tree)] == [("builder.locks", "builder.context")]


def test_a_sideways_import_between_rooms_of_one_floor_fails(tree: Path):
    _append(tree / "builder" / "mirror" / "apt.py", "\nfrom stackforge.builder.records import sbom  # noqa\n")
    assert [(v.source, v.target, v.why) for v in layers.check(tree)] == [
        ("builder.mirror", "builder.records", "sideways on room floor 1 of builder/")
    ]


def test_imports_down_the_rooms_within_a_room_and_for_annotations_pass(tree: Path):
    _append(
        tree / "builder" / "run" / "gate.py",
        "\nfrom stackforge.builder import plan  # noqa\nfrom stackforge.builder.records import sbom  # noqa\n"
        "from stackforge.builder.run import bake  # noqa\n",
    )
    _append(
        tree / "builder" / "plan" / "phases.py",
        "\nif TYPE_CHECKING:\n    from stackforge.builder.locks.locks import Lock\n",
    )
    assert layers.check(tree) == []


def test_a_module_outside_every_room_of_builder_fails(tree: Path):
    (tree / "builder" / "helpers.py").write_text('"""Helpers."""\n')
    found = layers.check(tree)
    assert [(v.path.name, v.source) for v in found] == [("helpers.py", "builder.helpers")]
    assert found[0].why.startswith("a module outside every room of builder/")


def test_a_new_room_must_be_placed_on_a_floor(tree: Path):
    (tree / "builder" / "extra").mkdir()
    (tree / "builder" / "extra" / "__init__.py").write_text("")
    (tree / "builder" / "extra" / "tool.py").write_text("from stackforge.builder.plan import plan  # noqa\n")
    assert {v.why for v in layers.check(tree)} == {
        "a room on no floor: add it to ROOMS['builder'] in scripts/layers.py"
    }


def test_no_raw_engine_call_outside_the_clients():
    assert [str(c) for c in layers.raw_engine_calls(REPO / "tools" / "stackforge")] == []


def test_a_raw_engine_call_outside_the_clients_fails(tree: Path):
    lines = (tree / "builder" / "run" / "gate.py").read_text().count("\n")
    _append(tree / "builder" / "run" / "gate.py", "\n\ndef tag(engine):\n    engine.cli('tag', 'a', 'b', timeout=60)\n")
    _append(tree / "flows" / "nightly.py", "\n\ndef bake(engine, cmd):\n    return engine.stream(cmd)\n")
    _append(tree / "clients" / "git.py", "\n\ndef inside(engine):\n    engine.cli('version')\n")
    found = layers.raw_engine_calls(tree)
    assert [(c.path.name, c.line, c.method) for c in found] == [
        ("gate.py", lines + 4, "cli"),
        ("nightly.py", found[1].line, "stream"),
    ]
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tree)], capture_output=True, text=True)
    assert proc.returncode == 1 and "gate.py" in proc.stdout and "raw engine call (.cli(…))" in proc.stdout
    assert "git.py" not in proc.stdout


def test_the_docker_sdk_outside_the_clients_fails(tree: Path):
    module = tree / "publish" / "oci.py"
    lines = module.read_text().count("\n")
    _append(
        module,
        "\n\ndef attrs(engine, ref):\n"  # lines + 3
        "    return engine.sdk().images.get(ref).attrs\n"
        "\n\ndef errors():\n"  # lines + 7
        "    import docker.errors\n"
        "    from docker import types  # noqa\n"
        "    import importlib\n"
        "    return importlib.import_module('docker.models'), __import__('docker'), docker.errors\n",
    )
    _append(tree / "flows" / "nightly.py", "\nfrom docker.errors import NotFound  # noqa\n")
    _append(
        tree / "smoke" / "run.py", "\nimport dockerfile_parse, json as docker  # noqa\nfrom .docker import x  # noqa\n"
    )
    _append(
        tree / "clients" / "layerstore.py",
        "\n\ndef inside(engine):\n    import docker\n    return engine.sdk(), docker\n",
    )
    found = layers.raw_engine_calls(tree)
    assert [(c.path.name, c.line - lines, c.method) for c in found if c.path.name == "oci.py"] == [
        ("oci.py", 4, "sdk"),
        ("oci.py", 8, "import docker.errors"),
        ("oci.py", 9, "import docker"),
        ("oci.py", 11, "import docker.models"),
        ("oci.py", 11, "import docker"),
    ]
    assert [(c.path.name, c.method) for c in found if c.path.name != "oci.py"] == [
        ("nightly.py", "import docker.errors")
    ]
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tree)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"oci.py:{lines + 4}: a raw engine call (.sdk(…)) outside clients/" in proc.stdout
    assert (
        "nightly.py:" in proc.stdout
        and "a use of the docker SDK (import docker.errors) outside clients/" in proc.stdout
    )
    assert "layerstore.py" not in proc.stdout and "run.py" not in proc.stdout
