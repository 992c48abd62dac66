"""A night in the registry (publish/night.py) and the merge's verdict when shards did not report (flows/night_merge.py),
against the in-process registry: the plan kept once, a shard's result and evidence read back byte for byte, every
hostile answer refused, and a night whose shards never reported or reported for another plan failing every row of
them, naming the shard, with no alias moved. The merge of published rows runs against a real engine and registry in
tests/integration/test_nightly_shards.py."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

from stackforge.clients.registry import MalformedAnswer, RegistryClient, RetryPolicy, parse_repository
from stackforge.errors import UserError
from stackforge.flows import night_plan as np
from stackforge.flows.night_merge import MergeOptions, merge
from stackforge.publish import night as nightreg
from tests.fixtures.stack_support import RootSpec, repo_root
from tests.fixtures.stub_registry import StubRegistry

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.01, total_seconds=5)
DATE = "20261201"


@pytest.fixture
def registry():
    with StubRegistry() as stub:
        yield stub


def night(stub: StubRegistry) -> RegistryClient:
    return RegistryClient(parse_repository(f"{stub.address}/team/{nightreg.NIGHT_REPOSITORY}"), policy=FAST)


def a_plan(date: str = DATE) -> np.Plan:
    units = [np.Unit(stack="night-a", target=t, platform="linux/amd64", estimate_s=1.0) for t in ("escape", "plain")]
    return np.make_plan(units, [np.Problem(stack="broken", reason="error: it does not load")],
                        np.PlanOptions(date=date, shards=2))  # fmt: skip


def result(plan_digest: str, shard: str, rows: list[dict]) -> nightreg.ShardResult:
    return nightreg.ShardResult(schema="stackforge.nightly-shard/v1", date=DATE, shard=shard, plan=plan_digest,
                                rows=[nightreg.Row(**r) for r in rows])  # fmt: skip


def test_a_night_keeps_its_first_plan(registry):
    client = night(registry)
    first = a_plan().model_dump(by_alias=True, mode="json")
    doc, digest, recorded = nightreg.record_plan(client, DATE, first)
    assert recorded and doc == first
    other = {**first, "shards": first["shards"][:1]}
    doc, again, recorded = nightreg.record_plan(client, DATE, other)  # a re-run of the plan job gets the first back
    assert not recorded and doc == first and again == digest
    assert nightreg.fetch_plan(client, "20261202") is None


def test_a_shard_result_and_its_evidence_read_back_as_written(registry, tmp_path):
    client = night(registry)
    plan = a_plan()
    _, plan_digest, _ = nightreg.record_plan(client, DATE, plan.model_dump(by_alias=True, mode="json"))
    shard = plan.shards[0]
    evidence = tmp_path / "evidence"
    (evidence / "tests" / "unit").mkdir(parents=True)
    (evidence / "gate.txt").write_text("gate result: 7 PASS, 0 FAIL\n")
    (evidence / "tests" / "unit" / "result.json").write_text('{"verdict": "passed"}')
    (evidence / "link").symlink_to("/etc/passwd")
    bundle, left_out = nightreg.pack_evidence(evidence)
    assert left_out == ["link"] and nightreg.pack_evidence(evidence)[0] == bundle  # the same files, the same bytes
    unit = shard.units[0]
    row = {"stack": unit.stack, "target": unit.target, "status": "failed", "stage": "gate", "reason": "FAIL import x"}
    digest = nightreg.report_shard(client, result(plan_digest, shard.id, [row]), nightreg.plan_subject(client, plan_digest),
                                   {unit.key: bundle})  # fmt: skip
    got = nightreg.fetch_shard(client, DATE, shard.id)
    assert got is not None and got.manifest_digest == digest and got.plan_digest == plan_digest
    assert got.result.rows[0].reason == "FAIL import x" and set(got.evidence) == {unit.key}
    out = tmp_path / "out"
    names = nightreg.unpack_evidence(nightreg.fetch_evidence(client, got.evidence[unit.key]), out, "test")
    assert sorted(names) == ["gate.txt", "tests/unit/result.json"]
    assert (out / "gate.txt").read_text() == "gate result: 7 PASS, 0 FAIL\n" and not (out / "link").exists()
    assert nightreg.fetch_shard(client, DATE, plan.shards[1].id) is None  # never reported


def test_a_result_under_another_shards_tag_is_refused(registry):
    client = night(registry)
    plan = a_plan()
    _, plan_digest, _ = nightreg.record_plan(client, DATE, plan.model_dump(by_alias=True, mode="json"))
    a, b = plan.shards
    nightreg.report_shard(client, result(plan_digest, a.id, []), nightreg.plan_subject(client, plan_digest), {})
    manifest = client.get_manifest(nightreg.shard_tag(DATE, a.id))
    client.put_manifest(nightreg.shard_tag(DATE, b.id), manifest.body, manifest.media_type)  # a copy under b's tag
    with pytest.raises(MalformedAnswer, match="holds the result of night .* shard " + a.id):
        nightreg.fetch_shard(client, DATE, b.id)


def _bundle(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue())


def _member(
    name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
    return info, data


@pytest.mark.parametrize(
    "members, problem",
    [
        ([_member("../escape.txt")], "'..' part"),
        ([_member("/etc/cron.d/x")], "absolute path"),
        ([_member("ok.txt"), _member("sbom", kind=tarfile.SYMTYPE, link="/etc/shadow")], "not a regular file"),
        ([_member("dev", kind=tarfile.CHRTYPE)], "not a regular file"),
    ],
    ids=["dotdot", "absolute", "symlink", "device"],
)
def test_a_hostile_evidence_bundle_writes_nothing(tmp_path, members, problem):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=problem):
        nightreg.unpack_evidence(_bundle(members), out, "hostile")
    assert not out.exists() and not (tmp_path / "escape.txt").exists()


def test_an_evidence_bundle_that_unpacks_past_its_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(nightreg, "MAX_UNPACKED", 1 << 20)
    bomb = _bundle([_member("zeros", b"\0" * (4 << 20))])  # 4 MiB of zeros, a few KiB compressed
    assert len(bomb) < 64 << 10
    with pytest.raises(UserError, match="more than"):
        nightreg.unpack_evidence(bomb, tmp_path / "out", "bomb")
    assert not (tmp_path / "out").exists()


UNLOCKED = "indexes:\n  pypi: {lock: false}\n"


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(
        stacks=("example.yaml",),
        stack_files={
            "night-a.yaml": "name: night-a\ninherits: example\nnightly: true\n" + UNLOCKED
            + "targets:\n  plain: {entrypoint: [python3]}\n"
        },
    )  # fmt: skip


def test_a_shard_that_never_reported_fails_its_rows_by_name_and_moves_no_alias(registry, tmp_path, root_spec):
    root = repo_root(tmp_path, root_spec)
    client = night(registry)
    plan = a_plan()
    _, plan_digest, _ = nightreg.record_plan(client, DATE, plan.model_dump(by_alias=True, mode="json"))
    reported, missing = plan.shards
    (unit,) = reported.units
    row = {"stack": unit.stack, "target": unit.target, "status": "failed", "stage": "build", "reason": "no space left"}
    nightreg.report_shard(
        client, result(plan_digest, reported.id, [row]), nightreg.plan_subject(client, plan_digest), {}
    )
    lines: list[str] = []
    out = tmp_path / "night"
    summary = merge(root, f"{registry.address}/team", MergeOptions(date=DATE, out=out, policy=FAST, echo=lines.append))
    rows = {(r.stack, r.target): r for r in summary.rows}
    (gone,) = missing.units
    assert rows[gone.stack, gone.target].stage == "missing" and rows[gone.stack, gone.target].status == "failed"
    assert f"shard {missing.id} never reported" in rows[gone.stack, gone.target].reason
    assert (
        rows[unit.stack, unit.target].reason == "no space left" and rows[unit.stack, unit.target].shard == reported.id
    )
    assert rows["broken", "*"].stage == "load"  # a stack the plan could not read: a failed row, not a gap
    assert all(r.aliases == {"*": r.aliases["*"]} and r.aliases["*"].startswith("not moved") for r in summary.rows
               if r.stack == "night-a")  # fmt: skip
    assert summary.exit_code == 1 and summary.shards[missing.id]["status"] == "missing"
    assert summary.shards[reported.id]["status"] == "reported"
    doc = json.loads((out / "summary.json").read_text())
    assert {r["stage"] for r in doc["rows"]} == {"missing", "build", "load"} and doc["merge"]["duration_s"] >= 0
    md = (out / "summary.md").read_text()
    assert "Shards: 1 of 2 reported" in md and f"`{missing.id}`" in md and "FAILED (missing)" in md


def test_a_shard_that_ran_another_plan_of_the_night_is_not_taken(registry, tmp_path, root_spec):
    root = repo_root(tmp_path, root_spec)
    client = night(registry)
    plan = a_plan()
    _, plan_digest, _ = nightreg.record_plan(client, DATE, plan.model_dump(by_alias=True, mode="json"))
    stale = "sha256:" + "0" * 64
    shard = plan.shards[0]
    (unit,) = shard.units
    row = {"stack": unit.stack, "target": unit.target, "status": "failed", "stage": "gate"}
    # the subject names the recorded plan, the result another one: refused when read
    nightreg.report_shard(client, result(stale, shard.id, [row]), nightreg.plan_subject(client, plan_digest), {})
    summary = merge(
        root, f"{registry.address}/team", MergeOptions(date=DATE, out=tmp_path / "n", policy=FAST, echo=print)
    )
    got = next(r for r in summary.rows if (r.stack, r.target) == (unit.stack, unit.target))
    assert (
        got.stage == "shard" and "cannot be read" in got.reason and summary.shards[shard.id]["status"] == "unreadable"
    )


def test_a_merge_without_a_recorded_plan_says_how_to_make_one(registry, tmp_path, root_spec):
    root = repo_root(tmp_path, root_spec)
    with pytest.raises(UserError) as exc:
        merge(root, f"{registry.address}/team", MergeOptions(date=DATE, out=tmp_path / "n", policy=FAST))
    assert "no plan of night 20261201" in exc.value.message and "--plan --registry" in exc.value.fix


def test_a_shard_reports_one_row_per_unit_and_a_stack_that_did_not_lint_fails_each_of_its_units():
    from stackforge.flows.night_shard import _unit_rows
    from stackforge.flows.nightly import Row, Summary

    units = [np.Unit(stack=s, target=t, platform="linux/amd64") for s, t in (("a", "x"), ("a", "y"), ("b", "z"), ("c", "w"))]  # fmt: skip
    (shard,) = np.group(units, 1)
    summary = Summary(DATE, "r.example/t")
    summary.rows = [
        Row(stack="a", target="*", status="failed", stage="lint", reason="lint: trailing whitespace"),
        Row(stack="b", target="z", status="published", tag="r/b:1", digest="sha256:" + "1" * 64),
        Row(stack="recipes", target="broken", status="failed", stage="load", reason="no such image"),
    ]
    rows, rest = _unit_rows(summary, shard)
    assert [(r.stack, r.target, r.status, r.stage) for r in rows] == [
        ("a", "x", "failed", "lint"), ("a", "y", "failed", "lint"), ("b", "z", "published", None),
        ("c", "w", "failed", "build"),  # the plan named a target the shard's stack does not publish
    ]  # fmt: skip
    assert all(r.shard == shard.id and r.platform == "linux/amd64" for r in rows)
    assert [(r.stack, r.target, r.shard) for r in rest] == [("recipes", "broken", shard.id)]


def test_a_shard_result_of_the_wrong_shape_fails_its_rows_instead_of_the_merge(registry, tmp_path, root_spec):
    root = repo_root(tmp_path, root_spec)
    client = night(registry)
    plan = a_plan()
    _, plan_digest, _ = nightreg.record_plan(client, DATE, plan.model_dump(by_alias=True, mode="json"))
    shard = plan.shards[0]
    (unit,) = shard.units
    good = result(plan_digest, shard.id, [{"stack": unit.stack, "target": unit.target, "status": "published"}])
    doc = good.data()
    doc["rows"][0]["tests"] = ["not", "a", "mapping"]  # what a hostile or broken writer could send
    body = json.dumps(doc).encode()
    manifest, _ = nightreg._artifact(client, nightreg.SHARD_TYPE, [(nightreg.SHARD_TYPE, body, {})],
                                     {}, subject=nightreg.plan_subject(client, plan_digest))  # fmt: skip
    client.put_manifest(nightreg.shard_tag(DATE, shard.id), manifest, "application/vnd.oci.image.manifest.v1+json")
    summary = merge(
        root, f"{registry.address}/team", MergeOptions(date=DATE, out=tmp_path / "n", policy=FAST, echo=print)
    )
    got = next(r for r in summary.rows if (r.stack, r.target) == (unit.stack, unit.target))
    assert got.stage == "shard" and "rows[0].tests" in got.reason and summary.exit_code == 1
