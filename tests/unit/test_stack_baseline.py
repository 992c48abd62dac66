"""The baseline the rule and malformed-stack tests start from: the copied real stacks lint clean,
and the error parser the tests use reads locations as the CLI prints them."""

from __future__ import annotations

from tests.fixtures.stack_support import make_root, parse_errors, run_cli


def test_copied_stacks_lint_clean(tmp_path, capsys):
    rc, out, err = run_cli(capsys, make_root(tmp_path), "lint")
    assert rc == 0
    assert out.splitlines() == ["post1: ok", "post2: ok"]
    # the plugin they agree with is not in this root's mirror cache: a note each, not a failure; and each says
    # why its public index has no lock
    notes = [line.split(": ")[:2] for line in err.splitlines()]
    assert notes == [["note", s] for s in ("post1", "post1", "post2", "post2")], err
    assert [line.split(": ")[2].split(" ")[0] for line in err.splitlines()] == ["not", "index", "not", "index"]


def test_parse_errors_reads_locations():
    text = (
        "error: stacks/a.yaml:4:11: platform.python: 3.10 was read as a number\n  fix: quote it\n"
        "error: --set foo: an override must look like key.path=value\n  fix: e.g. x=y\n"
        "error: no stack named 'x'\n"
    )
    assert parse_errors(text) == [
        {
            "file": "stacks/a.yaml",
            "line": 4,
            "col": 11,
            "message": "platform.python: 3.10 was read as a number",
            "fix": "quote it",
        },
        {
            "file": "--set foo",
            "line": None,
            "col": None,
            "message": "an override must look like key.path=value",
            "fix": "e.g. x=y",
        },
        {"file": None, "line": None, "col": None, "message": "no stack named 'x'", "fix": None},
    ]
