"""Fetch a pinned upstream into a host-side cache and export a clean tree of it.

Two kinds of source, both checked before anything is built from them:

- git: a bare mirror per URL under ``<cache>/git/`` (created once, then
  fetched). The pinned commit must be present and must be exactly the commit
  the pinned tag points to (annotated tags are peeled); anything else is a
  UserError naming the tag, the expected commit and the actual one.
- release sdist: ``name==version`` found on a PEP 503 simple index, the
  ``.tar.gz`` downloaded into ``<cache>/sdist/<sha256>/`` and checked against
  the pinned sha256.

An upstream is an :class:`UpstreamPin`: ``git``, ``tag``, ``commit``, optional ``sdist`` (an
:class:`SdistPin`: ``name``, ``version``, ``sha256``) and optional ``patches``; the stack's
``upstreams.<name>`` and an :class:`UpstreamSpec` both are one. An sdist is downloaded from an
:class:`SdistSpec` (it carries the index URL). Git runs through ``clients.git.git``; this module knows
nothing about patch series.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from packaging.utils import canonicalize_name

from stackforge import fslock, netread, progress
from stackforge.clients.git import git, rev_parse
from stackforge.clients.index import IndexClient, IndexQueryError
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.urls import Credential, redact, redact_text, scrub
from stackforge.urls import split as split_credentials

if TYPE_CHECKING:
    import requests

# --- specs ---------------------------------------------------------------------


@dataclass
class SdistSpec:
    index_url: str
    name: str
    version: str
    sha256: str


@dataclass
class UpstreamSpec:
    git: str | None = None
    tag: str | None = None
    commit: str | None = None
    sdist: SdistSpec | None = None
    patches: str | None = None
    name: str | None = None


class SdistPin(Protocol):
    """A pinned release sdist: the stack's ``upstreams.<name>.sdist`` or an :class:`SdistSpec`."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def sha256(self) -> str: ...


class UpstreamPin(Protocol):
    """A pinned upstream: the stack's ``upstreams.<name>`` (``stack.model.Upstream``) or an :class:`UpstreamSpec`."""

    @property
    def git(self) -> str | None: ...
    @property
    def tag(self) -> str | None: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def sdist(self) -> SdistPin | None: ...
    @property
    def patches(self) -> str | None: ...


def sdist_of(spec: UpstreamPin) -> SdistSpec | None:
    """The upstream's sdist with its index URL (None when it declares none). The stack's own sdist names its
    index; a caller that has the stack gives an :class:`UpstreamSpec` with the URL looked up."""
    sdist = spec.sdist
    if sdist is None or isinstance(sdist, SdistSpec):
        return sdist
    raise UserError(
        f"the upstream sdist {sdist.name}=={sdist.version} is given without its index URL",
        fix="pass an UpstreamSpec whose SdistSpec carries the index URL (patches.ops does it from the stack)",
    )


def pinned_commit(spec: UpstreamPin) -> str:
    """The upstream's pinned commit; none is a UserError."""
    if not spec.commit:
        raise UserError(
            f"the upstream {redact(str(spec.git))} has no pinned commit",
            fix="set upstreams.<name>.commit to a full commit id",
        )
    return spec.commit


def sdist_index_url(sdist: SdistSpec) -> str:
    url = sdist.index_url
    if not url:
        raise UserError("the upstream sdist has no index URL", fix="set sdist.index_url (a PEP 503 simple index URL)")
    return str(url)


# --- git ------------------------------------------------------------------------


def git_credential_env(url: str, credential: Credential | None) -> dict[str, str]:
    """Environment that hands ``credential`` to git for ``url`` only, through ``GIT_CONFIG_*`` (never on
    the command line, where ``ps`` shows it): an ``Authorization`` header for user/password, and a
    ``url.<with token>.insteadOf`` rewrite for sensitive query parameters."""
    if credential is None or not re.match(r"^https?://", url):
        return {}
    entries: list[tuple[str, str]] = []
    if credential.auth:
        token = base64.b64encode(":".join(credential.auth).encode()).decode()
        entries.append((f"http.{url}.extraHeader", f"Authorization: Basic {token}"))
    if credential.query:
        entries.append((f"url.{credential.with_query(url)}.insteadOf", url))
    env = {"GIT_CONFIG_COUNT": str(len(entries))}
    for i, (key, value) in enumerate(entries):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def _is_remote_url(url: str) -> bool:
    return "://" in url or re.match(r"^[\w.-]+@[\w.-]+:", url) is not None


