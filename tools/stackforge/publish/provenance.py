"""Signed provenance: an in-toto Statement v1 whose subject is the published image and whose predicate is SLSA
provenance v1, in a DSSE envelope signed with the publisher's key (securesystemslib: Ed25519 or ECDSA P-256 PEM
keys, as ``openssl genpkey`` writes them).

The predicate says what the image was built from, taken from the publish record and the build's evidence
(``inputs.json``): the stack, target, ``--set`` values and the stack files' sha256 (external parameters); every
pin, every upstream at its commit (tag, commit time, patch series hash) and the base image (resolved
dependencies); the builder, engine, buildx and BuildKit versions, SOURCE_DATE_EPOCH and the build id (run
details). :func:`check` is the operator's side: the envelope's signature by the given key, the statement's subject
against the pulled digest, and the predicate against the publish record of that digest.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stackforge import __version__, safeio
from stackforge.errors import UserError, printable

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "https://github.com/stackforge/stackforge/build/v1"
BUILDER_ID = "https://github.com/stackforge/stackforge"
ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"


def statement(record: dict[str, Any], inputs: dict[str, Any], repository: str) -> dict[str, Any]:
    """The in-toto statement of one publish: ``record`` (the publish record's data), ``inputs`` (the build's
    ``inputs.json``), ``repository`` (``host/name`` the image was published to)."""
    digest = str(record["digest"])
    labels = record.get("labels") or {}
    deps: list[dict[str, Any]] = []
    for up in inputs.get("upstreams") or []:
        pin = str(up.get("pin", ""))
        ref, _, commit = pin.partition("@")
        dep: dict[str, Any] = {"name": up.get("name"), "uri": f"{up.get('kind')}:{up.get('name')}@{ref}"}
        if up.get("kind") == "git" and commit:
            dep["digest"] = {"gitCommit": commit}
        elif commit.startswith("sha256:"):
            dep["digest"] = {"sha256": commit.split(":", 1)[1]}
        dep["annotations"] = {
            k: up[k] for k in ("commit_time", "series_hash", "patches") if up.get(k) not in (None, [], "")
        }
        deps.append(dep)
    for name, version in sorted((record.get("pins") or {}).items()):
        deps.append({"name": name, "uri": f"pkg:pypi/{name}@{version}"})
    base = labels.get("org.stackforge.base.id")
    if base:
        deps.append(
            {
                "name": "base",
                "uri": f"docker-image:{labels.get('org.opencontainers.image.base.name', '')}",
                "digest": {"sha256": str(base).split(":", 1)[-1]},
            }
        )
    engine = inputs.get("engine") or {}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": repository, "digest": {"sha256": digest.split(":", 1)[1]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "stack": record.get("stack"),
                    "target": record.get("target"),
                    "overrides": record.get("overrides"),
                    "stack_files": {n: e.get("sha256") for n, e in (record.get("stack_files") or {}).items()},
                },
                "internalParameters": {
                    "fingerprint": record.get("fingerprint"),
                    "inputs_fingerprint": record.get("inputs_fingerprint"),
                    "source_date_epoch": inputs.get("source_date_epoch"),
                    "options": record.get("options"),
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER_ID,
                    "version": {
                        "stackforge": __version__,
                        "docker": engine.get("server_version"),
                        "buildx": engine.get("buildx_version"),
                        "buildkit": engine.get("buildkit_version"),
                    },
                },
                "metadata": {"invocationId": record.get("build_id"), "startedOn": inputs.get("time")},
                "byproducts": _byproducts(record),
            },
        },
    }


def _byproducts(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The image id (what a pull gives) and, when publishing normalized the image, the id of the one the gate ran in."""
    out = []
    for name in ("image_id", "gated_image_id"):
        value = record.get(name)
        if value and (name == "image_id" or value != record.get("image_id")):
            out.append({"name": name, "digest": {"sha256": str(value).split(":")[-1]}})
    return out


# -- keys and envelopes -----------------------------------------------------------------------------------


#: a PEM key file: a few hundred bytes
KEY_LIMIT = 64 << 10
#: a DSSE envelope of one statement (the attachment's own cap is larger; the statement is a few KiB)
ENVELOPE_LIMIT = 4 << 20


