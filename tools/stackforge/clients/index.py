"""A small client for Python package indexes: PEP 691 JSON first, PEP 503 HTML as the fallback.

One request per project page, sent with
``Accept: application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01``;
the server's ``Content-Type`` decides which parser reads the answer. Per file the client keeps what the
index declared and nothing more:

- ``upload_time`` (PEP 700) -- ``None`` when the index did not give one. Nothing here ever invents a
  publish time: callers print ``unknown`` for ``None``.
- ``size`` (PEP 700) -- ``None`` when not given (HTML pages never give it).
- ``hashes`` -- from the JSON ``hashes`` object or the ``#sha256=`` URL fragment of an HTML link.
- ``yanked`` -- ``False``, ``True`` or the reason string (PEP 592 / PEP 691).

Queries run concurrently (``IndexClient.projects``; ``lines.fetch_pages`` across a stack's indexes) over
one HTTP session per index, whose keep-alive connections the threads share; a project page is fetched
at most once per client, even when several threads ask for it at the same time. They use HTTP caching: pages are kept on disk
(``cache_dir``, normally ``build/cache/index/``) keyed by URL and revalidated with ``If-None-Match`` /
``If-Modified-Since``; a ``304`` answer re-uses the stored body.

Credentials: what ``urls.split`` takes off the index URL (userinfo, sensitive query parameters), an
explicit ``credential``/``auth``, else ``credentials.for_url`` (what the stack loader split off, the
environment, ``$NETRC`` or ``~/.netrc``). They are never printed: every URL or exception text this module
puts in a message goes through ``urls.redact`` / ``urls.redact_text``. They go only to the index's own origin
(scheme, host and port): a file on another host (``files.pythonhosted.org``) or a redirect elsewhere gets none.

Answers are bounded (:mod:`stackforge.netread`): a page is read up to ``netread.INDEX_PAGE_LIMIT`` bytes within
``page_seconds``, a download up to the size the index declares (else ``netread.DOWNLOAD_LIMIT``), streamed to
``<name>.part`` and hashed on the way; over a limit nothing is kept.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal, overload
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import requests
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from stackforge import netread, safeio
from stackforge.clients.credentials import for_url
from stackforge.errors import UserError
from stackforge.fslock import file_sha256
from stackforge.urls import Credential, redact, redact_text, split

JSON_V1 = "application/vnd.pypi.simple.v1+json"
HTML_V1 = "application/vnd.pypi.simple.v1+html"
ACCEPT_JSON_FIRST = f"{JSON_V1}, {HTML_V1};q=0.2, text/html;q=0.01"
ACCEPT_HTML_ONLY = f"{HTML_V1}, text/html;q=0.01"

CACHE_FORMAT = 1
POOL_SIZE = 16  # connections to one index at once, kept alive


class _Unset(enum.Enum):
    RESOLVE = enum.auto()


_RESOLVE = _Unset.RESOLVE  # IndexClient(credential=…) not given: ask credentials.for_url


class IndexQueryError(UserError):
    """The index could not be queried (network, HTTP status, unparseable page)."""


class IndexUnreachable(IndexQueryError):
    """No answer from the index (name resolution, connection, TLS, time-out): every page on it fails alike, so a
    report says it once per index (``cause`` in a few words, see ``netread.short_cause``)."""

    def __init__(self, message: str, *, cause: str, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.cause = cause


class ProjectNotFound(IndexQueryError):
    """The index has no page for this project (HTTP 404)."""


# --------------------------------------------------------------------------------------------------
# URLs and credentials


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """Return ``(url without any credential, (user, password) or None)`` (see ``urls.split``)."""
    clean, cred = split(url)
    return clean, (cred.auth if cred else None)


# --------------------------------------------------------------------------------------------------
# What an index says about one file


@dataclass(frozen=True)
class IndexFile:
    """One distribution file as listed by the index."""

    filename: str
    url: str
    hashes: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    size: int | None = None
    upload_time: datetime | None = None
    yanked: bool | str = False
    requires_python: str | None = None

    @property
    def sha256(self) -> str | None:
        return self.hashes.get("sha256")

    @property
    def is_yanked(self) -> bool:
        return self.yanked is not False and self.yanked is not None

    @property
    def kind(self) -> str:
        """``wheel``, ``sdist`` or ``other``."""
        return _parse_filename(self.filename)[0]

    @property
    def project(self) -> str | None:
        return _parse_filename(self.filename)[1]

    @property
    def version(self) -> Version | None:
        return _parse_filename(self.filename)[2]

    @property
    def tags(self) -> frozenset[Tag]:
        """Wheel tags (empty for anything that is not a wheel)."""
        return _parse_filename(self.filename)[3]

    def to_json(self) -> dict:
        return {
            "filename": self.filename,
            "url": redact(self.url),
            "hashes": dict(self.hashes),
            "size": self.size,
            "upload_time": format_time(self.upload_time, iso=True),
            "yanked": self.yanked,
            "requires_python": self.requires_python,
        }


_FILENAME_CACHE: dict[str, tuple] = {}


def _parse_filename(filename: str) -> tuple[str, str | None, Version | None, frozenset[Tag]]:
    hit = _FILENAME_CACHE.get(filename)
    if hit is not None:
        return hit
    result: tuple = ("other", None, None, frozenset())
    if filename.endswith(".whl"):
        try:
            name, version, _build, tags = parse_wheel_filename(filename)
            result = ("wheel", str(name), version, frozenset(tags))
        except (InvalidWheelFilename, InvalidVersion):
            pass
    elif filename.endswith((".tar.gz", ".zip")):
        try:
            name, version = parse_sdist_filename(filename)
            result = ("sdist", str(name), version, frozenset())
        except (InvalidSdistFilename, InvalidVersion):
            pass
    _FILENAME_CACHE[filename] = result
    return result


@dataclass
class ProjectPage:
    """An index's answer for one project."""

    name: str
    url: str
    files: list[IndexFile]
    format: str  # "json" or "html"
    api_version: str | None = None
    versions: list[str] | None = None  # PEP 700 "versions", when the index sent it
    from_cache: bool = False

    def by_version(self) -> dict[Version, list[IndexFile]]:
        out: dict[Version, list[IndexFile]] = {}
        for f in self.files:
            if f.version is not None:
                out.setdefault(f.version, []).append(f)
        return out

    def files_for(self, version: str | Version) -> list[IndexFile]:
        v = Version(str(version))
        return [f for f in self.files if f.version == v]


