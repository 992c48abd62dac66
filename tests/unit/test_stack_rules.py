"""Release-train rules: for each rule a stack that breaks it, and the finding it must give.

Each broken stack is a child of the real post2 (or post1) written into a throw-away
repository root, so the finding must point at the child's file and line.
"""

from __future__ import annotations

import json

import pytest

from stackforge.builder.context import prepare
from stackforge.builder.locks import locks
from stackforge.builder.plan import contract
from stackforge.stack import rules
from stackforge.stack.load import load
from tests.fixtures.stack_support import REPO, locate, make_root, run_cli

RULE_FUNCTIONS = {
    "train": rules.check_trains,
    "built-for": rules.check_built_for,
    "aligned": rules.check_aligned,
    "vendor-build": rules.check_vendor_build,
    "minimum": rules.check_minimums,
    "index": rules.check_indexes,
    "lock": locks.check_locks,
    "runtime": rules.check_runtime,
    "platform-line": rules.check_line,
    "contract": contract.check,
}


#: the line of post2 that declares its own platform line's label
POST2_AMD64_LOCAL = locate(REPO / "stacks" / "post2.yaml", "amd64: {arch: x86_64", "local")[0]


def child(body: str, parent: str = "post2") -> str:
    return f"name: a\ninherits: {parent}\n{body}"


