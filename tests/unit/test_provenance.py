"""Signed provenance: statements from a record and the build's inputs, DSSE envelopes signed with keys that
openssl made (Ed25519 and ECDSA P-256), and every refusal an operator relies on."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from stackforge.errors import UserError
from stackforge.publish import provenance
from tests.fixtures.records import a_record

DIGEST = "sha256:" + "a" * 64
INPUTS = {
    "upstreams": [
        {
            "name": "vllm",
            "kind": "git",
            "pin": "v0.28.0@2cf0a6915ce544dc493a0990f2ea38d81601128a",
            "commit_time": 1758800000,
            "series_hash": "sha256:" + "5" * 64,
            "patches": ["0001-musa.patch"],
        }
    ],
    "engine": {"server_version": "26.1.5", "buildx_version": "0.13.1", "buildkit_version": "v0.13.2"},
    "source_date_epoch": 1758800000,
    "time": "2026-09-29T10:15:30Z",
}


def openssl_key(tmp_path: Path, name: str, *algorithm: str) -> tuple[Path, Path]:
    key, pub = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub"
    subprocess.run(["openssl", "genpkey", *algorithm, "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    return key, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {
        "ed25519": openssl_key(d, "ed", "-algorithm", "ed25519"),
        "p256": openssl_key(d, "p256", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"),
        "other": openssl_key(d, "other", "-algorithm", "ed25519"),
        "rsa": openssl_key(d, "rsa", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"),
    }


def test_the_statement_names_the_image_and_what_built_it():
    rec = a_record(
        DIGEST,
        labels={"org.stackforge.base.id": "sha256:" + "b" * 64, "org.opencontainers.image.base.name": "ubuntu:22.04"},
    )
    stmt = provenance.statement(rec, INPUTS, "127.0.0.1:5000/team/vllm")
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["subject"] == [{"name": "127.0.0.1:5000/team/vllm", "digest": {"sha256": "a" * 64}}]
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    build = stmt["predicate"]["buildDefinition"]
    assert build["externalParameters"]["stack_files"] == {"example.yaml": "sha256:" + "d" * 64}
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    assert deps["vllm"]["digest"] == {"gitCommit": "2cf0a6915ce544dc493a0990f2ea38d81601128a"}
    assert deps["vllm"]["annotations"]["series_hash"] == "sha256:" + "5" * 64
    assert deps["idna"]["uri"] == "pkg:pypi/idna@3.10"
    assert deps["base"]["digest"] == {"sha256": "b" * 64}
    assert build["internalParameters"]["source_date_epoch"] == 1758800000
    run = stmt["predicate"]["runDetails"]
    assert run["builder"]["version"]["buildkit"] == "v0.13.2" and run["metadata"]["startedOn"] == INPUTS["time"]
    assert [b["name"] for b in run["byproducts"]] == ["image_id"]
    gated = provenance.statement({**rec, "gated_image_id": "sha256:" + "9" * 64}, INPUTS, "127.0.0.1:5000/team/vllm")
    produced = {b["name"]: b["digest"]["sha256"] for b in gated["predicate"]["runDetails"]["byproducts"]}
    assert produced == {"image_id": str(rec["image_id"]).split(":")[-1], "gated_image_id": "9" * 64}


@pytest.mark.parametrize("kind", ["ed25519", "p256"])
def test_a_signed_statement_opens_with_its_key_and_checks_against_the_record(keys, kind):
    key, pub = keys[kind]
    rec = a_record(DIGEST)
    body = provenance.sign(provenance.statement(rec, INPUTS, "r/team/vllm"), key)
    envelope = json.loads(body)
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    stmt = provenance.open_envelope(body, provenance.public_key(pub))
    assert all(ok for ok, _ in provenance.check(stmt, DIGEST, rec))


def test_another_key_a_changed_byte_and_another_digest_are_refused(keys):
    key, pub = keys["ed25519"]
    rec = a_record(DIGEST)
    body = provenance.sign(provenance.statement(rec, INPUTS, "r/team/vllm"), key)
    with pytest.raises(UserError, match="not signed by the given key"):
        provenance.open_envelope(body, provenance.public_key(keys["other"][1]))
    envelope = json.loads(body)
    signed = base64.b64decode(envelope["payload"])
    payload = signed.replace(b"idna@3.10", b"idna@3.11")
    assert payload != signed and len(payload) == len(signed)  # one byte changed
    envelope["payload"] = base64.b64encode(payload).decode()
    with pytest.raises(UserError, match="not signed by the given key"):
        provenance.open_envelope(json.dumps(envelope).encode(), provenance.public_key(pub))
    stmt = provenance.open_envelope(body, provenance.public_key(pub))
    failed = [line for ok, line in provenance.check(stmt, "sha256:" + "e" * 64, rec) if not ok]
    assert failed and failed[0].startswith("subject sha256:" + "a" * 64)
    other = a_record(DIGEST, pins={"idna": "3.11"}, fingerprint="0" * 16)
    failed = [line for ok, line in provenance.check(stmt, DIGEST, other) if not ok]
    assert any("differ idna" in line for line in failed) and any("fingerprint" in line for line in failed)


def test_keys_stackforge_does_not_sign_with_are_refused(keys, tmp_path):
    with pytest.raises(UserError) as err:
        provenance.signer(keys["rsa"][0])
    assert "Ed25519 or ECDSA P-256" in err.value.message and "openssl genpkey" in (err.value.fix or "")
    encrypted = tmp_path / "enc.pem"
    subprocess.run(
        ["openssl", "pkey", "-in", str(keys["ed25519"][0]), "-aes256", "-passout", "pass:x", "-out", str(encrypted)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(UserError, match="not an unencrypted PEM private key"):
        provenance.signer(encrypted)
    with pytest.raises(UserError, match="not a PEM public key"):
        provenance.public_key(keys["ed25519"][0])
    with pytest.raises(UserError, match="signing key does not exist"):
        provenance.signer(tmp_path / "missing.pem")
    with pytest.raises(UserError, match="not a DSSE envelope"):
        provenance.open_envelope(b"{}", provenance.public_key(keys["ed25519"][1]))


def test_a_copy_under_another_name_verifies_and_stays_strict(keys):
    """The statement binds the digest, not the repository (what `stackforge copy` relies on): checked for the image
    read from another registry and name it passes, its name shown and not checked; another digest fails whatever
    the name, and so does a statement whose subjects are malformed."""
    key, pub = keys["ed25519"]
    rec = a_record(DIGEST)
    published_as = "registry.example/team/vllm"
    stmt = provenance.open_envelope(
        provenance.sign(provenance.statement(rec, INPUTS, published_as), key), provenance.public_key(pub)
    )
    copied = {**rec, "repository": published_as}  # the record travels with the copy unchanged
    checks = provenance.check(stmt, DIGEST, copied)
    assert all(ok for ok, _ in checks), checks
    assert f"subject {DIGEST} pulled={DIGEST} (named '{published_as}': where it was published, not checked)" in [
        line for _, line in checks
    ]
    other = "sha256:" + "e" * 64
    (subject,) = [(ok, line) for ok, line in provenance.check(stmt, other, copied) if line.startswith("subject ")]
    assert subject == (False, f"subject {DIGEST} pulled={other}")  # the name does not help another digest
    (line,) = [x for x in provenance.check({**stmt, "subject": [{"digest": {"sha512": "a" * 128}}]}, DIGEST, copied)
               if x[1].startswith("subject ")]  # fmt: skip
    assert line[0] is False
    for bad in ([{"name": published_as, "digest": DIGEST}], "x", None):  # not a statement: refused, never a pass
        with pytest.raises(UserError, match="in-toto statement: subject"):
            provenance.check({**stmt, "subject": bad}, DIGEST, copied)
    several = {**stmt, "subject": [{"name": "a", "digest": {"sha256": "e" * 64}}, *stmt["subject"]]}
    assert all(ok for ok, _ in provenance.check(several, DIGEST, copied))  # one of its subjects is the image
