"""A kernel's own build environment (``kernels.<k>.build_requires``): the plan's phases, the requirement files the
context writes, the Dockerfile's stages, and the refusals (file:line)."""

from __future__ import annotations

import pytest

from stackforge.builder.context.context import assemble
from stackforge.builder.plan.plan import INSTALLER, make_plan
from stackforge.builder.plan.render import render_dockerfile
from stackforge.stack.load import load
from tests.fixtures.stack_support import assert_refused, make_root

SHA = "b" * 64
PIP_SHA = "c" * 64
# A private vendor index, a public one and an all-hashed public one; three kernels: one that names pins on each
# index (one by another spelling), one that builds in the whole environment, one that needs no pin.
STACK = f"""\
name: kenv
description: kernels with and without a build environment of their own
platform: {{os: debian12, python: "3.11", arch: x86_64}}
base: {{image: "stackforge/base:bookworm", python: python3, pip: {{version: "24.2", sha256: ["{PIP_SHA}"]}}}}
indexes:
  pub:    {{url: "https://pypi.example/simple", role: public}}
  vend:   {{url: "https://vendor.example/simple", role: vendor, deps_from: pub, private: true}}
  hashed: {{url: "https://hashed.example/simple", role: public}}
upstreams:
  lib:
    sdist: {{index: pub, name: lib, version: "1.0", sha256: "{"d" * 64}"}}
kernels:
  narrow:
    upstream: lib
    build_requires: [Torch, setuptools, six]
    run: python -m pip wheel --no-build-isolation --no-deps --wheel-dir /out/wheels .
  whole:
    upstream: lib
    run: python -m pip wheel --no-build-isolation --no-deps --wheel-dir /out/wheels .
  copy:
    upstream: lib
    build_requires: []
    run: cp -a data /out/files/data
    files: {{data: /opt/data}}
packages:
  torch:      {{version: "2.5.0", index: vend, gate: spec}}
  extra:      {{version: "2.0", index: vend}}
  setuptools: {{version: "80.9.0", index: pub}}
  idna:       {{version: "3.10", index: pub}}
  six:        {{version: "1.16.0", index: hashed, sha256: ["{SHA}"]}}
gate:
  imports: [{{module: torch, dist: torch}}]
tags:
  local: "stackforge-test/kenv:1"
targets:
  run: {{entrypoint: [python3]}}
"""


@pytest.fixture
def kenv(tmp_path):
    return load("kenv", root=make_root(tmp_path, {"kenv.yaml": STACK}))


def test_build_requires_cut_each_pin_phase_down_to_the_named_pins_in_phase_order(kenv):
    kernels = {k.name: k for k in make_plan(kenv).kernels}
    env = kernels["narrow"].build_env
    assert env is not None
    assert [(p.name, p.index, p.pins) for p in env] == [
        (INSTALLER, "pub", ["pip==24.2"]),
        ("vend-nodeps", "vend", ["torch==2.5.0"]),
        ("pub", "pub", ["setuptools==80.9.0"]),
        ("hashed", "hashed", ["six==1.16.0"]),
    ]
    # Every one --no-deps (the environment holds exactly the named pins), none checked or constrained by the
    # main phases' machinery, each named by the key that asked for it; hashes as the main phase requires them.
    assert all(p.no_deps and not p.checks_pins and p.constraints is None for p in env)
    assert {p.key for p in env} == {"kernels.narrow.build_requires"}
    assert [p.require_hashes for p in env] == [True, False, False, True]
    assert [p.requirements for p in env[1:]] == [
        "deps/buildenv-narrow/vend-nodeps.txt",
        "deps/buildenv-narrow/pub.txt",
        "deps/buildenv-narrow/hashed.txt",
    ]
    # The private index's credential reaches its own phase only, as in deps.
    assert [p.credentials for p in env] == [False, True, False, False]
    assert kernels["whole"].build_env is None
    assert [p.name for p in kernels["copy"].build_env or []] == [INSTALLER]


def test_a_locked_phase_gives_its_lock_to_the_build_environment(kenv):
    plan = make_plan(kenv, {"pub": "stacks/locks/kenv/pub.txt", "vend": "stacks/locks/kenv/vend.txt"})
    env = {p.name: p for p in next(k for k in plan.kernels if k.name == "narrow").build_env or []}
    assert env["pub"].lock == "stacks/locks/kenv/pub.txt" and env["pub"].require_hashes
    assert env["vend-nodeps"].lock == "stacks/locks/kenv/vend.txt"


def test_the_context_holds_each_build_environments_pins_with_their_phases_hashes(tmp_path, kenv):
    deps = assemble(kenv, tmp_path / "out", sources=False).context_dir / "deps"
    assert (deps / "buildenv-narrow" / "vend-nodeps.txt").read_text() == "torch==2.5.0\n"
    assert (deps / "buildenv-narrow" / "pub.txt").read_text() == "setuptools==80.9.0\n"
    assert (deps / "buildenv-narrow" / "hashed.txt").read_text() == f"six==1.16.0 \\\n    --hash=sha256:{SHA}\n"
    assert not (deps / "buildenv-copy").exists() and not (deps / "buildenv-whole").exists()
    # The main phases' files are what they were: the public phase still installs every public pin.
    assert (deps / "pub.txt").read_text() == "setuptools==80.9.0\nidna==3.10\n"


