"""`stackforge verify`: what an operator checks before trusting a pulled image.

The image's labels must name the stack and carry exactly its pins (and, when the
declaration is unchanged, its fingerprint); the lines of an upstream's image contract about the image's
configuration (labels, ENV, WORKDIR, CMD, ENTRYPOINT) must hold on the image's own config; then the
dependency gate and the ABI check run again inside the image, with a read-only root filesystem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stackforge.builder.context.context import build_dir_for
from stackforge.builder.plan import contract
from stackforge.builder.plan.plan import LABEL_NS, gate_spec
from stackforge.builder.records import evidence
from stackforge.builder.run.gate import run_gate
from stackforge.clients.engine import Engine, NoSuchImage, platform_of
from stackforge.errors import UserError
from stackforge.stack.load import fingerprint

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack

PIN = f"{LABEL_NS}.pin."
OPTION = f"{LABEL_NS}.option."


@dataclass
class Verification:
    image: str
    stack: str
    lines: list[str] = field(default_factory=list)
    failed: int = 0
    #: the publish record's ``tests`` and ``smoke`` (a published image's verify); None: no record read, or the
    #: record holds none
    record_tests: Any = None
    record_smoke: Any = None

    def add(self, ok: bool, text: str) -> None:
        self.lines.append(("PASS " if ok else "FAIL ") + text)
        self.failed += not ok

    def checked(self) -> list[dict[str, Any]]:
        """What was checked, in order, as ``{what, count, ok}`` (see :func:`checked`)."""
        return checked(self)

    def summary(self, subject: str) -> str:
        """The one line that ends a verify: what it checked and how many checks failed."""
        parts = [_part(c) for c in self.checked()]
        head = "verified" if not self.failed else "NOT verified"
        return f"{head} {subject}: {', '.join(parts)} — {self.failed} failed"


#: a verification line's first word -> what the summary calls it, and whether it counts distinct names
KINDS = {
    "index": ("index", False),
    "platform": ("platforms", True),
    "digest": ("digest", False),
    "record": ("record", False),
    "tag": ("tag", False),
    "image": ("image id", False),
    "labels": ("labels", False),
    "pin": ("pins", True),
    "option": ("options", True),
    "fingerprint": ("fingerprint", False),
    "contract": ("contract lines", True),
    "stack": ("stack files", True),
    "overlay": ("overlay", False),
    "gate": ("gate", False),
    "abi": ("abi", False),
    "signed": ("signed provenance", False),
    "sbom": ("sbom", False),
    "scan": ("scan", False),
    "rebuild": ("rebuild", False),
}
LINES = ("gate", "abi")  # counted by the output lines the check printed before its verdict


def checked(v: Verification) -> list[dict[str, Any]]:
    """Each kind of check ``v`` ran (from its PASS/FAIL lines), in the order first run: ``count`` is the pins,
    options and stack files by name, the gate's and ABI check's output lines; then the read-only gate, and the
    record's tests and smoke (``count`` None and ``ok`` None when none is recorded)."""
    found: dict[str, dict[str, Any]] = {}
    names: dict[str, set[str]] = {}
    output = 0  # indented lines since the last verdict line: a gate's output
    for line in v.lines:
        if line.startswith("  "):
            output += 1
            continue
        status, _, rest = line.partition(" ")
        if status not in ("PASS", "FAIL"):
            output = 0
            continue
        word, _, tail = rest.strip().partition(" ")
        what, by_name = KINDS.get(word, (word, False))
        entry = found.setdefault(what, {"what": what, "count": None, "ok": True})
        entry["ok"] = entry["ok"] and status == "PASS"
        if by_name and (word != "stack" or " sha256 " in tail):
            names.setdefault(what, set()).add(tail.split()[0] if tail.split() else "")
            entry["count"] = len(names[what])
        if what in LINES:
            entry["count"] = (entry["count"] or 0) + output
        output = 0
    out = list(found.values())
    if "gate" in found:
        out.append({"what": "read-only gate", "count": None, "ok": found["gate"]["ok"]})
    out.append(_recorded("tests", v.record_tests))
    out.append(_recorded("smoke", v.record_smoke))
    return out


def _recorded(what: str, value: Any) -> dict[str, Any]:
    """The record's test slices or smoke recipes: how many, and each verdict's count (None: none recorded). They
    are what the record says, not checks this verify ran: ``ok`` is False when one failed, else True when every
    one passed, else None (some did not run)."""
    if not value or not isinstance(value, (dict, list)):
        return {"what": what, "count": None, "ok": None, "verdicts": {}}
    items = list(value.values()) if isinstance(value, dict) else list(value)
    verdicts: dict[str, int] = {}
    for item in items:
        verdict = _verdict(item)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    ok = False if verdicts.get("failed") else True if verdicts.get("passed") == len(items) else None
    return {"what": what, "count": len(items), "ok": ok, "verdicts": verdicts}


def _verdict(item: Any) -> str:
    """An item's verdict as the record writes it (``verdict``, ``status``, or ``ok``)."""
    if not isinstance(item, dict):
        return "unknown"
    for key in ("verdict", "status"):
        if isinstance(item.get(key), str):
            return str(item[key])
    ok = item.get("ok")
    return "passed" if ok is True else "failed" if ok is False else "unknown"


def _count(n: int, plural: str) -> str:
    """``12 pins``, ``1 pin``, ``3 stack files``, ``1 line``."""
    return f"{n} {plural if n != 1 else plural[:-1]}"


