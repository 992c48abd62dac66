"""Kernel trees, in-tree series, post-install patches, steps and requirement rules: schema, grammar
refusals (file:line), plan and Dockerfile shape, and the in-image scripts run on this host."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_stage_history_order import every_violation

from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.render import SOURCE_IMAGES, render_dockerfile
from stackforge.errors import UserError
from stackforge.patches.series import in_tree_series
from stackforge.stack import load as stackload
from stackforge.stack.installed import export_order
from tests.fixtures import image_scripts
from tests.fixtures import musa_standins as ms
from tests.fixtures.stack_support import RootSpec, assert_refused, locate, run_cli

IMAGES = SOURCE_IMAGES

KERN = """\
name: kern
inherits: post2
upstreams:
  vllm:
    patches: null
    patches_from: {upstream: vllm_musa, path: patches/vllm, order: series}
kernels:
  vllm_musa:
    trees: {vllm: third_party/vllm}
post_install:
  - {dist: mate, below: "0.2.6", patch: patches/installed/mate.patch}
  - {dist: flash_mla, when: "<0.2.8", patch: patches/installed/flash.patch}
steps:
  mate-aot:
    env:
      MATE_MUSA_ARCH_LIST: "{{ platform.gpu_arch | map('musa_arch') | join(',') }}"
    run: python -m mate.aot --all
rules:
  requires:
    - {name: torch_musa, dist: torch_musa, min: "2.7"}
    - {name: MUSA Toolkit, command: "mcc --version", min: "4.3.6"}
