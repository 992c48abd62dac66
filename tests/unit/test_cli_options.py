"""The verbs' shared options: scoped --set, --json on every verb that prints a result, --out's help."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from stackforge.cli.main import build_parser, main
from stackforge.cli.options import overrides_for, select, split_scope
from stackforge.errors import UserError

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- scoped --set

SPLIT = [
    ("plain", "packages.idna.version=3.9", (None, "packages.idna.version=3.9")),
    ("scoped", "post2:packages.idna.version=3.9", ("post2", "packages.idna.version=3.9")),
    ("colon-in-value", "base.image=stackforge/base:bookworm", (None, "base.image=stackforge/base:bookworm")),
    ("mapping-value", "packages.m={version: 3.0.2, index: pypi}", (None, "packages.m={version: 3.0.2, index: pypi}")),
    ("scoped-colon-in-value", "post2:base.image=a/b:c", ("post2", "base.image=a/b:c")),
    ("dotted-stack-name", "vllm-0.11.0:tags.local=x", ("vllm-0.11.0", "tags.local=x")),
    ("scope-without-equals", "post2:packages", ("post2", "packages")),
    ("no-colon-no-equals", "packages", (None, "packages")),
]


@pytest.mark.parametrize("case", SPLIT, ids=[c[0] for c in SPLIT])
def test_split_scope(case):
    _, text, expected = case
    assert split_scope(text) == expected


BAD_SCOPE = [
    ("upper-case", "Post2:a=1", "'Post2' is not a stack name"),
    ("empty", ":a=1", "'' is not a stack name"),
    ("space", "post 2:a=1", "'post 2' is not a stack name"),
    ("control", "po\x1bst:a=1", "'the scope' is not a stack name"),
]


@pytest.mark.parametrize("case", BAD_SCOPE, ids=[c[0] for c in BAD_SCOPE])
def test_a_scope_that_is_not_a_stack_name_is_refused(case):
    _, text, message = case
    with pytest.raises(UserError) as err:
        split_scope(text)
    assert err.value.message == message and err.value.exit_code == 2


APPLY = [
    # (selected stacks, --set values, stack asked for, overrides it gets)
    ("unscoped-applies-to-all", ["post1", "post2"], ["a=1"], "post1", ["a=1"]),
    ("scoped-applies-to-its-stack", ["post1", "post2"], ["post2:a=1", "b=2"], "post2", ["a=1", "b=2"]),
    ("scoped-skips-other-stacks", ["post1", "post2"], ["post2:a=1", "b=2"], "post1", ["b=2"]),
    ("order-is-kept", ["post1", "post2"], ["a=1", "post1:a=2", "a=3"], "post1", ["a=1", "a=2", "a=3"]),
    ("path-to-yaml-is-its-stem", ["stacks/post2.yaml"], ["post2:a=1"], "stacks/post2.yaml", ["a=1"]),
]


@pytest.mark.parametrize("case", APPLY, ids=[c[0] for c in APPLY])
def test_overrides_per_stack(case):
    _, selected, sets, name, expected = case
    args = argparse.Namespace(overrides=sets)
    select(args, selected)
    assert overrides_for(args, name) == expected


def test_a_single_stack_verb_takes_only_its_own_scope():
    args = argparse.Namespace(overrides=["example:a=1"])
    assert overrides_for(args, "example") == ["a=1"]
    with pytest.raises(UserError) as err:
        overrides_for(argparse.Namespace(overrides=["post2:a=1"]), "example")
    assert "'post2'" in err.value.message and "(example)" in err.value.fix


CLI_SCOPE_ERRORS = [
    (
        "lint-unselected",
        ["lint", "post1", "post2", "--set", "example:a=1"],
        "error: --set example:a=1: the scope 'example' names a stack this command does not work on",
        "one of the selected stacks (post1, post2)",
    ),
    (
        "bake-unselected",
        ["bake", "post1", "--print", "--set", "post2:a=1"],
        "error: --set post2:a=1: the scope 'post2'",
        "(post1)",
    ),
    (
        "single-stack-other-scope",
        ["tags", "example", "--set", "post2:tags.local=x"],
        "error: --set post2:tags.local=x: the scope 'post2'",
        "(example)",
    ),
    (
        "diff-unselected",
        ["diff", "post1", "post2", "--set", "example:a=1"],
        "error: --set example:a=1: the scope 'example'",
        "(post1, post2)",
    ),
    (
        "nightly-scope-of-no-stack",
        ["nightly", "--registry", "localhost:5000/ns", "--set", "post9:a=1"],
        "error: --set post9:a=1: the scope 'post9' names a stack this command does not work on",
        "(post2)",
    ),
    (
        "nightly-unselected",
        ["nightly", "post1", "--registry", "localhost:5000/ns", "--set", "post2:a=1"],
        "error: --set post2:a=1: the scope 'post2'",
        "(post1)",
    ),
    (
        "not-a-stack-name",
        ["show", "example", "--set", "Example:a=1"],
        "error: --set Example:…: 'Example' is not a stack name",
        "STACK:key.path=value",
    ),
]


@pytest.mark.parametrize("case", CLI_SCOPE_ERRORS, ids=[c[0] for c in CLI_SCOPE_ERRORS])
def test_scope_errors_exit_2_and_name_the_selected_stacks(case, capsys):
    _, argv, head, fix = case
    assert main(["--root", str(REPO), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(head), err
    assert fix in err


def test_scoped_set_reaches_only_its_stack(capsys):
    assert (
        main(["--root", str(REPO), "lint", "post1", "post2", "--json", "--set", "post2:packages.nonexistent.version=1"])
        == 2
    )
    result = json.loads(capsys.readouterr().out)
    report = result["stacks"]
    assert result["ok"] is False
    assert [r["stack"] for r in report] == ["post1", "post2"]
    assert "invalid" not in report[0] and "packages.nonexistent" in report[1]["invalid"]


def test_scoped_set_in_a_single_stack_verb(capsys):
    assert main(["--root", str(REPO), "tags", "example", "--json", "--set", "example:tags.local=a/b:c"]) == 0
    assert json.loads(capsys.readouterr().out)["local"] == "a/b:c"


# --------------------------------------------------------------------------- --json everywhere


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(verb path, parser) for every verb that runs something."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _leaves(child, (*prefix, name))


LEAVES = dict(_leaves(build_parser()))


@pytest.mark.parametrize("verb", sorted(LEAVES), ids=[" ".join(v) for v in sorted(LEAVES)])
def test_every_verb_accepts_json(verb):
    options = {s for a in LEAVES[verb]._actions for s in a.option_strings}
    assert "--json" in options, f"stackforge {' '.join(verb)} has no --json"


def test_the_verbs_walked_are_the_known_ones():
    verbs = {" ".join(v) for v in LEAVES}
    assert {
        "list",
        "tags",
        "build",
        "gate",
        "abi",
        "verify",
        "lock",
        "bump",
        "diff",
        "render",
        "bake",
        "nightly",
        "publish",
        "patches hash",
        "wheel inspect",
    } <= verbs


CHEAP = [
    ("list", ["list"], lambda v: [s["name"] for s in v["stacks"]][:1] == ["example"]),
    ("show", ["show", "example"], lambda v: v["stack"]["name"] == "example"),
    ("lint", ["lint", "example"], lambda v: v["ok"] is True and v["stacks"][0]["stack"] == "example"),
    (
        "tags",
        ["tags", "example", "--registry", "registry.example.com/ns", "--date", "20250101"],
        lambda v: v["publish"].endswith("-20250101-r1") and v["local"].startswith("stackforge-example:"),
    ),
    ("diff", ["diff", "post1", "post2"], lambda v: v["old"] == "post1" and v["new"] == "post2"),
    ("schema", ["schema"], lambda v: "properties" in v),
    ("render", ["render", "example", "--no-sources", "--out", "{tmp}/build"], lambda v: "fingerprint" in v),
    ("bake-print", ["bake", "example", "--print"], lambda v: "target" in v),
    ("patches-hash", ["patches", "hash", "patches/markupsafe"], lambda v: len(v["hash"]) == 64),
    ("patches-index-check", ["patches", "index", "--check"], lambda v: v == {"stale": []}),
    ("patches-lint", ["patches", "lint"], lambda v: v["count"] == len(v["findings"]) == 0),
]


@pytest.mark.parametrize("case", CHEAP, ids=[c[0] for c in CHEAP])
def test_json_is_valid_json_on_stdout(case, capsys, tmp_path):
    _, argv, check = case
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = main(["--root", str(REPO), *argv, "--json"])
    out, _ = capsys.readouterr()
    value = json.loads(out)
    assert code in (0, 1)
    assert check(value), value


def test_diff_format_json_is_an_alias_of_json(capsys):
    main(["--root", str(REPO), "diff", "post1", "post2", "--format", "json"])
    by_format = capsys.readouterr().out
    main(["--root", str(REPO), "diff", "post1", "post2", "--json"])
    assert capsys.readouterr().out == by_format
    json.loads(by_format)


# --------------------------------------------------------------------------- --out says what it names

OUT_HELP = [
    ("render", "the stack's build directory"),
    ("build", "the stack's build directory"),
    ("publish", "the stack's build directory"),
    ("bake", "bake.json and bake.log"),
    ("nightly", "summary.md and summary.json"),
]


@pytest.mark.parametrize("case", OUT_HELP, ids=[c[0] for c in OUT_HELP])
def test_out_help_names_what_it_is(case):
    verb, words = case
    out = next(a for a in LEAVES[(verb,)]._actions if "--out" in a.option_strings)
    assert words in out.help and "default: build/" in out.help