def resolve_git_url(url: str, root: Path | None = None) -> str:
    """A local path (relative to ``root``) becomes absolute; URLs pass through."""
    if _is_remote_url(url):
        return url
    p = Path(url)
    if not p.is_absolute():
        p = (root or Path.cwd()) / p
    if not p.exists():
        raise UserError(
            f"upstream git path {url} does not exist",
            file=str(p),
            fix="point upstreams.<name>.git at a repository URL or an existing local repository",
        )
    return str(p.resolve())


def mirror_path(url: str, cache_dir: Path | str) -> Path:
    """Where the bare mirror of ``url`` lives in the cache (one per URL)."""
    base = re.sub(r"\.git$", "", url.rstrip("/").rsplit("/", 1)[-1]) or "repo"
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base)
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(cache_dir) / "git" / f"{base}-{key}.git"


def _has_commit(mirror: Path, commit: str) -> bool:
    return git(mirror, "cat-file", "-e", f"{commit}^{{commit}}", check=False).ok


def peeled_tag(mirror: Path, tag: str) -> str | None:
    """The commit a tag points to, annotated tags peeled; None if the tag is absent."""
    return rev_parse(mirror, f"refs/tags/{tag}")


def verify_pin(mirror: Path, url: str, tag: str | None, commit: str) -> str:
    """Check that ``commit`` is in the mirror and that ``tag`` names it; return the full id."""
    if not _has_commit(mirror, commit):
        raise UserError(
            f"pinned commit {commit} is not in {url}",
            fix="check upstreams.<name>.commit; the commit must exist in the upstream repository",
        )
    full = git(mirror, "rev-parse", f"{commit}^{{commit}}").stdout.strip()
    if tag:
        actual = peeled_tag(mirror, tag)
        if actual is None:
            raise UserError(
                f"tag {tag} does not exist in {url} (expected it to point at {full})",
                fix="check upstreams.<name>.tag",
            )
        if actual != full:
            raise UserError(
                f"tag {tag} points at {actual}, but the stack pins commit {full}",
                fix=f"pin the commit the tag names (commit: {actual}) or the tag that names {full}",
            )
    return full


def _url_credential(url: str, workspace: Workspace | None) -> Credential | None:
    """The credential of ``url`` from the workspace's resolver (default: :meth:`Workspace.default`)."""
    return (workspace or Workspace.default()).url_credential(url)


def fetch_upstream(
    spec: UpstreamPin,
    cache_dir: Path | str,
    *,
    root: Path | None = None,
    offline: bool = False,
    workspace: Workspace | None = None,
    reuse: bool = False,
    credential: Credential | None = None,
) -> Path:
    """Create or update the bare mirror of ``spec.git`` and verify the pin. Returns the mirror path.

    The mirror tracks branches and tags (``refs/heads/*``, ``refs/tags/*``);
    a pinned commit only reachable from elsewhere is fetched by id. With
    ``offline`` the cache is used as it is, and a missing mirror is an error.
    With ``reuse`` (what a build asks for) a mirror that already holds the pinned commit, and the pinned tag
    naming it, is used without asking the upstream anything.
    A remote URL's credential is what it carries, else ``credential`` (what the stack gives for it), else the
    workspace's resolver's.
    """
    url_in, commit, tag = spec.git, spec.commit, spec.tag
    label = spec.name if isinstance(spec, UpstreamSpec) else None
    if not url_in:
        raise UserError("the upstream has no git URL", fix="set upstreams.<name>.git")
    commit = pinned_commit(spec)
    url, in_url = split_credentials(str(url_in))
    url = resolve_git_url(url, root)
    credential = in_url or ((credential or _url_credential(url, workspace)) if _is_remote_url(url) else None)
    auth_env = git_credential_env(url, credential)
    mirror = mirror_path(url, cache_dir)
    if offline:
        if not mirror.is_dir():
            raise UserError(
                f"no cached mirror of {url} at {mirror} and offline mode is on",
                fix="run once with network access, or drop --offline",
            )
    elif reuse and _holds_pin(mirror, tag, commit):
        _in_cache(label or redact(url), tag or commit[:12])
    else:
        # one fetch of a mirror at a time (another stackforge, another platform's build of this one): a second one
        # waits, then finds what the first fetched
        with fslock.entry_lock(mirror, f"the mirror of {redact(url)}"):
            if reuse and _holds_pin(mirror, tag, commit):
                _in_cache(label or redact(url), tag or commit[:12])
            else:
                with progress.step(f"fetch {label or redact(url)} {tag or commit[:12]} (git)"):
                    _update_mirror(mirror, url, commit, auth_env, credential)
    verify_pin(mirror, url, tag, commit)
    return mirror


