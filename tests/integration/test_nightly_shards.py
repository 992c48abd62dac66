"""A night on two build hosts: the plan splits the example stack's two targets into two shards, one runs on the
shared engine, the other on a second engine started on this host (scripts/second-engine.sh: its own socket, data
root, bridge and subnet; `--builder` reaches it), both publish to a loopback registry that asks for a login, and the
merge publishes the verdict.

The night, in order (one module fixture; the tests read what it recorded):

1. the plan, recorded in the registry; the aliases stand where an earlier night left them (a stand-in manifest);
2. shard 1 on the first engine; the merge: shard 2 never reported, so its row fails as missing and no alias moves;
3. shard 2 on the second engine, which lacks the base image (a host not provisioned yet): its preflight fails, it
   reports that; the merge names the failed shard and moves no alias;
4. the base image loaded into the second engine, shard 2 run again: it publishes; the merge: every row passed,
   each alias moved exactly once, one summary with both rows, which `stackforge history` reads as any night;
5. shard 2 run again and shard 1 run on the second engine (another host than the one that published it): each finds
   its image already published under its tag, no new -rN; the merge leaves the aliases as they are.

Then the second engine stops, and the first engine still runs a container, its bridge and rules as they were.

Last, a night of a stack of two platform lines (example-multi: linux/amd64 and linux/arm64) against a registry of its
own: a shard per line — the arm64 one under emulation on this host, on a native arm64 runner in CI — each pushing its
gated image by digest, untagged; the merge tags one OCI index of both under the night's tag and moves the alias to it,
the history reads both rows verified, and an operator's `stackforge verify TAG --all-platforms` (no checkout) passes
every platform, each record naming the tag that resolves to the index.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from stackforge.clients.registry import RegistryClient, parse_repository
from tests.fixtures import musa_builds as mb
from tests.fixtures import run_names
from tests.fixtures import second_engine as se
from tests.fixtures.registry import start_registry

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20261001"
LOGIN = ("publisher", "n1ght-pw")
STACK = "night-shards"
ALIASES = {"escape": "py3.11-latest", "plain": "py3.11-latest-plain"}


def _root(dest: Path) -> Path:
    """A checkout of this repository's stacks and patches with one nightly stack: the example with a second target."""
    shutil.copytree(REPO / "stacks", dest / "stacks")
    shutil.copytree(REPO / "patches", dest / "patches")
    for path in (dest / "stacks").glob("*.yaml"):
        path.write_text(re.sub(r"(?m)^nightly: true\b.*$", "nightly: false", path.read_text()))
    (dest / "stacks" / f"{STACK}.yaml").write_text(
        f"name: {STACK}\ninherits: example\nnightly: true\n"
        "indexes:\n  pypi: {lock: false}\n"  # the example's lock is its own
        'targets:\n  plain: {entrypoint: [python3, -c, "print(1)"]}\n'
    )
    return dest


