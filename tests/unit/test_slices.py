"""Test slices (``tests:`` of a stack or a recipe, ``stackforge test``) without an engine.

The schema's errors name the file and line; pytest's summary line and JUnit XML are read from what the real
pytest of this interpreter prints and writes; a whole slice runs through :class:`LocalEngine`, which runs the
slice's ``docker run`` as a local pytest process, so counts, moved tests, evidence and exit codes come from a
real run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stackforge.clients.workspace import Workspace
from stackforge.signals import Interrupted
from stackforge.smoke import slices
from stackforge.smoke.pytest_result import compare, parse_junit, parse_summary
from stackforge.smoke.run import HostFacts
from stackforge.stack.load import load
from stackforge.stack.model import Slice
from tests.fixtures import hostile_files as hf
from tests.fixtures.gitrepo import GitRepo
from tests.fixtures.slice_engine import LocalEngine
from tests.fixtures.stack_support import make_root, parse_errors, run_cli

#: A test file with every outcome pytest has: 3 passed (one a parametrized pair), 1 failed, 1 skipped, 1 xfailed,
#: 1 xpassed, 1 error (a broken fixture), and a warning.
EVERY_OUTCOME = textwrap.dedent(
    """
    import warnings
    import pytest

    def test_pass():
        pass

    @pytest.mark.parametrize("v", [1, "a b"])
    def test_param(v):
        pass

    def test_fail():
        assert 1 == 2

    @pytest.mark.skip(reason="not here")
    def test_skip():
        pass

    @pytest.mark.xfail(reason="known", strict=False)
    def test_xfail():
        assert 0

    @pytest.mark.xfail(reason="fixed upstream", strict=False)
    def test_xpass():
        pass

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture broke")

    def test_error(broken):
        pass

    class TestGroup:
        def test_warns(self):
            warnings.warn("careful")
    """
)

PASSING = textwrap.dedent(
    """
    import pytest

    def test_one():
        pass

    def test_two():
        pass

    @pytest.mark.xfail(reason="carried", strict=False)
    def test_three():
        assert 0
    """
)

READ_ONLY = textwrap.dedent(
    """
    from pathlib import Path

    def test_reads_a_staged_file():
        assert (Path(__file__).parent.parent / "data" / "pins.txt").read_text() == "torchada==0.1.90\\n"
    """
)


def real_pytest(tmp_path: Path, source: str, *args: str) -> tuple[str, str]:
    """(output, JUnit XML) of this interpreter's real pytest run on ``source`` as tests/test_demo.py."""
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_demo.py").write_text(source)
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--rootdir={tmp_path}", f"--junitxml={junit}"]
        + ["-o", "junit_family=xunit1", "-rA", *args, "tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    return proc.stdout, junit.read_text()


# -- pytest's output -------------------------------------------------------------------------------------


def test_the_summary_line_and_junit_of_a_real_run_agree(tmp_path):
    output, junit = real_pytest(tmp_path, EVERY_OUTCOME)
    summary = parse_summary(output)
    assert summary is not None
    assert summary.counts == {"passed": 4, "failed": 1, "skipped": 1, "xfailed": 1, "xpassed": 1, "error": 1}
    assert summary.warnings == 1 and summary.duration_s >= 0
    cases = {c.id: c.outcome for c in parse_junit(junit, output)}
    assert cases == {
        "tests/test_demo.py::test_pass": "passed",
        "tests/test_demo.py::test_param[1]": "passed",
        "tests/test_demo.py::test_param[a b]": "passed",
        "tests/test_demo.py::test_fail": "failed",
        "tests/test_demo.py::test_skip": "skipped",
        "tests/test_demo.py::test_xfail": "xfailed",
        "tests/test_demo.py::test_xpass": "xpassed",
        "tests/test_demo.py::test_error": "error",
        "tests/test_demo.py::TestGroup::test_warns": "passed",
    }


def test_deselected_and_no_tests_ran_are_read(tmp_path):
    output, _ = real_pytest(tmp_path, PASSING, "-k", "one")
    summary = parse_summary(output)
    assert summary is not None and summary.counts["passed"] == 1 and summary.deselected == 2
    output, _ = real_pytest(tmp_path, PASSING, "-k", "nothing_matches")
    summary = parse_summary(output)
    assert summary is not None and summary.deselected == 3 and not any(summary.counts.values())


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        ("============ 60 passed, 4 xfailed in 3.21s ============", {"passed": 60, "xfailed": 4}),
        ("60 passed, 4 xfailed in 3.21s", {"passed": 60, "xfailed": 4}),
        (
            "===== 2 failed, 58 passed, 3 warnings, 2 errors in 65.01s (0:01:05) =====",
            {"failed": 2, "passed": 58, "error": 2},
        ),
        ("=============================== 1 error in 0.10s ===============================", {"error": 1}),
        ("============================ no tests ran in 0.01s =============================", {}),
    ],
)
def test_summary_line_variants(line, counts):
    summary = parse_summary(f"collected 64 items\n\n{line}\n")
    assert summary is not None
    assert {k: v for k, v in summary.counts.items() if v} == counts