def _in_cache(what: str, pin: str) -> None:
    progress.note(f"{what} {pin}: the pinned commit is in the cache (not fetched; --refresh fetches anyway)")


def _holds_pin(mirror: Path, tag: str | None, commit: str) -> bool:
    """Whether the cached mirror already has the pinned commit (and the pinned tag naming it)."""
    if not mirror.is_dir() or not _has_commit(mirror, commit):
        return False
    full = git(mirror, "rev-parse", f"{commit}^{{commit}}", check=False).stdout.strip()
    return tag is None or peeled_tag(mirror, tag) == full


def _update_mirror(
    mirror: Path, url: str, commit: str, auth_env: dict[str, str], credential: Credential | None
) -> None:
    """Create the bare mirror of ``url`` (atomically) or fetch into it; fetch ``commit`` by id if still missing."""
    if not mirror.is_dir():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=mirror.name + ".", dir=mirror.parent))
        try:
            git(None, "init", "--quiet", "--bare", str(tmp))
            git(tmp, "remote", "add", "origin", url, credential=credential)
            git(tmp, "config", "--replace-all", "remote.origin.fetch", "+refs/heads/*:refs/heads/*")
            git(tmp, "config", "--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*")
            git(tmp, "config", "remote.origin.mirror", "true")
            _fetch(tmp, url, auth_env, credential)
            tmp.rename(mirror)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    else:
        _fetch(mirror, url, auth_env, credential)
    if not _has_commit(mirror, commit):
        git(mirror, "fetch", "--quiet", "origin", commit, check=False, env=auth_env)


def _fetch(mirror: Path, url: str, auth_env: dict[str, str], credential: Credential | None) -> None:
    res = git(mirror, "fetch", "--quiet", "--prune", "--force", "origin", check=False, env=auth_env)
    if not res.ok:
        raise UserError(
            f"cannot fetch upstream {redact(url)}:\n{scrub(res.output, credential).strip()}",
            fix="check the URL and the network; a local path or a file:// URL works for mirrors",
        )


def commit_time(mirror: Path, commit: str) -> int:
    """Committer time of ``commit`` (seconds since the epoch): a SOURCE_DATE_EPOCH."""
    return int(git(mirror, "log", "-1", "--format=%ct", commit).stdout.strip())


