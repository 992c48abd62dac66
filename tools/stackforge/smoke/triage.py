"""vLLM's ``EngineDeadError`` in a smoke run's container log, classified by where it sits.

vLLM's API server logs the error when its output handler loses the engine (``AsyncLLM output_handler
failed.`` and a traceback ending in ``vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an
issue. See stack trace (above) for the root cause.``). Where that line sits decides what it means:

- after the smoke stopped the container (the ``docker stop`` SIGTERM; the smoke notes how many log lines
  there were just before it): vLLM tearing its engine down on the signal — ``[shutdown] Process manager: …``,
  ``[shutdown] MPClient: engine manager stopped`` — while the output handler still awaited output. Phase
  ``shutdown``: noted in the report, not a failure;
- before the stop: the engine died while serving. Phase ``serving``: the row whose requests were running
  when it was logged fails (the log lines around it in the reason); outside every row the run fails.

The row spans and the stop come from :class:`LogMarks` (line counts of the container log, taken by the run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from stackforge.smoke.report import FAILED, SmokeReport

#: The exception line of vLLM's EngineDeadError (its qualified name, or the name followed by its message);
#: not a traceback's source line (``raise EngineDeadError()``, ``except EngineDeadError:``).
ENGINE_DEAD = re.compile(r"(?<![\w.])(?<!except )(?:vllm\.v1\.engine\.exceptions\.)?EngineDeadError(?=:|\s*$)")
#: vLLM's (and uvicorn's) own lines once a shutdown runs: `[shutdown] …` (launcher, MPClient, process manager,
#: EngineCore), `Shutting down FastAPI HTTP server.`, uvicorn's `Shutting down`.
SHUTDOWN_LINE = re.compile(r"\[shutdown\]|Shutting down FastAPI HTTP server|INFO:\s+Shutting down\s*$")
SHUTDOWN, SERVING = "shutdown", "serving"
BEFORE, AFTER = 6, 2  # context lines kept around each error (before: ahead of its traceback)
TRACEBACK = 40  # the longest traceback taken whole
#: vLLM's logger tag, ``[async_llm.py:538]``: the lines of one logged traceback all carry the same one
TAG = re.compile(r"\[[\w./-]+:\d+\]")
MERGE = 3  # hits this close together are one error (a chained traceback)


@dataclass
class LogMarks:
    """Line counts of the container log: where each row started and ended, and when the stop was sent."""

    rows: dict[str, list[int]] = field(default_factory=dict)  # row name -> [first line, end) (0-based)
    stop: int | None = None  # lines before the smoke stopped the container (None: it never stopped it)

    def row_at(self, index: int) -> str | None:
        return next((name for name, (a, b) in self.rows.items() if a <= index < b), None)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "stop": self.stop}


def find(log: str, marks: LogMarks) -> list[dict[str, Any]]:
    """Each EngineDeadError of ``log``: its phase, line (1-based) and text, the row it fell in and its context."""
    lines = log.splitlines()
    out: list[dict[str, Any]] = []
    last = -MERGE - 1
    for i, text in enumerate(lines):
        if not ENGINE_DEAD.search(text):
            continue
        if i - last <= MERGE:
            last = i
            continue
        last = i
        shutdown = marks.stop is not None and i >= marks.stop
        entry: dict[str, Any] = {
            "phase": SHUTDOWN if shutdown else SERVING,
            "line_no": i + 1,
            "line": text.strip(),
            "row": None if shutdown else marks.row_at(i),
            "context": [line.rstrip() for line in lines[max(0, _block_start(lines, i) - BEFORE) : i + AFTER + 1]],
        }
        if shutdown:
            assert marks.stop is not None
            entry["after"] = next((t.strip() for t in lines[marks.stop : i] if SHUTDOWN_LINE.search(t)), None)
        out.append(entry)
    return out


def _block_start(lines: list[str], i: int) -> int:
    """Where the logged traceback that ends at line ``i`` starts: the lines before it with the same logger tag."""
    tag = TAG.search(lines[i])
    if tag is None:
        return i
    start = i
    while start > 0 and i - start < TRACEBACK and tag.group(0) in lines[start - 1]:
        start -= 1
    return start


def reason(entry: dict[str, Any]) -> str:
    """What a failed row or run says: where, and the log lines around it."""
    return f"vLLM's EngineDeadError while serving (container.log line {entry['line_no']}):\n" + "\n".join(
        entry["context"]
    )


def apply(report: SmokeReport, log: str, marks: LogMarks) -> None:
    """Record every EngineDeadError of ``log`` in ``report``; one while serving fails the row it fell in
    (the run fails by the report's verdict when it fell in no row)."""
    report.log_marks = marks.to_json()
    report.engine_dead = find(log, marks)
    rows = {r.name: r for r in report.rows}
    for entry in report.engine_dead:
        row = rows.get(entry["row"]) if entry["phase"] == SERVING and entry["row"] else None
        if row is None:
            continue
        why = reason(entry)
        row.failed(f"{row.reason}; {why}" if row.status == FAILED and row.reason else why, engine_dead=entry["line_no"])
