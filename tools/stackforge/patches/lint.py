"""Static checks over series directories; no upstream needed.

Each finding names the file and line it is about (the series file or the
``.patch`` file), the patch, and for diff content the patched file and line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from stackforge.errors import UserError
from stackforge.patches.index import index_is_current
from stackforge.patches.patchfile import ZERO_FROM, index_is_full, parse_patch
from stackforge.patches.series import (
    BASE_LAYER,
    INDEX_FILE,
    OVERLAYS_DIR,
    PATCH_NAME_RE,
    SERIES_FILE,
    Series,
    read_series,
)

# Internal tracker ids: an upper-case project key, a dash, five or more digits.
DEFAULT_TRACKER_PATTERN = r"(?<![A-Za-z0-9])[A-Z]+-\d{5,}(?!\d)"

DOC_SUFFIXES = {".md", ".rst", ".txt", ".adoc", ".markdown"}
HASH_SUFFIXES = {
    ".py",
    ".pyi",
    ".pyx",
    ".pxd",
    ".sh",
    ".bash",
    ".yaml",
    ".yml",
    ".toml",
    ".cfg",
    ".cmake",
    ".txt",
    ".in",
    ".r",
    ".pl",
    ".rb",
}
HASH_NAMES = {"Makefile", "Dockerfile", "CMakeLists.txt", "requirements.txt", ".gitignore", ".dockerignore"}
SLASH_SUFFIXES = {
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".cxx",
    ".hpp",
    ".hh",
    ".cu",
    ".cuh",
    ".mu",
    ".muh",
    ".java",
    ".js",
    ".ts",
    ".go",
    ".rs",
    ".proto",
    ".swift",
    ".kt",
}


@dataclass
class Finding:
    code: str
    message: str
    file: str  # the series file or the .patch file
    line: int | None = None
    patch: str | None = None
    layer: str = BASE_LAYER
    source_file: str | None = None  # the patched file, for findings in diff content
    source_line: int | None = None

    def render(self) -> str:
        loc = self.file + (f":{self.line}" if self.line else "")
        parts = [f"{loc}: {self.code}:"]
        if self.patch:
            parts.append(f"patch {self.patch}" + ("" if self.layer == BASE_LAYER else f" (layer {self.layer})") + ":")
        if self.source_file:
            parts.append(f"{self.source_file}" + (f":{self.source_line}" if self.source_line else "") + ":")
        parts.append(self.message)
        return " ".join(parts)

    def to_json(self) -> dict:
        return asdict(self)


def _kind(path: str) -> str:
    p = Path(path)
    name, suffix = p.name, p.suffix.lower()
    if (
        (suffix in DOC_SUFFIXES and name not in HASH_NAMES)
        or name.upper().startswith(("README", "CHANGELOG", "LICENSE", "NOTICE"))
        or path.startswith("docs/")
    ):
        return "doc"
    if suffix in SLASH_SUFFIXES:
        return "slash"
    if suffix in HASH_SUFFIXES or name in HASH_NAMES:
        return "hash"
    return "any"


class _CommentScanner:
    """Extract the comment (or docstring) part of consecutive added lines of one file."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.in_block = False  # /* ... */
        self.in_doc: str | None = None  # python triple-quote delimiter

    def comment(self, text: str) -> str:
        if self.kind == "doc":
            return text
        out: list[str] = []
        if self.kind in ("hash", "any"):
            out.append(self._hash(text))
        if self.kind in ("slash", "any"):
            out.append(self._slash(text))
        return " ".join(x for x in out if x)

    def _hash(self, text: str) -> str:
        parts: list[str] = []
        s = text
        if self.in_doc:
            end = s.find(self.in_doc)
            if end < 0:
                return s
            parts.append(s[:end])
            s = s[end + 3 :]
            self.in_doc = None
        for q in ('"""', "'''"):
            while q in s:
                start = s.find(q)
                end = s.find(q, start + 3)
                if end < 0:
                    parts.append(s[start + 3 :])
                    self.in_doc = q
                    s = s[:start]
                    break
                parts.append(s[start + 3 : end])
                s = s[:start] + s[end + 3 :]
        stripped = s.lstrip()
        if stripped.startswith("#"):
            parts.append(stripped[1:])
        else:
            m = re.search(r"\s#(.*)$", s)
            if m:
                parts.append(m.group(1))
        return " ".join(parts)

    def _slash(self, text: str) -> str:
        parts: list[str] = []
        s = text
        while s:
            if self.in_block:
                end = s.find("*/")
                if end < 0:
                    parts.append(s)
                    return " ".join(parts)
                parts.append(s[:end])
                s = s[end + 2 :]
                self.in_block = False
                continue
            i_line = s.find("//")
            i_block = s.find("/*")
            if i_line < 0 and i_block < 0:
                break
            if i_line >= 0 and (i_block < 0 or i_line < i_block):
                parts.append(s[i_line + 2 :])
                break
            s = s[i_block + 2 :]
            self.in_block = True
        if not parts and text.lstrip().startswith("*"):
            parts.append(text.lstrip()[1:])
        return " ".join(parts)