def _stand_in(client: RegistryClient, tag: str) -> str:
    """A manifest under ``tag`` (an alias an earlier night left): its digest."""
    config = json.dumps({"stand-in": tag, "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    client.upload_blob(digest, len(config), lambda: io.BytesIO(config))
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest,
                                  "size": len(config)}, "layers": []}).encode()  # fmt: skip
    client.put_manifest(tag, body, "application/vnd.oci.image.manifest.v1+json")
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Night:
    """The hosts, the registry and what each step left."""

    def __init__(self, tmp: Path, registry: str, engine: se.SecondEngine):
        self.tmp, self.registry, self.engine = tmp, registry, engine
        self.ns = f"n{run_names.RUN}"
        self.repo = f"{registry}/{self.ns}"
        self.roots = {h: _root(tmp / h) for h in ("first", "second", "merge")}
        self.env = {
            "STACKFORGE_REGISTRY_USER": LOGIN[0],
            "STACKFORGE_REGISTRY_PASSWORD": LOGIN[1],
            "DOCKER_CONFIG": str(engine.docker_config),  # BuildKit's cache import logs in with the docker CLI's login
        }
        self.caches = {"first": REPO / "build" / "cache", "second": tmp / "second-cache", "merge": tmp / "merge-cache"}
        self.sets = ["--set", f"tags.local={run_names.NS}/{STACK}:{run_names.RUN}"]
        self.client = RegistryClient(parse_repository(f"{self.repo}/stackforge-example"), credentials=LOGIN)
        # what the fixture records as the night goes
        self.first_engine_before: Any = None
        self.stand_ins: dict[str, str] = {}
        self.second_images: list[str] = []
        self.history: subprocess.CompletedProcess | None = None
        self.steps: dict[str, dict] = {}
        self.plan: dict = {}

    def stackforge(self, host: str, *args: str) -> subprocess.CompletedProcess:
        env = {**self.env, "STACKFORGE_CACHE": str(self.caches[host]), "STACKFORGE_LOCK_DIR": str(self.tmp / f"locks-{host}")}  # fmt: skip
        return mb.stackforge("--root", str(self.roots[host]), *args, env=env, timeout=1200)

    def shard(self, step: str, target: str, host: str, second_engine: bool) -> None:
        shard = next(s["id"] for s in self.plan["shards"] if s["units"][0]["target"] == target)
        args = ["nightly", "--shard", shard, "--registry", self.repo, "--date", DATE, "--no-freshness", "--no-drift"]
        if second_engine:
            args += ["--builder", self.engine.builder]
        t0 = time.monotonic()
        proc = self.stackforge(host, *args, "--json", *self.sets)
        self.steps[step] = {"proc": proc, "seconds": time.monotonic() - t0, "shard": shard,
                            "summary": json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None}  # fmt: skip

    def merge(self, step: str) -> None:
        out = self.tmp / "nights" / DATE
        t0 = time.monotonic()
        proc = self.stackforge("merge", "nightly", "--merge", "--registry", self.repo, "--date", DATE, "--out", str(out), *self.sets)  # fmt: skip
        took = time.monotonic() - t0
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else None
        self.steps[step] = {"proc": proc, "seconds": took, "summary": summary, "aliases": self.aliases(),
                            "md": (out / "summary.md").read_text() if summary else "", "tags": self.tags()}  # fmt: skip

    def aliases(self) -> dict[str, str | None]:
        got = {}
        for alias in ALIASES.values():
            info = self.client.head_manifest(alias)
            got[alias] = info.digest if info else None
        return got

    def tags(self) -> list[str]:
        return sorted(t for t in self.client.list_tags() if f"-{DATE}-r" in t)


@pytest.fixture(scope="module")
def night(tmp_path_factory, base_image):
    tmp = tmp_path_factory.mktemp("shards")
    registry, stop_registry = start_registry(tmp / "registry", login=LOGIN)
    before = se.first_engine_state()
    engine = se.start(se.docker_config_with_login(tmp / "docker", registry, LOGIN))
    n = Night(tmp, registry, engine)
    n.first_engine_before = before
    try:
        plan = n.stackforge("merge", "nightly", "--plan", "--json", "--shards", "2", "--registry", n.repo,
                            "--date", DATE, *n.sets)  # fmt: skip
        assert plan.returncode == 0, plan.stdout + plan.stderr
        n.plan = json.loads(plan.stdout)
        n.stand_ins = {alias: _stand_in(n.client, alias) for alias in ALIASES.values()}
        n.shard("first", "escape", "first", second_engine=False)
        n.merge("missing")
        n.shard("unprovisioned", "plain", "second", second_engine=True)
        n.merge("failed")
        engine.load(base_image)
        n.shard("second", "plain", "second", second_engine=True)
        n.merge("passed")
        n.second_images = engine.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        n.shard("again", "plain", "second", second_engine=True)
        n.shard("elsewhere", "escape", "second", second_engine=True)
        n.merge("rerun")
        history = n.stackforge("merge", "history", "--nights", str(tmp / "nights"), "--out", str(tmp / "site"), "--json")  # fmt: skip
        n.history = history
        yield n
    finally:
        if not engine.stopped:
            engine.stop()
        stop_registry()
        subprocess.run(["docker", "image", "rm", f"{run_names.NS}/{STACK}:{run_names.RUN}",
                        f"{run_names.NS}/{STACK}:{run_names.RUN}-plain"], capture_output=True)  # fmt: skip


def _rows(summary: dict) -> dict[str, dict]:
    return {r["target"]: r for r in summary["rows"] if r["stack"] == STACK}


