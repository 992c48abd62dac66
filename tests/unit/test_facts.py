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
