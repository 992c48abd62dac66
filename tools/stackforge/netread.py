"""Bounded network reads: an answer is hostile input until it has been read within its limits.

- :class:`Deadline`: an overall time limit for one operation (a manifest, an index page, a doctor check),
  not for one read. :func:`guard` enforces it: a watchdog shuts the sockets of the requests made under it
  once it passes, so a server that trickles one byte a second cannot hold a status line, a header, a chunk
  line or a body past it. Sessions must be made by :func:`session` (or mount :class:`WatchedAdapter`) for
  their sockets to be watched.
- :func:`read_body` / :func:`stream_to_file`: a response body read with a byte cap (a declared
  ``Content-Length`` over it fails before a byte is read) and the deadline checked between reads;
  ``stream_to_file`` writes to ``<dest>.part`` while hashing and keeps nothing when anything fails.
- :func:`same_origin`: credentials go only where they were given for (scheme, host and port).

Every failure here is an :class:`Exceeded` (a ``UserError``, exit 1) naming the URL redacted and the limit.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3 import exceptions as u3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from stackforge.errors import UserError
from stackforge.urls import redact

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
CHUNK = 64 * KiB
#: manifests and image indexes, as containerd limits them
MANIFEST_LIMIT = 4 * MiB
#: one page of a tag list, a referrers index, a token answer
DOCUMENT_LIMIT = 4 * MiB
#: an error answer's body (only its first lines are ever shown)
ERROR_LIMIT = 64 * KiB
#: one project page of a package index (PyPI's largest JSON pages are a few tens of MiB)
INDEX_PAGE_LIMIT = 64 * MiB
#: a download whose size nothing declared (an sdist the index gave no size for)
DOWNLOAD_LIMIT = 2 * GiB
#: pages of one paginated listing
PAGE_LIMIT = 100
#: redirects followed by hand (credentials are re-decided at each hop)
REDIRECT_LIMIT = 5


class Exceeded(UserError):
    """An answer went over a limit (size, time, pages) or broke the protocol; nothing of it was kept."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message, fix=fix or "the server's answer is not one this client accepts; check the URL "
                         "(a proxy or server that answers endlessly or slowly is refused)", exit_code=1)  # fmt: skip


def too_large(url: str, limit: int, what: str = "answer") -> Exceeded:
    return Exceeded(f"{redact(url)}: {what} larger than {limit} bytes (the limit)")


# --------------------------------------------------------------------------------------------------
# Origins


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of ``url``, the port defaulted from the scheme; host lower-case."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
        return scheme, (parts.hostname or "").lower(), port
    except ValueError:
        return "", "", None


