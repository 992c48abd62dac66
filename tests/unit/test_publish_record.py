"""The publish record attached to an image: schema, the referrers API, and the OCI 1.1 tag-schema fallback
(a ``sha256-<hex>`` tag holding an image index of the referrers), against the in-memory stub registry."""

from __future__ import annotations

import json

import pytest

from stackforge.clients import registry
from stackforge.clients.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient, RegistryError, parse_repository
from stackforge.errors import UserError
from stackforge.flows import operator
from stackforge.overlay.record import expected_labels
from stackforge.publish import record as records
from stackforge.publish.record_schema import OverlayPart, PublishRecord
from stackforge.stack import scheme
from stackforge.stack.scheme import TagScheme
from tests.fixtures.records import REPO, a_record
from tests.fixtures.stub_registry import StubRegistry


def the_record(digest: str, **changes) -> PublishRecord:
    return PublishRecord.model_validate(a_record(digest, **changes))


def setup(reg: StubRegistry) -> tuple[RegistryClient, dict]:
    digest = reg.put_image(REPO, "v1-20260929-r1", b'{"config": 1}', [b"layer"])
    body, media = reg.manifests[digest]
    client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"))
    return client, {"mediaType": media, "digest": digest, "size": len(body)}


def test_the_record_schema():
    assert records.check_schema(a_record("sha256:" + "a" * 64)) == []
    bad = a_record("sha256:" + "a" * 64, schema="other/v9", pins="idna==3.10")
    del bad["digest"]
    assert records.check_schema(bad) == [
        "schema is 'other/v9', not 'stackforge.publish-record/v1'",
        "digest: missing or not a str",
        "pins: missing or not a dict",
    ]
    assert records.check_schema([1]) == ["the record is not a JSON object"]


def test_the_artifact_refers_to_the_image_and_carries_the_record():
    subject = {"mediaType": OCI_MANIFEST, "digest": "sha256:" + "a" * 64, "size": 7}
    body, manifest = records.artifact(the_record(subject["digest"]), subject, "2026-09-29T10:00:00Z")
    doc = json.loads(manifest)
    assert doc["artifactType"] == records.ARTIFACT_TYPE and doc["subject"] == subject
    assert doc["config"] == {"mediaType": records.EMPTY_TYPE, "digest": records.sha256_digest(b"{}"), "size": 2}
    assert doc["layers"] == [
        {"mediaType": records.ARTIFACT_TYPE, "digest": records.sha256_digest(body), "size": len(body)}
    ]
    assert json.loads(body)["digest"] == subject["digest"]


def test_the_tag_schema_fallback_without_a_referrers_api():
    with StubRegistry() as reg:
        client, subject = setup(reg)
        first = records.attach(client, the_record(subject["digest"]), subject, "2026-09-29T10:00:00Z")
        assert first.via == "tag-schema" and first.fallback_tag == "sha256-" + subject["digest"][7:]
        again = records.attach(client, the_record(subject["digest"], tags=["x"]), subject, "2026-09-30T10:00:00Z")
        index_digest = reg.tag_digest(REPO, first.fallback_tag)
        body, media = reg.manifests[index_digest]
        index = json.loads(body)
        assert media == OCI_INDEX and index["mediaType"] == OCI_INDEX and index["schemaVersion"] == 2
        assert [m["digest"] for m in index["manifests"]] == [first.digest, again.digest]
        entry = index["manifests"][1]
        assert entry["artifactType"] == records.ARTIFACT_TYPE and entry["mediaType"] == OCI_MANIFEST
        assert entry["annotations"] == {records.CREATED: "2026-09-30T10:00:00Z"}
        records.attach(client, the_record(subject["digest"], tags=["x"]), subject, "2026-09-30T10:00:00Z")
        assert len(json.loads(reg.manifests[reg.tag_digest(REPO, first.fallback_tag)][0])["manifests"]) == 2  # once
        found = records.fetch(client, subject["digest"])
        assert found is not None and found.via == "tag-schema" and found.record["tags"] == ["x"]
        assert found.subject == subject["digest"] and found.manifest_digest == again.digest


def test_the_referrers_api_where_the_registry_has_it():
    with StubRegistry(referrers=True) as reg:
        client, subject = setup(reg)
        done = records.attach(client, the_record(subject["digest"]), subject, "2026-09-29T10:00:00Z")
        assert done.via == "referrers" and done.fallback_tag is None
        assert reg.tag_digest(REPO, records.fallback_tag(subject["digest"])) is None  # no fallback tag written
        found = records.fetch(client, subject["digest"])
        assert found is not None and found.via == "referrers" and found.record["digest"] == subject["digest"]


def test_an_image_without_a_record_and_a_record_served_altered():
    with StubRegistry() as reg:
        client, subject = setup(reg)
        assert records.fetch(client, subject["digest"]) is None
        records.attach(client, the_record(subject["digest"]), subject)
        found = records.fetch(client, subject["digest"])
        assert found is not None
        layer = json.loads(reg.manifests[found.manifest_digest][0])["layers"][0]["digest"]
        reg.blobs[layer] = reg.blobs[layer].replace(b"3.10", b"9.99")  # the registry serves other bytes
        with pytest.raises(RegistryError, match="served other bytes"):
            records.fetch(client, subject["digest"])


