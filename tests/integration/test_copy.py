"""`stackforge copy` between two real docker-registry processes: the example image published with `--sign-key` to
the session's registry, copied under another repository name and tag to a registry that asks for a login (its
credentials from a docker config, the source's anonymous), verified there with `verify --key` from an empty
directory; a second copy uploads nothing, a copy cut off part-way completes, a copy within one registry mounts, a
tag-only copy (skopeo) fails `verify` naming `stackforge copy`, and a source listing a referrer of another image is
refused. docker-registry 2.8 has no referrers API: both sides use the tag-schema fallback."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from stackforge.clients.registry import OCI_MANIFEST, RegistryClient, parse_repository
from stackforge.publish import attest, referrers
from stackforge.publish import record as records
from stackforge.publish.record_schema import parse
from tests.fixtures import run_names
from tests.fixtures.records import a_record
from tests.fixtures.registry import start_registry

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20260929"
LOGIN = ("mirror", "m1rror-pw")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """(host:port of a docker-registry that asks for a login, the environment whose docker config holds it)."""
    base = tmp_path_factory.mktemp("mirror")
    url, stop = start_registry(base / "registry", login=LOGIN)
    config = base / "docker"
    config.mkdir()
    auth = base64.b64encode(":".join(LOGIN).encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {url: {"auth": auth}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STACKFORGE_REGISTRY_", "STACKFORGE_ROOT"))}
    env.update(DOCKER_CONFIG=str(config), STACKFORGE_CACHE=str(base / "cache"), PYTHONPATH=str(REPO / "tools"))
    try:
        yield url, env
    finally:
        pulled = subprocess.run(["docker", "image", "ls", "--digests", "--format", "{{.Repository}}@{{.Digest}}"],
                                capture_output=True, text=True).stdout.split()  # fmt: skip
        mine = [ref for ref in pulled if ref.startswith(f"{url}/")]
        if mine:
            subprocess.run(["docker", "image", "rm", *mine], capture_output=True)
        stop()


def stackforge(env: dict, *args: str, cwd: Path | None = None, root: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stackforge", *(["--root", str(root)] if root else []), *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=1800)  # fmt: skip


@pytest.fixture(scope="module")
def published(tmp_path_factory, base_image, registry, mirror):
    """The example image built and published with --sign-key to the session's registry: (reference, digest, the
    public key, the repository)."""
    _, env = mirror
    tmp = tmp_path_factory.mktemp("copysrc")
    root = tmp / "repo"
    root.mkdir()
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    key, pub = tmp / "key.pem", tmp / "key.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    tag = f"{run_names.NS}/example:copy-{uuid.uuid4().hex[:8]}"
    own = {**env, "STACKFORGE_CACHE": str(REPO / "build" / "cache")}
    built = stackforge(own, "build", "example", "--set", f"tags.local={tag}", root=root)
    assert built.returncode == 0, built.stderr[-4000:]
    try:
        proc = stackforge(own, "publish", "example", "--registry", f"{registry}/c{uuid.uuid4().hex[:8]}", "--date",
                          DATE, "--set", f"tags.local={tag}", "--sign-key", str(key), "--json", root=root)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)
    out = json.loads(proc.stdout)
    return f"{out['repository']}:{out['tag']}", out["digest"], pub, out["repository"]


@pytest.fixture(scope="module")
def copied(published, mirror, tmp_path_factory):
    """The first copy, to another registry, repository name and tag: (DST reference, its --json report)."""
    src, _, _, _ = published
    url, env = mirror
    dst = f"{url}/team/vllm-mirror:night"
    proc = stackforge(env, "copy", src, dst, "--json", cwd=tmp_path_factory.mktemp("copy-cwd"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dst, json.loads(proc.stdout)


def test_a_copy_under_another_name_verifies_with_the_key_at_the_mirror_from_an_empty_directory(
    published, mirror, copied, tmp_path
):
    src, digest, pub, repository = published
    dst, report = copied
    url, env = mirror
    assert report["digest"] == digest and report["pinned"] == f"{url}/team/vllm-mirror@{digest}"
    assert report["attached"] and set(report["attached"]) == {"publish record", "signed provenance", "SBOM"}
    assert report["referrers"] == "tag-schema" and report["counts"]["manifests"] == {"copied": 5}
    assert set(report["counts"]["blobs"]) == {"uploaded"} and report["uploaded_bytes"] > 0
    hexpart = digest.removeprefix("sha256:")
    assert [(t["tag"], t["status"]) for t in report["tags"]] == [
        (f"sha256-{hexpart}", "written"),
        (f"sha256-{hexpart}.att", "written"),
        ("night", "written"),
    ]
    empty = tmp_path / "operator"
    empty.mkdir()
    proc = stackforge(env, "verify", dst, "--key", str(pub), cwd=empty)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert f"PASS record  digest={digest} matches the pulled digest" in out
    assert any(l.startswith("note    tag     ") and f"a copy of {repository}" in l for l in out), out
    assert any(l.startswith("PASS signed  provenance signed by ") for l in out)
    assert any(l.startswith(f"PASS signed  subject {digest} pulled={digest} (named '{repository}'") for l in out)
    assert any(l.startswith("PASS sbom ") and l.endswith("0 mismatches") for l in out)
    assert "PASS gate    re-run inside the image with a read-only root filesystem" in out
    assert out[-1].startswith(f"verified {dst}: digest, record, signed provenance, image id, ") and out[-1].endswith(
        "— 0 failed"
    )
    assert list(empty.iterdir()) == []


def test_a_second_copy_uploads_nothing(published, mirror, copied, tmp_path):
    src, digest, _, _ = published
    dst, first = copied
    _, env = mirror
    proc = stackforge(env, "copy", src, dst, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert again["uploaded_bytes"] == 0 and again["digest"] == digest
    assert again["counts"] == {
        "manifests": {"present": 5},
        "blobs": {"present": len(first["blobs"])},
        "tags": {"present": 3},
    }
    text = stackforge(env, "copy", src, dst, cwd=tmp_path)
    assert text.returncode == 0 and text.stdout.startswith(f"already copied: {src} -> {dst}\n"), text.stdout


def _delete(url: str, path: str) -> None:
    resp = requests.delete(f"http://{url}/v2/{path}", auth=LOGIN, timeout=10)
    assert resp.status_code == 202, (path, resp.status_code, resp.text)


def test_a_copy_cut_off_part_way_completes_when_run_again(published, mirror, copied, tmp_path):
    """What a copy stopped part-way leaves: some blobs and manifests there, others (and the tag) not. A layer, the SBOM
    and the image manifest (with its tag) are removed from a complete copy; the next run puts back exactly those."""
    src, digest, pub, _ = published
    _, first = copied
    url, env = mirror
    dst = f"{url}/team/cut:night"
    assert stackforge(env, "copy", src, dst, cwd=tmp_path).returncode == 0
    layer = max(first["blobs"], key=lambda b: b["size"])["digest"]
    sbom = next(m["digest"] for m in first["manifests"] if m.get("artifact_type") == attest.SBOM.artifact_type)
    _delete(url, f"team/cut/blobs/{layer}")
    _delete(url, f"team/cut/manifests/{sbom}")
    _delete(url, f"team/cut/manifests/{digest}")  # and the tag naming it
    client = RegistryClient(parse_repository(f"{url}/team/cut"), credentials=LOGIN)
    assert client.head_manifest("night") is None and not client.blob_exists(layer)

    proc = stackforge(env, "copy", src, dst, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert [b["digest"] for b in done["blobs"] if b["status"] != "present"] == [layer]
    assert sorted(m["digest"] for m in done["manifests"] if m["status"] == "copied") == sorted([digest, sbom])
    assert {(t["tag"], t["status"]) for t in done["tags"]} >= {("night", "written")}
    # What `verify --key` reads there: the tag, the record, the signature and the SBOM of that digest.
    assert client.head_manifest("night").digest == digest
    found = records.fetch(client, digest)
    assert found is not None and found.parsed().digest == digest
    checks = attest.check_provenance(client, digest, pub, found.record)
    assert all(ok for ok, _ in checks), checks
    assert attest.sbom_of(client, digest) is not None


def test_a_copy_within_one_registry_mounts_every_blob(mirror, copied, tmp_path):
    dst, first = copied
    url, env = mirror
    proc = stackforge(env, "copy", dst, f"{url}/other/vllm", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["counts"]["blobs"] == {"mounted": len(first["blobs"])} and report["uploaded_bytes"] == 0
    assert report["tags"][-1] == {"tag": "night", "digest": first["digest"], "status": "written"}


@pytest.fixture(scope="module")
def skopeo() -> str:
    exe = shutil.which("skopeo")
    if exe is None:
        pytest.fail("skopeo is not installed: apt-get install -y skopeo (scripts/engine-setup.sh installs it; "
                    ".ci/run runs that)", pytrace=False)  # fmt: skip
    return exe


def test_a_tag_only_copy_fails_verify_naming_what_is_missing_and_stackforge_copy(published, mirror, skopeo, tmp_path):
    src, digest, pub, _ = published
    url, env = mirror
    dst = f"{url}/skopeo/vllm:night"
    proc = subprocess.run([skopeo, "copy", "--src-tls-verify=false", "--dest-tls-verify=false", "--authfile",
                           str(Path(env["DOCKER_CONFIG"]) / "config.json"), f"docker://{src}", f"docker://{dst}"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    checked = stackforge(env, "verify", dst, "--key", str(pub), cwd=tmp_path)
    assert checked.returncode == 1 and "Traceback" not in checked.stderr
    out = checked.stdout.splitlines()
    assert f"PASS digest  {dst} resolves to {digest}" in out  # skopeo kept the manifest: the same image
    assert any(l.startswith(f"FAIL record  none attached to {digest} in {url}/skopeo/vllm ") and
               l.endswith("missing here: publish record, signed provenance, SBOM") for l in out), out  # fmt: skip
    assert any(f"`stackforge copy SRC {dst}`" in l and f"`oras cp -r SRC {dst}`" in l for l in out), out
    assert out[-1].startswith(f"NOT verified {dst}: digest, record (FAILED)")


def test_a_source_listing_a_referrer_of_another_image_is_refused(published, mirror, tmp_path):
    """Someone with push rights at the source lists, among an image's referrers, a record whose subject is another
    image: the copy is refused before anything is written at the destination."""
    src, digest, _, repository = published
    url, env = mirror
    hostile = f"{repository.split('/', 1)[0]}/hostile/vllm"
    made = stackforge(env, "copy", src, f"{hostile}:night", cwd=tmp_path)  # the image as published, then tampered
    assert made.returncode == 0, made.stderr
    there = RegistryClient(parse_repository(hostile))
    config, layer = b'{"rootfs": {"type": "layers", "diff_ids": []}}', b"another image"
    for data in (config, layer):
        there.upload_blob(referrers.descriptor("x", data)["digest"], len(data), lambda d=data: io.BytesIO(d))
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": referrers.descriptor("application/vnd.oci.image.config.v1+json", config),
                       "layers": [referrers.descriptor("application/vnd.oci.image.layer.v1.tar", layer)]}).encode()  # fmt: skip
    other = referrers.descriptor(OCI_MANIFEST, body)["digest"]
    there.put_manifest(other, body, OCI_MANIFEST)
    theirs = records.attach(there, parse(a_record(other)), referrers.subject_of(there, other), "2999-01-01T00:00:00Z")
    listed = there.get_manifest(theirs.digest)
    entry = referrers.descriptor(OCI_MANIFEST, listed.body, artifactType=records.ARTIFACT_TYPE)
    index = there.get_manifest(referrers.fallback_tag(digest)).json()
    there.put_manifest(referrers.fallback_tag(digest), json.dumps(referrers.fallback_index(index, entry)).encode(),
                       "application/vnd.oci.image.index.v1+json")  # fmt: skip

    proc = stackforge(env, "copy", f"{hostile}:night", f"{url}/refused/vllm:night", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"referrer {theirs.digest} is listed for {digest} but names the subject {other}" in proc.stderr
    assert "nothing was copied" in proc.stderr
    assert requests.get(f"http://{url}/v2/refused/vllm/tags/list", auth=LOGIN, timeout=10).status_code == 404