# --------------------------------------------------------------------------------------------------
# Parsing


def parse_time(value: str | None) -> datetime | None:
    """ISO 8601 (``yyyy-mm-ddThh:mm:ss[.ffffff]Z``, PEP 700) to an aware UTC datetime; ``None`` if absent."""
    if not value:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    m = re.match(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(\.\d+)?(.*)$", text)
    if not m:
        return None
    frac = (m.group(2) or "")[:7].ljust(7, "0") if m.group(2) else ""
    try:
        dt = datetime.fromisoformat(m.group(1) + frac + m.group(3))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc)


@overload
def format_time(dt: datetime | None, *, iso: Literal[False] = False) -> str: ...
@overload
def format_time(dt: datetime | None, *, iso: bool) -> str | None: ...
def format_time(dt: datetime | None, *, iso: bool = False) -> str | None:
    """``None`` stays ``None`` for JSON (``iso=True``); text output shows ``unknown``."""
    if dt is None:
        return None if iso else "unknown"
    if iso:
        return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def parse_json_page(body: str | bytes, base_url: str, project: str) -> ProjectPage:
    """Parse a PEP 691 project page."""
    try:
        data = safeio.parse_json(body, source=redact(base_url), what="project page", limit=max(len(body), 1))
    except safeio.Malformed as exc:
        raise IndexQueryError(f"{redact(base_url)}: not valid JSON ({exc.message})") from None
    if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
        raise IndexQueryError(f"{redact(base_url)}: not a PEP 691 project page (no list of files)")
    files = []
    for entry in data.get("files", []):
        if not isinstance(entry, dict):
            continue
        filename = entry.get("filename")
        url = entry.get("url")
        if not filename or not url:
            continue
        size = entry.get("size")
        files.append(
            IndexFile(
                filename=filename,
                url=urljoin(base_url, url),
                hashes={k.lower(): v.lower() for k, v in (entry.get("hashes") or {}).items()},
                size=size if isinstance(size, int) and size >= 0 else None,
                upload_time=parse_time(entry.get("upload-time")),
                yanked=entry.get("yanked", False) or False,
                requires_python=entry.get("requires-python"),
            )
        )
    meta = data.get("meta") or {}
    return ProjectPage(
        name=data.get("name") or project,
        url=base_url,
        files=files,
        format="json",
        api_version=meta.get("api-version"),
        versions=data.get("versions"),
    )


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self.meta: dict[str, str] = {}
        self._current: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._current = dict(attrs)
            self._text = []
        elif tag == "meta":
            d = dict(attrs)
            name, content = d.get("name"), d.get("content")
            if name and content is not None:
                self.meta[name] = content

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._current is not None:
            self.anchors.append((self._current, "".join(self._text).strip()))
            self._current = None