def same_origin(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` share scheme, host and port (and have a host at all)."""
    oa = origin(a)
    return bool(oa[1]) and oa == origin(b)


# --------------------------------------------------------------------------------------------------
# Deadlines


class Deadline:
    """``seconds`` from now (monotonic)."""

    def __init__(self, seconds: float, what: str = "") -> None:
        self.seconds = max(float(seconds), 0.001)
        self.end = time.monotonic() + self.seconds
        self.what = what

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def timeout(self, per_read: float) -> float:
        """A socket timeout that never outlives the deadline."""
        return max(min(per_read, self.remaining()), 0.001)

    def error(self, url: str) -> Exceeded:
        return Exceeded(
            f"{redact(url)}: timed out: no complete answer within {self.seconds:g} s (the limit{self._of()})"
        )

    def check(self, url: str) -> None:
        if self.expired():
            raise self.error(url)

    def _of(self) -> str:
        return f" for {self.what}" if self.what else ""


class _Watchdog:
    def __init__(self) -> None:
        self.socks: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.fired = False
        self.lock = threading.Lock()

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            if self.fired:
                _shut(sock)
            self.socks.add(sock)

    def fire(self) -> None:
        with self.lock:
            self.fired = True
            for sock in list(self.socks):
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


_current = threading.local()


@contextmanager
def guard(deadline: Deadline, url: str) -> Iterator[Deadline]:
    """Run requests (made through :func:`session`) under ``deadline``: when it passes, their sockets are shut,
    and whatever failed after it is reported as the deadline (an :class:`Exceeded` naming ``url``)."""
    dog = _Watchdog()
    outer = getattr(_current, "dog", None)
    _current.dog = dog
    timer = threading.Timer(max(deadline.remaining(), 0.0), dog.fire)
    timer.daemon = True
    timer.start()
    try:
        yield deadline
    except Exceeded:
        raise
    except Exception:
        if dog.fired or deadline.expired():
            raise deadline.error(url) from None
        raise
    finally:
        timer.cancel()
        _current.dog = outer
    if dog.fired:
        raise deadline.error(url)


class _Registering:
    """A connection that hands its socket to the current guard's watchdog for every response it reads."""

    sock: Any

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        dog = getattr(_current, "dog", None)
        if dog is not None and self.sock is not None:
            dog.add(self.sock)
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _WatchedHTTP(_Registering, HTTPConnection):
    pass


class _WatchedHTTPS(_Registering, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTP


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPS


class WatchedAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections a :func:`guard` can shut."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        """Connections through an environment proxy are watched too."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if hasattr(manager, "pool_classes_by_scheme"):
            manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
        return manager


def session(*, trust_env: bool = False, **adapter: Any) -> requests.Session:
    """A session whose sockets a :func:`guard` watches. ``trust_env``: environment proxies and ``~/.netrc``
    (for a host's own netrc entry), as pip uses them; off, credentials are only what each request carries."""
    s = requests.Session()
    s.trust_env = trust_env
    mounted = WatchedAdapter(**adapter)
    s.mount("http://", mounted)
    s.mount("https://", mounted)
    return s


def _loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname.strip("[]")).is_loopback
    except ValueError:
        return False


def environment_settings(url: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the environment says about reaching ``url``, as docker reads it for a registry: the proxy of
    ``HTTPS_PROXY``/``HTTP_PROXY`` unless ``NO_PROXY`` exempts the host (a loopback host is never proxied), and the
    CA bundle of ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``. Never ``~/.netrc``: credentials are only what each
    request carries. For a session made with ``trust_env=False``."""
    env = os.environ if environ is None else environ
    hostname = urlsplit(url).hostname or ""
    proxies: dict[str, str] = {}
    if not _loopback(hostname):
        lower = {
            k.lower(): v for k, v in env.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
        }
        scheme = urlsplit(url).scheme
        proxy = lower.get(f"{scheme}_proxy") or lower.get("all_proxy")
        if proxy and not requests.utils.should_bypass_proxies(url, no_proxy=lower.get("no_proxy", "")):
            proxies = {scheme: proxy}
    verify: bool | str = env.get("REQUESTS_CA_BUNDLE") or env.get("CURL_CA_BUNDLE") or True
    return {"proxies": proxies, "verify": verify}


# --------------------------------------------------------------------------------------------------
# Bodies


def declared_length(resp: requests.Response) -> int | None:
    value = resp.headers.get("Content-Length", "").strip()
    return int(value) if value.isdigit() else None


def iter_body(
    resp: requests.Response, url: str, limit: int, deadline: Deadline | None = None, what: str = "answer"
) -> Iterator[bytes]:
    """The body of a streamed ``resp`` (``stream=True``) in pieces as they arrive: at most ``limit`` bytes
    (decoded), the deadline checked between reads. Over a limit the response is closed."""
    declared = declared_length(resp)
    if declared is not None and declared > limit and "Content-Encoding" not in resp.headers:
        resp.close()
        raise too_large(url, limit, what)
    total = 0
    while True:
        if deadline is not None and deadline.expired():
            resp.close()
            raise deadline.error(url)
        data = _read1(resp)
        if not data:
            return
        total += len(data)
        if total > limit:
            resp.close()
            raise too_large(url, limit, what)
        yield data


def _read1(resp: requests.Response) -> bytes:
    """At most one read from the socket (as much as arrived, up to ``CHUNK``), with urllib3's errors as
    requests' (as ``iter_content`` raises them)."""
    try:
        return resp.raw.read1(CHUNK, decode_content=True) or b""
    except u3.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from None
    except u3.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from None
    except u3.ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from None
    except u3.SSLError as exc:
        raise requests.exceptions.SSLError(exc) from None
    except (OSError, ValueError) as exc:  # a socket shut by a guard, a closed response
        raise requests.exceptions.ConnectionError(exc) from None


def read_body(
    resp: requests.Response, url: str, limit: int, deadline: Deadline | None = None, what: str = "answer"
) -> bytes:
    """The whole body of a streamed ``resp``, within ``limit`` bytes and ``deadline``."""
    return b"".join(iter_body(resp, url, limit, deadline, what))


def release(resp: requests.Response, deadline: Deadline | None = None, limit: int = ERROR_LIMIT) -> None:
    """Done with ``resp``: a short rest of its body is read (so its connection goes back to the pool), a long
    or broken one is cut off with the connection."""
    try:
        for _ in iter_body(resp, resp.url or "", limit, deadline):
            pass
    except (Exceeded, requests.RequestException):
        pass
    finally:
        resp.close()


def stream_to_file(
    resp: requests.Response,
    url: str,
    dest: Path,
    limit: int,
    *,
    deadline: Deadline | None = None,
    sha256: str | None = None,
    advance: Callable[[int], None] | None = None,
    what: str = "download",
) -> str:
    """Write the body of ``resp`` to ``dest`` (through ``dest.part``), hashing it on the way; returns its
    sha256 hex. Over ``limit``, past ``deadline``, on a broken connection or when ``sha256`` is given and
    differs, nothing is left on disk."""
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(part, "wb") as fh:
            for data in iter_body(resp, url, limit, deadline, what):
                fh.write(data)
                h.update(data)
                if advance is not None:
                    advance(len(data))
        if sha256 is not None and h.hexdigest() != sha256.lower():
            raise Exceeded(
                f"{redact(url)}: sha256 mismatch: expected {sha256}, got {h.hexdigest()}",
                fix="the server sent other bytes than the pinned or declared ones; do not use it",
            )
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return h.hexdigest()


#: what a connection error's text means, in the words a person looks for
CAUSES = [
    ("Connection refused", "connection refused"),
    ("Connection reset", "connection reset by peer"),
    ("RemoteDisconnected", "connection closed without a response"),
    ("Name or service not known", "host name not found"),
    ("Temporary failure in name resolution", "host name not found"),
    ("Failed to resolve", "host name not found"),
    ("Read timed out", "read timed out"),
    ("timed out", "timed out"),
    ("CERTIFICATE_VERIFY_FAILED", "TLS certificate verification failed"),
    ("WRONG_VERSION_NUMBER", "TLS handshake failed (is it a plain-HTTP registry?)"),
]


def short_cause(exc: BaseException) -> str:
    """What a failed request came to, in a few words ("host name not found", "connection refused", …);
    the exception's own text, on one line and cut at 300 characters, when it is none of :data:`CAUSES`."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)):
        for needle, cause in CAUSES:
            if needle in text:
                return cause
    text = re.sub(r"\s+", " ", text)
    return text[:300]