def test_output_without_a_summary_line_has_none():
    assert parse_summary("ERROR: file or directory not found: tests/nonexist.py\n\n") is None
    assert parse_summary("the build took 3 steps in 2.0s\n") is None


def test_junit_that_is_not_xml_is_refused():
    with pytest.raises(ValueError, match="does not parse"):
        parse_junit("<testsuites><testcase", "")


def test_a_count_that_differs_names_the_tests_that_moved(tmp_path):
    output, junit = real_pytest(tmp_path, EVERY_OUTCOME)
    cases = parse_junit(junit, output)
    counts = parse_summary(output).counts  # type: ignore[union-attr]
    previous = {c.id: c.outcome for c in cases} | {"tests/test_demo.py::test_fail": "passed"}
    result = compare({"passed": 5, "skipped": 1, "xfailed": 1, "xpassed": 1, "error": 1}, counts, cases, previous)
    assert set(result.differs) == {"passed", "failed"}
    assert result.differs["failed"] == {"expected": 0, "got": 1, "tests": ["tests/test_demo.py::test_fail"]}
    assert result.changed == [{"test": "tests/test_demo.py::test_fail", "was": "passed", "now": "failed"}]
    assert any("failed: 1, expected 0 — tests/test_demo.py::test_fail" in line for line in result.lines())
    assert "tests/test_demo.py::test_fail: passed → failed" in result.lines()


# -- the schema ------------------------------------------------------------------------------------------


def _stack(tmp_path: Path, tests_yaml: str, files: dict[str, str] | None = None) -> Path:
    root = make_root(tmp_path, {"demo.yaml": "name: demo\ninherits: post2\n" + textwrap.dedent(tests_yaml)})
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("    select: [tests/t.py, -p, evil]\n", 7, "option '-p' is not taken"),
        ("    select: [-k, '$(reboot)']\n", 7, "is not a pytest expression"),
        ("    select: [tests/other.py]\n", 5, "is not under files.paths"),
        ("    select: [../t.py]\n", 7, "not a relative path"),
        ("    select: [-k]\n", 7, "-k needs a value"),
    ],
)
def test_a_bad_selection_is_refused_at_its_line(tmp_path, capsys, body, line, message):
    root = _stack(
        tmp_path,
        "tests:\n  contracts:\n    files: {paths: [tests/t.py]}\n    expect: {passed: 1}\n" + body,
    )
    rc, _, err = run_cli(capsys, root, "show", "demo")
    assert rc == 2
    hit = [e for e in parse_errors(err) if message in e["message"]]
    assert hit and hit[0]["file"] == "stacks/demo.yaml" and hit[0]["line"] == line, err


def test_unknown_outcome_upstream_and_target_are_refused_with_a_fix(tmp_path, capsys):
    root = _stack(
        tmp_path,
        """
        tests:
          a:
            files: {paths: [tests/t.py]}
            expect: {passed: 60, xfail: 4}
          b:
            files: {upstream: vllm_muse, paths: [tests/t.py]}
            expect: {passed: 1}
            target: vllm-open
        """,
    )
    rc, _, err = run_cli(capsys, root, "show", "demo")
    assert rc == 2
    errors = parse_errors(err)
    assert any("tests.a.expect.xfail" in e["message"] and "'xfailed'" in (e["fix"] or "") for e in errors), err
    rc, _, err = run_cli(capsys, root, "show", "demo")
    (root / "stacks" / "demo.yaml").write_text(
        (root / "stacks" / "demo.yaml").read_text().replace("xfail: 4", "xfailed: 4")
    )
    rc, _, err = run_cli(capsys, root, "show", "demo")
    errors = parse_errors(err)
    assert any(
        "unknown upstream 'vllm_muse'" in e["message"] and e["fix"] == "did you mean 'vllm_musa'?" for e in errors
    )
    assert any("unknown target 'vllm-open'" in e["message"] and e["line"] == 11 for e in errors), err


