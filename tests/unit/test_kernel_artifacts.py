"""Kernel toolchains, kernel files and option-selected probes: schema, grammar refusals (file:line), the plan and
Dockerfile shape with the option on and off, and the in-image installer and probe environment run on this host."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from stackforge.builder.plan.artifacts import check_uses
from stackforge.builder.plan.plan import image_labels, make_plan
from stackforge.builder.plan.render import SOURCE_IMAGES, render_dockerfile
from stackforge.errors import UserError
from stackforge.stack.load import load
from tests.fixtures import image_scripts
from tests.fixtures.stack_support import RootSpec, assert_refused, locate

IMAGES = SOURCE_IMAGES
INSTALLER = IMAGES / "kernels" / "install_files.py"

ART = """\
name: art
inherits: post2
kernels:
  vllm_rs:
    toolchain:
      uses: [rust-toolchain.toml]
      run: apt-get install -y cargo
    files:
      vllm/vllm-rs: "{site}/vllm/vllm-rs"
      bin/tool: /usr/local/bin/tool
    wheels: false
  extra: {upstream: vllm, run: "true", wheels: true}
gate:
  probes:
    - name: rs
      when: {BUILD_VLLM_RS: "1"}
      env: {VLLM_USE_RUST_FRONTEND: "1"}
      code: print("ok")
      expect: ok
