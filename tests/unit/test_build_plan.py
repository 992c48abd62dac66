"""The build plan, the Dockerfile filters and the context, as plain data: no engine, no network."""

from __future__ import annotations

import json
import os

import pytest

from stackforge.builder.context import context
from stackforge.builder.context.context import assemble
from stackforge.builder.plan import render
from stackforge.builder.plan.plan import gate_spec, image_labels, make_plan, pip_phases
from stackforge.builder.plan.render import dockerword, execform, render_dockerfile, requirements_text, shellword
from stackforge.builder.sources.sources import SourceInfo
from stackforge.errors import UserError
from stackforge.stack.load import fingerprint, load
from tests.fixtures.stack_support import REPO, make_root

SHA = "a" * 64
# Two vendor indexes (one private, one drawing its dependencies from the public index), two public
# indexes (one all-hashed, one not) and an index with no package, declared out of phase order.
MIXED = f"""\
name: mixed
description: every kind of index
platform: {{os: debian12, python: "3.11", arch: x86_64}}
base: {{image: "stackforge/base:bookworm", python: python3}}
indexes:
  pub:     {{url: "https://pypi.example/simple", role: public}}
  vend:    {{url: "https://vendor.example/simple", role: vendor, deps_from: pub, private: true}}
  hashed:  {{url: "https://hashed.example/simple", role: public}}
  vend2:   {{url: "https://vendor2.example/simple", role: vendor}}
  unused:  {{url: "https://unused.example/simple", role: public}}
packages:
  torch:    {{version: "2.5.0", index: vend, gate: spec}}
  idna:     {{version: "3.10", index: pub, import: idna}}
  musa-kit: {{version: "1.0", index: vend2, gate: metadata}}
  six:      {{version: "1.16.0", index: hashed, sha256: ["{SHA}"]}}
  extra:    {{version: "2.0", index: vend}}
gate:
  imports: [{{module: torch, dist: torch}}]
  probes: [{{name: p1, code: "print(1)", expect: "1"}}]
  library_path: [/usr/local/musa/lib]
tags:
  local: "stackforge-test/mixed:{{{{ packages.torch.version }}}}"
targets:
  run: {{entrypoint: [python3]}}
"""


@pytest.fixture
def mixed(tmp_path):
    return load("mixed", root=make_root(tmp_path, {"mixed.yaml": MIXED}))


def test_pip_phases_run_vendor_no_deps_then_public_then_vendor_deps(mixed):
    phases = pip_phases(mixed.model)
    assert [p.name for p in phases] == ["vend-nodeps", "vend2-nodeps", "pub", "hashed", "vend-deps"]
    assert [p.no_deps for p in phases] == [True, True, False, False, False]
    assert [p.index for p in phases] == ["vend", "vend2", "pub", "hashed", "pub"]
    assert [p.requirements for p in phases] == [
        "deps/vend.txt",
        "deps/vend2.txt",
        "deps/pub.txt",
        "deps/hashed.txt",
        "deps/vend.deps.txt",
    ]
    # The dependency phase reinstalls the vendor pins from the public index, without hashes.
    deps = phases[-1]
    assert deps.pins == ["torch==2.5.0", "extra==2.0"] and deps.index_url == "https://pypi.example/simple"
    assert not deps.require_hashes


def test_hashes_are_required_only_where_every_pin_has_one_or_a_lock_exists(mixed):
    flags = {p.name: p.require_hashes for p in pip_phases(mixed.model)}
    assert flags == {"vend-nodeps": False, "vend2-nodeps": False, "pub": False, "hashed": True, "vend-deps": False}
    flags = {p.name: p.require_hashes for p in pip_phases(mixed.model, frozenset({"pub", "vend"}))}
    assert flags == {"vend-nodeps": True, "vend2-nodeps": False, "pub": True, "hashed": True, "vend-deps": False}