def _ok(step: dict) -> str:
    proc = step["proc"]
    return f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_the_plan_splits_the_example_targets_into_two_shards_recorded_in_the_registry(night):
    plan = night.plan
    assert [[u["target"] for u in s["units"]] for s in plan["shards"]] in (
        [["escape"], ["plain"]],
        [["plain"], ["escape"]],
    )
    assert all(s["runs_on"] == ["linux", "x64"] for s in plan["shards"]) and plan["date"] == DATE
    night_repo = f"http://{night.registry}/v2/{night.ns}/stackforge-nightly/tags/list"
    tags = requests.get(night_repo, auth=LOGIN, timeout=10).json()["tags"]
    assert f"{DATE}-plan" in tags and {f"{DATE}-{s['id']}" for s in plan["shards"]} <= set(tags)


def test_a_shard_that_never_reported_is_a_failed_row_and_no_alias_moves(night):
    first, merged = night.steps["first"], night.steps["missing"]
    assert first["proc"].returncode == 0, _ok(first)
    assert _rows(first["summary"])["escape"]["status"] == "published"
    assert merged["proc"].returncode == 1, _ok(merged)
    rows = _rows(merged["summary"])
    assert rows["escape"]["status"] == "published" and rows["escape"]["shard"] == first["shard"]
    missing = rows["plain"]
    assert (missing["status"], missing["stage"]) == ("failed", "missing")
    assert f"shard {night.steps['unprovisioned']['shard']} never reported" in missing["reason"]
    assert merged["aliases"] == night.stand_ins  # every alias where the earlier night left it
    assert all(v.startswith("not moved") for r in rows.values() for v in r["aliases"].values())


def test_a_failed_shard_is_named_and_every_alias_stays_where_it_was(night):
    failed, merged = night.steps["unprovisioned"], night.steps["failed"]
    assert failed["proc"].returncode == 1, _ok(failed)
    assert "reported to" in failed["proc"].stderr  # a shard that published nothing reports all the same
    rows = _rows(merged["summary"])
    plain = rows["plain"]
    assert (plain["status"], plain["stage"], plain["shard"]) == ("failed", "preflight", failed["shard"])
    assert "stackforge/base:bookworm" in plain["reason"]
    assert merged["summary"]["shards"][failed["shard"]]["status"] == "reported"
    assert merged["aliases"] == night.stand_ins
    assert (
        "not moved: 1 of 2 rows of the stack did not pass: plain@linux/amd64 failed (preflight)"
        in rows["escape"]["aliases"]["*"]
    )
    assert merged["proc"].returncode == 1 and "FAILED (preflight)" in merged["md"]


def test_the_second_shard_ran_on_the_second_engine(night):
    second = night.steps["second"]
    assert second["proc"].returncode == 0, _ok(second)
    assert f"{run_names.NS}/{STACK}:{run_names.RUN}-plain" in night.second_images
    first_engine = subprocess.run(["docker", "image", "inspect", f"{run_names.NS}/{STACK}:{run_names.RUN}-plain"],
                                  capture_output=True)  # fmt: skip
    assert first_engine.returncode != 0  # built, gated and published from the second engine alone
    assert "importing cache manifest from" in second["proc"].stderr  # the first shard's image carried the cache


def test_once_every_shard_passed_the_merge_moves_each_alias_exactly_once(night):
    merged = night.steps["passed"]
    assert merged["proc"].returncode == 0, _ok(merged)
    summary = merged["summary"]
    rows = _rows(summary)
    assert set(rows) == {"escape", "plain"} and summary["verdict"] == "passed"
    assert {r["shard"] for r in rows.values()} == {s["id"] for s in night.plan["shards"]}
    assert all(r["platform"] == "linux/amd64" and r["evidence"] for r in rows.values())
    for target, alias in ALIASES.items():
        assert rows[target]["aliases"] == {alias: "moved"}
        assert merged["aliases"][alias] == rows[target]["digest"] != night.stand_ins[alias]
    moved = [a for r in rows.values() for a, v in r["aliases"].items() if v == "moved"]
    assert sorted(moved) == sorted(ALIASES.values())  # once each
    assert merged["tags"] == sorted(r["tag"].rsplit(":", 1)[1] for r in rows.values())
    assert "Shards: 2 of 2 reported" in merged["md"]
    assert merged["seconds"] < 30, merged["seconds"]  # no build, no pull: reads, checks and a few tag writes


