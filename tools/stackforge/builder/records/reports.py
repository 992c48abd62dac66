"""Report commands of a target (``targets.<name>.reports``), run in the built image after the gate.

Each report is one shell line run with ``docker run --rm --network=none`` (no network, the image's own
environment); its output goes to ``evidence/reports/<name>.txt`` and ``evidence/reports.json`` lists
every report with its target, command, exit code and duration. A report informs, it does not gate: a
command that fails is recorded with its exit code (and named on stderr), the build still stands. The
reports of every target the image went through run, parents first.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stackforge.clients.engine import Engine
from stackforge.clients.proc import Exceeded
from stackforge.fslock import atomic_write
from stackforge.stack.model import Stack

TIMEOUT_S = 300
MAX_OUTPUT = 1 << 20


def chain_reports(stack: Stack, target: str) -> list[tuple[str, str, str]]:
    """(target, name, command) of every report of ``target`` and its parents, parents first."""
    chain: list[str] = []
    name: str | None = target
    while name is not None and name not in chain:
        chain.append(name)
        name = stack.targets[name].from_ if name in stack.targets else None
    return [(t, n, cmd) for t in reversed(chain) for n, cmd in stack.targets[t].reports.items()]


def write_evidence(
    stack: Stack, target: str, engine: Engine, ref: str, evidence: Path, echo: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Run the reports against the image ``ref`` and keep their output in ``evidence``."""
    found = chain_reports(stack, target)
    if not found:
        return []
    outdir = evidence / "reports"
    outdir.mkdir(parents=True, exist_ok=True)
    records = []
    for owner, name, command in found:
        t = time.monotonic()
        try:
            proc = engine.run_merged(
                "run", "--rm", "--network=none", "--entrypoint", "sh", ref, "-c", command, timeout=TIMEOUT_S,
                limit=MAX_OUTPUT,
            )  # fmt: skip
            code: int | None = proc.returncode
            output = proc.stdout
        except subprocess.TimeoutExpired:
            code, output = None, f"timed out after {TIMEOUT_S} s\n"
        except Exceeded as exc:
            code, output = (
                None,
                exc.output.decode("utf-8", "replace") + f"\n[printed more than {MAX_OUTPUT} bytes: stopped]\n",
            )
        atomic_write(outdir / f"{name}.txt", output)
        records.append(
            {
                "name": name,
                "target": owner,
                "command": command,
                "exit_code": code,
                "duration_s": round(time.monotonic() - t, 2),
                "file": f"reports/{name}.txt",
            }
        )
        if code != 0 and echo is not None:
            echo(f"stackforge: report {name} of target {owner} exited {code} (kept in {outdir / (name + '.txt')})")
    atomic_write(evidence / "reports.json", json.dumps(records, indent=2) + "\n")
    return records
