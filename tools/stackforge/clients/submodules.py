"""The git submodules of a pinned upstream (``upstreams.<name>.submodules: true``), fetched on the host.

The superproject's tree at the pinned commit records each submodule as a *gitlink* (mode 160000: a path and a
commit id); its ``.gitmodules`` at that commit gives the URL. Each submodule is fetched into the cache like an
upstream (a bare mirror per URL, :func:`stackforge.clients.upstream.fetch_upstream`), must hold exactly the commit
the gitlink names, and is walked the same way for its own submodules (at most :data:`MAX_DEPTH` levels,
:data:`MAX_SUBMODULES` in all); one declared ``update = none`` is left out, as ``git clone --recursive`` leaves it. The export writes each one's tree at that commit into the superproject's tree.

``.gitmodules`` is the upstream's data, read as hostile input: it is parsed by ``git config --blob`` without
includes, and every entry is checked before anything is fetched: a path is relative, inside the tree, made of
plain segments (no ``.``, ``..`` or ``.git``); a URL is an https/http/ssh/git URL or ``user@host:path``, never
an option (``-u…``), a transport helper (``ext::…``) or shell text; a relative URL (``../other.git``) is
resolved against the superproject's URL and may not climb above its host; a ``file://`` URL or a local path is
accepted only when the superproject itself is local (a remote upstream cannot make the build read the host's
files). Each refusal is one UserError naming ``upstreams.<name>.submodules``, the submodule's path and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from stackforge import grammar
from stackforge.clients import upstream as sources
from stackforge.clients.git import git
from stackforge.clients.upstream import export_commit
from stackforge.errors import UserError
from stackforge.urls import redact
from stackforge.urls import split as split_credentials

if TYPE_CHECKING:
    from stackforge.clients.workspace import Workspace

MAX_DEPTH = 8
MAX_SUBMODULES = 256
MAX_GITMODULES = 1 << 20  # bytes
GITLINK = b"160000"
SEGMENT = re.compile(r"[A-Za-z0-9_+@][A-Za-z0-9._+@-]{0,254}|\.[A-Za-z0-9_+@-][A-Za-z0-9._+@-]{0,253}")
SCP = re.compile(r"^(?:[A-Za-z0-9._-]+@)?([A-Za-z0-9][A-Za-z0-9.-]*):(?!//)(.*)$")
REMOTE_SCHEMES = ("https", "http", "ssh", "git")
SKIP = "\0update=none"  # a submodule declared ``update = none``: not fetched, its directory stays empty


@dataclass(frozen=True)
class Submodule:
    """One submodule of an upstream: where it sits in the upstream's tree, where it was fetched from and the
    commit its gitlink names; ``repo`` is a repository holding that commit (not recorded)."""

    path: str
    url: str
    commit: str
    repo: Path

    def record(self) -> dict[str, str]:
        """What the evidence, the inputs fingerprint and the mirror's manifest hold of it."""
        return {"path": self.path, "url": redact(self.url), "commit": self.commit}


#: ``(url, commit, path) -> a repository holding commit``; raises UserError when it cannot
Fetch = Callable[[str, str, str], Path]


def _refuse(upstream: str, path: str, message: str, fix: str) -> UserError:
    return UserError(f"upstreams.{upstream}.submodules: submodule {path}: {message}", fix=fix)


HOSTILE_FIX = (
    "the upstream's .gitmodules is malformed or hostile: pin a commit whose submodules use plain "
    "https/ssh URLs and paths inside the tree, or drop submodules: true"
)


def check_path(path: str) -> str | None:
    """Why ``path`` (a submodule path, relative to the tree it sits in) is refused, or None."""
    parts = path.split("/")
    if not path or len(path) > 1024 or path.startswith("/"):
        return f"its path {path[:120]!r} is not a relative path inside the tree"
    for part in parts:
        if part in ("", ".", "..") or part.lower() == ".git" or not SEGMENT.fullmatch(part):
            return f"its path {path[:120]!r} is not a plain path inside the tree (segment {part[:60]!r})"
    return None


def _is_local(url: str) -> bool:
    return url.startswith("/") or url.startswith("file://")


def _parent(base: str) -> str | None:
    """``base`` with its last path segment removed; None when it has no path segment left (the host)."""
    base = base.rstrip("/")
    if "://" in base:
        scheme, rest = base.split("://", 1)
        host, _, path = rest.partition("/")
        if "/" in path:
            return f"{scheme}://{host}/{path.rsplit('/', 1)[0]}"
        return f"{scheme}://{host}" if path and scheme != "file" else None  # never above the host or /
    m = SCP.match(base)
    if m and not base.startswith("/"):
        head, path = base[: m.start(2)], m.group(2).rstrip("/")
        if not path:
            return None
        return head + (path.rsplit("/", 1)[0] if "/" in path else "")
    if base in ("", "/"):
        return None
    return str(PurePosixPath(base).parent)


