"""The CLI starts without its libraries: `--help` of every verb and a `list` answered from its stored rows
import no library module (the model, Jinja, the engine and registry clients, pyelftools)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.stack_support import make_root

TOOLS = Path(__file__).resolve().parents[2] / "tools"

# Third-party libraries and stackforge's own library packages; none may be imported to build the parser.
HEAVY = ("pydantic", "pydantic_core", "jinja2", "docker", "requests", "urllib3", "elftools", "yaml")
HEAVY_OWN = (
    "stackforge.builder",
    "stackforge.publish",
    "stackforge.freshness",
    "stackforge.patches",
    "stackforge.recipes",
    "stackforge.mirror",
    "stackforge.overlay",
    "stackforge.smoke",
    "stackforge.stack.model",
    "stackforge.stack.load",
    "stackforge.stack.rules",
    "stackforge.stack.tags",
)

PROBE = """
import contextlib, io, json, sys
from stackforge.cli.main import main
argvs = json.loads(sys.argv[1])
codes = []
for argv in argvs:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            codes.append(main(argv))
        except SystemExit as exc:
            codes.append(exc.code)
    sys.stderr.write(out.getvalue())
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


def _probe(argvs: list[list[str]], env: dict[str, str] | None = None) -> dict:
    """Run ``main(argv)`` for each argv in a fresh interpreter; the exit codes and the modules it imported."""
    full_env = {**os.environ, "PYTHONPATH": str(TOOLS), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True, env=full_env, check=True
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    result["printed"] = proc.stderr
    return result


def _heavy(modules: list[str]) -> list[str]:
    return [
        m for m in modules if m.split(".")[0] in HEAVY or any(m == own or m.startswith(own + ".") for own in HEAVY_OWN)
    ]


def _verbs() -> list[list[str]]:
    """Every verb and sub-verb of the parser, as argv prefixes."""
    import argparse

    from stackforge.cli.main import build_parser

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append([*prefix, name])
                    found += walk(sub, [*prefix, name])
        return found

    return walk(build_parser(), [])


def test_help_of_every_verb_imports_no_library():
    verbs = _verbs()
    assert ["newest"] in verbs and ["patches", "apply"] in verbs and ["wheel", "inspect"] in verbs
    result = _probe([["--help"]] + [[*v, "--help"] for v in verbs])
    assert set(result["codes"]) == {0}
    assert "usage: stackforge" in result["printed"] and "--train-window" in result["printed"]
    assert _heavy(result["modules"]) == []


def test_each_verb_is_registered_by_the_module_named_for_it():
    """VERB_MODULES lists every verb with the module that registers it, and nothing else."""
    import argparse
    import importlib

    from stackforge.cli.main import COMMAND_MODULES, VERB_MODULES

    registered = {}
    for module in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"stackforge.cli.{module}").register(sub)
        registered.update(dict.fromkeys(sub.choices, module))
    assert registered == VERB_MODULES


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--json"],
        ["--root", "/r", "newest", "post2", "--package", "torch", "--set", "a.b=1"],
        ["--root=/r", "patches", "check", "post2"],
        ["build", "post2", "--target", "t"],
    ],
)
def test_a_named_verb_parses_as_with_every_verb(argv):
    """The parser of the named verb alone gives the namespace of the whole parser, and is all that is built."""
    from stackforge.cli.main import build_parser

    narrow, full = build_parser(argv), build_parser()

    def verbs(parser):
        return next(a for a in parser._actions if a.dest == "command").choices

    assert len(verbs(narrow)) < len(verbs(full))
    assert vars(narrow.parse_args(argv)) == vars(full.parse_args(argv))


@pytest.mark.parametrize(
    "argv", [["--help"], ["--root", "/r", "--help"], ["nosuchverb"], ["-h", "list"], ["--ro", "/r", "list"]]
)
def test_anything_but_a_named_verb_gets_every_verb(argv):
    from stackforge.cli.main import COMMAND_MODULES, build_parser

    parser = build_parser(argv)
    assert len({c for a in parser._actions if a.dest == "command" for c in a.choices}) > len(COMMAND_MODULES)


def test_the_guard_sees_a_library_import():
    """The same probe, on a verb that loads a stack, does see the model: the guard can fail."""
    result = _probe([["--root", str(TOOLS.parent), "show", "post2", "--json"]])
    assert result["codes"] == [0]
    assert "pydantic" in _heavy(result["modules"]) and "stackforge.stack.load" in result["modules"]


