"""Install the files kernel steps wrote besides wheels (stackforge; run in the gate stage).

usage: install_files.py SPEC.json   (a list of {key, kernel, source, dest}; each kernel's /out/files is mounted
at /stackforge/files/<kernel>). Every declared file must exist: the missing ones are named by their stack key
and nothing is installed. Each file keeps its mode; ``{site}/`` is this interpreter's site-packages. The
"installed KEY: DEST mode=… sha256=…" lines are printed and kept in files.txt beside SPEC.json.
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


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    missing = []
    for entry in spec:
        src = FILES / entry["kernel"] / entry["source"]
        if src.is_symlink() or not src.is_file():
            what = "is not a regular file" if src.exists() or src.is_symlink() else "was not written"
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
        tmp = dest.with_name(f".{dest.name}.stackforge-tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dest)
        digest = hashlib.sha256(dest.read_bytes()).hexdigest()
        mode = stat.S_IMODE(dest.stat().st_mode)
        record.append(f"installed {entry['key']}: {dest} mode={mode:04o} sha256={digest}")
        print(record[-1], flush=True)
    # Kept in the image: what was installed is readable without the build log (a cached step prints nothing).
    Path(argv[1]).with_name("files.txt").write_text("".join(line + "\n" for line in record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
