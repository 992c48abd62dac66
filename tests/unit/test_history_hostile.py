"""`stackforge history` against hostile nights: an --out that would delete what it reads, special files, huge and
deep documents, wrong types, evidence named outside its night, colliding page names, markup and escape sequences.
Each is one `error:` line naming the file (and the field), the other nights still shown, nothing deleted, no hang."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from stackforge import safeio
from stackforge.cli.main import main
from stackforge.flows import history, nightly
from tests.fixtures import hostile_files as hf
from tests.fixtures.nights import Image, edit_summary, write_night

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64
PKGS = {"vllm": "0.11.0+musa", "numpy": "1.26.4"}


@pytest.fixture
def nights(tmp_path) -> Path:
    root = tmp_path / "nightly"
    write_night(root, "20261129", [Image("post2", "vllm-openai", D1, PKGS, {"libc6": "2.36-9"})])
    write_night(root, "20261130", [Image("post2", "vllm-openai", D2, PKGS, {"libc6": "2.36-9"})])
    return root


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """The CLI's exit, stdout and error lines (bounded: a read that blocks fails the test)."""
    code = hf.within(30, main, ["history", *argv])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.startswith("error:")]


def summaries(root: Path) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted(root.glob("*/summary.json"))}


# --- --out never deletes what history reads ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["nights", "parent", "a night", "a link to the nights"])
def test_an_out_that_is_or_holds_the_nights_is_refused_and_nothing_is_deleted(nights, tmp_path, capsys, where):
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    out = {"nights": nights, "parent": tmp_path, "a night": nights / "20261130", "a link to the nights": tmp_path / "l"}[where]  # fmt: skip
    if where == "a link to the nights":
        out.symlink_to(nights)
        before.add(Path("l"))
    code, stdout, errors = run(capsys, "--nights", str(nights), "--out", str(out))
    assert code != 0 and stdout == "" and len(errors) == 1 and "--out" in errors[0]
    assert {p.relative_to(tmp_path) for p in tmp_path.rglob("*")} == before  # every summary and evidence file kept


def test_a_directory_history_did_not_write_is_not_replaced(nights, tmp_path, capsys):
    out = tmp_path / "www"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(out))
    assert code != 0 and len(errors) == 1 and "did not write" in errors[0]
    assert (out / "notes.txt").read_text() == "mine" and not (out / "index.html").exists()


def test_the_site_under_the_nights_is_replaced_and_never_read_as_a_night(nights, capsys):
    site = nights / "site"
    for _ in range(2):  # the CI files write $NIGHTS/site every night
        code, stdout, errors = run(capsys, "--nights", str(nights), "--out", str(site))
        assert (code, errors, stdout.strip()) == (0, [], str(site / "index.html"))
    (site / "summary.json").write_text((nights / "20261130" / "summary.json").read_text())  # even holding one
    code, _, _ = run(capsys, "--nights", str(nights), "--out", str(site), "--json")
    assert code == 0
    assert len(history.read_nights(nights)) == 2 and not list(nights.glob(".site*"))
    assert re.findall(r'<h3 id="night-(\w+)"', (site / "index.html").read_text()) == ["20261130", "20261129"]


def test_a_site_an_earlier_release_wrote_is_replaced_but_a_look_alike_is_not(nights, tmp_path, capsys):
    old = tmp_path / "old"
    (old / "images").mkdir(parents=True)
    (old / "images" / "20261130-post2-vllm-openai.html").write_text("<html></html>")
    (old / "index.html").write_text("<p>generated 2026-11-30 by <code>stackforge history</code>.</p>")
    assert run(capsys, "--nights", str(nights), "--out", str(old))[0] == 0
    assert (old / "images" / "20261130.post2.vllm-openai.html").is_file() and (old / safeio.OUTPUT_MARK).is_file()
    assert not (old / "images" / "20261130-post2-vllm-openai.html").exists()
    other = tmp_path / "other"
    (other / "images").mkdir(parents=True)
    (other / "index.html").write_text("<p>my own page</p>")
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(other))
    assert code != 0 and len(errors) == 1 and (other / "index.html").read_text() == "<p>my own page</p>"


# --- a summary that cannot be read --------------------------------------------------------------------------------

