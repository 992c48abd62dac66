"""URLs with credentials: split them off so nothing downstream can print them."""
from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit


def redact(url: str) -> str:
    """The URL without user:password, safe for logs, labels, evidence and cache keys."""
    try:
        parts = urlsplit(url)
        if not (parts.username or parts.password):
            return url
        host = parts.netloc.rsplit("@", 1)[1]
    except ValueError:
        return "<unparseable URL>"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def redact_text(text: str) -> str:
    """Any ``scheme://user:password@`` inside free text (an override, an error) with the userinfo removed."""
    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@", r"\1", text)


def credentials(url: str) -> tuple[str, str] | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.username or parts.password:
        return unquote(parts.username or ""), unquote(parts.password or "")
    return None


def host(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""
