"""Registry build cache options (builder/run/regcache.py): what reaches buildx and the bake plan, and what is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.builder.run import bake as bakemod
from stackforge.builder.run.regcache import RegistryCache, export_refused
from stackforge.builder.run.run import BuildOptions, _extra_args
from stackforge.errors import UserError
from tests.fixtures.stack_support import RootSpec, parse_errors, run_cli

REF = "127.0.0.1:5000/stackforge-example:py3.11-latest"


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(parts=("stacks", "patches"))


def test_no_option_means_no_cache():
    assert RegistryCache.parse() is None
    assert RegistryCache.parse([], None, None) is None


def test_registry_cache_imports_from_the_reference_and_exports_inline():
    cache = RegistryCache.parse(registry_cache=REF)
    assert cache is not None
    assert cache.buildx_args() == ["--cache-from", f"type=registry,ref={REF}", "--cache-to", "type=inline"]
    assert cache.bake_fields() == {"cache-from": [f"type=registry,ref={REF}"], "cache-to": ["type=inline"]}


def test_a_registry_export_is_every_stage_and_imports_keep_their_order_without_repeats():
    other = "registry.example/cache/post2:buildcache"
    cache = RegistryCache.parse([REF, other, REF], other)
    assert cache is not None
    assert cache.buildx_args() == [
        "--cache-from",
        f"type=registry,ref={REF}",
        "--cache-from",
        f"type=registry,ref={other}",
        "--cache-to",
        f"type=registry,ref={other},mode=max",
    ]


@pytest.mark.parametrize(
    "value",
    [
        "reg.example/a:b,type=local,dest=/etc",  # a second buildx key smuggled in after a comma
        "type=registry,ref=reg.example/a:b",  # a buildx spec is not a reference
        "reg.example/a:b mode=max",
        "--push",
        "reg.example/A:b",  # upper case path
        "reg.example/a:b\n--cache-to=type=local,dest=/tmp/x",
        "",
    ],
)
def test_a_value_that_is_not_a_reference_is_refused_before_any_command_line(value):
    for kwargs in ({"cache_from": [value]}, {"cache_to": value}, {"registry_cache": value}):
        with pytest.raises(UserError) as err:
            RegistryCache.parse(**kwargs)
        assert "is not an image reference" in err.value.message
        assert "\n" not in err.value.message


def test_inline_is_an_export_only_and_a_digest_is_no_export_target():
    with pytest.raises(UserError, match="an import names where the cache is"):
        RegistryCache.parse(["inline"])
    with pytest.raises(UserError, match="pushed to a tag, not to a digest"):
        RegistryCache.parse(cache_to="reg.example/a@sha256:" + "0" * 64)
    with pytest.raises(UserError, match="--cache-to sets it too"):
        RegistryCache.parse(cache_to="inline", registry_cache=REF)


def test_each_bake_target_exports_to_its_own_tag_and_imports_it_first():
    cache = RegistryCache.parse([REF], "reg.example/cache/night:buildcache")
    assert cache is not None
    own = cache.for_target("post2-vllm-openai")
    assert own.export == "reg.example/cache/night:buildcache-post2-vllm-openai"
    assert own.imports == (own.export, REF)
    untagged = RegistryCache.parse(cache_to="reg.example/cache/night")
    assert untagged is not None and untagged.for_target("a-b").export == "reg.example/cache/night:a-b"
    inline = RegistryCache.parse(registry_cache=REF)
    assert inline is not None and inline.for_target("a-b") is inline


def test_the_build_passes_the_cache_after_its_network():
    class Ctx:
        mirror = None

    opts = BuildOptions(network="host", cache=RegistryCache.parse(registry_cache=REF))
    assert _extra_args(opts, Ctx()) == ["--network=host", "--cache-from", f"type=registry,ref={REF}"] + [
        "--cache-to",
        "type=inline",
    ]
    assert _extra_args(BuildOptions(), Ctx()) == []


def test_a_refused_export_is_recognised_in_the_log():
    log = '#0 building with "default" instance using docker driver\nERROR: Cache export is not supported for the docker driver.\n'
    assert export_refused(log)
    assert not export_refused("ERROR: failed to solve: process did not complete successfully")


def test_the_bake_plan_carries_the_cache_per_target(tmp_path: Path):
    item = bakemod.BakeTarget("ex-escape", "ex", "escape", "ex:1", tmp_path, tmp_path / "Dockerfile")
    cache = RegistryCache.parse([REF], "reg.example/cache/night:bc")
    target = bakemod.plan([item], cache=cache)["target"]["ex-escape"]
    assert target["cache-to"] == ["type=registry,ref=reg.example/cache/night:bc-ex-escape,mode=max"]
    assert target["cache-from"] == [
        "type=registry,ref=reg.example/cache/night:bc-ex-escape",
        f"type=registry,ref={REF}",
    ]
    assert "cache-from" not in bakemod.plan([item])["target"]["ex-escape"]


def test_bake_print_shows_the_cache_fields(root):
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), "bake", "example", "--print"]
        + ["--ca-bundle", "none", "--registry-cache", REF],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    target = json.loads(proc.stdout)["target"]["example-escape"]
    assert target["cache-from"] == [f"type=registry,ref={REF}"] and target["cache-to"] == ["type=inline"]


@pytest.mark.parametrize("verb", [["build", "example"], ["bake", "example"], ["nightly", "--registry", "r.example"]])
def test_each_verb_refuses_a_bad_reference_naming_the_option(capsys, root, verb):
    code, _out, err = run_cli(capsys, root, *verb, "--cache-from", "r.example/a:b,type=local,dest=/x")
    assert code != 0
    (error,) = parse_errors(err)
    assert error["file"] == "--cache-from" and "is not an image reference" in error["message"], err


def test_each_nightly_build_exports_to_its_bake_targets_tag(tmp_path: Path):
    from stackforge.flows.nightly import NightlyRun, _cache_of

    def run(cache):
        return NightlyRun("r.example", "20260101", None, None, None, tmp_path, print, None, None, None, cache=cache)

    cache = RegistryCache.parse(cache_to="reg.example/cache/night:bc")
    assert (
        _cache_of(run(cache), "post2", "vllm-openai")["cache"].export == "reg.example/cache/night:bc-post2-vllm-openai"
    )
    assert _cache_of(run(None), "post2", "vllm-openai") == {}
