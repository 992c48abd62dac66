"""Evidence per build: build ids, `latest`, lookup by image id, retention, the flat layout of earlier releases."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from stackforge.builder.records import evidence
from stackforge.errors import BuildFailed, UserError
from stackforge.publish.stack import check_gated, publish_dir

T0 = dt.datetime(2026, 9, 29, 10, 15, 30, tzinfo=dt.timezone.utc)


def make(root: Path, when: dt.datetime, **result) -> Path:
    build = evidence.new_build(root, when)
    if result:
        (build / "result.json").write_text(json.dumps(result))
    return build


def test_build_ids_sort_by_time_and_never_collide(tmp_path):
    root = tmp_path / "evidence"
    a = evidence.new_build(root, T0)
    b = evidence.new_build(root, T0)  # the same second: the next sequence number
    c = evidence.new_build(root, T0 + dt.timedelta(seconds=1))
    assert [p.name for p in (a, b, c)] == ["20260929T101530Z-001", "20260929T101530Z-002", "20260929T101531Z-001"]
    assert evidence.builds(root) == [a, b, c] and evidence.newest(root) == c
    later_tz = dt.datetime(2026, 9, 29, 12, 15, 31, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert evidence.build_id(later_tz) == "20260929T101531Z-001"  # always UTC


def test_latest_is_a_relative_link_replaced_atomically(tmp_path):
    root = tmp_path / "evidence"
    a, b = make(root, T0, ok=True), make(root, T0 + dt.timedelta(seconds=5), ok=True)
    evidence.finish(a, ok=True, keep=10)
    assert os.readlink(root / "latest") == a.name
    evidence.finish(b, ok=True, keep=10)
    assert os.readlink(root / "latest") == b.name and evidence.resolve(root) == b.resolve()
    failed = make(root, T0 + dt.timedelta(seconds=9), ok=False, reason="gate")
    evidence.finish(failed, ok=False, keep=10)
    assert evidence.latest(root) == b.resolve(), "a failed build never moves latest"
    assert evidence.newest(root) == failed
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
    assert evidence.resolve(b) == b  # a build directory resolves to itself


def test_find_gated_by_image_id_and_target(tmp_path):
    root = tmp_path / "evidence"
    one = make(root, T0, ok=True, image_id="sha256:1", target="t")
    make(root, T0 + dt.timedelta(seconds=1), ok=True, image_id="sha256:2", target="t")
    make(root, T0 + dt.timedelta(seconds=2), ok=False, reason="boom")
    assert evidence.find_gated(root, "sha256:1")[0] == one
    assert evidence.find_gated(root, "sha256:1", "other")[0] is None
    assert evidence.find_gated(root, "sha256:9")[0] is None


def test_check_gated_finds_an_earlier_build_and_refuses_an_unknown_image(tmp_path):
    root = tmp_path / "evidence"
    with pytest.raises(UserError, match="no gated build of s/t: .* holds no build") as err:
        check_gated(root, "s", "t", "sha256:1", "img:1")
    assert err.value.exit_code == 2
    one = make(root, T0, ok=True, image_id="sha256:1", target="t", tag="img:1")
    make(root, T0 + dt.timedelta(seconds=1), ok=True, image_id="sha256:2", target="t", tag="img:2")
    gated = check_gated(root, "s", "t", "sha256:1", "img:1")
    assert gated == {"evidence": str(one / "result.json"), "build_id": one.name, "image_id": "sha256:1", "tag": "img:1"}
    assert publish_dir(root, gated, "sha256:1") == one
    with pytest.raises(
        BuildFailed,
        match=r"no gated build of s/t .* produced it \(the newest gated build of t "
        r"\(20260929T101531Z-001\) produced sha256:2\)",
    ):
        check_gated(root, "s", "t", "sha256:9", "img:9")
    make(root, T0 + dt.timedelta(seconds=2), ok=False, reason="gate failed:\n  FAIL import x")
    with pytest.raises(BuildFailed, match=r"the newest build \(20260929T101532Z-001\) failed: gate failed:"):
        check_gated(root, "s", "other", "sha256:9", "img:9")


def test_an_ungated_publish_record_finds_its_directory(tmp_path):
    root = tmp_path / "evidence"
    first = publish_dir(root, None, "sha256:u")
    assert evidence.is_build(first) and not (first / "result.json").exists()
    (first / "publish-failed.json").write_text(json.dumps({"image_id": "sha256:u"}))
    assert publish_dir(root, None, "sha256:u") == first  # the next attempt writes beside the first record
    assert publish_dir(root, None, "sha256:v") != first


def test_retention_keeps_n_and_every_published_build(tmp_path):
    root = tmp_path / "evidence"
    made = [make(root, T0 + dt.timedelta(seconds=i), ok=True, image_id=f"sha256:{i}") for i in range(6)]
    (made[0] / "publish.json").write_text("{}")
    evidence.point_latest(root, made[1])  # latest names an old build (newer ones failed, say)
    removed = evidence.prune(root, 2, current=made[5])
    assert removed == [made[2], made[3]]
    assert evidence.builds(root) == [made[0], made[1], made[4], made[5]]
    assert evidence.prune(root, 2) == []  # what is left beyond two is published or latest
    assert evidence.keep_builds(3) == 3


@pytest.mark.parametrize("value", ["0", "-1", "ten"])
def test_a_bad_retention_is_refused(monkeypatch, value):
    monkeypatch.setenv(evidence.KEEP_ENV, value)
    with pytest.raises(UserError, match=f"{evidence.KEEP_ENV}="):
        evidence.keep_builds()


def test_retention_default_and_environment(monkeypatch):
    monkeypatch.delenv(evidence.KEEP_ENV, raising=False)
    assert evidence.keep_builds() == 10
    monkeypatch.setenv(evidence.KEEP_ENV, "4")
    assert evidence.keep_builds() == 4


def test_a_flat_legacy_evidence_directory_becomes_a_build_with_its_publish_record(tmp_path):
    root = tmp_path / "evidence"
    root.mkdir()
    (root / "result.json").write_text(json.dumps({"ok": True, "image_id": "sha256:old", "target": "t"}))
    (root / "publish.json").write_text("{}")
    (root / "smoke" / "r").mkdir(parents=True)
    os.utime(root / "result.json", (T0.timestamp(), T0.timestamp()))
    new = evidence.new_build(root, T0 + dt.timedelta(hours=1))
    old = root / "20260929T101530Z-001"
    assert sorted(p.name for p in old.iterdir()) == ["publish.json", "result.json", "smoke"]
    assert evidence.latest(root) == old.resolve() and evidence.builds(root) == [old, new]
    assert evidence.find_gated(root, "sha256:old")[0] == old


def test_smoke_goes_into_the_build_that_made_the_image(tmp_path):
    stack_dir = tmp_path / "post2"
    base = make(stack_dir / "evidence", T0, ok=True, image_id="sha256:aaa", target="t")
    over = make(stack_dir / "overlays" / "jev" / "evidence", T0, ok=True, image_id="sha256:bbb", target="t")
    assert evidence.smoke_dir(stack_dir, "sha256:aaa", "r") == base / "smoke" / "r"
    assert evidence.smoke_dir(stack_dir, "sha256:bbb", "r") == over / "smoke" / "r"
    assert evidence.smoke_dir(stack_dir, "sha256:0123456789abcdef", "r") == stack_dir / "smoke" / "0123456789ab" / "r"