# (id, stack a.yaml, expected finding: rule, message, fix, line, col)
BROKEN = [
    (
        "train-post",
        child("packages:\n  torchvision:\n    version: 0.26.0.post1+musa5.2.0\n"),
        "train",
        "torchvision 0.26.0.post1+musa5.2.0 is at post1 but train 'torch' is at post2 (torch 2.11.0.post2+musa5.2.0)",
        "move torchvision to its post2 build with the rest of the train",
        5,
        14,
    ),
    (
        "train-local",
        child("packages:\n  torchaudio:\n    version: 2.11.0.post2+musa.3\n"),
        "train",
        "torchaudio 2.11.0.post2+musa.3 has local label '+musa.3' but train 'torch' uses "
        "'+musa5.2.0' (torch 2.11.0.post2+musa5.2.0)",
        "pin the +musa5.2.0 build of torchaudio",
        5,
        14,
    ),
    (
        "platform-line",
        child("packages:\n  flash_mla:\n    version: 0.2.7+musa5.3.0\n"),
        "platform-line",
        "flash_mla 0.2.7+musa5.3.0 is a +musa5.3.0 build, but platform line 'amd64' (linux/amd64) is the +musa5.2.0 "
        f"line (platforms.amd64.local, stacks/post2.yaml:{POST2_AMD64_LOCAL}): the line mixes +musa5.2.0 and "
        "+musa5.3.0",
        "pin the +musa5.2.0 build of flash_mla (or, if the line moved to +musa5.3.0, move every pin of it)",
        5,
        14,
    ),
    (
        "train-local-missing",
        child("packages:\n  torch_musa:\n    version: 2.11.0.post2\n"),
        "train",
        "torch_musa 2.11.0.post2 has no local label but train 'torch' uses '+musa5.2.0' (torch 2.11.0.post2+musa5.2.0)",
        "pin the +musa5.2.0 build of torch_musa",
        5,
        14,
    ),
    (
        "train-release",
        child(
            "packages:\n  torch_musa:\n    version: 2.12.0.post2+musa5.2.0\n"
            "rules:\n  trains:\n    - {name: torch, members: [torch, torch_musa], agree: [release]}\n"
        ),
        "train",
        "torch_musa release 2.12.0 differs from torch release 2.11.0",
        "pin torch_musa 2.11.0",
        5,
        14,
    ),
    (
        "built-for",
        child("packages:\n  deep_ep:\n    version: 1.1.0+musa5.2.0torch2.11.0.post1\n"),
        "built-for",
        "deep_ep 1.1.0+musa5.2.0torch2.11.0.post1 is built for '+musa5.2.0torch2.11.0.post1', but this "
        "stack's torch is 2.11.0.post2+musa5.2.0 (expected local label '+musa5.2.0torch2.11.0.post2')",
        "pin deep_ep==1.1.0+musa5.2.0torch2.11.0.post2, or check the index for a build against torch "
        "2.11.0.post2+musa5.2.0",
        5,
        14,
    ),
    (
        "built-for-no-local",
        child("packages:\n  deep_ep:\n    version: 1.1.0\n"),
        "built-for",
        "deep_ep 1.1.0 names no build (no local label), but this stack's torch is 2.11.0.post2+musa5.2.0 "
        "(expected local label '+musa5.2.0torch2.11.0.post2')",
        "pin deep_ep==1.1.0+musa5.2.0torch2.11.0.post2, or check the index for a build against torch "
        "2.11.0.post2+musa5.2.0",
        5,
        14,
    ),
    (
        "aligned",
        child("packages:\n  flash_mla:\n    version: 0.2.6\n"),
        "aligned",
        "flash_mla 0.2.6 differs from mate 0.2.7; family 'mate' moves as one public version (each member may carry "
        "its own local label)",
        "pin flash_mla 0.2.7",
        5,
        14,
    ),
    (
        "vendor-build",
        child("packages:\n  apache-tvm-ffi:\n    version: 0.1.9.post2\n"),
        "vendor-build",
        "apache-tvm-ffi 0.1.9.post2 is not a '+musa' build",
        "pin the vendor build, e.g. 0.1.9.post2+musa.1",
        5,
        14,
    ),
    (
        "runtime",
        child('platform:\n  musa: 5.1.0\n  musa_runtime: "5.2"\n'),
        "runtime",
        "platform.musa_runtime 5.2 is not the line of platform.musa 5.1.0",
        'set platform.musa_runtime to "5.1"',
        5,
        17,
    ),
    (
        "vendor-build-other-label",
        child("packages:\n  apache-tvm-ffi:\n    version: 0.1.9.post2+cu128\n"),
        "vendor-build",
        "apache-tvm-ffi 0.1.9.post2+cu128 is not a '+musa' build",
        "pin the vendor build, e.g. 0.1.9.post2+musa.1",
        5,
        14,
    ),
    (
        "minimum-conditional",
        child("packages:\n  torchada:\n    version: 0.1.89\n"),
        "minimum",
        "torchada 0.1.89 is below the declared minimum 0.1.90 when torch_musa >= 2.11.0.post2",
        "pin torchada 0.1.90 or newer",
        5,
        14,
    ),
    (
        "minimum-unconditional",
        child("rules:\n  minimums:\n    - {package: triton, min: 3.3.0}\n"),
        "minimum",
        "triton 3.2.0 is below the declared minimum 3.3.0",
        "pin triton 3.3.0 or newer",
        None,
        None,
    ),
    (
        "index-public-deps-from",
        child("indexes:\n  pypi:\n    deps_from: mthreads\n"),
        "index",
        "public index 'pypi' cannot have deps_from",
        "remove deps_from",
        5,
        16,
    ),
    (
        "index-deps-from-vendor",
        child(
            "indexes:\n  mirror:\n    url: https://mirror.example.com/simple\n    role: vendor\n"
            "  mthreads:\n    deps_from: mirror\n"
        ),
        "index",
        "index 'mthreads' takes its dependencies from 'mirror', which is not a public index",
        "name a public index",
        8,
        16,
    ),
]


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_stack_gives_its_finding(tmp_path, capsys, case):
    _, text, rule, message, fix, line, col = case
    root = make_root(tmp_path, {"a.yaml": text})
    rc, out, err = run_cli(capsys, root, "lint", "a", "--json")
    assert (rc, err) == (1, "")
    (report,) = json.loads(out)["stacks"]
    file = "stacks/a.yaml"
    if line is None:  # a rule whose subject the child did not touch: the finding points at the parent's pin
        file, line, col = "stacks/post1.yaml", *locate(root / "stacks" / "post1.yaml", "  triton:", "3.2.0")
    assert report == {
        "stack": "a",
        "findings": [{"rule": rule, "message": message, "fix": fix, "file": file, "line": line, "col": col}],
    }


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_only_the_broken_rule_fires(tmp_path, case):
    """Each rule is its own function: the broken stack trips exactly that one."""
    _, text, rule, message, *_ = case
    stack = load("a", root=make_root(tmp_path, {"a.yaml": text}))
    for name, fn in RULE_FUNCTIONS.items():
        found = fn(stack)
        if name == rule:
            assert [(f.rule, f.message) for f in found] == [(rule, message)]
        else:
            assert found == [], f"{name} fired on a stack that only breaks {rule}"


def test_rule_list_covers_every_rule_function():
    assert set(prepare.RULES) == set(RULE_FUNCTIONS.values())


def test_lint_text_output_names_file_line_rule_and_fix(tmp_path, capsys):
    root = make_root(tmp_path, {"a.yaml": BROKEN[0][1]})
    rc, out, err = run_cli(capsys, root, "lint", "a")
    assert (rc, err) == (1, not_fetched("a"))
    assert out == (
        f"stacks/a.yaml:5:14: train: {BROKEN[0][3]}\n"
        "  fix: move torchvision to its post2 build with the rest of the train\n"
    )


def test_finding_from_a_set_override_names_the_override(tmp_path, capsys):
    rc, out, err = run_cli(
        capsys, make_root(tmp_path), "lint", "post2", "--json", "--set", "packages.flash_mla.version=0.2.6"
    )
    assert (rc, err) == (1, "")
    (finding,) = json.loads(out)["stacks"][0]["findings"]
    assert finding["file"] == "--set packages.flash_mla.version=0.2.6"
    assert (finding["line"], finding["col"]) == (None, None)
    assert finding["rule"] == "aligned"


