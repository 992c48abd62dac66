"""Numbers out of a command's output, and their comparison with expected values under a tolerance.

Two formats (``recipes/numeric.py`` documents them for recipe authors):

- ``json``: the last non-empty line is a JSON object of name -> number;
- ``mate-log``: MATE's API log at MATE_LOGLEVEL >= 5, as ``mate/api_logging.py`` prints it: a call opens with
  ``[<time>] MATE API Call: <function>``, its result follows ``Output value:`` and ends at a line of ``=``; a
  tensor there carries ``min=``, ``max=``, ``mean=``, ``nan_count=`` and ``inf_count=`` lines. The n-th call of a
  function gives ``<function>#<n>.<stat>``; the i-th tensor of a tuple result ``<function>#<n>[<i>].<stat>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stackforge import safeio
from stackforge.recipes.numeric import Tolerance, numbers_of

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CALL = re.compile(r"MATE API Call: (\S+)")
STAT = re.compile(r"^\s*(min|max|mean|nan_count|inf_count)=(\S+)\s*$")
TUPLE_ITEM = re.compile(r"^\s*\[(\d+)\]:")


def parse_json(text: str) -> dict[str, float] | str:
    """The last non-empty line as {name: number}, or why the output has none."""
    lines = [line for line in ANSI.sub("", text).splitlines() if line.strip()]
    if not lines:
        return "the command printed nothing (expected a JSON object {name: number} on its last line)"
    try:
        data = safeio.parse_json(lines[-1], source="the command's last line")
    except safeio.Malformed:
        return f"its last line is not JSON (expected a JSON object {{name: number}}): {lines[-1][:200]!r}"
    return numbers_of(data)


def parse_mate_log(text: str) -> dict[str, float] | str:
    """The output statistics of every MATE API call in the log, or why there are none."""
    out: dict[str, float] = {}
    calls: dict[str, int] = {}
    current: str | None = None
    in_output, item = False, None
    for line in ANSI.sub("", text).splitlines():
        m = CALL.search(line)
        if m:
            calls[m.group(1)] = calls.get(m.group(1), 0) + 1
            current, in_output, item = f"{m.group(1)}#{calls[m.group(1)]}", False, None
        elif line.startswith("Output value:"):
            in_output, item = current is not None, None
        elif in_output and line.startswith("===="):
            in_output = False
        elif in_output:
            t = TUPLE_ITEM.match(line)
            if t:
                item = t.group(1)
            s = STAT.match(line)
            if s:
                try:
                    value = float(s.group(2))
                except ValueError:
                    return f"{current}: {s.group(1)}={s.group(2)!r} is not a number"
                out[f"{current}{f'[{item}]' if item is not None else ''}.{s.group(1)}"] = value
    if not out:
        return (
            "no MATE output statistics in the output (MATE prints them at MATE_LOGLEVEL >= 5 after "
            "'Output value:' for each @mate_api call)"
        )
    return out


PARSERS = {"json": parse_json, "mate-log": parse_mate_log}


@dataclass
class Comparison:
    """Each expected name's value, its delta and whether it is within the tolerance; names missing or extra."""

    rows: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def out_of_tolerance(self) -> list[dict]:
        return [r for r in self.rows if not r["ok"]]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.out_of_tolerance)

    def reason(self, what: str) -> str:
        """One line: what differs (empty when nothing does)."""
        parts = []
        bad = self.out_of_tolerance
        if bad:
            shown = ", ".join(
                f"{r['name']} {r['value']:g} vs {r['expected']:g} (delta {r['delta']:.3g})" for r in bad[:5]
            )
            parts.append(f"{len(bad)} of {len(self.rows)} value(s) out of tolerance: {shown}")
        if self.missing:
            parts.append(f"missing from {what}: {', '.join(self.missing[:10])}")
        if self.extra:
            parts.append(f"not in the reference: {', '.join(self.extra[:10])}")
        return "; ".join(parts)

    def as_details(self) -> dict:
        return {"values": self.rows, "missing": self.missing, "extra": self.extra}


def compare(values: dict[str, float], expected: dict[str, float], tolerance: Tolerance) -> Comparison:
    """``values`` against ``expected`` name by name."""
    out = Comparison()
    for name, want in expected.items():
        if name not in values:
            out.missing.append(name)
            continue
        got = values[name]
        out.rows.append(
            {"name": name, "value": got, "expected": want, "delta": got - want, "ok": tolerance.allows(got, want)}
        )
    out.extra = [name for name in values if name not in expected]
    return out