def test_make_plan_attaches_locks_and_credentials_to_the_right_phases(mixed):
    plan = make_plan(mixed, {"pub": "stacks/locks/mixed/pub.txt", "vend": "stacks/locks/mixed/vend.txt"})
    by = {p.name: p for p in plan.phases}
    assert by["pub"].lock == "stacks/locks/mixed/pub.txt" and by["vend-nodeps"].lock == "stacks/locks/mixed/vend.txt"
    assert by["vend-deps"].lock is None and by["hashed"].lock is None
    # Only the private index's own phase mounts the netrc; its dependency phase reads the public index.
    assert {n for n, p in by.items() if p.credentials} == {"vend-nodeps"}
    assert plan.stack == "mixed" and plan.fingerprint == fingerprint(mixed.model)
    assert plan.local_ref == "stackforge-test/mixed:2.5.0" and plan.upstreams == [] and plan.kernels == []
    assert json.loads(plan.to_json())["phases"][0]["name"] == "vend-nodeps"


def test_gate_spec_lists_every_pin_with_its_mode_and_the_vendor_packages_for_abi(mixed):
    spec = gate_spec(mixed.model)
    assert spec["stack"] == "mixed"
    assert [(p["name"], p["import"], p["mode"], p["version"]) for p in spec["packages"]] == [
        ("torch", "torch", "spec", "2.5.0"),
        ("idna", "idna", "exact", "3.10"),
        ("musa-kit", "musa_kit", "metadata", "1.0"),
        ("six", "six", "exact", "1.16.0"),
        ("extra", "extra", "exact", "2.0"),
    ]
    assert spec["imports"] == [{"module": "torch", "dist": "torch"}]
    assert [p["name"] for p in spec["probes"]] == ["p1"] and spec["read_only"] is True
    assert spec["abi"] == {"packages": ["torch", "musa-kit", "extra"], "library_path": ["/usr/local/musa/lib"]}


def test_gate_spec_without_abi_checks_no_package(tmp_path):
    stack = load("mixed", root=make_root(tmp_path, {"mixed.yaml": MIXED}), overrides=["gate.abi=false"])
    assert gate_spec(stack.model)["abi"]["packages"] == []


def test_labels_name_the_base_the_pins_the_sources_and_only_what_is_known(mixed):
    labels = image_labels(mixed)
    assert labels["org.opencontainers.image.title"] == "mixed"
    assert labels["org.opencontainers.image.base.name"] == "stackforge/base:bookworm"
    assert labels["org.stackforge.fingerprint"] == fingerprint(mixed.model)
    assert labels["org.stackforge.pin.musa-kit"] == "1.0"
    for absent in (
        "org.opencontainers.image.created",
        "org.opencontainers.image.base.digest",
        "org.stackforge.base.id",
        "org.stackforge.inputs",
        "org.opencontainers.image.source",
    ):
        assert absent not in labels
    full = image_labels(
        mixed,
        base_digest="sha256:" + "d" * 64,
        base_id="sha256:" + "e" * 64,
        created="2024-01-01T00:00:00Z",
        series={"x": "sha256:" + "f" * 64},
        inputs="sha256:" + "0" * 64,
    )
    assert full["org.opencontainers.image.base.digest"] == "sha256:" + "d" * 64
    assert full["org.stackforge.base.id"] == "sha256:" + "e" * 64
    assert full["org.opencontainers.image.created"] == "2024-01-01T00:00:00Z"
    assert full["org.stackforge.series.x"] == "sha256:" + "f" * 64
    assert full["org.stackforge.inputs"] == "sha256:" + "0" * 64


def test_labels_of_git_and_sdist_upstreams():
    # the source upstream's git URL, unless the stack's labels say otherwise (post1: the fork's web address)
    git = image_labels(load("post1", root=REPO, overrides=["labels={}"]))
    assert git["org.opencontainers.image.source"] == "https://github.com/MooreThreads/vllm-musa.git"
    post1 = image_labels(load("post1", root=REPO))
    assert post1["org.opencontainers.image.source"] == "https://github.com/MooreThreads/vllm-musa"
    assert post1["org.opencontainers.image.version"] == "v0.1.24"
    assert post1["org.stackforge.upstream.vllm"] == "v0.28.0@2cf0a6915ce544dc493a0990f2ea38d81601128a"
    example = image_labels(load("example", root=REPO))
    assert example["org.opencontainers.image.source"] == "https://pypi.org/simple/markupsafe/"
    assert example["org.opencontainers.image.version"] == "3.0.3"
    assert "org.opencontainers.image.revision" not in example
    assert example["org.stackforge.upstream.markupsafe"] == (
        "markupsafe==3.0.3@sha256:722695808f4b6457b320fdc131280796bdceb04ab50fe1795cd540799ebe1698"
    )


