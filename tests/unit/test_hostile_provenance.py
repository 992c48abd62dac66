"""Signed provenance as hostile input: key files that are FIFOs, devices or huge; envelopes and statements of the
wrong shape, too deep or not UTF-8; attachments over their cap. Each gives a verdict line or one error, never a
traceback or a hang."""

from __future__ import annotations

import base64
import json

import pytest

from stackforge.clients.registry import OCI_MANIFEST, RegistryClient, RetryPolicy, parse_repository
from stackforge.errors import UserError
from stackforge.publish import attest, provenance
from tests.fixtures import hostile_files as hf
from tests.fixtures.records import a_record
from tests.fixtures.stub_registry import StubRegistry, digest_of
from tests.unit.test_provenance import DIGEST, INPUTS, keys  # noqa: F401 - the module's key fixture

FAST = RetryPolicy(attempts=1, base_delay=0, max_delay=0, total_seconds=10)


@pytest.mark.parametrize("maker", ["fifo", "zero_link", "not_utf8"])
def test_key_files_that_are_not_keys_are_one_error(tmp_path, maker):
    path = hf.SPECIALS[maker](tmp_path / "key.pub")
    with pytest.raises(UserError) as err:
        hf.within(5, provenance.public_key, path)
    assert str(path) in err.value.render()
    with pytest.raises(UserError):
        hf.within(5, provenance.signer, path)


def test_a_huge_key_file_is_refused(tmp_path):
    with pytest.raises(UserError, match="larger than"):
        provenance.public_key(hf.huge(tmp_path / "key.pub", 1 << 30))


def _envelope(body: bytes, **over) -> bytes:
    env = {"payload": base64.b64encode(body).decode(), "payloadType": provenance.PAYLOAD_TYPE,
           "signatures": [{"keyid": "k", "sig": base64.b64encode(b"x").decode()}], **over}  # fmt: skip
    return json.dumps(env).encode()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels"),
        (b'{"payload": "caf\xe9"}', "not UTF-8"),
        (b"[]", "(the document)"),
        (json.dumps({"payload": 5, "payloadType": "x", "signatures": []}).encode(), "payload"),
        (json.dumps({"payload": "a", "payloadType": "x", "signatures": "none"}).encode(), "signatures"),
        (_envelope(b"{}", signatures=[{"keyid": 1, "sig": "x"}]), "signatures[0].keyid"),
        (_envelope(b"{}", payload="!!!not base64!!!"), "DSSE envelope"),
    ],
)
def test_a_malformed_envelope_is_one_error_naming_the_field(keys, body, said):  # noqa: F811
    with pytest.raises(UserError, match="not a DSSE envelope") as err:
        provenance.open_envelope(body, provenance.public_key(keys["ed25519"][1]))
    assert said in err.value.message


def test_a_signed_statement_of_the_wrong_shape_is_refused(keys):  # noqa: F811
    key, pub = keys["ed25519"]
    from securesystemslib.dsse import Envelope

    for stmt, field in ((["not", "a", "statement"], "(the document)"), ({"_type": "x", "subject": [{"digest": "sha256:a"}], "predicateType": "p"}, "subject[0].digest")):  # fmt: skip
        env = Envelope(payload=json.dumps(stmt).encode(), payload_type=provenance.PAYLOAD_TYPE, signatures={})
        env.sign(provenance.signer(key))
        body = json.dumps(env.to_dict()).encode()
        with pytest.raises(UserError, match="not an in-toto statement") as err:
            provenance.open_envelope(body, provenance.public_key(pub))
        assert field in err.value.message


def _client(reg: StubRegistry) -> RegistryClient:
    return RegistryClient(parse_repository(f"{reg.address}/team/app"), policy=FAST, credentials=None)


def _attach_att(reg: StubRegistry, digest: str, layer: dict, blob: bytes | None = None) -> None:
    """A cosign ``.att`` manifest for ``digest`` holding ``layer`` (and its blob, when given)."""
    config = b"{}"
    reg.blobs[digest_of(config)] = config
    if blob is not None:
        reg.blobs[digest_of(blob)] = blob
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": 2},
                           "layers": [layer]}).encode()  # fmt: skip
    reg.manifests[digest_of(manifest)] = (manifest, OCI_MANIFEST)
    reg.tags.setdefault("team/app", {})[attest.cosign_tag(digest)] = digest_of(manifest)


def test_verify_key_gives_a_verdict_for_attachments_that_are_not_envelopes(keys):  # noqa: F811
    pub = keys["ed25519"][1]
    with StubRegistry() as reg:
        digest = reg.put_image("team/app", "v1", b'{"rootfs": {"diff_ids": []}}', [])
        over = {"mediaType": provenance.ENVELOPE_TYPE, "digest": "sha256:" + "0" * 64, "size": 1 << 40}
        _attach_att(reg, digest, over)
        lines = hf.within(20, attest.check_provenance, _client(reg), digest, pub, a_record(digest))
        assert len(lines) == 1 and lines[0][0] is False and "cannot be read" in lines[0][1]
        deep = b"[" * 100_000 + b"]" * 100_000
        _attach_att(reg, digest, {"mediaType": provenance.ENVELOPE_TYPE, "digest": digest_of(deep), "size": len(deep)}, deep)  # fmt: skip
        lines = hf.within(20, attest.check_provenance, _client(reg), digest, pub, a_record(digest))
        assert lines[0][0] is False and "nests 100000 levels" in lines[0][1]


def test_an_attached_sbom_that_is_not_one_is_a_failed_line_not_a_crash():
    ok, line = True, ""
    with pytest.raises(UserError, match="SBOM"):
        attest.check_sbom(b"\xff\xfe not json", '{"components": []}')
    with pytest.raises(UserError, match="components"):
        attest.check_sbom(b'{"components": "all"}', '{"components": []}')
    ok, line = attest.check_sbom(b'{"components": [{"purl": "pkg:pypi/a@1\\u001b[2J"}]}', '{"components": []}')
    assert not ok and "\x1b" not in line