"""


def load(file, name, *overrides):
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


post_install = load(IMAGES / "installed" / "post_install.py", "stackforge_image_post_install")
gate = image_scripts.load("gate")


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(stack_files={"kern.yaml": KERN})


def test_plan_and_dockerfile_carry_every_new_key(root):
    stack = stackload.load("kern", root=root)
    plan = make_plan(stack)
    kernel = next(k for k in plan.kernels if k.name == "vllm_musa")
    assert kernel.trees == {"vllm": "third_party/vllm", "flashinfer": "third_party/flashinfer"}
    assert [(p.key, p.dist, p.specifier, p.expect) for p in plan.post_install] == [
        ("post_install[0]", "mate", "<0.2.6", "skipped"),  # the stack pins mate 0.2.7
        ("post_install[1]", "flash_mla", "<0.2.8", "applied"),
    ]
    assert [(s.name, s.env, s.run) for s in plan.steps] == [
        (
            "mate-aot",
            {"MAX_JOBS": "2", "CARGO_BUILD_JOBS": "4", "MATE_MUSA_ARCH_LIST": "3.1"},
            "python -m mate.aot --all",
        )
    ]
    assert plan.gate["requires"][1] == {
        "name": "MUSA Toolkit",
        "dist": None,
        "command": "mcc --version",
        "min": "4.3.6",
    }
    assert plan.gate["post_install_report"] == "/stackforge/installed/report.txt"
    text = render_dockerfile(plan)
    assert (
        "COPY --from=src-vllm / /stackforge/src/vllm_musa/third_party/vllm\n"
        "COPY --from=src-flashinfer / /stackforge/src/vllm_musa/third_party/flashinfer\n"
        "WORKDIR /stackforge/src/vllm_musa\n" in text
    )
    assert "FROM deps AS installed\n" in text and "FROM installed AS gate-env\n" in text
    assert not every_violation(text)  # each image's history its own
    assert "RUN python /stackforge/installed/post_install.py /stackforge/installed/post_install.json\n" in text
    assert (
        "RUN export PIP_NO_INDEX=1 GIT_ALLOW_PROTOCOL=file MAX_JOBS=2 CARGO_BUILD_JOBS=4 MATE_MUSA_ARCH_LIST=3.1; \\\n"
        "    python -m mate.aot --all\n" in text
    )
    # the upstream carrying the series is exported (and patched) first
    assert export_order(stack.model) == ["vllm_musa", "vllm", "flashinfer", "vllm_omni"]


def test_a_stack_without_the_keys_renders_as_before(root):
    text = render_dockerfile(make_plan(stackload.load("post2", root=root)))
    assert "AS installed" not in text and "FROM deps AS gate-env\n" in text


def test_step_env_values_are_shell_quoted(root):
    stack = stackload.load("kern", root=root, overrides=["steps.mate-aot.env.MATE_MUSA_ARCH_LIST=3.1; rm -rf /"])
    assert "MATE_MUSA_ARCH_LIST='3.1; rm -rf /'; \\\n" in render_dockerfile(make_plan(stack))


@pytest.mark.parametrize(
    ("line_has", "value", "message"),
    [
        ("trees:", "{vllm: ../vllm}", "'../vllm' is not a relative path"),
        ("trees:", "{vllm: .}", "'.' is the kernel's own tree"),
        ("trees:", "{vllm: /abs}", "'/abs' is not a relative path"),
        ("trees:", "{vlm: third_party/vllm}", "kernels.vllm_musa.trees.vlm: unknown upstream 'vlm'"),
        ("trees:", "{vllm_musa: x}", "'vllm_musa' is this kernel's own tree"),
        ("patches_from:", "{upstream: vllm_musa, path: ../x}", "'../x' is not a relative path"),
        ("patches_from:", "{upstream: musa, path: patches/vllm}", "patches_from.upstream: unknown upstream 'musa'"),
        ("patches_from:", "{upstream: vllm, path: patches/vllm}", "an upstream cannot carry its own series"),
        (
            "- {dist: mate",
            '{dist: mate, below: "0.2.6", when: "<1", patch: p.patch}',
            "exactly one of 'below' or 'when'",
        ),
        ("- {dist: mate", "{dist: mate, when: '<0.2.6; rm', patch: p.patch}", "is not a version specifier"),
        (
            "- {dist: mate",
            '{dist: matte, below: "0.2.6", patch: p.patch}',
            "post_install.0.dist: unknown package 'matte'",
        ),
        ("- {dist: mate", '{dist: mate, below: "0.2.6", patch: ../p.patch}', "'../p.patch' is not a relative path"),
        ("- {name: torch_musa", '{name: torch_musa, min: "2.7"}', "exactly one of 'dist' or 'command'"),
        ("- {name: torch_musa", '{name: "a;b", dist: torch_musa, min: "2.7"}', "not a name such as"),
        ("- {name: torch_musa", '{name: t, dist: torch_musa, min: ">=2.7"}', "is a range"),
        ("run: python -m", '"a\\nb"', "steps.mate-aot.run: contains a newline"),
    ],
)
def test_bad_values_are_refused_with_file_and_line(root, capsys, line_has, value, message):
    path = root / "stacks" / "kern.yaml"
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line_has in line)
    indent, key = lines[n][: len(lines[n]) - len(lines[n].lstrip())], lines[n].strip()
    if key.startswith("- "):
        lines[n] = f"{indent}- {value}"
    else:
        lines[n] = f"{indent}{key.split(':', 1)[0]}: {value}"
    assert_refused(capsys, root, "kern", lines, n, message)


def test_a_cycle_of_carried_series_is_refused(root, capsys):
    # Both series keys together are fine: the carried series first, the repository's own on top.
    rc, _, err = run_cli(capsys, root, "show", "kern", "--set", "upstreams.vllm.patches=patches/vllm")
    assert rc == 0, err
    over = "upstreams.vllm_musa.patches_from={upstream: vllm, path: p}"
    rc, _, err = run_cli(capsys, root, "show", "kern", "--set", over)
    assert rc == 2 and "series depend on each other: vllm -> vllm_musa -> vllm" in err


def test_in_tree_series_directory_missing_or_escaping_names_the_key(root, tmp_path):
    stack = stackload.load("kern", root=root)
    src = tmp_path / "src"
    (src / "vllm_musa" / "patches" / "vllm").mkdir(parents=True)
    with pytest.raises(UserError) as exc:
        in_tree_series(stack, "vllm", src)
    line, _ = locate(root / "stacks" / "kern.yaml", "patches_from:", "path")
    assert exc.value.message.startswith(
        "upstreams.vllm.patches_from.path: patches/vllm has no series file in vllm_musa"
    )
    assert exc.value.line == line
    (src / "vllm_musa" / "patches" / "vllm").rmdir()
    (src / "vllm_musa" / "patches" / "vllm").symlink_to(tmp_path)
    with pytest.raises(UserError, match="leaves vllm_musa's tree"):
        in_tree_series(stack, "vllm", src)


def test_a_series_without_a_series_file_is_taken_in_file_name_order(root, tmp_path):
    """vllm-musa keeps vLLM's series as vllm_musa/patches/series/*.patch, ordered by name (no series file)."""
    stack = stackload.load("kern", root=root, overrides=["upstreams.vllm.patches_from.order=name"])
    src = tmp_path / "src"
    carrier = src / "vllm_musa" / "patches" / "vllm"
    carrier.mkdir(parents=True)
    for name in ("0002-B.patch", "0010-C.patch", "0001-A.patch", "README.md"):
        (carrier / name).write_text(f"{name}\n")
    found = in_tree_series(stack, "vllm", src)
    assert found == src.parent / ".series" / "vllm"
    listed = [l for l in (found / "series").read_text().splitlines() if not l.startswith("#")]
    assert listed == ["0001-A.patch", "0002-B.patch", "0010-C.patch"]
    assert sorted(p.name for p in carrier.iterdir()) == ["0001-A.patch", "0002-B.patch", "0010-C.patch", "README.md"]
    for p in carrier.glob("*.patch"):
        p.unlink()
    with pytest.raises(UserError, match=r"upstreams.vllm.patches_from.path: no \*.patch files in vllm"):
        in_tree_series(stack, "vllm", src)


