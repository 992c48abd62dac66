"""Parse one patch file in ``git format-patch`` form (mail headers, message, diff).

The parser keeps line numbers so findings can point into the ``.patch`` file
and into the patched source file at the same time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.header import decode_header, make_header
from pathlib import Path

ZERO_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_PATCH_PREFIX_RE = re.compile(r"^\s*\[PATCH[^\]]*\]\s*", re.IGNORECASE)
_TRAILER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: \S")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: \d+)?$")


@dataclass
class Hunk:
    file: str
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    patch_line: int  # line of the @@ header in the .patch file
    lines: list[str] = field(default_factory=list)

    @property
    def preimage(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    @property
    def postimage(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]

    def text(self) -> str:
        return "\n".join([self.header, *self.lines])


@dataclass
class AddedLine:
    file: str
    line: int  # line number in the patched file
    patch_line: int  # line number in the .patch file
    text: str


@dataclass
class FileDiff:
    old_path: str | None
    new_path: str | None
    patch_line: int
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    index_line: str | None = None

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"


@dataclass
class PatchFile:
    path: Path
    raw: bytes
    from_line: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    subject: str = ""
    subject_line: int = 0
    body: list[tuple[int, str]] = field(default_factory=list)  # (patch line, text)
    files: list[FileDiff] = field(default_factory=list)
    signature_line: int | None = None
    has_mail_headers: bool = False

    @property
    def author(self) -> str:
        return self.headers.get("from", "")

    @property
    def date(self) -> str:
        return self.headers.get("date", "")

    @property
    def message_lines(self) -> list[tuple[int, str]]:
        """Subject and body, with line numbers, as git am would record them."""
        out = [(self.subject_line, self.subject)] if self.subject else []
        return out + self.body

    @property
    def trailers(self) -> list[tuple[int, str]]:
        paras = _paragraphs(self.body)
        if paras and all(_TRAILER_RE.match(t) for _, t in paras[-1]):
            return paras[-1]
        return []

    @property
    def description(self) -> str:
        """The body without trailers, trimmed."""
        paras = _paragraphs(self.body)
        if paras and all(_TRAILER_RE.match(t) for _, t in paras[-1]):
            paras = paras[:-1]
        return "\n\n".join("\n".join(t for _, t in p) for p in paras).strip()

    @property
    def summary(self) -> str:
        """The description's first paragraph on one line (for the index)."""
        desc = self.description
        if not desc:
            return ""
        first = desc.split("\n\n", 1)[0]
        return " ".join(first.split())

    @property
    def hunks(self) -> list[Hunk]:
        return [h for f in self.files for h in f.hunks]

    def added_lines(self) -> list[AddedLine]:
        out: list[AddedLine] = []
        for h in self.hunks:
            new_no = h.new_start
            for offset, ln in enumerate(h.lines, start=1):
                tag = ln[:1]
                if tag == "+":
                    out.append(AddedLine(h.file, new_no, h.patch_line + offset, ln[1:]))
                    new_no += 1
                elif tag == " ":
                    new_no += 1
        return out

    def touched_files(self) -> list[str]:
        return [f.path for f in self.files]


