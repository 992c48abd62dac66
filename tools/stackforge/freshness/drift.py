"""`stackforge drift STACK`: the stack against an upstream's own files at a newer revision.

For each upstream that declares ``agree:`` (or the one ``--upstream`` names), the files it names are read from the
host's mirror at the pinned commit and at a newer ref (``--at``: a branch, a tag or a commit; default: the head of
the upstream's default branch), and compared with :func:`stackforge.stack.agreement.drift`: exact pins that moved,
lines added or removed, new constraints (``huggingface_hub<2.0``), and KEY=VALUE values (the vLLM tag the plugin's
``third_party/PINS`` names), each with its file and line. The mirror is fetched first unless ``fetch`` is off
(then the cache answers, or the upstream is "not fetched").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stackforge.builder.sources import agree
from stackforge.clients import upstream as sources
from stackforge.clients.git import git, rev_parse
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import UserError
from stackforge.stack import agreement
from stackforge.stack.agreement import DriftRow
from stackforge.stack.load import LoadedStack
from stackforge.urls import split


@dataclass
class UpstreamDrift:
    upstream: str
    pinned: str  # the pinned commit
    pin: str  # tag@commit, as the stack writes it
    ref: str  # the newer ref asked for (or the default branch)
    commit: str  # what ref names
    rows: list[DriftRow] = field(default_factory=list)
    keys: dict[str, dict[str, dict]] = field(default_factory=dict)  # path -> KEY -> {value, line, stack} at ref
    missing: list[str] = field(default_factory=list)  # files named by agree: that ref does not have

    def to_json(self) -> dict:
        return {
            "upstream": self.upstream,
            "pinned": {"pin": self.pin, "commit": self.pinned},
            "at": {"ref": self.ref, "commit": self.commit},
            "drifted": bool(self.rows),
            "rows": [r.to_json() for r in self.rows],
            "keys": self.keys,
            "missing": self.missing,
        }


@dataclass
class DriftReport:
    stack: str
    upstreams: list[UpstreamDrift] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        return any(u.rows for u in self.upstreams)

    @property
    def exit_code(self) -> int:
        return 1 if self.drifted else 0

    def to_json(self) -> dict:
        return {"stack": self.stack, "drifted": self.drifted, "upstreams": [u.to_json() for u in self.upstreams]}

    def render(self) -> str:
        out: list[str] = []
        for u in self.upstreams:
            at = f"{u.ref}@{u.commit[:12]}"
            head = f"{self.stack}: upstream {u.upstream} {u.pin} → {at}"
            if not u.rows:
                out.append(f"{head}: no drift")
            else:
                out.append(f"{head}: {len(u.rows)} change(s)")
                out.append("")
                pinned = u.pin.split("@")[0] if "@" in u.pin else u.pin[:12]
                cells = [["change", "package", "stack", pinned, u.ref, "where"]]
                for r in u.rows:
                    stack = r.stack or ""
                    if r.agrees is False:
                        stack += " (differs)"
                    cells.append([r.change, r.package, stack, r.before or "", r.after or "", r.where])
                widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
                for n, row in enumerate(cells):
                    out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
                    if n == 0:
                        out.append("| " + " | ".join("-" * w for w in widths) + " |")
            for path, keys in u.keys.items():
                named = ", ".join(
                    f"{k}={v['value']}" + (f" (line {v['line']})" if v["line"] else "") for k, v in keys.items()
                )
                out.append(f"  {path} at {u.ref}: {named}")
            for path in u.missing:
                out.append(f"  {path}: not in the upstream at {u.ref}")
            out.append("")
        return "\n".join(out).rstrip("\n") + "\n"


def _agreeing(loaded: LoadedStack, upstream: str | None) -> list[str]:
    stack = loaded.model
    declared = [n for n, up in stack.upstreams.items() if up.agree is not None]
    if upstream is None:
        if not declared:
            raise UserError(
                f"stack '{loaded.name}' has no upstream that declares agree: (nothing to compare)",
                fix="declare upstreams.<name>.agree: {requirements: [...]} for the upstream whose own pins the stack "
                "follows",
            )
        return declared
    if upstream not in stack.upstreams:
        raise UserError(
            f"--upstream {upstream}: stack '{loaded.name}' has no upstream '{upstream}'",
            fix=f"name one of: {', '.join(stack.upstreams)}",
        )
    if upstream not in declared:
        raise UserError(
            f"--upstream {upstream}: upstreams.{upstream} declares no agree: (nothing to compare)",
            fix=f"name one that does ({', '.join(declared) or 'none does'}), or declare upstreams.{upstream}.agree",
        )
    return [upstream]


def default_branch(mirror: Path, url: str, workspace: Workspace, fetch: bool) -> str:
    """The upstream's default branch: asked of the upstream when ``fetch`` (and recorded as the mirror's HEAD),
    else the mirror's HEAD as last recorded."""

    if fetch:
        clean, in_url = split(url)
        credential = in_url or workspace.url_credential(clean)
        env = sources.git_credential_env(clean, credential)
        res = git(mirror, "ls-remote", "--symref", "origin", "HEAD", check=False, env=env, timeout=120)
        for line in res.stdout.splitlines():
            if line.startswith("ref: refs/heads/") and line.endswith("\tHEAD"):
                branch = line[len("ref: refs/heads/") : -len("\tHEAD")]
                git(mirror, "symbolic-ref", "HEAD", f"refs/heads/{branch}", check=False)
                return branch
    head = git(mirror, "symbolic-ref", "--short", "HEAD", check=False).stdout.strip()
    if head and rev_parse(mirror, f"refs/heads/{head}"):
        return head
    raise UserError(
        "cannot tell the upstream's default branch from the cache",
        fix="pass --at BRANCH (or a tag or commit), or run with network so the upstream is asked",
    )


