"""Install the files kernel steps wrote besides wheels (stackforge; run in the gate stage).

usage: install_files.py SPEC.json   (a list of {key, kernel, source, dest}; each kernel's /out/files is mounted
at /stackforge/files/<kernel>). Every declared file must exist: the missing ones are named by their stack key
and nothing is installed. Each file keeps its mode; ``{site}/`` is this interpreter's site-packages. A source
that is a directory replaces the destination directory as a whole (a stale module of the one it replaces does
not survive); a symbolic link anywhere in it is refused. The "installed KEY: DEST mode=… sha256=…" lines (one
per file) are printed and kept in files.txt beside SPEC.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import sysconfig
from pathlib import Path

FILES = Path("/stackforge/files")
SITE = "{site}/"


def destination(dest: str) -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / dest[len(SITE) :] if dest.startswith(SITE) else Path(dest)


def problem(src: Path) -> str | None:
    """Why ``src`` cannot be installed (None: it can)."""
    if src.is_symlink():
        return "was written as a symbolic link"
    if src.is_file():
        return None
    if not src.is_dir():
        return "was written as neither a file nor a directory" if src.exists() else "was not written"
    for parent, dirs, files in os.walk(src):
        for name in dirs + files:
            path = Path(parent) / name
            if path.is_symlink():
                return f"was written holding a symbolic link ({path.relative_to(src)})"
            if not (path.is_dir() or path.is_file()):
                return f"was written holding a special file ({path.relative_to(src)})"
    return None


def digest_line(key: str, dest: Path) -> str:
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()
    mode = stat.S_IMODE(dest.stat().st_mode)
    return f"installed {key}: {dest} mode={mode:04o} sha256={digest}"


def install_tree(src: Path, dest: Path) -> None:
    """Replace the directory ``dest`` by a copy of ``src`` (copied beside it first, then swapped in)."""
    tmp = dest.with_name(f".{dest.name}.stackforge-tmp")
    old = dest.with_name(f".{dest.name}.stackforge-old")
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dest.is_dir() and not dest.is_symlink():
        os.replace(dest, old)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    missing = []
    for entry in spec:
        src = FILES / entry["kernel"] / entry["source"]
        what = problem(src)
        if what:
            missing.append(
                f"error: {entry['key']}: {entry['source']} {what} by kernel {entry['kernel']} "
                f"(expected /out/files/{entry['source']} in stage kernel-{entry['kernel']})"
            )
    if missing:
        print("\n".join(missing), file=sys.stderr, flush=True)
        return 1
    record = []
    for entry in spec:
        src, dest = FILES / entry["kernel"] / entry["source"], destination(entry["dest"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            install_tree(src, dest)
            installed = sorted(p for p in dest.rglob("*") if p.is_file())
        else:
            tmp = dest.with_name(f".{dest.name}.stackforge-tmp")
            shutil.copy2(src, tmp)
            os.replace(tmp, dest)
            installed = [dest]
        for path in installed:
            record.append(digest_line(entry["key"], path))
            print(record[-1], flush=True)
    # Kept in the image: what was installed is readable without the build log (a cached step prints nothing).
    Path(argv[1]).with_name("files.txt").write_text("".join(line + "\n" for line in record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