"""


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(stack_files={"art.yaml": ART})


def between(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def test_option_on_toolchain_stage_then_offline_build_then_files_after_the_wheels():
    stack = load("post2")
    plan = make_plan(stack)
    rs = next(k for k in plan.kernels if k.name == "vllm_rs")
    assert rs.wheels is False and rs.toolchain is not None
    assert rs.toolchain.path_prefix == "/usr/local/cargo/bin"
    assert rs.toolchain.uses == ["tools/install_protoc.sh", "rust-toolchain.toml", "rust"]
    assert "CARGO_BUILD_JOBS" not in rs.toolchain.env and rs.env["CARGO_BUILD_JOBS"] == "4"  # tuning: the build only
    assert [(f.key, f.source, f.dest) for f in plan.files] == [
        ("kernels.flashinfer_mamba.files.mamba", "mamba", "{site}/flashinfer/mamba"),
        ("kernels.vllm_rs.files.vllm/vllm-rs", "vllm/vllm-rs", "{site}/vllm/vllm-rs"),
        (
            "kernels.vllm_rs.files.vllm/_rust_tool_parser.abi3.so",
            "vllm/_rust_tool_parser.abi3.so",
            "{site}/vllm/_rust_tool_parser.abi3.so",
        ),
    ]
    text = render_dockerfile(plan)
    # The toolchain stage holds only the files it uses, never the kernel's whole tree: a source change re-runs
    # only the kernel stage built FROM it; a toolchain change re-runs both.
    toolchain = between(text, "FROM deps AS toolchain-vllm_rs\n", "FROM toolchain-vllm_rs AS kernel-vllm_rs\n")
    assert "COPY --from=src-vllm / " not in toolchain
    assert "COPY --from=src-vllm /rust-toolchain.toml /stackforge/toolchain/vllm_rs/rust-toolchain.toml\n" in toolchain
    assert "PIP_NO_INDEX" not in toolchain and "https://sh.rustup.rs" in toolchain
    assert 'ENV RUSTUP_HOME="/usr/local/rustup"' in toolchain and "ENV PATH=/usr/local/cargo/bin:$PATH\n" in toolchain
    kernel = between(text, "FROM toolchain-vllm_rs AS kernel-vllm_rs\n", "FROM deps AS gate-env\n")
    assert "COPY --from=src-vllm / /stackforge/src/vllm\n" in kernel
    assert "export PIP_NO_INDEX=1 GIT_ALLOW_PROTOCOL=file CARGO_NET_OFFLINE=true;" in kernel
    assert text.index("https://sh.rustup.rs") < text.index("bash build_rust.sh")
    gate = between(text, "FROM deps AS gate-env\n", "COPY gate/")
    wheels, files = gate.index("pip install --no-index"), gate.index("install_files.py")
    assert wheels < files and "/stackforge/wheels/vllm_rs" not in gate
    assert "--mount=type=bind,from=kernel-vllm_rs,source=/out/files,target=/stackforge/files/vllm_rs" in gate
    # Nothing of the toolchain stage is in the image: only kernel stages build FROM it.
    assert text.count("FROM toolchain-vllm_rs ") == 1 and "from=toolchain-" not in text
    probes = {p["name"]: p for p in plan.gate["probes"]}
    assert probes["vllm-rs"]["env"] == {"VLLM_USE_RUST_FRONTEND": "1"}
    assert image_labels(stack)["org.stackforge.kernels"] == "vllm,vllm_musa,flashinfer_mamba,vllm_rs"


def test_option_off_leaves_out_the_stage_the_files_and_the_probe():
    stack = load("post2", overrides=["options.BUILD_VLLM_RS.value=0"])
    plan = make_plan(stack)
    assert [k.name for k in plan.kernels] == ["vllm", "vllm_musa", "flashinfer_mamba"]
    assert [f.key for f in plan.files] == ["kernels.flashinfer_mamba.files.mamba"]
    assert [p["name"] for p in plan.gate["probes"]] == ["fused-moe-configs"]
    text = render_dockerfile(plan)
    for absent in ("AS toolchain-", "kernel-vllm_rs", "files/vllm_rs", "rustup", "vllm-rs"):
        assert absent not in text, absent
    labels = image_labels(stack)
    assert labels["org.stackforge.kernels"] == "vllm,vllm_musa,flashinfer_mamba"
    assert labels["org.stackforge.option.BUILD_VLLM_RS"] == "0"


def test_a_kernel_with_files_may_still_install_wheels(root):
    plan = make_plan(load("art", root, ["kernels.vllm_rs.wheels=true"]))
    assert [k.name for k in plan.wheel_kernels] == ["vllm", "vllm_musa", "vllm_rs", "extra"]
    assert "/stackforge/wheels/vllm_rs/*.whl" in render_dockerfile(plan)


@pytest.mark.parametrize(
    ("line_has", "value", "message"),
    [
        ("vllm/vllm-rs:", '../x: "{site}/x"', "'../x' is not a file path relative to the kernel's /out/files"),
        ("vllm/vllm-rs:", '/abs: "{site}/x"', "'/abs' is not a file path relative"),
        ("vllm/vllm-rs:", 'dir/: "{site}/x"', "'dir/' is not a file path relative"),
        ("vllm/vllm-rs:", "vllm/vllm-rs: vllm/vllm-rs", "'vllm/vllm-rs' is not an absolute file path or {site}/"),
        ("vllm/vllm-rs:", 'vllm/vllm-rs: "{site}/../x"', "is not an absolute file path or {site}/"),
        ("vllm/vllm-rs:", 'vllm/vllm-rs: "{site}/"', "is not an absolute file path or {site}/"),
        ("vllm/vllm-rs:", "vllm/vllm-rs: /usr/../etc/passwd", "is not an absolute file path"),
        ("vllm/vllm-rs:", "vllm/vllm-rs: '/usr/x; rm -rf /'", "is not an absolute file path"),
        ("vllm/vllm-rs:", "vllm/vllm-rs: /usr/local/bin/tool", "/usr/local/bin/tool is also installed by"),
        ("uses:", "uses: [../Cargo.lock]", "'../Cargo.lock' is not a file path relative"),
        ("run: apt-get", 'run: "a\\nb"', "kernels.vllm_rs.toolchain.run: contains a newline"),
        ("wheels: true", "wheels: false", "kernels.extra.wheels: the step installs nothing (wheels: false, no files)"),
        ("when: {BUILD", "when: {BUILD_VLLM_R: '1'}", "gate.probes.0.when.BUILD_VLLM_R: unknown build option"),
        ("when: {BUILD", "when: {BUILD_VLLM_RS: '2'}", "'2' is not one of the option's choices"),
        ("env: {VLLM", "env: {VLLM_USE_RUST_FRONTEND: 1}", "environment values must be strings"),
        ("env: {VLLM", "env: {'1BAD': x}", "is not a valid environment variable name"),
    ],
)
def test_bad_values_are_refused_with_file_and_line(root, capsys, line_has, value, message):
    path = root / "stacks" / "art.yaml"
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line_has in line)
    indent = lines[n][: len(lines[n]) - len(lines[n].lstrip())]
    lines[n] = f"{indent}{value}" if "wheels: true" not in line_has else lines[n].replace(line_has, value)
    assert_refused(capsys, root, "art", lines, n, message)


def test_a_toolchain_path_missing_from_the_tree_names_the_key(root, tmp_path):
    stack = load("art", root)
    tree = tmp_path / "vllm"
    tree.mkdir()
    with pytest.raises(UserError) as exc:
        check_uses(stack, "vllm_rs", "vllm", tree)
    assert exc.value.message.startswith("kernels.vllm_rs.toolchain.uses[0]: rust-toolchain.toml is not in vllm's tree")
    assert exc.value.line == locate(root / "stacks" / "art.yaml", "uses:", "rust-toolchain.toml")[0]
    (tree / "rust-toolchain.toml").write_text("[toolchain]\n")
    check_uses(stack, "vllm_rs", "vllm", tree)


# --------------------------------------------------------------------------- images/kernels/install_files.py


def run_installer(tmp_path: Path, spec: list[dict], files_root: Path) -> subprocess.CompletedProcess:
    """The installer with its /stackforge/files root moved under tmp_path (the script's only fixed path)."""
    script = tmp_path / "install_files.py"
    script.write_text(INSTALLER.read_text().replace('Path("/stackforge/files")', f"Path({str(files_root)!r})"))
    (tmp_path / "spec.json").write_text(__import__("json").dumps(spec))
    return subprocess.run([sys.executable, str(script), str(tmp_path / "spec.json")], capture_output=True, text=True)


def test_installer_keeps_the_mode_and_fails_naming_the_key_of_a_missing_file(tmp_path):
    files = tmp_path / "files"
    (files / "k" / "bin").mkdir(parents=True)
    (files / "k" / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    os.chmod(files / "k" / "bin" / "tool", 0o755)
    dest = tmp_path / "out" / "deep" / "tool"
    spec = [
        {"key": "kernels.k.files.bin/tool", "kernel": "k", "source": "bin/tool", "dest": str(dest)},
        {"key": "kernels.k.files.lib/x.so", "kernel": "k", "source": "lib/x.so", "dest": str(tmp_path / "x.so")},
    ]
    proc = run_installer(tmp_path, spec, files)
    assert proc.returncode == 1
    assert "error: kernels.k.files.lib/x.so: lib/x.so was not written by kernel k" in proc.stderr
    assert not dest.exists()  # nothing is installed when one file is missing
    proc = run_installer(tmp_path, spec[:1], files)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755 and dest.read_text().endswith("echo tool\n")
    assert proc.stdout.startswith(f"installed kernels.k.files.bin/tool: {dest} mode=0755 sha256=")


def test_installer_replaces_a_directory_as_a_whole_and_refuses_a_link_inside(tmp_path):
    files = tmp_path / "files"
    (files / "k" / "mamba").mkdir(parents=True)
    (files / "k" / "mamba" / "__init__.py").write_text("PROVIDER = 'musa'\n")
    (files / "k" / "mamba" / "ssd.py").write_text("SSD = 1\n")
    dest = tmp_path / "site" / "flashinfer" / "mamba"
    dest.mkdir(parents=True)
    (dest / "__init__.py").write_text("PROVIDER = 'cuda'\n")
    (dest / "stale_cuda_only.py").write_text("STALE = 1\n")
    spec = [{"key": "kernels.k.files.mamba", "kernel": "k", "source": "mamba", "dest": str(dest)}]
    proc = run_installer(tmp_path, spec, files)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["__init__.py", "ssd.py"]  # the stale module is gone
    assert (dest / "__init__.py").read_text() == "PROVIDER = 'musa'\n"
    assert [line.split(" mode=")[0] for line in proc.stdout.splitlines()] == [
        f"installed kernels.k.files.mamba: {dest / '__init__.py'}",
        f"installed kernels.k.files.mamba: {dest / 'ssd.py'}",
    ]
    assert not list(dest.parent.glob(".mamba.stackforge-*"))
    (files / "k" / "mamba" / "escape.py").symlink_to("/etc/passwd")
    proc = run_installer(tmp_path, spec, files)
    assert proc.returncode == 1
    assert "error: kernels.k.files.mamba: mamba was written holding a symbolic link (escape.py) by kernel k" in (
        proc.stderr
    )
    assert sorted(p.name for p in dest.iterdir()) == ["__init__.py", "ssd.py"]  # untouched


def test_installer_resolves_site_to_this_interpreters_site_packages():
    spec = importlib.util.spec_from_file_location("stackforge_image_install_files", INSTALLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.destination("{site}/vllm/vllm-rs") == Path(sysconfig.get_paths()["purelib"]) / "vllm" / "vllm-rs"
    assert module.destination("/usr/local/bin/x") == Path("/usr/local/bin/x")


def test_a_probe_runs_with_its_env_which_is_restored_after(monkeypatch):
    gate = image_scripts.load("gate")
    monkeypatch.delenv("STACKFORGE_PROBE_X", raising=False)
    probe = {
        "name": "env",
        "code": "import os; print(os.environ['STACKFORGE_PROBE_X'])",
        "expect": "1",
        "env": {"STACKFORGE_PROBE_X": "1"},
    }
    assert gate.check_probe(probe) == (True, "PASS probe  env result=1")
    assert "STACKFORGE_PROBE_X" not in os.environ
    ok, line = gate.check_probe({**probe, "env": {}})
    assert not ok and "KeyError" in line
