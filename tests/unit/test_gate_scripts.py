"""The scripts shipped into images (images/gate/gate.py, abi.py), tested directly on this host."""

from __future__ import annotations

import importlib.metadata as md
import io
import os
import sys
import textwrap
from pathlib import Path

from tests.fixtures.image_scripts import load

gate = load("gate")
abi = load("abi")
PACKAGING = md.version("packaging")


def pkg(version: str, mode: str = "exact", name: str = "packaging", module: str = "packaging") -> dict:
    return {"name": name, "dist": name, "import": module, "mode": mode, "version": version}


def test_exact_pass_and_fail_lines_match_the_seed_format():
    assert gate.check_package(pkg(PACKAGING)) == (True, f"PASS import packaging  version={PACKAGING}")
    ok, line = gate.check_package(pkg("0.0.1"))
    assert not ok and line == f"FAIL import packaging  expected=0.0.1 found={PACKAGING}"


def test_a_pin_with_a_local_label_matches_only_that_build():
    ok, line = gate.check_package(pkg(PACKAGING + "+musa.1"))
    assert not ok
    assert line == (
        f"FAIL import packaging  expected={PACKAGING}+musa.1 found={PACKAGING} "
        "(no local label, but the pin is the +musa.1 build)"
    )
    # A pin of "2" must not accept "26.2": versions compare by component, never as strings.
    assert not gate.check_package(pkg(PACKAGING.split(".")[0][:1]))[0]


def test_metadata_mode_does_not_import():
    ok, line = gate.check_package(pkg(PACKAGING, "metadata", module="no_such_module_anywhere"))
    assert ok and line.startswith("PASS meta   packaging")


def test_spec_mode_finds_the_module_without_importing_it(tmp_path, monkeypatch):
    # A module whose import would fail: spec mode only finds it (the fork's check of torch_c_dlpack_ext).
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ok, line = gate.check_package(pkg(PACKAGING, "spec", module="explodes_on_import"))
    assert ok and line == f"PASS spec   packaging  version={PACKAGING}"
    assert "explodes_on_import" not in sys.modules
    ok, line = gate.check_package(pkg(PACKAGING, "spec", module="no_such_module_anywhere"))
    assert not ok and line == (
        f"FAIL spec   packaging  expected={PACKAGING} error=no module spec for no_such_module_anywhere"
    )
    ok, line = gate.check_package(pkg("0.0.1", "spec", module="explodes_on_import"))
    assert not ok and line == f"FAIL spec   packaging  expected=0.0.1 found={PACKAGING}"


def test_import_failure_is_a_fail_that_names_the_module():
    ok, line = gate.check_package(pkg("1.0", module="no_such_module_anywhere", name="nope"))
    assert not ok
    assert "error=import no_such_module_anywhere: ModuleNotFoundError" in line


def test_python_is_checked_against_the_platform_line_or_release():
    have = ".".join(map(str, sys.version_info[:3]))
    minor = ".".join(map(str, sys.version_info[:2]))
    assert gate.check_python(minor) == (True, f"PASS python            version={have} platform={minor}")
    assert gate.check_python(have)[0]
    other = f"{sys.version_info[0]}.{sys.version_info[1] + 1}"
    ok, line = gate.check_python(other)
    assert not ok and line.startswith(f"FAIL python            version={have} platform={other} ")
    # 3.1 is not a prefix of 3.11: versions compare by component.
    assert not gate.check_python(f"{sys.version_info[0]}.{str(sys.version_info[1])[0]}")[0] or sys.version_info[1] < 10
    out = io.StringIO()
    assert gate.run({"python": other, "packages": []}, out=out) == 1
    assert "FAIL python" in out.getvalue() and "gate result: 0 PASS, 1 FAIL" in out.getvalue()


def test_probe_compares_the_last_printed_line():
    assert gate.check_probe({"name": "p", "code": "print('x')\nprint('42')", "expect": "42"}) == (
        True,
        "PASS probe  p result=42",
    )
    ok, line = gate.check_probe({"name": "p", "code": "print(41)", "expect": "42"})
    assert not ok and line == "FAIL probe  p expected=42 found=41"


def test_write_audit_names_files_created_under_site_packages(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "writer").mkdir(parents=True)
    (site / "writer" / "__init__.py").write_text(
        textwrap.dedent("""
        import os
        here = os.path.dirname(__file__)
        os.symlink("target.json", os.path.join(here, "alias.json"))
        with open(os.path.join(here, "cache.bin"), "w") as fh:
            fh.write("x")
    """)
    )
    monkeypatch.syspath_prepend(str(site))
    audit = gate.WriteAudit([str(site)])
    monkeypatch.setattr(gate, "AUDIT", audit)
    gate._audited("writer", gate.check_import, {"module": "writer", "dist": "writer"})
    lines = gate.write_failures()
    assert len(lines) == 1 and lines[0].startswith("FAIL write  writer")
    assert f"{site}/writer/alias.json (os.symlink)" in lines[0]
    assert f"{site}/writer/cache.bin (open)" in lines[0]
    # Reading is not writing.
    audit.writes.clear()
    gate._audited("reader", lambda: open(site / "writer" / "__init__.py").read())
    assert gate.write_failures() == []