def parse_html_page(body: str | bytes, base_url: str, project: str) -> ProjectPage:
    """Parse a PEP 503 project page. HTML carries no size and no upload time: both stay ``None``."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    parser = _AnchorParser()
    parser.feed(body)
    files = []
    for attrs, text in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url = urljoin(base_url, href)
        parts = urlsplit(url)
        filename = unquote(parts.path.rsplit("/", 1)[-1]) or text
        hashes = {}
        if parts.fragment and "=" in parts.fragment:
            algo, _, digest = parts.fragment.partition("=")
            hashes[algo.lower()] = digest.lower()
        yanked: bool | str = False
        if "data-yanked" in attrs:
            yanked = attrs["data-yanked"] or True
        files.append(
            IndexFile(
                filename=filename,
                url=urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, "")),
                hashes=hashes,
                yanked=yanked,
                requires_python=attrs.get("data-requires-python"),
            )
        )
    return ProjectPage(
        name=project,
        url=base_url,
        files=files,
        format="html",
        api_version=parser.meta.get("pypi:repository-version"),
    )


# --------------------------------------------------------------------------------------------------
# The client


class _DiskCache:
    """Project pages on disk, one JSON file per (URL, Accept), for conditional requests."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _path(self, url: str, accept: str) -> Path:
        key = hashlib.sha256(f"{CACHE_FORMAT}\n{redact(url)}\n{accept}".encode()).hexdigest()
        return self.directory / f"{key}.json"

    def get(self, url: str, accept: str) -> dict | None:
        path = self._path(url, accept)
        if not path.is_file():
            return None
        try:
            entry = safeio.read_json(path, what="index cache entry", follow=False)
        except safeio.Malformed:
            return None
        if not isinstance(entry, dict) or entry.get("url") != redact(url):
            return None
        return entry

    def put(self, url: str, accept: str, entry: dict) -> None:
        path = self._path(url, accept)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({**entry, "url": redact(url)}))
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written is only slower


