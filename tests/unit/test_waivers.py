"""stacks/waivers.yaml: read with positions, refused by lint (no reason, past its date, a repeat, a wrong
shape) naming the file and line, never taken for a stack."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from stackforge.builder.records import waivers
from stackforge.errors import UserError
from stackforge.stack.load import load
from stackforge.stack.names import list_stacks
from tests.fixtures import hostile_files as hf
from tests.fixtures.stack_support import make_root, run_cli

TODAY = dt.date(2026, 12, 6)
GOOD = """\
# the vendor's wheel: no fixed build for MUSA yet
waivers:
  - id: GHSA-aaaa-bbbb-cccc
    package: torchvision
    versions: ["0.26.0.post2+musa5.2.0"]
    reason: the vendor's build; the affected decoder is not reachable from vllm serve
    expires: 2027-01-31
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stacks" / "waivers.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_good_file_loads_and_lints_clean(tmp_path):
    path = write(tmp_path, GOOD)
    assert waivers.lint(path, TODAY, "stacks/waivers.yaml") == []
    (w,) = waivers.load(path, "stacks/waivers.yaml").entries
    assert (w.id, w.package, w.versions, w.expires) == (
        "GHSA-aaaa-bbbb-cccc",
        "torchvision",
        ("0.26.0.post2+musa5.2.0",),
        dt.date(2027, 1, 31),
    )
    assert w.where == "stacks/waivers.yaml:3" and not w.expired(dt.date(2027, 1, 31)) and w.expired(dt.date(2027, 2, 1))


@pytest.mark.parametrize(
    ("change", "line", "said"),
    [
        (
            ("    reason: the vendor's build; the affected decoder is not reachable from vllm serve\n", ""),
            3,
            "has no reason",
        ),
        (("the vendor's build; the affected decoder is not reachable from vllm serve", '"  "'), 6, "has no reason"),
        (("the vendor's build; the affected decoder is not reachable from vllm serve", "n/a"), 6, "says nothing"),
        (("2027-01-31", "2026-12-05"), 7, "expired on 2026-12-05: its finding blocks the gate again"),
    ],
)
def test_lint_refuses_a_waiver_without_a_reason_or_past_its_date(tmp_path, change, line, said):
    path = write(tmp_path, GOOD.replace(*change))
    (problem,) = waivers.lint(path, TODAY, "stacks/waivers.yaml")
    assert problem.render().startswith(f"error: stacks/waivers.yaml:{line}:") and said in problem.message
    assert problem.fix


def test_lint_refuses_a_repeat(tmp_path):
    path = write(tmp_path, GOOD + GOOD.split("waivers:\n", 1)[1].replace("torchvision", "TorchVision"))
    (problem,) = waivers.lint(path, TODAY, "stacks/waivers.yaml")
    assert problem.render().startswith("error: stacks/waivers.yaml:8:") and "repeats the waiver at line 3" in problem.message  # fmt: skip


@pytest.mark.parametrize(
    ("change", "where", "said"),
    [
        (
            ('versions: ["0.26.0.post2+musa5.2.0"]', "versions: 0.26"),
            ":5:",
            "waivers[0].versions: Input should be a valid list",
        ),
        (
            ('versions: ["0.26.0.post2+musa5.2.0"]', "versions: [3.10]"),
            ":5:",
            "waivers[0].versions[0]: Input should be a valid string",
        ),
        (
            ('versions: ["0.26.0.post2+musa5.2.0"]', "versions: []"),
            ":5:",
            "waivers[0].versions: List should have at least 1 item",
        ),
        (("expires: 2027-01-31", "expires: next year"), ":7:", "waivers[0].expires: Input should be a valid date"),
        (
            ("expires: 2027-01-31", "expires: 2027-01-31\n    by: me"),
            ":8:",
            "waivers[0].by: Extra inputs are not permitted",
        ),
        (("id: GHSA-aaaa-bbbb-cccc", "id: GHSA-1\\x1b[2J"), ":3:", "waivers[0].id: String should match pattern"),
        (("waivers:", "waiver:"), ":2:", "waiver: Extra inputs are not permitted"),
    ],
)
def test_a_wrong_shape_is_one_error_at_its_line(tmp_path, change, where, said):
    path = write(tmp_path, GOOD.replace(*change))
    (problem,) = waivers.lint(path, TODAY, "stacks/waivers.yaml")
    assert problem.render().startswith(f"error: stacks/waivers.yaml{where}") and said in problem.message
    with pytest.raises(UserError, match="each waiver is"):
        waivers.load(path, "stacks/waivers.yaml")  # the gate does not guess either


@pytest.mark.parametrize("maker", ["fifo", "zero_link"])
def test_a_waivers_file_that_is_no_file_is_refused_at_once(tmp_path, maker):
    path = hf.SPECIALS[maker](tmp_path / "stacks" / "waivers.yaml")
    problems = hf.within(10, waivers.lint, path, TODAY, "stacks/waivers.yaml")
    assert "not a regular file" in problems[0].message
    with pytest.raises(UserError, match="not a regular file"):
        hf.within(10, waivers.load, path)


def test_the_waivers_file_is_not_a_stack(tmp_path):
    root = make_root(tmp_path)
    write(root, GOOD)
    assert "waivers" not in list_stacks(root)
    with pytest.raises(UserError, match="holds the repository's vulnerability waivers, not a stack"):
        load("waivers", root=root)


def test_stackforge_lint_refuses_an_expired_waiver_naming_file_and_line(tmp_path, capsys):
    root = make_root(tmp_path)
    write(root, GOOD.replace("2027-01-31", "2020-01-31"))
    rc, out, err = run_cli(capsys, root, "lint", "post2")
    assert rc == 1 and "error: stacks/waivers.yaml:7:" in out and "expired on 2020-01-31" in out
    rc, out, _ = run_cli(capsys, root, "lint", "post2", "--json")
    report = json.loads(out)
    assert rc == 1 and not report["ok"] and report["waivers"][0].startswith("error: stacks/waivers.yaml:7:")
    write(root, GOOD.replace("2027-01-31", "2099-01-31"))
    rc, out, _ = run_cli(capsys, root, "lint", "post2")
    assert rc == 0 and "waivers" not in out
