"""Run one pip phase and check that it kept every vendor pin (run inside the image, standard library only).

    python preserve.py --phase NAME --key STACK_KEY --index INDEX --record OUT.json [--pins PINS.json|none] \\
        [--public PUBLIC.json] [--lock LOCK --stack STACK] -- python -m pip install ...

1. Runs the pip command (adding ``--report`` when pip has it, 22.2 and later), streaming its output.
   If pip fails and its message names a conflict with a vendor pin (the constraints file holds them), one
   more line names the phase, its stack key and the package that asked for another version; so does a
   conflict with a public pin (``PUBLIC.json``: {name: version}) that the phase held as a constraint.
2. After the phase, every vendor pin (``PINS.json``: {name: version}) must still be installed at a version the
   pin matches under the local-label rule (``localver.py``: a pin with a local label matches only that build, a
   pin without one matches any build of its version, as pip's ``==`` does), and the line names what is
   installed exactly: ``PASS preserve torch version=2.11.0.post2+musa5.2.0`` per pin (``… pin=0.2.7`` when a
   build of an unlabelled pin is installed), or a FAIL naming the phase and who pulled the other version in (from the pip report: the requested item, or the items whose
   Requires-Dist names the package; else the dists the phase changed that require it).
3. Writes OUT.json: the phase, its index, what it installed (name, version, archive URL and sha256 when
   pip knows it, requested, requires_dist) and the preserve lines; ``inventory.py`` reads these records.

With ``--lock`` (a requirement phase run ``--no-index`` after its index's lock installed the closure), a
failure adds one line naming what the lock lacks, the lock and ``stackforge lock STACK``.

Exit status: pip's on failure, 1 when a vendor pin drifted, else 0.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tempfile

import localver

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
DEPENDS = re.compile(r"^\s*(\S+) (\S+) depends on (.+)$")
MISSING = re.compile(r"No matching distribution found for ([A-Za-z0-9][A-Za-z0-9._-]*)")
REQUESTED = re.compile(r"^\s*The user requested (?!\(constraint\))(\S.*)$")
CONSTRAINT = re.compile(r"^\s*The user requested \(constraint\) ([A-Za-z0-9][A-Za-z0-9._-]*)(\S+)\s*$")
PUBLIC = "/stackforge/deps/public-pins.json"
BARE = re.compile(r"(the phase requests |\S+ \S+ depends on )[\w.-]+(\[[^\]]*\])?(\s*;.*)?")  # no version asked


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    m = NAME.match(spec)
    return canon(m.group(1)) if m else ""


def installed() -> dict[str, tuple[str, str, list[str]]]:
    """canonical name -> (name, version, requires) of every distribution on sys.path, read afresh."""
    importlib.invalidate_caches()
    out: dict[str, tuple[str, str, list[str]]] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and canon(name) not in out:
            out[canon(name)] = (name, dist.version, list(dist.requires or []))
    return out


def report_items(report: dict) -> dict[str, dict]:
    """canonical name -> {name, version, url, sha256, requested, requires_dist} of a pip report's installs."""
    items = {}
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        info = item.get("download_info", {}) or {}
        archive = info.get("archive_info", {}) or {}
        sha = (archive.get("hashes") or {}).get("sha256")
        if not sha and str(archive.get("hash", "")).startswith("sha256="):
            sha = archive["hash"].split("=", 1)[1]
        items[canon(meta.get("name", ""))] = {
            "name": meta.get("name"),
            "version": meta.get("version"),
            "url": info.get("url"),
            "sha256": sha,
            "requested": bool(item.get("requested")),
            "requires_dist": list(meta.get("requires_dist") or []),
        }
    return items


def pulled_in_by(package: str, items: dict[str, dict], changed: dict[str, tuple[str, str, list[str]]]) -> str:
    """Who made this phase install ``package``: the phase's own requirements, or the dists requiring it."""
    key = canon(package)
    if items.get(key, {}).get("requested"):
        return "the phase's own requirements"
    who = [
        f"{i['name']} {i['version']} (requires {r})"
        for i in items.values()
        for r in i["requires_dist"]
        if requirement_name(r) == key
    ]
    if not who:
        who = [
            f"{name} {version} (requires {r})"
            for k, (name, version, reqs) in changed.items()
            if k != key
            for r in reqs
            if requirement_name(r) == key
        ]
    return ", ".join(who) if who else "unknown (no installed dist of this phase requires it)"


def check(pins: dict[str, str], after: dict, items: dict[str, dict], changed: dict, phase: str) -> list[str]:
    """The preserve lines: one per vendor pin, in the pins' order."""
    lines = []
    for name, want in pins.items():
        found = after.get(canon(name))
        if found is not None and localver.matches(want, found[1]):
            pinned = "" if localver.same_build(want, found[1]) else f" pin={want}"
            lines.append(f"PASS preserve {name} version={found[1]}{pinned}")
            continue
        seen = found[1] if found else "not-installed"
        why = f" ({localver.explain(want, found[1])})" if found and localver.same_public(want, found[1]) else ""
        lines.append(
            f"FAIL preserve {name} expected={want} found={seen}{why} phase={phase} "
            f"pulled-in-by={pulled_in_by(name, items, changed)}"
        )
    return lines


def conflict(output: list[str], pins: dict[str, str]) -> list[str]:
    """pip's "X depends on torch>=2.12" lines that ask a vendor pin for another version."""
    vendor = {canon(n) for n in pins}
    asked = [
        f"the phase requests {m.group(1).strip()}"
        for m in map(REQUESTED.match, output)
        if m and requirement_name(m.group(1)) in vendor
    ]
    return [
        f"{m.group(1)} {m.group(2)} depends on {m.group(3).strip()}"
        for m in map(DEPENDS.match, output)
        if m and requirement_name(m.group(3)) in vendor
    ] + asked


