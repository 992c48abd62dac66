"""`stackforge audit` in a real git repository with a planted stale reference."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stackforge.cli.main import main

REPO = Path(__file__).resolve().parents[2]

DOCS = """# Installing the image
The image carries torch 2.11.0.post2+musa5.2.0 and torchada 0.1.90.
Install the vendor wheels with pip install torch==2.11.0.post1+musa5.2.0 --no-deps
Images before this one were tagged vllm:v0.28.0-ph1-5.2.0-torch2.11.0.post1-latest.
A version such as 2.11.0.post10 or 12.11.0.post1 is not the old pin.
"""


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "docs").mkdir()
    for name in ("post1", "post2"):
        (root / "stacks" / f"{name}.yaml").write_text((REPO / "stacks" / f"{name}.yaml").read_text())
    (root / "docs" / "install.md").write_text(DOCS)
    (root / "README.md").write_text("See docs/install.md. Current train: post2.\n")
    (root / "logo.png").write_bytes(b"\x89PNG\0\0 2.11.0.post1 inside binary data")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "init")
    (root / "notes-untracked.md").write_text("torchada 0.1.83\n")  # not tracked: not scanned
    return root


def audit(root, capsys, *argv):
    code = main(["--root", str(root), "audit", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_audit_finds_the_planted_reference(repo, capsys):
    code, out, _ = audit(repo, capsys, "post2")
    assert code == 1
    lines = [ln for ln in out.splitlines() if ln.startswith("docs/")]
    doc = DOCS.splitlines()
    col3 = doc[2].index("2.11.0.post1+musa5.2.0") + 1
    assert lines == [
        f"docs/install.md:3:{col3}: 2.11.0.post1+musa5.2.0 (torch was 2.11.0.post1+musa5.2.0, now 2.11.0.post2+musa5.2.0)",
    ]
    # line 4's bare 2.11.0.post1 is current: post2's aarch64 line pins torch 2.11.0.post1+musa5.2.1mp22
    assert "docs/install.md:4:" not in out
    assert "stacks/post1.yaml" not in out  # the parent declares the old pins by design
    assert "notes-untracked" not in out and "logo.png" not in out
    assert "1 stale reference(s) in 4 tracked text files" in out


def test_allow_list_and_json(repo, capsys):
    (repo / "docs" / "install.md").write_text(DOCS + "The post1 install read torch==2.11.0.post1+musa5.2.0 too.\n")
    (repo / "stacks" / "audit-allow.txt").write_text(
        "# history that must keep naming the old pin\n"
        "docs/install.md 2.11.0.post1+musa5.2.0   # the previous install line, quoted on purpose\n"
    )
    git(repo, "add", "stacks/audit-allow.txt", "docs/install.md")
    code, out, _ = audit(repo, capsys, "post2", "--json")
    data = json.loads(out)
    assert code == 0, out
    assert data["findings"] == []
    allowed = {(a["path"], a["line"]): a["allowed_by"] for a in data["allowed"]}
    assert allowed[("docs/install.md", 3)] == allowed[("docs/install.md", 6)] == "stacks/audit-allow.txt:2"
    assert any(p == "stacks/post1.yaml" for p, _ in allowed)

    (repo / "stacks" / "audit-allow.txt").write_text("docs/install.md 2.11.0.post1\n")  # another stale string
    code, out, _ = audit(repo, capsys, "post2", "--json")
    assert code == 1
    assert [(f["path"], f["line"]) for f in json.loads(out)["findings"]] == [
        ("docs/install.md", 3),
        ("docs/install.md", 6),
    ]

    (repo / "stacks" / "audit-allow.txt").write_text("docs/\n")
    code, out, _ = audit(repo, capsys, "post2", "--show-allowed")
    assert code == 0
    assert "[allowed: stacks/audit-allow.txt:1]" in out


def test_fixing_the_reference_clears_the_audit(repo, capsys):
    text = (repo / "docs" / "install.md").read_text()
    text = text.replace("2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0").replace(
        "torch2.11.0.post1", "torch2.11.0.post2"
    )
    (repo / "docs" / "install.md").write_text(text)
    code, out, _ = audit(repo, capsys, "post2")
    assert code == 0, out
    assert "0 stale reference(s)" in out


def test_against_another_stack(repo, capsys):
    code, out, _ = audit(repo, capsys, "post1", "--against", "post2", "--json")
    data = json.loads(out)
    # Seen from post1, post2's pins are the ones moved away from; the files of post2's chain are
    # exempt (post1.yaml is in it, and its rules name 0.1.90 and 2.11.0.post2 as minimums).
    assert code == 1
    assert "2.11.0.post2+musa5.2.0" in data["stale"] and "0.1.90" in data["stale"]
    assert {(f["path"], f["line"]) for f in data["findings"]} == {("docs/install.md", 2)}
    assert {a["path"] for a in data["allowed"]} == {"stacks/post1.yaml", "stacks/post2.yaml"}
    code, _, err = audit(repo, capsys, "post1")
    assert code == 2 and "has no parent" in err
