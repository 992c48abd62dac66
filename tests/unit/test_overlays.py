"""Overlays without an engine: the schema and its refusals with file:line, the checked-in jev overlay, the host
checks (file hashes), a range's changed files (and the refusal of a patch outside the installed package), the
rendered Dockerfile, and the install script on a real site directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.builder.plan.render import SOURCE_IMAGES
from stackforge.errors import UserError
from stackforge.overlay import build as ob
from stackforge.overlay import range as ranges
from stackforge.overlay.load import check_files, load_overlay
from stackforge.recipes.lint import reads_env
from stackforge.stack.load import load
from tests.fixtures.stack_support import RootSpec

REPO = Path(__file__).resolve().parents[2]
JEV = REPO / "overlays" / "jev"


@pytest.fixture
def root_spec() -> RootSpec:
    """A repository holding the stacks, patches and the jev overlay, to edit freely."""
    return RootSpec(parts=("stacks", "patches", "overlays"))


def problems(root: Path, name: str = "jev") -> list[UserError]:
    with pytest.raises(UserError) as info:
        load_overlay(root, name)
    return getattr(info.value, "problems", [info.value])


def edit(root: Path, old: str, new: str) -> int:
    """Replace text in jev's overlay.yaml; returns the 1-based line of the new text."""
    path = root / "overlays" / "jev" / "overlay.yaml"
    text = path.read_text()
    assert old in text, old
    text = text.replace(old, new, 1)
    path.write_text(text)
    return text[: text.index(new)].count("\n") + 1


