"""stack.agreement: requirement and KEY=VALUE files of an upstream compared with the stack's pins (pure)."""

from __future__ import annotations

import pytest

from stackforge.stack.agreement import (
    compare,
    compare_keys,
    dockerfile_args,
    drift,
    marker_environment,
    parse_keys,
    read_requirements,
    satisfies,
)

#: the platform plugin's requirements/musa_private.txt at 078be0e7 (the vendor wheels), as published
MUSA_PRIVATE = """\
# MUSA/MT self-built wheels, published on the Moore Threads index:
#   https://dl.mthreads.com/repo/api/pypi/pypi/simple

torch==2.11.0.post2+musa5.2.0
torch_musa==2.11.0.post2+musa5.2.0
torchvision==0.26.0.post2+musa5.2.0
torchaudio==2.11.0.post2+musa5.2.0
mate==0.2.7
mate-mubin==0.2.7
flash_attn_3==0.2.7+musa
flash_mla==0.2.7+musa
deep-gemm==0.2.7+musa
flashinfer-python==0.2.7+musa
sageattention==0.2.7+musa
deep_ep==1.1.0+musa5.2.0torch2.11.0.post2
tilelang_musa==0.1.12+musa.2
# The MUSA 5.2.0 Triton backend remains pinned independently of the PyTorch
# release; verify this pin in the 2.11 image before changing it.
triton==3.2.0
apache-tvm-ffi==0.1.11.post1+musa.1
torch-c-dlpack-ext==0.1.5
"""

#: post2's vendor pins (stacks/post1.yaml + post2.yaml) as they are written today
POST2_VENDOR = {
    "torch": "2.11.0.post2+musa5.2.0",
    "torch_musa": "2.11.0.post2+musa5.2.0",
    "torchvision": "0.26.0.post2+musa5.2.0",
    "torchaudio": "2.11.0.post2+musa5.2.0",
    "deep_ep": "1.1.0+musa5.2.0torch2.11.0.post2",
    "mate": "0.2.7",
    "mate-mubin": "0.2.7",
    "flash_attn_3": "0.2.7",
    "flash_mla": "0.2.7",
    "deep-gemm": "0.2.7",
    "flashinfer-python": "0.2.7",
    "sageattention": "0.2.7",
    "tilelang_musa": "0.1.12",
    "triton": "3.2.0",
    "apache-tvm-ffi": "0.1.9.post2+musa.1",
    "torch-c-dlpack-ext": "0.1.3",
}

ENV = marker_environment("3.10", "x86_64")


def files(mapping: dict[str, str]):
    return lambda path: mapping.get(path)


def test_post2_today_disagrees_with_the_plugin_on_8_of_16_lines_each_named_by_file_line():
    found = read_requirements(files({"requirements/musa_private.txt": MUSA_PRIVATE}), ["requirements/musa_private.txt"])
    assert len(found.lines) == 16 and found.files == ["requirements/musa_private.txt"]
    result = compare("vllm_musa", found.lines, POST2_VENDOR, env=ENV)
    rows = [(f.kind, f.path, f.line, f.package, f.stack, f.spec) for f in result.findings]
    assert rows == [
        ("pin", "requirements/musa_private.txt", 10, "flash_attn_3", "0.2.7", "==0.2.7+musa"),
        ("pin", "requirements/musa_private.txt", 11, "flash_mla", "0.2.7", "==0.2.7+musa"),
        ("pin", "requirements/musa_private.txt", 12, "deep-gemm", "0.2.7", "==0.2.7+musa"),
        ("pin", "requirements/musa_private.txt", 13, "flashinfer-python", "0.2.7", "==0.2.7+musa"),
        ("pin", "requirements/musa_private.txt", 14, "sageattention", "0.2.7", "==0.2.7+musa"),
        ("pin", "requirements/musa_private.txt", 16, "tilelang_musa", "0.1.12", "==0.1.12+musa.2"),
        ("pin", "requirements/musa_private.txt", 20, "apache-tvm-ffi", "0.1.9.post2+musa.1", "==0.1.11.post1+musa.1"),
        ("pin", "requirements/musa_private.txt", 21, "torch-c-dlpack-ext", "0.1.3", "==0.1.5"),
    ]
    assert len(result.agreed) == 8
    first = result.findings[0]
    assert first.where == "vllm_musa:requirements/musa_private.txt:10"
    assert "pins flash_attn_3 0.2.7+musa, but the stack pins flash_attn_3 0.2.7" in first.message
    assert first.fix == (
        "pin packages.flash_attn_3.version: '0.2.7+musa' (the upstream's), or add "
        "upstreams.vllm_musa.agree.except.flash_attn_3: <why they differ>"
    )