def test_dangling_symlinks_are_found(tmp_path, monkeypatch):
    (tmp_path / "ok").write_text("")
    os.symlink(tmp_path / "ok", tmp_path / "good")
    os.symlink(tmp_path / "missing", tmp_path / "bad")
    monkeypatch.setattr(gate, "site_dirs", lambda: [str(tmp_path)])
    assert gate.dangling_symlinks() == [f"FAIL link   {tmp_path}/bad -> {tmp_path}/missing (dangling symlink)"]


def test_run_counts_fails_and_exits_nonzero():
    out = io.StringIO()
    rc = gate.run({"packages": [pkg(PACKAGING), pkg("0.0.1")]}, out=out)
    assert rc == 1
    assert out.getvalue().splitlines()[-1] == "gate result: 1 PASS, 1 FAIL"


LDD = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibmusa_kernels.so => /opt/venv/lib/python3.11/site-packages/torch_musa/lib/libmusa_kernels.so (0x00007f1)
\tlibmlx5.so.1 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f3)
"""


def test_parse_ldd_separates_resolved_and_missing():
    resolved, missing = abi.parse_ldd(LDD)
    assert missing == ["libmlx5.so.1"]
    assert (
        "libmusa_kernels.so",
        "/opt/venv/lib/python3.11/site-packages/torch_musa/lib/libmusa_kernels.so",
    ) in resolved
    assert ("ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2") in resolved
    assert len(resolved) == 3


def test_elf_machine_tells_a_foreign_architecture(tmp_path):
    host = abi.elf_machine(Path(os.path.realpath(sys.executable)))
    assert host is not None
    fake = tmp_path / "aarch64.so"
    fake.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 11 + (183).to_bytes(2, "little") + b"\x00" * 40)
    assert abi.elf_machine(fake) == 183 and abi.machine_name(183) == "aarch64"
    script = tmp_path / "libfoo.so"
    script.write_text("/* GNU ld script */ INPUT(libfoo.so.1)")
    assert abi.elf_machine(script) is None


def test_library_path_expands_site(monkeypatch):
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    import sysconfig

    assert (
        abi.library_path(["{site}/torch/lib", "/usr/local/musa-5.2/lib"])
        == f"{sysconfig.get_paths()['purelib']}/torch/lib:/usr/local/musa-5.2/lib"
    )


def test_pip_check_is_one_gate_line_and_a_broken_requirement_fails_the_gate(monkeypatch):
    import subprocess

    def fake_run(cmd, **kwargs):
        assert cmd[1:] == ["-m", "pip", "check"]
        return subprocess.CompletedProcess(
            cmd, 1, "torch 2.11.0 has requirement filelock>=3.16.1, but you have filelock 3.0.\n", ""
        )

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = io.StringIO()
    assert gate.run({"pip_check": True}, out=out) == 1
    assert out.getvalue().splitlines() == [
        "FAIL pip    check      torch 2.11.0 has requirement filelock>=3.16.1, but you have filelock 3.0.",
        "gate result: 0 PASS, 1 FAIL",
    ]
    monkeypatch.setattr(
        subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "No broken requirements found.\n", "")
    )
    out = io.StringIO()
    assert gate.run({"pip_check": True}, out=out) == 0
    assert out.getvalue().splitlines()[0] == "PASS pip    check      No broken requirements found."
    out = io.StringIO()
    assert gate.run({"pip_check": True}, out=out, read_only=True) == 0  # the read-only re-run skips it
    assert out.getvalue().splitlines() == ["read-only: gate result: 0 PASS, 0 FAIL"]


def test_pip_check_passes_only_the_unmet_requirements_the_stack_allows_with_their_reason(monkeypatch):
    import subprocess

    report = (
        "vllm-musa 0.1.24 has requirement torch==2.11.0.post2+musa5.2.0, but you have torch 2.11.0.post1+musa5.2.0.\n"
        "vllm-musa 0.1.24 requires mthreads-ml-py, which is not installed.\n"
    )
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, report, ""))
    allow = [{"dist": "vllm_musa", "requires": "Torch", "reason": "the plugin pins the next train"}]
    out = io.StringIO()
    assert gate.run({"pip_check": True, "pip_check_allow": allow}, out=out) == 1
    assert out.getvalue().splitlines() == [
        "PASS pip    check      allowed: vllm-musa 0.1.24 has requirement torch==2.11.0.post2+musa5.2.0, but you "
        "have torch 2.11.0.post1+musa5.2.0. (the plugin pins the next train)",
        "FAIL pip    check      vllm-musa 0.1.24 requires mthreads-ml-py, which is not installed.",
        "gate result: 1 PASS, 1 FAIL",
    ]
    # allowing another requirement of the same distribution does not pass this one
    other = [{"dist": "vllm-musa", "requires": "torch-musa", "reason": "r"}]
    out = io.StringIO()
    assert gate.run({"pip_check": True, "pip_check_allow": other}, out=out) == 1
    assert out.getvalue().count("FAIL pip") == 2


def test_the_gate_checks_the_installer_the_stack_pins():
    import importlib.metadata as md

    have = md.version("pip")
    out = io.StringIO()
    assert gate.run({"pip": have}, out=out) == 0
    assert out.getvalue().splitlines()[0] == f"PASS pip    version    version={have}"
    out = io.StringIO()
    assert gate.run({"pip": "1.0"}, out=out) == 1
    assert out.getvalue().splitlines()[0] == f"FAIL pip    version    expected=1.0 found={have}"
