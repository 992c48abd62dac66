"""The vulnerability gate: it fails closed (a missing, empty, stale or non-covering database is an error naming
the fix, never a verdict), waivers a reviewer reads hold a finding back with their reason until they expire, and
the verdict's fields are what the nightly summary carries. Engine-free: SBOMs are made with sbom.document and
scanned from a file with `stackforge scan --sbom`."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from stackforge.builder.records import sbom, vulns, waivers
from stackforge.cli.main import main
from stackforge.errors import UserError
from tests.fixtures import hostile_osv, osv_db

NOW = dt.datetime.now(dt.timezone.utc)
DISTS = [
    {"name": "pip", "version": "24.0"},  # TEST-GHSA-4xh5-x5gv-qwph: medium
    {"name": "Jinja2", "version": "3.1.4"},  # TEST-PYSEC-2026-1: critical
    {"name": "torchvision", "version": "0.26.0.post2"},
]
DEBIAN = "base-files\t12.4+deb12u5\tamd64\t\t\nlibssl3\t3.0.11-1~deb12u1\tamd64\topenssl\t3.0.11-1~deb12u1\n"


def bom(dists=DISTS, dpkg=DEBIAN, os_release=None) -> str:
    return sbom.document("vllm:test", "sha256:" + "1" * 64, None, dists, sbom.parse_dpkg(dpkg), os_release)


def scan(db: Path, text: str | None = None, **kw) -> vulns.ScanReport:
    return vulns.scan_sbom(text or bom(), "vllm:test", db, **kw)


@pytest.fixture
def db(tmp_path) -> Path:
    return osv_db.fresh_copy(tmp_path / "osv")


def write_waivers(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- fails closed ------------------------------------------------------------------------------------------


def test_a_missing_or_empty_database_is_an_error_never_clear(tmp_path):
    with pytest.raises(UserError, match="no such directory") as err:
        scan(tmp_path / "absent")
    assert "osv-snapshot.json" in (err.value.fix or "")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no OSV records") as err:
        scan(tmp_path / "empty")
    assert "all.zip" in (err.value.fix or "")
    other = tmp_path / "npm"
    hostile_osv.write(
        other / "npm",
        "X",
        hostile_osv.record(affected=hostile_osv.affected(package={"ecosystem": "npm", "name": "left-pad"})),
    )
    with pytest.raises(UserError, match="holds no OSV records of PyPI, Debian, Ubuntu"):
        scan(other)


def test_a_database_that_does_not_cover_the_image_is_an_error(tmp_path):
    pypi_only = osv_db.fresh_copy(tmp_path / "pypi", ecosystems=("PyPI",))
    with pytest.raises(UserError, match=r"has no Debian:12 records: the image's 2 Debian:12 packages") as err:
        scan(pypi_only)
    assert "Debian/all.zip" in (err.value.fix or "")
    bullseye = osv_db.fresh_copy(tmp_path / "deb11")
    for path in (bullseye / "Debian").glob("TEST-*.json"):
        path.write_text(path.read_text().replace('"Debian:12"', '"Debian:11"'))
    with pytest.raises(UserError, match=r"has no Debian:12 records \(it has Debian records of 11\)"):
        scan(bullseye)
    debian_only = osv_db.fresh_copy(tmp_path / "debian", ecosystems=("Debian",))
    with pytest.raises(UserError, match="has no PyPI records"):
        scan(debian_only)
    assert scan(debian_only, bom(dists=[])).verdict == "blocked"  # an image with no Python: Debian is enough


def test_an_sbom_with_nothing_to_scan_is_no_verdict(db):
    with pytest.raises(UserError, match="nothing to scan"):
        scan(db, bom(dists=[], dpkg=""))


def test_an_image_whose_release_is_unknown_is_an_error(db):
    jammy = "base-files\t12ubuntu4.7\tamd64\t\t\nlibssl3\t3.0.2-0ubuntu1.14\tamd64\topenssl\t3.0.2-0ubuntu1.14\n"
    with pytest.raises(UserError, match="does not say which Ubuntu release"):
        scan(db, bom(dpkg=jammy))
    with pytest.raises(UserError, match="has no Ubuntu:22.04 records"):  # with its os-release: a release to cover
        scan(db, bom(dpkg=jammy, os_release={"ID": "ubuntu", "VERSION_ID": "22.04"}))


def test_a_stale_snapshot_is_an_error_naming_its_age_and_the_flag(tmp_path):
    old = osv_db.fresh_copy(tmp_path / "old", age=dt.timedelta(days=9))
    with pytest.raises(UserError) as err:
        scan(old)
    assert "advisories in" in err.value.message and "9.0 days old" in err.value.message
    assert "older than --osv-max-age 7.0 days" in err.value.message and "--osv-max-age" in (err.value.fix or "")
    assert scan(old, max_age=dt.timedelta(days=10)).verdict == "blocked"  # a longer age, given knowingly
    future = osv_db.fresh_copy(tmp_path / "future", age=-dt.timedelta(days=2))
    with pytest.raises(UserError, match="in the future"):
        scan(future)


def test_without_a_snapshot_file_the_newest_record_dates_the_export_and_the_report_says_so(tmp_path):
    db = osv_db.fresh_copy(tmp_path / "osv")
    (db / "Debian" / "osv-snapshot.json").unlink()
    with pytest.raises(UserError, match=r"no osv-snapshot.json: newest record modified 2026-10-01T00:00:00Z"):
        scan(db)  # the fixture's newest Debian record is older than a week
    rec = json.loads((db / "Debian" / "TEST-DSA-openssl.json").read_text())
    rec["modified"] = (NOW - dt.timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (db / "Debian" / "TEST-DSA-openssl.json").write_text(json.dumps(rec))
    report = scan(db)
    text = "\n".join(report.lines())
    assert "Debian:12 no osv-snapshot.json: newest record modified" in text and "PyPI snapshot" in text
    assert report.summary()["database"]["Debian:12"]["from"] == "newest record"


@pytest.mark.parametrize(("text", "hours"), [("7d", 168), ("36h", 36), ("2w", 336), ("3", 72)])
def test_max_age_reads_hours_days_weeks(text, hours):
    assert vulns.parse_max_age(text) == dt.timedelta(hours=hours)


@pytest.mark.parametrize("text", ["", "7 days", "-1d", "0h", "400d", "1y", "d"])
def test_max_age_refuses_what_is_not_an_age(text):
    with pytest.raises(UserError, match="--osv-max-age"):
        vulns.parse_max_age(text)


# -- verdicts and waivers ---------------------------------------------------------------------------------


def test_blocked_then_waived_with_its_reason_then_clear(db, tmp_path):
    report = scan(db)
    assert report.verdict == "blocked"
    assert report.summary()["blocked"] == ["TEST-PYSEC-2026-1", "TEST-DSA-5532-1"]
    path = write_waivers(
        tmp_path / "stacks" / "waivers.yaml",
        """\
