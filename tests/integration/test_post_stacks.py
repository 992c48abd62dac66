"""The real post2 and post1 stacks, built end to end from stand-in endpoints.

Only the endpoints and the base image are overridden (``--set indexes.*.url``, ``upstreams.*.git/commit``,
``base.image``); stacks/post2.yaml, stacks/post1.yaml and the build code path are the production ones.
See tests/fixtures/musa_standins.py for what the stand-ins are.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess

import pytest

from stackforge.builder.plan.plan import pip_check_allow
from stackforge.stack.load import fingerprint
from tests.fixtures import musa_builds as mb
from tests.fixtures import musa_standins as ms
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

#: the stacks' own local tags, built in the run's namespace (tests/fixtures/run_names.py)
POST2_TAG = run_names.namespaced("vllm-musa:ubuntu22.04_py3.11_musa_runtime_5.2_pytorch_release_2.11.0.post2_musa5.2.0")
POST1_TAG = run_names.namespaced("vllm-musa:ubuntu22.04_py3.11_musa_runtime_5.2_pytorch_release_2.11.0.post1_musa5.2.0")
DEEP_EP_SO = "deep_ep_cpp.cpython-311-x86_64-linux-gnu.so"
PIP_CHECK = "PASS pip    check      No broken requirements found."
#: an unmet requirement post1 allows: pip check names the plugin and the pin (the line's text is pip's own)
ALLOWED = "allowed: vllm-musa 0.1.24 has requirement {name}=="


@pytest.fixture(scope="module")
def post2(standins):
    build = standins.happy("post2")
    assert build.ok, build.describe()
    # Tests address the image by its id: the build is shared by the session, and other modules' builds of
    # post2 move its local tag (test_build_example checks that a build's tag names its image).
    return build


@pytest.fixture(scope="module")
def post1(standins):
    build = standins.happy("post1")
    assert build.ok, build.describe()
    assert mb.image_id(POST1_TAG) == build.image
    return build


def assert_machine_and_python(lines: list[str]) -> None:
    """The gate's first checks: the machine it ran on is this host's (the stack's platform.arch), and the image's
    interpreter is the stack's platform.python (the stand-ins set 3.11)."""
    assert lines[0] == f"PASS machine {platform.machine()}", lines[0]
    assert re.fullmatch(
        rf"PASS python +version={re.escape(ms.BASE_PYTHON)}\.\d+ platform={re.escape(ms.BASE_PYTHON)}", lines[1]
    ), lines[1]


def expected_gate(stack) -> list[str]:
    """The installer the phases ran with, one PASS line per pin in stack order, then the extra imports and the
    probes, as the seed prints them, and pip check (a requirement the stack allows on a line of its own)."""
    verbs = {"metadata": "meta  ", "spec": "spec  "}
    lines = [f"PASS pip    version    version={stack.base.pip.version}"] if stack.base.pip else []
    lines += [f"PASS {verbs.get(p.gate, 'import')} {n:<10} version={p.version}" for n, p in stack.packages.items()]
    # the extra imports report what the stand-ins serve: the upstreams' tags, the requirement files' wheels
    versions = {
        **{n: v for n, v, _, _ in ms.REQUIREMENT_WHEELS},
        "vllm": stack.upstreams["vllm"].tag.lstrip("v"),
        "vllm_musa": stack.upstreams["vllm_musa"].tag.lstrip("v"),
    }
    lines += [f"PASS import {i.module:<10} version={versions[i.dist]}" for i in stack.gate.imports]
    selected = [p for p in stack.gate.probes if all(stack.options[o].value == v for o, v in p.when.items())]
    lines += [f"PASS probe  {p.name} result={p.expect}" for p in selected]
    # rules.requires, checked in the image: mcc comes from the stand-in MUSA apt stack of the 5.2 line.
    lines += [
        f"PASS requires MUSA Toolkit version={stack.platform.musa} min=4.3.6",
        f"PASS requires torch_musa version={stack.packages['torch_musa'].version} min=2.7",
    ]
    allowed = sorted(a["requires"] for a in pip_check_allow(stack))
    lines += [PIP_CHECK] if not allowed else [ALLOWED.format(name=n) for n in allowed]
    return lines


def test_post2_every_gate_line_passes(post2, standins):
    stack = standins.stack("post2", post2.overrides)
    gate = post2.evidence_lines("gate.txt")
    # The seed's own lines, literally.
    for line in (
        "PASS import torchada   version=0.1.90",
        "PASS import torch      version=2.11.0.post2+musa5.2.0",
        "PASS import torch_musa version=2.11.0.post2+musa5.2.0",
        "PASS import deep_ep    version=1.1.0+musa5.2.0torch2.11.0.post2",
        "PASS meta   apache-tvm-ffi version=0.1.11.post1+musa.1",
        "PASS import vllm       version=0.28.0",
        "PASS import vllm_musa  version=0.1.24",
        "PASS probe  fused-moe-configs result=100 space-free + 41 spaced = 141",
        "PASS probe  vllm-rs result=vllm/vllm-rs is a file",
    ):
        assert line in gate, f"{line!r} not in gate output:\n" + "\n".join(gate)
    # Every check, in stack order (torchada before torch), and nothing else.
    checks = [l for l in gate if l.startswith(("PASS ", "FAIL ", "WARN "))]
    assert_machine_and_python(checks)
    assert checks[2:] == expected_gate(stack)
    assert len(stack.packages) == 18 and len(checks) == 2 + 1 + 18 + len(stack.gate.imports) + 2 + 2 + 1
    assert gate[-1] == f"gate result: {len(checks)} PASS, 0 FAIL"
    # The platform plugin activates when vllm is imported, before vllm's own line, as in the seed.
    assert gate.index(ms.PLUGIN_LINE) == gate.index("PASS import vllm       version=0.28.0") - 1


def test_post2_installs_the_musa_apt_stack_of_its_runtime_line_in_one_transaction(post2):
    """system.musa against the stand-in source, which mixes the 5.1 and 5.2 lines and carries the traps."""
    system = post2.evidence_lines("system.txt")
    assert "layer os: install=never: skipped" in system
    assert "layer musa: install=auto: 19 package(s) in one apt transaction" in system
    for line in (
        "resolved musa-toolkit: musa-toolkit-5-2",
        "resolved libmthreads-compute: libmthreads-compute=5.2.0-1",  # not 5.20.0-1
        "resolved libmthreads-mtml: libmthreads-mtml=2.4.1-1",  # not 2.4.10-1
        "resolved libmudnn3: libmudnn3-musa-5",  # the second candidate name
        "link /usr/local/musa -> /usr/local/musa-5.2.0",
    ):
        assert line in system, "\n".join(system)
    installed = dict(l.split(" ", 1) for l in system[system.index("installed:") + 1 :] if " " in l)
    assert installed["musa-toolkit-5-2"] == "5.2.0-1" and "musa-toolkit-5-1" not in installed
    assert not [name for name in installed if name.endswith("-5-1")]
    # The runtime library the ABI check resolves through gate.library_path /usr/local/musa/lib.
    proc = mb.docker(
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "sh",
        post2.image,
        "-c",
        "readlink -f /usr/local/musa/lib/libmusart.so.5 && command -v mcc",
    )
    assert proc.stdout.split() == ["/usr/local/musa-5.2.0/lib/libmusart.so.5.2.0", "/usr/local/musa/bin/mcc"]


def test_post2_readonly_rerun_and_abi_stage_pass(post2, standins):
    stack = standins.stack("post2", post2.overrides)
    readonly = post2.evidence_lines("gate-readonly.txt")
    machine = f"PASS machine {platform.machine()}"  # the read-only gate runs on the stack's platform too
    imports = [machine] + [
        l for l in expected_gate(stack) if not l.startswith(("PASS probe", "PASS pip", "PASS requires"))
    ]
    assert [l for l in readonly if l.startswith("read-only: ")] == [f"read-only: {l}" for l in imports] + [
        f"read-only: gate result: {len(imports)} PASS, 0 FAIL"
    ]
    abi = post2.evidence_lines("abi.txt")
    assert abi[-1] == "abi result: 0 FAIL"
    assert not [l for l in abi if l.startswith("FAIL")]
    # deep_ep's extension needs libmusa_kernels.so, found only through gate.library_path {site}/torch_musa/lib.
    assert any(re.fullmatch(rf"PASS abi +deep_ep +{re.escape(DEEP_EP_SO)} resolved=\d+", l) for l in abi), abi
    for so in ("libmusa_kernels.so", "libmusa_python.so.2", f"_MUSAC{ms.EXT}"):
        assert any(re.fullmatch(rf"PASS abi +torch_musa +{re.escape(so)} resolved=\d+", l) for l in abi), (so, abi)
    # deep_ep is compiled and declares no Requires-Dist: a WARN, and the only one (torch, torch_musa declare deps).
    warns = [l for l in abi if l.startswith("WARN")]
    assert len(warns) == 1 and re.match(
        r"WARN abi +deep_ep +compiled \(1 \.so\) and declares no Requires-Dist", warns[0]
    )


def test_post2_vendor_wheels_own_dependencies_come_from_the_public_index(post2):
    # flashinfer-python (vendor, installed --no-deps) requires tabulate, which only the public stand-in serves
    # and nothing public requires: the vendor wheels' dependency phase installed it.
    proc = mb.docker(
        "run", "--rm", "--network=none", "--entrypoint", "python", post2.image, "-m", "pip", "show", "tabulate"
    )
    fields = dict(l.split(": ", 1) for l in proc.stdout.splitlines() if ": " in l)
    assert fields["Version"] == ms.PUBLIC_DEPS["tabulate"]
    assert fields["Required-by"] == "flashinfer-python"
    phases = re.findall(
        r"^RUN .*pip install --index-url (\S+) .*-r /stackforge/deps/(\S+)$",
        (post2.out / "Dockerfile").read_text().replace("\\\n", " "),
        re.M,
    )
    assert [p[1] for p in phases] == [
        "installer.txt",
        "mthreads.txt",
        "pypi.txt",
        "requirements/vllm-build.txt",
        "requirements/vllm-common.txt",
        "requirements/vllm-transitive.txt",
        "mthreads.deps.txt",
    ]
    # the installer and the vendor wheels' dependencies resolve against the public index
    assert phases[0][0] == phases[-1][0] == phases[2][0]
    inventory = json.loads((post2.evidence / "inventory.json").read_text())
    tab = next(d for d in inventory["dists"] if d["name"].lower() == "tabulate")
    assert tab["phase"] == "mthreads-deps"


def test_post2_image_tag_and_labels(post2, standins):
    assert post2.tag == POST2_TAG
    labels = mb.labels_of(post2.image)
    stack = standins.stack("post2", post2.overrides)
    pins = {k[len("org.stackforge.pin.") :]: v for k, v in labels.items() if k.startswith("org.stackforge.pin.")}
    assert pins == {n: p.version for n, p in stack.packages.items()}
    assert labels["org.stackforge.fingerprint"] == fingerprint(stack)
    inputs = json.loads((post2.evidence / "inputs.json").read_text())
    assert labels["org.stackforge.inputs"] == inputs["inputs_fingerprint"]
    assert inputs["upstreams"][0]["pin"] == f"v0.28.0@{standins.repos['vllm'].commit}"
    assert labels["org.opencontainers.image.revision"] == standins.repos["vllm_musa"].commit
    assert labels["org.stackforge.upstream.vllm"] == f"v0.28.0@{standins.repos['vllm'].commit}"
    assert labels["org.opencontainers.image.version"] == "v0.1.24"  # the source upstream (vllm_musa)
    assert labels["org.stackforge.upstream.vllm_musa"] == f"v0.1.24@{standins.repos['vllm_musa'].commit}"
    assert labels["com.mthreads.vllm.version"] == "v0.28.0"
    assert labels["org.stackforge.stack"] == "post2"
    assert labels["org.opencontainers.image.base.name"] == standins.base_image
    # the plugin's Mooncake, labelled as its final stage labels it (the image holds that release: its check passed)
    assert labels["com.mthreads.vllm-musa.mooncake-version"] == "0.3.13" == ms.MOONCAKE[1]
    assert "PASS probe  mooncake result=mooncake-transfer-engine-musa 0.3.13 target=mooncake" in post2.evidence_lines(
        "checks.txt"
    )


def test_post2_target_runs_vllm_serve(post2):
    # The entrypoint is `vllm serve`: the arguments of `docker run` are its arguments (--help: it prints and
    # exits; serving for real is what `stackforge smoke` checks).
    proc = mb.docker("run", "--rm", "--network=none", post2.image, "stand-in/model", "--port", "8123", "--help")
    assert "usage: vllm serve [model_tag] [options]" in proc.stdout


def test_gate_verb_reruns_the_gate_on_the_built_image(post2, standins):
    # The stack says Python 3.10; the stand-in image has the base's 3.11, and the gate says so.
    wrong = mb.stackforge("gate", post2.image, "--stack", "post2")
    assert wrong.returncode == 1
    assert re.search(r"^FAIL python +version=3\.11\.\d+ platform=3\.10 ", wrong.stdout, re.M), wrong.stdout
    proc = mb.stackforge(
        "gate",
        post2.image,
        "--stack",
        "post2",
        "--set",
        f"platform.python={ms.BASE_PYTHON}",
        "--set",
        f"base.pip={ms.bundled_pip().version}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    for line in (
        "PASS import torchada   version=0.1.90",
        "PASS import deep_ep    version=1.1.0+musa5.2.0torch2.11.0.post2",
        "PASS probe  fused-moe-configs result=100 space-free + 41 spaced = 141",
    ):
        assert line in out, proc.stdout
    assert_machine_and_python(out)
    assert PIP_CHECK in out
    assert out[-1] == f"gate result: {2 + len(expected_gate(standins.stack('post2', post2.overrides)))} PASS, 0 FAIL"


def test_abi_verb_reports_deep_ep_resolved(post2, standins):
    proc = mb.stackforge("abi", post2.image, "--stack", "post2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert any(re.fullmatch(rf"PASS abi +deep_ep +{re.escape(DEEP_EP_SO)} resolved=\d+", l) for l in out), proc.stdout
    assert out[-1] == "abi result: 0 FAIL"
    # Without the stack's library path the same .so does not resolve: the ABI check uses it.
    proc = mb.stackforge("abi", post2.image, "--stack", "post2", "--set", "gate.library_path=[]")
    assert proc.returncode != 0
    line = next(l for l in proc.stdout.splitlines() if l.startswith("FAIL abi") and "deep_ep" in l)
    assert re.fullmatch(rf"FAIL abi +deep_ep +{re.escape(DEEP_EP_SO)} missing=(\S+)", line), line
    assert set(line.rsplit("missing=", 1)[1].split(",")) == {
        "libmusa_python.so.2",
        "libmusa_kernels.so",
        "libtorch_python.so",
    }


def test_post1_builds_end_to_end(post1, standins):
    stack = standins.stack("post1", post1.overrides)
    assert post1.tag == POST1_TAG
    gate = post1.evidence_lines("gate.txt")
    assert "PASS import torchada   version=0.1.83" in gate
    assert "PASS import torchaudio version=2.11.0+musa5.2.0" in gate
    assert "PASS import deep_ep    version=1.1.0+musa5.2.0torch2.11.0.post1" in gate
    checks = [l for l in gate if l.startswith(("PASS ", "FAIL ", "WARN "))]
    assert_machine_and_python(checks)
    expected = expected_gate(stack)
    allowed = [l for l in checks if l.startswith("PASS pip    check      allowed: ")]
    assert checks[2 : len(checks) - len(allowed)] == [l for l in expected if "allowed: " not in l]
    # the plugin revision requires the post2 train and torchada 0.1.90: pip check reports each, and post1 allows
    # each with its reason
    assert len(allowed) == 6 and all(
        any(line.startswith(f"PASS pip    check      {a}") for line in allowed) for a in expected if "allowed: " in a
    ), allowed
    assert gate[-1] == f"gate result: {len(checks)} PASS, 0 FAIL"
    assert post1.evidence_lines("abi.txt")[-1] == "abi result: 0 FAIL"
    labels = mb.labels_of(post1.image)
    assert labels["org.stackforge.pin.torch"] == "2.11.0.post1+musa5.2.0"
    assert labels["org.opencontainers.image.revision"] == standins.repos["vllm_musa"].commit
    assert labels["org.stackforge.upstream.vllm"] == f"v0.28.0@{standins.repos['vllm'].commit}"


# --------------------------------------------------------------------------- BUILD_VLLM_RS: post2 on, post1 off

SITE = "/opt/venv/lib/python3.11/site-packages"


def in_image(image: str, script: str) -> subprocess.CompletedProcess:
    return mb.docker("run", "--rm", "--network=none", "--entrypoint", "sh", image, "-c", script, check=False)


def test_post2_installs_the_rust_frontend_and_tool_parser_built_by_the_vllm_rs_kernel(post2, standins):
    # The real Rust binary, executable, inside the vllm package where vLLM resolves it.
    proc = in_image(post2.image, f"test -x {SITE}/vllm/vllm-rs && {SITE}/vllm/vllm-rs --version")
    assert proc.returncode == 0 and proc.stdout.strip() == "vllm-rs 0.28.0 (stand-in Rust frontend)", proc
    proc = in_image(
        post2.image,
        "VLLM_USE_RUST_FRONTEND=1 python -c 'import vllm._rust_tool_parser as p, vllm.envs as e; "
        "print(p.BACKEND, e.VLLM_RUST_FRONTEND_PATH)'",
    )
    assert proc.stdout.strip().splitlines()[-1] == f"rust {SITE}/vllm/vllm-rs", proc
    assert "PASS probe  vllm-rs result=vllm/vllm-rs is a file" in post2.evidence_lines("gate.txt")
    installed = mb.docker(
        "run", "--rm", "--network=none", "--entrypoint", "cat", post2.image, "/stackforge/kernels/files.txt"
    ).stdout
    assert re.search(
        r"^installed kernels\.vllm_rs\.files\.vllm/vllm-rs: \S+/vllm/vllm-rs mode=0755 sha256=", installed, re.M
    )
    # The toolchain (protoc, cargo, the fetched crates) stayed in the kernel's stages.
    proc = in_image(post2.image, "command -v cargo || command -v rustc || command -v protoc || ls /usr/local/cargo")
    assert proc.returncode != 0 and proc.stdout == "", proc
    labels = mb.labels_of(post2.image)
    assert labels["org.stackforge.option.BUILD_VLLM_RS"] == "1"
    assert labels["org.stackforge.kernels"] == "vllm,vllm_musa,flashinfer_mamba,vllm_rs"
    assert json.loads((post2.evidence / "inputs.json").read_text())["options"] == {"BUILD_VLLM_RS": "1"}


def test_post1_with_the_option_off_has_nothing_of_vllm_rs(post1):
    dockerfile = (post1.out / "Dockerfile").read_text()
    for absent in ("AS toolchain-vllm_rs", "kernel-vllm_rs", "files/vllm_rs", "build_rust.sh"):
        assert absent not in dockerfile, absent
    assert not [l for l in post1.evidence_lines("gate.txt") if "vllm-rs" in l]
    proc = in_image(post1.image, f"ls {SITE}/vllm; find / -xdev -name 'vllm-rs*' -o -name '*rust_tool_parser*'")
    assert proc.returncode == 0 and "__init__.py" in proc.stdout and "rust" not in proc.stdout, proc
    labels = mb.labels_of(post1.image)
    assert labels["org.stackforge.option.BUILD_VLLM_RS"] == "0"
    assert labels["org.stackforge.kernels"] == "vllm,vllm_musa,flashinfer_mamba"


def test_a_declared_file_the_kernel_did_not_write_fails_the_build_naming_it(post2, standins):
    before = mb.image_id(POST2_TAG)
    ep = standins.endpoints(standins.specs("post2"))
    files = '{vllm/vllm-rs: "{site}/vllm/vllm-rs", vllm/vllm-rs-bench: "{site}/vllm/vllm-rs-bench"}'
    build = standins.build(
        "post2", [*standins.overrides(ep, vllm_rs=True), f"kernels.vllm_rs.files={files}"], label="rs-missing-file"
    )
    assert not build.ok and build.proc.returncode != 0
    assert "kernels.vllm_rs.files.vllm/vllm-rs-bench: vllm/vllm-rs-bench was not written by kernel vllm_rs" in (
        build.proc.stderr
    ), build.describe()
    assert build.image is None and mb.image_id(POST2_TAG) == before  # nothing tagged