def constraints(output: list[str]) -> dict[str, list[str]]:
    """Each project's constraints as pip names them, one specifier each ("The user requested (constraint)
    numpy==1.26,==1.26.4": the stack's pin and an upstream's -c file's line for the same project)."""
    out: dict[str, list[str]] = {}
    for m in map(CONSTRAINT.match, output):
        if m:
            out.setdefault(canon(m.group(1)), []).extend(s.strip() for s in m.group(2).split(",") if s.strip())
    return out


def held_public(output: list[str], public: dict[str, str]) -> dict[str, str]:
    """The public pins pip names as this phase's constraints ("The user requested (constraint) numpy==1.26.4")."""
    held = constraints(output)
    return {name: version for name, version in public.items() if f"=={version}" in held.get(canon(name), [])}


def public_conflicts(output: list[str], phase: str, key: str, public: dict[str, str]) -> list[str]:
    """One line per public pin a refused resolution would move: the phase, its stack key, the pin, what asked."""
    lines = []
    held = constraints(output)
    for name, version in held_public(output, public).items():
        # a bare name ("The user requested numpy") is satisfied by the pin: only versioned asks conflict
        why = [w for w in conflict(output, {name: version}) if not BARE.fullmatch(w)]
        why += [f"the phase's constraints ask {name}{s}" for s in held[canon(name)] if s != f"=={version}"]
        if why:
            lines.append(
                f"ERROR: pip phase {phase} (stack key {key}) would move the public pin {name}=={version} "
                f"(stack key packages.{name}; the constraints hold it): {'; '.join(why)}"
            )
    return lines


def offline_failure(output: list[str], phase: str, lock: str, stack: str) -> str:
    """Why a phase run with --no-index failed: its lock lacks what its requirement files need."""
    missing = sorted({m.group(1) for m in map(MISSING.search, output) if m})
    what = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not" if missing else "something is not"
    return (
        f"ERROR: pip phase {phase} runs --no-index: its requirement files must be satisfied by what {lock} "
        f"installed with --require-hashes, and {what} (the lock is incomplete or stale; nothing is fetched "
        f"from the index instead): run: stackforge lock {stack}"
    )


def pip_has_report(argv: list[str]) -> bool:
    if "install" not in argv:
        return False
    try:
        import pip
    except ImportError:
        return False
    parts = [int(p) for p in re.findall(r"\d+", pip.__version__)[:2]]
    return parts >= [22, 2]


def run_pip(argv: list[str], report: str | None) -> tuple[int, list[str]]:
    cmd = list(argv) + (["--report", report] if report else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    kept: list[str] = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        kept = (kept + [line.rstrip("\n")])[-400:]
    return proc.wait(), kept


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(
            "usage: preserve.py --phase NAME --key KEY --index INDEX --record OUT.json [--pins F] -- pip …",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    opts = dict(zip(argv[1:split:2], argv[2:split:2]))
    command = argv[split + 1 :]
    phase, key, index = opts["--phase"], opts["--key"], opts["--index"]
    pins: dict[str, str] = {}
    if opts.get("--pins") != "none":  # the installer phase: no vendor pin is installed before it
        with open(opts.get("--pins", "/stackforge/deps/vendor-pins.json")) as fh:
            pins = json.load(fh)
    public: dict[str, str] = {}
    if os.path.isfile(opts.get("--public", PUBLIC)):
        with open(opts.get("--public", PUBLIC)) as fh:
            public = json.load(fh)
    before = installed()
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json") if pip_has_report(command) else None
        rc, output = run_pip(command, report_path)
        if rc != 0:
            why = conflict(output, pins)
            moved = public_conflicts(output, phase, key, public)
            what = (
                f"would replace a vendor pin (the constraints hold them): {'; '.join(why)}"
                if why
                else f"failed (pip exit {rc}; its message is above)"
            )
            if why or not moved:
                print(f"ERROR: pip phase {phase} (stack key {key}) {what}", flush=True)
            for line in moved:
                print(line, flush=True)
            if "--lock" in opts:
                print(offline_failure(output, phase, opts["--lock"], opts.get("--stack", "STACK")), flush=True)
            return rc
        report = {}
        if report_path and os.path.isfile(report_path):
            with open(report_path) as fh:
                report = json.load(fh)
    items = report_items(report)
    after = installed()
    changed = {k: v for k, v in after.items() if before.get(k, (None, None))[1] != v[1]}
    lines = check(pins, after, items, changed, phase)
    failed = [line for line in lines if line.startswith("FAIL")]
    lines.append(f"preserve result: {len(lines) - len(failed)} PASS, {len(failed)} FAIL after phase {phase}")
    for line in lines:
        print(line, flush=True)
    if not items:  # no report (an old pip): what changed, from the metadata
        items = {
            k: {"name": n, "version": v, "url": None, "sha256": None, "requested": False, "requires_dist": r}
            for k, (n, v, r) in changed.items()
        }
    record = {"phase": phase, "key": key, "index": index, "installed": list(items.values()), "preserve": lines}
    os.makedirs(os.path.dirname(opts["--record"]) or ".", exist_ok=True)
    with open(opts["--record"], "w") as fh:
        json.dump(record, fh, indent=2)
    if failed:
        for line in failed:
            name = line.split()[2]
            print(
                f"ERROR: pip phase {phase} (stack key {key}) replaced the vendor pin {name}=={pins[name]}: "
                f"{line.split(' pulled-in-by=', 1)[1]}",
                flush=True,
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