def test_the_newest_revision_of_a_date_and_of_all_dates():
    with StubRegistry() as reg:
        for tag in ("v1-20260928-r1", "v1-20260929-r1", "v1-20260929-r2", "v1-20260929-r10", "v1-latest"):
            reg.put_image(REPO, tag, tag.encode(), [b"l"])
        client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"))
        scheme = TagScheme.from_prefix("v1")
        assert operator.newest(client, scheme, None) == ("v1-20260929-r10", "20260929")
        assert operator.newest(client, scheme, "20260928") == ("v1-20260928-r1", "20260928")
        with pytest.raises(Exception, match="no published tag of 20260101"):
            operator.newest(client, scheme, "20260101")


@pytest.mark.parametrize(
    "ref, repo, reference",
    [
        ("127.0.0.1:5000/team/vllm:v1-20260929-r1", "127.0.0.1:5000/team/vllm", "v1-20260929-r1"),
        ("reg.example.com/team/vllm@sha256:" + "a" * 64, "reg.example.com/team/vllm", "sha256:" + "a" * 64),
    ],
)
def test_references(ref, repo, reference):
    got_repo, got_ref = registry.split_ref(ref)
    assert (str(got_repo), got_ref) == (repo, reference) and registry.is_remote(ref)
    assert not registry.is_remote("stackforge-example:py3.11")


def test_the_tag_schemes_read_off_a_repository_with_no_checkout():
    tags = [
        "v1-20260928-r1",
        "v1-20260929-r2",
        "v1-20260929-r2-vllm-openai",
        "jev-v1-20270105-r1",
        "v1-latest",
        "v1-20261399-r1",  # not a date
        "sha256-20260929" + "a" * 56,  # a record fallback tag
    ]
    found = scheme.streams(tags)
    assert {scheme.pattern(s): t for s, t in found.items()} == {
        "v1-YYYYMMDD-rN": ["v1-20260928-r1", "v1-20260929-r2"],
        "v1-YYYYMMDD-rN-vllm-openai": ["v1-20260929-r2-vllm-openai"],
        "jev-v1-YYYYMMDD-rN": ["jev-v1-20270105-r1"],
    }
    s = TagScheme("v1-", "-r", "")
    assert s in found and s.parse("v1-20260929-r2") == ("20260929", 2)


def test_pull_by_repository_picks_one_scheme_and_its_newest_revision():
    with StubRegistry() as reg:
        for tag in ("v1-20260928-r3", "v1-20260929-r1", "v1-20260929-r2", "jev-v1-20270105-r1", "v1-latest"):
            reg.put_image(REPO, tag, tag.encode(), [b"l"])
        client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"))
        with pytest.raises(UserError, match="holds 2 tag schemes: jev-v1-YYYYMMDD-rN .newest jev-v1-20270105-r1.; "
                           "v1-YYYYMMDD-rN .newest v1-20260929-r2.") as err:  # fmt: skip
            operator.newest_published(client, None, None)
        assert "--tags PATTERN" in str(err.value.fix)
        assert operator.newest_published(client, None, "v1-YYYYMMDD-rN") == ("v1-20260929-r2", "20260929")
        assert operator.newest_published(client, "20260928", "v1") == ("v1-20260928-r3", "20260928")
        assert operator.newest_published(client, None, "jev") == ("jev-v1-20270105-r1", "20270105")
        with pytest.raises(UserError, match="no published tag .* matching 'other'"):
            operator.newest_published(client, None, "other")


def test_an_overlay_record_and_the_labels_it_names():
    overlay = {
        "name": "jev",
        "fingerprint": "sha256:" + "1" * 64,
        "definition": {"sha256": "sha256:" + "2" * 64, "text": "base: {stack: post2, target: vllm-openai}\n"},
        "base": {"identity": "sha256:" + "3" * 64, "image_id": "sha256:" + "3" * 64, "ref": "vllm-musa:post2"},
        "ranges": {"vllm": "sha256:" + "4" * 64},
        "changed": {"vllm": "sha256:" + "5" * 64},
        "files": "sha256:" + "6" * 64,
    }
    assert records.check_schema(a_record("sha256:" + "a" * 64, overlay=overlay)) == []
    assert records.check_schema(a_record("sha256:" + "a" * 64, overlay={**overlay, "base": "x", "files": 1})) == [
        "overlay.base: missing or not a dict",
        "overlay.files: missing or not a str",
    ]
    ns = "org.stackforge.overlay"
    assert expected_labels(OverlayPart.model_validate(overlay)) == {
        ns: "jev",
        f"{ns}.fingerprint": overlay["fingerprint"],
        f"{ns}.files": overlay["files"],
        f"{ns}.base": overlay["base"]["identity"],
        f"{ns}.base.id": overlay["base"]["image_id"],
        f"{ns}.base.ref": "vllm-musa:post2",
        f"{ns}.range.vllm": overlay["ranges"]["vllm"],
        f"{ns}.changed.vllm": overlay["changed"]["vllm"],
    }


def test_pull_from_a_registry_that_does_not_answer_is_a_user_error(monkeypatch):
    client = RegistryClient(parse_repository(f"127.0.0.1:1/{REPO}"))

    def refused() -> list[str]:
        raise RegistryError("list tags: gave up after 6 attempt(s) in 5.0 s: connection refused")

    monkeypatch.setattr(client, "list_tags", refused)
    with pytest.raises(UserError, match="cannot list its tags: .*connection refused") as err:
        operator.newest_published(client, None, None)
    assert "registry address" in str(err.value.fix)
