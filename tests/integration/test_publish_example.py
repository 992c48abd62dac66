"""`stackforge build example` then `stackforge publish example`: only the gated image is published.

The whole production path: the stack's tag templates, the build's evidence, the engine export,
the registry, the alias, the re-pull through the engine, and the evidence bundle.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
import requests
from packaging.version import Version

from tests.fixtures import osv_db, run_names

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20260929"


def stackforge(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory, base_image):
    root = tmp_path_factory.mktemp("pubexample") / "repo"
    root.mkdir()
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    tag = f"{run_names.NS}/example:publish-{uuid.uuid4().hex[:8]}"
    proc = stackforge(root, "build", "example", "--set", f"tags.local={tag}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield root, tag
    subprocess.run(["docker", "image", "rm", tag], capture_output=True)


def test_the_gated_example_image_is_published_verified_and_not_twice(built, registry):
    root, tag = built
    ns = f"e{uuid.uuid4().hex[:8]}"
    args = ("publish", "example", "--registry", f"{registry}/{ns}", "--date", DATE, "--set", f"tags.local={tag}")
    proc = stackforge(root, *args, "--verify-pull")
    assert proc.returncode == 0, proc.stderr
    evidence_dir = root / "build" / "example" / "evidence" / "latest"
    ev = json.loads((evidence_dir / "publish.json").read_text())
    result = json.loads((evidence_dir / "result.json").read_text())
    assert ev["status"] == "published" and ev["stack"] == "example" and ev["target"] == "escape"
    assert ev["repository"] == f"{registry}/{ns}/stackforge-example"
    assert ev["tag"].endswith(f"-{DATE}-r1") and ev["tag"].startswith("py")
    # The published image is the gated one normalized (file times clamped to the layer epoch): the record maps
    # the gated image id to what a pull gives.
    assert ev["gated_image_id"] == result["image_id"] == ev["gated_build"]["image_id"] != ev["image_id"]
    assert ev["verification"]["pull"]["identical"] is True
    assert f"published: {ev['repository']}:{ev['tag']}" in proc.stdout
    r = requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).json()
    record_tag = "sha256-" + ev["digest"].removeprefix("sha256:")  # the publish record (tag-schema fallback)
    assert sorted(r["tags"]) == sorted([ev["tag"], *ev["aliases"], record_tag])
    # The record was prepared in the settle pause (exported from the layer store, not `docker save`) and names
    # the tags the publish reported.
    events = [e["event"] for e in ev["push_log"]]
    assert "settle-work" in events and "settle-work-failed" not in events
    assert "export-from-layer-store" in events and "export-from-layer-store-refused" not in events
    attached = json.loads((evidence_dir / "record.json").read_text())
    assert attached["record"]["tags"] == [ev["tag"], *ev["aliases"]]
    head = requests.head(
        f"http://{registry}/v2/{ns}/stackforge-example/manifests/{ev['tag']}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        timeout=10,
    )
    assert head.headers["Docker-Content-Digest"] == ev["digest"]

    again = stackforge(root, *args)
    assert again.returncode == 0, again.stderr
    assert "already published" in again.stdout and ev["tag"] in again.stdout
    assert sorted(
        requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).json()["tags"]
    ) == sorted(r["tags"])


def test_an_image_that_is_not_the_gated_one_is_refused(built, registry, tmp_path):
    root, tag = built
    ns = f"e{uuid.uuid4().hex[:8]}"
    other = f"{run_names.NS}/example:ungated-{ns}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("not-gated")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"no\n"))
    subprocess.run(["docker", "import", "-", other], input=buf.getvalue(), capture_output=True, check=True)
    try:
        proc = stackforge(
            root, "publish", "example", "--registry", f"{registry}/{ns}", "--date", DATE, "--set", f"tags.local={other}"
        )
    finally:
        subprocess.run(["docker", "image", "rm", other], capture_output=True)
    assert proc.returncode == 1 and "but no gated build of example/" in proc.stderr
    assert requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).status_code == 404


def test_a_stack_that_fails_lint_publishes_nothing(built, registry):
    root, tag = built
    ns = f"e{uuid.uuid4().hex[:8]}"
    proc = stackforge(
        root,
        "publish",
        "post2",
        "--registry",
        f"{registry}/{ns}",
        "--allow-ungated",
        "--set",
        f"tags.local={tag}",
        "--set",
        "packages.torchvision.version=0.26.0.post1+musa5.2.0",
    )
    assert proc.returncode == 1 and "stack 'post2' fails lint" in proc.stderr and "torchvision" in proc.stderr
    assert "Nothing was published." in proc.stderr and "Traceback" not in proc.stderr
    assert requests.get(f"http://{registry}/v2/{ns}/vllm/tags/list", timeout=10).status_code == 404


def openssl_key(directory: Path, name: str, *algorithm: str) -> tuple[Path, Path]:
    key, pub = directory / f"{name}.pem", directory / f"{name}.pub"
    subprocess.run(["openssl", "genpkey", *algorithm, "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    return key, pub


def test_a_signed_publish_attaches_provenance_before_any_tag(built, registry, tmp_path):
    from stackforge.publish import provenance

    root, tag = built
    ns = f"e{uuid.uuid4().hex[:8]}"
    key, pub = openssl_key(tmp_path, "p256", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    rsa, _ = openssl_key(tmp_path, "rsa", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
    args = ("publish", "example", "--registry", f"{registry}/{ns}", "--date", DATE, "--set", f"tags.local={tag}")
    refused = stackforge(root, *args, "--sign-key", str(rsa))
    assert refused.returncode == 2 and "Ed25519 or ECDSA P-256" in refused.stderr
    assert requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).status_code == 404

    proc = stackforge(root, *args, "--sign-key", str(key))
    assert proc.returncode == 0, proc.stderr
    evidence_dir = root / "build" / "example" / "evidence" / "latest"
    ev = json.loads((evidence_dir / "publish.json").read_text())
    base = f"http://{registry}/v2/{ns}/stackforge-example"
    hexpart = ev["digest"].removeprefix("sha256:")
    tags = requests.get(f"{base}/tags/list", timeout=10).json()["tags"]
    assert f"sha256-{hexpart}.att" in tags  # cosign's attestation tag
    index = requests.get(
        f"{base}/manifests/sha256-{hexpart}", headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10
    ).json()
    kinds = sorted(m["artifactType"] for m in index["manifests"])
    assert kinds == [
        "application/vnd.cyclonedx+json",
        "application/vnd.in-toto+json",
        "application/vnd.stackforge.publish-record.v1+json",
    ]
    # The build's SBOM travels with the image: `sbom REF` reads it back from the registry, byte for byte.
    ref = f"{registry}/{ns}/stackforge-example:{ev['tag']}"
    printed = stackforge(root, "sbom", ref)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == (evidence_dir / "sbom.cdx.json").read_text()
    sbom_doc = json.loads(printed.stdout)
    inventory = json.loads((evidence_dir / "inventory.json").read_text())
    assert {c["name"] for c in sbom_doc["components"] if c["purl"].startswith("pkg:pypi/")} == {
        d["name"] for d in inventory["dists"]
    }
    assert any(c["purl"].startswith("pkg:deb/debian/libc6@") for c in sbom_doc["components"])
    envelope = (evidence_dir / "provenance.json").read_bytes()
    stmt = provenance.open_envelope(envelope, provenance.public_key(pub))
    record = json.loads((evidence_dir / "record.json").read_text())["record"]
    assert all(ok for ok, _ in provenance.check(stmt, ev["digest"], record)), provenance.check(
        stmt, ev["digest"], record
    )
    deps = {d["name"] for d in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert "base" in deps and set(record["pins"]) <= deps

    # The operator's side: the key opens it, the statement describes the pulled image and its record, and the
    # attached SBOM lists exactly what the pulled image has installed.
    checked = stackforge(root, "verify", ref, "--key", str(pub))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "PASS signed  provenance signed by" in checked.stdout
    assert "PASS signed  subject sha256:" in checked.stdout
    assert "0 mismatches" in checked.stdout and "PASS sbom" in checked.stdout
    _, other = openssl_key(tmp_path, "other", "-algorithm", "ed25519")
    wrong = stackforge(root, "verify", ref, "--key", str(other))
    assert wrong.returncode == 1 and "is signed by" in wrong.stdout and "FAIL signed" in wrong.stdout
    unsigned_ns = f"u{uuid.uuid4().hex[:8]}"
    plain = (
        "publish",
        "example",
        "--registry",
        f"{registry}/{unsigned_ns}",
        "--date",
        DATE,
        "--set",
        f"tags.local={tag}",
    )
    assert stackforge(root, *plain).returncode == 0
    unsigned_ref = f"{registry}/{unsigned_ns}/stackforge-example:{ev['tag']}"
    refused = stackforge(root, "verify", unsigned_ref, "--key", str(pub))
    assert refused.returncode == 1 and "the image is unsigned" in refused.stdout

    again = stackforge(root, *args, "--sign-key", str(key))  # already published and signed: nothing new
    assert again.returncode == 0 and "already published" in again.stdout
    index2 = requests.get(
        f"{base}/manifests/sha256-{hexpart}", headers={"Accept": "application/vnd.oci.image.index.v1+json"}, timeout=10
    ).json()
    signed = [m for m in index2["manifests"] if m["artifactType"] == "application/vnd.in-toto+json"]
    assert len(signed) == 1  # signed once: the re-publish found its signature (its record is attached again)


def test_a_known_vulnerability_keeps_the_aliases_where_they_were(built, registry, tmp_path):
    root, tag = built
    ns = f"e{uuid.uuid4().hex[:8]}"
    osv_dir = osv_db.fresh_copy(tmp_path / "osv")
    args = ("publish", "example", "--registry", f"{registry}/{ns}", "--date", DATE, "--set", f"tags.local={tag}")
    held = stackforge(root, *args, "--osv", str(osv_dir), "--fail-on", "medium")
    assert held.returncode == 0, held.stderr
    evidence_dir = root / "build" / "example" / "evidence" / "latest"
    ev = json.loads((evidence_dir / "publish.json").read_text())
    sbom_doc = json.loads((evidence_dir / "sbom.cdx.json").read_text())
    pip = next(c["version"] for c in sbom_doc["components"] if c["name"] == "pip")
    assert Version(pip) < Version("25.3")  # the example image's pip is older than the fixture advisory's fix
    assert ev["scan"]["blocking"] and "TEST-GHSA-4xh5-x5gv-qwph" in ev["scan"]["blocking"]
    assert "not moved: " in held.stdout and "at or above medium" in held.stdout
    tags = requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).json()["tags"]
    assert ev["tag"] in tags and not any(t.endswith("-latest") for t in tags)  # immutable tag only

    # A reviewer waives what blocks (stacks/waivers.yaml, with a reason): the verdict is waived, the alias moves.
    found = stackforge(
        root,
        "scan",
        "--sbom",
        str(evidence_dir / "sbom.cdx.json"),
        "--osv",
        str(osv_dir),
        "--fail-on",
        "medium",
        "--json",
    )
    blocking = [f for f in json.loads(found.stdout)["findings"] if f["blocking"]]
    assert found.returncode == 1 and {f["id"] for f in blocking} == set(ev["scan"]["blocking"])
    entries = "".join(
        f"  - {{id: {f['id']}, package: {f['package']}, versions: ['{f['version']}'], "
        f"reason: 'accepted for the test: the fix needs a newer base image', expires: 2099-12-31}}\n"
        for f in blocking
    )
    waivers = root / "stacks" / "waivers.yaml"
    waivers.write_text("waivers:\n" + entries)
    try:
        waived = stackforge(root, *args, "--osv", str(osv_dir), "--fail-on", "medium")
    finally:
        waivers.unlink()
    assert waived.returncode == 0 and "already published" in waived.stdout, waived.stderr
    scan = json.loads((evidence_dir / "publish.json").read_text())["scan"]
    assert scan["verdict"] == "waived" and scan["blocked"] == [] and scan["waivers"] == "stacks/waivers.yaml"
    assert scan["waived"][0]["reason"].startswith("accepted for the test") and scan["waived"][0]["expires"] == "2099-12-31"  # fmt: skip
    tags = requests.get(f"http://{registry}/v2/{ns}/stackforge-example/tags/list", timeout=10).json()["tags"]
    assert any(t.endswith("-latest") for t in tags)  # every blocking finding waived: the alias moves