def test_slices_do_not_change_the_fingerprint(tmp_path):
    root = _stack(tmp_path, "tests:\n  a:\n    files: {paths: [tests/t.py]}\n    expect: {passed: 1}\n")
    with_tests = load("demo", root=root)
    (root / "stacks" / "demo.yaml").write_text("name: demo\ninherits: post2\n")
    from stackforge.stack.load import fingerprint

    assert fingerprint(with_tests.model) == fingerprint(load("demo", root=root).model)


def test_the_selection_defaults_to_the_staged_paths():
    plain = Slice.model_validate(
        {"files": {"paths": ["tests/a.py", "data"]}, "select": ["-k", "not slow"], "expect": {"passed": 1}}
    )
    assert plain.arguments() == ["-k", "not slow", "tests/a.py", "data"]
    nodes = Slice.model_validate(
        {"files": {"paths": ["tests"]}, "select": ["tests/a.py::TestX::test_y[1]"], "expect": {"passed": 1}}
    )
    assert nodes.arguments() == ["tests/a.py::TestX::test_y[1]"]
    assert nodes.expected() == {"passed": 1, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0, "error": 0}


# -- a whole slice, through the local engine -------------------------------------------------------------

NO_DEVICE = HostFacts((), ("runc",))


def _workspace(root: Path, engine: LocalEngine) -> Workspace:
    ws = Workspace.at(root)
    ws.__dict__["engine"] = engine  # the cached engine of this run
    return ws


def _ref(loaded, name: str) -> slices.SliceRef:
    return next(r for r in slices.declared(loaded) if r.name == name)


SLICE = """
tests:
  demo:
    files: {paths: [tests/test_demo.py, data]}
    select: [tests/test_demo.py]
    expect: {passed: 2, xfailed: 1}
"""


def test_a_slice_runs_and_keeps_its_evidence(tmp_path):
    root = _stack(tmp_path, SLICE, {"tests/test_demo.py": PASSING, "data/pins.txt": "x\n"})
    loaded = load("demo", root=root)
    engine = LocalEngine()
    out = tmp_path / "evidence"
    result = slices.run_slice(
        loaded,
        _ref(loaded, "demo"),
        slices.SliceTarget("img", "sha256:1", out),
        _workspace(root, engine),
        facts=NO_DEVICE,
    )
    assert result.verdict == "passed", result.reason
    assert result.counts["passed"] == 2 and result.counts["xfailed"] == 1
    assert result.summary_line.endswith("2 passed, 1 xfailed in " + result.summary_line.split(" in ")[1])
    saved = json.loads((out / "result.json").read_text())
    assert saved["verdict"] == "passed" and saved["exit_code"] == 0
    assert {t["id"] for t in saved["tests"]} == {f"tests/test_demo.py::test_{n}" for n in ("one", "two", "three")}
    assert "<testcase" in (out / "junit.xml").read_text()
    assert "short test summary info" in (out / "pytest.txt").read_text()
    argv = engine.runs[0]
    for option in ("--rm", "--read-only", "--network"):
        assert option in argv
    assert argv[argv.index("--tmpfs") + 1] == "/tmp" and argv[argv.index("--network") + 1] == "none"
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert mounts[0].endswith(":/slice:ro") and mounts[1].endswith(":/slice-out")
    assert argv[argv.index("--entrypoint") + 1] == "python"
    assert argv[-1] == "tests/test_demo.py"


