"""The nightly hands its signing key and its vulnerability gate to every publish, and the summary says why an
image's aliases stayed where they were."""

from __future__ import annotations

from types import SimpleNamespace

from stackforge.clients.workspace import Workspace
from stackforge.flows.nightly import NightlyRun, Summary, _one
from stackforge.stack.load import load
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
        aliases = {"r/x:v-latest": HELD} if options.osv else {"r/x:v-latest": "moved"}
        return SimpleNamespace(status="published", reference="r/x:t", digest="sha256:" + "a" * 64, aliases=aliases)

    key, osv = tmp_path / "key.pem", tmp_path / "osv"
    run = NightlyRun(
        registry="registry.test/x",
        date="20260929",
        policy=None,
        workspace=Workspace.at(root),
        engine=None,
        outdir=tmp_path / "nightly",
        echo=lambda line: None,
        build=build,
        options=lambda **kw: kw,
        publish=publish,
        sign_key=key,
        osv=osv,
        fail_on="medium",
    )
    row = _one(run, load("post2", root=root), "vllm-openai")
    assert [(o.sign_key, o.osv, o.fail_on) for o in seen] == [(key, osv, "medium")]
    assert row.aliases == {"r/x:v-latest": HELD}
    assert HELD in Summary(date="20260929", registry="r", rows=[row]).markdown()
