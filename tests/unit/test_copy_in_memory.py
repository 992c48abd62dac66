"""`stackforge copy SRC DST` on in-memory registries: what the plan reads at the source, what the copy writes at the
destination (byte for byte, referrers kept valid, the fallback tag where the destination has no referrers API), a
second run that writes nothing, a run cut off part-way that completes, and sources that are refused before anything
is written. The engine tests (tests/integration/test_copy.py) do the same between two docker-registry processes and
verify the copy with `stackforge verify --key`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stackforge.clients.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient, RegistryError, parse_repository
from stackforge.errors import BuildFailed, UserError
from stackforge.flows.operator import verify_ref
from stackforge.publish import attest, copy, provenance, referrers
from stackforge.publish import record as records
from stackforge.publish.record_schema import parse
from tests.fixtures.records import a_record
from tests.fixtures.stub_registry import StubRegistry, digest_of

REPO = "team/vllm"
TAG = "v1-20260929-r1"
SBOM = b'{"bomFormat": "CycloneDX", "components": [{"purl": "pkg:pypi/idna@3.10"}]}'
WRITES = ("PUT", "POST", "PATCH", "DELETE")
A = "sha256:" + "a" * 64


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("keys")
    private, public = d / "ed.pem", d / "ed.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True)
    return private, public


def client(reg: StubRegistry, repo: str = REPO) -> RegistryClient:
    return RegistryClient(parse_repository(f"{reg.address}/{repo}"))


def publish(reg: StubRegistry, key: Path, repo: str = REPO, tag: str | None = TAG, layers=(b"one", b"two")) -> str:
    """An image with what `stackforge publish --sign-key` attaches: the record, the signed provenance (a referrer and
    cosign's .att tag) and the SBOM; its digest."""
    digest = reg.put_image(repo, tag, b'{"architecture": "amd64", "n": %d}' % len(layers), list(layers))
    c = client(reg, repo)
    subject = referrers.subject_of(c, digest)
    rec = a_record(digest, repository=f"{reg.address}/{repo}", tags=[tag] if tag else [])
    records.attach(c, parse(rec), subject, "2026-09-29T10:00:00Z")
    envelope = provenance.sign(provenance.statement(rec, {}, f"{reg.address}/{repo}"), key)
    referrers.attach(c, attest.PROVENANCE, envelope, subject, {"in-toto.io/predicate-type": provenance.PREDICATE_TYPE})
    attest.attach_cosign(c, digest, envelope)
    attest.attach_sbom(c, digest, SBOM)
    reg.requests.clear()
    return digest


def writes(reg: StubRegistry) -> list[tuple[str, str]]:
    return [r for r in reg.requests if r[0] in WRITES]


def test_the_plan_reads_the_image_what_is_attached_to_it_and_cosigns_tag(key):
    with StubRegistry() as src:
        digest = publish(src, key[0])
        p = copy.plan(client(src), TAG)
        assert p.digest == digest and p.root.role == "image"
        assert [n.role for n in p.nodes] == ["image", "referrer", "referrer", "referrer", "cosign"]
        assert p.kinds() == ["publish record", "signed provenance", "SBOM"]
        assert p.attached == {digest: [n.digest for n in p.nodes if n.role == "referrer"]}
        assert all(n.subject == digest for n in p.nodes if n.role == "referrer")
        (cosign,) = [n for n in p.nodes if n.role == "cosign"]
        assert cosign.tags == [referrers.fallback_tag(digest) + ".att"]
        for node in p.nodes:  # every manifest byte for byte as the source serves it
            assert src.manifests[node.digest][0] == node.body and digest_of(node.body) == node.digest
        assert {b.digest for b in p.blobs()} == {digest_of(b) for b in (b"one", b"two", referrers.EMPTY, SBOM)} | {
            digest_of(b'{"architecture": "amd64", "n": 2}')
        } | {b.digest for n in p.nodes if n.role != "image" for b in n.blobs}
        assert not writes(src)  # planning reads only


def test_a_copy_to_another_registry_and_name_keeps_every_digest_and_verifies_there(key, tmp_path):
    private, public = key
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, private)
        done = copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/mirror/vllm:night", clients=(client(src), client(dst, "mirror/vllm")))  # fmt: skip
        assert done.digest == digest and done.pinned == f"{dst.address}/mirror/vllm@{digest}"
        assert dst.tag_digest("mirror/vllm", "night") == digest
        planned = copy.plan(client(src), TAG).nodes
        assert all(dst.manifests[n.digest][0] == src.manifests[n.digest][0] for n in planned)  # byte for byte
        index = json.loads(dst.manifests[dst.tag_digest("mirror/vllm", referrers.fallback_tag(digest))][0])
        assert sorted(m["digest"] for m in index["manifests"]) == sorted(n.digest for n in planned if n.role == "referrer")  # fmt: skip
        assert done.referrers == "tag-schema" and dst.tag_digest("mirror/vllm", referrers.fallback_tag(digest))
        assert dst.tag_digest("mirror/vllm", attest.cosign_tag(digest)) == src.tag_digest(REPO, attest.cosign_tag(digest))  # fmt: skip
        assert done.counts()["blobs"] == {"uploaded": len(src.blobs)} and done.wrote
        # What `verify --key` reads at the destination: the record, the signature and the SBOM of that digest.
        there = client(dst, "mirror/vllm")
        found = records.fetch(there, digest)
        assert found is not None and found.via == "tag-schema" and found.parsed().digest == digest
        assert found.parsed().repository == f"{src.address}/{REPO}"  # where it was published: not bound
        checks = attest.check_provenance(there, digest, public, found.record)
        assert checks and all(ok for ok, _ in checks), checks
        other = tmp_path / "other.pub"
        subprocess.run(
            f"openssl genpkey -algorithm ed25519 | openssl pkey -pubout -out {other}", shell=True, check=True
        )
        wrong = attest.check_provenance(there, digest, other, found.record)  # as strict at the copy
        assert [ok for ok, _ in wrong] == [False] and "none of 1 provenance envelope(s) is signed by" in wrong[0][1]
        assert attest.sbom_of(there, digest) == SBOM
        lines = done.lines()
        assert lines[0] == f"copied: {src.address}/{REPO}:{TAG} -> {dst.address}/mirror/vllm:night"
        assert (
            "  attached   publish record, signed provenance, SBOM (at the destination through the tag-schema)" in lines
        )
        assert json.loads(json.dumps(done.to_json()))["counts"]["tags"] == {"written": 3}


