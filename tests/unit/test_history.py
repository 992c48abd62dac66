"""`stackforge history`: the nights as a static site — newest first, failed rows marked, "same image as" an
earlier night, per image its packages and what changed since its previous night; every value escaped."""

from __future__ import annotations

import json
import re

import pytest

from stackforge.cli.main import main
from stackforge.flows import history
from stackforge.flows.nightly import Row, Summary
from tests.fixtures.nights import Image, edit_summary, write_night

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64
VLLM = {"vllm": "0.11.0+musa", "torch": "2.7.1+musa.4.3.0", "numpy": "1.26.4"}


@pytest.fixture
def nights(tmp_path):
    root = tmp_path / "nightly"
    write_night(root, "20261128", [Image("post2", "vllm-openai", D1, VLLM, {"libc6": "2.36-9"})])
    write_night(root, "20261129", [Image("post2", "vllm-openai", D1, VLLM, {"libc6": "2.36-9"})])
    moved = {**VLLM, "numpy": "2.2.6", "triton": "3.2.0"}
    del moved["torch"]
    write_night(
        root,
        "20261130",
        [
            Image("post2", "vllm-openai", D2, moved, {"libc6": "2.36-10"}),
            Image("post1", "vllm-openai", None, failed_at="gate"),
        ],
    )
    return root


def test_the_index_lists_the_nights_newest_first_and_marks_a_failed_row(nights, tmp_path):
    index, read = history.history(nights, tmp_path / "site")
    assert [n.date for n in read] == ["20261130", "20261129", "20261128"]
    html = index.read_text()
    heads = re.findall(r"<h3 id=\"night-(\d+)\">", html)
    assert heads == ["20261130", "20261129", "20261128"]
    failed = re.findall(r'<tr class="failed">\s*<td>post1</td>', html)
    assert len(failed) == 1 and "failed (gate)" in html and "gate failed: see the log" in html
    assert "same image as 20261128" in html  # the 29th published the 28th's digest again
    assert html.count("same image as") == 1
    assert "5.40 GB" in html


def test_an_image_page_lists_its_packages_and_what_changed(nights, tmp_path):
    history.history(nights, tmp_path / "site")
    page = (tmp_path / "site" / "images" / "20261130.post2.vllm-openai.html").read_text()
    assert 'href="20261129.post2.vllm-openai.html"' in page and 'href="../index.html#night-20261130"' in page
    rows = re.findall(
        r'<tr class="(added|removed|changed)"><td[^>]*>\w+</td><td>([^<]+)</td><td>([^<]*)</td><td>([^<]*)</td>', page
    )
    assert sorted(rows) == [
        ("added", "triton", "", "3.2.0"),
        ("changed", "libc6 (deb)", "2.36-9", "2.36-10"),
        ("changed", "numpy", "1.26.4", "2.2.6"),
        ("removed", "torch", "2.7.1+musa.4.3.0", ""),
    ]
    same = (tmp_path / "site" / "images" / "20261129.post2.vllm-openai.html").read_text()
    assert "No change in the installed Python distributions" in same
    assert "<td>vllm</td><td>0.11.0+musa</td>" in same


def test_values_from_a_summary_are_escaped(tmp_path):
    root = tmp_path / "nightly"
    night = write_night(root, "20261201", [Image("post2", "vllm-openai", None, failed_at="build")])
    data = json.loads((night / "summary.json").read_text())
    data["rows"][0]["reason"] = '<script>alert("x")</script>'
    data["rows"][0]["target"] = '"><img src=x onerror=alert(1)>'
    (night / "summary.json").write_text(json.dumps(data))
    html = history.history(root, tmp_path / "site")[0].read_text()
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html


def test_the_site_is_replaced_whole_and_a_bad_summary_is_named(nights, tmp_path):
    site = tmp_path / "site"
    history.history(nights, site)
    (site / "stale.html").write_text("old")
    history.history(nights, site)
    assert not (site / "stale.html").exists()
    (nights / "20261130" / "summary.json").write_text("{not json")
    _, read = history.history(nights, site)
    (problem,) = history.problems(read)
    assert problem.shown == "20261130/summary.json" and "is not JSON" in problem.message
    assert [n.date for n in read if n.error is None] == ["20261129", "20261128"]  # the others are still shown
    html = (site / "index.html").read_text()
    assert "The summary of <code>20261130</code> cannot be read: nightly summary is not JSON" in html
    assert not list(site.parent.glob(".site*"))