def _paragraphs(lines: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    paras: list[list[tuple[int, str]]] = []
    cur: list[tuple[int, str]] = []
    for item in lines:
        if item[1].strip():
            cur.append(item)
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    return paras


def _decode_header(value: str) -> str:
    try:
        return str(make_header(decode_header(value)))
    except Exception:  # malformed encoded-words: keep the raw text
        return value


def _strip_path(p: str) -> str | None:
    p = p.split("\t", 1)[0]
    if p == "/dev/null":
        return None
    if p.startswith(("a/", "b/")):
        return p[2:]
    return p


def parse_patch(path: Path | str, data: bytes | None = None) -> PatchFile:
    path = Path(path)
    raw = path.read_bytes() if data is None else data
    text = raw.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pf = PatchFile(path=path, raw=raw)
    i = 0
    n = len(lines)
    if i < n and lines[i].startswith("From ") and not lines[i].startswith("From:"):
        pf.from_line = lines[i]
        i += 1
    # Mail headers: "Key: value" lines (with folded continuations) up to a blank line.
    if i < n and re.match(r"^[A-Za-z][A-Za-z0-9-]*: ", lines[i]):
        pf.has_mail_headers = pf.from_line is not None or lines[i].lower().startswith(("from:", "subject:"))
    if pf.has_mail_headers:
        key = None
        while i < n and lines[i] != "":
            ln = lines[i]
            if ln[:1] in (" ", "\t") and key:
                pf.headers[key] += " " + ln.strip()
            else:
                k, _, v = ln.partition(":")
                key = k.strip().lower()
                pf.headers[key] = v.strip()
                if key == "subject":
                    pf.subject_line = i + 1
            i += 1
        i += 1  # blank line after headers
        subj = _decode_header(pf.headers.get("subject", ""))
        pf.subject = _PATCH_PREFIX_RE.sub("", subj, count=1).strip()
        if "from" in pf.headers:
            pf.headers["from"] = _decode_header(pf.headers["from"])
    # Message body: up to "---", the first diff, or an "Index:" line.
    while i < n:
        ln = lines[i]
        if ln == "---" or ln.startswith("diff --git ") or ln.startswith("Index: "):
            break
        pf.body.append((i + 1, ln))
        i += 1
    while pf.body and not pf.body[-1][1].strip():
        pf.body.pop()
    while pf.body and not pf.body[0][1].strip():
        pf.body.pop(0)
    if not pf.has_mail_headers and pf.body:
        # Plain diff with a free-form header: the first line stands in for a subject.
        pf.subject_line, pf.subject = pf.body.pop(0)
    # Diff section.
    cur: FileDiff | None = None
    hunk: Hunk | None = None
    old_left = new_left = 0
    while i < n:
        ln = lines[i]
        lineno = i + 1
        i += 1
        if hunk is not None and (old_left > 0 or new_left > 0):
            tag = ln[:1]
            if tag in (" ", "") and ln[:1] != "\\":
                hunk.lines.append(ln if ln else " ")
                old_left -= 1
                new_left -= 1
                continue
            if tag == "-":
                hunk.lines.append(ln)
                old_left -= 1
                continue
            if tag == "+":
                hunk.lines.append(ln)
                new_left -= 1
                continue
            if tag == "\\":
                hunk.lines.append(ln)
                continue
            hunk = None  # malformed hunk: fall through and parse the line afresh
        if hunk is not None and ln.startswith("\\"):
            hunk.lines.append(ln)
            continue
        if ln.startswith("diff --git "):
            m = re.match(r"^diff --git (\S+) (\S+)$", ln)
            a, b = (m.group(1), m.group(2)) if m else (None, None)
            cur = FileDiff(_strip_path(a) if a else None, _strip_path(b) if b else None, lineno)
            pf.files.append(cur)
            hunk = None
            continue
        if ln == "-- " and cur is not None:
            pf.signature_line = lineno
            break
        if cur is None:
            if ln.startswith("--- ") or ln.startswith("Index: "):
                cur = FileDiff(None, None, lineno)
                pf.files.append(cur)
            else:
                continue
        if ln.startswith("--- "):
            cur.old_path = _strip_path(ln[4:])
        elif ln.startswith("+++ "):
            cur.new_path = _strip_path(ln[4:])
            if cur.old_path is None and cur.new_path is None:
                pass
        elif ln.startswith("new file mode"):
            cur.old_path = None
        elif ln.startswith("deleted file mode"):
            cur.new_path = None
        elif ln.startswith("rename to "):
            cur.new_path = ln[len("rename to ") :]
        elif ln.startswith("rename from "):
            cur.old_path = ln[len("rename from ") :]
        elif ln.startswith("index "):
            cur.index_line = ln
        elif ln.startswith("Binary files ") or ln == "GIT binary patch":
            cur.binary = True
        else:
            m = _HUNK_RE.match(ln)
            if m:
                old_len = int(m.group(2)) if m.group(2) is not None else 1
                new_len = int(m.group(4)) if m.group(4) is not None else 1
                hunk = Hunk(
                    file=cur.path,
                    old_start=int(m.group(1)),
                    old_len=old_len,
                    new_start=int(m.group(3)),
                    new_len=new_len,
                    header=ln,
                    patch_line=lineno,
                )
                cur.hunks.append(hunk)
                old_left, new_left = old_len, new_len
    # A deleted file's hunks name the old path.
    for f in pf.files:
        for h in f.hunks:
            h.file = f.path
    return pf


def index_is_full(fd: FileDiff) -> bool:
    if fd.index_line is None:
        return True
    m = _INDEX_RE.match(fd.index_line)
    return m is not None and len(m.group(1)) == 40 and len(m.group(2)) == 40