SUMMARY_CASES = {
    "fifo": (lambda p: hf.fifo(p), "FIFO"),
    "zero_link": (lambda p: hf.zero_link(p), "leads out of"),  # to /dev/zero
    "huge": (lambda p: hf.huge(p, history.MAX_SUMMARY + 1), "larger than"),
    "deep": (lambda p: hf.deep_json(p), "nests 100000 levels"),
    "not_utf8": (lambda p: hf.not_utf8(p), "not UTF-8"),
    "link_out": (lambda p: hf.link_out(p), "leads out of"),
    **{f"json{i}": (lambda p, t=text: p.write_text(t), "nightly summary") for i, text in enumerate(hf.HOSTILE_JSON)},
}


@pytest.mark.parametrize("case", sorted(SUMMARY_CASES))
def test_a_hostile_summary_is_one_error_line_and_the_other_nights_are_shown(nights, tmp_path, capsys, case):
    make, says = SUMMARY_CASES[case]
    path = nights / "20261130" / "summary.json"
    path.unlink()
    make(path)
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert code == 1 and len(errors) == 1, errors
    assert "20261130/summary.json: " in errors[0] and says in errors[0]
    html = (tmp_path / "site" / "index.html").read_text()
    assert "The summary of <code>20261130</code> cannot be read" in html
    assert "images/20261129.post2.vllm-openai.html" in html  # the good night is there, with its page


WRONG_TYPES = {
    "rows[0].digest": lambda d: d["rows"][0].update(digest=12),
    "rows[0].duration_s": lambda d: d["rows"][0].update(duration_s="600"),
    "rows[0].smoke_recipes.qwen": lambda d: d["rows"][0].update(smoke_recipes={"qwen": 1}),
    "rows[0].aliases": lambda d: d["rows"][0].update(aliases=["-latest"]),
    "rows[0].stack": lambda d: d["rows"][0].pop("stack"),
    "rows": lambda d: d.update(rows={"0": {}}),
    "date": lambda d: d.update(date="2026-11-30"),
    "ci.run_url": lambda d: d.update(ci={"run_url": ["https://x"]}),
}


@pytest.mark.parametrize("field", sorted(WRONG_TYPES))
def test_a_summary_of_the_wrong_shape_names_the_file_and_the_field(nights, tmp_path, capsys, field):
    edit_summary(nights / "20261130", WRONG_TYPES[field])
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert code == 1 and len(errors) == 1
    assert f"20261130/summary.json: nightly summary: {field}:" in errors[0]


def test_a_night_directory_linked_out_of_the_nights_is_not_read(nights, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    (nights / "20261130").rename(elsewhere)
    (nights / "20261130").symlink_to(elsewhere)
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert (
        code == 1 and len(errors) == 1 and "20261130/summary.json: the night's directory is a link out of" in errors[0]
    )
    assert (elsewhere / "summary.json").is_file()
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(elsewhere))  # nor is it written over
    assert code != 0 and (elsewhere / "summary.json").is_file()


def test_a_digest_edited_to_another_shape_is_refused(nights, tmp_path):
    edit_summary(nights / "20261130", lambda d: d["rows"][0].update(digest="sha256:abc"))
    read = history.read_nights(nights)
    assert read[0].error and "rows[0].digest" in read[0].error and not read[0].images


# --- the evidence a summary names ---------------------------------------------------------------------------------

EVIDENCE_FILES = ["inventory.json", "publish.json", "system.txt", "inputs.json", "sbom.cdx.json", "provenance.json"]


HOSTILE_EVIDENCE = [
    (name, maker)
    for name in EVIDENCE_FILES
    for maker in ("fifo", "zero_link", "link_out", "deep_json", "not_utf8")
    if (name, maker) != ("system.txt", "deep_json")  # brackets are text there
]