# --------------------------------------------------------------------------- what must not fire


def test_post1_torchaudio_without_post_is_in_the_train():
    """post1's torchaudio is 2.11.0+musa5.2.0: it carries no postN, so only the local label is compared."""
    stack = load("post1", root=REPO)
    assert stack.model.packages["torchaudio"].version == "2.11.0+musa5.2.0"
    assert rules.check_trains(stack) == []


@pytest.mark.parametrize("torchada", ["0.1.83", "0.1.80"])
def test_conditional_minimum_does_not_apply_below_its_condition(tmp_path, torchada):
    """torchada >= 0.1.90 only when torch_musa >= 2.11.0.post2; post1 is at post1."""
    stack = load("post1", root=make_root(tmp_path), overrides=[f"packages.torchada.version={torchada}"])
    assert rules.check_minimums(stack) == []


def test_conditional_minimum_applies_at_its_condition(tmp_path):
    stack = load("post1", root=make_root(tmp_path), overrides=["packages.torch_musa.version=2.11.0.post2+musa5.2.0"])
    assert [f.message for f in rules.check_minimums(stack)] == [
        "torchada 0.1.83 is below the declared minimum 0.1.90 when torch_musa >= 2.11.0.post2"
    ]


def test_rules_are_data_a_stack_without_a_train_has_no_train_finding(tmp_path):
    text = child("packages:\n  torchvision:\n    version: 0.26.0.post1+musa5.2.0\nrules:\n  trains: []\n")
    stack = load("a", root=make_root(tmp_path, {"a.yaml": text}))
    assert prepare.lint(stack) == []


def test_every_real_stack_passes_every_rule():
    for name in ("post1", "post2"):
        assert prepare.lint(load(name, root=REPO)) == [], name


# --------------------------------------------------------------------------- lint exit codes

#: what lint says of a stack whose plugin (upstreams.vllm_musa.agree) is not in the host's mirror cache
NOT_FETCHED = (
    "not checked: upstream vllm_musa at 078be0e7c285b1171d424f7f9ce1d757f78d4f6f is not fetched "
    "(run stackforge render {stack}, or stackforge lint --upstreams {stack})"
)


#: what lint says of a stack whose public index says why it has no lock (post1's, inherited)
UNLOCKED = "index 'pypi' installs without hashes (no lock): {reason} (indexes.pypi.unlocked)"


#: what lint says of post2's aarch64 line (and a child's), which declares the values no record states
UNKNOWN = (
    "platform arm64 (linux/arm64) is declared, not buildable: no record states packages.torchaudio, "
    "packages.deep_ep, packages.mate, packages.mate-mubin, … ({n} in all) (platforms.arm64.unknown); render and "
    "build refuse it"
)


def notes_of(stack: str) -> list[str]:
    reason = load("post1", root=REPO).model.indexes["pypi"].unlocked
    lines = (
        [] if stack == "post1" else [UNKNOWN.format(n=len(load("post2", root=REPO).model.platforms["arm64"].unknown))]
    )
    return [NOT_FETCHED.format(stack=stack), UNLOCKED.format(reason=reason), *lines]


def not_fetched(*stacks: str) -> str:
    return "".join(f"note: {s}: {note}\n" for s in stacks for note in notes_of(s))


def test_lint_exit_0_when_clean(tmp_path, capsys):
    root = make_root(tmp_path)
    assert run_cli(capsys, root, "lint")[0] == 0
    rc, out, err = run_cli(capsys, root, "lint", "post1", "post2", "--json")
    assert (rc, err) == (0, "")
    assert json.loads(out) == {
        "ok": True,
        "stacks": [{"stack": "post1", "findings": []}, {"stack": "post2", "findings": []}],
        "notes": [f"{n}: {note}" for n in ("post1", "post2") for note in notes_of(n)],
    }


def test_lint_exit_1_on_findings_and_reports_the_clean_stacks_too(tmp_path, capsys):
    root = make_root(tmp_path, {"a.yaml": BROKEN[0][1]})
    rc, out, err = run_cli(capsys, root, "lint")
    assert (rc, err) == (1, not_fetched("a", "post1", "post2"))
    assert "post1: ok" in out.splitlines() and "post2: ok" in out.splitlines()
    assert out.startswith("stacks/a.yaml:5:14: train: ")


