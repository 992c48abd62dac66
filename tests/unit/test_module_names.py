"""Tests are imported without packages (rootdir-relative basenames), so two test modules of one file name in
different folders fail a whole-suite collection ("import file mismatch") while each folder alone collects: this
holds the suite to one module per name."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def duplicate_names(root: Path) -> dict[str, list[str]]:
    """Each test module file name found in more than one folder under ``root``, with the folders."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("test_*.py")):
        seen[path.name].append(str(path.parent.relative_to(root)))
    return {name: dirs for name, dirs in seen.items() if len(dirs) > 1}


def test_no_two_test_modules_share_a_name():
    assert duplicate_names(TESTS) == {}, "give one of them another name"


def test_the_check_sees_a_name_in_two_folders(tmp_path: Path):
    for folder in ("unit", "integration"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_same.py").write_text("")
    (tmp_path / "unit" / "test_other.py").write_text("")
    assert duplicate_names(tmp_path) == {"test_same.py": ["integration", "unit"]}