class IndexClient:
    """Query one simple index.

    ``url`` is the index root (``https://pypi.org/simple``). ``auth`` (a ``(user, password)`` pair) or
    ``credential`` (``None``: only what ``url`` itself carries) is the credential; without either, what
    ``urls.split`` takes off ``url`` is used, else ``credentials.for_url`` (what the stack loader split
    off, the environment, ``$NETRC``/``~/.netrc``).
    Sensitive query parameters of the credential go with every request to the index's own host.
    ``prefer_json=False`` asks for HTML only. ``cache_dir`` enables the on-disk conditional-request cache.
    """

    def __init__(
        self,
        url: str,
        *,
        auth: tuple[str, str] | None = None,
        credential: Credential | Literal[_Unset.RESOLVE] | None = _RESOLVE,
        cache_dir: str | Path | None = None,
        prefer_json: bool = True,
        timeout: float = 30.0,
        max_workers: int = 8,
        user_agent: str = "stackforge-index-client",
        page_seconds: float = 120.0,
    ) -> None:
        clean, in_url = split(url)
        self.url = clean.rstrip("/") + "/"
        if auth is not None:
            credential = Credential(auth[0], auth[1], (), "explicit")
        if credential is _RESOLVE:
            credential = in_url or for_url(clean)
        self.credential = credential or in_url
        self.auth = self.credential.auth if self.credential else None
        self.host = urlsplit(self.url).hostname
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.cache = _DiskCache(self.cache_dir) if self.cache_dir else None
        self.accept = ACCEPT_JSON_FIRST if prefer_json else ACCEPT_HTML_ONLY
        self.timeout = timeout
        self.page_seconds = page_seconds
        self.max_workers = max(1, max_workers)
        self.user_agent = user_agent
        self._session_obj: requests.Session | None = None
        self._pages: dict[str, ProjectPage] = {}
        self._inflight: dict[str, Future[ProjectPage]] = {}
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "not_modified": 0}

    def same_as(self, other: IndexClient) -> bool:
        """Whether ``other`` asks the same index the same way: URL, credential, cache, content types, limits."""
        return (
            self.url,
            self.credential,
            self.cache_dir,
            self.accept,
            self.timeout,
            self.page_seconds,
            self.max_workers,
            self.user_agent,
        ) == (
            other.url,
            other.credential,
            other.cache_dir,
            other.accept,
            other.timeout,
            other.page_seconds,
            other.max_workers,
            other.user_agent,
        )

    def params_for(self, url: str) -> dict[str, str]:
        """The credential's query parameters for a request to ``url`` (only on the index's own origin)."""
        if self.credential is None or not self.credential.query:
            return {}
        return self.credential.params() if netread.same_origin(url, self.url) else {}

    def auth_for(self, url: str) -> tuple[str, str] | None:
        """The basic-auth pair for a request to ``url``: only on the index's own origin."""
        return self.auth if netread.same_origin(url, self.url) else None

    @property
    def display_url(self) -> str:
        return redact(self.url.rstrip("/"))

    def _session(self) -> requests.Session:
        """The index's one session, shared by the threads: at most ``pool_size`` connections to the index at
        once (a thread waits for a free one), each kept alive for the next request."""
        with self._lock:
            s = self._session_obj
            if s is None:
                # No session-wide auth: each request carries the credential only on the index's origin.
                s = netread.session(trust_env=True, pool_connections=1, pool_maxsize=self.pool_size, pool_block=True)
                s.headers["User-Agent"] = self.user_agent
                self._session_obj = s
            return s

    @property
    def pool_size(self) -> int:
        """Connections to the index at once: ``POOL_SIZE``, or ``max_workers`` when that is more."""
        return max(self.max_workers, POOL_SIZE)

    def project_url(self, name: str) -> str:
        return urljoin(self.url, canonicalize_name(name) + "/")

    def _get(self, url: str, accept: str) -> tuple[str, str, str, bool]:
        """GET with conditional headers; returns (body, content_type, final_url, from_cache)."""
        cached = self.cache.get(url, accept) if self.cache else None
        headers = {"Accept": accept}
        if cached:
            if cached.get("etag"):
                headers["If-None-Match"] = cached["etag"]
            if cached.get("last_modified"):
                headers["If-Modified-Since"] = cached["last_modified"]
        deadline = netread.Deadline(self.page_seconds, "one index page")
        try:
            with netread.guard(deadline, url):
                return self._get_within(url, accept, headers, cached, deadline)
        except netread.Exceeded as exc:
            raise IndexQueryError(exc.message, fix=exc.fix) from None
        except (requests.ConnectionError, requests.Timeout) as exc:
            cause = redact_text(netread.short_cause(exc))
            raise IndexUnreachable(
                f"cannot reach {redact(url)}: {type(exc).__name__}: {cause}",
                cause=cause,
                fix="check the index URL and your network; credentials come from the environment or ~/.netrc",
            ) from None
        except requests.RequestException as exc:
            raise IndexQueryError(
                f"cannot reach {redact(url)}: {type(exc).__name__}: {redact_text(str(exc))}",
                fix="check the index URL and your network; credentials come from the environment or ~/.netrc",
            ) from None

    def _get_within(
        self, url: str, accept: str, headers: dict[str, str], cached: dict | None, deadline: netread.Deadline
    ) -> tuple[str, str, str, bool]:
        resp = self._session().get(url, headers=headers, params=self.params_for(url), auth=self.auth_for(url),
                                   timeout=deadline.timeout(self.timeout), stream=True)  # fmt: skip
        try:
            return self._answer(resp, url, accept, cached, deadline)
        finally:
            netread.release(resp, deadline)

    def _answer(
        self, resp: requests.Response, url: str, accept: str, cached: dict | None, deadline: netread.Deadline
    ) -> tuple[str, str, str, bool]:
        """(body, content type, final URL, from the cache) of an index's answer, its body bounded."""
        with self._lock:
            self.stats["requests"] += 1
        if resp.status_code == 304 and cached:
            with self._lock:
                self.stats["not_modified"] += 1
            return cached["body"], cached.get("content_type", ""), cached.get("final_url", url), True
        if resp.status_code == 404:
            raise ProjectNotFound(f"{redact(url)}: no such project on this index (HTTP 404)")
        if resp.status_code in (401, 403):
            raise IndexQueryError(
                f"{redact(url)}: HTTP {resp.status_code} (credentials missing or refused)",
                fix="set STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD or add the host to ~/.netrc",
            )
        if resp.status_code != 200:
            raise IndexQueryError(f"{redact(url)}: HTTP {resp.status_code}")
        ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
        # Decode ourselves: without a charset requests would guess the encoding with a slow detector.
        # PEP 691 JSON is UTF-8; HTML uses its declared charset, else UTF-8.
        charset = resp.encoding if "charset=" in resp.headers.get("Content-Type", "").lower() else "utf-8"
        raw = netread.read_body(resp, url, netread.INDEX_PAGE_LIMIT, deadline, "index page")
        try:
            body = raw.decode(charset or "utf-8", errors="replace")
        except LookupError:
            body = raw.decode("utf-8", errors="replace")
        final_url = split(resp.url)[0]  # without the credential's query parameters
        if self.cache and (resp.headers.get("ETag") or resp.headers.get("Last-Modified")):
            self.cache.put(
                url,
                accept,
                {
                    "etag": resp.headers.get("ETag"),
                    "last_modified": resp.headers.get("Last-Modified"),
                    "content_type": ctype,
                    "final_url": final_url,
                    "body": body,
                },
            )
        return body, ctype, final_url, False

    def _get_file(self, url: str) -> str:
        """A static PEP 503 tree on disk (``file:///srv/simple``): ``<project>/index.html``."""
        path = Path(unquote(urlsplit(url).path)) / "index.html"
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            raise ProjectNotFound(f"{url}: no such project on this index ({path} does not exist)") from None
        except OSError as exc:
            raise IndexQueryError(f"{url}: cannot read {path}: {exc.strerror}") from None

    def project(self, name: str) -> ProjectPage:
        """The project page for ``name`` (memoised for the life of the client; a thread asking for a page
        another thread is fetching waits for that fetch)."""
        key = canonicalize_name(name)
        with self._lock:
            page = self._pages.get(key)
            pending = self._inflight.get(key)
            if page is None and pending is None:
                mine: Future[ProjectPage] = Future()
                self._inflight[key] = mine
        if page is not None:
            return page
        if pending is not None:
            return pending.result()
        try:
            page = self._fetch(name, key)
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            mine.set_exception(exc)
            raise
        with self._lock:
            self._pages[key] = page
            del self._inflight[key]
        mine.set_result(page)
        return page

    def _fetch(self, name: str, key: str) -> ProjectPage:
        url = self.project_url(name)
        if url.startswith("file://"):
            body, ctype, final_url, from_cache = self._get_file(url), "text/html", url, False
        else:
            body, ctype, final_url, from_cache = self._get(url, self.accept)
        if ctype in (JSON_V1, "application/json"):
            page = parse_json_page(body, final_url, key)
        elif ctype in (HTML_V1, "text/html", "") or ctype.startswith("text/"):
            page = parse_html_page(body, final_url, key)
        else:
            raise IndexQueryError(f"{redact(url)}: unexpected Content-Type {ctype!r}")
        page.from_cache = from_cache
        return page

    def projects(self, names: Iterable[str]) -> dict[str, ProjectPage | IndexQueryError]:
        """Query many projects concurrently. Each value is the page or the error for that project."""
        names = list(dict.fromkeys(names))

        def one(n: str) -> ProjectPage | IndexQueryError:
            try:
                return self.project(n)
            except IndexQueryError as exc:
                return exc

        if len(names) <= 1:
            return {n: one(n) for n in names}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(names))) as pool:
            return dict(zip(names, pool.map(one, names)))

    def download(self, file: IndexFile, dest_dir: str | Path) -> Path:
        """Download ``file`` into ``dest_dir`` and check its sha256 (when the index declared one); at most the
        size the index declared. The index's credential goes along only when the file is on its origin."""
        return download(
            file.url,
            dest_dir,
            session=self._session(),
            sha256=file.sha256,
            filename=file.filename,
            timeout=self.timeout,
            params=self.params_for(file.url),
            auth=self.auth_for(file.url),
            size=file.size,
        )


