"""`stackforge sbom` and `stackforge scan` on the post2 image built from the stand-ins: the SBOM lists what the
image's inventory and dpkg database hold (with each vendor wheel's index and sha256), and the scan, offline
against the OSV fixture (tests/fixtures/osv), reports the pip advisory (the image's pip is older than 25.3) and
gates by severity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import osv_db

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def osv_dir(tmp_path_factory) -> Path:
    """The OSV fixture as a fetch leaves it today (each export with its osv-snapshot.json)."""
    return osv_db.fresh_copy(tmp_path_factory.mktemp("osv") / "db")


def test_the_sbom_lists_every_distribution_and_package(post2, tmp_path):
    out = tmp_path / "sbom.json"
    proc = mb.stackforge("sbom", post2.image, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    by_name = {c["name"]: c for c in doc["components"]}
    torch = by_name["torch"]
    assert torch["version"] == "2.11.0.post2+musa5.2.0" and torch["hashes"][0]["alg"] == "SHA-256"
    assert {"name": "stackforge:index", "value": "mthreads"} in torch["properties"]
    inventory = json.loads(
        mb.docker("run", "--rm", "--entrypoint", "cat", post2.image, "/stackforge/inventory.json").stdout
    )
    pypi = {c["name"] for c in doc["components"] if c["purl"].startswith("pkg:pypi/")}
    assert pypi == {d["name"] for d in inventory["dists"]}  # every installed distribution, nothing else
    dpkg = mb.docker(
        "run", "--rm", "--entrypoint", "dpkg-query", post2.image, "-W", "-f", "${Package}\n"
    ).stdout.split()
    debs = {c["name"] for c in doc["components"] if c["purl"].startswith("pkg:deb/")}
    assert debs == set(dpkg) and "libc6" in debs
    again = tmp_path / "again.json"
    assert mb.stackforge("sbom", post2.image, "--out", str(again)).returncode == 0
    assert again.read_bytes() == out.read_bytes()  # one image, one SBOM


def test_the_scan_reports_and_gates_by_severity(post2, osv_dir, tmp_path):
    proc = mb.stackforge("scan", post2.image, "--osv", str(osv_dir), "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == (1 if any(f["blocking"] for f in report["findings"]) else 0), proc.stderr
    assert report["verdict"] == ("blocked" if proc.returncode else "clear") and report["packages"] > 100
    assert set(report["snapshots"]) == {"PyPI", "Debian:12"}  # the image's release, read from its os-release
    pip = next(f for f in report["findings"] if f["package"] == "pip")
    assert pip["id"] == "TEST-GHSA-4xh5-x5gv-qwph" and pip["severity"] == "medium" and pip["fixed"] == ["25.3"]
    assert not pip["blocking"] and report["fail_on"] == "high"
    strict = mb.stackforge("scan", post2.image, "--osv", str(osv_dir), "--fail-on", "medium")
    assert strict.returncode == 1 and "BLOCK TEST-GHSA-4xh5-x5gv-qwph" in strict.stdout
    assert strict.stdout.rstrip().endswith("blocked")
    bad = mb.stackforge("scan", post2.image, "--osv", str(osv_dir), "--fail-on", "severe")
    assert bad.returncode == 2 and "is not a severity" in bad.stderr
    (tmp_path / "empty").mkdir()
    empty = mb.stackforge("scan", post2.image, "--osv", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "holds no OSV records" in empty.stderr  # fails closed, never clear