def resolve_url(raw: str, base: str) -> str | None:
    """``raw`` from .gitmodules, a relative one (``./x``, ``../x``) resolved against ``base`` (the URL the
    superproject was fetched from) as git resolves it; None when it climbs above ``base``'s host or root."""
    if not (raw.startswith("./") or raw.startswith("../")):
        return raw
    rel, cur = raw, base.rstrip("/")
    while rel.startswith("./") or rel.startswith("../"):
        if rel.startswith("./"):
            rel = rel[2:]
            continue
        rel = rel[3:]
        parent = _parent(cur)
        if parent is None:
            return None
        cur = parent
    if not rel or any(p in (".", "..") for p in rel.split("/")):
        return None
    return f"{cur}{rel}" if cur.endswith(":") else f"{cur.rstrip('/')}/{rel}"


def check_url(url: str, super_url: str) -> str | None:
    """Why submodule ``url`` (resolved) is refused for a superproject fetched from ``super_url``, or None."""
    shown = redact(url)
    if url.startswith("-") or re.match(r"^[A-Za-z0-9+._-]*::", url):
        return f"its URL {shown[:120]!r} is an option or a transport helper, not a repository URL"
    reason = grammar.check_git_source(url, shown[:120])
    if reason:
        return f"its URL is refused: {reason}"
    if "://" in url:
        scheme = url.split("://", 1)[0]
        if scheme == "file":
            path = url[len("file://") :]
            if any(p in (".", "..") for p in path.split("/")):
                return f"its URL {shown[:120]!r} has '.' or '..' segments"
        elif scheme not in REMOTE_SCHEMES:
            return f"its URL {shown[:120]!r} is not an https, http, ssh or git URL"
    elif url.startswith("/"):
        if any(p in (".", "..") for p in url.split("/")):
            return f"its URL {shown[:120]!r} has '.' or '..' segments"
    else:
        m = SCP.match(url)
        if not m or m.group(2).startswith("-"):
            return f"its URL {shown[:120]!r} is not a repository URL (https://, ssh://, git://, user@host:path)"
    if _is_local(url) and not _is_local(super_url):
        return (
            f"its URL {shown[:120]!r} is a path on this host, but the upstream is remote "
            f"({redact(super_url)}): a remote .gitmodules may not make the build read local files"
        )
    return None


def gitlinks(repo: Path, commit: str) -> dict[str, str]:
    """Path -> commit of every gitlink in the tree of ``commit``."""
    out = git(repo, "ls-tree", "-r", "-z", "--full-tree", commit, binary=True).stdout
    links: dict[str, str] = {}
    for entry in out.split(b"\0"):
        meta, _, path = entry.partition(b"\t")
        fields = meta.split(b" ")
        if len(fields) == 3 and fields[0] == GITLINK:
            links[path.decode("utf-8", "surrogateescape")] = fields[2].decode()
    return links


def gitmodules(repo: Path, commit: str, upstream: str, where: str) -> dict[str, dict[str, str]]:
    """The entries of ``.gitmodules`` at ``commit``: name -> {key: value}; {} without the file."""
    blob = f"{commit}:.gitmodules"
    size = git(repo, "cat-file", "-s", blob, check=False)
    if not size.ok:
        return {}
    if not size.stdout.strip().isdigit() or int(size.stdout.strip()) > MAX_GITMODULES:
        raise _refuse(upstream, where, f".gitmodules is larger than {MAX_GITMODULES} bytes", HOSTILE_FIX)
    res = git(repo, "config", "--blob", blob, "--no-includes", "--null", "--list", check=False, binary=True)
    if not res.ok:
        raise _refuse(upstream, where, f".gitmodules cannot be parsed: {res.stderr.strip()[:200]}", HOSTILE_FIX)
    entries: dict[str, dict[str, str]] = {}
    for item in res.stdout.split(b"\0"):
        key, _, value = item.decode("utf-8", "surrogateescape").partition("\n")
        if not key.startswith("submodule.") or key.count(".") < 2:
            continue
        name, var = key[len("submodule.") :].rsplit(".", 1)
        entries.setdefault(name, {})[var] = value
    return entries