waivers:
  - id: TEST-PYSEC-2026-1
    package: jinja2              # PEP 503: Jinja2 is jinja2
    versions: ["3.1.4"]
    reason: the template sandbox the advisory needs is not used by the server
    expires: 2099-01-31
  - id: TEST-CVE-2023-5363       # an alias of TEST-DSA-5532-1
    package: openssl
    versions: ["3.0.11-1~deb12u1"]
    reason: the base image's openssl; the fix lands with the next base image rebuild
    expires: 2099-02-28
""",
    )
    report = scan(db, waivers=waivers.load(path, "stacks/waivers.yaml"))
    assert report.verdict == "waived" and report.blocking == []
    fields = report.summary()
    assert set(fields) == {"verdict", "fail_on", "blocked", "waived", "findings", "database", "waivers"}
    assert fields["blocked"] == [] and fields["findings"] == 3 and fields["waivers"] == "stacks/waivers.yaml"
    assert fields["waived"][0] == {
        "id": "TEST-PYSEC-2026-1",
        "package": "Jinja2",
        "version": "3.1.4",
        "severity": "critical",
        "reason": "the template sandbox the advisory needs is not used by the server",
        "expires": "2099-01-31",
        "waiver": "stacks/waivers.yaml:2",
    }
    lines = report.lines()
    assert any(
        line.startswith("waived TEST-PYSEC-2026-1") and "until 2099-01-31" in line and "sandbox" in line
        for line in lines
    )
    assert lines[-1].endswith("0 blocking and 2 waived at or above high: waived")
    assert scan(db, fail_on="critical", text=bom(dists=DISTS[:1])).verdict == "clear"


def test_an_expired_waiver_blocks_again_and_says_so(db, tmp_path):
    path = write_waivers(
        tmp_path / "w.yaml",
        """\
waivers:
  - {id: TEST-PYSEC-2026-1, package: Jinja2, versions: ["3.1.4"], reason: accepted until the next vendor drop, expires: 2026-01-31}
""",
    )
    report = scan(db, waivers=waivers.load(path), fail_on="critical")
    assert report.verdict == "blocked" and report.summary()["blocked"] == ["TEST-PYSEC-2026-1"]
    line = next(line for line in report.lines() if "TEST-PYSEC-2026-1" in line)
    assert line.startswith("BLOCK ") and "expired on 2026-01-31" in line
    finding = next(f for f in report.to_json()["findings"] if f["id"] == "TEST-PYSEC-2026-1")
    assert finding["blocking"] and finding["waived"] is None and finding["expired_waiver"]["expires"] == "2026-01-31"


def test_a_waiver_covers_only_its_versions_and_package(db, tmp_path):
    path = write_waivers(
        tmp_path / "w.yaml",
        """\