def _prepare_dest(dest_dir: Path | str) -> Path:
    dest = Path(dest_dir)
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest} exists and is not empty", fix="choose an empty or new directory")
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def export_commit(mirror: Path, commit: str, dest_dir: Path | str) -> Path:
    """Write the tree of ``commit`` into ``dest_dir`` exactly as a checkout would (no .git)."""
    dest = _prepare_dest(dest_dir)
    with tempfile.TemporaryDirectory(prefix="stackforge-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        # Line-ending conversion from the user's configuration would change the bytes.
        plain = ["-c", "core.autocrlf=false", "-c", "core.eol=lf", "--git-dir", str(mirror), "--work-tree", str(dest)]
        git(None, *plain, "read-tree", commit, env=env)
        git(None, *plain, "checkout-index", "--all", "--force", env=env)
    return dest


def export_paths(mirror: Path, commit: str, paths: Sequence[str], dest_dir: Path | str) -> list[str]:
    """Write the files of ``commit``'s tree under each of ``paths`` (a file or a directory) into ``dest_dir`` at
    the same relative paths. Returns the paths the tree does not hold (then nothing is written)."""
    files: list[str] = []
    missing: list[str] = []
    for path in paths:
        listed = git(mirror, "ls-tree", "-r", "-z", "--name-only", commit, "--", path.rstrip("/"))
        found = [f for f in listed.stdout.split("\0") if f]
        if not found:
            missing.append(path)
        files += found
    if missing:
        return missing
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stackforge-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        plain = ["-c", "core.autocrlf=false", "-c", "core.eol=lf", "--git-dir", str(mirror), "--work-tree", str(dest)]
        git(None, *plain, "read-tree", commit, env=env)
        git(None, *plain, "checkout-index", "--force", "-z", "--stdin", env=env, input="\0".join(sorted(set(files))))
    return []


def export_upstream(
    spec: UpstreamPin,
    cache_dir: Path | str,
    dest_dir: Path | str,
    *,
    root: Path | None = None,
    offline: bool = False,
    workspace: Workspace | None = None,
    credential: Credential | None = None,
) -> Path:
    """Write a clean tree of the pinned upstream into ``dest_dir`` (``credential``: what the stack gives for its
    git URL or sdist index).

    The release sdist is the source when the spec declares one; otherwise the
    pinned git commit (verified against its tag) is exported from the mirror.
    """
    sdist = sdist_of(spec)
    if sdist:
        return export_sdist(sdist, cache_dir, dest_dir, offline=offline, workspace=workspace, credential=credential)
    mirror = fetch_upstream(spec, cache_dir, root=root, offline=offline, workspace=workspace, credential=credential)
    return export_commit(mirror, str(spec.commit), dest_dir)


# --- release sdists ---------------------------------------------------------------

SDIST_SECONDS = 3600.0  # one sdist download, start to end


def _download(
    url: str,
    dest: Path,
    sha256: str,
    client: IndexClient | None = None,
    transfer: progress.Transfer | None = None,
    size: int | None = None,
) -> None:
    """Write the sdist at ``url`` to ``dest`` (through ``dest.part``), hashed on the way and checked against
    ``sha256``: a local file, or an HTTP GET through ``client`` (an ``IndexClient``, whose credential goes only
    to the index's own origin) or anonymously. At most ``size`` bytes (what the index declared; else
    ``netread.DOWNLOAD_LIMIT``) within ``SDIST_SECONDS``; over a limit, on a broken connection or a wrong hash
    nothing is kept. Messages show the URL redacted."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return _copy_local(Path(urllib.parse.unquote(parsed.path)), url, dest, sha256, transfer)
    import requests

    session = client._session() if client is not None else netread.session(trust_env=True)
    params = client.params_for(url) if client is not None else {}
    auth = client.auth_for(url) if client is not None else None
    deadline = netread.Deadline(SDIST_SECONDS, "one sdist download")
    limit = size if size is not None else netread.DOWNLOAD_LIMIT
    try:
        with netread.guard(deadline, url), session.get(url, timeout=deadline.timeout(60), headers={"Accept": "*/*"},
                                                        params=params, auth=auth, stream=True) as resp:  # fmt: skip
            _check_status(resp, url)
            length = resp.headers.get("Content-Length", "")
            if transfer is not None and length.isdigit():
                transfer.total = int(length)
            netread.stream_to_file(resp, url, dest, limit, deadline=deadline, sha256=sha256, what="sdist",
                                   advance=transfer.advance if transfer is not None else None)  # fmt: skip
    except netread.Exceeded as exc:
        raise UserError(exc.message, fix=_MISMATCH_FIX if "sha256 mismatch" in exc.message else exc.fix) from None
    except requests.RequestException as exc:
        raise UserError(
            f"cannot reach sdist {redact(url)}: {type(exc).__name__}: {redact_text(str(exc))}",
            fix="check the index URL and the network",
        ) from None


_MISMATCH_FIX = "the file on the index is not the pinned one; check sdist.version and sdist.sha256"


def _check_status(resp: requests.Response, url: str) -> None:
    if resp.status_code in (401, 403):
        raise UserError(
            f"sdist {redact(url)} answered HTTP {resp.status_code} (credentials missing or refused)",
            fix="give the index's credentials: user:password@ in its URL, "
            "STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD, or a ~/.netrc entry for its host",
        )
    if resp.status_code != 200:
        raise UserError(
            f"sdist {redact(url)} answered HTTP {resp.status_code}", fix="check the index URL and the project name"
        )


def _copy_local(path: Path, url: str, dest: Path, sha256: str, transfer: progress.Transfer | None) -> None:
    """A local sdist (``file://``) copied to ``dest`` when its sha256 is ``sha256``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read sdist {redact(url)}: {exc.strerror}") from None
    if transfer is not None:
        transfer.advance(len(data))
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise UserError(f"sha256 mismatch for {redact(url)}: expected {sha256}, got {actual}", fix=_MISMATCH_FIX)
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data)
    part.replace(dest)


def declared_size(client: IndexClient | None, name: str, version: str, url: str) -> int | None:
    """The size the index declared for the file at ``url`` (None when it declared none)."""
    if client is None:
        return None
    for f in client.project(name).files_for(version):
        if urllib.parse.urldefrag(f.url)[0] == url:
            return f.size
    return None


def find_sdist(
    index_url: str, name: str, version: str, workspace: Workspace | None = None, credential: Credential | None = None
) -> tuple[str, IndexClient]:
    """``(URL of name-version.tar.gz, the IndexClient that found it)`` on a PEP 691/503 simple index;
    the client carries the index's credential (what the URL carries, else ``credential``, what the stack gives for
    its index, else the workspace's resolver's) for the download."""

    clean, in_url = split_credentials(index_url)
    client = IndexClient(index_url, credential=in_url or credential or _url_credential(clean, workspace))
    try:
        files = client.project(name).files_for(version)
    except IndexQueryError as exc:
        raise UserError(
            f"cannot read the index page of {name}: {exc.message}",
            fix=exc.fix or "check the index URL and the project name",
        ) from None
    for f in files:
        if f.kind == "sdist" and f.filename.endswith(".tar.gz"):
            return urllib.parse.urldefrag(f.url)[0], client
    raise UserError(
        f"no sdist {name}-{version}.tar.gz on {client.display_url}/{canonicalize_name(name)}/",
        fix="check sdist.name and sdist.version against the index",
    )


def find_sdist_url(index_url: str, name: str, version: str, workspace: Workspace | None = None) -> str:
    """The URL of ``name-version.tar.gz`` on a PEP 691/503 simple index (through the index client)."""
    return find_sdist(index_url, name, version, workspace)[0]


SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\.tar\.gz")


def sdist_file_name(url: str, name: str, version: str) -> str:
    """The cache file name of a downloaded sdist: the last segment of its URL, decoded, when that is a plain
    file name; an index that serves a name with a path in it (``..%2F..%2Fx.tar.gz``), a control character
    or anything but a ``.tar.gz`` is refused, so nothing is written outside the cache."""
    last = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if SAFE_FILE_NAME.fullmatch(last) and ".." not in last:
        return last
    raise UserError(
        f"the index serves sdist {name}=={version} under an unsafe file name {last[:120]!r}",
        fix="the index is misconfigured or hostile: a file name is one path segment ending in .tar.gz",
    )


def fetch_sdist(
    sdist: SdistSpec,
    cache_dir: Path | str,
    *,
    offline: bool = False,
    workspace: Workspace | None = None,
    credential: Credential | None = None,
) -> Path:
    """Download the pinned sdist (once) and check its sha256. Returns the cached file. ``credential``: what the
    stack gives for the sdist's index."""
    name, version = str(sdist.name), str(sdist.version)
    expected = str(sdist.sha256 or "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        raise UserError(
            f"sdist {name}=={version} has no valid sha256 pin ({expected!r})",
            fix="set sdist.sha256 to the file's 64-hex sha256",
        )
    cache = Path(cache_dir) / "sdist" / expected
    found = _cached_sdist(cache, expected)
    if found is not None:
        return found
    if offline:
        raise UserError(
            f"sdist {name}=={version} is not cached and offline mode is on", fix="run once with network access"
        )
    # one download of a file at a time (another stackforge, another platform's build of this one): a second one
    # waits, then finds what the first downloaded
    with fslock.entry_lock(cache, f"sdist {name}=={version}"):
        found = _cached_sdist(cache, expected)
        return found if found is not None else _fetch_sdist(sdist, cache, expected, workspace, credential)


def _cached_sdist(cache: Path, expected: str) -> Path | None:
    if cache.is_dir():
        for f in cache.glob("*.tar.gz"):
            if hashlib.sha256(f.read_bytes()).hexdigest() == expected:
                return f
    return None


def _fetch_sdist(
    sdist: SdistSpec, cache: Path, expected: str, workspace: Workspace | None, credential: Credential | None
) -> Path:
    name, version = str(sdist.name), str(sdist.version)
    url, client = find_sdist(sdist_index_url(sdist), name, version, workspace, credential)
    out = cache / sdist_file_name(url, name, version)
    try:
        with progress.transfer(f"download {name}=={version} (sdist)") as t:
            _download(url, out, expected, client, t, declared_size(client, name, version, url))
    except BaseException:
        if cache.is_dir() and not any(cache.iterdir()):
            cache.rmdir()  # nothing of a failed download is kept
        raise
    return out


def unpack_sdist(archive: Path, dest_dir: Path | str) -> Path:
    """Unpack an sdist into ``dest_dir``, dropping its single top-level directory."""
    dest = _prepare_dest(dest_dir)
    with tarfile.open(archive, "r:gz") as tf:
        members = tf.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members if m.name not in ("", ".")}
        strip = len(tops) == 1 and any("/" in m.name for m in members)
        kept = []
        for m in members:
            name = m.name.split("/", 1)[1] if strip and "/" in m.name else (None if strip else m.name)
            if not name:
                continue
            if name.startswith("/") or ".." in Path(name).parts:
                raise UserError(f"sdist {archive.name} has an unsafe member {m.name!r}")
            if m.issym() or m.islnk():
                target = m.linkname
                if target.startswith("/") or ".." in Path(target).parts:
                    raise UserError(f"sdist {archive.name} has a link escaping the tree: {m.name!r} -> {target!r}")
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                continue
            m.name = name
            if m.islnk() and strip:
                m.linkname = m.linkname.split("/", 1)[1] if "/" in m.linkname else m.linkname
            kept.append(m)
        if sys.version_info >= (3, 11, 4) or hasattr(tarfile, "data_filter"):
            tf.extractall(dest, members=kept, filter="data")
        else:  # pragma: no cover - older Pythons; members were checked above
            tf.extractall(dest, members=kept)
    return dest


def sdist_time(archive: Path) -> int | None:
    """The newest modification time among the sdist's members: when its release was packed, the
    SOURCE_DATE_EPOCH of an sdist upstream (as a commit's time is a git upstream's). None for an archive that
    records none."""
    with tarfile.open(archive, "r:gz") as tf:
        newest = max((int(m.mtime) for m in tf.getmembers()), default=0)
    return newest or None


def export_sdist(
    sdist: SdistSpec,
    cache_dir: Path | str,
    dest_dir: Path | str,
    *,
    offline: bool = False,
    workspace: Workspace | None = None,
    credential: Credential | None = None,
) -> Path:
    """Download (or reuse), verify and unpack the pinned sdist into ``dest_dir``."""
    return unpack_sdist(
        fetch_sdist(sdist, cache_dir, offline=offline, workspace=workspace, credential=credential), dest_dir
    )


def describe(spec: UpstreamPin) -> str:
    """A short human description of the pin."""
    sdist = spec.sdist
    if sdist:
        return f"{sdist.name}=={sdist.version} (sdist)"
    tag = spec.tag
    commit = str(spec.commit or "")
    return f"{tag} ({commit[:12]})" if tag else commit[:12]