@pytest.mark.parametrize(("name", "maker"), HOSTILE_EVIDENCE)
def test_a_hostile_evidence_file_is_named_and_not_read(nights, tmp_path, capsys, name, maker):
    path = nights / "20261130" / "post2-vllm-openai" / name
    path.unlink(missing_ok=True)
    hf.SPECIALS[maker](path)
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert code == 1 and len(errors) == 1 and f"20261130/post2-vllm-openai/{name}:" in errors[0], errors
    page = (tmp_path / "site" / "images" / "20261130.post2.vllm-openai.html").read_text()
    assert "Problems with its evidence" in page and f"20261130/post2-vllm-openai/{name}" in page
    hostname = hf.OUTSIDE.read_text().strip()
    assert hostname not in page.replace(f"20261130/post2-vllm-openai/{name}", "")  # nothing of the file outside
    (read, older) = history.read_nights(nights)
    assert not older.problems and older.images[0].kept


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("inventory.json", {"dists": [{"name": "vllm", "version": 1}]}, "inventory: dists[0].version"),
        ("inventory.json", {"dists": "vllm"}, "inventory: dists"),
        ("publish.json", {"status": "published", "digest": D2, "size": "5 GB"}, "publish record: size"),
        ("publish.json", {"digest": D2}, "publish record: status"),
        ("inputs.json", {"labels": {"org.opencontainers.image.revision": 7}}, "build inputs: labels.org"),
        ("sbom.cdx.json", {"bomFormat": "SPDX", "specVersion": "2"}, "SBOM: bomFormat"),
        ("provenance.json", {"payloadType": "x", "payload": "e30=", "signatures": []}, "provenance: signatures"),
    ],
)
def test_an_evidence_record_of_the_wrong_shape_names_the_file_and_the_field(
    nights, tmp_path, capsys, name, body, field
):
    (nights / "20261130" / "post2-vllm-openai" / name).write_text(json.dumps(body))
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert code == 1 and len(errors) == 1 and f"post2-vllm-openai/{name}: {field}" in errors[0], errors


def test_a_huge_evidence_record_is_refused_within_its_bound(nights, tmp_path):
    hf.huge(nights / "20261130" / "post2-vllm-openai" / "inventory.json", history.MAX_RECORD + 1)
    (read, _) = history.read_nights(nights)
    (problem,) = read.problems
    assert "larger than" in problem.message and read.images[0].dists == []


@pytest.mark.parametrize("value", ["/etc", "../20261129/post2-vllm-openai", "post2-vllm-openai/../../x", "link", ""])
def test_evidence_named_outside_its_night_is_never_read(nights, tmp_path, capsys, value):
    outside = tmp_path / "outside"
    (outside / "e").mkdir(parents=True)
    (outside / "e" / "inventory.json").write_text(json.dumps({"dists": [{"name": "planted", "version": "6.6.6"}]}))
    (nights / "20261130" / "link").symlink_to(outside / "e")
    edit_summary(nights / "20261130", lambda d: d["rows"][0].update(evidence=value))
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert code == 1 and len(errors) == 1 and "summary.json: rows[0].evidence" in errors[0], errors
    (image,) = history.read_nights(nights)[0].images
    assert image.dists == [] and not image.kept and image.size is None and image.unverified
    assert "planted" not in (tmp_path / "site" / "images" / "20261130.post2.vllm-openai.html").read_text()


def test_an_evidence_file_linked_out_of_its_night_is_not_read(nights, tmp_path):
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"dists": [{"name": "planted", "version": "6.6.6"}]}))
    inv = nights / "20261130" / "post2-vllm-openai" / "inventory.json"
    inv.unlink()
    inv.symlink_to(planted)
    (read, _) = history.read_nights(nights)
    assert [d["name"] for d in read.images[0].dists] == [] and "leads out of" in read.problems[0].message


# --- names, markup, terminals --------------------------------------------------------------------------------------


def test_rows_whose_names_join_alike_get_pages_and_evidence_of_their_own(tmp_path):
    root = tmp_path / "nightly"
    pairs = [("hp-a", "b-c"), ("hp-a-b", "c"), ("a.b", "x"), ("a", "b.x"), ("a_b", "x"), ("Post2", "x"), ("post2", "x")]
    write_night(root, "20261201", [Image(s, t, "sha256:" + f"{i:x}" * 64, {f"only-{i}": "1"}) for i, (s, t) in enumerate(pairs)])  # fmt: skip
    history.history(root, tmp_path / "site")
    pages = sorted((tmp_path / "site" / "images").glob("*.html"))
    assert len(pages) == len(pairs) == len({p.name.lower() for p in pages})
    for i, (stack, target) in enumerate(pairs):
        text = (tmp_path / "site" / "images" / history.page_name("20261201", stack, target)).read_text()
        assert f"<td>only-{i}</td>" in text and [j for j in range(len(pairs)) if f"<td>only-{j}</td>" in text] == [i]