def test_the_jev_overlay_loads_and_its_files_match():
    ov = load_overlay(REPO, "jev")
    assert ov.model.base.stack == "post2" and ov.model.base.target == "vllm-openai"
    assert set(ov.model.env) == {
        "MODEL",
        "SERVED_NAME",
        "PORT",
        "API_PORT",
        "CANVAS",
        "DENOISE_STEPS",
        "GMEM",
        "MAX_LEN",
        "BACKEND",
    }
    assert set(check_files(ov)) == {"/opt/jev/interposer.py", "/opt/jev/entrypoint.sh"}
    entrypoint = (JEV / "files" / "entrypoint.sh").read_text()
    assert all(reads_env(entrypoint, name) for name in ov.model.env)
    for flag in (
        "--served-model-name",
        "--port",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--attention-backend",
        "--diffusion-config",
    ):
        assert flag in entrypoint
    proc = subprocess.run(["sh", "-n", str(JEV / "files" / "entrypoint.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_recipe_agrees_with_the_overlay():
    import yaml

    recipe = yaml.safe_load((REPO / "recipes" / "diffusion-gemma.yaml").read_text())
    ov = load_overlay(REPO, "jev").model
    assert recipe["image"]["overlay"] == "jev"
    assert {k: v["default"] for k, v in recipe["env"].items()} == {k: v.default for k, v in ov.env.items()}
    assert recipe["ports"] == ov.ports


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("base: {stack: post2, target: vllm-openai}", "base: {image: 'registry.example/vllm:jev'}", "is not pinned"),
        ("base: {stack: post2, target: vllm-openai}", "base: {stack: post2}", "write {stack: NAME, target: NAME}"),
        ("    dest: /opt/jev/interposer.py", "    dest: /opt/jev/../etc/passwd", "is not an absolute file path"),
        ("    dest: /opt/jev/interposer.py", "    dest: /stackforge/overlay/x", "stackforge's own records"),
        ("  - src: files/interposer.py", "  - src: ../jev/files/interposer.py", "is not a file path relative"),
        ('    mode: "0644"', "    mode: 644", "was read as a number"),
        ('    mode: "0644"', '    mode: "0999"', "is not a file mode"),
        ('  PORT: {default: "8000"', "  PORT: {default: 8000", "was read as a number"),
        ("  GMEM: {", "  G MEM: {", "G MEM"),
        ("ports: {api: 8000, interposer: 18011}", "ports: {api: 8000, interposer: 8000}", "is also ports.api"),
        ("  com.mthreads.vllm.overlay:", "  Com.Mthreads:", "Com.Mthreads"),
        ("description: post2", "descripton: post2", "unknown key 'descripton'"),
    ],
)
def test_refusals_name_the_file_and_line(root, old, new, message):
    line = edit(root, old, new)
    found = problems(root)
    assert any(message in p.message for p in found), [p.render() for p in found]
    hit = next(p for p in found if message in p.message)
    assert hit.file == "overlays/jev/overlay.yaml" and hit.line == line, hit.render()
    assert hit.exit_code == 2


def test_an_undeclared_range_directory_is_refused(root):
    (root / "overlays" / "jev" / "patches" / "vllm_musa").mkdir()
    (root / "overlays" / "jev" / "patches" / "vllm_musa" / "series").write_text("")
    found = problems(root)
    assert "overlays/jev/patches/vllm_musa/ is not declared under patches:" in found[0].message


def test_a_file_whose_sha256_differs_is_named_with_its_key(root):
    (root / "overlays" / "jev" / "files" / "interposer.py").write_text("print('changed')\n")
    ov = load_overlay(root, "jev")
    with pytest.raises(UserError) as info:
        check_files(ov)
    err = info.value
    text = (root / "overlays" / "jev" / "overlay.yaml").read_text().splitlines()
    assert err.line == text.index("    sha256: " + ov.model.files[0].sha256) + 1
    assert "files.0.sha256: overlays/jev/files/interposer.py has sha256" in err.message
    assert "write sha256:" in (err.fix or "")


def test_the_range_changes_files_of_the_installed_package_only(root):
    ov = load_overlay(root, "jev")
    assert [p for p, _ in ranges.changed_paths(ov, "vllm")] == [
        "vllm/entrypoints/jev/__init__.py",
        "vllm/entrypoints/jev/canvas.py",
    ]
    rdir = root / "overlays" / "jev" / "patches" / "vllm"
    bad = "0003-Kernels-tune-the-canvas-kernel.patch"
    (rdir / bad).write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: stackforge maintainers <maintainers@stackforge.invalid>\n"
        "Date: Mon, 30 Nov 2026 00:00:00 +0000\n"
        "Subject: [PATCH] Kernels: tune the canvas kernel\n\n"
        "A compiled kernel changes.\n\n"
        "diff --git a/csrc/canvas.cu b/csrc/canvas.cu\n"
        "--- a/csrc/canvas.cu\n+++ b/csrc/canvas.cu\n"
        "@@ -1 +1 @@\n-int steps = 48;\n+int steps = 64;\n"
    )
    with (rdir / "series").open("a") as fh:
        fh.write(bad + "\n")
    with pytest.raises(UserError) as info:
        ranges.changed_paths(ov, "vllm")
    err = info.value
    assert f"patches/vllm/{bad} changes csrc/canvas.cu, which is outside the installed package vllm" in err.message
    assert err.file == str(rdir / bad) and err.line == 8
    assert "needs a stack to rebuild it" in (err.fix or "")


def test_tags_labels_and_the_dockerfile_render_in_the_sandbox(root):
    loaded = load("post2", root=root)
    ov = load_overlay(root, "jev")
    assert ob.local_ref(loaded, ov) == "vllm-musa:v0.28.0-torch2.11.0.post2-jev"
    ref = ob.publish_ref(loaded, ov, "registry.example/team", "20270105", 3)
    assert str(ref) == "registry.example/team/vllm/vllm-openai:jev-v0.28.0-5.2.0-torch2.11.0.post2-20270105-r3"
    base = ob.BaseImage("vllm-musa:base", "sha256:" + "a" * 64, None, "post2", "vllm-openai", layers=23)
    changed = {"vllm": [ranges.Changed("vllm", "vllm/entrypoints/jev/canvas.py", "0002-x.patch", "b" * 64)]}
    labels = ob.overlay_labels(loaded, ov, base, changed)
    assert labels["org.stackforge.overlay.base"] == base.image_id
    assert labels["org.stackforge.base.layers"] == "23"  # the publisher leaves the base's layers as they are
    assert labels["org.stackforge.overlay.range.vllm"] == ranges.range_hash(ov, "vllm")
    data = {"packages": ["vllm"], "files": [{"path": "vllm/entrypoints/jev/canvas.py"}]}
    text = ob.render_dockerfile(ov, ob.template_view(loaded, ov, base, data, labels), root)
    assert text.startswith("# Rendered by stackforge from overlays/jev/overlay.yaml")
    assert "\nFROM vllm-musa:base\n" in text
    assert "\nCOPY files/entrypoint /opt/jev/entrypoint.sh\n" in text
    assert '\nENV MODEL="google/diffusiongemma-26B-A4B-it" \\\n' in text
    assert "\nEXPOSE 8000 18011\n" in text
    assert '\nENTRYPOINT ["/opt/jev/entrypoint.sh"]\n' in text

    edit(root, '  local: "vllm-musa:', '  local: "{{ overlay.name.__class__ }}vllm-musa:')
    with pytest.raises(UserError) as info:
        ob.local_ref(loaded, load_overlay(root, "jev"))
    assert info.value.file == "overlays/jev/overlay.yaml" and "template refused" in info.value.message