def test_a_count_that_moves_fails_naming_the_tests(tmp_path):
    root = _stack(tmp_path, SLICE, {"tests/test_demo.py": PASSING, "data/pins.txt": "x\n"})
    loaded = load("demo", root=root)
    ws, out = _workspace(root, LocalEngine()), tmp_path / "evidence"
    where = slices.SliceTarget("img", "sha256:1", out)
    assert slices.run_slice(loaded, _ref(loaded, "demo"), where, ws, facts=NO_DEVICE).verdict == "passed"
    (root / "tests" / "test_demo.py").write_text(
        PASSING.replace("def test_two():\n    pass", "def test_two():\n    assert False")
    )
    result = slices.run_slice(loaded, _ref(loaded, "demo"), where, ws, facts=NO_DEVICE)
    assert result.verdict == "failed" and result.exit_code == 1
    assert result.moved["outcomes"]["failed"]["tests"] == ["tests/test_demo.py::test_two"]
    assert result.moved["changed"] == [{"test": "tests/test_demo.py::test_two", "was": "passed", "now": "failed"}]
    assert "tests/test_demo.py::test_two: passed → failed" in (result.reason or "")
    lines = result.lines()
    assert "1 passed (expected 2)" in lines[0] and "1 failed (expected 0)" in lines[0]
    assert "  failed (1, expected 0): tests/test_demo.py::test_two" in lines
    assert "  changed: tests/test_demo.py::test_two: passed → failed" in lines


def test_a_slice_needing_a_device_is_not_run_on_a_host_without(tmp_path):
    root = _stack(
        tmp_path, SLICE + "    hardware: {devices: mthreads, count: 1}\n", {"tests/test_demo.py": PASSING, "data/x": ""}
    )
    loaded = load("demo", root=root)
    engine = LocalEngine()
    out = tmp_path / "evidence"
    result = slices.run_slice(
        loaded, _ref(loaded, "demo"), slices.SliceTarget("img", None, out), _workspace(root, engine), facts=NO_DEVICE
    )
    assert result.verdict == "not-run" and result.exit_code == 3
    assert "this host has no mthreads device" in (result.reason or "")
    assert engine.runs == [] and json.loads((out / "result.json").read_text())["verdict"] == "not-run"
    allowed = slices.run_slice(
        loaded,
        _ref(loaded, "demo"),
        slices.SliceTarget("img", None, out),
        _workspace(root, engine),
        facts=NO_DEVICE,
        allow_missing_hardware=True,
    )
    assert (
        allowed.verdict == "not-run"
        and allowed.counts["passed"] == 2
        and "not a hardware result" in (allowed.reason or "")
    )
    assert "--runtime=mthreads" not in engine.runs[0]


def test_upstream_files_are_read_at_the_pinned_commit(tmp_path):
    upstream = GitRepo.init(tmp_path / "upstream")
    upstream.write("tests/test_pins.py", READ_ONLY)
    upstream.write("data/pins.txt", "torchada==0.1.90\n")
    pinned = upstream.commit("pins")
    upstream.write("data/pins.txt", "torchada==0.2.0\n")
    upstream.commit("later")
    root = _stack(
        tmp_path,
        f"""
        upstreams:
          demo_up: {{git: {upstream.path}, commit: {pinned}}}
        tests:
          pins:
            files: {{upstream: demo_up, paths: [tests/test_pins.py, data/pins.txt]}}
            select: [tests/test_pins.py]
            expect: {{passed: 1}}
        """,
    )
    loaded = load("demo", root=root)
    ws = _workspace(root, LocalEngine())
    result = slices.run_slice(
        loaded, _ref(loaded, "pins"), slices.SliceTarget("img", None, tmp_path / "ev"), ws, facts=NO_DEVICE
    )
    assert result.verdict == "passed", result.reason
    assert result.files["commit"] == pinned and result.files["from"] == "upstream"


def test_a_path_the_pinned_tree_lacks_is_refused(tmp_path):
    upstream = GitRepo.init(tmp_path / "upstream")
    upstream.write("tests/test_pins.py", READ_ONLY)
    pinned = upstream.commit("pins")
    root = _stack(
        tmp_path,
        f"""
        upstreams:
          demo_up: {{git: {upstream.path}, commit: {pinned}}}
        tests:
          pins:
            files: {{upstream: demo_up, paths: [tests/test_pins.py, data/pins.txt]}}
            expect: {{passed: 1}}
        """,
    )
    loaded = load("demo", root=root)
    from stackforge.errors import UserError

    with pytest.raises(UserError, match=r"has no data/pins.txt") as info:
        slices.run_slice(
            loaded,
            _ref(loaded, "pins"),
            slices.SliceTarget("img", None, tmp_path / "ev"),
            _workspace(root, LocalEngine()),
            facts=NO_DEVICE,
        )
    assert info.value.file == "stacks/demo.yaml" and info.value.line is not None


