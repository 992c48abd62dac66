"""The local-label rule: one table of cases, one verdict each, through every place that compares a pin with a
version (the rule itself, the gate, the preserve check, the stack rules, diff and the lock check)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stackforge import localver
from stackforge.stack.diff import diff_stacks
from stackforge.stack.load import load
from tests.fixtures.image_scripts import GATE_DIR
from tests.fixtures.image_scripts import load as load_image_script

gate = load_image_script("gate")
preserve = load_image_script("preserve")
REPO = Path(__file__).resolve().parents[2]

#: (pin, installed, verdict, matches)
TABLE = [
    ("0.2.7", "0.2.7", localver.MATCH, True),
    ("0.2.7", "0.2.7+musa", localver.BUILD_OF_PIN, True),
    ("0.2.7+musa", "0.2.7+musa", localver.MATCH, True),
    ("0.2.7+musa", "0.2.7", localver.NOT_PINNED_BUILD, False),
    ("0.2.7+musa", "0.2.7+musa.2", localver.OTHER_BUILD, False),
    ("0.2.7", "0.2.8", localver.OTHER_VERSION, False),
    ("0.2.7+musa", "0.2.8+musa", localver.OTHER_VERSION, False),
    # PEP 440 spellings: zero padding, case and separators of the label
    ("1.26", "1.26.0", localver.MATCH, True),
    ("2.11.0.post2+musa5.2.0", "2.11.0.post2+MUSA5.2.0", localver.MATCH, True),
    ("0.1.12+musa.2", "0.1.12+musa-2", localver.MATCH, True),
    ("0.1.12+musa.2", "0.1.12+musa.3", localver.OTHER_BUILD, False),
]
IDS = [f"{pin}~{installed}" for pin, installed, _, _ in TABLE]


@pytest.mark.parametrize(("pin", "installed", "verdict", "ok"), TABLE, ids=IDS)
def test_the_rule_gives_one_verdict_per_case(pin, installed, verdict, ok):
    assert localver.verdict(pin, installed) == verdict
    assert localver.matches(pin, installed) is ok


def _dist(site, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.parametrize(("pin", "installed", "verdict", "ok"), TABLE, ids=IDS)
def test_the_gate_agrees(tmp_path, monkeypatch, pin, installed, verdict, ok):
    _dist(tmp_path, "labelled-dist", installed)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"name": "labelled-dist", "dist": "labelled-dist", "import": "x", "mode": "metadata", "version": pin}
    passed, line = gate.check_package(spec)
    assert passed is ok
    # what is installed is reported exactly as installed, whatever the pin says
    assert (f"version={installed}" if ok else f"found={installed}") in line
    assert ("pin=" in line) is (verdict == localver.BUILD_OF_PIN)


@pytest.mark.parametrize(("pin", "installed", "verdict", "ok"), TABLE, ids=IDS)
def test_the_preserve_check_agrees(pin, installed, verdict, ok):
    after = {"labelled-dist": ("labelled-dist", installed, [])}
    (line,) = preserve.check({"labelled-dist": pin}, after, {}, {}, "vendor")
    assert line.startswith("PASS" if ok else "FAIL")
    assert (f"version={installed}" if ok else f"found={installed}") in line


@pytest.mark.parametrize(("pin", "installed", "verdict", "ok"), TABLE, ids=IDS)
def test_diff_calls_only_another_build_a_change(pin, installed, verdict, ok):
    """diff compares two pins: only the same build (same public version and label) is unchanged."""
    old = load("post2", root=REPO, overrides=[f"packages.numpy.version={pin}"]).model
    new = load("post2", root=REPO, overrides=[f"packages.numpy.version={installed}"]).model
    rows = {r.package: r for r in diff_stacks(old, new).changed}
    assert ("numpy" in rows) is (verdict not in (localver.MATCH,))
    if verdict in (localver.BUILD_OF_PIN, localver.NOT_PINNED_BUILD, localver.OTHER_BUILD):
        assert rows["numpy"].note.startswith("another build of the same version")


def test_an_aligned_family_aligns_on_the_public_version(tmp_path):
    from stackforge.stack import rules

    labelled = load("post2", root=REPO, overrides=["packages.flash_attn_3.version=0.2.7+musa"])
    assert rules.check_aligned(labelled) == []
    moved = load("post2", root=REPO, overrides=["packages.flash_attn_3.version=0.2.8+musa"])
    (finding,) = rules.check_aligned(moved)
    assert finding.fix == "pin flash_attn_3 0.2.7+musa"


def test_the_gate_and_preserve_ship_the_rule_beside_them():
    """The in-image scripts import the one rule from beside them: images/gate/localver.py is the package's file."""
    link = GATE_DIR / "localver.py"
    assert link.is_symlink() and os.path.samefile(link, localver.__file__)