def test_the_dockerfile_starts_each_kernel_from_its_own_environment_or_deps(kenv):
    text = render_dockerfile(make_plan(kenv))
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert "FROM base AS buildenv-narrow" in stages and "FROM buildenv-narrow AS kernel-narrow" in stages
    assert "FROM deps AS kernel-whole" in stages
    assert "FROM base AS buildenv-copy" in stages and "FROM buildenv-copy AS kernel-copy" in stages
    # Defined before deps, so deps' steps are the ones the image's history keeps (stages FROM one parent share
    # it in BuildKit's Dockerfile frontend, the last defined winning); the kernel that builds in deps after it.
    deps = stages.index("FROM base AS deps")
    assert stages.index("FROM scratch AS src-lib") < stages.index("FROM base AS buildenv-narrow") < deps
    assert stages.index("FROM buildenv-copy AS kernel-copy") < deps < stages.index("FROM deps AS kernel-whole")
    narrow = text.split("AS buildenv-narrow", 1)[1].split("\nFROM ", 1)[0]
    installs = [line.strip() for line in narrow.splitlines() if "pip install" in line]
    assert installs == [
        "python -m pip install --index-url https://pypi.example/simple/ --no-deps --require-hashes "
        "-r /stackforge/deps/installer.txt",
        "python -m pip install --index-url https://vendor.example/simple/ --no-deps "
        "-r /stackforge/deps/buildenv-narrow/vend-nodeps.txt",
        "python -m pip install --index-url https://pypi.example/simple/ --no-deps "
        "-r /stackforge/deps/buildenv-narrow/pub.txt",
        "python -m pip install --index-url https://hashed.example/simple/ --no-deps --require-hashes "
        "-r /stackforge/deps/buildenv-narrow/hashed.txt",
    ]
    # The netrc secret is mounted once: in the private vendor index's step.
    assert narrow.count("--mount=type=secret,id=netrc") == 1
    runs = narrow.split("\nRUN ")[1:]
    assert [("id=netrc" in run, run.split("-r /stackforge/deps/")[1].split()[0]) for run in runs] == [
        (False, "installer.txt"),
        (True, "buildenv-narrow/vend-nodeps.txt"),
        (False, "buildenv-narrow/pub.txt"),
        (False, "buildenv-narrow/hashed.txt"),
    ]
    # No preserve record: the build environment never reaches the image or its inventory.
    assert "preserve.py" not in narrow


def _lines(**kernel: str) -> list[str]:
    body = STACK.split("kernels:\n", 1)
    head, tail = body[0], body[1].split("packages:\n", 1)[1]
    kern = ["kernels:", "  k:", "    upstream: lib", "    run: make", *(f"    {k}: {v}" for k, v in kernel.items())]
    return [*head.splitlines(), *kern, "packages:", *tail.splitlines()]


def test_a_name_that_is_not_a_pin_of_the_stack_is_refused_at_its_line(tmp_path, capsys):
    root = make_root(tmp_path)
    lines = _lines(build_requires="[setuptools, cmake]")
    n = next(i for i, line in enumerate(lines) if "build_requires" in line)
    assert_refused(capsys, root, "kenv", lines, n, "'cmake' is not a package of the stack")


def test_a_pin_named_twice_is_refused(tmp_path, capsys):
    root = make_root(tmp_path)
    lines = _lines(build_requires="[setuptools, Setuptools]")
    n = next(i for i, line in enumerate(lines) if "build_requires" in line)
    assert_refused(capsys, root, "kenv", lines, n, "'Setuptools' is listed twice")


def test_a_targets_kernel_may_not_declare_a_build_environment(tmp_path, capsys):
    root = make_root(tmp_path)
    lines = STACK.replace(
        "  run: {entrypoint: [python3]}",
        "  run:\n    entrypoint: [python3]\n    kernels:\n      tk:\n        upstream: lib\n"
        "        build_requires: [setuptools]\n        run: make",
    ).splitlines()
    n = next(i for i, line in enumerate(lines) if "build_requires: [setuptools]" in line)
    assert_refused(capsys, root, "kenv", lines, n, "a target's kernel builds in its parent image's environment")


@pytest.mark.parametrize("name", ["buildenv-x", "toolchain-x"])
def test_target_names_of_the_kernels_stages_are_reserved(tmp_path, capsys, name):
    root = make_root(tmp_path)
    lines = STACK.replace("  run: {entrypoint: [python3]}", f"  {name}: {{entrypoint: [python3]}}").splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}:"))
    assert_refused(capsys, root, "kenv", lines, n, f"target name '{name}' is reserved for a build stage")