def test_an_image_of_other_pins_is_refused(tmp_path):
    root = _stack(tmp_path, SLICE)
    loaded = load("demo", root=root)
    labels = {
        "org.stackforge.stack": "demo",
        **{f"org.stackforge.pin.{n}": p.version for n, p in loaded.model.packages.items()},
    }
    demo = [_ref(loaded, "demo")]
    assert slices.image_mismatch(loaded, labels, demo) == []
    labels["org.stackforge.pin.torch"] = "2.11.0.post1+musa5.2.0"
    wrong = slices.image_mismatch(loaded, labels, demo)
    assert wrong == ["pin torch: the image has 2.11.0.post1+musa5.2.0, stacks/demo.yaml pins 2.11.0.post2+musa5.2.0"]


# -- the command line ------------------------------------------------------------------------------------


def test_the_cli_exit_codes_tell_passed_failed_not_run_and_bad_input(tmp_path, capsys, monkeypatch):
    root = _stack(tmp_path, SLICE, {"tests/test_demo.py": PASSING, "data/pins.txt": "x\n"})
    engine = LocalEngine()
    monkeypatch.setattr(Workspace, "engine", property(lambda self: engine))
    out = tmp_path / "out"
    rc, stdout, err = run_cli(capsys, root, "test", "demo", "--slice", "demo", "--out", str(out))
    assert rc == 0, err
    assert stdout.splitlines()[0].startswith("PASSED   demo: 2 passed, 1 xfailed")
    (root / "stacks" / "demo.yaml").write_text(
        (root / "stacks" / "demo.yaml").read_text().replace("passed: 2", "passed: 3")
    )
    rc, stdout, _ = run_cli(capsys, root, "test", "demo", "--slice", "demo", "--out", str(out), "--json")
    data = json.loads(stdout)
    assert rc == 1 and data["exit_code"] == 1 and data["slices"][0]["verdict"] == "failed"
    assert data["slices"][0]["moved"]["outcomes"]["passed"]["tests"] == [
        "tests/test_demo.py::test_one",
        "tests/test_demo.py::test_two",
    ]
    (root / "stacks" / "demo.yaml").write_text(
        (root / "stacks" / "demo.yaml").read_text() + "    hardware: {devices: mthreads}\n"
    )
    rc, stdout, _ = run_cli(capsys, root, "test", "demo", "--slice", "demo", "--out", str(out))
    assert rc == 3 and stdout.startswith("NOT-RUN  demo")
    rc, _, err = run_cli(capsys, root, "test", "demo", "--slice", "nope")
    assert rc == 2 and "one of: contracts, probes, demo" in err
    rc, _, err = run_cli(capsys, root, "test", "post1")
    assert rc == 2 and "declare no test slice" in err


def test_evidence_goes_to_the_gated_build_that_made_the_image(tmp_path):
    from stackforge.builder.records import evidence

    stack_dir = tmp_path / "build" / "post2"
    build = stack_dir / "evidence" / "20261202T101500Z-001"
    build.mkdir(parents=True)
    (build / "result.json").write_text(json.dumps({"ok": True, "image_id": "sha256:" + "a" * 64}))
    assert evidence.tests_dir(stack_dir, "sha256:" + "a" * 64, "contracts") == build / "tests" / "contracts"
    other = evidence.tests_dir(stack_dir, "sha256:" + "b" * 64, "contracts")
    assert other == stack_dir / "tests" / ("b" * 12) / "contracts"


RECIPE = """\
description: a model on the demo image
image: {{stack: demo, target: vllm-openai{overlay}}}
model: {{id: Org/Model}}
ports: {{api: 8000}}
hardware: {{devices: mthreads, count: 1}}
tests:
  reads:
    files: {{paths: [tests/test_demo.py]}}
    expect: {{passed: 60, xfailed: 4}}
    hardware: {{devices: mthreads, count: 1}}
"""