def test_verb_defaults_written_in_the_cli_are_the_library_defaults():
    from stackforge.cli import audit, newest, patches
    from stackforge.cli import doctor as doctor_cli
    from stackforge.flows import doctor
    from stackforge.freshness import audit as freshness_audit
    from stackforge.freshness import newest as freshness_newest
    from stackforge.patches import DEFAULT_TRACKER_PATTERN

    assert newest.DEFAULT_TRAIN_WINDOW == freshness_newest.DEFAULT_TRAIN_WINDOW
    assert audit.ALLOW_FILE == freshness_audit.ALLOW_FILE
    assert doctor_cli.DEFAULT_TIMEOUT == doctor.DEFAULT_TIMEOUT
    assert patches.DEFAULT_TRACKER_PATTERN == DEFAULT_TRACKER_PATTERN


def test_lazy_calls_the_attribute_of_the_moment(monkeypatch):
    from stackforge.cli.lazy import lazy
    from stackforge.freshness import newest as freshness_newest

    window = lazy("stackforge.freshness.newest")
    assert window.DEFAULT_TRAIN_WINDOW == freshness_newest.DEFAULT_TRAIN_WINDOW
    call = lazy("stackforge.freshness.newest", "newest")
    monkeypatch.setattr(freshness_newest, "newest", lambda *a, **kw: ("patched", a, kw))
    assert call(1, x=2) == ("patched", (1,), {"x": 2})
    with pytest.raises(TypeError):
        window()


def _list(root: Path, cache: Path, *extra: str) -> dict:
    return _probe(
        [["--root", str(root), "list", *extra], ["--root", str(root), "list", "--json", *extra]],
        env={"STACKFORGE_CACHE": str(cache)},
    )


def test_list_answers_from_its_stored_rows_without_the_model(tmp_path):
    root = make_root(tmp_path)
    cache = tmp_path / "cache"
    first = _list(root, cache)
    assert first["codes"] == [0, 0] and "pydantic" in first["modules"]
    again = _list(root, cache)
    assert again["printed"] == first["printed"] and again["codes"] == [0, 0]
    assert _heavy(again["modules"]) == []
    assert "post2            MUSA 5.2.0 release train, torch 2.11.0.post2" in again["printed"]


def test_list_recomputes_when_a_stack_or_a_set_value_changes(tmp_path):
    root = make_root(tmp_path)
    cache = tmp_path / "cache"
    _list(root, cache)
    post2 = root / "stacks" / "post2.yaml"
    post2.write_text(post2.read_text().replace("description: MUSA", "descripton: MUSA"))
    changed = _list(root, cache)
    assert changed["codes"] == [2, 2] and "pydantic" in changed["modules"]
    assert "post2            invalid: stacks/post2.yaml:" in changed["printed"] and "descripton" in changed["printed"]
    # Rows with an invalid stack are not stored: the same rows again, validated again.
    again = _list(root, cache)
    assert again["codes"] == [2, 2] and again["printed"] == changed["printed"] and "pydantic" in again["modules"]
    post2.write_text(post2.read_text().replace("descripton: MUSA", "description: MUSA"))
    assert _heavy(_list(root, cache)["modules"]) == []  # the valid rows of the first run are stored still
    overridden = _list(root, cache, "--set", "post1:description=moved")
    assert "post1            moved" in overridden["printed"] and "pydantic" in overridden["modules"]


def _outside(modules: list[str], within: tuple[str, ...]) -> list[str]:
    """The stackforge modules of ``modules`` whose files lie outside ``within`` (paths in the package)."""
    out = []
    for name in modules:
        if name != "stackforge" and not name.startswith("stackforge."):
            continue
        parts = name.split(".")[1:]
        package = (TOOLS / "stackforge" / Path(*parts)).is_dir() if parts else True
        rel = "/".join([*parts, "__init__.py"]) if package else "/".join(parts) + ".py"
        if not any(rel == w or rel.startswith(w + "/") for w in within):
            out.append(rel)
    return out


def test_the_rows_key_covers_every_module_a_list_runs(tmp_path):
    """The rows are kept by the fingerprint of VALIDATING_CODE alone: a first list, with a valid stack, an
    invalid one and a --set value, loads no stackforge module outside it."""
    from stackforge.stack.listing import VALIDATING_CODE

    root = make_root(tmp_path)
    post2 = root / "stacks" / "post2.yaml"
    post2.write_text(post2.read_text().replace("description: MUSA", "descripton: MUSA"))
    ran = _list(root, tmp_path / "cache", "--set", "post1:description=moved")
    assert ran["codes"] == [2, 2] and "descripton" in ran["printed"] and "post1            moved" in ran["printed"]
    assert "stackforge.stack.model" in ran["modules"]
    assert _outside(ran["modules"], VALIDATING_CODE) == []
    assert _outside(["stackforge.builder.plan", "stackforge.clients.proc"], VALIDATING_CODE) == [
        "builder/plan/__init__.py",
        "clients/proc.py",
    ]