waivers:
  - {id: TEST-PYSEC-2026-1, package: Jinja2, versions: ["3.1.3"], reason: an older build was reviewed, expires: 2099-01-01}
  - {id: TEST-PYSEC-2026-1, package: markupsafe, versions: ["3.1.4"], reason: another package was reviewed, expires: 2099-01-01}
""",
    )
    report = scan(db, waivers=waivers.load(path), fail_on="critical")
    assert report.verdict == "blocked" and report.waived == []


def test_a_waiver_without_a_reason_covers_nothing(db, tmp_path):
    path = write_waivers(
        tmp_path / "w.yaml",
        "waivers:\n  - {id: TEST-PYSEC-2026-1, package: Jinja2, versions: ['3.1.4'], expires: 2099-01-01}\n",
    )
    assert scan(db, waivers=waivers.load(path), fail_on="critical").verdict == "blocked"


def test_outside_text_reaches_the_terminal_stripped_and_json_escaped(db, tmp_path):
    rec = hostile_osv.record(id="TEST-ESC-1", summary="pip \x1b]0;owned\x07\x1b[2J\x1b[31mfine\x1b[0m")
    hostile_osv.write(db / "PyPI", "TEST-ESC-1", rec)
    report = scan(db)
    text = "\n".join(report.lines())
    assert "\x1b" not in text and "\x07" not in text and "fine" in text
    dumped = json.dumps(report.to_json())
    assert "\x1b" not in dumped and "\\u001b[31m" in dumped  # JSON keeps it, escaped


# -- the CLI ----------------------------------------------------------------------------------------------


@pytest.fixture
def stackforge(capsys, monkeypatch):
    """``stackforge ARGS`` run in-process in ``cwd``: (exit code, stdout, stderr); an exception that is not a
    UserError (a traceback) fails the test."""

    def run(*args: str, cwd: Path) -> SimpleNamespace:
        monkeypatch.chdir(cwd)
        monkeypatch.delenv("STACKFORGE_ROOT", raising=False)
        capsys.readouterr()
        rc = main(list(args))
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out, stderr=err)

    return run


def test_scan_cli_fails_closed_on_an_empty_database_and_gates_a_file(stackforge, db, tmp_path):
    (tmp_path / "sbom.json").write_text(bom())
    (tmp_path / "empty").mkdir()
    empty = stackforge("scan", "--sbom", "sbom.json", "--osv", "empty", cwd=tmp_path)
    assert empty.returncode == 2 and empty.stdout == ""
    assert empty.stderr.startswith("error: --osv: empty holds no OSV records") and "Traceback" not in empty.stderr
    blocked = stackforge("scan", "--sbom", "sbom.json", "--osv", str(db), "--json", cwd=tmp_path)
    assert blocked.returncode == 1, blocked.stderr
    assert json.loads(blocked.stdout)["verdict"] == "blocked"
    stale = stackforge("scan", "--sbom", "sbom.json", "--osv", str(db), "--osv-max-age", "1h", cwd=tmp_path)
    assert stale.returncode == 2 and "older than --osv-max-age 1 h" in stale.stderr


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        ("fifo", "is a FIFO, not a regular file"),
        ("versions", "OSV record: affected[0].versions: Input should be a valid list"),
        ("sbom", "sbom.json: CycloneDX SBOM: components: Input should be a valid list"),
    ],
)
def test_scan_cli_names_the_hostile_file_and_field_in_one_error(stackforge, db, tmp_path, setup, said):
    (tmp_path / "sbom.json").write_text(bom())
    if setup == "fifo":
        os.mkfifo(db / "PyPI" / "EVIL.json")
    elif setup == "versions":
        hostile_osv.write(db / "PyPI", "EVIL", hostile_osv.record(affected=hostile_osv.affected(versions="3.100")))
    else:
        (tmp_path / "sbom.json").write_text(
            json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.5", "components": "x"})
        )
    proc = stackforge("scan", "--sbom", "sbom.json", "--osv", str(db), cwd=tmp_path)
    assert proc.returncode != 0 and proc.stdout == ""
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: ") and said in first and "Traceback" not in proc.stderr


def test_scan_in_a_repository_applies_its_waivers(stackforge, db, tmp_path):
    repo = tmp_path / "repo"
    write_waivers(
        repo / "stacks" / "waivers.yaml",
        "waivers:\n  - {id: TEST-PYSEC-2026-1, package: Jinja2, versions: ['3.1.4'], reason: 'reviewed, not reachable here', expires: 2099-01-01}\n",
    )
    (repo / "sbom.json").write_text(bom(dists=DISTS, dpkg=DEBIAN))
    shutil.rmtree(db / "Debian")
    osv_db.fresh_copy(tmp_path / "deb", ecosystems=("Debian",))
    shutil.copytree(tmp_path / "deb" / "Debian", db / "Debian")
    proc = stackforge("scan", "--sbom", "sbom.json", "--osv", str(db), "--fail-on", "critical", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "waivers: stacks/waivers.yaml" in proc.stdout and proc.stdout.rstrip().endswith(": waived")