def test_a_recipe_declares_slices_for_its_image(tmp_path, capsys):
    root = _stack(
        tmp_path,
        SLICE,
        {
            "tests/test_demo.py": PASSING,
            "recipes/plain.yaml": RECIPE.format(overlay=""),
            "recipes/layered.yaml": RECIPE.format(overlay=", overlay: jev"),
        },
    )
    loaded = load("demo", root=root)
    names = [r.name for r in slices.declared(loaded)]
    assert names == [
        "contracts",
        "probes",
        "demo",
        "plain.reads",
    ]  # the stack's (post2's inherited first), then the recipe's
    plain = _ref(loaded, "plain.reads")
    assert plain.owner == "plain" and plain.target == "vllm-openai" and plain.slice.expected()["xfailed"] == 4
    assert "layered.reads" in [r.name for r in slices.declared(loaded, overlay="jev")]
    (root / "recipes" / "plain.yaml").write_text(RECIPE.format(overlay="").replace("xfailed: 4", "xfail: 4"))
    rc, _, err = run_cli(capsys, root, "recipe", "lint", "plain")
    assert rc == 2 and "recipes/plain.yaml:9:" in err and "tests.reads.expect.xfail" in err


def test_a_recipe_slice_path_that_is_missing_is_refused_at_the_recipe_line(tmp_path):
    root = _stack(tmp_path, SLICE, {"recipes/plain.yaml": RECIPE.format(overlay="")})
    loaded = load("demo", root=root)
    from stackforge.errors import UserError

    with pytest.raises(UserError, match="no tests/test_demo.py in the repository") as info:
        slices.run_slice(
            loaded,
            _ref(loaded, "plain.reads"),
            slices.SliceTarget("img", None, tmp_path / "ev"),
            _workspace(root, LocalEngine()),
            facts=NO_DEVICE,
            allow_missing_hardware=True,
        )
    assert info.value.file == "recipes/plain.yaml" and info.value.line == 8


def test_a_slice_that_runs_past_its_timeout_fails_and_its_container_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(slices, "ENGINE_GRACE_S", 0)
    slow = "import time\n\ndef test_slow():\n    time.sleep(30)\n"
    root = _stack(
        tmp_path,
        "tests:\n  slow:\n    files: {paths: [tests/test_slow.py]}\n    expect: {passed: 1}\n    timeout_s: 2\n",
        {"tests/test_slow.py": slow},
    )
    loaded = load("demo", root=root)
    engine = LocalEngine()
    result = slices.run_slice(
        loaded,
        _ref(loaded, "slow"),
        slices.SliceTarget("img", None, tmp_path / "ev"),
        _workspace(root, engine),
        facts=NO_DEVICE,
    )
    assert result.verdict == "failed" and result.pytest_exit is None
    assert "did not finish within 2 s" in (result.reason or "")
    name = result.docker[result.docker.index("--name") + 1]
    assert ("rm", "--force", name) in engine.calls


def test_a_repository_path_that_leads_outside_is_refused(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not the repository's\n")
    root = _stack(tmp_path, "tests:\n  leak:\n    files: {paths: [tests/link.txt]}\n    expect: {passed: 1}\n")
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "link.txt").symlink_to(outside)
    loaded = load("demo", root=root)
    from stackforge.errors import UserError

    with pytest.raises(UserError, match="tests/link.txt leads outside the repository"):
        slices.run_slice(
            loaded,
            _ref(loaded, "leak"),
            slices.SliceTarget("img", None, tmp_path / "ev"),
            _workspace(root, LocalEngine()),
            facts=NO_DEVICE,
        )


TEARDOWN = """
import pytest

@pytest.fixture
def resource():
    yield
    raise RuntimeError("teardown broke")

def test_fails_then_teardown_errors(resource):
    assert False
"""


def test_a_failure_then_a_teardown_error_counts_as_pytest_counts_it(tmp_path):
    slice_yaml = "tests:\n  td:\n    files: {paths: [tests/test_td.py]}\n    expect: {failed: 1, error: 1}\n"
    root = _stack(tmp_path, slice_yaml, {"tests/test_td.py": TEARDOWN})
    loaded = load("demo", root=root)
    where = slices.SliceTarget("img", None, tmp_path / "ev")
    result = slices.run_slice(loaded, _ref(loaded, "td"), where, _workspace(root, LocalEngine()), facts=NO_DEVICE)
    assert result.counts["failed"] == 1 and result.counts["error"] == 1
    assert result.verdict == "passed", result.reason
    # pytest's JUnit XML records the teardown error as a testcase of its own: both count the same
    outcomes = sorted(t["outcome"] for t in result.tests)
    assert outcomes == ["error", "failed"] and result.note is None