@pytest.mark.parametrize(
    "version, spec, ok, kind",
    [
        ("1.26.0", "==1.26", True, ""),  # PEP 440 pads with zeros
        ("1.26.4", "==1.26", False, "pin"),
        ("0.2.7", "==0.2.7+musa", False, "pin"),
        ("0.2.7+musa", "==0.2.7", False, "pin"),  # PEP 440 matching accepts it; an exact pin does not
        ("0.2.7+musa", "===0.2.7+musa", True, ""),
        ("1.26.4", "==1.26.*", True, ""),
        ("1.27.0", "==1.26.*", False, "constraint"),
        ("0.35.3", "<2.0", True, ""),
        ("2.1.0", "<2.0", False, "constraint"),
        ("0.1.90", ">=0.1.83", True, ""),
        ("2.11.0.post2+musa5.2.0", ">=2", True, ""),
        ("2.12.0rc1", ">=2", True, ""),  # a pinned pre-release is the stack's choice
        ("4.57.1", ">=4.56.0,<5", True, ""),
        ("5.5.3", ">=4.56.0,<5", False, "constraint"),
        ("1.0", "", True, ""),
    ],
)
def test_satisfies(version, spec, ok, kind):
    assert satisfies(version, spec) == (ok, kind)


def test_includes_comments_markers_and_constraint_files_are_read_inside_the_tree():
    tree = {
        "requirements/musa.txt": "# Common dependencies\n-r common.txt\n-r musa_private.txt\n-c ../constraints.txt\n",
        "requirements/common.txt": (
            "torchada==0.1.81  # the plugin's\nnumpy==1.26\n"
            "transformers>=4.56.0, \\\n  <5\n"
            "triton==3.3.0; platform_machine == 'aarch64'\n"
            "six; python_version > '3.11'\n"
            "--extra-index-url https://example.invalid/simple\n"
            "-r ../../../etc/passwd\n"
            "pkg @ https://example.invalid/pkg.whl\n"
        ),
        "requirements/musa_private.txt": "triton==3.2.0\n-r nope.txt\n",
        "constraints.txt": "numpy<2\n",
    }
    found = read_requirements(files(tree), ["requirements/musa.txt", "requirements/common.txt"])
    assert found.files == [
        "requirements/musa.txt",
        "requirements/common.txt",
        "requirements/musa_private.txt",
        "constraints.txt",
    ]
    assert [(ln.where, ln.name, ln.specifier, ln.constraint) for ln in found.lines] == [
        ("requirements/common.txt:1", "torchada", "==0.1.81", False),
        ("requirements/common.txt:2", "numpy", "==1.26", False),
        ("requirements/common.txt:3", "transformers", "<5,>=4.56.0", False),
        ("requirements/common.txt:5", "triton", "==3.3.0", False),
        ("requirements/common.txt:6", "six", "", False),
        ("requirements/musa_private.txt:1", "triton", "==3.2.0", False),
        ("constraints.txt:1", "numpy", "<2", True),
    ]
    assert found.missing == ["requirements/nope.txt (via requirements/musa_private.txt:2)"]
    assert found.skipped == [
        "requirements/common.txt:7: --extra-index-url is not followed",
        "requirements/common.txt:8: -r is not followed",
        "requirements/common.txt:9: a URL",
    ]
    pins = {"torchada": "0.1.90", "numpy": "1.26.0", "transformers": "4.57.1", "triton": "3.2.0"}
    result = compare("vllm_musa", found.lines, pins, env=ENV)
    # the aarch64-only triton line is not this platform's; numpy 1.26.0 is ==1.26 and <2
    assert [(f.package, f.kind, f.where) for f in result.findings] == [
        ("torchada", "pin", "vllm_musa:requirements/common.txt:1")
    ]
    assert [ln.where for ln in result.agreed] == [
        "requirements/common.txt:2",
        "requirements/common.txt:3",
        "requirements/musa_private.txt:1",
        "constraints.txt:1",
    ]


