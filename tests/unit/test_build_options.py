"""Build options (declared choices that select steps) and tuning (build environment outside the fingerprint)."""

from __future__ import annotations

import pytest

from stackforge.builder.plan.plan import image_labels, make_plan
from stackforge.errors import UserError
from stackforge.stack.load import fingerprint, load
from stackforge.stack.tags import local_ref
from tests.fixtures.stack_support import RootSpec, make_root, parse_errors, run_cli

RS = """\
name: rs
inherits: post2
options:
  BUILD_VLLM_RS:
    choices: ["1", "0"]
    value: "1"
    description: build the Rust frontend
kernels:
  vllm_rs:
    upstream: vllm
    when: {BUILD_VLLM_RS: "1"}
    run: bash build_rust.sh
"""


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(stack_files={"rs.yaml": RS})


def kernels(stack) -> list[str]:
    return [k.name for k in make_plan(stack).kernels]


def test_an_option_selects_its_steps(root):
    on = load("rs", root)
    off = load("rs", root, ["options.BUILD_VLLM_RS.value=0"])
    assert kernels(on) == ["vllm", "vllm_musa", "flashinfer_mamba", "vllm_rs"]
    assert kernels(off) == ["vllm", "vllm_musa", "flashinfer_mamba"]
    # What is built differs, so the fingerprint and the labels do.
    assert fingerprint(on.model) != fingerprint(off.model)
    assert image_labels(on)["org.stackforge.option.BUILD_VLLM_RS"] == "1"
    assert image_labels(off)["org.stackforge.option.BUILD_VLLM_RS"] == "0"


def test_tuning_stays_out_of_fingerprint_tags_and_labels_but_reaches_the_steps(root):
    default = load("rs", root)
    tuned = load("rs", root, ["tuning.MAX_JOBS=16"])
    assert fingerprint(default.model) == fingerprint(tuned.model)
    assert str(local_ref(default)) == str(local_ref(tuned))
    assert image_labels(default) == image_labels(tuned)
    steps = {k.name: k.env for k in make_plan(tuned).kernels}
    assert all(env["MAX_JOBS"] == "16" for env in steps.values())
    assert {k.name: k.env for k in make_plan(default).kernels}["vllm_musa"]["MAX_JOBS"] == "2"


def test_a_stack_without_options_keeps_its_fingerprint_when_the_schema_grows(root):
    """Empty, empty-by-default keys are left out of the fingerprint: a new feature does not move it."""
    stack = load("post2", root)
    explicit = load("post2", root, ["gate.probes=[]"])
    assert fingerprint(stack.model) != fingerprint(explicit.model)  # probes were declared: emptying them is a change
    empty = ["kernels.vllm.files={}", "kernels.vllm.trees={}", "kernels.vllm.when={}", "kernels.vllm.toolchain=null"]
    assert fingerprint(stack.model) == fingerprint(load("post2", root, empty).model)


def test_templates_can_read_option_values(tmp_path):
    root = make_root(tmp_path, {"rs.yaml": RS + 'labels:\n  org.example.rs: "rs={{ options.BUILD_VLLM_RS }}"\n'})
    assert image_labels(load("rs", root, ["options.BUILD_VLLM_RS.value=0"]))["org.example.rs"] == "rs=0"


@pytest.mark.parametrize(
    "override,message",
    [
        ("options.BUILD_VLLM_RS.value=2", "'2' is not one of the choices ['1', '0']"),
        ("kernels.vllm_rs.when={BUILD_VLLM_RS: '2'}", "kernels.vllm_rs.when.BUILD_VLLM_RS: '2' is not one of"),
        ("kernels.vllm_rs.when={BUILD_VLLM_SR: '1'}", "unknown build option 'BUILD_VLLM_SR'"),
        ("kernels.vllm_musa.env.MAX_JOBS=4", "kernels.vllm_musa.env.MAX_JOBS: MAX_JOBS is also declared under tuning"),
        ("options.BUILD_VLLM_RS.choices=[]", "at least 1 item"),
    ],
)
def test_bad_options_are_refused_naming_the_key(root, capsys, override, message):
    rc, out, err = run_cli(capsys, root, "show", "rs", "--set", override)
    assert rc == 2 and out == ""
    assert message in err, err
    assert "Traceback" not in err


def test_an_unknown_option_in_the_file_names_its_line(tmp_path, capsys):
    root = make_root(tmp_path, {"rs.yaml": RS.replace('when: {BUILD_VLLM_RS: "1"}', 'when: {BUILD_RS: "1"}')})
    rc, _, err = run_cli(capsys, root, "show", "rs")
    assert rc == 2
    (first,) = [e for e in parse_errors(err) if "BUILD_RS" in e["message"]]
    assert first["file"].endswith("rs.yaml") and first["line"] == 11, first
    assert "did you mean 'BUILD_VLLM_RS'" in err


def test_option_values_are_strings(tmp_path):
    root = make_root(tmp_path, {"rs.yaml": RS.replace('value: "1"', "value: yes")})
    with pytest.raises(UserError, match="option values are strings"):
        load("rs", root)