class _Signature(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    keyid: str = ""
    sig: str


class DsseEnvelope(BaseModel):
    """A DSSE envelope as the attachment holds it (``payload`` and each ``sig`` in base64)."""

    model_config = ConfigDict(extra="allow", strict=True)
    payload: str
    payloadType: str
    signatures: list[_Signature]


class _Subject(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = ""
    digest: dict[str, str]


class _BuildDefinition(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    externalParameters: Any = None
    internalParameters: dict[str, Any] = Field(default_factory=dict)
    resolvedDependencies: list[dict[str, Any]] = Field(default_factory=list)


class _Predicate(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    buildDefinition: _BuildDefinition = Field(default_factory=_BuildDefinition)


class Statement(BaseModel):
    """The in-toto statement in a signed envelope: the parts :func:`check` reads, each of its type."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)
    type_: str = Field(alias="_type")
    subject: list[_Subject]
    predicateType: str
    predicate: _Predicate = Field(default_factory=_Predicate)


def _read(path: Path, what: str) -> bytes:
    return safeio.read_bytes(path, limit=KEY_LIMIT, what=what)


def _check_curve(key: Any, path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    ok = isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)) or (
        isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and key.curve.name == "secp256r1"
    )
    if not ok:
        raise UserError(
            f"{path}: a {type(key).__name__.lstrip('_')} key; stackforge signs with Ed25519 or ECDSA P-256",
            file=str(path),
            fix="openssl genpkey -algorithm ed25519 -out key.pem (or -algorithm EC -pkeyopt ec_paramgen_curve:P-256)",
        )


def signer(path: Path) -> Any:
    """A signer of the PEM private key at ``path`` (unencrypted PKCS#8, as ``openssl genpkey`` writes it)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        key = load_pem_private_key(_read(path, "signing key"), password=None)
    except (ValueError, TypeError) as exc:
        raise UserError(
            f"{path}: not an unencrypted PEM private key ({exc})",
            file=str(path),
            fix="give the key openssl genpkey wrote (PKCS#8 PEM, no passphrase)",
        ) from None
    _check_curve(key, path)
    return CryptoSigner(key)


def public_key_of(private: Path) -> Any:
    """The securesystemslib public key of the PEM private key at ``private``."""
    return signer(private).public_key


def public_key(path: Path) -> Any:
    """The securesystemslib key of the PEM public key at ``path`` (``openssl pkey -pubout``)."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    try:
        key = load_pem_public_key(_read(path, "public key"))
    except (ValueError, TypeError) as exc:
        raise UserError(
            f"{path}: not a PEM public key ({exc})", file=str(path), fix="openssl pkey -in key.pem -pubout -out key.pub"
        ) from None
    _check_curve(key, path)
    return SSlibKey.from_crypto(key)


def sign(stmt: dict[str, Any], key_path: Path) -> bytes:
    """The DSSE envelope (JSON bytes) of ``stmt`` signed with the key at ``key_path``."""
    from securesystemslib.dsse import Envelope

    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer(key_path))
    return json.dumps(envelope.to_dict(), sort_keys=True).encode()


def open_envelope(body: bytes, key: Any) -> dict[str, Any]:
    """The statement of the envelope ``body`` when ``key`` signed it; a ``UserError`` saying why not."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    try:
        data = safeio.parse_model(
            DsseEnvelope, body, source="the provenance", what="DSSE envelope", limit=ENVELOPE_LIMIT
        )
        envelope = Envelope.from_dict(data.model_dump(mode="json"))
    except safeio.Malformed as exc:
        raise UserError(f"the provenance is not a DSSE envelope: {exc.message}") from None
    except (ValueError, KeyError, TypeError) as exc:  # base64 that does not decode
        raise UserError(f"the provenance is not a DSSE envelope: {printable(exc)[:200]}") from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise UserError(f"the provenance's payloadType is {envelope.payload_type!r}, not {PAYLOAD_TYPE}")
    try:
        envelope.verify([key], 1)
    except VerificationError:
        raise UserError(
            f"the provenance is not signed by the given key (keyid {key.keyid[:16]}…): signed by "
            + ", ".join(s[:16] + "…" for s in envelope.signatures)
        ) from None
    try:
        stmt = safeio.parse_json(envelope.payload, source="the signed provenance", what="payload", limit=ENVELOPE_LIMIT)
        safeio.validate(Statement, stmt, source="the signed provenance", what="in-toto statement")
    except safeio.Malformed as exc:
        raise UserError(f"the signed provenance is not an in-toto statement: {exc.message}") from None
    return stmt


def check(stmt: dict[str, Any], digest: str, record: dict[str, Any] | None) -> list[tuple[bool, str]]:
    """(ok, line) for the statement's type, subject and predicate against the pulled ``digest`` and its record.
    The statement came from a registry: it is read through :class:`Statement`, and what it says reaches a line
    only as printable text. The pulled digest must be one of the subjects' sha256; a subject's name (where the image
    was published) is shown, not checked, so a copy under another repository name verifies."""
    parsed = safeio.validate(Statement, stmt, source="the signed provenance", what="in-toto statement")

    def shown(value: Any) -> str:
        return printable(value)[:200]

    out: list[tuple[bool, str]] = []
    out.append((parsed.type_ == STATEMENT_TYPE, f"statement type {shown(parsed.type_)}"))
    out.append((parsed.predicateType == PREDICATE_TYPE, f"predicate type {shown(parsed.predicateType)}"))
    subjects = [s.digest.get("sha256") for s in parsed.subject]
    want = digest.split(":", 1)[1]
    if want in subjects:  # the digest is bound; the subject's name (the repository it was published to) is not
        name = parsed.subject[subjects.index(want)].name
        named = f" (named {shown(name)!r}: where it was published, not checked)" if name else ""
        out.append((True, f"subject sha256:{want} pulled={digest}{named}"))
    else:
        out.append((False, f"subject sha256:{shown(subjects[0]) if subjects else 'none'} pulled={digest}"))
    if record is not None:
        expected = statement(record, {}, "")["predicate"]["buildDefinition"]
        got = parsed.predicate.buildDefinition
        out.append(
            (
                got.externalParameters == expected.get("externalParameters"),
                "predicate externalParameters against the publish record",
            )
        )
        pins = {d["name"]: d["uri"] for d in expected["resolvedDependencies"] if d["uri"].startswith("pkg:pypi/")}
        have = {d.get("name"): d.get("uri") for d in got.resolvedDependencies}
        differ = sorted(n for n in pins if have.get(n) != pins[n])
        out.append(
            (
                not differ,
                f"predicate {len(pins)} pins against the record" + (f": differ {', '.join(differ)}" if differ else ""),
            )
        )
        fp = got.internalParameters.get("fingerprint")
        out.append((fp == record.get("fingerprint"), f"predicate fingerprint={shown(fp)} record={record.get('fingerprint')}"))  # fmt: skip
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