def _part(c: dict[str, Any]) -> str:
    what, count = c["what"], c["count"]
    if what in ("tests", "smoke"):
        if count is None:
            return f"{what}: none recorded"
        unit = "slices" if what == "tests" else "recipes"
        passed = c["verdicts"].get("passed", 0)
        others = ", ".join(f"{n} {v}" for v, n in sorted(c["verdicts"].items()) if v != "passed")
        text = f"{what} {passed}/{count} {unit} passed" + (f" ({others})" if others else "")
    elif what in LINES:
        text = f"{what} {_count(count or 0, 'lines')}"
    elif count is not None:
        text = _count(count, what)
    else:
        text = what
    return text if c["ok"] is not False or what in ("tests", "smoke") else f"{text} (FAILED)"


def local_record(loaded: ResolvedStack, image_id: str | None) -> dict[str, Any] | None:
    """The publish record the build that made ``image_id`` kept (``record.json`` of its evidence, written when
    it was published); None when no build here made the image, or it was never published."""
    if not image_id:
        return None
    build, _ = evidence.find_gated(build_dir_for(loaded) / "evidence", image_id)
    path = build / "record.json" if build is not None else None
    try:
        kept = json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return None
    record = kept.get("record") if isinstance(kept, dict) else None
    return record if isinstance(record, dict) else None


def image_labels(engine: Engine, image: str) -> dict[str, str]:
    """The labels of the image to verify; one that is not in the local engine is a UserError naming it, with the
    way to get it."""
    try:
        return engine.image_labels(image)
    except NoSuchImage:
        raise UserError(
            f"image '{image}' is not in the local engine",
            file="IMAGE",
            fix=f"docker pull {image} first, or build it with stackforge build",
        ) from None


def image_config(engine: Engine, image: str) -> dict[str, Any]:
    """The image's ``Config`` (labels, Env, WorkingDir, Cmd, Entrypoint) as the engine reports it."""
    return engine.image_config(image)


def line_of(loaded: ResolvedStack, engine: Engine, image: str, attrs: Mapping[str, Any] | None = None) -> ResolvedStack:
    """The platform line of ``loaded`` the image was built for (by its config's OS and architecture; ``attrs``: the
    image's description when the caller holds it): an arm64 image is checked against the arm64 line's pins,
    fingerprint and machine. A stack with no line of that platform is checked as it is: its fingerprint and gate
    say the image is not its."""
    os_name, arch, _ = platform_of(engine.image_attrs(image) if attrs is None else attrs)
    platform = f"{os_name}/{arch}"
    try:
        return loaded.for_platform(platform)
    except UserError:
        return loaded


def stack_of(labels: dict[str, str], image: str) -> str:
    name = labels.get(f"{LABEL_NS}.stack")
    if not name:
        raise UserError(
            f"image '{image}' carries no {LABEL_NS}.stack label: it was not built by stackforge",
            file="IMAGE",
            fix="pass --stack S to check it against a stack anyway",
        )
    return name


def verify(
    loaded: ResolvedStack,
    image: str,
    labels: dict[str, str],
    engine: Engine | None = None,
    config: dict[str, Any] | None = None,
) -> Verification:
    """``config``: the image's ``Config`` (:func:`image_config`), for the contract lines about it (none checked
    without it, nor for an overlay's image)."""
    stack = loaded.model
    engine = engine or Engine()
    v = Verification(image, stack.name)
    v.add(
        labels.get(f"{LABEL_NS}.stack") == stack.name,
        f"labels  stack={labels.get(f'{LABEL_NS}.stack', 'missing')} (checking against {stack.name})",
    )
    pins = {k[len(PIN) :]: val for k, val in labels.items() if k.startswith(PIN)}
    for name, pkg in stack.packages.items():
        have = pins.get(name)
        v.add(have == pkg.version, f"pin     {name:<10} label={have or 'missing'} stack={pkg.version}")
    for extra in sorted(set(pins) - set(stack.packages)):
        v.add(False, f"pin     {extra:<10} label={pins[extra]} is not a pin of the stack")
    option_labels = {k[len(OPTION) :]: val for k, val in labels.items() if k.startswith(OPTION)}
    for name, option in stack.options.items():
        have = option_labels.get(name)
        v.add(
            have == option.value,
            f"option  {name} label={have or 'missing'} stack={option.value}"
            + ("" if have is None or have == option.value else f" (check with --set options.{name}.value={have})"),
        )
    want = fingerprint(stack)
    have = labels.get(f"{LABEL_NS}.fingerprint")
    v.add(
        have == want,
        f"fingerprint label={have or 'missing'} stack={want}"
        + ("" if have == want else " (the stack declaration differs from the one this image was built from)"),
    )
    # an overlay's image sets its own entrypoint and env on the base image: the contract is the base image's
    overlay = labels.get(f"{LABEL_NS}.overlay")
    for ok, text in contract.image_lines(loaded, config) if config is not None and not overlay else []:
        v.add(ok, text)
    for script, what in (("gate.py", "gate"), ("abi.py", "abi")):
        if script == "abi.py" and not gate_spec(stack)["abi"]["packages"]:
            continue  # no vendor packages: nothing for the ABI check to resolve
        ok, out = run_gate(loaded, image, engine, script=script)
        v.lines.extend(f"  {line}" for line in out)
        v.add(ok, f"{what:<7} re-run inside the image with a read-only root filesystem")
    return v
