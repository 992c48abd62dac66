"""The upstream facts the stand-ins are generated from, and the stacks against them."""

from __future__ import annotations

import json
import re

from stackforge import localver
from stackforge.stack.load import load
from tests.fixtures import facts
from tests.fixtures import musa_standins as ms
from tests.fixtures.stack_support import REPO, run_cli

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def test_every_fact_names_its_source_commit_or_why_it_is_missing():
    for upstream in ("vllm-musa", "vllm"):
        data = facts.upstream(upstream)
        assert "/" in data["repository"] and COMMIT.match(data["pin"])
        for path, entry in data["files"].items():
            assert isinstance(entry["pinned"], bool), (upstream, path)
            if entry.get("missing"):
                assert "commit" not in entry and not entry["pinned"]
                continue
            assert COMMIT.match(entry["commit"]), (upstream, path)
            assert entry["pinned"] == (entry["commit"] == data["pin"]), (upstream, path)
            for known in (entry.get("at_pin") or entry).get("known") or []:  # a line known at the pin: its source
                assert known["text"] and "test_inplace_porting_contract.py:" in known["source"], (upstream, path)
            if "other" in entry:
                assert COMMIT.match(entry["other"]["commit"]) and entry["other"]["commit"] != data["pin"]


def test_the_plugins_common_txt_at_the_pin_holds_what_its_contract_test_asserts_and_nothing_softened():
    common = facts.known_file("vllm-musa", "requirements/common.txt")
    assert common.commit == facts.upstream("vllm-musa")["pin"]
    assert [k["text"] for k in common.known] == [
        "torchada==0.1.90",
        "transformers==5.5.3",
        "huggingface_hub>=1.27.0,<2.0",
    ]
    text = common.stand_in().splitlines()
    for known in common.known:  # each line on its own line, its source on the line before
        i = text.index(known["text"])
        assert text[i - 1] == f"# at the pin: {known['source']}"
    # the other revision's lines the pin contradicts are left out, and say why
    assert "torchada==0.1.81" not in text and "click==8.2.0" not in text
    assert "click>=8.4.2" in common.not_at_pin["click==8.2.0"]
    assert text.index("numpy==1.26") > text.index("huggingface_hub>=1.27.0,<2.0")
    assert text[text.index("numpy==1.26") - 1] == "# at 1df06c8aa819 (another revision), line 4"
    assert "unknown: every line's number" in text[0]


def test_vllms_common_txt_at_the_pin_drops_the_transformers_line_the_plugin_contradicts():
    vllm = facts.known_file("vllm", "requirements/common.txt")
    text = vllm.stand_in(ms.VLLM_COMMON_PROJECTS).splitlines()
    assert "huggingface_hub >= 1.27.0" in text
    assert not [line for line in text if line.startswith("transformers")]
    assert "transformers==5.5.3" in vllm.not_at_pin["10"]


def test_the_contract_facts_cite_lines_of_the_module_read_at_the_pin():
    data = facts.contract()
    module = facts.upstream("vllm-musa")["tests"][data["module"]]
    assert data["commit"] == module["commit"] == facts.upstream("vllm-musa")["pin"] and module["pinned"]
    lines = [e["line"] for e in data["lines"]]
    assert lines == sorted(set(lines)) and lines[0] > 0 and lines[-1] <= 459  # 459 lines, 18712 characters
    kinds = {k for e in data["lines"] for k in e.get("holds", {}) if k not in ("target", "kernel")}
    assert kinds <= {
        "labels",
        "no_labels",
        "env",
        "no_env",
        "workdir",
        "cmd",
        "entrypoint",
        "installs",
        "only_binary",
        "checks_version",
        "installs_file",
        "constrained",
        "gate_pins",
        "gate_exact",
        "gate_order",
        "gate_imports",
        "options",
        "stages",
    }
    for entry in data["lines"]:  # one claim per line, on a file the module reads
        assert entry["reads"] in module["reads"], entry
        assert len(set(entry.get("holds", {})) - {"target"}) <= 1, entry
    # the stack key post2 pins: the plugin's musa_private.txt holds its torch line and every private pin of it
    stack = data["stacks"]["torch==2.11.0.post2+musa5.2.0"]
    pins = {f"{n}=={v}" for n, (_, v) in facts.plugin_vendor_pins().items()}
    assert "torch==2.11.0.post2+musa5.2.0" in pins and set(stack["private"]) <= pins
    assert stack["torchada"] == facts.known_file("vllm-musa", "requirements/common.txt").known[0]["text"]


def test_the_plugin_facts_are_read_at_the_commit_the_stacks_pin():
    stack = load("post2", root=REPO).model
    assert facts.upstream("vllm-musa")["pin"] == stack.upstreams["vllm_musa"].commit
    assert facts.upstream("vllm")["pin"] == stack.upstreams["vllm"].commit
    assert facts.fact_file("vllm-musa", "requirements/musa_private.txt").pinned


def test_post2_pins_every_line_of_the_plugins_musa_private_txt_exactly(capsys):
    rc, out, _ = run_cli(capsys, REPO, "show", "post2", "--json")
    assert rc == 0
    shown = {facts.canon(n): p["version"] for n, p in json.loads(out)["stack"]["packages"].items()}
    plugin = facts.plugin_vendor_pins()
    assert len(plugin) == 16
    for name, (line, version) in plugin.items():
        assert shown[facts.canon(name)] == version, f"musa_private.txt:{line}: {name}=={version}"


def test_the_vendor_stand_in_serves_the_facts_whatever_the_stack_pins():
    """The index is generated from the facts: a stack that pins another build finds it missing."""
    moved = load("post2", root=REPO, overrides=["packages.flash_attn_3.version=0.2.7", "packages.triton.version=3.9.9"])
    served = {(facts.canon(s.name), s.version) for s in ms.stack_specs(moved.model)["mthreads"]}
    assert ("flash-attn-3", "0.2.7+musa") in served and ("flash-attn-3", "0.2.7") not in served
    assert ("triton", "3.2.0") in served and ("triton", "3.9.9") not in served
    # beside the plugin's builds, what a real index keeps: the seeds' post1 train and another runtime line
    assert ("torch", "2.11.0.post1+musa5.2.0") in served and ("torch", "2.11.0.post2+musa5.1.0") in served
    public = {(facts.canon(s.name), s.version) for s in ms.stack_specs(moved.model)["pypi"]}
    assert ("flash-attn-3", "0.2.7") in public  # the unlabelled public release beside the vendor's +musa build


def test_the_plugin_stand_in_keeps_each_requirement_on_its_upstream_line():
    text = ms.MUSA_REQUIREMENTS["requirements/musa_private.txt"].splitlines()
    for name, (line, version) in facts.plugin_vendor_pins().items():
        assert text[line - 1] == f"{name}=={version}"
    assert text[0].startswith("# requirements/musa_private.txt of vllm-musa at 078be0e7")


def test_an_unlabelled_pin_of_a_labelled_vendor_build_matches_it_but_is_not_that_build():
    """What the old post2 pins meant: pip's ==0.2.7 takes 0.2.7+musa; only the labelled pin names the build."""
    (_, plugin), (_, old) = facts.plugin_vendor_pins()["flash_attn_3"], (0, "0.2.7")
    assert localver.matches(old, plugin) and not localver.same_build(old, plugin)
