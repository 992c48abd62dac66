"""URLs with credentials: split them off so nothing downstream can print them."""
from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit


def redact(url: str) -> str:
    """The URL without user:password, safe for logs, labels, evidence and cache keys."""
    parts = urlsplit(url)
    if not (parts.username or parts.password):
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def credentials(url: str) -> tuple[str, str] | None:
    parts = urlsplit(url)
    if parts.username or parts.password:
        return unquote(parts.username or ""), unquote(parts.password or "")
    return None


def host(url: str) -> str:
    return urlsplit(url).hostname or ""
