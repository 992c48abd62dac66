"""Post-install patches of installed distributions, run inside the image after the pip phases.

Reads the spec stackforge wrote (post_install.json: key, dist, specifier, file, sha256, expect) and, for
each entry, reads the installed version of ``dist``; when it matches ``specifier`` the unified diff
``file`` (paths a/… b/… relative to site-packages) is applied there, otherwise the entry is skipped.
``expect`` is what the stack's pin predicts (it is in the image's label): an installed version that
disagrees fails. Every hunk must match exactly (no fuzz; an offset is allowed); all files are checked
before any is written. One line per entry (``PASS patch  mate applied …`` / ``PASS patch  mate skipped
…`` / ``FAIL patch  …``) on stdout and in report.txt beside the spec; exit 1 on any FAIL.
Standard library only (pip's vendored ``packaging`` compares versions when present).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import sys
import sysconfig
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    pass


def matches(version: str, specifier: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[assignment]
    return SpecifierSet(specifier).contains(version, prereleases=True)


def parse(text: str) -> list[tuple[str, list[tuple[int, list[str], list[str]]]]]:
    """[(path relative to site-packages, [(old start, old lines, new lines)])] of a unified diff."""
    files: list[tuple[str, list]] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = line[4:].split("\t")[0].strip()
            new = lines[i + 1][4:].split("\t")[0].strip()
            target = new if new != "/dev/null" else old
            if target == "/dev/null" or "/" not in target:
                raise PatchError(f"cannot tell the file of {line.strip()!r}")
            files.append((target.split("/", 1)[1], []))
            i += 2
            continue
        m = HUNK.match(line)
        if m and files:
            start = int(m.group(1))
            want_old = int(m.group(2) or "1")
            want_new = int(m.group(4) or "1")
            old_lines: list[str] = []
            new_lines: list[str] = []
            i += 1
            while i < len(lines) and (len(old_lines) < want_old or len(new_lines) < want_new):
                body = lines[i]
                if body.startswith("\\"):
                    i += 1
                    continue
                tag, rest = body[:1], body[1:]
                if tag in (" ", "\n"):
                    rest = rest if tag == " " else "\n"
                    old_lines.append(rest)
                    new_lines.append(rest)
                elif tag == "-":
                    old_lines.append(rest)
                elif tag == "+":
                    new_lines.append(rest)
                else:
                    raise PatchError(f"malformed hunk line {i + 1}: {body.rstrip()!r}")
                i += 1
            files[-1][1].append((start, old_lines, new_lines))
            continue
        i += 1
    if not files:
        raise PatchError("no file in the patch")
    return files


def apply_hunks(path: str, content: list[str], hunks) -> list[str]:
    out = list(content)
    shift = 0
    for n, (start, old, new) in enumerate(hunks, start=1):
        at = max(start - 1 + shift, 0) if old else start + shift
        candidates = [at] + [at + d for r in range(1, len(out) + 1) for d in (-r, r)]
        hit = next((c for c in candidates if 0 <= c <= len(out) - len(old) and out[c : c + len(old)] == old), None)
        if hit is None:
            raise PatchError(f"hunk {n} of {path} does not apply (at line {start})")
        out[hit : hit + len(old)] = new
        shift += len(new) - len(old) + (hit - at)
    return out


def apply(patch: Path, site: Path) -> list[str]:
    """Apply ``patch`` under ``site``: every file checked first, then written. The paths changed."""
    changes = {}
    for rel, hunks in parse(patch.read_text()):
        target = site / rel
        if ".." in Path(rel).parts or not str(target.resolve()).startswith(str(site.resolve()) + os.sep):
            raise PatchError(f"{rel} is outside site-packages")
        creating = all(not old for _, old, _ in hunks) and not target.exists()
        if not creating and not target.is_file():
            raise PatchError(f"{rel} is not installed")
        content = [] if creating else target.read_text().splitlines(keepends=True)
        changes[target] = apply_hunks(rel, content, hunks)
    for target, lines in changes.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(lines))
    return [str(t.relative_to(site)) for t in changes]


def run(spec: list[dict], base: Path, site: Path) -> tuple[int, list[str]]:
    lines, failed = [], 0
    for entry in spec:
        dist, key, spec_text = entry["dist"], entry["key"], entry["specifier"]
        digest = entry["sha256"]
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            lines.append(f"FAIL patch  {dist} {key}: {dist} is not installed")
            failed += 1
            continue
        patch = base / entry["file"]
        if hashlib.sha256(patch.read_bytes()).hexdigest() != digest:
            lines.append(f"FAIL patch  {dist} {key}: {entry['patch']} differs from the one stackforge hashed")
            failed += 1
            continue
        state = "applied" if matches(version, spec_text) else "skipped"
        if state != entry["expect"]:
            lines.append(
                f"FAIL patch  {dist} {key}: installed {version} is {state} by {spec_text}, "
                f"but the stack's pin is {entry['expect']}"
            )
            failed += 1
            continue
        if state == "skipped":
            lines.append(f"PASS patch  {dist} skipped version={version} (not {spec_text}) sha256={digest}")
            continue
        try:
            changed = apply(patch, site)
        except (PatchError, OSError, UnicodeDecodeError) as exc:
            lines.append(f"FAIL patch  {dist} {key}: {entry['patch']} does not apply: {exc}")
            failed += 1
            continue
        lines.append(
            f"PASS patch  {dist} applied version={version} ({spec_text}) sha256={digest} files={','.join(changed)}"
        )
    return failed, lines


def main(argv: list[str]) -> int:
    spec_path = Path(argv[1])
    site = Path(argv[2]) if len(argv) > 2 else Path(sysconfig.get_paths()["purelib"])
    failed, lines = run(json.loads(spec_path.read_text()), spec_path.parent, site)
    for line in lines:
        print(line, flush=True)
    (spec_path.parent / "report.txt").write_text("".join(f"{line}\n" for line in lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