def test_a_second_copy_writes_nothing(key):
    with StubRegistry() as src, StubRegistry() as dst:
        publish(src, key[0])
        pair = (client(src), client(dst))
        copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=pair)
        dst.requests.clear()
        again = copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=pair)
        assert not writes(dst), writes(dst)
        assert not again.wrote and again.lines()[0].startswith("already copied: ")
        assert set(again.counts()["blobs"]) == {"present"} and set(again.counts()["manifests"]) == {"present"}
        assert set(again.counts()["tags"]) == {"present"}
        assert [t["tag"] for t in again.tags][-1] == TAG  # no tag given: the source's


class CutOff(RegistryClient):
    """A destination whose connection drops at the ``cut``-th manifest PUT (and stays down)."""

    cut: int = 0
    puts: int = 0

    def put_manifest(self, reference, body, media_type):
        self.puts += 1
        if self.puts >= self.cut:
            raise RegistryError("PUT manifest: connection reset by peer")
        return super().put_manifest(reference, body, media_type)


@pytest.mark.parametrize("cut", [1, 3, 6, 7, 8])  # a manifest, a referrer, the fallback tag, cosign's, the tag
def test_a_copy_cut_off_part_way_leaves_no_tag_and_completes_when_run_again(key, cut):
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, key[0])
        broken = CutOff(parse_repository(f"{dst.address}/{REPO}"))
        broken.cut = cut
        with pytest.raises(BuildFailed) as err:
            copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}:{TAG}", clients=(client(src), broken))
        assert "run the same copy again" in (err.value.fix or "")
        assert dst.tag_digest(REPO, TAG) is None  # the tag is written last: never without the proof
        uploaded = set(dst.blobs)
        done = copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}:{TAG}", clients=(client(src), client(dst)))  # fmt: skip
        assert dst.tag_digest(REPO, TAG) == digest
        assert {b["digest"] for b in done.blobs if b["status"] == "present"} == uploaded  # not uploaded twice
        assert records.fetch(client(dst), digest) is not None and attest.sbom_of(client(dst), digest) == SBOM


def test_a_destination_with_the_referrers_api_gets_no_fallback_tag(key):
    with StubRegistry() as src, StubRegistry(referrers=True) as dst:
        digest = publish(src, key[0])
        done = copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=(client(src), client(dst)))
        assert done.referrers == "referrers API"
        assert dst.tag_digest(REPO, referrers.fallback_tag(digest)) is None
        found = records.fetch(client(dst), digest)
        assert found is not None and found.via == "referrers"


