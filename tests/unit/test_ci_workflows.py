"""The nightly's CI definitions keep what they should and nothing they should not: caches outside the work tree,
credentials as environment variables only (no netrc written), the history site built every night."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"
GITLAB = REPO / "docs" / "ci" / "gitlab-ci.yml"


def _scripts(doc: dict) -> str:
    text = []
    for job in doc.get("jobs", {}).values():
        text += [str(step.get("run", "")) for step in job.get("steps", [])]
    for job in (v for v in doc.values() if isinstance(v, dict) and "script" in v):
        text += [str(line) for key in ("before_script", "script", "after_script") for line in job.get(key, [])]
    return "\n".join(text)


def _env(doc: dict) -> dict:
    env = dict(doc.get("variables", {}))
    for job in doc.get("jobs", {}).values():
        env.update(job.get("env", {}))
    return env


@pytest.mark.parametrize("path", [WORKFLOW, GITLAB], ids=["github", "gitlab"])
def test_no_credential_is_written_to_disk(path):
    doc = yaml.safe_load(path.read_text())
    scripts = _scripts(doc)
    assert not re.search(r"netrc|docker login|config\.json|> *~/", scripts), scripts
    env = _env(doc)
    for var in ("STACKFORGE_REGISTRY_PASSWORD", "STACKFORGE_INDEX_MTHREADS_PASSWORD"):
        assert var in env, var
        assert "secrets." in str(env[var]) or str(env[var]).startswith("$"), var


@pytest.mark.parametrize("path", [WORKFLOW, GITLAB], ids=["github", "gitlab"])
def test_caches_and_nights_live_outside_the_work_tree_and_the_history_is_built(path):
    doc = yaml.safe_load(path.read_text())
    env = _env(doc)
    assert Path(env["STACKFORGE_CACHE"]).is_absolute() and Path(env["NIGHTS"]).is_absolute()
    scripts = _scripts(doc)
    assert 'ARGS="--out $NIGHTS/$DATE"' in scripts
    assert 'stackforge history --nights "$NIGHTS"' in scripts


def test_the_github_checkout_keeps_the_virtual_environment():
    doc = yaml.safe_load(WORKFLOW.read_text())
    (job,) = doc["jobs"].values()
    checkout = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout.get("with", {}).get("clean") is False
