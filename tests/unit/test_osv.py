"""OSV matching: ranges and explicit versions in both ecosystems, severities, withdrawn records, dpkg's
version order checked against dpkg itself."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stackforge import osv
from stackforge.errors import UserError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "osv"


@pytest.fixture(scope="module")
def db():
    return osv.load(FIXTURE)


def ids(findings):
    return [f.id for f in findings]


def test_the_fixture_loads_and_skips_withdrawn_records(db):
    assert db.count == 3
    assert osv.scan(db, [osv.Package("Debian", "zlib", "1:1.2.13.dfsg-1")]) == []


@pytest.mark.parametrize(
    "version, hit",
    [("24.0", True), ("25.2", True), ("25.3", False), ("25.3.1", False), ("1.0", True)],
)
def test_a_pypi_range_with_a_fix(db, version, hit):
    found = osv.scan(db, [osv.Package("PyPI", "pip", version)])
    assert ids(found) == (["TEST-GHSA-4xh5-x5gv-qwph"] if hit else [])
    if hit:
        f = found[0]
        assert f.severity == "medium" and f.fixed == ("25.3",)  # GitHub's MODERATE, not the CVSS score
        assert "pip" in f.line() and "fixed in 25.3" in f.line() and "TEST-CVE-2025-8869" in f.line()


@pytest.mark.parametrize(
    "name, version, hit",
    [
        ("jinja2", "2.11.3", False),
        ("Jinja2", "3.0.0", True),
        ("jinja_2", "3.1.4", False),  # another project: names normalise, they do not fuzzy-match
        ("JINJA2", "3.1.4", True),
        ("jinja2", "3.1.5", False),
        ("jinja2", "3.1.6rc1", True),  # the second range: introduced ..
        ("jinja2", "3.1.6", True),  # .. last_affected, inclusive
        ("jinja2", "3.1.7", False),
    ],
)
def test_pypi_names_normalise_and_last_affected_is_inclusive(db, name, version, hit):
    found = osv.scan(db, [osv.Package("PyPI", name, version)])
    assert ids(found) == (["TEST-PYSEC-2026-1"] if hit else [])
    if hit:
        assert found[0].severity == "critical"  # from the CVSS 3.1 vector: 9.8


@pytest.mark.parametrize(
    "version, hit",
    [
        ("3.0.11-1~deb12u1", True),
        ("3.0.11-1~deb12u2", False),
        ("3.0.15-1~deb12u1", False),
        ("3.0.9-1", True),
        ("1:3.0.9-1", False),  # an epoch sorts above every version without one
    ],
)
def test_a_debian_advisory_by_dpkg_order(db, version, hit):
    found = osv.scan(db, [osv.Package("Debian", "openssl", version)])
    assert ids(found) == (["TEST-DSA-5532-1"] if hit else [])
    if hit:
        assert found[0].severity == "unknown" and "treated as high" in found[0].line()
        assert found[0].at_least("high") and not found[0].at_least("critical")


def test_findings_sort_most_severe_first(db):
    found = osv.scan(
        db,
        [
            osv.Package("PyPI", "pip", "24.0"),
            osv.Package("PyPI", "jinja2", "3.1.4"),
            osv.Package("Debian", "openssl", "3.0.9-1"),
        ],
    )
    assert [f.severity for f in found] == ["critical", "unknown", "medium"]


def test_a_file_that_is_not_a_record_is_named(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "db")
    (tmp_path / "db" / "PyPI" / "broken.json").write_text("{not json")
    with pytest.raises(UserError) as err:
        osv.load(tmp_path / "db")
    assert "broken.json" in err.value.message
    (tmp_path / "db" / "PyPI" / "broken.json").write_text(json.dumps({"summary": "no id"}))
    with pytest.raises(UserError, match="not an OSV record"):
        osv.load(tmp_path / "db")
    with pytest.raises(UserError, match="no such directory"):
        osv.load(tmp_path / "missing")


VERSIONS = [
    "1.0", "1.0-1", "1.0-2", "1.0~rc1", "1.0~rc1-1", "1.0+b1", "1.0.1", "1:0.9", "2:1.0", "1.0a", "1.0-1~deb12u1",
    "1.0-1+deb12u1", "1.00", "1.0.0", "3.0.11-1~deb12u2", "3.0.11-1~deb12u1", "0", "1.2.13.dfsg-1", "a1", "1~~", "1~",
    "1.0-1.1", "10", "9", "1.0.-1",
]  # fmt: skip


def test_dpkg_order_agrees_with_dpkg_itself():
    wrong = []
    for a, b in itertools.combinations(VERSIONS, 2):
        for op, want in (("lt", -1), ("eq", 0), ("gt", 1)):
            said = subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True).returncode == 0
            if said and osv.dpkg_compare(a, b) != want:
                wrong.append((a, op, b, osv.dpkg_compare(a, b)))
    assert wrong == []
