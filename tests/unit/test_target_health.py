"""A target's HEALTHCHECK (rendered) and its report commands (run in the built image, kept in the evidence)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.render import render_dockerfile
from stackforge.builder.records import reports
from stackforge.clients.engine import Engine
from stackforge.stack.load import StackInvalid, load


def stage(text: str, head: str) -> str:
    return next(s for s in text.split("\nFROM ") if s.startswith(head))


def test_post_stacks_declare_mate_check_as_the_healthcheck():
    stack = load("post2")
    text = render_dockerfile(make_plan(stack), {})
    line = (
        'HEALTHCHECK --interval=60s --timeout=30s --start-period=30s --retries=3 CMD ["python", "-m", "mate", "check"]'
    )
    assert line in stage(text, "final AS vllm-openai")
    assert text.count("HEALTHCHECK") == 1  # vllm-omni and default inherit it from vllm-openai
    assert stack.model.targets["vllm-openai"].reports == {
        "mate-config": "python -m mate show-config --json",
        "versions": "python -m pip list --format=freeze",
    }


def test_hostile_healthcheck_arguments_stay_one_json_word_each():
    hc = 'targets.vllm-openai.healthcheck={cmd: [sh, -c, "curl -f http://x/ \\"$HOME\\" ]]"], interval_s: 5}'
    text = render_dockerfile(make_plan(load("post2", overrides=[hc])), {})
    line = next(x for x in text.splitlines() if x.startswith("HEALTHCHECK"))
    assert line == (
        'HEALTHCHECK --interval=5s --timeout=30s --start-period=0s --retries=3 CMD ["sh", "-c", '
        '"curl -f http://x/ \\"$HOME\\" ]]"]'
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("targets.vllm-openai.healthcheck={cmd: []}", "targets.vllm-openai.healthcheck.cmd"),
        ("targets.vllm-openai.healthcheck={cmd: [x], interval_s: 0}", "targets.vllm-openai.healthcheck.interval_s"),
        ("targets.vllm-openai.healthcheck={cmd: [x], every: 5}", "unknown key 'every'"),
        ('targets.vllm-openai.healthcheck={cmd: ["a\\nb"]}', "targets.vllm-openai.healthcheck.cmd"),
        ('targets.vllm-openai.reports={"../x": "true"}', "targets.vllm-openai.reports"),
        ('targets.vllm-openai.reports={x: "a\\nb"}', "targets.vllm-openai.reports: the value of 'x' contains"),
        ('targets.vllm-openai.reports={x: ""}', "targets.vllm-openai.reports.x"),
    ],
)
def test_bad_health_values_name_the_key(override, message):
    with pytest.raises(StackInvalid) as exc:
        load("post2", overrides=[override])
    rendered = [p.render() for p in exc.value.problems]
    assert any(message in r for r in rendered), rendered


def test_reports_of_the_chain_run_parents_first():
    stack = load("post2", overrides=["targets.vllm-omni.reports={omni: vllm-omni --version}"]).model
    assert reports.chain_reports(stack, "vllm-omni") == [
        ("vllm-openai", "mate-config", "python -m mate show-config --json"),
        ("vllm-openai", "versions", "python -m pip list --format=freeze"),
        ("vllm-omni", "omni", "vllm-omni --version"),
    ]
    assert reports.chain_reports(stack, "final") == []


def fake_engine(tmp_path: Path) -> Engine:
    """The engine client over a docker CLI that records its arguments and answers like
    ``docker run --rm … sh -c CMD`` would."""
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\nfor last; do :; done\nsh -c "$last"\n')
    os.chmod(docker, stat.S_IRWXU)
    return Engine(docker=str(docker))


def test_reports_are_kept_with_exit_codes(tmp_path):
    stack = load(
        "post2", overrides=['targets.vllm-openai.reports={hello: "echo hello; echo err >&2", broken: "exit 3"}']
    ).model
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    said: list[str] = []
    records = reports.write_evidence(stack, "vllm-openai", fake_engine(tmp_path), "img:1", evidence, said.append)
    assert [(r["name"], r["exit_code"], r["file"]) for r in records] == [
        ("hello", 0, "reports/hello.txt"),
        ("broken", 3, "reports/broken.txt"),
    ]
    assert (evidence / "reports" / "hello.txt").read_text() == "hello\nerr\n"
    assert json.loads((evidence / "reports.json").read_text()) == records
    assert said == [f"stackforge: report broken of target vllm-openai exited 3 (kept in {evidence}/reports/broken.txt)"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "run --rm --network=none --entrypoint sh img:1 -c echo hello; echo err >&2"
