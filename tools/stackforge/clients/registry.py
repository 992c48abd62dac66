"""A small client for the OCI distribution API (the registry side of ``publish``).

Only what publishing and copying need: ping, list tags (paginated), HEAD/GET/PUT/DELETE a
manifest, HEAD/GET a blob (into memory, or streamed to a file), upload or mount a blob, and the referrers of a
manifest. Every request goes
through :func:`with_retries`: exponential backoff with full jitter on 5xx, 429,
408 and connection errors (resets, refused, timeouts), bounded both in attempts
and in total time. Anything else (4xx) is an answer, not a fault, and is raised
at once as :class:`RegistryError`.

Loopback registries (127.0.0.0/8, ``localhost``, ``::1``) are spoken to over plain
HTTP, everything else over HTTPS, as the docker engine does by default.
Authentication: anonymous, or Basic/Bearer with credentials from
``STACKFORGE_REGISTRY_USER``/``STACKFORGE_REGISTRY_PASSWORD`` or from the
``auths`` entry of the docker client config for that host.

Answers are hostile input (:mod:`stackforge.netread`): ``Authorization`` goes only to the registry's own origin
(a redirect to blob storage elsewhere carries none; redirects are followed by hand, at most
``netread.REDIRECT_LIMIT``); a tag list's ``Link`` is followed only on the same origin, stops on a URL it has
already read and fails past ``netread.PAGE_LIMIT`` pages; manifests and indexes are read up to 4 MiB, tag pages
and token answers up to ``netread.DOCUMENT_LIMIT``, blobs up to the size their descriptor declares and checked
against their digest on the way; every read operation (its retries included) ends within ``read_seconds``, and
all of them within :meth:`RegistryClient.budget` when one is set.
A malformed answer (a manifest that is not a JSON object, a tag list whose tags are not strings) is a
:class:`MalformedAnswer`.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import requests

from stackforge import netread, safeio
from stackforge.clients import credentials
from stackforge.errors import UserError
from stackforge.grammar import DIGEST_RE, HOST_RE, REPO_PATH_RE, looks_like_host
from stackforge.urls import redact, redact_text
from stackforge.urls import split as split_url

T = TypeVar("T")

# Manifest media types we ask for and understand.
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_ACCEPT = ", ".join([OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_MANIFEST_LIST])
#: the largest blob :meth:`RegistryClient.download_blob` takes, and the slowest rate it waits for one at
BLOB_LIMIT = 64 << 30
#: the most an image config blob may take (a build's history of hundreds of steps is well under a MiB)
CONFIG_LIMIT = 16 << 20
BLOB_MIN_RATE = 256 << 10  # bytes per second


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------
# Repository references
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repository:
    """``host[:port]/name`` of one repository, e.g. ``127.0.0.1:5000/mcconline/inference/vllm``."""

    host: str
    name: str
    scheme: str = "https"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"

    def __str__(self) -> str:
        return f"{self.host}/{self.name}" if self.name else self.host

    def ref(self, tag_or_digest: str) -> str:
        sep = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"{self}{sep}{tag_or_digest}"

    def child(self, name: str) -> Repository:
        return Repository(host=self.host, name=f"{self.name}/{name}" if self.name else name, scheme=self.scheme)


def is_loopback_host(host: str) -> bool:
    hostname = host
    if hostname.startswith("["):
        hostname = hostname[1 : hostname.index("]")]
    elif ":" in hostname:
        hostname = hostname.rsplit(":", 1)[0]
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


_FIX = "give host[:port][/path], e.g. 127.0.0.1:5000/mcconline/inference or registry.example.com/team"


def parse_registry(
    text: str, *, what: str = "registry reference", plain_http: bool | None = None, require_name: bool = False
) -> Repository:
    """Parse ``host[:port][/path]`` into a :class:`Repository` (``name`` may be empty) or raise ``UserError``.

    The host part must look like a host (contain a dot or a port, or be ``localhost``),
    as in docker's own reference grammar, so ``mcconline/vllm`` is not silently read as
    a Docker Hub name. Schemes, tags, digests and upper-case paths are rejected with a fix.
    """
    raw = text.strip().rstrip("/")
    if not raw:
        raise UserError(f"empty {what}", fix=_FIX)
    if "://" in raw:
        raise UserError(
            f"{what} {text!r} must not carry a scheme",
            fix=_FIX + " (loopback registries are spoken to over plain HTTP, others over HTTPS)",
        )
    host, _, path = raw.partition("/")
    if "@" in raw or ":" in path:
        raise UserError(f"{what} {text!r} must not carry a tag or a digest", fix=_FIX)
    if not HOST_RE.fullmatch(host) or not looks_like_host(host):
        raise UserError(f"{what} {text!r} does not start with a registry host ({host!r} is not host[:port])", fix=_FIX)
    if path and not REPO_PATH_RE.fullmatch(path):
        raise UserError(
            f"invalid repository path {path!r} in {what} {text!r}",
            fix="path components are lower-case [a-z0-9] separated by '.', '_', '__' or '-'",
        )
    if require_name and not path:
        raise UserError(f"{what} {text!r} names no repository", fix=_FIX)
    if len(path) > 255:
        raise UserError(f"{what} {text!r}: repository name longer than 255 characters", fix=_FIX)
    if plain_http is None:
        plain_http = is_loopback_host(host)
    return Repository(host=host, name=path, scheme="http" if plain_http else "https")


def parse_repository(text: str, *, what: str = "repository", plain_http: bool | None = None) -> Repository:
    """``host[:port]/name`` of one repository (a name is required)."""
    return parse_registry(text, what=what, plain_http=plain_http, require_name=True)


# --------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: at most ``attempts`` tries and ``total_seconds`` of wall time.

    Delays grow as ``base_delay * 2**n`` capped at ``max_delay``, with full jitter
    (a uniform draw in [0, delay]); a ``Retry-After`` header is honoured up to ``max_delay``.
    """

    attempts: int = 6
    base_delay: float = 0.5
    max_delay: float = 8.0
    total_seconds: float = 120.0

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        upper = min(self.max_delay, self.base_delay * (2 ** max(failures - 1, 0)))
        return (rng or random).uniform(0, upper)


RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RegistryError(Exception):
    """The registry answered, and the answer is an error (or it could not be reached)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        codes: Iterable[str] = (),
        retryable: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.codes = tuple(codes)
        self.retryable = retryable
        self.retry_after = retry_after


class MalformedAnswer(RegistryError, ValueError):
    """The registry answered something that is not what the API says it answers."""


def parse_answer(body: bytes, what: str) -> Any:
    """The JSON of a registry answer (already read within its size cap) within the nesting cap; a
    :class:`MalformedAnswer` naming ``what`` when it is not JSON."""
    try:
        return safeio.parse_json(body, source=what, what="answer", limit=max(len(body), 1))
    except safeio.Malformed as exc:
        raise MalformedAnswer(f"{what} is not valid JSON: {exc.message}") from None


class RetriesExhausted(RegistryError):
    def __init__(self, what: str, attempts: int, elapsed: float, last: Exception):
        super().__init__(
            f"{what}: gave up after {attempts} attempt(s) in {elapsed:.1f} s: {netread.short_cause(last)}",
            status=getattr(last, "status", None),
            codes=getattr(last, "codes", ()),
        )
        self.last = last
        self.attempts = attempts


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RegistryError):
        return exc.retryable
    return isinstance(
        exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError, ConnectionError)
    )


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    log: Callable[..., None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """Call ``fn`` until it returns, retrying transient failures within ``policy``."""
    start = clock()
    failures = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not _is_retryable(exc):
                raise
            failures += 1
            elapsed = clock() - start
            delay = policy.delay(failures, rng)
            retry_after = getattr(exc, "retry_after", None)
            if retry_after is not None:
                delay = max(delay, min(retry_after, policy.max_delay))
            if failures >= policy.attempts or elapsed + delay > policy.total_seconds:
                if log:
                    log("gave-up", what=what, attempts=failures, error=netread.short_cause(exc))
                raise RetriesExhausted(what, failures, elapsed, exc) from exc
            if log:
                log("retry", what=what, attempt=failures, delay=round(delay, 3), error=netread.short_cause(exc))
            sleep(delay)


# --------------------------------------------------------------------------------------------
# Credentials
# --------------------------------------------------------------------------------------------


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


@dataclass
class ManifestInfo:
    digest: str | None
    media_type: str | None
    size: int | None


@dataclass
class Manifest:
    body: bytes
    media_type: str | None
    header_digest: str | None

    @property
    def digest(self) -> str:
        """The digest of the bytes as received (what the registry's tag really resolves to)."""
        return sha256_digest(self.body)

    def json(self) -> dict[str, Any]:
        """The manifest as a JSON object; a :class:`MalformedAnswer` when it is not one."""
        doc = parse_answer(self.body, f"manifest {self.digest}")
        if not isinstance(doc, dict):
            raise MalformedAnswer(f"manifest {self.digest} is a JSON {type(doc).__name__}, not an object")
        return doc


@dataclass
class RegistryClient:
    repository: Repository
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    log: Callable[..., None] | None = None
    timeout: tuple[float, float] = (10.0, 600.0)
    session: requests.Session = field(default_factory=netread.session)
    credentials: tuple[str, str] | None = None
    #: wall time of one read operation (a manifest, a tag list, a blob), its retries included
    read_seconds: float = 30.0
    #: a monotonic time every read operation of this client ends by (``budget``), or None
    until: float | None = None
    _auth_header: str | None = field(default=None, repr=False)
    _auth_origin: str = field(default="", repr=False)  # the origin whose challenge the header answers
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self) -> None:
        self.session.trust_env = False  # proxies and CA bundle per request (netread.environment_settings), no netrc
        if self.credentials is None:
            self.credentials = credentials.for_registry(self.repository.host)

    # -- plumbing ------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.repository.base_url}/v2/{self.repository.name}/{path}"

    @property
    def _deadline(self) -> netread.Deadline | None:
        """The deadline of the read operation this thread is in, if any."""
        return getattr(self._local, "deadline", None)

    def _timeout(self) -> tuple[float, float]:
        if self._deadline is None:
            return self.timeout
        return self._deadline.timeout(self.timeout[0]), self._deadline.timeout(self.timeout[1])

    def _headers_for(self, url: str, headers: dict[str, str] | None) -> dict[str, str]:
        """``headers`` plus ``Authorization`` when ``url`` is on the origin that asked for it."""
        hdrs = dict(headers or {})
        if self._auth_header and netread.same_origin(url, self._auth_origin):
            hdrs["Authorization"] = self._auth_header
        return hdrs

    def _send(
        self, method: str, url: str, body_factory: Callable[[], Any] | None, headers: dict[str, str] | None
    ) -> requests.Response:
        """One request and the redirects of a GET/HEAD, followed by hand: each hop gets ``Authorization`` only
        when it is on the registry's origin, only http(s), at most ``netread.REDIRECT_LIMIT`` hops."""
        for _ in range(netread.REDIRECT_LIMIT + 1):
            data = body_factory() if body_factory else None
            try:
                resp = self.session.request(method, url, data=data, headers=self._headers_for(url, headers),
                                            timeout=self._timeout(), allow_redirects=False, stream=True,
                                            **netread.environment_settings(url))  # fmt: skip
            finally:
                if data is not None and hasattr(data, "close"):
                    data.close()
            location = resp.headers.get("Location")
            if method not in ("GET", "HEAD") or not resp.is_redirect or not location:
                return resp
            netread.release(resp, self._deadline)
            url = urljoin(url, location)
            if urlparse(url).scheme not in ("http", "https"):
                raise MalformedAnswer(f"{method} redirected to a non-HTTP URL {redact(url)}")
        raise MalformedAnswer(f"{method} {redact(url)}: more than {netread.REDIRECT_LIMIT} redirects")

    def _request(
        self,
        method: str,
        url: str,
        *,
        ok: Iterable[int],
        body_factory: Callable[[], Any] | None = None,
        headers: dict[str, str] | None = None,
        stream: bool = False,
        _authed: bool = False,
    ) -> requests.Response:
        """``method url``; the response when its status is in ``ok`` (its body unread: use :meth:`_body`)."""
        resp = self._send(method, url, body_factory, headers)
        if resp.status_code == 401 and not _authed and self._authenticate(resp, url):
            netread.release(resp, self._deadline)
            return self._request(
                method, url, ok=ok, body_factory=body_factory, headers=headers, stream=stream, _authed=True
            )
        if resp.status_code in ok:
            return resp
        raise self._error(method, url, resp)

    def _body(self, resp: requests.Response, limit: int, what: str = "answer") -> bytes:
        """The body of ``resp`` within ``limit`` bytes and the operation's deadline; closed afterwards."""
        try:
            return netread.read_body(resp, resp.url or "", limit, self._deadline, what)
        finally:
            resp.close()

    def _json(self, resp: requests.Response, limit: int, what: str) -> Any:
        body = self._body(resp, limit, what)
        return parse_answer(body, f"{what} from {redact(resp.url or '')}")

    def _error(self, method: str, url: str, resp: requests.Response) -> RegistryError:
        codes: list[str] = []
        detail = ""
        try:
            raw = b"" if method == "HEAD" else self._body(resp, netread.ERROR_LIMIT, "error answer")
        except (netread.Exceeded, requests.RequestException):
            raw = b""
        try:
            payload = parse_answer(raw, "error answer")
            for err in payload.get("errors", []) or []:
                codes.append(str(err.get("code")))
                detail += f" {err.get('code')}: {err.get('message')}"
        except (ValueError, AttributeError, TypeError):
            text = raw.decode("utf-8", "replace")
            detail = (" " + text[:200].strip()) if text.strip() else ""
        retry_after = None
        if resp.headers.get("Retry-After", "").strip().isdigit():
            retry_after = float(resp.headers["Retry-After"])
        path = urlparse(url).path
        resp.close()
        return RegistryError(
            f"{method} {path} -> HTTP {resp.status_code}{detail[:400]}",
            status=resp.status_code,
            codes=codes,
            retryable=resp.status_code in RETRY_STATUS,
            retry_after=retry_after,
        )

    def _authenticate(self, resp: requests.Response, url: str) -> bool:
        """Answer the challenge of ``resp`` (to a request for ``url``): the header is kept for that origin only."""
        challenge = resp.headers.get("WWW-Authenticate", "")
        scheme, params = _parse_challenge(challenge)
        if scheme == "basic" and self.credentials:
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            self._auth_header, self._auth_origin = f"Basic {token}", url
            return True
        if scheme == "bearer" and params.get("realm"):
            self._auth_header, self._auth_origin = f"Bearer {self._token(params)}", url
            return True
        return False

    def _token(self, params: dict[str, str]) -> str:
        """A bearer token from the challenge's realm (with the credentials, if any). The realm is http(s), and
        https unless the registry itself is plain HTTP; its redirects are not followed; the answer is bounded."""
        realm = params["realm"]
        scheme = urlparse(realm).scheme
        if scheme not in ("http", "https") or (scheme == "http" and self.repository.scheme == "https"):
            raise MalformedAnswer(f"the registry names a token realm {redact(realm)} that is not https")
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        query["scope"] = f"repository:{self.repository.name}:pull,push"
        r = self.session.get(realm + ("&" if "?" in realm else "?") + urlencode(query), auth=self.credentials,
                             timeout=self._timeout(), allow_redirects=False, stream=True)  # fmt: skip
        if r.status_code != 200:
            r.close()
            raise RegistryError(f"token request to {redact(realm)} -> HTTP {r.status_code}", status=r.status_code,
                                retryable=r.status_code in RETRY_STATUS)  # fmt: skip
        answer = self._json(r, netread.DOCUMENT_LIMIT, "token answer")
        tok = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
        if not isinstance(tok, str) or not tok or not tok.isprintable():
            raise MalformedAnswer(f"token endpoint {redact(realm)} returned no token")
        return tok

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return with_retries(fn, what=what, policy=self.policy, log=self.log)

    def budget(self, seconds: float) -> RegistryClient:
        """Make every read operation of this client from now on end within ``seconds`` in all (a verb's reads)."""
        self.until = time.monotonic() + seconds
        return self

    def within(self, seconds: float) -> RegistryClient:
        """A client of the same repository, session and credentials whose read operations from now on end within
        ``seconds`` in all: one phase of a verb's reads, the other phases' budgets left as they are (a thread's
        phase does not move another's)."""
        return replace(self, until=time.monotonic() + seconds, _local=threading.local())

    def _read(self, what: str, url: str, fn: Callable[[], T], seconds: float | None = None) -> T:
        """A read operation: ``fn`` with retries, all of it within ``read_seconds`` (and the policy's total); past
        that, or over a size limit, a non-retryable :class:`RegistryError` naming the URL and the limit."""
        if self._deadline is not None:  # nested: the outer operation's deadline holds
            return self._retry(what, fn)
        seconds = min(self.read_seconds if seconds is None else seconds, self.policy.total_seconds)
        if self.until is not None:
            seconds = min(seconds, self.until - time.monotonic())
        self._local.deadline = netread.Deadline(seconds, what)
        try:
            with netread.guard(self._local.deadline, url):
                return self._retry(what, fn)
        except netread.Exceeded as exc:
            raise RegistryError(exc.message) from None
        except RetriesExhausted as exc:
            if isinstance(exc.last, netread.Exceeded):
                raise RegistryError(exc.last.message) from None
            raise
        finally:
            self._local.deadline = None

    # -- API -------------------------------------------------------------------------------

    def ping(self) -> None:
        """``GET /v2/``: is this an OCI registry we can talk to? Raises RegistryError."""
        url = f"{self.repository.base_url}/v2/"
        self._retry("ping", lambda: netread.release(self._request("GET", url, ok=(200,))))

    def check_push(self) -> None:
        """Start a blob upload and cancel it: the registry answers and takes this client's credentials for a push
        to the repository; nothing is stored. Raises RegistryError (a 401/403 names the refusal)."""

        def call() -> None:
            resp = self._request("POST", self._url("blobs/uploads/"), ok=(202,))
            location = resp.headers.get("Location")
            netread.release(resp, self._deadline)
            if location:  # cancel the session; a registry that keeps it lets it expire
                done = self._request("DELETE", urljoin(self.repository.base_url + "/", location), ok=range(200, 600))
                netread.release(done, self._deadline)

        self._retry("check push", call)

    def list_tags(self) -> list[str]:
        """All tags of the repository; [] if the repository does not exist. ``Link`` pagination is followed on
        the registry's origin only, ends at a page already read, and fails past ``netread.PAGE_LIMIT`` pages."""
        first = self._url("tags/list?n=1000")
        return self._read("list tags", first, lambda: self._tag_pages(first))

    def _tag_pages(self, first: str) -> list[str]:
        tags: list[str] = []
        seen: set[str] = set()
        url: str | None = first
        while url and url not in seen:
            if len(seen) >= netread.PAGE_LIMIT:
                raise MalformedAnswer(f"{redact(first)}: tag list longer than {netread.PAGE_LIMIT} pages (the limit)")
            seen.add(url)
            resp = self._request("GET", url, ok=(200, 404))
            if resp.status_code == 404:
                codes = _error_codes(self._body(resp, netread.ERROR_LIMIT, "error answer"))
                if not codes or "NAME_UNKNOWN" in codes:
                    return tags
                raise RegistryError(f"GET tags/list -> HTTP 404 {codes}", status=404, codes=codes)
            nxt = _next_link(resp, url)
            tags.extend(_tag_page(self._json(resp, netread.DOCUMENT_LIMIT, "tag list"), url))
            if nxt is not None and not netread.same_origin(nxt, first):
                raise MalformedAnswer(f"{redact(url)}: the tag list's next page is on another origin "
                                      f"({redact(nxt)}); refused")  # fmt: skip
            url = nxt
        return tags

    def head_manifest(self, reference: str) -> ManifestInfo | None:
        def call() -> ManifestInfo | None:
            resp = self._request(
                "HEAD", self._url(f"manifests/{reference}"), ok=(200, 404), headers={"Accept": MANIFEST_ACCEPT}
            )
            netread.release(resp, self._deadline)
            if resp.status_code == 404:
                return None
            size = resp.headers.get("Content-Length")
            return ManifestInfo(
                digest=resp.headers.get("Docker-Content-Digest"),
                media_type=resp.headers.get("Content-Type"),
                size=int(size) if size and size.isdigit() else None,
            )

        return self._read(f"HEAD manifest {reference}", self._url(f"manifests/{reference}"), call)

    def get_manifest(self, reference: str) -> Manifest | None:
        def call() -> Manifest | None:
            resp = self._request(
                "GET",
                self._url(f"manifests/{reference}"),
                ok=(200, 404),
                headers={"Accept": MANIFEST_ACCEPT, "Cache-Control": "no-cache"},
            )
            if resp.status_code == 404:
                netread.release(resp, self._deadline)
                return None
            return Manifest(
                body=self._body(resp, netread.MANIFEST_LIMIT, "manifest"),
                media_type=resp.headers.get("Content-Type"),
                header_digest=resp.headers.get("Docker-Content-Digest"),
            )

        return self._read(f"GET manifest {reference}", self._url(f"manifests/{reference}"), call)

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str | None:
        """PUT a manifest under a tag or a digest; returns the registry's ``Docker-Content-Digest``."""
        return self._retry(f"PUT manifest {reference}", lambda: self.put_manifest_once(reference, body, media_type))

    def put_manifest_once(self, reference: str, body: bytes, media_type: str) -> str | None:
        """One PUT attempt, no retry: the caller re-checks the tag between attempts."""
        return self._put_manifest(reference, body, media_type).get("Docker-Content-Digest")

    def _put_manifest(self, reference: str, body: bytes, media_type: str) -> Mapping[str, str]:
        """One PUT of a manifest; the response's headers."""
        resp = self._request(
            "PUT",
            self._url(f"manifests/{reference}"),
            ok=(201, 200, 202),
            body_factory=lambda: body,
            headers={"Content-Type": media_type},
        )
        netread.release(resp, self._deadline)
        return resp.headers

    def put_manifest_subject(self, reference: str, body: bytes, media_type: str) -> tuple[str | None, str | None]:
        """PUT a manifest that names a ``subject``; returns (``Docker-Content-Digest``, ``OCI-Subject``). A registry
        with the referrers API answers ``OCI-Subject``: it indexes the manifest itself, with no fallback tag."""

        def call() -> tuple[str | None, str | None]:
            headers = self._put_manifest(reference, body, media_type)
            return headers.get("Docker-Content-Digest"), headers.get("OCI-Subject")

        return self._retry(f"PUT manifest {reference}", call)

    def get_referrers(self, digest: str, artifact_type: str | None = None) -> dict[str, Any] | None:
        """``GET /v2/<name>/referrers/<digest>``: the OCI image index of the manifests whose subject is ``digest``;
        None when the registry has no referrers API (404/405, or an answer that is not an image index), so the
        caller reads the tag-schema fallback (``sha256-<hex>``) instead."""
        query = f"?{urlencode({'artifactType': artifact_type})}" if artifact_type else ""
        url = self._url(f"referrers/{digest}") + query

        def call() -> dict[str, Any] | None:
            resp = self._request("GET", url, ok=(200, 404, 405), headers={"Accept": OCI_INDEX})
            if resp.status_code != 200 or not resp.headers.get("Content-Type", "").startswith(OCI_INDEX):
                netread.release(resp, self._deadline)
                return None
            try:
                data = self._json(resp, netread.MANIFEST_LIMIT, "referrers index")
            except MalformedAnswer:
                return None
            return data if isinstance(data, dict) and isinstance(data.get("manifests"), list) else None

        return self._read(f"GET referrers {digest[:19]}", url, call)

    def delete_manifest(self, digest: str) -> bool:
        """DELETE by digest. False when the registry does not allow deletion or does not have it."""

        def call() -> bool:
            resp = self._request("DELETE", self._url(f"manifests/{digest}"), ok=(202, 200, 404, 405))
            netread.release(resp, self._deadline)
            return resp.status_code in (200, 202)

        return self._retry(f"DELETE manifest {digest}", call)

    def blob_exists(self, digest: str) -> bool:
        def call() -> bool:
            resp = self._request("HEAD", self._url(f"blobs/{digest}"), ok=(200, 404))
            netread.release(resp, self._deadline)
            return resp.status_code == 200

        return self._read(f"HEAD blob {digest[:19]}", self._url(f"blobs/{digest}"), call)

    def get_blob(self, digest: str, *, max_bytes: int = 64 << 20, size: int | None = None) -> bytes:
        """The blob ``digest``: at most ``max_bytes``; with ``size`` (what its descriptor declares) exactly that
        many bytes, checked against the digest (without, the caller compares)."""
        if size is not None and not 0 <= size <= max_bytes:
            raise MalformedAnswer(f"blob {digest}: declared size {size} is not within 0..{max_bytes} bytes")
        url = self._url(f"blobs/{digest}")

        def call() -> bytes:
            resp = self._request("GET", url, ok=(200,))
            data = self._body(resp, max_bytes if size is None else size, f"blob {digest[:19]}")
            if size is not None and len(data) != size:
                raise MalformedAnswer(f"blob {digest}: {len(data)} bytes served, its descriptor says {size}")
            if size is not None and sha256_digest(data) != digest:
                raise MalformedAnswer(f"blob {digest}: the registry served other bytes")
            return data

        return self._read(f"GET blob {digest[:19]}", url, call)

    def config_blob(self, manifest: Any, *, max_bytes: int = CONFIG_LIMIT) -> tuple[str, bytes]:
        """The config blob an image manifest names (``manifest``: the parsed manifest document): its digest and its
        bytes, read with the descriptor's digest and size checked; :class:`MalformedAnswer` when the document names
        no config by a sha256 digest and a size within 0..``max_bytes``."""
        config = manifest.get("config") if isinstance(manifest, dict) else None
        digest = config.get("digest") if isinstance(config, dict) else None
        size = config.get("size") if isinstance(config, dict) else None
        if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
            raise MalformedAnswer("the manifest names no config blob by a sha256 digest")
        if isinstance(size, bool) or not isinstance(size, int):
            raise MalformedAnswer(f"the manifest gives config {digest} no size")
        return digest, self.get_blob(digest, max_bytes=max_bytes, size=size)

    def config_of(self, manifest: Any, *, max_bytes: int = CONFIG_LIMIT) -> dict[str, Any]:
        """The image config an image manifest names (see :meth:`config_blob`), parsed: a JSON object, else
        :class:`MalformedAnswer`."""
        digest, blob = self.config_blob(manifest, max_bytes=max_bytes)
        doc = parse_answer(blob, f"config {digest}")
        if not isinstance(doc, dict):
            raise MalformedAnswer(f"config {digest} is not a JSON object")
        return doc

    def download_blob(self, digest: str, size: int, dest: Path, advance: Callable[[int], None] | None = None) -> None:
        """The blob ``digest`` streamed to ``dest`` (through ``dest.part``): at most ``size`` bytes (what its descriptor
        declares), hashed on the way and kept only when their sha256 is the digest. The read, its retries included,
        ends within ``read_seconds`` plus ``size`` at :data:`BLOB_MIN_RATE` (and the policy's total); nothing is left
        on disk when it fails."""
        if not DIGEST_RE.fullmatch(digest) or not 0 <= size <= BLOB_LIMIT:
            raise MalformedAnswer(f"blob {digest[:80]!r}: not a sha256 digest with a size within 0..{BLOB_LIMIT} bytes")
        url = self._url(f"blobs/{digest}")

        def call() -> None:
            resp = self._request("GET", url, ok=(200,))
            try:
                netread.stream_to_file(resp, resp.url or url, dest, size, deadline=self._deadline,
                                       sha256=digest.split(":", 1)[1], advance=advance, what=f"blob {digest[:19]}")  # fmt: skip
            finally:
                resp.close()

        self._read(f"GET blob {digest[:19]}", url, call, seconds=self.read_seconds + size / BLOB_MIN_RATE)

    def mount_blob(self, digest: str, source: str) -> bool:
        """Cross-repository mount: ``POST blobs/uploads/?mount=<digest>&from=<source>`` (same registry).

        True when the registry linked the blob (201); False when it opened an upload session
        instead (it lacks the blob there or does not mount): that session is cancelled.
        """

        def call() -> bool:
            query = urlencode({"mount": digest, "from": source})
            resp = self._request("POST", self._url(f"blobs/uploads/?{query}"), ok=(201, 202))
            netread.release(resp, self._deadline)
            if resp.status_code == 201:
                return True
            location = resp.headers.get("Location")
            if location:
                try:
                    cancel = urljoin(self.repository.base_url + "/", location)
                    netread.release(self._request("DELETE", cancel, ok=(200, 202, 204, 404)))
                except RegistryError:
                    pass  # an abandoned session expires on its own
            return False

        return self._retry(f"mount blob {digest[:19]}", call)

    def upload_blob(self, digest: str, size: int, opener: Callable[[], Any]) -> None:
        """Monolithic upload (POST a session, PUT the bytes with ``?digest=``).

        ``opener`` returns a fresh readable for every attempt: a failed attempt abandons
        its upload session and the next one starts a new session from byte 0.
        """

        def call() -> None:
            resp = self._request("POST", self._url("blobs/uploads/"), ok=(202,))
            location = resp.headers.get("Location")
            netread.release(resp, self._deadline)
            if not location:
                raise RegistryError("POST blobs/uploads/ -> 202 without a Location header")
            upload_url = urljoin(self.repository.base_url + "/", location)
            parsed = urlparse(upload_url)
            query = parse_qs(parsed.query, keep_blank_values=True)
            query["digest"] = [digest]
            put_url = parsed._replace(query=urlencode(query, doseq=True)).geturl()
            resp = self._request(
                "PUT",
                put_url,
                ok=(201,),
                body_factory=opener,
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            )
            netread.release(resp, self._deadline)
            got = resp.headers.get("Docker-Content-Digest")
            if got and got != digest:
                raise RegistryError(f"blob upload stored {got}, expected {digest}")

        self._retry(f"upload blob {digest[:19]}", call)