def test_an_except_lets_a_line_through_and_a_stale_one_is_a_finding():
    lines = read_requirements(files({"r.txt": "torchada==0.1.81\nnumpy==1.26\n"}), ["r.txt"]).lines
    pins = {"torchada": "0.1.90", "numpy": "1.26.0", "torch": "2.11.0"}
    excepts = {"torchada": "post2 needs the fused-MoE aliases of 0.1.90", "numpy": "old reason", "torch": "gone"}
    result = compare("vllm_musa", lines, pins, excepts, env=ENV)
    assert [(ln.name, why) for ln, why in result.excepted] == [
        ("torchada", "post2 needs the fused-MoE aliases of 0.1.90")
    ]
    assert [(f.kind, f.package, f.where) for f in result.findings] == [
        ("stale", "numpy", "vllm_musa:r.txt:2"),
        ("stale", "torch", "vllm_musa"),
    ]
    assert result.findings[0].message == (
        "upstreams.vllm_musa.agree.except.numpy is stale: the upstream's 'numpy==1.26' agrees with the stack's 1.26.0"
    )
    assert result.findings[1].message == (
        "upstreams.vllm_musa.agree.except.torch names a package none of the upstream's files name"
    )
    # the wiring of the requirement phases compares without the stale check
    assert compare("vllm_musa", lines, pins, excepts, env=ENV, stale=False).findings == []


PINS = """\
# Single source of truth for the upstream pins.
VLLM_TAG=v0.28.0
VLLM_COMMIT=2cf0a6915ce544dc493a0990f2ea38d81601128a
FLASHINFER_REPOSITORY="https://github.com/yeahdongcn/flashinfer.git"
"""


def test_key_value_files_are_read_by_regex_and_compared_as_text():
    assert parse_keys(PINS) == {
        "VLLM_TAG": ("v0.28.0", 2),
        "VLLM_COMMIT": ("2cf0a6915ce544dc493a0990f2ea38d81601128a", 3),
        "FLASHINFER_REPOSITORY": ("https://github.com/yeahdongcn/flashinfer.git", 4),
    }
    wanted = {
        "VLLM_TAG": ("upstreams.vllm.tag", "v0.27.0"),
        "VLLM_COMMIT": ("upstreams.vllm.commit", "2cf0a6915ce544dc493a0990f2ea38d81601128a"),
        "FLASHINFER_COMMIT": ("upstreams.flashinfer.commit", "5e4b43c4"),
    }
    out = compare_keys("vllm_musa", "third_party/PINS", PINS, wanted)
    assert [(f.kind, f.where, f.package, f.stack, f.spec) for f in out] == [
        ("key", "vllm_musa:third_party/PINS:2", "VLLM_TAG", "v0.27.0", "v0.28.0"),
        ("missing", "vllm_musa:third_party/PINS", "FLASHINFER_COMMIT", "5e4b43c4", None),
    ]
    assert out[0].message == "VLLM_TAG=v0.28.0, but the stack's upstreams.vllm.tag is v0.27.0"
    assert [f.kind for f in compare_keys("vllm_musa", "third_party/PINS", None, wanted)] == ["missing"] * 3


def test_drift_names_moved_pins_new_constraints_removals_and_keys_with_their_lines():
    before = read_requirements(
        files({"r.txt": "mooncake-transfer-engine==0.3.12.post1\nclick==8.2.0\nray>=2.47\n"}), ["r.txt"]
    ).lines
    after = read_requirements(
        files({"r.txt": "mooncake-transfer-engine==0.3.13\nhuggingface_hub<2.0\nray>=2.48\nnewpkg==1.0\n"}),
        ["r.txt"],
    ).lines
    rows = drift(
        before,
        after,
        {"mooncake-transfer-engine": "0.3.12.post1", "huggingface-hub": "0.35.3"},
        env=ENV,
        keys_before={"PINS": {"VLLM_TAG": ("v0.28.0", 1)}},
        keys_after={"PINS": {"VLLM_TAG": ("v0.29.0", 1)}},
        key_values={"PINS": {"VLLM_TAG": "v0.28.0"}},
    )
    assert [(r.change, r.package, r.stack, r.before, r.after, r.where, r.agrees) for r in rows] == [
        ("moved", "mooncake-transfer-engine", "0.3.12.post1", "==0.3.12.post1", "==0.3.13", "r.txt:1", False),
        ("constraint", "huggingface-hub", "0.35.3", None, "<2.0", "r.txt:2", True),
        ("constraint", "ray", None, ">=2.47", ">=2.48", "r.txt:3", None),
        ("added", "newpkg", None, None, "==1.0", "r.txt:4", None),
        ("removed", "click", None, "==8.2.0", None, "r.txt:2", None),
        ("key", "VLLM_TAG", "v0.28.0", "v0.28.0", "v0.29.0", "PINS:1", False),
    ]
    assert drift(before, before, {}, env=ENV) == []


