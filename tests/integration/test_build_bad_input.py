"""Bad input for the build path: one clear message, a non-zero exit, and no tagged image.

Every case builds the real post2 stack from the stand-in endpoints (tests/fixtures/musa_standins.py)
with one thing wrong: a ``--set`` value, or what a stand-in endpoint serves (a vendor index whose
deep_ep has a lazily loaded .so needing a library the image lacks; a public index whose torchada lost
a config file; ...). The post2 cases are fast because every good layer is shared through BuildKit's
cache; only the broken phase and what follows it run.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

SITE = "/opt/venv/lib/python3.11/site-packages"
BAD_SHA = "deadbeef" * 8


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- what the endpoints serve


def deep_ep_needs_missing_library(stack, specs):
    """deep_ep's wheel gains a lazily loaded extension that needs libmlx5.so.1 (rdma-core), absent here:
    ``import deep_ep`` still works, only the ABI check can see it."""
    return ms.replace_specs(specs, ms.deep_ep_spec(stack.packages["deep_ep"].version, internode_needs=["libmlx5.so.1"]))


def vendor_wheel_metadata_says_another_version(stack, specs):
    """torch_musa's wheel is named for the pin, but its METADATA says post1 (a mislabelled upload)."""
    pkg = stack.packages["torch_musa"]
    spec = ms.torch_musa_spec(pkg.version, stack.packages["torch"].version)
    spec.metadata_version = pkg.version.replace(".post2", ".post1")
    return ms.replace_specs(specs, spec)


def torchada_lost_a_config(stack, specs):
    """torchada 0.1.90 as published without one of its spaced fused-MoE configs."""
    return ms.replace_specs(specs, ms.torchada_spec(stack.packages["torchada"].version, spaced=40))


def vendor_wheel_moves_a_public_pin(stack, specs):
    """mate 0.2.7 (vendor) declares ``torchada>=0.1.91`` and the public index has 0.1.91: the vendor
    wheels' dependency phase would replace the pinned torchada 0.1.90; the stack's pins are its constraints."""
    mate = stack.packages["mate"]
    out = ms.replace_specs(specs, ms.plain_spec("mate", mate.version, mate.import_name, ["torchada>=0.1.91"]))
    return ms.add_specs(out, "pypi", ms.torchada_spec("0.1.91"))


JIT_WRITER = """import os, subprocess
__version__ = "{version}"
# JIT cache next to the package, written by a child process (no Python-level write to audit).
subprocess.run(["touch", os.path.join(os.path.dirname(__file__), "jit-cache.bin")], check=True)
"""


def mate_writes_at_import_through_a_subprocess(stack, specs):
    """mate's import writes a JIT cache file into site-packages from a child process: only the
    read-only re-run of the imports can see it."""
    mate = stack.packages["mate"]
    spec = ms.WheelSpec(
        "mate", mate.version, ms.PURE, files={"mate/__init__.py": JIT_WRITER.format(version=mate.version)}
    )
    return ms.replace_specs(specs, spec)


# --------------------------------------------------------------------------- the table


@dataclass
class Case:
    id: str
    overrides: list[str] | Callable = field(default_factory=list)  # list, or f(standins) -> list
    serve: Callable | None = None  # f(stack, specs) -> specs the stand-in indexes serve instead
    code: int = 1
    expect: list[str] = field(default_factory=list)  # regexes the error must match
    marks: tuple = ()


