"""Install an overlay's layered range into the image (standard library only).

    python install.py [--check] DIR

DIR holds ``manifest.json`` (the packages and, per changed file, its path below site-packages and the sha256
of its post-image; ``null`` for a file the range deletes) and ``range/<path>`` (the post-images, patched on the
host). Each package is found where it is installed (``importlib.util.find_spec``, nothing imported); every file
is copied over the installed one (or removed) and its hash checked in place, its stale bytecode removed; then
each package is imported. One line per file and package (``PASS range  vllm/… sha256=…``, ``PASS import vllm
version=…``), kept in DIR/install.txt; any FAIL fails the step. ``--check`` changes nothing: it checks the
installed files' hashes and imports the packages (``stackforge verify``, on a read-only root).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def drop_bytecode(path: str) -> None:
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0] + "."
    if os.path.isdir(cache):
        for name in os.listdir(cache):
            if name.startswith(stem) and name.endswith(".pyc"):
                os.remove(os.path.join(cache, name))


def main(argv: list[str]) -> int:
    check = argv[1:2] == ["--check"]
    top = argv[2] if check else argv[1]
    with open(os.path.join(top, "manifest.json")) as fh:
        manifest = json.load(fh)
    lines: list[str] = []
    sites: dict[str, str] = {}

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    for pkg in manifest["packages"]:
        spec = importlib.util.find_spec(pkg)
        where = list(spec.submodule_search_locations or []) if spec else []
        if not where:
            say(f"FAIL range  {pkg} is not an installed package in this image")
            continue
        sites[pkg] = os.path.dirname(os.path.realpath(where[0]))
    for item in manifest["files"]:
        path, want = item["path"], item["sha256"]
        pkg = path.split("/", 1)[0]
        if pkg not in sites:
            say(f"FAIL range  {path} package={pkg} not installed")
            continue
        dest = os.path.join(sites[pkg], path)
        if check:
            have = sha256(dest) if os.path.isfile(dest) else None
            ok = have == want
            say(
                f"{'PASS' if ok else 'FAIL'} range  {path} sha256={have or 'absent'}"
                + ("" if ok else f" expected={want}")
            )
            continue
        if want is None:
            if os.path.lexists(dest):
                os.remove(dest)
            drop_bytecode(dest)
            say(f"PASS range  {path} deleted patch={item['patch']}")
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.islink(dest):
            os.remove(dest)
        shutil.copyfile(os.path.join(top, "range", path), dest)
        os.chmod(dest, 0o644)
        drop_bytecode(dest)
        have = sha256(dest)
        ok = have == want
        say(
            f"{'PASS' if ok else 'FAIL'} range  {path} sha256={have}"
            + ("" if ok else f" expected={want}")
            + f" patch={item['patch']}"
        )
    for item in manifest.get("extra", []) if check else []:
        dest, want = item["dest"], item["sha256"]
        have = sha256(dest) if os.path.isfile(dest) else None
        mode = oct(os.stat(dest).st_mode & 0o7777)[2:].zfill(4) if have else "-"
        ok = have == want and int(mode, 8) == int(item["mode"], 8)
        say(
            f"{'PASS' if ok else 'FAIL'} file   {dest} sha256={have or 'absent'} mode={mode}"
            + ("" if ok else f" expected={want} mode={item['mode']}")
        )
    for pkg in manifest["packages"]:
        try:
            mod = importlib.import_module(pkg)
        except BaseException as exc:
            say(f"FAIL import {pkg} error={type(exc).__name__}: {exc}")
            continue
        say(f"PASS import {pkg} version={getattr(mod, '__version__', '?')} site={sites.get(pkg, '?')}")
    failed = [ln for ln in lines if ln.startswith("FAIL")]
    if failed:
        print(f"ERROR: overlay {manifest['overlay']}: {len(failed)} FAIL installing the layered range", flush=True)
        return 1
    if check:
        return 0
    with open(os.path.join(top, "install.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
