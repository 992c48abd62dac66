"""The dependency gate, run inside the image as a build step.

Reads the gate spec written by stackforge (gate.json next to this file, or the
path given as the first argument) and checks, in the stack's order:

* each pinned package: import it first (importing torchada patches torch, so
  order matters), then read the installed version from its distribution
  metadata and compare with the pin — ``exact`` (equal), ``prefix`` (starts
  with the pin) or ``metadata`` (no import, version only);
* extra imports (vllm, the platform plugin): imported, version reported;
* probes: small named snippets whose printed result must equal the expectation.

Prints one line per check (``PASS import torch      version=…``), then a
summary, and exits 1 on any FAIL. Standard library only: it runs in any image.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import io
import json
import sys
from pathlib import Path

WIDTH = 10


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:300]


def check_package(pkg: dict) -> tuple[bool, str]:
    name, dist, module, mode, want = pkg["name"], pkg["dist"], pkg["import"], pkg["mode"], pkg["version"]
    verb = "meta  " if mode == "metadata" else "import"
    label = f"{verb} {name:<{WIDTH}}"
    if mode != "metadata":
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - any import failure is a gate failure
            return False, f"FAIL {label} expected={want} error=import {module}: {_err(exc)}"
    found = _version(dist)
    if found is None:
        return False, f"FAIL {label} expected={want} found=not-installed"
    ok = found == want if mode == "exact" else found.startswith(want)
    if ok:
        return True, f"PASS {label} version={found}"
    return False, f"FAIL {label} expected={want} found={found}"


def check_import(item: dict) -> tuple[bool, str]:
    module, dist = item["module"], item.get("dist") or item["module"]
    label = f"import {module:<{WIDTH}}"
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001
        return False, f"FAIL {label} error={_err(exc)}"
    return True, f"PASS {label} version={_version(dist) or 'unknown'}"


def check_probe(probe: dict) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(probe["code"], f"<probe {probe['name']}>", "exec"), {"__name__": "__probe__"})
    except BaseException as exc:  # noqa: BLE001
        return False, f"FAIL probe  {probe['name']} error={_err(exc)}"
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    found = lines[-1].strip() if lines else ""
    if found == probe["expect"]:
        return True, f"PASS probe  {probe['name']} result={found}"
    return False, f"FAIL probe  {probe['name']} expected={probe['expect']} found={found}"


def run(spec: dict, out=sys.stdout) -> int:
    failed = passed = 0
    checks = ([(check_package, p) for p in spec.get("packages", [])]
              + [(check_import, i) for i in spec.get("imports", [])]
              + [(check_probe, p) for p in spec.get("probes", [])])
    for fn, item in checks:
        ok, line = fn(item)
        print(line, file=out, flush=True)
        passed += ok
        failed += not ok
    print(f"gate result: {passed} PASS, {failed} FAIL", file=out, flush=True)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(__file__).with_name("gate.json")
    spec = json.loads(path.read_text())
    return run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
