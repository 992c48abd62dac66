"""What the history site proves per image: signed or unsigned (the provenance in the night's evidence, checked with
a key when given), the scan's verdict, the aliases held back and why, the source commit, the night's CI run, the
SBOM, and a digest the night's own publish record (and the registry, when asked) confirms — a summary edited by
hand is not shown as published. And the summary model accepts every summary the nightly writes."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from stackforge import safeio
from stackforge.cli.main import main
from stackforge.clients.registry import OCI_INDEX, OCI_MANIFEST, RegistryClient, parse_repository, sha256_digest
from stackforge.clients.workspace import Workspace
from stackforge.flows import history, nightly
from stackforge.flows.night_records import NightSummary, SummaryRow
from stackforge.publish import attest
from stackforge.publish import night as nightreg
from stackforge.publish.publisher import PublishOptions
from stackforge.stack.load import load
from tests.fixtures.nights import VLLM_COMMIT, Image, edit_summary, signing_key, write_night
from tests.fixtures.records import a_record
from tests.fixtures.registry import free_port, start_registry
from tests.fixtures.stack_support import make_root

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64
PKGS = {"vllm": "0.11.0+musa"}
HELD = "not moved: 1 known vulnerability at or above high (GHSA-aaaa-bbbb-cccc)"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    ours = signing_key(tmp_path_factory.mktemp("ours"))
    theirs = signing_key(tmp_path_factory.mktemp("theirs"))
    return ours, theirs


def _row(nights: list[history.Night], date: str, stack: str = "post2") -> history.Image:
    (night,) = [n for n in nights if n.date == date]
    (image,) = [i for i in night.images if i.stack == stack]
    return image


def _page(site: Path, date: str, stack: str = "post2", target: str = "vllm-openai") -> str:
    return (site / "images" / history.page_name(date, stack, target)).read_text()


# --- signed ---------------------------------------------------------------------------------------------------------


def test_a_signed_image_shows_signed_and_an_unsigned_one_unsigned(tmp_path, keys):
    (key, pub), _ = keys
    root = tmp_path / "nightly"
    write_night(root, "20261101", [Image("post2", "vllm-openai", D1, PKGS, signed_by=key)])
    write_night(root, "20261102", [Image("post2", "vllm-openai", D2, PKGS)])
    index, nights = history.history(root, tmp_path / "site")
    assert (_row(nights, "20261101").signed, _row(nights, "20261102").signed) == ("signed", "unsigned")
    assert "signature not checked" in (_row(nights, "20261101").signed_note or "")
    html = index.read_text()
    assert '<td class="signed">signed</td>' in html and '<td class="unsigned">unsigned</td>' in html
    _, nights = history.history(root, tmp_path / "site", history.HistoryOptions(key=pub))
    assert _row(nights, "20261101").signed == "signed" and pub.name in (_row(nights, "20261101").signed_note or "")
    assert history.problems(nights) == []


def test_a_provenance_signed_by_another_key_or_for_another_image_is_not_signed(tmp_path, keys, capsys):
    (_, pub), (other, _) = keys
    root = tmp_path / "nightly"
    write_night(root, "20261101", [Image("post2", "vllm-openai", D1, PKGS, signed_by=other)])
    code = main(["history", "--nights", str(root), "--out", str(tmp_path / "site"), "--key", str(pub)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "provenance.json: provenance: the provenance is not signed" in errors[0]
    assert "unsigned" in _page(tmp_path / "site", "20261101")
    moved = tmp_path / "moved"
    write_night(moved, "20261101", [Image("post2", "vllm-openai", D1, PKGS, signed_by=other)])
    write_night(moved, "20261102", [Image("post2", "vllm-openai", D2, PKGS)])
    envelope = (moved / "20261101" / "post2-vllm-openai" / "provenance.json").read_bytes()
    (moved / "20261102" / "post2-vllm-openai" / "provenance.json").write_bytes(envelope)  # D1's, beside D2
    nights = history.read_nights(moved)
    assert _row(nights, "20261102").signed == "unsigned" and "names another image" in str(_row(nights, "20261102").signed_note)  # fmt: skip
    assert _row(nights, "20261101").signed == "signed"


# --- scan, aliases, source, log, SBOM, months ------------------------------------------------------------------------


# the scan as publish/stack.py's scan_record writes it into publish.json, and as ScanReport.summary() gives a row's
SNAPSHOTS = {"PyPI": {"fetched_at": "2026-11-01T00:00:00Z", "from": "osv-snapshot.json", "age_hours": 3}}
CLEAR = {"verdict": "clear", "blocked": [], "waived": [], "snapshots": SNAPSHOTS, "waivers": None, "database": "/osv",
         "records": 9, "fail_on": "high", "findings": [], "blocking": [], "reason": None}  # fmt: skip
BLOCKED = {**CLEAR, "verdict": "blocked", "blocked": ["GHSA-aaaa-bbbb-cccc"], "blocking": ["GHSA-aaaa-bbbb-cccc"],
           "findings": ["GHSA-aaaa-bbbb-cccc high x 1"], "reason": "1 known vulnerability at or above high"}  # fmt: skip
ROW_WAIVED = {"verdict": "waived", "fail_on": "high", "blocked": [], "findings": 1, "database": SNAPSHOTS,
              "waivers": "stacks/waivers.yaml", "waived": [{"id": "GHSA-w", "package": "torchvision",
              "version": "0.26.0.post2", "severity": "high", "reason": "the vendor's wheel, no fixed build",
              "expires": "2027-01-01", "waiver": "stacks/waivers.yaml#1"}]}  # fmt: skip


def test_the_scan_verdict_clear_waived_and_blocked_and_the_alias_held_back(tmp_path):
    root = tmp_path / "nightly"
    night = write_night(
        root,
        "20261101",
        [
            Image("a", "t", D1, PKGS, scan=CLEAR, aliases={"r/a:t-latest": "moved"}),
            Image("b", "t", D1, PKGS, scan=CLEAR, aliases={"r/b:t-latest": "moved"}),
            Image("c", "t", D2, PKGS, scan=BLOCKED, aliases={"r/c:t-latest": HELD}),
            Image("d", "t", D2, PKGS),
            Image("e", "t", D2, PKGS, scan={"blocking": ["OSV-OLD"], "findings": ["OSV-OLD high y 2"]}),  # older
        ],
    )
    edit_summary(night, lambda d: d["rows"][1].update(scan=ROW_WAIVED))  # the row's own scan is read first
    index, nights = history.history(root, tmp_path / "site")
    verdicts = {i.stack: i.scan.text for i in nights[0].images if i.scan}
    assert verdicts == {
        "a": "clear",
        "b": "waived: GHSA-w (the vendor's wheel, no fixed build)",
        "c": "blocked: GHSA-aaaa-bbbb-cccc",
        "d": "not scanned",
        "e": "blocked: OSV-OLD",
    }
    html = index.read_text()
    assert '<td class="scan-blocked">blocked: GHSA-aaaa-bbbb-cccc</td>' in html
    assert f'<td class="held">t-latest {HELD}</td>' in html and html.count('class="held"') == 1
    page = _page(tmp_path / "site", "20261101", "c", "t")
    assert "blocked by: <code>GHSA-aaaa-bbbb-cccc</code>" in page and f"<code>t-latest</code> {HELD}" in page
    assert "waived <code>GHSA-w</code>: the vendor&#39;s wheel, no fixed build" in _page(tmp_path / "site", "20261101", "b", "t")  # fmt: skip
    assert history.problems(nights) == []


def test_a_scan_never_shows_better_than_it_says_and_a_bad_one_does_not_hide_the_record(tmp_path):
    root = tmp_path / "nightly"
    night = write_night(root, "20261101", [Image("a", "t", D1, PKGS, scan={**CLEAR, "blocked": ["OSV-1"]}),
                                           Image("b", "t", D1, PKGS, scan={"findings": "many"})])  # fmt: skip
    edit_summary(night, lambda d: d["rows"][0].update(scan={"verdict": "clear", "blocked": ["OSV-1"], "findings": 1}))
    (read,) = history.read_nights(root)
    a, b = read.images
    assert a.scan is not None and a.scan.text == "blocked: OSV-1"
    assert b.scan is not None and b.scan.verdict == "unreadable" and b.verified == "the night's publish record"
    assert [p.shown for p in read.problems] == ["20261101/b-t/publish.json"] and "scan: findings" in read.problems[
        0
    ].message


def test_the_source_commit_links_to_its_forge_and_is_text_elsewhere(tmp_path):
    root = tmp_path / "nightly"
    write_night(
        root,
        "20261101",
        [
            Image("a", "t", D1, PKGS),
            Image("b", "t", D2, PKGS, source=("https://git.example.org/vllm.git", VLLM_COMMIT)),
            Image("c", "t", D2, PKGS, source=None),
        ],
    )
    index, _ = history.history(root, tmp_path / "site")
    html = index.read_text()
    link = f"https://github.com/vllm-project/vllm/commit/{VLLM_COMMIT}"
    assert f'<a href="{link}"><code>{VLLM_COMMIT[:12]}</code></a>' in html
    assert f"<td><code>{VLLM_COMMIT[:12]}</code></td>" in html and html.count("/commit/") == 1
    assert f'href="{link}"' in _page(tmp_path / "site", "20261101", "a", "t")


def test_the_build_log_links_to_the_nights_ci_run_or_the_given_template(tmp_path, capsys):
    root = tmp_path / "nightly"
    with_ci = write_night(root, "20261101", [Image("a", "t", D1, PKGS)])
    write_night(root, "20261102", [Image("a", "t", D1, PKGS)])
    env = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "org/stackforge", "GITHUB_RUN_ID": "77",
           "GITHUB_SHA": "c" * 40}  # fmt: skip
    edit_summary(with_ci, lambda d: d.update(ci=nightly.ci_run(env)))
    options = history.HistoryOptions(log_url="https://ci.example.com/nightly/{date}/")
    index, nights = history.history(root, tmp_path / "site", options)
    html = index.read_text()
    assert '<a href="https://github.com/org/stackforge/actions/runs/77">log</a>' in html
    assert '<a href="https://ci.example.com/nightly/20261102/">log</a>' in html
    assert f'<a href="https://github.com/org/stackforge/commit/{"c" * 40}"><code>cccccccccccc</code></a>' in html
    for bad in ("javascript:alert(1)/{date}", "https://x/{date}/{user}", "https://x/{date", "ftp://x/{date}"):
        code = main(["history", "--nights", str(root), "--out", str(tmp_path / "s2"), "--log-url", bad])
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "--log-url" in err and not (tmp_path / "s2").exists()


def test_ci_run_reads_github_and_gitlab_and_drops_what_is_no_web_address():
    github = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "12",
              "GITHUB_RUN_ATTEMPT": "2", "GITHUB_SHA": "d" * 40}  # fmt: skip
    assert nightly.ci_run(github) == {
        "provider": "github",
        "run_url": "https://github.com/o/r/actions/runs/12/attempts/2",
        "commit": "d" * 40,
        "commit_url": f"https://github.com/o/r/commit/{'d' * 40}",
    }
    gitlab = {"CI_JOB_URL": "https://gitlab.example.com/g/p/-/jobs/9", "CI_PROJECT_URL": "https://gitlab.example.com/g/p",
              "CI_COMMIT_SHA": "e" * 40}  # fmt: skip
    assert nightly.ci_run(gitlab)["commit_url"] == f"https://gitlab.example.com/g/p/-/commit/{'e' * 40}"
    assert nightly.ci_run({}) == {}
    hostile = {"CI_JOB_URL": "javascript:alert(1)", "CI_COMMIT_SHA": "main; rm -rf /"}
    assert nightly.ci_run(hostile) == {"provider": "gitlab"}
    assert "***" in nightly.ci_run({"CI_JOB_URL": "https://user:tok@gitlab.example.com/j/1"})["run_url"]


def test_each_image_page_links_its_sbom_copied_into_the_site_once(tmp_path):
    root = tmp_path / "nightly"
    write_night(root, "20261101", [Image("a", "t", D1, PKGS, {"libc6": "2.36"}), Image("b", "t", D2, PKGS, sbom=False)])
    night = write_night(root, "20261102", [Image("a", "t", D1, PKGS, {"libc6": "2.36"})])
    same = root / "20261101" / "a-t" / "sbom.cdx.json"
    (night / "a-t" / "sbom.cdx.json").write_bytes(same.read_bytes())  # an unchanged image, the same SBOM
    _, nights = history.history(root, tmp_path / "site")
    sboms = sorted((tmp_path / "site" / "sbom").iterdir())
    assert [p.name for p in sboms] == [f"{_row(nights, '20261101', 'a').sbom}.cdx.json"]
    doc = json.loads(sboms[0].read_text())
    assert doc["bomFormat"] == "CycloneDX" and {c["name"] for c in doc["components"]} == {"vllm", "libc6"}
    for date in ("20261101", "20261102"):
        assert f'<a href="../sbom/{sboms[0].name}">CycloneDX JSON</a>' in _page(tmp_path / "site", date, "a", "t")
    assert "<th>SBOM</th><td>-</td>" in _page(tmp_path / "site", "20261101", "b", "t")


def test_the_nights_are_grouped_by_month_newest_first(tmp_path):
    root = tmp_path / "nightly"
    for date in ("20261130", "20261201", "20261015", "20261202"):
        write_night(root, date, [Image("a", "t", D1, PKGS)])
    (root / "broken").mkdir()
    (root / "broken" / "summary.json").write_text("[]")
    html = history.history(root, tmp_path / "site")[0].read_text()
    months = re.findall(r'<h2 class="month">([^<]+)</h2>', html)
    assert months == ["December 2026", "November 2026", "October 2026", "Undated"]
    sections = html.split('<h2 class="month">')[1:]
    assert re.findall(r"Night (\d+)", sections[0]) == ["20261202", "20261201"]
    assert '<a href="#month-2026-12">December 2026</a>' in html and "Night broken" in sections[3]


# --- the digest the night's own records confirm ------------------------------------------------------------------


def test_a_digest_edited_by_hand_is_unverified_not_published(tmp_path, capsys):
    root = tmp_path / "nightly"
    write_night(root, "20261101", [Image("a", "t", D1, PKGS)])
    night = write_night(root, "20261102", [Image("a", "t", D1, PKGS), Image("b", "t", D2, PKGS)])
    edit_summary(night, lambda d: d["rows"][0].update(digest=D2))
    code = main(["history", "--nights", str(root), "--out", str(tmp_path / "site")])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "20261102/summary.json: rows[0].digest" in errors[0]
    assert f"its digest is {D1}" in errors[0]
    nights = history.read_nights(root)
    edited = _row(nights, "20261102", "a")
    assert edited.outcome == "unverified" and edited.same_as is None and edited.verified is None
    assert (nights[0].passed, nights[0].unverified) == (1, 1)
    html = (tmp_path / "site" / "index.html").read_text()
    assert re.search(r'<tr class="unverified">\s*<td><a [^>]+>a</a></td>\s*<td>t</td>\s*<td>-</td>\s*<td class="status">unverified: published</td>', html)  # fmt: skip
    assert "1 of 2 passed, 0 failed, 0 not run, 1 unverified" in html
    assert _row(nights, "20261101", "a").verified == "the night's publish record"


def test_a_missing_publish_record_or_one_of_another_row_leaves_the_digest_unverified(tmp_path):
    root = tmp_path / "nightly"
    night = write_night(root, "20261101", [Image("a", "t", D1, PKGS), Image("b", "t", D2, PKGS)])
    (night / "a-t" / "publish.json").unlink()
    (night / "b-t" / "publish.json").write_text(
        (night / "b-t" / "publish.json").read_text().replace('"stack": "b"', '"stack": "z"')
    )
    (night_read,) = history.read_nights(root)
    a, b = night_read.images
    assert a.unverified and "no readable publish record" in a.unverified
    assert b.unverified and "the record of z/t" in b.unverified
    assert [p.message for p in night_read.problems] == [f"rows[1].digest: {b.unverified}"]


def _push(registry: str, name: str, tag: str | None, arch: str = "amd64") -> str:
    """A one-blob image pushed to the real registry under ``tag`` (None: by its digest); its manifest digest."""
    client = RegistryClient(parse_repository(f"{registry}/{name}"))
    config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    client.upload_blob(sha256_digest(config), len(config), lambda: io.BytesIO(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256_digest(config),
            "size": len(config),
        },
        "layers": [],
    }
    body = json.dumps(manifest).encode()
    client.put_manifest(tag or sha256_digest(body), body, OCI_MANIFEST)
    return sha256_digest(body)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real docker-registry on 127.0.0.1 for this module: ``host:port``."""
    url, stop = start_registry(tmp_path_factory.mktemp("registry"))
    yield url
    stop()