def test_a_fallback_tag_at_the_destination_keeps_what_it_lists(key):
    """The destination's fallback index gains the referrers it lacks; an entry of its own (a record attached there)
    stays, and a second copy leaves the index as it is."""
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, key[0])
        pair = (client(src), client(dst))
        copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=pair)
        theirs = records.attach(client(dst), parse(a_record(digest)), referrers.subject_of(client(dst), digest), "2030-01-01T00:00:00Z")  # fmt: skip
        before = dst.tag_digest(REPO, referrers.fallback_tag(digest))
        copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=pair)
        assert dst.tag_digest(REPO, referrers.fallback_tag(digest)) == before
        index = json.loads(dst.manifests[before][0])
        assert theirs.digest in [m["digest"] for m in index["manifests"]] and len(index["manifests"]) == 4


def test_an_index_is_copied_with_every_platform_manifest_and_what_is_attached_to_each(key):
    with StubRegistry() as src, StubRegistry() as dst:
        amd = publish(src, key[0], tag=None, layers=(b"amd64 layer",))
        arm = publish(src, key[0], tag=None, layers=(b"arm64 layer", b"more"))
        index = {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": d,
                    "size": len(src.manifests[d][0]),
                    "platform": {"architecture": a},
                }
                for d, a in ((amd, "amd64"), (arm, "arm64"))
            ],
        }
        body = json.dumps(index).encode()
        client(src).put_manifest(TAG, body, OCI_INDEX)
        top = digest_of(body)
        p = copy.plan(client(src), TAG)
        assert p.root.role == "index" and [n.role for n in p.nodes].count("child") == 2
        assert set(p.attached) == {amd, arm}  # the children's referrers
        done = copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=(client(src), client(dst)))
        assert dst.tag_digest(REPO, TAG) == top and dst.manifests[top][0] == body
        for child in (amd, arm):
            found = records.fetch(client(dst), child)
            assert found is not None and found.parsed().digest == child
            assert dst.tag_digest(REPO, attest.cosign_tag(child))
        assert done.manifests[-1]["role"] == "index"
        order = [m["digest"] for m in done.manifests]
        assert order.index(amd) < order.index(top) and order.index(arm) < order.index(top)  # children first


def hostile_referrer(src: StubRegistry, digest: str, manifest: dict) -> None:
    """List ``manifest`` in ``digest``'s fallback index at the source (as anyone with push rights could)."""
    c = client(src)
    body = json.dumps(manifest).encode()
    src.manifests[digest_of(body)] = (body, OCI_MANIFEST)  # as served, whatever blobs it names
    entry = referrers.descriptor(OCI_MANIFEST, body, artifactType=records.ARTIFACT_TYPE)
    current = c.get_manifest(referrers.fallback_tag(digest))
    index = referrers.fallback_index(current.json() if current else None, entry)
    c.put_manifest(referrers.fallback_tag(digest), json.dumps(index).encode(), OCI_INDEX)


def test_a_referrer_whose_subject_is_another_image_is_refused_before_anything_is_written(key):
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, key[0])
        other = publish(src, key[0], tag="other", layers=(b"another image",))
        body = src.manifests[next(n.digest for n in copy.plan(client(src), "other").nodes if n.role == "referrer")][0]
        stolen = json.loads(body)  # a record of the other image, listed as this one's
        assert stolen["subject"]["digest"] == other
        hostile_referrer(src, digest, stolen)
        with pytest.raises(copy.Refused) as err:
            copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=(client(src), client(dst)))
        assert f"is listed for {digest} but names the subject {other}" in err.value.message
        assert "nothing was copied" in err.value.message and not writes(dst)


def test_a_manifest_over_its_size_cap_is_refused(key):
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, key[0])
        big = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": records.ARTIFACT_TYPE,
            "config": referrers.descriptor(referrers.EMPTY_TYPE, referrers.EMPTY),
            "layers": [],
            "subject": referrers.subject_of(client(src), digest),
            "annotations": {"padding": "x" * (4 << 20)},
        }
        hostile_referrer(src, digest, big)
        with pytest.raises(BuildFailed) as err:
            copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=(client(src), client(dst)))
        assert "4.0 MiB" in err.value.message or "4194304" in err.value.message, err.value.message
        assert "nothing was copied" in err.value.message and not writes(dst)