def collect(
    upstream: str,
    repo: Path,
    commit: str,
    url: str,
    fetch: Fetch,
    *,
    prefix: str = "",
    depth: int = 0,
    found: list[Submodule] | None = None,
) -> list[Submodule]:
    """Every submodule of ``commit`` (in ``repo``, fetched from ``url``), recursively, parents before their
    children; each fetched through ``fetch`` and checked to be at its gitlink's commit."""
    found = [] if found is None else found
    where = prefix.rstrip("/") or "."
    entries = gitmodules(repo, commit, upstream, where)
    by_path: dict[str, tuple[str, str | None]] = {}
    for name, entry in entries.items():
        path = entry.get("path")
        if path is None:
            continue
        shown = prefix + path
        reason = check_path(path)
        if reason:
            raise _refuse(upstream, shown[:120], reason, HOSTILE_FIX)
        raw = entry.get("url")
        resolved = None
        if raw is not None:
            resolved = resolve_url(raw, url)
            if resolved is None:
                raise _refuse(
                    upstream, shown, f"its relative URL {redact(raw)[:120]!r} climbs above {redact(url)}", HOSTILE_FIX
                )
            resolved = split_credentials(resolved)[0]
            reason = check_url(resolved, url)
            if reason:
                raise _refuse(upstream, shown, reason, HOSTILE_FIX)
        if entry.get("update", "").strip().lower() == "none":
            resolved = SKIP  # `git clone --recursive` leaves it out too
        by_path[path] = (name, resolved)
    for path, sub_commit in sorted(gitlinks(repo, commit).items()):
        shown = prefix + path
        reason = check_path(path)
        if reason:
            raise _refuse(upstream, shown[:120], reason, HOSTILE_FIX)
        name, sub_url = by_path.get(path, (path, None))
        if sub_url == SKIP:
            continue
        if sub_url is None:
            raise _refuse(
                upstream,
                shown,
                f"the tree at {commit[:12]} records it (commit {sub_commit}) but .gitmodules gives no URL for it",
                "pin a commit whose .gitmodules names every submodule, or drop submodules: true",
            )
        if depth >= MAX_DEPTH:
            raise _refuse(upstream, shown, f"submodules nest deeper than {MAX_DEPTH} levels", HOSTILE_FIX)
        if len(found) >= MAX_SUBMODULES:
            raise _refuse(upstream, shown, f"the upstream has more than {MAX_SUBMODULES} submodules", HOSTILE_FIX)
        sub_repo = fetch(sub_url, sub_commit, shown)
        found.append(Submodule(shown, sub_url, sub_commit, sub_repo))
        collect(upstream, sub_repo, sub_commit, sub_url, fetch, prefix=shown + "/", depth=depth + 1, found=found)
    return found


def cache_fetch(
    upstream: str,
    cache_dir: Path | str,
    *,
    offline: bool = False,
    workspace: Workspace | None = None,
    reuse: bool = True,
) -> Fetch:
    """A :data:`Fetch` through the host's cache (a bare mirror per URL, as upstreams are fetched)."""

    def fetch(url: str, commit: str, path: str) -> Path:
        spec = sources.UpstreamSpec(git=url, commit=commit, name=f"{upstream} submodule {path}")
        try:
            return sources.fetch_upstream(spec, cache_dir, offline=offline, workspace=workspace, reuse=reuse)
        except UserError as err:
            raise _refuse(
                upstream,
                path,
                f"its commit {commit} cannot be fetched from {redact(url)}: {err.message}",
                "the pinned commit records a submodule commit its URL does not serve (or the URL cannot be "
                "reached): pin a commit whose submodule commits are published, or drop submodules: true",
            ) from None

    return fetch


def repo_fetch(upstream: str, repo: Path, fix: str) -> Fetch:
    """A :data:`Fetch` that finds every commit in ``repo`` (a mirror's repository of the upstream, which holds
    its submodules' commits too), never the network."""

    def fetch(url: str, commit: str, path: str) -> Path:
        if git(repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False).ok:
            return repo
        raise _refuse(upstream, path, f"the mirror holds no commit {commit} of {redact(url)}", fix)

    return fetch


def export(subs: list[Submodule], dest: Path) -> None:
    """Write each submodule's tree at its commit into ``dest`` (the superproject's exported tree; a gitlink
    exports as an empty directory), parents before children, never through a link."""

    for sub in subs:
        cur = dest
        for part in sub.path.split("/"):
            cur = cur / part
            if cur.is_symlink() or not cur.is_dir():
                raise UserError(
                    f"submodule {sub.path}: {cur.relative_to(dest)} in the exported tree is not a directory",
                    fix="the tree and its submodules disagree; pin another commit or drop submodules: true",
                )
        export_commit(sub.repo, sub.commit, cur)