# --------------------------------------------------------------------------- render filters


@pytest.mark.parametrize(
    "value,word",
    [
        ("plain", '"plain"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a\\b", '"a\\\\b"'),
        ("$HOME ${X}", '"\\$HOME \\${X}"'),
        ("ünïcødé → ok", '"ünïcødé → ok"'),
        ("", '""'),
        (3, '"3"'),
    ],
)
def test_dockerword_quotes_so_the_parser_reads_the_value_back(value, word):
    assert dockerword(value) == word


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "x\u2028y", "nul\x00"])
def test_dockerword_and_shellword_refuse_line_breaks_and_controls(bad):
    with pytest.raises(ValueError):
        dockerword(bad)
    with pytest.raises(ValueError):
        shellword(bad)


@pytest.mark.parametrize(
    "value,word",
    [
        ("plain-word_1.0", "plain-word_1.0"),
        ("two words", "'two words'"),
        ("it's", "'it'\"'\"'s'"),
        ("$(touch x)", "'$(touch x)'"),
        ("", "''"),
    ],
)
def test_shellword_quotes_only_what_the_shell_would_interpret(value, word):
    assert shellword(value) == word


def test_execform_is_one_line_of_json_with_unicode_kept():
    assert execform(["python", "-c", 'print("é")', 7]) == '["python", "-c", "print(\\"é\\")", "7"]'
    line = execform(["a\u2028b", "c\x85d", "e\u2029f", "g\nh"])
    assert "\n" not in line and len(line.splitlines()) == 1
    assert json.loads(line) == ["a\u2028b", "c\x85d", "e\u2029f", "g\nh"]


def test_requirements_text_adds_hashes_only_for_pins_that_have_them():
    text = requirements_text(["six==1.16.0", "idna==3.10"], {"six": [SHA, "b" * 64]})
    assert text == f"six==1.16.0 \\\n    --hash=sha256:{SHA} \\\n    --hash=sha256:{'b' * 64}\nidna==3.10\n"
    assert requirements_text(["idna==3.10"]) == "idna==3.10\n"


def test_images_dir_prefers_the_roots_templates_and_falls_back_to_the_source_tree(tmp_path, monkeypatch):
    own = tmp_path / "images"
    own.mkdir()
    (own / "Dockerfile.j2").write_text("FROM x\n")
    assert render.images_dir(tmp_path) == own
    assert render.images_dir(tmp_path / "elsewhere") == render.SOURCE_IMAGES
    monkeypatch.setattr(render, "SOURCE_IMAGES", tmp_path / "missing")
    with pytest.raises(UserError, match=r"stackforge.s templates are missing: no .*missing/Dockerfile.j2"):
        render.images_dir(tmp_path / "elsewhere")


def _template(tmp_path, text: str):
    (tmp_path / "images").mkdir(exist_ok=True)
    (tmp_path / "images" / "Dockerfile.j2").write_text(text)
    return tmp_path


def test_template_errors_name_the_template(tmp_path, mixed):
    plan = make_plan(mixed)
    with pytest.raises(UserError) as exc:
        render_dockerfile(plan, root=_template(tmp_path, "FROM {{ plan.base_image\n"))
    assert exc.value.file == "images/Dockerfile.j2" and "invalid Dockerfile template" in str(exc.value)
    with pytest.raises(UserError, match="cannot render images/Dockerfile.j2"):
        render_dockerfile(plan, root=_template(tmp_path, "LABEL x={{ 'a\nb' | dockerword }}\n"))


def test_rendering_collapses_blank_runs_and_strips_trailing_space(tmp_path, mixed):
    text = render_dockerfile(
        make_plan(mixed),
        {"k": "v"},
        syntax="docker/dockerfile:1.7",
        root=_template(
            tmp_path,
            "# syntax={{ syntax }}  \n\n\n\nFROM {{ plan.base_image }}\n"
            "{% for k, v in labels.items() %}LABEL {{ k | dockerword }}"
            "={{ v | dockerword }}{% endfor %}\n\n\n",
        ),
    )
    assert text == '# syntax=docker/dockerfile:1.7\n\nFROM stackforge/base:bookworm\nLABEL "k"="v"\n'