def test_a_descriptor_that_is_not_one_and_a_manifest_that_is_not_an_image_are_refused(key):
    with StubRegistry() as src:
        digest = publish(src, key[0])
        hostile_referrer(src, digest, {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {"digest": "sha256:x"},
                                       "layers": [], "subject": referrers.subject_of(client(src), digest)})  # fmt: skip
        with pytest.raises(copy.Refused, match="has no sha256 digest"):
            copy.plan(client(src), TAG)
    with StubRegistry() as src:
        body = json.dumps({"schemaVersion": 1, "mediaType": "application/vnd.docker.distribution.manifest.v1+json"})
        src.manifests[digest_of(body.encode())] = (
            body.encode(),
            "application/vnd.docker.distribution.manifest.v1+json",
        )
        src.tags[REPO] = {"old": digest_of(body.encode())}
        with pytest.raises(copy.Refused, match="not an image manifest or index"):
            copy.plan(client(src), "old")


@pytest.mark.parametrize(
    ("src", "dst", "want"),
    [
        ("r.example/a/x:t1", "m.example:5000/b/y", ("r.example", "a/x", "t1", "m.example:5000", "b/y", "t1")),
        ("r.example/a/x:t1", "m.example/b/y:night", ("r.example", "a/x", "t1", "m.example", "b/y", "night")),
        (f"r.example/a/x@{A}", "m.example/y", ("r.example", "a/x", A, "m.example", "y", A)),
    ],
)
def test_references_a_destination_without_a_tag_takes_the_sources(src, dst, want):
    source, reference, target, wanted = copy.references(src, dst)
    assert (source.host, source.name, reference, target.host, target.name, wanted) == want


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        ("r.example/a/x:t1", "m.example/b/y:bad tag", "is not a tag"),
        ("r.example/a/x@sha256:abc", "m.example/b/y", "is not a digest"),
        ("user:pw@r.example/a/x:t1", "m.example/b/y", "carries no scheme and no credential"),
        ("r.example/a/x:t1", "y:night", "name the registry"),
    ],
)
def test_bad_references_are_refused(src, dst, match):
    with pytest.raises(UserError, match=match) as err:
        copy.references(src, dst)
    assert "pw" not in err.value.render()


def test_a_destination_digest_that_is_not_the_sources_is_refused(key):
    with StubRegistry() as src, StubRegistry() as dst:
        publish(src, key[0])
        with pytest.raises(UserError, match="DST names sha256:0000"):
            copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}@sha256:{'0' * 64}", clients=(client(src), client(dst)))  # fmt: skip
        assert not writes(dst)


def test_verify_of_a_tag_only_copy_names_what_is_missing_and_the_command_that_copies_it(key):
    """What skopeo copy or docker pull/tag/push leave at the mirror: the image, nothing attached to it. verify stops
    before any pull (no engine is needed to say so)."""
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, key[0])
        c = client(dst)
        for blob in copy.plan(client(src), TAG).root.blobs:
            data = src.blobs[blob.digest]
            c.upload_blob(blob.digest, len(data), lambda data=data: __import__("io").BytesIO(data))
        c.put_manifest(TAG, src.manifests[digest][0], OCI_MANIFEST)
        ref = f"{dst.address}/{REPO}:{TAG}"
        v = verify_ref(ref, engine=None, key=key[1])
        assert v.failed == 1
        assert any(
            l.startswith(f"FAIL record  none attached to {digest} in {dst.address}/{REPO} ")
            and l.endswith("missing here: publish record, signed provenance, SBOM")
            for l in v.lines
        ), v.lines
        (note,) = [l for l in v.lines if l.startswith("note ")]
        assert f"`stackforge copy SRC {ref}`" in note and f"`oras cp -r SRC {ref}`" in note and "skopeo copy" in note


def test_a_blob_served_with_other_bytes_is_not_uploaded(key):
    with StubRegistry() as src, StubRegistry() as dst:
        digest = publish(src, key[0])
        layer = digest_of(b"two")
        src.blobs[layer] = b"TWO"  # the source serves other bytes under the digest
        with pytest.raises(BuildFailed) as err:
            copy.copy(f"{src.address}/{REPO}:{TAG}", f"{dst.address}/{REPO}", clients=(client(src), client(dst)))
        assert "sha256 mismatch" in err.value.message and layer not in dst.blobs
        assert dst.tag_digest(REPO, TAG) is None and digest not in dst.manifests