def test_rerunning_shards_publishes_no_duplicate_tag_and_the_merge_moves_nothing_again(night):
    passed, rerun = night.steps["passed"], night.steps["rerun"]
    for step in ("again", "elsewhere"):
        got = night.steps[step]
        assert got["proc"].returncode == 0, _ok(got)
        (row,) = got["summary"]["rows"]
        assert row["status"] == "already-published", row
        assert row["tag"] == _rows(passed["summary"])[row["target"]]["tag"]
    assert rerun["tags"] == passed["tags"]  # one -rN per target: no duplicate
    assert rerun["proc"].returncode == 0, _ok(rerun)
    assert rerun["aliases"] == passed["aliases"]
    assert {a: v for r in _rows(rerun["summary"]).values() for a, v in r["aliases"].items()} == {
        alias: "unchanged" for alias in ALIASES.values()
    }


def test_the_history_reads_the_merged_night_with_every_row_verified(night):
    assert night.history.returncode == 0, night.history.stdout + night.history.stderr
    doc = json.loads(night.history.stdout)
    (one,) = [n for n in doc["nights"] if n["date"] == DATE]
    assert (one["images"], one["unverified"]) == (2, 0) and doc["problems"] == []


def test_the_first_engine_still_runs_containers_after_the_second_stopped(night, base_image):
    stopped = night.engine.stop()
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert se.rules_left(night.engine.name) == []
    assert subprocess.run(["ip", "link", "show", f"sfe-{night.engine.name}"], capture_output=True).returncode != 0
    assert se.first_engine_state() == night.first_engine_before
    ran = se.first_engine_runs(base_image)
    assert ran.returncode == 0, ran.stdout + ran.stderr


# --------------------------------------------------------------------------------------------------------------
# A stack of two platform lines: each line on a shard of its platform, one index tagged by the merge

MULTI = "example-multi"


@pytest.fixture(scope="module")
def lines_night(tmp_path_factory, base_image, arm_base_image):
    """example-multi's night on two shards — its linux/amd64 line on one, its linux/arm64 line on the other (on this
    x86_64 host under emulation; a native arm64 runner in CI) — then the merge, against a registry of its own:
    (the plan, {platform: shard's process}, the merge's process, its summary, the night's tags, the tag's raw
    manifest, the alias's digest, the history's process, the night's directory)."""
    tmp = tmp_path_factory.mktemp("lines")
    registry, stop_registry = start_registry(tmp / "registry")
    root = _root(tmp / "repo")
    repo = f"{registry}/l{run_names.RUN}"
    local = run_names.image(MULTI, "shards")
    sets = ["--set", f"tags.local={local}"]
    env = {"STACKFORGE_CACHE": str(REPO / "build" / "cache"), "STACKFORGE_LOCK_DIR": str(tmp / "locks")}

    def stackforge(*args: str) -> subprocess.CompletedProcess:
        return mb.stackforge("--root", str(root), *args, env=env, timeout=1800)

    night = ["--registry", repo, "--date", DATE]
    try:
        planned = stackforge("nightly", "--plan", "--json", *night, MULTI, *sets)
        assert planned.returncode == 0, planned.stdout + planned.stderr
        plan = json.loads(planned.stdout)
        shards = {}
        for shard in plan["shards"]:
            shards[shard["platform"]] = stackforge("nightly", "--shard", shard["id"], *night, "--no-freshness",
                                                   "--no-drift", "--json", *sets)  # fmt: skip
        out = tmp / "nights" / DATE
        merged = stackforge("nightly", "--merge", *night, "--out", str(out), *sets)
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
        client = RegistryClient(parse_repository(f"{repo}/stackforge-{MULTI}"))
        tags = [t for t in client.list_tags() if f"-{DATE}-r" in t]
        raw = None
        if len(tags) == 1:
            inspect = subprocess.run(["docker", "buildx", "imagetools", "inspect", "--raw", f"{repo}/stackforge-{MULTI}:{tags[0]}"],
                                     capture_output=True, text=True, timeout=120)  # fmt: skip
            raw = json.loads(inspect.stdout) if inspect.returncode == 0 else inspect.stderr
        alias = client.head_manifest("py3.11-latest")
        history = stackforge("history", "--nights", str(tmp / "nights"), "--out", str(tmp / "site"), "--json")
        # an operator's verify of the tag, every platform, from an empty directory (no checkout): each child's
        # newest record names the tag, which resolves to the index listing it
        (tmp / "operator").mkdir()
        ref = f"{repo}/stackforge-{MULTI}:{tags[0]}" if len(tags) == 1 else f"{repo}/stackforge-{MULTI}:missing"
        verified = mb.stackforge("verify", ref, "--all-platforms", env=env, cwd=tmp / "operator", timeout=900)
        yield plan, shards, merged, summary, tags, raw, alias.digest if alias else None, history, out, verified
    finally:
        stop_registry()
        subprocess.run(["docker", "image", "rm", local, f"{local}-arm64"], capture_output=True)


