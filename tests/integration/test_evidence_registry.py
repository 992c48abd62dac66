"""Evidence per build and operators without the build host, on the example stack and a loopback registry
(docker-registry 2.8: no referrers API, so records use the OCI 1.1 tag-schema fallback).

Two builds of one stack in a row keep both evidence sets (``latest`` moves to the second), and the earlier
gated image is still published from its own evidence, with its record attached; `pull` and `verify` from an
empty directory check it; a tampered record and a digest that does not match the record are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stackforge.builder.records import evidence
from tests.fixtures import run_names

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20260929"


def stackforge(root: Path | None, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, STACKFORGE_CACHE=str(REPO / "build" / "cache"), PYTHONPATH=str(REPO / "tools"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", *(["--root", str(root)] if root else []), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=1800,
    )


def image_id(ref: str) -> str:
    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, base_image):
    """Two builds of the example stack in a row: the first as it is, the second with another description (a
    label, so another image) under another local tag."""
    root = tmp_path_factory.mktemp("evidence") / "repo"
    root.mkdir()
    shutil.copytree(REPO / "stacks", root / "stacks")
    shutil.copytree(REPO / "patches", root / "patches")
    token = uuid.uuid4().hex[:8]
    first, second = f"{run_names.NS}/example:ev1-{token}", f"{run_names.NS}/example:ev2-{token}"
    a = stackforge(root, "build", "example", "--set", f"tags.local={first}")
    assert a.returncode == 0, a.stderr[-4000:]
    b = stackforge(
        root, "build", "example", "--set", f"tags.local={second}", "--set", f"description=second build {token}"
    )
    assert b.returncode == 0, b.stderr[-4000:]
    yield root, first, second
    subprocess.run(["docker", "image", "rm", first, second], capture_output=True)


def test_two_builds_keep_both_evidence_sets_and_latest_moves(two_builds):
    root, first, second = two_builds
    ev_root = root / "build" / "example" / "evidence"
    builds = evidence.builds(ev_root)
    assert len(builds) == 2
    results = [json.loads((b / "result.json").read_text()) for b in builds]
    assert [r["image_id"] for r in results] == [image_id(first), image_id(second)]
    assert image_id(first) != image_id(second)
    assert [r["build_id"] for r in results] == [b.name for b in builds]
    for b in builds:  # each set is whole
        assert {"inputs.json", "Dockerfile", "build.log", "gate.txt", "result.json"} <= {p.name for p in b.iterdir()}
    assert os.readlink(ev_root / "latest") == builds[1].name


def test_publishing_the_earlier_gated_image_still_works(two_builds, published):
    root, first, _ = two_builds
    older, newer = evidence.builds(root / "build" / "example" / "evidence")
    record = json.loads((older / "publish.json").read_text())
    assert record["gated_image_id"] == image_id(first) and record["gated_build"]["build_id"] == older.name
    assert record["digest"] == published[2]["digest"]
    assert not (newer / "publish.json").exists()


def test_an_image_no_gated_build_made_is_refused(two_builds, registry):
    root, first, _ = two_builds
    other = f"{run_names.NS}/example:evx-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "tag", "stackforge/base:bookworm", other], check=True, capture_output=True)
    try:
        proc = stackforge(root, "publish", "example", "--registry", f"{registry}/evx", "--date", DATE,
                          "--set", f"tags.local={other}")  # fmt: skip
    finally:
        subprocess.run(["docker", "image", "rm", other], capture_output=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no gated build of example/escape" in proc.stderr and "nothing was published" in proc.stderr


def publish_first(two_builds, registry) -> tuple[str, str, dict]:
    """Publish the first build's image to a fresh namespace: (repository, immutable tag, publish.json)."""
    root, first, _ = two_builds
    ns = f"ev{uuid.uuid4().hex[:8]}"
    proc = stackforge(root, "publish", "example", "--registry", f"{registry}/{ns}", "--date", DATE,
                      "--set", f"tags.local={first}", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    published = json.loads(proc.stdout)
    return published["repository"], published["tag"], published


@pytest.fixture(scope="module")
def published(two_builds, registry) -> tuple[str, str, dict]:
    """The first build's image, published while a later build of the stack exists."""
    return publish_first(two_builds, registry)


#: what the operator's install adds to an empty virtual environment (MB, as ``du -sm`` counts): measured 68 MB with
#: Python 3.11 (README.md "Install"); the whole site-packages, pip and setuptools included, 93 MB
ADDED_MB, SITE_MB = 75, 100
_EMPTY_SITE_MB: list[int] = []


def du_mb(path: Path) -> int:
    return int(subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


@pytest.fixture(scope="module")
def installed_cli(installed_wheel) -> Path:
    """stackforge as an operator installs it (the session's ``installed_wheel``): its ``stackforge`` executable."""
    _EMPTY_SITE_MB[:] = [installed_wheel.empty_site_mb]
    return installed_wheel.cli


def test_the_installed_wheel_verifies_a_published_image_from_an_empty_directory(installed_cli, published, tmp_path):
    """The templates and in-image scripts travel in the wheel: verify re-runs the gate from them, anywhere."""
    repository, tag, published = published
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STACKFORGE_ROOT")}
    env["STACKFORGE_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([str(installed_cli), "verify", f"{repository}:{tag}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert "PASS gate    re-run inside the image with a read-only root filesystem" in out
    assert out[-1].startswith(f"verified {repository}:{tag}: digest, record, ") and out[-1].endswith("— 0 failed")
    module = subprocess.run([str(installed_cli.parent / "python"), "-c", "import stackforge; print(stackforge.__file__)"],
                            capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout  # fmt: skip
    assert str(installed_cli.parents[2]) in module and str(REPO) not in module  # the wheel's copy, not the checkout


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_the_operators_install_is_small_names_its_commit_and_sends_lock_to_its_extra(installed_cli, tmp_path):
    from stackforge import __version__, buildinfo

    site = next(installed_cli.parents[1].glob("lib/python3*/site-packages"))
    total = du_mb(site)
    assert total - _EMPTY_SITE_MB[0] <= ADDED_MB and total <= SITE_MB, (total, _EMPTY_SITE_MB)
    assert not list(site.glob("uv")) and not list(site.glob("zstandard"))  # the builder's extras stay out

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STACKFORGE_ROOT")}
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "uv").exists()]
    env["PATH"] = os.pathsep.join([str(installed_cli.parent), *path])
    env["STACKFORGE_CACHE"] = str(tmp_path / "cache")
    said = subprocess.run([str(installed_cli), "--version"], capture_output=True, text=True, cwd=tmp_path, env=env)
    dirty = "-dirty" if _git("status", "--porcelain", "--", *buildinfo.BUILD_PATHS) else ""
    assert (
        said.returncode == 0
        and said.stdout == f"stackforge {__version__} (commit {_git('rev-parse', 'HEAD')}{dirty})\n"
    )

    lock = subprocess.run([str(installed_cli), "--root", str(REPO), "lock", "example"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert lock.returncode == 2 and "Traceback" not in lock.stderr, lock.stderr
    assert "error: `stackforge lock` resolves with uv's resolver" in lock.stderr
    assert "pip install 'stackforge[lock]'" in lock.stderr


def test_pull_then_verify_from_an_empty_directory(two_builds, published, tmp_path):
    root, first, _ = two_builds
    repository, tag, published = published
    older = evidence.builds(root / "build" / "example" / "evidence")[0]
    kept = json.loads((older / "record.json").read_text())
    assert kept["attached"]["via"] == "tag-schema" and kept["record"]["digest"] == published["digest"]

    pulled = stackforge(root, "pull", "example", "--registry", repository.rsplit("/", 1)[0])
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert f"PASS digest  {repository}:{tag} resolves to {published['digest']}" in pulled.stdout
    assert pulled.stdout.strip().endswith(" — 0 failed") and "(pulled): digest, record, " in pulled.stdout

    empty = tmp_path / "operator"
    empty.mkdir()
    proc = stackforge(None, "verify", f"{repository}:{tag}", cwd=empty)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert any(l.startswith("PASS record  sha256:") and "found via tag-schema" in l for l in out)
    assert f"PASS record  digest={published['digest']} matches the pulled digest" in out
    assert "PASS labels  the image's labels equal the record's" in out
    assert "PASS pin     idna label=3.10 record=3.10" in out
    assert any(l.startswith("PASS stack   example.yaml sha256 image=sha256:") for l in out)
    assert "PASS gate    re-run inside the image with a read-only root filesystem" in out
    summary = out[-1]  # one line of what it checked: the record's smoke and tests when it holds them
    assert summary.startswith(f"verified {repository}:{tag}: digest, record, tag, image id, labels, ")
    assert re.search(r", \d+ pins, fingerprint, \d+ stack files?, ", summary), summary
    assert ", read-only gate, tests: none recorded, smoke" in summary and summary.endswith(" — 0 failed")
    assert list(empty.iterdir()) == []  # nothing written where it ran

    # no checkout: the repository alone, its tag scheme read off its tags (the fallback tag and alias left out)
    by_repo = stackforge(None, "pull", repository, cwd=empty)
    assert by_repo.returncode == 0, by_repo.stdout + by_repo.stderr
    assert f"PASS digest  {repository}:{tag} resolves to {published['digest']}" in by_repo.stdout
    assert by_repo.stdout.strip().splitlines()[-1].startswith(f"verified {repository}:{tag} (pulled): digest, ")
    namespace, name = repository.rsplit("/", 1)
    same = stackforge(None, "pull", name, "--registry", namespace, "--date", DATE, cwd=empty)
    assert same.returncode == 0 and f"verified {repository}:{tag} (pulled): " in same.stdout, same.stdout
    assert list(empty.iterdir()) == []


def tamper(repository: str, image: str, changes: dict, created: str) -> None:
    """Attach a newer record for the image ``image`` with ``changes`` (as someone with push rights could)."""
    from stackforge.clients.registry import RegistryClient, parse_repository
    from stackforge.publish import record as records
    from stackforge.publish.record_schema import parse

    client = RegistryClient(parse_repository(repository))
    found = records.fetch(client, image)
    assert found is not None
    rec = {
        **found.record,
        **{k: v if not isinstance(v, dict) else {**found.record[k], **v} for k, v in changes.items()},
    }
    info = client.head_manifest(image)
    assert info is not None
    records.attach(client, parse(rec), {"mediaType": info.media_type, "digest": image, "size": info.size}, created)


def test_a_tampered_record_and_a_digest_that_does_not_match_it_are_refused(two_builds, registry, tmp_path):
    repository, tag, published = publish_first(two_builds, registry)
    digest = published["digest"]
    tamper(repository, digest, {"pins": {"idna": "3.11"}}, "2999-01-01T00:00:00Z")
    proc = stackforge(None, "verify", f"{repository}:{tag}", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "FAIL pin     idna label=3.10 record=3.11" in proc.stdout.splitlines()
    assert proc.stdout.strip().endswith("failed, refused") and "pins (FAILED)" in proc.stdout.splitlines()[-1]

    other = "sha256:" + "0" * 64
    tamper(repository, digest, {"digest": other}, "2999-01-02T00:00:00Z")
    proc = stackforge(None, "verify", f"{repository}@{digest}", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        f"FAIL record  digest={other} does not match the pulled digest {digest}: "
        "the record does not describe this image; refused"
    ) in proc.stdout.splitlines()


@pytest.fixture(scope="module")
def overlay_published(two_builds, published):
    """An overlay (one file) on the published first build, pinned by digest, built and published into the same
    repository (after the tests that pull the stack's tags from it): (repository, the overlay's publish.json, the
    base's publish.json)."""
    root = two_builds[0]
    repository, _, base = published
    token = uuid.uuid4().hex[:8]
    odir = root / "overlays" / "tiny"
    (odir / "files").mkdir(parents=True)
    data = f"tiny overlay {token}\n".encode()
    (odir / "files" / "hello.txt").write_bytes(data)
    (odir / "overlay.yaml").write_text(
        "description: one file on the published example image\n"
        f"base: {{image: {repository}@{base['digest']}}}\n"
        f"files:\n  - {{src: files/hello.txt, dest: /opt/tiny/hello.txt, sha256: {hashlib.sha256(data).hexdigest()}}}\n"
        "tags:\n"
        f'  local: "{run_names.NS}/tiny:{{{{ overlay.name }}}}-{token}"\n'
        '  publish: "stackforge-example:{{ overlay.name }}-{{ date }}-r{{ revision }}"\n'
    )
    built = stackforge(root, "build", "example", "--overlay", "tiny")
    assert built.returncode == 0, built.stderr[-4000:]
    proc = stackforge(root, "publish", "example", "--overlay", "tiny", "--registry", repository.rsplit("/", 1)[0],
                      "--date", DATE, "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield repository, json.loads(proc.stdout), base
    subprocess.run(["docker", "image", "rm", f"{run_names.NS}/tiny:tiny-{token}"], capture_output=True)


def test_an_overlay_is_verified_and_pulled_from_the_registry_alone(overlay_published, tmp_path):
    repository, published, base = overlay_published
    ref = f"{repository}:{published['tag']}"
    assert published["tag"] == f"tiny-{DATE}-r1"
    proc = stackforge(None, "verify", ref, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert "PASS overlay name label=tiny record=tiny" in out
    assert f"PASS overlay base label={base['digest']} record={base['digest']}" in out
    assert any(l.startswith("PASS overlay /stackforge/overlay/tiny/overlay.yaml sha256 image=sha256:") for l in out)
    assert any(l.startswith("PASS overlay declaration of the embedded overlay.yaml=sha256:") for l in out)
    assert any(l.startswith("PASS overlay files of the embedded overlay.yaml=sha256:") for l in out)
    assert f"PASS overlay base {repository}@{base['digest']} is in the registry" in out
    assert any(l.startswith("PASS overlay layers start with the ") and "(config diff_ids, from the registry)" in l
               for l in out)  # fmt: skip
    assert any(l.startswith("  PASS file   /opt/tiny/hello.txt sha256=") for l in out)
    assert "PASS overlay range files and files re-hashed inside the image with a read-only root" in out
    assert any(l.startswith("PASS stack   example.yaml sha256 image=sha256:") for l in out)  # the base's stack
    assert "PASS gate    re-run inside the image with a read-only root filesystem" in out
    assert out[-1].startswith(f"verified {ref}: digest, record, ") and ", overlay, " in out[-1]

    two = stackforge(None, "pull", repository, cwd=tmp_path)  # the stack's tags and the overlay's
    assert two.returncode == 2 and "holds 2 tag schemes:" in two.stderr, two.stderr
    assert f"tiny-YYYYMMDD-rN (newest {published['tag']})" in two.stderr and "--tags PATTERN" in two.stderr


def test_an_overlay_whose_labels_disagree_with_its_record_is_refused(overlay_published, tmp_path):
    repository, published, _ = overlay_published
    other = "sha256:" + "0" * 64
    tamper(repository, published["digest"], {"overlay": {"files": other}}, "2999-01-03T00:00:00Z")
    proc = stackforge(None, "verify", f"{repository}@{published['digest']}", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    out = proc.stdout.splitlines()
    assert "PASS labels  the image's labels equal the record's" in out  # only the overlay part was changed
    assert any(l.startswith("FAIL overlay files label=sha256:") and l.endswith(f"record={other}") for l in out)
    assert ("FAIL overlay the labels disagree with the record: the image is not the overlay the record describes; "
            "refused") in out  # fmt: skip
    assert proc.stdout.strip().endswith("failed, refused") and "overlay (FAILED)" in out[-1]
