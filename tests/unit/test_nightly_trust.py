"""The nightly hands its signing key and its vulnerability gate to every publish, and the summary says why an
image's aliases stayed where they were."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.flows.nightly import NightlyOptions, NightlyRun, Summary, _one, nightly
from stackforge.publish.publisher import PublishOptions, TrustOptions
from stackforge.stack.load import load
from tests.fixtures import osv_db
from tests.fixtures.stack_support import make_root

HELD = "not moved: 1 known vulnerability at or above medium (TEST-GHSA-4xh5-x5gv-qwph)"


def test_every_publish_gets_the_key_and_the_gate_and_the_summary_says_why(tmp_path):
    root = make_root(tmp_path)
    seen = []

    def build(stack, opts, **kw):
        (tmp_path / "evidence").mkdir(exist_ok=True)
        return SimpleNamespace(evidence=tmp_path / "evidence", gate=["gate result: 9 PASS, 0 FAIL"])

    def publish(stack, registry, *, options, move_aliases=True, **kw):
        seen.append(options)
        aliases = {"r/x:v-latest": HELD} if options.trust.osv else {"r/x:v-latest": "moved"}
        return SimpleNamespace(status="published", reference="r/x:t", digest="sha256:" + "a" * 64, aliases=aliases)

    key, osv = tmp_path / "key.pem", tmp_path / "osv"
    run = NightlyRun(
        registry="registry.test/x",
        date="20260929",
        publishing=PublishOptions(trust=TrustOptions(sign_key=key, osv=osv, fail_on="medium")),
        workspace=Workspace.at(root),
        engine=None,
        outdir=tmp_path / "nightly",
        echo=lambda line: None,
        build=build,
        options=lambda **kw: kw,
        publish=publish,
    )
    row = _one(run, load("post2", root=root), "vllm-openai")
    assert [(o.trust.sign_key, o.trust.osv, o.trust.fail_on) for o in seen] == [(key, osv, "medium")]
    assert row.aliases == {"r/x:v-latest": HELD}
    assert HELD in Summary(date="20260929", registry="r", rows=[row]).markdown()


SCAN = {
    "verdict": "waived",
    "fail_on": "high",
    "blocked": [],
    "waived": [
        {
            "id": "GHSA-aaaa-bbbb-cccc",
            "package": "torchvision",
            "version": "0.26.0.post2",
            "severity": "high",
            "reason": "the vendor's build \x1b[2J| not reachable",
            "expires": "2027-01-31",
            "waiver": "stacks/waivers.yaml:3",
        }
    ],
    "findings": 1,
    "database": {"PyPI": {"fetched_at": "2026-12-06T02:00:00Z", "from": "snapshot", "age_hours": 3.0}},
    "waivers": "stacks/waivers.yaml",
}


def test_the_summary_carries_the_scan_verdict_and_each_waiver_with_its_reason(tmp_path):
    root = make_root(tmp_path)

    def build(stack, opts, **kw):
        (tmp_path / "evidence").mkdir(exist_ok=True)
        return SimpleNamespace(evidence=tmp_path / "evidence", gate=["gate result: 9 PASS, 0 FAIL"])

    def publish(stack, registry, *, options, move_aliases=True, **kw):
        moved = {"r/x:v-latest": "moved"}
        return SimpleNamespace(
            status="published", reference="r/x:t", digest="sha256:" + "a" * 64, aliases=moved, scan=SCAN
        )

    run = NightlyRun(
        registry="registry.test/x",
        date="20260929",
        publishing=PublishOptions(trust=TrustOptions(osv=tmp_path / "osv")),
        workspace=Workspace.at(root),
        engine=None,
        outdir=tmp_path / "nightly",
        echo=lambda line: None,
        build=build,
        options=lambda **kw: kw,
        publish=publish,
    )
    row = _one(run, load("post2", root=root), "vllm-openai")
    summary = Summary(date="20260929", registry="r", rows=[row])
    data = json.loads(json.dumps(summary.to_json()))
    assert data["rows"][0]["scan"]["verdict"] == "waived" and data["rows"][0]["scan"]["blocked"] == []
    assert data["rows"][0]["scan"]["waived"][0]["reason"].startswith("the vendor's build")
    text = summary.markdown()
    line = next(line for line in text.splitlines() if line.startswith("| post2 | vllm-openai | linux/amd64 | waived"))
    assert "GHSA-aaaa-bbbb-cccc torchvision 0.26.0.post2 until 2027-01-31" in line and "\x1b" not in line
    assert "build \\| not reachable" in line  # a table cell stays one cell


def test_a_stale_database_stops_the_night_before_it_builds(tmp_path):
    root = make_root(tmp_path)
    stale = osv_db.fresh_copy(tmp_path / "osv", age=dt.timedelta(days=8))
    opts = NightlyOptions(
        publish=PublishOptions(trust=TrustOptions(osv=stale)), echo=lambda line: None, out=tmp_path / "night"
    )
    with pytest.raises(UserError, match="older than --osv-max-age"):
        nightly(root, "registry.test/x", opts)
    assert not (tmp_path / "night").exists()  # nothing ran, nothing written