def test_a_value_with_a_dollar_stays_literal(root):
    edit(root, "BACKEND: {default: TRITON_ATTN", "BACKEND: {default: '$(reboot) \"x\"'")
    loaded, ov = load("post2", root=root), load_overlay(root, "jev")
    base = ob.BaseImage("vllm-musa:base", "sha256:" + "a" * 64, None)
    text = ob.render_dockerfile(ov, ob.template_view(loaded, ov, base, {"packages": [], "files": []}, {}), root)
    assert 'BACKEND="\\$(reboot) \\"x\\""' in text


def test_the_install_script_replaces_files_in_site_packages_and_checks_them(tmp_path):
    site = tmp_path / "site"
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("__version__ = '1.0'\n")
    (site / "pkg" / "sub" / "old.py").write_text("gone = True\n")
    top = tmp_path / "overlay"
    (top / "range" / "pkg" / "sub").mkdir(parents=True)
    new = "VALUE = 42\n"
    (top / "range" / "pkg" / "sub" / "new.py").write_text(new)
    import hashlib

    manifest = {
        "overlay": "t",
        "packages": ["pkg"],
        "files": [
            {
                "upstream": "pkg",
                "path": "pkg/sub/new.py",
                "patch": "0001-a.patch",
                "sha256": hashlib.sha256(new.encode()).hexdigest(),
            },
            {"upstream": "pkg", "path": "pkg/sub/old.py", "patch": "0002-b.patch", "sha256": None},
        ],
        "extra": [],
    }
    (top / "manifest.json").write_text(json.dumps(manifest))
    script = SOURCE_IMAGES / "overlay" / "install.py"
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(script), str(top)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "pkg" / "sub" / "new.py").read_text() == new and not (site / "pkg" / "sub" / "old.py").exists()
    assert "PASS import pkg version=1.0" in proc.stdout
    check = subprocess.run([sys.executable, str(script), "--check", str(top)], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout
    (site / "pkg" / "sub" / "new.py").write_text("VALUE = 0\n")
    check = subprocess.run([sys.executable, str(script), "--check", str(top)], capture_output=True, text=True, env=env)
    assert check.returncode == 1 and "FAIL range  pkg/sub/new.py" in check.stdout


def test_recipe_lint_reads_the_overlay_entrypoint_in_the_repository(root):
    from stackforge.recipes.lint import check_repository
    from stackforge.recipes.load import load_recipe

    shutil.copytree(REPO / "recipes", root / "recipes")
    assert check_repository(load_recipe(root, "diffusion-gemma"), root) == []
    script = root / "overlays" / "jev" / "files" / "entrypoint.sh"
    script.write_text(script.read_text().replace('"$DENOISE_STEPS"', "48").replace("${DENOISE_STEPS:-48}", "48"))
    found = check_repository(load_recipe(root, "diffusion-gemma"), root)
    assert [e.message for e in found] == [
        "env.DENOISE_STEPS: the entrypoint of overlay jev (files/entrypoint.sh) never reads $DENOISE_STEPS"
    ]
    assert found[0].file == "recipes/diffusion-gemma.yaml"