def _error_codes(body: bytes) -> list[str]:
    try:
        return [str(e.get("code")) for e in (parse_answer(body, "error answer").get("errors") or [])]
    except (ValueError, AttributeError, TypeError):
        return []


def _tag_page(doc: Any, url: str) -> list[str]:
    """The tags of one page of a tag list: ``{"tags": [str, …] | null}``, anything else a MalformedAnswer."""
    tags = doc.get("tags") if isinstance(doc, dict) else ()
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.isprintable() and len(t) <= 128 for t in tags):
        raise MalformedAnswer(f'{redact(url)}: the tag list is not {{"tags": [strings]}}')
    return tags


def _next_link(resp: requests.Response, current: str) -> str | None:
    link = resp.headers.get("Link")
    if not link or len(link) > 8192:  # no page link, or none a registry would send
        return None
    m = re.search(r"<([^>]+)>\s*;\s*rel=\"?next\"?", link)
    if not m:
        return None
    return urljoin(current, m.group(1))


def split_ref(ref: str) -> tuple[Repository, str]:
    """(repository, tag or digest) of ``host/name:tag`` or ``host/name@sha256:…``. A reference that carries a
    credential (``user:password@host/…``) is refused, and never printed back."""
    if split_url(ref)[1] is not None or "://" in ref:
        raise UserError(f"{redact_text(ref)}: a reference carries no scheme and no credential", file="REF",
                        fix="give HOST/NAME:TAG; credentials come from STACKFORGE_REGISTRY_USER/_PASSWORD or "
                            "`docker login` (the docker config)")  # fmt: skip
    if "@" in ref:
        name, _, reference = ref.partition("@")
    else:
        name, sep, reference = ref.rpartition(":")
        if not sep or "/" in reference:
            name, reference = ref, "latest"
    if not looks_like_host(name.split("/", 1)[0]):
        raise UserError(f"{redact_text(ref)}: name the registry, e.g. registry.example.com/team/vllm:TAG or …@sha256:…",
                        file="REF", fix="give the reference as published (`stackforge publish` prints it)")  # fmt: skip
    return parse_repository(name, what="REF"), reference


def is_remote(ref: str) -> bool:
    return looks_like_host(ref.split("/", 1)[0]) and "/" in ref