def lint_series(
    series: Series,
    *,
    start: int | None = None,
    tracker_pattern: str = DEFAULT_TRACKER_PATTERN,
    root: Path | None = None,
) -> list[Finding]:
    """Findings for one layer. ``start`` is the number its first patch must carry."""
    tracker = re.compile(tracker_pattern)
    findings: list[Finding] = []

    def rel(p: Path) -> str:
        if root:
            try:
                return str(p.resolve().relative_to(root.resolve()))
            except ValueError:
                pass
        return str(p)

    sf = rel(series.series_file)
    layer = series.layer

    def add(code: str, message: str, file: str, line: int | None = None, patch: str | None = None, **kw) -> None:
        findings.append(Finding(code, message, file, line, patch, layer, **kw))

    # The series file itself: comments are shipped text too.
    if series.series_file.is_file():
        for lineno, raw in enumerate(series.series_file.read_text(encoding="utf-8").splitlines(), start=1):
            if raw.lstrip().startswith("#"):
                for m in tracker.finditer(raw):
                    add("tracker-id", f"internal tracker id {m.group(0)!r} in a series comment", sf, lineno)
    # Series vs directory, both ways; duplicates.
    seen: dict[str, int] = {}
    for e in series.entries:
        if e.name in seen:
            add("duplicate-entry", f"{e.name} is listed twice (first on line {seen[e.name]})", sf, e.line, e.name)
            continue
        seen[e.name] = e.line
        if "/" in e.name or not e.name.endswith(".patch"):
            add("bad-entry", f"{e.name!r} is not a .patch file name in this directory", sf, e.line, e.name)
        elif not (series.dir / e.name).is_file():
            add("missing-patch", f"series lists {e.name} but there is no such file", sf, e.line, e.name)
    on_disk = sorted(p.name for p in series.dir.glob("*.patch"))
    for name in on_disk:
        if name not in seen:
            add(
                "unlisted-patch",
                f"{name} is in the directory but not in {SERIES_FILE}",
                rel(series.dir / name),
                None,
                name,
            )
    # Names and numbering.
    expect = start
    for e in series.entries:
        named = PATCH_NAME_RE.match(e.name)
        if not named:
            add("bad-name", f"{e.name!r} does not follow NNNN-<Area>-<summary>.patch", sf, e.line, e.name)
            expect = None if expect is None else expect + 1
            continue
        num = int(named.group("num"))
        if expect is None:
            expect = num
        if num != expect:
            add(
                "numbering",
                f"{e.name} is number {num:04d} but its position needs {expect:04d}",
                sf,
                e.line,
                e.name,
            )
        expect += 1
    # Each patch's content.
    for e in series.entries:
        path = series.dir / e.name
        if (e.name in seen and seen[e.name] != e.line) or not path.is_file():
            continue
        pf = parse_patch(path)
        pfile = rel(path)
        if not pf.has_mail_headers or pf.from_line is None:
            add("not-export-form", "not in `git format-patch` form (mail headers missing)", pfile, 1, e.name)
        elif pf.from_line != ZERO_FROM:
            add("not-export-form", "the From line carries a commit id; export with --zero-commit", pfile, 1, e.name)
        if pf.signature_line:
            add(
                "not-export-form",
                "ends with a '-- ' signature; export with --no-signature",
                pfile,
                pf.signature_line,
                e.name,
            )
        for fd in pf.files:
            if not index_is_full(fd):
                add(
                    "not-export-form",
                    "abbreviated blob ids on the index line; export with --full-index",
                    pfile,
                    fd.patch_line,
                    e.name,
                    source_file=fd.path,
                )
        if not pf.subject:
            add("no-subject", "the patch has no subject", pfile, pf.subject_line or 1, e.name)
        if not pf.description:
            add(
                "no-description",
                "the patch has no description (a body saying what it changes and why)",
                pfile,
                pf.subject_line or 1,
                e.name,
            )
        if not pf.files:
            add("empty-patch", "the patch changes no file", pfile, 1, e.name)
        for lineno, text in pf.message_lines:
            for m in tracker.finditer(text):
                add("tracker-id", f"internal tracker id {m.group(0)!r} in the commit message", pfile, lineno, e.name)
        scanners: dict[str, _CommentScanner] = {}
        prev_line: dict[str, int] = {}
        for al in pf.added_lines():
            if al.text != al.text.rstrip():
                add(
                    "trailing-whitespace",
                    "added line ends in whitespace",
                    pfile,
                    al.patch_line,
                    e.name,
                    source_file=al.file,
                    source_line=al.line,
                )
            sc = scanners.get(al.file)
            if sc is None or prev_line.get(al.file, -10) != al.line - 1:
                sc = scanners[al.file] = _CommentScanner(_kind(al.file))
            prev_line[al.file] = al.line
            comment = sc.comment(al.text)
            for m in tracker.finditer(comment):
                what = "doc line" if sc.kind == "doc" else "comment"
                add(
                    "tracker-id",
                    f"internal tracker id {m.group(0)!r} in an added {what}",
                    pfile,
                    al.patch_line,
                    e.name,
                    source_file=al.file,
                    source_line=al.line,
                )
    # The generated index.
    idx = series.dir / INDEX_FILE
    if not idx.is_file():
        add("index-missing", f"{INDEX_FILE} is missing; run `stackforge patches index`", rel(idx))
    elif not index_is_current(series):
        add("index-stale", f"{INDEX_FILE} does not match the series; run `stackforge patches index`", rel(idx))
    return findings


