"""The ABI gate, run inside the image as a build step.

For every shared object installed by the stack's vendor packages, ask the image's
own loader (``ldd``) to resolve each needed library, with the library path the
runtime uses (the stack's ``gate.library_path``; ``{site}`` is site-packages).
A library that is "not found" fails the build and is named with its package and
.so. A compiled distribution that declares no Requires-Dist gets a WARN line:
no resolver guards its ABI, so this check is the only one that does.

Reads gate.json (``abi`` section); prints one line per .so; exits 1 on any FAIL.
Standard library only.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

WIDTH = 10
SO = re.compile(r"\.so(\.\d+)*$")
NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found")
RESOLVED = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)")
LOADER = re.compile(r"^\s*(/\S+)\s+\(0x")


def library_path(entries: list[str]) -> str:
    site = sysconfig.get_paths()["purelib"]
    dirs = [e.replace("{site}", site) for e in entries]
    current = os.environ.get("LD_LIBRARY_PATH", "")
    return ":".join([*dirs, *([current] if current else [])])


ELF_MACHINES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv"}


def elf_machine(path: Path) -> int | None:
    """e_machine of an ELF file, or None when it is not ELF (e.g. a linker script named .so)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def machine_name(number: int | None) -> str:
    return ELF_MACHINES.get(number, f"machine {number}") if number is not None else "not ELF"


def shared_objects(dist: md.Distribution) -> list[Path]:
    return sorted(Path(str(f.locate())) for f in (dist.files or []) if SO.search(str(f)))


def parse_ldd(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """ldd output → ([(library, path it resolved to)], [libraries not found])."""
    rows = text.splitlines()
    missing = [m.group(1) for m in map(NOT_FOUND.match, rows) if m]
    resolved = [(m.group(1), m.group(2)) for m in map(RESOLVED.match, rows) if m]
    resolved += [(Path(m.group(1)).name, m.group(1)) for m in map(LOADER.match, rows) if m]
    return resolved, missing


def check_dist(name: str, env: dict) -> tuple[list[str], int]:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return [f"FAIL abi   {name:<{WIDTH}} not installed"], 1
    lines, failed = [], 0
    objects = shared_objects(dist)
    host = elf_machine(Path(os.path.realpath(sys.executable)))
    for so in objects:
        machine = elf_machine(so)
        if machine is None:
            continue
        if host is not None and machine != host:
            failed += 1
            lines.append(
                f"FAIL abi   {name:<{WIDTH}} {so.name} is built for {machine_name(machine)}, "
                f"this image runs {machine_name(host)}"
            )
            continue
        proc = subprocess.run(["ldd", str(so)], capture_output=True, text=True, env=env)
        text = proc.stdout + proc.stderr
        if "not a dynamic executable" in text:
            continue
        resolved, missing = parse_ldd(text)
        if missing:
            failed += 1
            lines.append(f"FAIL abi   {name:<{WIDTH}} {so.name} missing={','.join(missing)}")
        else:
            lines.append(f"PASS abi   {name:<{WIDTH}} {so.name} resolved={len(resolved)}")
        # Where each library was found (or not): the evidence a reviewer would otherwise run ldd for.
        lines += [f"    {lib} => {path}" for lib, path in resolved] + [f"    {lib} => not found" for lib in missing]
    if objects and not dist.requires:
        lines.append(
            f"WARN abi   {name:<{WIDTH}} compiled ({len(objects)} .so) and declares no Requires-Dist: "
            "no resolver guards its ABI"
        )
    return lines, failed


def run(spec: dict, out=sys.stdout) -> int:
    abi = spec.get("abi") or {}
    env = dict(os.environ, LD_LIBRARY_PATH=library_path(abi.get("library_path", [])))
    failed = 0
    if abi.get("packages"):  # which machine resolved the libraries, along which path
        where = env["LD_LIBRARY_PATH"] or "the loader's default paths"
        print(f"PASS abi   {'machine':<{WIDTH}} {platform.machine()} LD_LIBRARY_PATH={where}", file=out, flush=True)
    for name in abi.get("packages", []):
        lines, n = check_dist(name, env)
        failed += n
        for line in lines:
            print(line, file=out, flush=True)
    print(f"abi result: {failed} FAIL", file=out, flush=True)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(__file__).with_name("gate.json")
    return run(json.loads(path.read_text()))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