def test_each_line_is_built_on_a_shard_of_its_platform_and_pushed_by_digest_untagged(lines_night):
    plan, shards, *_ = lines_night
    by_platform = {s["platform"]: s for s in plan["shards"]}
    assert set(by_platform) == {"linux/amd64", "linux/arm64"}
    assert by_platform["linux/arm64"]["runs_on"] == ["linux", "arm64"]
    assert [u["line"] for u in by_platform["linux/arm64"]["units"]] == ["arm64"]
    for platform, proc in shards.items():
        assert proc.returncode == 0, f"{platform}: rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        (row,) = json.loads(proc.stdout)["rows"]
        assert (row["status"], row["platform"], row.get("tag")) == ("pushed", platform, None) and row["digest"]


def test_the_merge_tags_one_index_of_both_lines_and_moves_the_alias_to_it(lines_night):
    _, shards, merged, summary, tags, raw, alias, history, out, *_ = lines_night
    assert merged.returncode == 0, merged.stdout + merged.stderr[-6000:]
    pushed = {p: json.loads(proc.stdout)["rows"][0]["digest"] for p, proc in shards.items()}
    rows = {r["platform"]: r for r in summary["rows"]}
    assert len(tags) == 1 and isinstance(raw, dict), raw  # one tag of the night: the index
    assert raw["mediaType"] == "application/vnd.oci.image.index.v1+json"
    listed = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in raw["manifests"]}
    assert listed == pushed  # each child is the digest its shard reported
    assert all(r["status"] == "published" and r["tag"].endswith(f":{tags[0]}") for r in rows.values())
    assert {p: r["digest"] for p, r in rows.items()} == pushed
    index_digest = "sha256:" + hashlib.sha256(json.dumps(raw, separators=(",", ":"), sort_keys=True).encode()).hexdigest()  # fmt: skip
    assert alias == index_digest and all(r["aliases"] == {"py3.11-latest": "moved"} for r in rows.values())
    assert rows["linux/arm64"]["evidence"] == f"{MULTI}-escape@arm64"
    assert "PASS machine aarch64" in (out / f"{MULTI}-escape@arm64" / "gate.txt").read_text()  # gated on arm64
    assert history.returncode == 0, history.stdout + history.stderr
    (one,) = json.loads(history.stdout)["nights"]
    assert (one["images"], one["unverified"]) == (2, 0)


def test_verify_of_the_merged_tag_checks_every_platform_from_its_record(lines_night):
    """``stackforge verify TAG --all-platforms`` from an empty directory, once the merge tagged the index: each
    platform's image passes every check, its newest record (the merge's) naming the tag, which resolves to the index
    listing the image for its platform."""
    _, _, _, _, tags, raw, *_, verified = lines_night
    out = verified.stdout + verified.stderr
    assert verified.returncode == 0, out[-8000:]
    assert not [line for line in out.splitlines() if line.startswith("FAIL")], out[-8000:]
    index = raw["manifests"] if isinstance(raw, dict) else []
    for child in index:
        platform = f"{child['platform']['os']}/{child['platform']['architecture']}"
        assert f"PASS platform {platform} " in out and f"record  digest={child['digest']} matches" in out
    told = [line for line in out.splitlines() if line.startswith(f"PASS tag     {tags[0]} (from the record) resolves to the index")]  # fmt: skip
    assert len(told) == len(index) == 2, out[-8000:]