def lint_layers(
    layers: Sequence[Series], *, tracker_pattern: str = DEFAULT_TRACKER_PATTERN, root: Path | None = None
) -> list[Finding]:
    """Lint a base series and the layered ranges above it; numbering runs on across layers."""
    out: list[Finding] = []
    start: int | None = 1 if layers and layers[0].layer == BASE_LAYER else None
    for s in layers:
        out += lint_series(s, start=start, tracker_pattern=tracker_pattern, root=root)
        start = None if start is None else start + len(s)
    return out


def lint_repository(root: Path, *, tracker_pattern: str = DEFAULT_TRACKER_PATTERN) -> list[Finding]:
    out: list[Finding] = []
    dirs = []
    pdir = root / "patches"
    if pdir.is_dir():
        dirs += [(BASE_LAYER, p) for p in sorted(pdir.iterdir()) if p.is_dir()]
    odir = root / OVERLAYS_DIR
    if odir.is_dir():
        for ov in sorted(p for p in odir.iterdir() if p.is_dir()):
            dirs += [(ov.name, p) for p in sorted((ov / "patches").glob("*")) if p.is_dir()]
    groups: dict[str, list[Series]] = {}
    for layer, d in dirs:
        try:
            s = read_series(d, layer=layer)
        except UserError as err:
            out.append(Finding("no-series", err.message, str(d / SERIES_FILE), layer=layer))
            continue
        groups.setdefault(d.name, []).append(s)
    for layers in groups.values():
        # Layered ranges of different overlays are alternatives over the same base, not a stack.
        base = [s for s in layers if s.layer == BASE_LAYER]
        tops = [s for s in layers if s.layer != BASE_LAYER]
        if base:
            out += lint_layers(base, tracker_pattern=tracker_pattern, root=root)
        for t in tops:
            if base:
                out += lint_series(t, start=len(base[0]) + 1, tracker_pattern=tracker_pattern, root=root)
            else:
                out += lint_series(t, start=None, tracker_pattern=tracker_pattern, root=root)
    return out
