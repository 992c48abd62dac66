"""Stale references: tracked files that still name versions, tags or commits a stack moved away from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from stackforge.clients.git import git
from stackforge.errors import UserError
from stackforge.freshness.lines import standalone
from stackforge.stack.load import LoadedStack, load
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin

ALLOW_FILE = "stacks/audit-allow.txt"
MAX_AUDIT_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class StaleToken:
    text: str
    package: str
    before: str
    after: str

    def pattern(self) -> str:
        return standalone(self.text)


@dataclass
class AuditHit:
    path: str
    line: int
    col: int
    token: StaleToken
    text: str
    allowed_by: str | None = None

    def render(self) -> str:
        t = self.token
        return (
            f"{self.path}:{self.line}:{self.col}: {t.text} ({t.package} was {t.before}, now {t.after})"
            f"{' [allowed: ' + self.allowed_by + ']' if self.allowed_by else ''}\n    {self.text.strip()[:160]}"
        )

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "stale": self.token.text,
            "package": self.token.package,
            "before": self.token.before,
            "after": self.token.after,
            "text": self.text.rstrip("\n"),
            "allowed_by": self.allowed_by,
        }


@dataclass
class AuditReport:
    stack: str
    against: str
    tokens: list[StaleToken]
    hits: list[AuditHit]
    files_scanned: int

    @property
    def findings(self) -> list[AuditHit]:
        return [h for h in self.hits if h.allowed_by is None]

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def to_json(self) -> dict:
        return {
            "stack": self.stack,
            "against": self.against,
            "files_scanned": self.files_scanned,
            "stale": [t.text for t in self.tokens],
            "findings": [h.to_json() for h in self.findings],
            "allowed": [h.to_json() for h in self.hits if h.allowed_by],
            "exit_code": self.exit_code,
        }

    def render(self, show_allowed: bool = False) -> str:
        out = [
            f"audit {self.stack} against {self.against}: looking for "
            + (", ".join(t.text for t in self.tokens) or "nothing (no version moved)")
        ]
        for h in self.hits:
            if h.allowed_by is None or show_allowed:
                out.append(h.render())
        allowed = len(self.hits) - len(self.findings)
        out.append(
            f"{len(self.findings)} stale reference(s) in {self.files_scanned} tracked text files"
            + (f"; {allowed} allowed by {ALLOW_FILE} or the stack chain" if allowed else "")
        )
        return "\n".join(out)


def stale_tokens(old: Stack, new: Stack, lines: tuple[Stack, ...] = ()) -> list[StaleToken]:
    """The strings a tree should no longer contain once ``new`` replaces ``old``.

    Per package whose pin moved: the old version, its tag-safe form (``+`` → ``_``, as image tags write
    it), and its public part when that is not simply a prefix of the new public version (``2.11.0.post1``
    for torch, ``0.1.83`` for torchada; but not ``2.11.0`` for torchaudio ``2.11.0`` → ``2.11.0.post2``).
    Per upstream whose pin moved: the old tag and the old commit (also abbreviated, 7+ hex digits).
    Matches must stand alone: ``2.11.0.post1`` does not match inside ``2.11.0.post10`` or ``12.11.0.post1``.
    A version another platform line of ``new`` pins (``lines``), or its public part, is current, not stale (the
    aarch64 line's ``2.11.0.post1+musa5.2.1mp22`` keeps ``2.11.0.post1``).
    """
    tokens: dict[str, StaleToken] = {}
    new_versions = {p.version for p in new.packages.values()}
    on_lines = {p.version for line in lines for p in line.packages.values()}
    new_versions |= on_lines | {Pin(v).public for v in on_lines}
    for name, pkg in old.packages.items():
        after = new.packages[name].version if name in new.packages else "(removed)"
        if after == pkg.version:
            continue
        before = pkg.version
        cands = [before]
        if "+" in before:
            cands.append(before.replace("+", "_"))
            old_pub = Pin(before).public
            new_pub = Pin(after).public if after != "(removed)" else ""
            if old_pub != new_pub and not new_pub.startswith(old_pub + ".") and old_pub not in new_versions:
                cands.append(old_pub)
        for c in cands:
            if c not in new_versions:
                tokens.setdefault(c, StaleToken(c, name, before, after))
    for name, up in old.upstreams.items():
        nu = new.upstreams.get(name)
        if nu is None:
            continue
        if up.tag and up.tag != nu.tag:
            tokens.setdefault(up.tag, StaleToken(up.tag, f"upstream {name}", up.tag, nu.tag or "-"))
        if up.commit and up.commit != nu.commit:
            tokens.setdefault(up.commit, StaleToken(up.commit, f"upstream {name}", up.commit, nu.commit or "-"))
    return list(tokens.values())


def _commit_regex(commit: str) -> str:
    return rf"(?<![0-9a-fA-F]){re.escape(commit[:7])}[0-9a-f]{{0,{len(commit) - 7}}}(?![0-9a-fA-F])"


@dataclass
class AllowRule:
    glob: str
    token: str | None
    where: str

    def matches(self, path: str, token: str) -> bool:
        return _glob_match(path, self.glob) and (self.token is None or self.token == token)


def _glob_match(path: str, pattern: str) -> bool:
    if pattern.endswith("/"):
        pattern += "**"
    rx = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            rx += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            rx += ".*"
            i += 2
        else:
            ch = pattern[i]
            rx += "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch)
            i += 1
    return re.fullmatch(rx, path) is not None


def load_allow_list(path: Path, display: str = ALLOW_FILE) -> list[AllowRule]:
    """``stacks/audit-allow.txt``: one rule per line, ``GLOB [STALE-STRING]``, ``#`` starts a comment.

    ``GLOB`` matches repository paths (``*`` within a directory, ``**`` across directories, a trailing
    ``/`` means everything below). Without ``STALE-STRING`` every stale string is allowed in matching
    files; with it, only that one.
    """
    if not path.exists():
        return []
    rules_: list[AllowRule] = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) > 2:
            raise UserError(
                f"expected 'GLOB [STALE-STRING]', got {len(parts)} words",
                file=display,
                line=n,
                col=1,
                fix="one glob and at most one version string per line; comments start with #",
            )
        rules_.append(AllowRule(parts[0], parts[1] if len(parts) > 1 else None, f"{display}:{n}"))
    return rules_


def tracked_files(root: Path) -> list[str]:
    """Paths (relative to ``root``) of the files git tracks there."""
    res = git(root, "ls-files", "-z", check=False, binary=True)
    if not res.ok:
        raise UserError(
            f"{root}: cannot list tracked files with git (exit {res.returncode}: {res.stderr.strip()})",
            fix="run the audit inside a git checkout",
        )
    out = res.stdout if isinstance(res.stdout, bytes) else res.stdout.encode()
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def audit(loaded: LoadedStack, against: LoadedStack | None = None, *, allow_file: Path | None = None) -> AuditReport:
    """Scan the repository's tracked text files for versions the stack moved away from (since ``against``,
    default: its parent)."""
    stack, root = loaded.model, loaded.root
    if against is None:
        if not stack.inherits:
            raise UserError(f"stack {stack.name} has no parent to compare with", fix="pass --against OLD")
        against = load(stack.inherits, root=root)
    tokens = stale_tokens(against.model, stack, tuple(line.model for line in loaded.platform_lines().values()))
    allow_path = allow_file or (root / ALLOW_FILE)
    try:
        display = str(allow_path.resolve().relative_to(root.resolve()))
    except ValueError:
        display = str(allow_path)
    allow = load_allow_list(allow_path, display)
    # The old stack's own files declare the old pins by design.
    chain = set(against.files)
    regexes = []
    for t in tokens:
        rx = _commit_regex(t.text) if re.fullmatch(r"[0-9a-f]{40}", t.text) else t.pattern()
        regexes.append((t, re.compile(rx)))
    hits: list[AuditHit] = []
    scanned = 0
    for rel in tracked_files(root):
        path = root / rel
        try:
            if not path.is_file() or path.stat().st_size > MAX_AUDIT_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        scanned += 1
        if not regexes:
            continue
        text = data.decode("utf-8", "replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for t, token_rx in regexes:
                for m in token_rx.finditer(line):
                    if len(t.text) == 40 and not t.text.startswith(m.group(0)):
                        continue
                    allowed = None
                    if rel in chain:
                        allowed = f"{rel} is part of stack {against.name}"
                    elif rel == display:
                        allowed = "the allow-list itself"
                    else:
                        for rule in allow:
                            if rule.matches(rel, t.text):
                                allowed = rule.where
                                break
                    hits.append(AuditHit(rel, lineno, m.start() + 1, t, line, allowed))
    # One line may hold both a full version and its public part: keep the longest match per position.
    hits = _dedupe(hits)
    return AuditReport(stack.name, against.name, tokens, hits, scanned)


def _dedupe(hits: list[AuditHit]) -> list[AuditHit]:
    out: list[AuditHit] = []
    for h in sorted(hits, key=lambda h: (h.path, h.line, h.col, -len(h.token.text))):
        if out and out[-1].path == h.path and out[-1].line == h.line:
            prev = out[-1]
            if prev.col <= h.col < prev.col + len(prev.token.text):
                continue
        out.append(h)
    return out
