"""A sharded night's stack of several platform lines (stacks/example-multi.yaml: linux/amd64 and linux/arm64), merged
against a real ``docker-registry`` on 127.0.0.1: the registry is the point — what a shard pushed by digest, the
records attached to it, the index the merge tags over the lines and the aliases it moves are read back from it.

Each line's shard is stood in for by what it leaves in the registry (an image pushed by digest, its publish record
and its night row attached, its result under the shard's tag), so no engine builds here; the shard's own half (a
line built, gated and pushed by digest) runs against the engine in tests/integration/test_nightly_shards.py."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from stackforge.clients.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient, RetryPolicy, parse_repository
from stackforge.flows import night_plan as np
from stackforge.flows.night_merge import MergeOptions, merge
from stackforge.flows.nightly import Summary
from stackforge.publish import night as nightreg
from stackforge.publish import record as records
from stackforge.publish.record_schema import SCHEMA, GateResults, PublishRecord
from stackforge.publish.stack import alias_tags, destination
from stackforge.stack.load import load
from stackforge.stack.resolved import ResolvedStack
from tests.fixtures.registry import start_registry
from tests.fixtures.stack_support import RootSpec, repo_root

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.01, total_seconds=10)
DATE = "20261201"
STACK, TARGET = "example-multi", "escape"
LINES = {"amd64": "linux/amd64", "arm64": "linux/arm64"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    url, stop = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield url
    finally:
        stop()


@pytest.fixture
def root(tmp_path):
    return repo_root(tmp_path, RootSpec(parts=("stacks",)))


class Night:
    """One night of example-multi/escape in its own namespace of the registry."""

    def __init__(self, root: Path, registry: str, ns: str):
        self.root, self.registry = root, f"{registry}/{ns}"
        self.night = RegistryClient(parse_repository(f"{self.registry}/{nightreg.NIGHT_REPOSITORY}"), policy=FAST)
        loaded = ResolvedStack.of(load(STACK, root=root))
        _, repository, _, first, suffix = destination(loaded, self.registry, DATE, TARGET)
        self.image = RegistryClient(repository, policy=FAST)
        self.alias = alias_tags(loaded, self.registry, first, suffix)[0]
        units = [np.Unit(stack=STACK, target=TARGET, platform=p, line=name) for name, p in LINES.items()]  # type: ignore[arg-type]
        self.plan = np.make_plan(units, [], np.PlanOptions(date=DATE))
        _, self.plan_digest, _ = nightreg.record_plan(
            self.night, DATE, self.plan.model_dump(by_alias=True, mode="json")
        )
        self.shards = {s.platform: s for s in self.plan.shards}

    def push(self, platform: str, record: bool = True) -> str:
        """An image of ``platform`` pushed by digest (no tag), its publish record attached as a shard attaches it."""
        arch = platform.split("/")[1]
        config = json.dumps(
            {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
        ).encode()
        config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
        self.image.upload_blob(config_digest, len(config), lambda: io.BytesIO(config))
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": config_digest, "size": len(config)}}).encode()  # fmt: skip
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.image.put_manifest(digest, body, OCI_MANIFEST)
        if record:
            rec = PublishRecord.model_validate({"schema": SCHEMA, "stack": STACK, "target": TARGET, "digest": digest,
                                                "repository": str(self.image.repository), "image_id": config_digest,
                                                "tags": [], "stack_files": {}, "overrides": [], "pins": {},
                                                "options": {}, "fingerprint": "sha256:0", "labels": {},
                                                "gate": GateResults().data(), "smoke": {}})  # fmt: skip
            records.attach(self.image, rec, records.subject_of(self.image, digest), "2026-12-01T01:00:00Z")
        return digest

    def report(self, platform: str, row: dict, evidence: dict[str, str] | None = None) -> None:
        """The shard of ``platform`` reports ``row`` (and attaches it to its image, when it pushed one)."""
        shard = self.shards[platform]
        (unit,) = shard.units
        row = {"stack": STACK, "target": TARGET, "platform": platform, "shard": shard.id, **row}
        if row.get("digest"):
            nightreg.attach_row(self.image, row["digest"], {**row, "night": DATE}, DATE, shard.id)
        bundles = {}
        if evidence:
            where = self.root.parent / f"evidence-{shard.id}"
            where.mkdir()
            for name, text in evidence.items():
                (where / name).write_text(text)
            bundles[unit.key] = nightreg.pack_evidence(where)[0]
        result = nightreg.ShardResult(schema="stackforge.nightly-shard/v1", date=DATE, shard=shard.id,
                                      plan=self.plan_digest, rows=[nightreg.Row(**row)])  # fmt: skip
        nightreg.report_shard(self.night, result, nightreg.plan_subject(self.night, self.plan_digest), bundles)

    def merge(self, out: Path) -> tuple[Summary, list[str]]:
        said: list[str] = []
        opts = MergeOptions(date=DATE, out=out, policy=FAST, echo=said.append, lock_dir=self.root.parent / "locks")
        return merge(self.root, self.registry, opts), said

    def stand_in_alias(self) -> str:
        """The alias where an earlier night left it: an image of its own."""
        digest = self.push("linux/amd64", record=False)
        got = self.image.get_manifest(digest)
        assert got is not None
        self.image.put_manifest(self.alias, got.body, OCI_MANIFEST)
        return digest

    def night_tags(self) -> list[str]:
        return sorted(t for t in self.image.list_tags() if f"-{DATE}-r" in t)


def pushed(digest: str, evidence: str | None = None) -> dict:
    return {"status": "pushed", "digest": digest, "smoke": "none", **({"evidence": evidence} if evidence else {})}


def test_the_merge_tags_one_index_of_every_line_and_moves_the_aliases_once(root, registry, tmp_path):
    n = Night(root, registry, "lines-pass")
    before = n.stand_in_alias()
    digests = {p: n.push(p) for p in LINES.values()}
    publish_json = json.dumps({"status": "pushed", "stack": STACK, "target": TARGET, "platform": "linux/arm64",
                               "digest": digests["linux/arm64"], "tag": ""})  # fmt: skip
    n.report("linux/amd64", pushed(digests["linux/amd64"]))
    n.report(
        "linux/arm64", pushed(digests["linux/arm64"], "example-multi-escape@arm64"), {"publish.json": publish_json}
    )
    summary, said = n.merge(tmp_path / "night")
    assert summary.verdict == "passed", [(r.platform, r.stage, r.reason) for r in summary.rows]
    rows = {r.platform: r for r in summary.rows}
    (tag,) = n.night_tags()
    ref = f"{n.image.repository}:{tag}"
    assert {p: (r.status, r.tag, r.digest) for p, r in rows.items()} == {
        p: ("published", ref, digests[p]) for p in LINES.values()
    }
    # the tag is an OCI index: a manifest per line, each the digest its shard reported, in the stack's order
    index = n.image.get_manifest(tag)
    assert index is not None and index.media_type == OCI_INDEX
    listed = [
        (d["digest"], f"{d['platform']['os']}/{d['platform']['architecture']}") for d in index.json()["manifests"]
    ]
    assert listed == [(digests[p], p) for p in LINES.values()]
    # the aliases moved once, to the index, and every row says so
    alias = n.image.head_manifest(n.alias)
    assert alias is not None and alias.digest == index.digest != before
    assert all(r.aliases == {n.alias: "moved"} for r in summary.rows)
    # each line's newest record names the night's tag; its evidence says where it is published
    for digest in digests.values():
        found = records.fetch(n.image, digest)
        assert found is not None and found.parsed().tags == [tag]
    kept = json.loads((tmp_path / "night" / "example-multi-escape@arm64" / "publish.json").read_text())
    assert (kept["reference"], kept["index"]["digest"], kept["status"]) == (ref, index.digest, "published")
    assert rows["linux/arm64"].evidence == "example-multi-escape@arm64"
    assert any(f"published {ref}" in line for line in said)
    # a second merge of the night: the index is found under its tag, no -r2, nothing moves again
    again, _ = n.merge(tmp_path / "again")
    assert n.night_tags() == [tag] and again.verdict == "passed"
    assert {(r.status, r.tag) for r in again.rows} == {("already-published", ref)}
    assert all(r.aliases == {n.alias: "unchanged"} for r in again.rows)


def test_a_failed_line_leaves_no_index_and_every_alias_where_it_was(root, registry, tmp_path):
    n = Night(root, registry, "lines-fail")
    before = n.stand_in_alias()
    amd = n.push("linux/amd64")
    n.report("linux/amd64", pushed(amd))
    n.report("linux/arm64", {"status": "failed", "stage": "gate", "reason": "FAIL import markupsafe._speedups"})
    summary, _ = n.merge(tmp_path / "night")
    rows = {r.platform: r for r in summary.rows}
    assert (rows["linux/arm64"].status, rows["linux/arm64"].stage) == ("failed", "gate")
    assert (rows["linux/amd64"].status, rows["linux/amd64"].stage, rows["linux/amd64"].tag) == (
        "failed",
        "publish",
        None,
    )
    assert rows["linux/amd64"].reason == (
        "not published: linux/arm64 failed (gate); the stack's tag is one index of every platform line"
    )
    assert n.night_tags() == []  # no index, no tag of the night
    alias = n.image.head_manifest(n.alias)
    assert alias is not None and alias.digest == before
    assert all(r.aliases["*"].startswith("not moved: 2 of 2 rows of the stack did not pass") for r in summary.rows)
    assert summary.exit_code == 1


def test_a_line_without_its_record_is_not_indexed(root, registry, tmp_path):
    """The merge checks each child before it tags: the manifest its unit reported, carrying its publish record."""
    n = Night(root, registry, "lines-norecord")
    amd, arm = n.push("linux/amd64"), n.push("linux/arm64", record=False)
    n.report("linux/amd64", pushed(amd))
    n.report("linux/arm64", pushed(arm))
    summary, _ = n.merge(tmp_path / "night")
    assert n.night_tags() == []
    assert {(r.status, r.stage) for r in summary.rows} == {("failed", "publish")}
    assert all(f"@{arm} (linux/arm64) carries no publish record of {STACK}/{TARGET}" in (r.reason or "")
               for r in summary.rows)  # fmt: skip


def test_a_failed_smoke_of_the_own_line_publishes_the_index_and_holds_the_aliases(root, registry, tmp_path):
    """As in the one-process nightly: the smoke holds the aliases, not the index (every line passed its gate)."""
    n = Night(root, registry, "lines-smoke")
    before = n.stand_in_alias()
    amd, arm = n.push("linux/amd64"), n.push("linux/arm64")
    n.report("linux/amd64", {**pushed(amd), "status": "failed", "stage": "smoke", "smoke": "failed",
                             "reason": f"smoke failed (chat); published {amd}, its aliases were not moved"})  # fmt: skip
    n.report("linux/arm64", {**pushed(arm), "smoke": "not-run"})
    summary, _ = n.merge(tmp_path / "night")
    (tag,) = n.night_tags()
    rows = {r.platform: r for r in summary.rows}
    assert (rows["linux/amd64"].status, rows["linux/amd64"].stage) == ("failed", "smoke")
    assert (rows["linux/arm64"].status, rows["linux/arm64"].stage) == ("published", None)
    assert {r.tag for r in summary.rows} == {f"{n.image.repository}:{tag}"}
    alias = n.image.head_manifest(n.alias)
    assert alias is not None and alias.digest == before
    assert all(r.aliases["*"].startswith("not moved: 1 of 2 rows of the stack did not pass") for r in summary.rows)


def test_a_shard_rerun_after_the_merge_attaches_a_record_naming_the_tag_verify_checks(root, registry, tmp_path):
    """A line's shard run again once the merge tagged the index (the same image: its digest is in the index): the
    record it attaches, the newest, names the night's tag as the merge's did, so ``verify TAG --all-platforms`` still
    checks that child's tag against the index; before the merge, and for an image no index lists, it names none."""
    from stackforge.builder.run.verify import Verification
    from stackforge.flows.operator import registry_checks
    from stackforge.publish.publisher import PublishResult
    from stackforge.publish.stack import named_by_index

    n = Night(root, registry, "lines-rerun")
    digests = {p: n.push(p) for p in LINES.values()}
    scheme = destination(ResolvedStack.of(load(STACK, root=root)), n.registry, DATE, TARGET)[2]

    def rerun(platform: str, digest: str) -> PublishResult:
        pushed = PublishResult(status="pushed", repository=str(n.image.repository), tag="", digest=digest,
                               image_id=digest, size=None, aliases={}, verification={}, push_log=[], started_at="",
                               finished_at="2026-12-01T05:00:00Z", duration_s=0.0, source="")  # fmt: skip
        return named_by_index(pushed, n.image, scheme, DATE, platform)

    assert records.head(STACK, TARGET, rerun("linux/arm64", digests["linux/arm64"]))["tags"] == []  # not merged yet
    for platform, digest in digests.items():
        n.report(platform, pushed(digest))
    summary, _ = n.merge(tmp_path / "night")
    assert summary.verdict == "passed"
    (tag,) = n.night_tags()
    index = n.image.get_manifest(tag)
    assert index is not None
    arm = digests["linux/arm64"]
    result = rerun("linux/arm64", arm)
    assert records.head(STACK, TARGET, result)["tags"] == [tag]
    assert rerun("linux/amd64", arm).tag == ""  # the index lists it for another platform only
    other = "sha256:" + "0" * 64  # an arm64 image the index does not list (a rebuild that changed)
    assert records.head(STACK, TARGET, rerun("linux/arm64", other))["tags"] == []
    # the re-run shard's record, attached after the merge's, is the one verify reads: the tag check still runs
    newest = records.fetch(n.image, arm)
    assert newest is not None
    again = newest.parsed().model_copy(update={"tags": records.head(STACK, TARGET, result)["tags"]})
    records.attach(n.image, again, records.subject_of(n.image, arm), "2026-12-01T05:00:00Z")
    v = Verification(f"{n.image.repository}@{arm}", "?")
    assert registry_checks(v, n.image, arm, v.image, None, (index.digest, "linux/arm64")) is not None
    assert any(
        line.startswith(f"PASS tag     {tag} (from the record) resolves to the index {index.digest}")
        for line in v.lines
    ), v.lines
    assert v.failed == 0, v.lines
