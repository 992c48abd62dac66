"""The build's one input (docs/architecture.md, "The build's input"): no build step takes the loaded stack, the walk
of the stack value through `stackforge build` stays short (scripts/stackwalk.py), and the walk sees a step that
takes the loaded stack again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "stackwalk.py"
PACKAGE = REPO / "tools" / "stackforge"


def _stackwalk():
    spec = importlib.util.spec_from_file_location("stackwalk", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["stackwalk"] = module
    spec.loader.exec_module(module)
    return module


stackwalk = _stackwalk()


def test_no_build_step_takes_the_loaded_stack_and_the_walk_is_short():
    stops, funcs = stackwalk.walk(PACKAGE)
    in_builder = [
        f"{f.module}:{f.qual}"
        for f in funcs.values()
        if f.module.startswith("stackforge.builder") and "LoadedStack" in f.annotated
    ]
    assert in_builder == []
    names = {f"{f.module}:{f.qual}" for f in stops}
    # by name, wherever builder/'s rooms put the modules: the walk reaches the run and, through it, the plan
    reached = {(f.module.rsplit(".", 1)[-1], f.qual) for f in stops if f.module.startswith("stackforge.builder")}
    assert "stackforge.cli.build:cmd_build" in names and {("run", "build"), ("plan", "make_plan")} <= reached
    assert len(stops) < 100, sorted(names)


def test_the_walk_follows_the_stack_value_and_not_what_is_narrower(tmp_path):
    """A stop is a function that takes the stack value and is called with it from one that holds it; one that takes
    the model, or one no holder calls, is not."""
    pkg = tmp_path / "stackforge"
    files = {
        "cli/build.py": "from stackforge.builder.run import build\n\n\ndef cmd_build(args):\n"
        "    loaded = args.stack\n    return build(loaded)\n",
        "builder/run.py": "from stackforge.builder import plan\n\n\ndef build(loaded: ResolvedStack):\n"
        "    plan.make_plan(loaded.model)\n    return plan.labels(loaded)\n",
        "builder/plan.py": "def make_plan(stack: Stack):\n    return stack\n\n\ndef labels(loaded: LoadedStack | None):\n"
        "    return loaded\n\n\ndef unreached(loaded: ResolvedStack):\n    return labels(loaded)\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    stops, funcs = stackwalk.walk(pkg)
    assert [f"{f.module}:{f.qual}" for f in stops] == [
        "stackforge.builder.plan:labels",
        "stackforge.builder.run:build",
        "stackforge.cli.build:cmd_build",
    ]
    assert sorted(f.qual for f in funcs.values() if "LoadedStack" in f.annotated) == ["labels"]