#: a Dockerfile shaped like the plugin's: Mooncake's release as a build argument of two stages
DOCKERFILE = """\
ARG BASE_IMAGE=ubuntu:22.04
FROM ${BASE_IMAGE} AS base
# ARG MOONCAKE_VERSION=9.9.9 is a comment, never read
FROM base AS mooncake
ARG MOONCAKE_VERSION=0.3.13
RUN python -m pip install --only-binary=:all: \\
    "mooncake-transfer-engine-musa==${MOONCAKE_VERSION}"
FROM mooncake AS final
ARG PYTHON_VERSION \\
    MOONCAKE_VERSION="0.3.13"
LABEL com.mthreads.vllm-musa.mooncake-version="${MOONCAKE_VERSION}"
FROM final
ARG MOONCAKE_VERSION=${OTHER}
ARG MOONCAKE_VERSION
ARG MOONCAKE_VERSION=latest
"""


def test_a_dockerfiles_build_arguments_are_read_per_stage_as_pins_of_their_project():
    args = dockerfile_args(DOCKERFILE, "docker/musa.Dockerfile", {"MOONCAKE_VERSION": "mooncake-transfer-engine-musa"})
    assert [(ln.where, ln.stage, ln.text, ln.name, ln.specifier) for ln in args.lines] == [
        (
            "docker/musa.Dockerfile:5",
            "mooncake",
            "ARG MOONCAKE_VERSION=0.3.13",
            "mooncake-transfer-engine-musa",
            "==0.3.13",
        ),
        (
            "docker/musa.Dockerfile:9",
            "final",
            "ARG MOONCAKE_VERSION=0.3.13",
            "mooncake-transfer-engine-musa",
            "==0.3.13",
        ),
        ("docker/musa.Dockerfile:15", "3", "ARG MOONCAKE_VERSION=latest", "mooncake-transfer-engine-musa", "===latest"),
    ]
    assert args.skipped == [
        "docker/musa.Dockerfile:13: ARG MOONCAKE_VERSION=${OTHER} is not a literal version",
        "docker/musa.Dockerfile:14: ARG MOONCAKE_VERSION has no default to compare",
    ]
    # held to the same check as a requirement line: each stage's line named, with the stack key that pins it
    found = compare(
        "vllm_musa",
        args.lines,
        {"mooncake-transfer-engine-musa": "0.3.12.post1"},
        keys={"mooncake-transfer-engine-musa": "targets.mooncake.pip.mooncake.requirements[0]"},
    ).findings
    assert [(f.where, f.kind) for f in found] == [
        ("vllm_musa:docker/musa.Dockerfile:5", "pin"),
        ("vllm_musa:docker/musa.Dockerfile:9", "pin"),
        ("vllm_musa:docker/musa.Dockerfile:15", "pin"),
    ]
    assert found[1].message == (
        "'ARG MOONCAKE_VERSION=0.3.13' (stage final) pins mooncake-transfer-engine-musa 0.3.13, but the stack pins "
        "mooncake-transfer-engine-musa 0.3.12.post1"
    )
    assert found[1].fix == (
        "pin targets.mooncake.pip.mooncake.requirements[0]: 'mooncake-transfer-engine-musa==0.3.13' (the "
        "upstream's), or add upstreams.vllm_musa.agree.except.mooncake-transfer-engine-musa: <why they differ>"
    )
    reasons = {"mooncake-transfer-engine-musa": "why"}
    same = compare("vllm_musa", args.lines[:2], {"mooncake-transfer-engine-musa": "0.3.13"}, reasons).findings
    assert [f.message for f in same] == [
        "upstreams.vllm_musa.agree.except.mooncake-transfer-engine-musa is stale: the upstream's 'ARG "
        "MOONCAKE_VERSION=0.3.13' (stage mooncake) agrees with the stack's 0.3.13"
    ]


def test_drift_names_a_build_argument_that_moved_in_one_stage():
    names = {"MOONCAKE_VERSION": "mooncake-transfer-engine-musa"}
    before = dockerfile_args(DOCKERFILE, "d", names).lines
    after = dockerfile_args(DOCKERFILE.replace('"0.3.13"', '"0.3.13.post1"'), "d", names).lines
    rows = drift(before, after, {"mooncake-transfer-engine-musa": "0.3.13"})
    assert [(r.change, r.package, r.before, r.after, r.where, r.agrees) for r in rows] == [
        ("moved", "mooncake-transfer-engine-musa", "==0.3.13", "==0.3.13.post1", "d:9", False)
    ]