# --------------------------------------------------------------------------- context


def test_context_without_sources_has_requirements_gate_and_empty_source_dirs(tmp_path, mixed):
    ctx = assemble(mixed, tmp_path / "out", sources=False)
    deps = ctx.context_dir / "deps"
    assert sorted(p.name for p in deps.iterdir()) == [
        "constraints.txt",
        "hashed.txt",
        "pub.txt",
        "public-pins.json",
        "vend.deps.txt",
        "vend.txt",
        "vend2.txt",
        "vendor-pins.json",
    ]
    assert (deps / "hashed.txt").read_text() == f"six==1.16.0 \\\n    --hash=sha256:{SHA}\n"
    assert json.loads((ctx.context_dir / "gate" / "gate.json").read_text()) == gate_spec(mixed.model)
    assert ctx.sources == [] and ctx.series == {} and ctx.source_date_epoch is None
    assert ctx.inputs_fingerprint().startswith("sha256:")


def test_inputs_fingerprint_follows_the_base_and_the_sources(tmp_path, mixed):
    ctx = assemble(mixed, tmp_path / "out", sources=False)
    first = ctx.inputs_fingerprint()
    ctx.base = "sha256:" + "d" * 64
    second = ctx.inputs_fingerprint()
    ctx.sources = [SourceInfo("x", "git", "v1@abc", commit_time=5, series_hash="sha256:s")]
    third = ctx.inputs_fingerprint()
    assert len({first, second, third}) == 3
    assert ctx.series == {"x": "sha256:s"} and ctx.source_date_epoch == 5


def test_a_failed_fill_leaves_the_previous_context_and_no_staging(tmp_path, mixed, monkeypatch):
    out = tmp_path / "out"
    ctx = assemble(mixed, out, sources=False)
    marker = ctx.context_dir / "deps" / "pub.txt"
    before = marker.read_text()

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(context, "_fill", broken)
    with pytest.raises(OSError):
        assemble(mixed, out, sources=False)
    assert marker.read_text() == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".context-")] == []


def test_leftover_staging_directories_are_removed(tmp_path, mixed):
    out = tmp_path / "out"
    for name in ("context.partial", ".context-abc.partial"):
        (out / name / "deep").mkdir(parents=True)
    assemble(mixed, out, sources=False)
    assert sorted(p.name for p in out.iterdir() if os.path.isdir(p)) == ["context"]


def test_the_installer_phase_runs_first_from_the_public_index_and_checks_no_vendor_pin():
    stack = load("post2", root=REPO).model
    phases = pip_phases(stack)
    first, vendor = phases[0], phases[1]
    assert (first.name, first.index, first.pins, first.no_deps) == ("installer", "pypi", ["pip==26.3"], True)
    assert (first.key, first.checks_pins, first.constraints, first.lock_key()) == ("base.pip", False, None, "installer")
    # the vendor phase still runs without constraints: the installer installed no pin of the stack
    assert (vendor.name, vendor.constraints) == ("mthreads-nodeps", None)
    hashed = load("post2", root=REPO, overrides=["base.pip={version: '26.3', sha256: [" + "a" * 64 + "]}"])
    assert pip_phases(hashed.model)[0].require_hashes
    assert pip_phases(load("post2", root=REPO, overrides=["base.pip=null"]).model)[0].name == "mthreads-nodeps"


def test_pip_check_allows_what_an_upstreams_agree_except_excuses_with_its_reason():
    """post1 pins the post1 train against a plugin revision whose wheel requires the post2 train: the reasons
    the stack gives in upstreams.vllm_musa.agree.except are the reasons pip check's lines print."""
    post1 = load("post1", root=REPO).model
    allowed = gate_spec(post1)["pip_check_allow"]
    assert [(a["dist"], a["requires"]) for a in allowed] == [
        ("vllm_musa", n) for n in ("torch", "torch_musa", "torchvision", "torchaudio", "deep_ep", "torchada")
    ]
    reason = post1.upstreams["vllm_musa"].agree.except_["torch"]
    assert allowed[0]["reason"] == f"upstreams.vllm_musa.agree.except: {reason}"
    assert gate_spec(load("post2", root=REPO).model)["pip_check_allow"] == []  # post2 excepts nothing
