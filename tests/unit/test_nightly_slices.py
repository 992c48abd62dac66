"""The nightly runs each target's device-free ``nightly: true`` test slices after the build and before publishing:
a slice that passes lets the row publish, one whose counts moved fails the row at stage ``tests`` and nothing is
published; the summary counts the slices' verdicts. The slices run for real through :class:`LocalEngine`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

from stackforge.clients.workspace import Workspace
from stackforge.flows.nightly import NightlyRun, Summary, _one
from stackforge.publish.publisher import PublishOptions
from stackforge.smoke import slices
from stackforge.stack.load import load
from tests.fixtures.slice_engine import LocalEngine
from tests.fixtures.stack_support import make_root

TESTS = """
import pytest

def test_one():
    pass

@pytest.mark.xfail(reason="carried", strict=False)
def test_two():
    assert 0
"""

STACK = """
name: demo
inherits: post2
tests:
  contracts: {nightly: false}       # post2's, read from the plugin: not this test's
  quick:
    files: {paths: [checks/test_quick.py]}
    expect: {passed: 1, xfailed: 1}
    nightly: true
  on-device:
    files: {paths: [checks/test_quick.py]}
    expect: {passed: 1, xfailed: 1}
    hardware: {devices: mthreads}
    nightly: true
"""


def _run(tmp_path: Path, expect: str | None = None):
    root = make_root(
        tmp_path,
        {
            "demo.yaml": STACK
            if expect is None
            else STACK.replace("{passed: 1, xfailed: 1}\n    nightly", expect + "\n    nightly", 1)
        },
    )
    (root / "checks").mkdir()
    (root / "checks" / "test_quick.py").write_text(textwrap.dedent(TESTS))
    engine = LocalEngine()
    workspace = Workspace.at(root)
    workspace.__dict__["engine"] = engine
    published: list[bool] = []
    evidence = tmp_path / "evidence"

    def build(stack, opts, **kw):
        evidence.mkdir(exist_ok=True)
        return SimpleNamespace(evidence=evidence, gate=["gate result: 9 PASS, 0 FAIL"])

    def publish(stack, registry, *, move_aliases=True, **kw):
        published.append(move_aliases)
        return SimpleNamespace(status="published", reference="r/x:t", digest="sha256:" + "a" * 64, aliases={})

    run = NightlyRun(
        registry="registry.test/x",
        date="20260929",
        publishing=PublishOptions(),
        workspace=workspace,
        engine=engine,
        outdir=tmp_path / "nightly",
        echo=lambda line: None,
        build=build,
        options=lambda **kw: kw,
        publish=publish,
        test=slices.run_slice,
    )
    row = _one(run, load("demo", root=root), "vllm-openai")
    return row, published, evidence, engine


def test_a_passing_slice_lets_the_row_publish(tmp_path):
    row, published, evidence, engine = _run(tmp_path)
    assert row.ok and row.stage is None and published == [True]
    assert row.tests == {"quick": "passed"}  # the device slice is not the nightly's; contracts is not nightly here
    result = json.loads((evidence / "tests" / "quick" / "result.json").read_text())
    assert result["counts"]["passed"] == 1 and result["counts"]["xfailed"] == 1
    assert len(engine.runs) == 1
    summary = Summary(date="20260929", registry="r", rows=[row])
    assert "Test slices: 1 passed" in summary.markdown()
    assert summary.to_json()["rows"][0]["tests"] == {"quick": "passed"}


def test_a_slice_whose_counts_moved_fails_the_row_before_publishing(tmp_path):
    row, published, evidence, _ = _run(tmp_path, expect="{passed: 2}")
    assert not row.ok and row.stage == "tests" and published == []
    assert row.tests == {"quick": "failed"}
    assert "test slice quick failed" in (row.reason or "") and "checks/test_quick.py::test_two" in (row.reason or "")
    assert "Test slices: 1 failed" in Summary(date="d", registry="r", rows=[row]).markdown()