def test_the_nightly_names_each_rows_evidence_apart():
    taken: dict = {}
    first, second = nightly.evidence_name("hp-a", "b-c", taken), nightly.evidence_name("hp-a-b", "c", taken)
    assert first == "hp-a-b-c" and second.startswith("hp-a-b-c-") and first != second
    assert (
        nightly.evidence_name("hp-a-b", "c", taken) == second and nightly.evidence_name("hp-a", "b-c", taken) == first
    )
    assert safeio.relative_name(second) and len(taken) == 2


def test_page_names_are_injective_and_file_names():
    parts = [("hp-a", "b-c"), ("hp-a-b", "c"), ("a.b", "c"), ("a", "b.c"), ("a_2eb", "c"), ("A", "b"), ("a", "b")]
    names = [history.page_name("n", s, t) for s, t in parts]
    assert len(set(names)) == len(names) and all(re.fullmatch(r"[a-z0-9._-]+\.html", n) for n in names)
    long = [history.page_name("n", "x" * 300, t) for t in ("a", "b")]
    assert len(set(long)) == 2 and all(len(n) < 255 and "~" in n for n in long)


def test_every_value_from_a_night_reaches_the_html_escaped(nights, tmp_path):
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    evidence = nights / "20261130" / "post2-vllm-openai"
    edit_summary(
        nights / "20261130",
        lambda d: (
            d["rows"][0].update(target=evil, reason=evil, gate=evil, aliases={f"r/x:{evil}": f"not moved: {evil}"}),
            d.update(registry=evil, started_at=evil, ci={"run_url": "javascript:alert(3)", "commit": "0" * 40}),
        ),
    )
    record = json.loads((evidence / "publish.json").read_text())
    record["scan"] = {"blocking": [evil], "waived": [{"id": evil, "reason": evil}], "findings": [evil]}
    (evidence / "publish.json").write_text(json.dumps(record))
    labels = {"org.opencontainers.image.source": f"javascript:alert(4)//{evil}", "org.opencontainers.image.revision": evil}  # fmt: skip
    (evidence / "inputs.json").write_text(json.dumps({"labels": labels}))
    (evidence / "system.txt").write_text(f"installed:\n{evil.replace(' ', '')} 1\n")
    history.history(nights, tmp_path / "site")
    pages = sorted((tmp_path / "site").rglob("*.html"))
    for page in pages:
        html = page.read_text()
        assert "<script" not in html and "<img" not in html and 'href="javascript' not in html, page
        assert not re.search(r'href="(?!https?://|\.\./|images/|#|[\w.-]+\.html)', html), page
    shown = (tmp_path / "site" / "images" / history.page_name("20261130", "post2", evil)).read_text()
    assert shown.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 7  # target, reason, gate, alias, scan (3)
    assert "javascript:alert(4)" in shown and "javascript:alert(3)" not in shown  # a label shown as text, not a link


def test_the_templates_mark_nothing_safe_and_autoescape_is_on():
    templates = sorted((history.images_dir() / "docs").glob("history*.j2"))
    assert len(templates) == 3 and all("safe" not in t.read_text() for t in templates)
    assert history._environment().autoescape is True


def test_an_escape_sequence_in_a_night_never_reaches_the_terminal(nights, tmp_path, capsys):
    bad = nights / "2026\x1b]0;owned\x07\x1b[2J"
    bad.mkdir()
    (bad / "summary.json").write_text("\x1b[31m{")
    edit_summary(nights / "20261130", lambda d: d["rows"][0].update(evidence="\x1b[2Jx"))
    code, _, errors = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"))
    assert code == 1 and len(errors) == 2
    assert all("\x1b" not in line and "\x07" not in line for line in errors)
    code, out, _ = run(capsys, "--nights", str(nights), "--out", str(tmp_path / "site"), "--json")
    doc = json.loads(out)
    assert len(doc["problems"]) == 2 and "\x1b" not in out  # JSON keeps it escaped
    assert any("\x1b" in p["file"] for p in doc["problems"])


def test_the_nights_directory_itself_must_exist(tmp_path, capsys):
    code, _, errors = run(capsys, "--nights", str(tmp_path / "absent"), "--out", str(tmp_path / "site"))
    assert code == 2 and len(errors) == 1 and "is not a directory" in errors[0]
    os.mkfifo(tmp_path / "pipe")
    code, _, errors = run(capsys, "--nights", str(tmp_path / "pipe"), "--out", str(tmp_path / "site"))
    assert code == 2 and len(errors) == 1 and not (tmp_path / "site").exists()
