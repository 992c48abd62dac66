"""`stackforge recipe lint --image` against the post2 image built from the stand-ins: the image's own
`vllm serve --help=all` decides which serve flags exist, its entrypoint which env overrides are read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import musa_builds as mb
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]


def test_recipe_lint_against_the_image(post2, tmp_path):
    good = mb.stackforge("recipe", "lint", "qwen3-8b", "--image", post2.tag)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip() == f"qwen3-8b: ok (against {post2.tag})"

    text = (REPO / "recipes" / "qwen3-8b.yaml").read_text()
    assert '  --max-model-len: "4096"\n' in text
    bad = tmp_path / "qwen3-8b-typo.yaml"
    bad.write_text(
        text.replace('  --max-model-len: "4096"\n', '  --max-model-length: "4096"\n').replace(
            "ports: {api: 8000}", "ports: {api: 8000}\nenv: {GMEM: {default: '0.75', description: memory}}"
        )
    )
    line = bad.read_text().splitlines().index('  --max-model-length: "4096"') + 1
    proc = mb.stackforge("recipe", "lint", str(bad), "--image", post2.tag)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"error: {bad}:{line}:3: serve.--max-model-length: the image's vllm serve has no option" in out, out
    assert "fix: did you mean --max-model-len?" in out
    # vllm-openai's entrypoint is the vllm console script: it reads no $GMEM, so the override is dead
    assert "env.GMEM: the image's entrypoint (/" in out and "never reads $GMEM" in out, out

    missing = mb.stackforge("recipe", "lint", "qwen3-8b", "--image", run_names.image("no-such-image", "1"))
    assert missing.returncode == 2 and f"no image {run_names.image('no-such-image', '1')}" in missing.stderr


def test_the_matrix_recipes_lint_clean_against_the_image(post2):
    """The post2 matrix's recipes use vLLM's own options (quantization, speculative config, remote code, MLA
    backend): the image's `vllm serve --help=all` lists every one, for every configuration."""
    names = ["qwen3-30b-a3b-fp8", "deepseek-v2-lite", "nemotron-3.5-mtp6"]
    proc = mb.stackforge("recipe", "lint", *names, "--image", post2.tag, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and [r["recipe"] for r in report["recipes"]] == names
    assert all(r["findings"] == [] for r in report["recipes"])
