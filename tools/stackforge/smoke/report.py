"""Smoke results: one :class:`RowResult` per row, the :class:`SmokeReport` of a run, and its evidence.

A row is ``passed``, ``failed`` or ``not-run`` (with the reason: the host lacks the hardware, the server
never became ready or died before the row, the run was interrupted). ``not-run`` is never a pass: a
report is ``ok`` only when every row passed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stackforge.fslock import atomic_write

PASSED, FAILED, NOT_RUN = "passed", "failed", "not-run"
#: the exit statuses of `stackforge smoke` besides 0 (passed) and 2 (invalid input)
EXIT_FAILED, EXIT_NOT_RUN = 1, 3
SMOKE_JSON = "smoke.json"
CONTAINER_LOG = "container.log"


@dataclass
class RowResult:
    name: str
    kind: str  # preflight | readiness | chat | turns | get | log
    status: str = NOT_RUN
    reason: str | None = None
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def passed(self, **details: Any) -> RowResult:
        self.status, self.details = PASSED, {**self.details, **details}
        return self

    def failed(self, reason: str, **details: Any) -> RowResult:
        self.status, self.reason, self.details = FAILED, reason, {**self.details, **details}
        return self

    def skipped(self, reason: str) -> RowResult:
        self.status, self.reason = NOT_RUN, reason
        return self


@dataclass
class SmokeReport:
    recipe: str
    file: str
    image: str
    image_id: str | None = None
    stack: str | None = None
    target: str | None = None
    overlay: str | None = None
    hardware: dict[str, Any] = field(default_factory=dict)
    container: dict[str, Any] = field(default_factory=dict)
    rows: list[RowResult] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    error: str | None = None  # why the run stopped early (readiness, the server died, interrupted)
    evidence: str | None = None
    configuration: str | None = None  # the recipe's configuration that ran (None: the recipe declares none)
    #: vLLM's EngineDeadError lines of the container log (smoke/triage.py): {phase: shutdown|serving, line_no,
    #: line, row, context[, after]}; one while serving fails the run
    engine_dead: list[dict[str, Any]] = field(default_factory=list)
    log_marks: dict[str, Any] = field(default_factory=dict)  # where the rows and the stop sit in the log
    #: the repository the recipe's reference files are read from (None: the recipe was smoked with no checkout)
    checkout: str | None = None
    #: what the recipe asks that a run with no checkout does not check (each: the row and why)
    not_checked: list[str] = field(default_factory=list)

    @property
    def engine_died_serving(self) -> list[dict[str, Any]]:
        """The EngineDeadErrors logged while serving (before the smoke stopped the container)."""
        return [e for e in self.engine_dead if e.get("phase") == "serving"]

    @property
    def without_hardware(self) -> bool:
        """The rows ran on a host without the declared hardware (``--allow-missing-hardware``)."""
        return bool(self.hardware.get("missing") and self.hardware.get("allowed_missing"))

    @property
    def ok(self) -> bool:
        """Every row passed, on the declared hardware: the only result that vouches for the image."""
        return (
            bool(self.rows)
            and all(r.status == PASSED for r in self.rows)
            and not self.without_hardware
            and not self.engine_died_serving
        )

    @property
    def verdict(self) -> str:
        """passed (every row, on the declared hardware), failed (a row failed), or not-run: no row failed, but
        some did not run, or they ran without the declared hardware (never a pass). An EngineDeadError while
        serving fails the run even when it fell between the rows."""
        if self.ok:
            return PASSED
        return FAILED if any(r.status == FAILED for r in self.rows) or self.engine_died_serving else NOT_RUN

    @property
    def exit_code(self) -> int:
        """0 when every row passed (also when the rows ran without the hardware, as asked, and all passed);
        1 when a row failed; 3 when none failed but some did not run (e.g. no device on this host): a script
        tells "failed" from "not run" without reading smoke.json."""
        if self.ok or (
            self.without_hardware and self.verdict == NOT_RUN and all(r.status == PASSED for r in self.rows)
        ):
            return 0
        return EXIT_FAILED if self.verdict == FAILED else EXIT_NOT_RUN

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "file": self.file,
            "configuration": self.configuration,
            "image": self.image,
            "image_id": self.image_id,
            "stack": self.stack,
            "target": self.target,
            "overlay": self.overlay,
            "ok": self.ok,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "hardware": self.hardware,
            "container": self.container,
            "log": CONTAINER_LOG,
            "rows": [asdict(r) for r in self.rows],
            "engine_dead": self.engine_dead,
            "log_marks": self.log_marks,
            "checkout": self.checkout,
            "not_checked": self.not_checked,
        }

    def table(self) -> str:
        """One line per row: status, name, kind, duration, reason."""
        width = max([len(r.name) for r in self.rows] + [4])
        lines = []
        for r in self.rows:
            text = f"{r.status.upper():8} {r.name:<{width}} {r.kind:<9} {r.duration_s:6.1f} s"
            lines.append(text + (f"  {one_line(r.reason)}" if r.reason else ""))
        for e in self.engine_dead:
            status = "NOTED" if e.get("phase") == "shutdown" else "FAILED"
            lines.append(f"{status:8} {'engine':<{width}} {'log':<9} {'':>8}  {_engine_dead_line(e)}")
        died = self.engine_died_serving
        why = self.error or (
            f"every row passed, but without the declared hardware ({self.hardware['missing']}): not a hardware result"
            if self.without_hardware and self.verdict == NOT_RUN
            else f"vLLM's EngineDeadError while serving (container.log line {died[0].get('line_no')})"
            if died
            else None
        )
        if self.not_checked:
            lines.append(f"not checked (no checkout): {'; '.join(self.not_checked)}")
        name = self.recipe + (f" ({self.configuration})" if self.configuration else "")
        lines.append(f"smoke {name}: {self.verdict}" + (f" — {one_line(why)}" if why else ""))
        return "\n".join(lines)


def _engine_dead_line(entry: dict[str, Any]) -> str:
    where = f"container.log line {entry.get('line_no')}"
    if entry.get("phase") == "shutdown":
        after = f", after {entry['after']!r}" if entry.get("after") else ""
        return f"EngineDeadError during shutdown ({where}, after the stop was sent{after}): noted, not a failure"
    row = f"row {entry['row']!r}" if entry.get("row") else "between the rows"
    return f"EngineDeadError while serving ({where}, {row}): {one_line(entry.get('line'), 160)}"


def one_line(text: str | None, limit: int = 300) -> str:
    if not text:
        return ""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 3:  # the first line says what happened, the last ones (a log's tail) why
        lines = [lines[0], "…", *lines[-2:]]
    first = " | ".join(lines)
    return first if len(first) <= limit else first[: limit - 1] + "…"


def write_evidence(report: SmokeReport, outdir: Path, log: str) -> Path:
    """``smoke.json`` and ``container.log`` into ``outdir`` (created), each written whole or not at all."""
    outdir.mkdir(parents=True, exist_ok=True)
    report.evidence = str(outdir)
    atomic_write(outdir / CONTAINER_LOG, log)
    return atomic_write(outdir / SMOKE_JSON, json.dumps(report.to_json(), indent=2) + "\n")