CASES = [
    Case(
        "malformed-override",
        ["packages.torch"],
        code=2,
        expect=[r"^error: --set packages\.torch: an override must look like key\.path=value", r"fix: e\.g\. --set "],
    ),
    Case(
        "unknown-key-override",
        ["packages.torch.verison=2.11.0.post2+musa5.2.0"],
        code=2,
        expect=[r"unknown key 'verison' in packages\.torch", r"did you mean 'version'\?"],
    ),
    Case(
        "stack-fails-lint",
        ["packages.torchada.version=0.1.83"],
        code=1,
        expect=[
            r"stack 'post2' fails lint; nothing was built",
            r"torchada 0\.1\.83 is below the declared minimum 0\.1\.90 when torch_musa >= 2\.11\.0\.post2",
        ],
    ),
    Case(
        "commit-not-on-tag",
        lambda s: [f"upstreams.vllm.commit={s.repos['vllm'].off_tag}"],
        code=2,
        expect=[r"tag v0\.28\.0 points at [0-9a-f]{40}, but the stack pins commit [0-9a-f]{40}"],
    ),
    Case(
        "upstream-unreachable",
        ["upstreams.vllm.git=/nonexistent/upstream/vllm"],
        code=2,
        expect=[r"upstream git path /nonexistent/upstream/vllm does not exist"],
    ),
    Case(
        "base-image-missing",
        lambda s: [f"base.image=127.0.0.1:{closed_port()}/stackforge/missing:base"],
        code=1,
        expect=[r"base image '127\.0\.0\.1:\d+/stackforge/missing:base' is not present and could not be pulled"],
    ),
    Case(
        "index-unreachable",
        lambda s: [f"indexes.mthreads.url=http://127.0.0.1:{closed_port()}/simple"],
        code=1,
        expect=[r"127\.0\.0\.1:\d+", r"(?i)unreachable|cannot reach|connection refused|could not connect"],
    ),
    Case(
        # a pin the vendor index does not serve (excepted from the plugin's pins, which would name it first)
        "missing-wheel-version",
        ["packages.triton.version=3.2.1", "upstreams.vllm_musa.agree.except.triton=a build the index lacks"],
        code=1,
        expect=[r"No matching distribution found for triton==3\.2\.1"],
    ),
    Case(
        # post2 with the vendor pins it had before it carried the plugin's: every one that differs from the plugin's
        # requirements/musa_private.txt is named with its line, before anything is built (never at the gate)
        "pins-that-differ-from-the-plugin",
        [
            *(f"packages.{n}.version=0.2.7" for n in ("flash_attn_3", "flash_mla", "deep-gemm", "flashinfer-python")),
            "packages.sageattention.version=0.2.7",
            "packages.tilelang_musa.version=0.1.12",
            "packages.apache-tvm-ffi.version=0.1.9.post2+musa.1",
            "packages.torch-c-dlpack-ext.version=0.1.3",
        ],
        code=1,
        expect=[
            r"requirements/musa_private\.txt:21: agree: 'flash_attn_3==0\.2\.7\+musa' pins flash_attn_3 0\.2\.7\+musa, "
            r"but the stack pins flash_attn_3 0\.2\.7",
            r"requirements/musa_private\.txt:32: agree: 'torch-c-dlpack-ext==0\.1\.5'",
        ],
    ),
    Case(
        # vLLM's build requirements not installed in the deps stage: the offline kernel stage cannot fetch them,
        # and the build fails naming the first of vLLM's requirements/build.txt that pip cannot find (cmake at the
        # pinned commit) and why
        "missing-build-requirement",
        ["requirements.vllm-build.files=[{upstream: vllm_musa, path: requirements/test.txt}]"],
        code=1,
        expect=[r"vLLM's build requirement (cmake|setuptools-scm)\S* is not installed, and this build is offline"],
    ),
    Case(
        "hash-mismatch-public",
        # pip checks hashes for a whole phase: every public pin carries one, torchada's is wrong.
        [f"packages.torchada.sha256=[{BAD_SHA}]", f"packages.numpy.sha256=[{BAD_SHA}]"],
        code=1,
        expect=[r"THESE PACKAGES DO NOT MATCH THE HASHES"],
    ),
    Case(
        "hash-on-some-vendor-pins",
        [f"packages.triton.sha256=[{BAD_SHA}]"],
        code=2,
        expect=[
            r"packages\.triton\.sha256: only some pins of index 'mthreads' carry hashes",
            r"fix: give every pin of 'mthreads' its sha256, or drop them and run `stackforge lock post2`",
        ],
    ),
    Case(
        "wheel-metadata-differs-from-pin",
        serve=vendor_wheel_metadata_says_another_version,
        code=1,
        expect=[
            r"torch_musa.*inconsistent version: expected '2\.11\.0\.post2\+musa5\.2\.0', "
            r"but metadata has '2\.11\.0\.post1\+musa5\.2\.0'"
        ],
    ),
    Case(
        "public-pin-would-move",
        serve=vendor_wheel_moves_a_public_pin,
        code=1,
        expect=[
            r"ERROR: pip phase mthreads-deps \(stack key indexes\.mthreads\.deps_from\) would move the public pin "
            r"torchada==0\.1\.90 \(stack key packages\.torchada; the constraints hold it\): "
            r"mate 0\.2\.7 depends on torchada>=0\.1\.91"
        ],
    ),
    Case(
        "abi-miss",
        serve=deep_ep_needs_missing_library,
        code=1,
        expect=[rf"FAIL abi +deep_ep +internode{re.escape(ms.EXT)} missing=libmlx5\.so\.1$"],
    ),
    Case(
        "import-writes-symlinks",
        ["gate.prepare=[]"],
        code=1,
        expect=[
            r"FAIL write  torchada   wrote into site-packages at import: "
            rf"{re.escape(SITE)}/{re.escape(ms.CONFIG_DIR)}/E=\d+,N=\d+,device_name=MTTS5000\.json \(os\.symlink\)",
            r"and 36 more",
        ],
    ),
    Case(
        "dangling-symlink",
        [f'gate.prepare=["python -c \'import torchada\'", "ln -s /nonexistent {SITE}/torchada/moved-config.json"]'],
        code=1,
        expect=[rf"FAIL link   {re.escape(SITE)}/torchada/moved-config\.json -> /nonexistent \(dangling symlink\)"],
    ),
    Case(
        "read-only-import-fails",
        serve=mate_writes_at_import_through_a_subprocess,
        code=1,
        expect=[
            r"read-only: FAIL import mate +expected=0\.2\.7 error=import mate: CalledProcessError: "
            rf".*'touch', '{re.escape(SITE)}/mate/jit-cache\.bin'"
        ],
    ),
    Case(
        "probe-mismatch",
        serve=torchada_lost_a_config,
        code=1,
        expect=[
            r"FAIL probe  fused-moe-configs expected=100 space-free \+ 41 spaced = 141 "
            r"found=99 space-free \+ 40 spaced = 139"
        ],
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input(case: Case, standins):
    stack = standins.stack("post2")
    specs = standins.specs("post2")
    if case.serve is not None:
        specs = case.serve(stack, specs)
    endpoints = standins.endpoints(specs, label=f"{case.id}-" if case.serve else "")
    extra = case.overrides(standins) if callable(case.overrides) else case.overrides
    # A tag of this case's own, so another build of post2 on the same engine cannot make it appear.
    tag = f"{run_names.NS}/bad-input:{case.id}"
    mb.docker("image", "rm", tag, check=False)
    assert mb.image_id(tag) is None

    build = standins.build("post2", [*standins.overrides(endpoints), *extra, f"tags.local={tag}"], label="bad-input")

    err = build.proc.stderr
    assert build.proc.returncode == case.code, build.describe()
    # no traceback of stackforge's own (the engine's log may quote a build step's: "#41 1.2 Traceback …")
    assert not re.search(r"^Traceback", err, re.M), build.describe()
    # One message: a single "error:" line opens it, and only progress and the engine's log come before it.
    assert len(re.findall(r"^error:", err, re.M)) == 1, err
    assert err.startswith("error: ") or err.split("\nerror: ", 1)[0].splitlines()[0].startswith("stackforge: "), err
    for pattern in case.expect:
        assert re.search(pattern, err, re.M), f"{pattern!r} not in:\n{err}"
    # No tag: the local tag, removed before the build, still names nothing.
    assert mb.image_id(tag) is None
    if build.proc.returncode == 1 and (build.evidence / "result.json").is_file():
        assert '"ok": false' in (build.evidence / "result.json").read_text()
