"""OSV matching: ranges and explicit versions in both ecosystems, severities, withdrawn records, dpkg's
version order checked against dpkg itself."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stackforge import osv
from stackforge.errors import UserError
from tests.fixtures import hostile_files as hf
from tests.fixtures import hostile_osv, osv_db

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
    assert str(err.value.file).endswith("PyPI/broken.json") and "OSV record is not JSON" in err.value.message
    assert err.value.exit_code == 2 and err.value.render().startswith("error: ")
    (tmp_path / "db" / "PyPI" / "broken.json").write_text(json.dumps({"summary": "no id"}))
    with pytest.raises(UserError, match="OSV record: id: Field required"):
        osv.load(tmp_path / "db")
    with pytest.raises(UserError, match="no such directory"):
        osv.load(tmp_path / "missing")


@pytest.mark.parametrize(
    ("maker", "said"),
    [
        ("fifo", "is a FIFO, not a regular file"),
        ("zero_link", "symbolic link"),
        ("link_out", "symbolic link"),
        ("deep_json", "nests 100000 levels deep"),
        ("not_utf8", "not UTF-8"),
    ],
)
def test_a_special_or_linked_record_is_refused_at_once(tmp_path, maker, said):
    db = tmp_path / "db"
    shutil.copytree(FIXTURE, db)
    path = hf.SPECIALS[maker](db / "PyPI" / "EVIL.json")
    with pytest.raises(UserError) as err:
        hf.within(10, osv.load, db)
    assert said in err.value.message and str(err.value.file) == str(path)


def test_a_huge_record_and_a_linked_directory_are_refused(tmp_path):
    db = tmp_path / "db"
    shutil.copytree(FIXTURE, db)
    hf.huge(db / "PyPI" / "BIG.json", osv.MAX_RECORD_BYTES + 1)
    with pytest.raises(UserError, match="larger than"):
        hf.within(10, osv.load, db)
    (db / "PyPI" / "BIG.json").unlink()
    (db / "Elsewhere").symlink_to(tmp_path)  # a directory link: its files could be anywhere
    with pytest.raises(UserError, match="a link to a directory") as err:
        osv.load(db)
    assert str(err.value.file).endswith("Elsewhere")


@pytest.mark.parametrize(("case", "data", "field"), hostile_osv.CASES, ids=[c[0] for c in hostile_osv.CASES])
def test_a_record_of_the_wrong_shape_names_the_file_and_the_field(tmp_path, case, data, field):
    db = tmp_path / "db"
    shutil.copytree(FIXTURE, db)
    path = hostile_osv.write(db / "PyPI", case, data)
    with pytest.raises(UserError) as err:
        osv.load(db)
    text = err.value.render()
    assert text.startswith(f"error: {path}: OSV record: {field}:"), text
    assert "\x1b" not in text and "Traceback" not in text


@pytest.mark.parametrize("text", hf.HOSTILE_JSON)
def test_json_that_is_no_record_is_refused(tmp_path, text):
    db = tmp_path / "db"
    shutil.copytree(FIXTURE, db)
    (db / "PyPI" / "X.json").write_text(text)
    with pytest.raises(UserError) as err:
        osv.load(db)
    assert str(err.value.file).endswith("PyPI/X.json") and "\n" not in err.value.message


def test_versions_are_compared_whole_never_as_text(tmp_path):
    """A record listing 3.100 says nothing of 3.10 (a string there is refused, see the hostile cases)."""
    db = tmp_path / "db"
    rec = hostile_osv.record(id="TEST-LIST-1", affected=hostile_osv.affected(ranges=[], versions=["3.100", "13.10"]))
    hostile_osv.write(db / "PyPI", "TEST-LIST-1", rec)
    loaded = osv.load(db)
    assert osv.scan(loaded, [osv.Package("PyPI", "pip", "3.10")]) == []
    assert ids(osv.scan(loaded, [osv.Package("PyPI", "pip", "3.100")])) == ["TEST-LIST-1"]


def test_releases_are_kept_apart(tmp_path):
    """A Debian 11 advisory says nothing of a Debian 12 package; Ubuntu's LTS names read, Ubuntu Pro's not."""
    db = tmp_path / "db"
    deb11 = json.loads((FIXTURE / "Debian" / "TEST-DSA-openssl.json").read_text())
    deb11["id"] = "TEST-DSA-11"
    deb11["affected"][0]["package"]["ecosystem"] = "Debian:11"
    hostile_osv.write(db / "Debian", "TEST-DSA-11", deb11)
    usn = {
        "id": "TEST-USN-1",
        "modified": "2026-12-01T00:00:00Z",
        "severity": [{"type": "Ubuntu", "score": "medium"}],
        "affected": [
            {
                "package": {"ecosystem": "Ubuntu:22.04:LTS", "name": "openssl"},
                "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "3.0.2-0ubuntu1.15"}]}],
            },
            {"package": {"ecosystem": "Ubuntu:Pro:22.04:LTS", "name": "zlib"}, "versions": ["1"]},
        ],
    }
    hostile_osv.write(db / "Ubuntu", "TEST-USN-1", usn)
    loaded = osv.load(db)
    assert osv.scan(loaded, [osv.Package("Debian:12", "openssl", "3.0.9-1")]) == []
    assert ids(osv.scan(loaded, [osv.Package("Debian:11", "openssl", "3.0.9-1")])) == ["TEST-DSA-11"]
    found = osv.scan(loaded, [osv.Package("Ubuntu:22.04", "openssl", "3.0.2-0ubuntu1.14")])
    assert ids(found) == ["TEST-USN-1"] and found[0].severity == "medium"
    assert osv.scan(loaded, [osv.Package("Ubuntu:24.04", "openssl", "3.0.2-0ubuntu1.14")]) == []
    assert osv.scan(loaded, [osv.Package("Ubuntu:22.04", "zlib", "1")]) == []  # Ubuntu Pro's archive
    assert loaded.families["Debian"].releases == {"11"} and loaded.families["Ubuntu"].releases == {"22.04"}
    assert loaded.covers(osv.Ecosystem("Debian", "11")) and not loaded.covers(osv.Ecosystem("Debian", "12"))


def test_advisory_text_reaches_a_terminal_without_its_escapes(tmp_path):
    db = tmp_path / "db"
    evil = "pip \x1b]8;;http://evil\x07click\x1b]8;;\x07 \x1b[2J\x1b[31mcleared\x1b[0m"
    rec = hostile_osv.record(id="TEST-ESC-1", summary=evil, aliases=["CVE-\x1b[1m1"])
    hostile_osv.write(db / "PyPI", "TEST-ESC-1", rec)
    found = osv.scan(osv.load(db), [osv.Package("PyPI", "pip", "24.0")])
    line = found[0].line()
    assert "\x1b" not in line and "\x07" not in line and "click" in line and "cleared" in line
    assert found[0].summary.count("\x1b") == 5  # kept as it is for JSON, which escapes it
    named = dataclasses.replace(found[0], package=osv.Package("PyPI", "pip\x1b[8m\u009b2J", "24.0\x1b[0m"))
    assert "\x1b" not in named.line() and "\x9b" not in named.line()  # an SBOM's names are outside text too


@pytest.mark.parametrize(
    ("snapshot", "said"),
    [
        ({"ecosystem": "PyPI"}, "fetched_at: Field required"),
        ({"ecosystem": "PyPI", "fetched_at": "2026-12-01T00:00:00"}, "fetched_at: Input should have timezone info"),
        ({"ecosystem": "npm", "fetched_at": "2026-12-01T00:00:00Z"}, "is not one the scan reads"),
        ({"ecosystem": "PyPI", "fetched_at": "2026-12-01T00:00:00Z", "by": "x"}, "by: Extra inputs are not permitted"),
    ],
)
def test_a_snapshot_file_of_the_wrong_shape_is_refused(tmp_path, snapshot, said):
    db = tmp_path / "db"
    shutil.copytree(FIXTURE, db)
    (db / "PyPI" / osv.SNAPSHOT).write_text(json.dumps(snapshot))
    with pytest.raises(UserError, match=said) as err:
        osv.load(db)
    assert str(err.value.file).endswith(f"PyPI/{osv.SNAPSHOT}")


def test_the_database_knows_when_each_ecosystem_was_fetched(tmp_path):
    db = osv_db.fresh_copy(tmp_path / "db", age=dt.timedelta(days=3), ecosystems=("PyPI",))
    shutil.copytree(FIXTURE / "Debian", db / "Debian")  # no snapshot file: its newest record dates it
    loaded = osv.load(db)
    pypi, debian = loaded.families["PyPI"], loaded.families["Debian"]
    assert pypi.fetched_at is not None and abs(dt.datetime.now(dt.timezone.utc) - pypi.fetched_at - dt.timedelta(days=3)) < dt.timedelta(minutes=5)  # fmt: skip
    assert debian.fetched_at is None and debian.newest == dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc)
    assert pypi.records == 2 and debian.records == 1  # the withdrawn record counts for nothing


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