def test_lint_exit_2_on_invalid_input_even_with_findings(tmp_path, capsys):
    root = make_root(tmp_path, {"a.yaml": BROKEN[0][1], "b.yaml": "name: b\ninherits: post2\nplatfrom: {}\n"})
    rc, out, err = run_cli(capsys, root, "lint")
    assert rc == 2
    assert err == not_fetched("a") + (
        "error: stacks/b.yaml:3:1: unknown key 'platfrom' in the top level\n  fix: did you mean 'platform'?\n"
    ) + not_fetched("post1", "post2")
    assert "stacks/a.yaml:5:14: train: " in out  # the valid stacks are still checked


def test_lint_exit_2_json_marks_the_invalid_stack(tmp_path, capsys):
    root = make_root(tmp_path, {"b.yaml": "name: b\ninherits: post2\nplatfrom: {}\n"})
    rc, out, _ = run_cli(capsys, root, "lint", "post2", "b", "--json")
    assert rc == 2
    report = json.loads(out)["stacks"]
    assert report[0] == {"stack": "post2", "findings": []}
    assert report[1]["stack"] == "b" and "unknown key 'platfrom'" in report[1]["invalid"]


def test_lint_exit_2_on_a_tag_template_that_renders_an_invalid_tag(tmp_path, capsys):
    root = make_root(tmp_path, {"a.yaml": child("tags:\n  local: 'vllm-musa:{{ packages.torch.version }}'\n")})
    rc, _, err = run_cli(capsys, root, "lint", "a")
    assert rc == 2
    assert err.startswith(
        "error: stacks/a.yaml:4:10: tags.local renders 'vllm-musa:2.11.0.post2+musa5.2.0': "
        "tag '2.11.0.post2+musa5.2.0' contains '+'"
    )


def test_lint_exit_2_on_an_unknown_stack(tmp_path, capsys):
    rc, _, err = run_cli(capsys, make_root(tmp_path), "lint", "post3")
    assert rc == 2
    assert "no stack named 'post3'" in err and "did you mean 'post2'?" in err


# --------------------------------------------------------------------------- the runtime line


def _runtime_findings(*overrides: str) -> list[str]:
    return [f.message for f in rules.check_runtime(load("post2", root=REPO, overrides=list(overrides)))]


def test_the_runtime_line_agrees_with_the_train_and_the_toolkit():
    assert _runtime_findings() == []
    assert _runtime_findings("platform.musa_runtime=5.1") == [
        "platform.musa_runtime 5.1 is not the line of platform.musa 5.2.0",
        "train 'torch' is built for MUSA 5.2 (torch 2.11.0.post2+musa5.2.0), but platform.musa_runtime is 5.1",
    ]
    # a train built for another runtime line, with the platform otherwise consistent
    train = [
        f"packages.{n}.version={v}+musa5.1.0"
        for n, v in (
            ("torch", "2.11.0.post2"),
            ("torch_musa", "2.11.0.post2"),
            ("torchvision", "0.26.0.post2"),
            ("torchaudio", "2.11.0.post2"),
        )
    ]
    assert _runtime_findings(*train) == [
        "train 'torch' is built for MUSA 5.1 (torch 2.11.0.post2+musa5.1.0), but platform.musa_runtime is 5.2"
    ]


def test_apt_packages_of_another_runtime_line_are_findings():
    layer = load("post2", root=REPO).model.system["musa"].model_dump(by_alias=True, exclude_none=True)
    layer["packages"][0] = {"name": "musa-toolkit", "candidates": ["musa-toolkit-5-1"]}
    layer["packages"].append({"name": "libmusa-extra", "line": "5.1"})
    findings = _runtime_findings("system.musa=" + json.dumps(layer))
    assert findings == [
        "apt package musa-toolkit-5-1 is of the MUSA 5.1 line, but platform.musa_runtime is 5.2",
        "apt package libmusa-extra is pinned to the 5.1 line, but platform.musa_runtime is 5.2",
    ]


def test_lint_exits_1_for_a_runtime_line_the_train_was_not_built_for(tmp_path, capsys):
    rc, out, err = run_cli(capsys, REPO, "lint", "post2", "--set", "platform.musa_runtime=5.1")
    assert rc == 1 and "runtime: train 'torch' is built for MUSA 5.2" in out


def test_a_locked_public_index_needs_a_hashed_installer():
    """example installs from stacks/locks/example/pypi.txt with hashes: its installer must be hashed too."""
    unhashed = locks.check_locks(load("example", root=REPO, overrides=["base.pip=26.3"]))
    assert [(f.rule, f.path) for f in unhashed] == [("lock", ("base", "pip"))]
    assert "base.pip names no sha256: the installer phase would fetch pip 26.3 without one" in unhashed[0].message
    hashed = load("example", root=REPO, overrides=["base.pip={version: '26.3', sha256: [" + "a" * 64 + "]}"])
    assert locks.check_locks(hashed) == []
    assert locks.check_locks(load("post2", root=REPO)) == []  # no lock: nothing to match
