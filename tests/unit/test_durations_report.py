"""The suite's time by module: the report a run writes and the modules it names when over its budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_run_over_its_budget_names_its_slowest_modules(tmp_path):
    (tmp_path / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(1.2)\n\ndef test_b():\n    pass\n"
    )
    (tmp_path / "test_fast.py").write_text("def test_c():\n    pass\n")
    out = tmp_path / "durations.json"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "STACKFORGE_DURATIONS": str(out),
           "STACKFORGE_TEST_BUDGET": "0.5"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.durations", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    data = json.loads(out.read_text())
    assert [m["module"] for m in data["modules"]] == ["test_slow.py", "test_fast.py"]
    assert data["modules"][0]["tests"] == 2 and data["modules"][0]["seconds"] >= 1.2
    assert data["budget_seconds"] == 0.5 and data["wall_seconds"] >= 1.2
    assert "over the test budget" in proc.stdout and "test_slow.py" in proc.stdout.split("over the test budget")[1]


def test_a_parallel_run_reports_every_workers_modules_once(tmp_path):
    """Under pytest-xdist the process that started the run writes the report from every worker's reports: each
    module once, with the worker that ran it, and the workers' busy seconds."""
    for name, body in (("test_one.py", "time.sleep(0.8)"), ("test_two.py", "time.sleep(0.8)"), ("test_three.py", "")):
        (tmp_path / name).write_text(f"import time\n\ndef test_a():\n    {body or 'pass'}\n\ndef test_b():\n    pass\n")
    out = tmp_path / "durations.json"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "STACKFORGE_DURATIONS": str(out),
           "STACKFORGE_TEST_BUDGET": "0.5"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.durations",
         "-n", "2", "--dist", "loadfile", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    data = json.loads(out.read_text())
    modules = {m["module"]: m for m in data["modules"]}
    assert sorted(modules) == ["test_one.py", "test_three.py", "test_two.py"]
    assert all(m["tests"] == 2 for m in modules.values())
    assert modules["test_one.py"]["seconds"] >= 0.8 and modules["test_two.py"]["seconds"] >= 0.8
    assert {m["worker"] for m in modules.values()} == {"gw0", "gw1"} == set(data["workers"])
    busy = sum(data["workers"].values())
    assert abs(busy - sum(m["seconds"] for m in modules.values())) < 0.2
    assert proc.stdout.count("over the test budget") == 1 and "test_one.py" in proc.stdout