# --------------------------------------------------------------------------- images/installed/post_install.py


def spec_for(tmp_path: Path, dist: str, specifier: str, expect: str, patch_text: str) -> list[dict]:
    (tmp_path / "01.patch").write_text(patch_text)
    digest = hashlib.sha256(patch_text.encode()).hexdigest()
    return [
        {
            "key": "post_install[0]",
            "dist": dist,
            "specifier": specifier,
            "patch": "patches/installed/x.patch",
            "file": "01.patch",
            "expect": expect,
            "sha256": digest,
        }
    ]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages holding the stand-in mate at 0.2.5, as its wheel installs it."""
    site = tmp_path / "site"
    (site / "mate").mkdir(parents=True)
    (site / "mate" / "__init__.py").write_text('__version__ = "0.2.5"\n')
    info = site / "mate-0.2.5.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mate\nVersion: 0.2.5\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_post_install_applies_for_a_matching_version(tmp_path, site):
    spec = spec_for(tmp_path, "mate", "<0.2.6", "applied", ms.mate_patch("0.2.5"))
    failed, lines = post_install.run(spec, tmp_path, site)
    assert failed == 0
    assert lines == [
        f"PASS patch  mate applied version=0.2.5 (<0.2.6) sha256={spec[0]['sha256']} files=mate/__init__.py"
    ]
    assert (site / "mate" / "__init__.py").read_text() == '__version__ = "0.2.5"\nDYNAMO_BOOL_AUGASSIGN_FIXED = True\n'


def test_post_install_skips_otherwise_and_checks_the_stacks_expectation(tmp_path, site):
    spec = spec_for(tmp_path, "mate", "<0.2.4", "skipped", ms.mate_patch("0.2.5"))
    assert post_install.run(spec, tmp_path, site) == (
        0,
        [f"PASS patch  mate skipped version=0.2.5 (not <0.2.4) sha256={spec[0]['sha256']}"],
    )
    spec[0]["expect"] = "applied"
    failed, lines = post_install.run(spec, tmp_path, site)
    assert failed == 1 and "installed 0.2.5 is skipped by <0.2.4, but the stack's pin is applied" in lines[0]
    assert "DYNAMO" not in (site / "mate" / "__init__.py").read_text()


def test_post_install_that_does_not_apply_fails_naming_the_key(tmp_path, site):
    spec = spec_for(tmp_path, "mate", "<0.2.6", "applied", ms.mate_patch("0.2.4"))
    failed, lines = post_install.run(spec, tmp_path, site)
    assert failed == 1
    assert lines == [
        "FAIL patch  mate post_install[0]: patches/installed/x.patch does not apply: "
        "hunk 1 of mate/__init__.py does not apply (at line 1)"
    ]
    assert (site / "mate" / "__init__.py").read_text() == '__version__ = "0.2.5"\n'


def test_post_install_main_writes_the_report(tmp_path, site, capsys):
    spec = spec_for(tmp_path, "mate", "<0.2.6", "applied", ms.mate_patch("0.2.5"))
    (tmp_path / "post_install.json").write_text(json.dumps(spec))
    assert post_install.main(["post_install.py", str(tmp_path / "post_install.json"), str(site)]) == 0
    assert (tmp_path / "report.txt").read_text() == capsys.readouterr().out


# --------------------------------------------------------------------------- gate.py requires


def test_requires_by_dist_and_by_command():
    assert gate.check_requires({"name": "pytest", "dist": "pytest", "command": None, "min": "1.0"})[0]
    ok, line = gate.check_requires({"name": "pytest", "dist": "pytest", "command": None, "min": "999"})
    assert not ok and line.startswith("FAIL requires pytest min=999 found=")
    py = ".".join(map(str, sys.version_info[:3]))
    cmd = f'"{sys.executable}" -V'
    assert gate.check_requires({"name": "Python", "dist": None, "command": cmd, "min": "3.8"}) == (
        True,
        f"PASS requires Python version={py} min=3.8",
    )
    assert gate.check_requires({"name": "MUSA Toolkit", "dist": None, "command": cmd, "min": "4.3.6"}) == (
        False,
        f"FAIL requires MUSA Toolkit min=4.3.6 found={py}",
    )
    ok, line = gate.check_requires({"name": "MUSA Toolkit", "dist": None, "command": "exit 3", "min": "4.3.6"})
    assert not ok and line == "FAIL requires MUSA Toolkit min=4.3.6 found=none (exit 3: exit 3)"