def download(
    url: str,
    dest_dir: str | Path,
    *,
    session: requests.Session | None = None,
    sha256: str | None = None,
    filename: str | None = None,
    timeout: float = 60.0,
    params: dict[str, str] | None = None,
    auth: tuple[str, str] | None = None,
    size: int | None = None,
    seconds: float = 3600.0,
) -> Path:
    """Stream ``url`` to ``dest_dir/filename``; verify ``sha256`` (or a ``#sha256=`` fragment) if given.

    At most ``size`` bytes (what the index declared; else ``netread.DOWNLOAD_LIMIT``) within ``seconds``;
    hashed on the way, and nothing is kept when a limit or the hash fails. An existing file with the expected
    sha256 is reused without a request. ``auth``: the index's credential, for a file on the index's origin.
    """
    clean, in_url = split(url)
    parts = urlsplit(clean)
    if sha256 is None and parts.fragment.startswith("sha256="):
        sha256 = parts.fragment.split("=", 1)[1].lower()
    clean = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
    name = filename or unquote(parts.path.rsplit("/", 1)[-1]) or "download"
    dest = Path(dest_dir) / name
    if sha256 and dest.exists() and file_sha256(dest) == sha256:
        return dest
    sess = session or netread.session(trust_env=True)
    kwargs: dict = {"params": {**(in_url.params() if in_url else {}), **(params or {})}}
    if in_url is not None and in_url.auth:
        kwargs["auth"] = in_url.auth
    elif auth is not None:
        kwargs["auth"] = auth
    elif session is None:
        cred = for_url(clean)
        if cred is not None and cred.auth:
            kwargs["auth"] = cred.auth
    deadline = netread.Deadline(seconds, "one download")
    limit = size if size is not None else netread.DOWNLOAD_LIMIT
    try:
        with netread.guard(deadline, url), sess.get(clean, stream=True, timeout=timeout, **kwargs) as resp:
            if resp.status_code != 200:
                raise IndexQueryError(f"{redact(url)}: HTTP {resp.status_code}")
            netread.stream_to_file(resp, url, dest, limit, deadline=deadline, sha256=sha256, what="file")
    except netread.Exceeded as exc:
        raise IndexQueryError(exc.message, fix=exc.fix) from None
    except requests.RequestException as exc:
        raise IndexQueryError(f"cannot download {redact(url)}: {type(exc).__name__}") from None
    return dest