def resolve(mirror: Path, ref: str) -> str | None:
    """The commit ``ref`` names in the mirror: a branch, a tag, or a commit id."""
    for candidate in (f"refs/heads/{ref}", f"refs/tags/{ref}", ref):
        if candidate == ref and ref.startswith("-"):
            return None
        found = rev_parse(mirror, candidate)
        if found:
            return found
    return None


def upstream_drift(
    loaded: LoadedStack, name: str, *, at: str | None, workspace: Workspace, fetch: bool = True
) -> UpstreamDrift:
    """Upstream ``name`` (it declares ``agree``) at its pin against ``at`` (default: its default branch's head)."""
    up = loaded.model.upstreams[name]
    spec = up.agree
    assert spec is not None
    if up.git is None or up.commit is None:
        raise UserError(
            f"upstreams.{name} is a release sdist: it has no newer revisions to compare with",
            fix="run drift for a git upstream",
        )
    if fetch:
        mirror: Path | None = agree.fetch_mirror(loaded, name, workspace, refresh=True)
    else:
        mirror = agree.cached_mirror(loaded, name, workspace)
    if mirror is None:
        raise UserError(
            f"upstream {name} at {up.commit} is not fetched",
            fix=f"run stackforge render {loaded.name}, or drift with network",
        )
    ref = at or default_branch(mirror, up.git, workspace, fetch)
    commit = resolve(mirror, ref)
    if commit is None:
        raise UserError(
            f"--at {ref}: neither a branch, a tag nor a commit of upstream {name}",
            fix="name a branch or tag of the upstream (git ls-remote shows them), or a full commit id",
        )
    before_read = agree.git_reader(mirror, up.commit, name)
    after_read = agree.git_reader(mirror, commit, name)
    before, _ = agree.read_lines(loaded, name, before_read)
    after, gone = agree.read_lines(loaded, name, after_read)
    wanted = agree.key_values(loaded, name)
    keys_before, keys_after, shown = {}, {}, {}
    for path, keys in wanted.items():
        text_b, text_a = before_read(path), after_read(path)
        keys_before[path] = agreement.parse_keys(text_b) if text_b is not None else {}
        keys_after[path] = agreement.parse_keys(text_a) if text_a is not None else {}
        shown[path] = {
            k: {
                "value": keys_after[path].get(k, (None, None))[0],
                "line": keys_after[path].get(k, (None, None))[1],
                "stack": value,
            }
            for k, (_, value) in keys.items()
        }
    rows = agreement.drift(
        before,
        after,
        agree.pins(loaded),
        env=agree.environment(loaded),
        keys_before=keys_before,
        keys_after=keys_after,
        key_values={p: {k: v for k, (_, v) in keys.items()} for p, keys in wanted.items()},
    )
    _, was = agree.read_lines(loaded, name, before_read)
    missing = sorted({f.path for f in gone if f.path and f.package == ""} - {f.path for f in was if f.path})
    return UpstreamDrift(name, up.commit, up.pin, ref, commit, rows, shown, missing)


def drift(
    loaded: LoadedStack,
    *,
    upstream: str | None = None,
    at: str | None = None,
    workspace: Workspace | None = None,
    fetch: bool = True,
) -> DriftReport:
    """The stack's drift against each upstream that declares ``agree`` (or ``upstream``) at ``at``."""
    ws = workspace_for(loaded, workspace)
    report = DriftReport(loaded.name)
    for name in _agreeing(loaded, upstream):
        report.upstreams.append(upstream_drift(loaded, name, at=at, workspace=ws, fetch=fetch))
    return report


def nightly_cell(loaded: LoadedStack, workspace: Workspace | None = None, *, fetch: bool = True) -> dict:
    """What the nightly summary shows for a stack: ``{"drifted", "rows", "upstreams"}``, or ``{"error"}`` with
    the reason drift is n/a (no upstream declares agree, the upstream cannot be fetched, …)."""
    try:
        report = drift(loaded, workspace=workspace, fetch=fetch)
    except UserError as err:
        return {"error": f"n/a: {err.message}"}
    return {
        "drifted": report.drifted,
        "rows": sum(len(u.rows) for u in report.upstreams),
        "upstreams": [u.to_json() for u in report.upstreams],
    }


def nightly_line(stack: str, data: dict) -> str:
    """One markdown row: stack | drifted? | what drifted."""
    if data.get("error"):
        return f"| {stack} | n/a | {data['error'][5:] if data['error'].startswith('n/a: ') else data['error']} |"
    what = []
    for u in data["upstreams"]:
        for r in u["rows"]:
            change = f"{r['before'] or '∅'} → {r['after'] or '∅'}"
            what.append(f"{u['upstream']}: {r['change']} {r['package']} {change} ({r['where']})")
    verdict = "yes" if data["drifted"] else "no"
    return f"| {stack} | {verdict} | {'; '.join(what).replace('|', '/')} |"