def test_list_ignores_a_store_that_does_not_match_its_stacks(tmp_path):
    root = make_root(tmp_path)
    cache = tmp_path / "cache"
    first = _list(root, cache)
    store = cache / "list" / "list.json"
    entries = json.loads(store.read_text())
    for rows in entries.values():
        rows[0] = {"name": "evil", "description": "\x1b]0;owned\x07"}
    store.write_text(json.dumps(entries))
    again = _list(root, cache)
    assert again["printed"] == first["printed"] and "evil" not in again["printed"]
    entries = json.loads(store.read_text())  # rewritten by the run that refused the wrong name
    for rows in entries.values():
        rows[0] = {"name": rows[0]["name"], "description": "\x1b]0;owned\x07"}
    store.write_text(json.dumps(entries))
    assert _list(root, cache)["printed"] == first["printed"]
    store.write_text("{not json")
    assert _list(root, cache)["printed"] == first["printed"]


#: a first list in a fresh interpreter, reporting whether pydantic looked for its plugins (read from the
#: entry points of every installed distribution)
PLUGIN_PROBE = """
import contextlib, io, json, sys, importlib.metadata
looked = []
real = importlib.metadata.entry_points
def entry_points(**kw):
    looked.append(kw.get("group"))
    return real(**kw)
importlib.metadata.entry_points = entry_points
from stackforge.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "looked": looked, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("setting", [None, "some-plugin"])
def test_a_first_list_looks_for_no_pydantic_plugin_unless_told_to(tmp_path, setting):
    root = make_root(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    env |= {"PYTHONPATH": str(TOOLS), "STACKFORGE_CACHE": str(tmp_path / "cache")}
    if setting:
        env["PYDANTIC_DISABLE_PLUGINS"] = setting  # the user's own setting is kept: pydantic looks
    proc = subprocess.run(
        [sys.executable, "-c", PLUGIN_PROBE, "--root", str(root), "list"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["code"] == 0 and "pydantic_core" in result["modules"]  # the stacks were validated
    assert ("pydantic" in result["looked"]) == bool(setting)


#: a process started as ``stackforge`` starts: ``run()`` of ``__main__``, with ``main`` wrapped to report whether the
#: collector ran during the verb's work and after it, and how many objects were frozen out of its passes
GC_PROBE = """
import gc, json, sys
import stackforge.cli.main as cli
real = cli.main
def main(argv=None):
    code = real(argv)
    print(json.dumps({"code": code, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}), file=sys.stderr)
    return code
cli.main = main
from stackforge.__main__ import run
sys.argv = ["stackforge", *sys.argv[1:]]
run()
"""


def _started(tmp_path: Path, *argv: str) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": str(TOOLS), "STACKFORGE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", GC_PROBE, *argv], capture_output=True, text=True, env=env)
    return proc.returncode, json.loads(proc.stderr.splitlines()[-1])


def test_a_quick_verb_runs_with_the_collector_paused_and_others_set_it_going(tmp_path):
    from stackforge.cli.main import QUICK_VERBS, VERB_MODULES

    assert VERB_MODULES.keys() >= QUICK_VERBS
    root = make_root(tmp_path)
    code, state = _started(tmp_path, "--root", str(root), "list")
    assert code == 0 and state == {"code": 0, "enabled": False, "frozen": 0}
    # render is not quick: the collector runs again before its work, start-up's objects frozen out of its passes
    code, state = _started(tmp_path, "--root", str(root), "render", "no-such-stack")
    assert code == state["code"] == 2
    assert state["enabled"] is True and state["frozen"] > 10_000


def test_main_called_in_a_process_leaves_its_collector_as_it_was(tmp_path):
    """``main`` pauses nothing itself: a program (or a test) that calls it keeps its collector running."""
    import gc

    from stackforge.cli.main import main

    root = make_root(tmp_path)
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    assert main(["--root", str(root), "list"]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_the_installed_script_starts_as_python_m_does():
    import tomllib

    project = tomllib.loads((TOOLS.parent / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"stackforge": "stackforge.__main__:run"}