def test_the_cli_prints_the_index(nights, tmp_path, capsys):
    assert main(["history", "--nights", str(nights), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out" / "index.html")


def test_evidence_named_outside_its_night_is_not_read(tmp_path):
    root = tmp_path / "nightly"
    night = write_night(root, "20261202", [Image("post2", "vllm-openai", D1, VLLM)])
    outside = tmp_path / "elsewhere"
    (night / "post2-vllm-openai").rename(outside)
    data = json.loads((night / "summary.json").read_text())
    data["rows"][0]["evidence"] = "../../elsewhere"
    (night / "summary.json").write_text(json.dumps(data))
    (image,) = history.read_nights(root)[0].images
    assert image.dists == [] and not image.kept and image.size is None


def test_a_night_counts_not_run_apart_from_passed_and_failed(tmp_path):
    """A night whose smoke did not run (no device on its host) is neither passed nor failed, per recipe and in
    the totals: the summary the nightly writes, read back by the site."""
    night = tmp_path / "nightly" / "20261201"
    night.mkdir(parents=True)
    rows = [
        Row(
            "post2",
            "vllm-openai",
            "not-run",
            stage="smoke",
            smoke="not-run",
            smoke_recipes={"qwen3-8b": "not-run", "dsv2": "not-run"},
            reason="smoke not-run (no device)",
        ),
        Row("post1", "vllm-openai", "published", smoke="passed", smoke_recipes={"qwen3-8b": "passed"}),
        Row(
            "post0",
            "vllm-openai",
            "failed",
            stage="smoke",
            smoke="failed",
            smoke_recipes={"qwen3-8b": "failed", "dsv2": "passed"},
        ),
    ]
    (night / "summary.json").write_text(json.dumps(Summary("20261201", "r.example/t", rows=rows).to_json()))
    index, (read,) = history.history(tmp_path / "nightly", tmp_path / "site")
    assert (read.passed, read.failed, read.not_run) == (1, 1, 1)
    assert read.smoke_counts == {"passed": 2, "failed": 1, "not_run": 2}
    html = index.read_text()
    assert "1 of 3 passed, 1 failed, 1 not run" in html and "Smoke recipes: 2 passed, 1 failed, 2 not run." in html
    assert re.search(r'<tr class="not-run">\s*<td>post2</td>', html)  # not painted green, nor red
    assert "not-run (qwen3-8b not-run, dsv2 not-run)" in html and "failed (qwen3-8b failed, dsv2 passed)" in html


# --- a stack of platform lines: a row per platform -------------------------------------------------------------------

AMD, ARM = "linux/amd64", "linux/arm64"
INDEX = "sha256:" + "c" * 64
D3 = "sha256:" + "d" * 64


def lines(amd: str, arm: str, dists: dict[str, str]) -> list[Image]:
    """example-multi's two lines under one tag (an index): each its own image, record and evidence."""
    return [
        Image("example-multi", "escape", amd, dists, platform=AMD, index=INDEX),
        Image("example-multi", "escape", arm, dists, platform=ARM, index=INDEX, line="@arm64"),
    ]


@pytest.fixture
def platform_nights(tmp_path):
    root = tmp_path / "nightly"
    write_night(root, "20261204", [Image("example", "escape", D1, VLLM)])  # written before rows named a platform
    write_night(root, "20261205", [*lines(D1, D2, VLLM), Image("example", "escape", D1, VLLM, platform=AMD)])
    moved = {**VLLM, "numpy": "2.2.6"}
    write_night(root, "20261206", [*lines(D1, D3, moved), Image("example", "escape", D1, VLLM, platform=AMD)])
    return root


def test_the_index_shows_the_platform_of_every_row(platform_nights, tmp_path):
    index, nights = history.history(platform_nights, tmp_path / "site")
    html = index.read_text()
    assert "<th>target</th><th>platform</th><th>status</th>" in html
    newest = nights[0]
    assert [(i.stack, i.platform, i.outcome) for i in newest.images] == [
        ("example-multi", AMD, "passed"),
        ("example-multi", ARM, "passed"),
        ("example", AMD, "passed"),
    ]
    assert all(i.verified == "the night's publish record" for n in nights for i in n.images)
    assert re.search(r"<td>escape</td>\s*<td>linux/arm64</td>", html)
    (old,) = nights[-1].images  # a night before rows named their platform still reads; its cell is "-"
    assert old.platform is None and re.search(r"<td>escape</td>\s*<td>-</td>", html)
    assert history.problems(nights) == []


def test_each_platform_has_its_own_page_and_series_of_nights(platform_nights, tmp_path):
    _, nights = history.history(platform_nights, tmp_path / "site")
    pages = tmp_path / "site" / "images"
    arm = (pages / "20261206.example-multi.escape.linux_2farm64.html").read_text()
    assert 'href="20261205.example-multi.escape.linux_2farm64.html"' in arm  # its previous night: the same platform
    assert "<h1>example-multi/escape (linux/arm64) — night 20261206</h1>" in arm
    assert "<tr><th>platform</th><td>linux/arm64</td></tr>" in arm
    assert re.search(r'<tr class="changed"><td[^>]*>changed</td><td>numpy</td>', arm)
    amd = (pages / "20261206.example-multi.escape.linux_2famd64.html").read_text()
    assert 'href="20261205.example-multi.escape.linux_2famd64.html"' in amd
    # "same image as": per platform (the amd64 digest is the 5th's amd64 one; the arm64 one is new)
    by_platform = {i.platform: i for i in nights[0].images if i.stack == "example-multi"}
    assert by_platform[AMD].same_as == "20261205" and by_platform[ARM].same_as is None
    # a stack of one line keeps one page per night, its series across nights with and without the platform
    one = (pages / "20261205.example.escape.html").read_text()
    assert 'href="20261204.example.escape.html"' in one and 'href="20261206.example.escape.html"' in one


def test_a_row_claiming_another_platform_than_its_record_is_unverified(tmp_path):
    root = tmp_path / "nightly"
    night = write_night(root, "20261206", lines(D1, D2, VLLM))

    def swap(data):
        data["rows"][0]["platform"], data["rows"][1]["platform"] = ARM, AMD

    edit_summary(night, swap)
    _, nights = history.history(root, tmp_path / "site")
    amd, _ = nights[0].images
    assert amd.unverified and "it is the record of the linux/amd64 image" in amd.unverified
    assert len(history.problems(nights)) == 2