class InterruptedEngine(LocalEngine):
    def run_merged(self, *argv: str, timeout: float, limit: int = 0):
        raise Interrupted(signal.SIGTERM)


def test_an_interrupted_run_removes_its_container(tmp_path):
    root = _stack(tmp_path, SLICE, {"tests/test_demo.py": PASSING, "data/x": ""})
    loaded = load("demo", root=root)
    engine = InterruptedEngine()
    with pytest.raises(Interrupted) as info:
        slices.run_slice(
            loaded,
            _ref(loaded, "demo"),
            slices.SliceTarget("img", None, tmp_path / "ev"),
            _workspace(root, engine),
            facts=NO_DEVICE,
        )
    removed = [c for c in engine.calls if c[:2] == ("rm", "--force")]
    assert len(removed) == 1 and removed[0][2].startswith("stackforge-slice-demo-")
    assert info.value.notes == [f"the test container {removed[0][2]} was removed"]


# -- what a test container leaves behind is hostile ------------------------------------------------------


def _hostile_run(tmp_path, after, body=PASSING):
    root = _stack(tmp_path, SLICE, {"tests/test_demo.py": body, "data/pins.txt": "x\n"})
    loaded = load("demo", root=root)
    engine = LocalEngine(after=after)
    out = tmp_path / "evidence"
    result = hf.within(60, slices.run_slice, loaded, _ref(loaded, "demo"), slices.SliceTarget("img", "sha256:1", out),
                     _workspace(root, engine), facts=NO_DEVICE)  # fmt: skip
    return result, out, engine


def test_a_junit_link_left_by_the_container_is_not_followed(tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("<testsuites><testsuite><testcase name='SECRET-ON-THE-HOST'/></testsuite></testsuites>")

    def link(mounts):
        junit = Path(mounts["/slice-out"]) / "junit.xml"
        junit.unlink()
        junit.symlink_to(secret)

    result, out, _ = _hostile_run(tmp_path, link)
    assert result.verdict == "failed" and "junit.xml that is not taken" in (result.reason or "")
    assert "symbolic link" in result.reason
    assert not (out / "junit.xml").exists()
    assert "SECRET-ON-THE-HOST" not in "".join(p.read_text() for p in out.iterdir())


def test_a_junit_fifo_or_huge_file_left_by_the_container_is_refused(tmp_path, monkeypatch):
    def fifo(mounts):
        junit = Path(mounts["/slice-out"]) / "junit.xml"
        junit.unlink()
        os.mkfifo(junit)

    result, _, _ = _hostile_run(tmp_path / "a", fifo)
    assert result.verdict == "failed" and "a FIFO, not a regular file" in (result.reason or "")

    monkeypatch.setattr(slices, "JUNIT_LIMIT", 1 << 16)

    def huge(mounts):
        with open(Path(mounts["/slice-out"]) / "junit.xml", "ab") as fh:
            fh.truncate(1 << 30)

    result, _, _ = _hostile_run(tmp_path / "b", huge)
    assert result.verdict == "failed" and "larger than 65536 bytes" in (result.reason or "")


def test_a_container_that_prints_endlessly_is_stopped_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(slices, "OUTPUT_LIMIT", 1 << 20)
    # the image prints past pytest's own capture (a plugin, a sitecustomize): here the test suspends it
    noisy = (
        "import sys\n\ndef test_noise(request):\n"
        "    request.config.pluginmanager.getplugin('capturemanager').suspend_global_capture(in_=True)\n"
        "    while True:\n        sys.stdout.write('x' * 65536)\n"
    )
    result, _, engine = _hostile_run(tmp_path, None, body=noisy)
    assert result.verdict == "failed" and result.pytest_exit is None
    assert "printed more than 1048576 bytes" in (result.reason or "")
    name = result.docker[result.docker.index("--name") + 1]
    assert ("rm", "--force", name) in engine.calls


def test_junit_with_a_dtd_is_refused():
    from stackforge.smoke.pytest_result import parse_junit

    bomb = '<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaa">]><testsuites>&a;</testsuites>'
    with pytest.raises(ValueError, match="DTD"):
        parse_junit(bomb)