def test_a_republish_of_an_image_already_signed_keeps_its_provenance_in_the_evidence(tmp_path, keys, registry):
    """The nightly's second publish of an image (its aliases, after the smoke) or a re-run finds it signed and signs
    nothing again: the evidence it writes still holds the envelope, so the history shows it signed."""
    (key, _), _ = keys
    digest = _push(registry, "team/signed", "s-20261101-r1")
    client = RegistryClient(parse_repository(f"{registry}/team/signed"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    attest.Signing(key, lambda: a_record(digest), {}, client, first)(digest, "sha256:" + "c" * 64)
    again = attest.Signing(key, lambda: a_record(digest), {}, client, second)
    again(digest, "sha256:" + "c" * 64)
    assert again.attached == {"digest": digest, "already": True}
    assert (second / "provenance.json").read_bytes() == (first / "provenance.json").read_bytes()


def test_the_registry_check_confirms_a_tag_or_marks_it_unverified(tmp_path, capsys, registry):
    root = tmp_path / "nightly"
    digest = _push(registry, "team/a", "a-20261101-r1")
    other = _push(registry, "team/b", "b-20261101-r1")
    # b: the summary and its record agree with each other, not with what the registry holds
    write_night(root, "20261101", [Image("a", "t", digest, PKGS), Image("b", "t", D2, PKGS)], registry=f"{registry}/team")  # fmt: skip
    _, nights = history.history(root, tmp_path / "site", history.HistoryOptions(registry_check=True))
    a, b = nights[0].images
    assert a.verified == "the night's publish record and the registry" and not a.unverified
    assert b.unverified == f"the registry's b-20261101-r1 is {other}, not {D2}"
    assert [p.message for p in history.problems(nights)] == [f"b/t: {b.unverified}"]
    assert main(["history", "--nights", str(root), "--out", str(tmp_path / "site"), "--registry-check"]) == 1
    assert "error:" in capsys.readouterr().err
    down = tmp_path / "down"
    write_night(down, "20261101", [Image("a", "t", D1, PKGS)], registry=f"127.0.0.1:{free_port()}/team")
    _, nights = history.history(down, tmp_path / "site2", history.HistoryOptions(registry_check=True))
    (image,) = nights[0].images
    assert image.verified == "the night's publish record" and not image.unverified
    assert image.registry_note and "not reached" in image.registry_note and history.problems(nights) == []


# --- the summary the nightly writes ---------------------------------------------------------------------------------


def test_the_registry_check_confirms_each_platforms_image_through_the_index_its_tag_holds(tmp_path, registry):
    """A stack of platform lines: its tag holds an index (written by the publisher's own code); each row's digest is
    the image of its platform the index lists."""
    from stackforge.publish import platforms

    repo, tag = "team/example-multi", "example-multi-20261101-r1"
    amd, arm = _push(registry, repo, None, "amd64"), _push(registry, repo, None, "arm64")
    sizes = {d: len(RegistryClient(parse_repository(f"{registry}/{repo}")).get_manifest(d).body) for d in (amd, arm)}  # type: ignore[union-attr]  # fmt: skip
    body = platforms.index_body([platforms.Child("linux/amd64", amd, sizes[amd], OCI_MANIFEST),
                                 platforms.Child("linux/arm64", arm, sizes[arm], OCI_MANIFEST)])  # fmt: skip
    RegistryClient(parse_repository(f"{registry}/{repo}")).put_manifest(tag, body, OCI_INDEX)
    root = tmp_path / "nightly"
    rows = [Image("example-multi", "escape", amd, PKGS, platform="linux/amd64", index=sha256_digest(body)),
            Image("example-multi", "escape", arm, PKGS, platform="linux/arm64", index=sha256_digest(body), line="@a")]  # fmt: skip
    write_night(root, "20261101", rows, registry=f"{registry}/team")
    _, nights = history.history(root, tmp_path / "site", history.HistoryOptions(registry_check=True))
    assert [(i.platform, i.unverified) for i in nights[0].images] == [("linux/amd64", None), ("linux/arm64", None)]
    assert all(i.verified and i.verified.endswith(f"and the registry (its index {sha256_digest(body)[:19]}…)")
               for i in nights[0].images)  # fmt: skip
    assert history.problems(nights) == []
    # a row whose record names no platform, claiming the arm64 image is the amd64 one: the index says otherwise
    wrong = tmp_path / "wrong"
    write_night(wrong, "20261101", [Image("example-multi", "escape", arm, PKGS, platform="linux/amd64")],
                registry=f"{registry}/team")  # fmt: skip
    _, nights = history.history(wrong, tmp_path / "site2", history.HistoryOptions(registry_check=True))
    (image,) = nights[0].images
    assert image.unverified == f"the registry's {tag} lists {arm} for linux/arm64, not linux/amd64"
    assert [p.message for p in history.problems(nights)] == [f"example-multi/escape: {image.unverified}"]


def test_every_field_the_nightly_writes_is_named_by_the_summary_model():
    # one row type: the row the nightly writes, the row a shard reports and the row the history reads name the same
    # fields (publish/night.py NightRow)
    assert {f.name for f in dataclasses.fields(nightly.Row)} == set(SummaryRow.model_fields)
    assert set(nightreg.Row.model_fields) == set(SummaryRow.model_fields) and SummaryRow is nightreg.NightRow
    doc = nightly.Summary("20261101", "r.example/t", rows=[nightly.Row("a", "t", "published")], drift={"a": {}},
                          ci={"provider": "github"}).to_json()  # fmt: skip
    assert set(doc) <= set(NightSummary.model_fields)


FRESH = {"newest": False, "newer": [{"package": "torch", "pinned": "2.7.1", "newest": "2.8.0"}], "trains_moved": ["t"],
         "unknown": [], "error": None}  # fmt: skip
DRIFT = {"drifted": True, "rows": 1, "upstreams": [{"upstream": "vllm", "rows": [{"change": "changed", "package": "torch",
         "before": "2.7", "after": "2.8", "where": "requirements/cuda.txt"}]}]}  # fmt: skip


def test_a_summary_the_nightly_wrote_validates(tmp_path):
    """Rows as nightly._one makes them (a build and a publish that answer as the real ones do, every field set), and
    the summary as nightly._write_summary writes it, read back by the history's model."""
    root = make_root(tmp_path)
    evidence = tmp_path / "evidence"

    def build(stack, opts, **kw):
        evidence.mkdir(exist_ok=True)
        return SimpleNamespace(evidence=evidence, gate=["gate result: 9 PASS, 0 FAIL"])

    def publish(stack, registry, *, options, move_aliases=True, **kw):
        aliases = {"r/x:v-latest": HELD}
        return SimpleNamespace(status="published", reference="r/x:t", digest=D1, aliases=aliases)

    run = nightly.NightlyRun(registry="registry.test/x", date="20261101", publishing=PublishOptions(), workspace=Workspace.at(root),
                             engine=None, outdir=tmp_path / "nights" / "20261101", echo=lambda line: None, build=build,
                             options=lambda **kw: kw, publish=publish)  # fmt: skip
    stack = load("post2", root=root)
    rows = [nightly._one(run, stack, "vllm-openai"), nightly._one(run, stack, "vllm-openai")]
    rows.append(nightly.Row("post1", "*", "failed", stage="load", reason="x", smoke_recipes={"q": "not-run"},
                            tests={"s": "passed"}))  # fmt: skip
    summary = nightly.Summary("20261101", "registry.test/x", rows=rows, bake={"not_run": "--no-bake was given"},
                              freshness={"post2": FRESH}, drift={"post2": DRIFT},
                              ci=nightly.ci_run({"CI_JOB_URL": "https://gitlab.example.com/j/1"}))  # fmt: skip
    nightly._write_summary(summary, run.outdir, 0.0, lambda name: ["a.b=1"], root)
    doc = safeio.load_model(NightSummary, run.outdir / "summary.json")
    assert [r.evidence for r in doc.rows] == ["post2-vllm-openai", "post2-vllm-openai", None]
    assert doc.rows[0].aliases == {"r/x:v-latest": HELD} and doc.ci and doc.ci.run_url
    (night,) = history.read_nights(tmp_path / "nights")
    assert [i.status for i in night.images] == ["published", "published", "failed"] and night.problems == []


def test_a_summary_of_a_night_where_nothing_built_validates(tmp_path):
    """nightly() itself, engine-free: a repository whose only nightly stack does not load."""
    root = make_root(tmp_path)
    for path in (root / "stacks").glob("*.yaml"):
        path.write_text(re.sub(r"(?m)^nightly: true\b.*$", "nightly: false", path.read_text()))
    (root / "stacks" / "broken.yaml").write_text("name: broken\ninherits: example\nnightly: true\npackges: {}\n")
    out = tmp_path / "nightly" / "20261101"
    nightly.nightly(root, "127.0.0.1:9/team", nightly.NightlyOptions(date="20261101", out=out, echo=lambda line: None))
    doc = safeio.load_model(NightSummary, out / "summary.json")
    assert [(r.stack, r.stage) for r in doc.rows] == [("broken", "load")] and doc.verdict == "failed"
    (night,) = history.read_nights(tmp_path / "nightly")
    assert night.error is None and night.images[0].failed and not night.problems
