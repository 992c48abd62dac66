"""What a pytest run reported: its summary line, its JUnit XML and its ``-rA`` short summary, read as pytest
writes them; and how a run's counts compare with a slice's declared ones (the tests that moved).

The summary line (``== 60 passed, 4 xfailed in 3.21s ==``, ``no tests ran in 0.01s``, with ``-q`` without the
rules) gives the counts pytest vouches for; the JUnit XML (``-o junit_family=xunit1``: each ``<testcase>`` names
its ``file``) gives each test's outcome: no child is passed, ``<failure>`` failed, ``<error>`` error,
``<skipped type="pytest.xfail">`` xfailed, any other ``<skipped>`` skipped. A non-strict XPASS is a bare
``<testcase>`` in JUnit too; the ``XPASS <node id>`` line of ``-rA`` tells it from a pass.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from stackforge.stack.model import OUTCOMES

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(r"^=*\s*(?P<body>\S.*?) in (?P<secs>\d+(?:\.\d+)?)s(?: \(\d+:\d\d:\d\d\))?\s*=*\s*$")
PART = re.compile(r"^(\d+) ([a-z]+)$")
#: pytest's plural and singular words, as the outcome each counts.
WORDS = {
    "passed": "passed",
    "failed": "failed",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
    "error": "error",
    "errors": "error",
    "deselected": "deselected",
    "warning": "warnings",
    "warnings": "warnings",
    "rerun": "rerun",
}
MAX_LISTED = 20


@dataclass
class Summary:
    """pytest's last line: the count of each outcome (all six, 0 when not printed), deselected, warnings."""

    counts: dict[str, int]
    deselected: int = 0
    warnings: int = 0
    duration_s: float = 0.0
    line: str = ""


def parse_summary(output: str) -> Summary | None:
    """The summary line of pytest's output (the last line that reads as one), or None when there is none."""
    for raw in reversed(output.splitlines()):
        line = ANSI.sub("", raw).strip()
        m = SUMMARY.match(line)
        if not m:
            continue
        found = _parts(m.group("body"))
        if found is None:
            continue
        counts = {o: found.get(o, 0) for o in OUTCOMES}
        return Summary(counts, found.get("deselected", 0), found.get("warnings", 0), float(m.group("secs")), line)
    return None


def _parts(body: str) -> dict[str, int] | None:
    if body == "no tests ran":
        return {}
    out: dict[str, int] = {}
    for part in body.split(", "):
        m = PART.match(part.strip())
        if not m or m.group(2) not in WORDS:
            return None
        key = WORDS[m.group(2)]
        out[key] = out.get(key, 0) + int(m.group(1))
    return out


@dataclass
class TestCase:
    """One test as the JUnit XML (and ``-rA``) report it."""

    __test__ = False  # not a pytest test class

    id: str  # the pytest node id (file::Class::name[param])
    outcome: str  # one of OUTCOMES
    message: str | None = None
    duration_s: float = 0.0


def node_id(case: ET.Element) -> str:
    """The pytest node id of a ``<testcase>``: ``file::Class::name`` from xunit1's ``file`` attribute and the dotted
    classname (module path, then classes), else ``classname::name``."""
    classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
    if file:
        module = file.removesuffix(".py").replace("/", ".")
        rest = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
        return "::".join(p for p in (file, *rest.split("."), name) if p)
    return f"{classname}::{name}" if classname else name


def _outcome(case: ET.Element) -> tuple[str, str | None]:
    for child in case:
        if child.tag == "failure":
            return "failed", child.get("message")
        if child.tag == "error":
            return "error", child.get("message")
        if child.tag == "skipped":
            kind = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
            return kind, child.get("message")
    return "passed", None


def xpassed_ids(output: str) -> list[str]:
    """The text after ``XPASS`` on each line of ``-rA``'s short test summary (the node id, ``- reason`` after it)."""
    return [ANSI.sub("", line).strip()[len("XPASS ") :] for line in output.splitlines() if line.startswith("XPASS ")]


def parse_junit(text: str, output: str = "") -> list[TestCase]:
    """Every ``<testcase>`` of pytest's JUnit XML with its outcome; a bare one that ``-rA`` lists as XPASS is
    xpassed. Raises ``ValueError`` when the text is not JUnit XML (a document type or entity declaration, which
    pytest never writes, included: the XML comes from the image)."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise ValueError("the JUnit XML declares a DTD or entities, which pytest never writes; refused")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"the JUnit XML does not parse: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"the JUnit XML's root is <{root.tag}>, not <testsuites>")
    xpass = xpassed_ids(output)
    cases = []
    for case in root.iter("testcase"):
        ident = node_id(case)
        outcome, message = _outcome(case)
        if outcome == "passed" and any(x == ident or x.startswith(ident + " - ") for x in xpass):
            outcome = "xpassed"
        try:
            duration = float(case.get("time") or 0)
        except ValueError:
            duration = 0.0
        cases.append(TestCase(ident, outcome, message, round(duration, 3)))
    return cases


def junit_counts(cases: list[TestCase]) -> dict[str, int]:
    return {o: sum(c.outcome == o for c in cases) for o in OUTCOMES}


@dataclass
class Comparison:
    """A run's counts against the declared ones: the outcomes whose count differs, with the tests in each, and
    the tests whose outcome changed since the previous result of the same slice."""

    differs: dict[str, dict[str, object]] = field(default_factory=dict)  # outcome -> {expected, got, tests}
    changed: list[dict[str, str]] = field(default_factory=list)  # {test, was, now}

    @property
    def ok(self) -> bool:
        return not self.differs

    def lines(self) -> list[str]:
        """What moved, one line per outcome and per changed test, for people."""
        out = []
        for outcome, d in self.differs.items():
            tests = list(d["tests"])  # type: ignore[call-overload]
            shown = ", ".join(tests[:MAX_LISTED]) + (
                f" … (+{len(tests) - MAX_LISTED})" if len(tests) > MAX_LISTED else ""
            )
            out.append(f"{outcome}: {d['got']}, expected {d['expected']}" + (f" — {shown}" if shown else ""))
        out += [f"{c['test']}: {c['was']} → {c['now']}" for c in self.changed[:MAX_LISTED]]
        return out


def compare(
    expected: dict[str, int], counts: dict[str, int], cases: list[TestCase], previous: dict[str, str] | None = None
) -> Comparison:
    """``counts`` (the summary's) against ``expected``; the tests of each differing outcome from ``cases``; and,
    given the previous run's ``{test: outcome}``, every test whose outcome changed (new tests and gone ones too)."""
    result = Comparison()
    for outcome in OUTCOMES:
        want, got = expected.get(outcome, 0), counts.get(outcome, 0)
        if want != got:
            tests = [c.id for c in cases if c.outcome == outcome]
            result.differs[outcome] = {"expected": want, "got": got, "tests": tests}
    if previous is not None:
        now = {c.id: c.outcome for c in cases}
        for test in sorted(set(previous) | set(now)):
            was, new = previous.get(test, "absent"), now.get(test, "absent")
            if was != new:
                result.changed.append({"test": test, "was": was, "now": new})
    return result
