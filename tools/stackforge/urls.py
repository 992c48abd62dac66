"""URLs with credentials: split them off so nothing downstream can print them.

A credential in a URL is either userinfo (``scheme://user:password@host/…``; everything before the
LAST ``@`` ahead of the path is userinfo, so a password may hold spaces, ``:`` or an unencoded ``@``)
or the value of a sensitive query or fragment parameter (``?token=…``, ``?X-Amz-Signature=…``, see
``SENSITIVE_KEYS``; keys compare case-insensitively). ``user:password@host/…`` without a scheme counts
too; ``git@github.com:org/repo.git`` (a user name without a password) does not.

- ``split`` parses one URL into the URL without its credentials and a ``Credential``.
- ``redact`` / ``redact_text`` are the only forms a URL or a text quoting URLs is ever shown in:
  userinfo becomes ``***@`` and a sensitive parameter's value ``***``; host, port and path stay.
  Both run in linear time (no backtracking pattern), whatever the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

#: Query (and fragment) parameters whose value is a secret, compared case-insensitively.
SENSITIVE_KEYS = frozenset(
    {
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "auth_token",
        "authorization",
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "client_secret",
        "key",
        "api_key",
        "apikey",
        "api-key",
        "sig",
        "signature",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "private_token",
        "private-token",
        "job_token",
        "session_token",
        "sessiontoken",
    }
)

_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_AUTHORITY_END = re.compile(r"[/?#\r\n]")
# A key from SENSITIVE_KEYS right after ?, &, ; or #, then its value up to the next separator.
# Every alternative is a literal and the value class cannot overlap what follows: no backtracking.
_QUERY_SECRET = re.compile(
    r"(?<=[?&;#])("
    + "|".join(re.escape(k) for k in sorted(SENSITIVE_KEYS, key=len, reverse=True))
    + r")=[^&;#\s'\"<>]*",
    re.I,
)
# ``user:password@`` without a scheme, at the start of a token. The user part cannot hold ':' and the
# lookbehind only lets a match start at a token boundary, so each token is scanned a bounded number of times.
_BARE_USERINFO = re.compile(r"(?<![^\s'\"=,(\[<{])[^\s'\"=,()\[\]<>{}/@:]+:[^\s'\"<>/]*@(?=[\w\[])")


@dataclass(frozen=True)
class Credential:
    """What was split off a URL (or found for it elsewhere): basic-auth user and password and the
    sensitive query parameters (raw ``key=value`` pairs, as written). ``repr`` shows none of it."""

    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    query: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    source: str = "url"  # url | env | netrc

    @property
    def auth(self) -> tuple[str, str] | None:
        """``(user, password)`` for HTTP basic auth, or ``None`` when there is none."""
        return (self.username, self.password) if (self.username or self.password) else None

    def secrets(self) -> list[str]:
        """Every secret string this credential holds (for scrubbing text that may echo one)."""
        return [s for s in (self.password, *(v for _, v in self.query), *(unquote(v) for _, v in self.query)) if s]

    def params(self) -> dict[str, str]:
        """The query parameters to add to a request, decoded."""
        return {unquote(k): unquote(v) for k, v in self.query}

    def with_query(self, url: str) -> str:
        """``url`` with the sensitive query parameters put back (for a tool that takes one URL)."""
        if not self.query:
            return url
        base, hash_, frag = url.partition("#")
        sep = "&" if "?" in base else "?"
        return base + sep + "&".join(f"{k}={v}" for k, v in self.query) + hash_ + frag

    def with_userinfo(self, url: str) -> str:
        """``url`` with ``user:password@`` (percent-encoded) in front of the host, and the query put back."""
        url = self.with_query(url)
        if not self.auth:
            return url
        scheme, sep, rest = url.partition("://")
        if not sep:
            return url
        userinfo = quote(self.username, safe="") + (":" + quote(self.password, safe="") if self.password else "")
        return f"{scheme}://{userinfo}@{rest}"


def _scheme_start(text: str, colon: int, floor: int) -> int:
    """Index where the scheme ending at ``text[colon]`` (the ':' of '://') starts; ``colon`` if none."""
    s = colon
    while s > floor and text[s - 1] in _SCHEME_CHARS:
        s -= 1
    while s < colon and not text[s].isalpha():  # a scheme starts with a letter
        s += 1
    return s


def _authority_end(text: str, start: int) -> int:
    m = _AUTHORITY_END.search(text, start)
    return m.start() if m else len(text)


def _redact_userinfo(text: str) -> str:
    """Replace the userinfo of every ``scheme://…@`` in ``text`` with ``***``; one pass, linear."""
    out: list[str] = []
    pos = 0
    i = text.find("://")
    while i != -1:
        s = _scheme_start(text, i, pos)
        start = i + 3
        end = _authority_end(text, start)
        at = text.rfind("@", start, end)
        if s < i and at != -1:
            out.append(text[pos:start])
            out.append("***")
            pos = at
        i = text.find("://", max(start, end - 1))  # the authority may end inside the next '://'
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str) -> str:
    """``text`` with every URL credential in it (userinfo, with or without a scheme, and sensitive query
    or fragment values) replaced by ``***``. Linear in ``len(text)``."""
    if not text:
        return text
    text = _redact_userinfo(text)
    text = _BARE_USERINFO.sub("***@", text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + "=***", text)


def redact(url: str) -> str:
    """The URL as it may be shown: userinfo as ``***@``, sensitive parameter values as ``***``,
    scheme, host, port and path unchanged. Never fails, whatever the URL."""
    return redact_text(str(url))


def scrub(text: str, credential: Credential | None = None) -> str:
    """``text`` (a tool's output, which may echo a URL) with URL credentials redacted and no literal
    secret of ``credential`` left in it."""
    text = redact_text(text)
    for secret in credential.secrets() if credential else ():
        text = text.replace(secret, "***")
    return text


def _split_params(text: str, sep: str) -> tuple[str, list[tuple[str, str]]]:
    """``(kept parameters joined again, [(key, value) of sensitive ones]``)."""
    kept, secret = [], []
    for part in text.split(sep):
        key, eq, value = part.partition("=")
        if eq and unquote(key).strip().lower() in SENSITIVE_KEYS:
            secret.append((key, value))
        else:
            kept.append(part)
    return sep.join(kept), secret


def split(url: str) -> tuple[str, Credential | None]:
    """``(url without any credential, Credential or None)``.

    Userinfo is removed (user and password percent-decoded; the first ``:`` separates them), sensitive
    query parameters move into the credential, sensitive fragment parameters are dropped (a fragment is
    never sent). A user name without a password in a scheme-less URL (``git@host:org/repo``) stays."""
    text = str(url)
    username = password = ""
    had_userinfo = False
    i = text.find("://")
    if i != -1 and _scheme_start(text, i, 0) == 0 and i > 0:
        start = i + 3
        end = _authority_end(text, start)
        at = text.rfind("@", start, end)
        if at != -1:
            userinfo = text[start:at]
            text = text[:start] + text[at + 1 :]
            had_userinfo = True
    elif _BARE_USERINFO.match(text):
        end = _authority_end(text, 0)
        at = text.rfind("@", 0, end)
        userinfo, text, had_userinfo = text[:at], text[at + 1 :], True
    if had_userinfo:
        user, _, pw = userinfo.partition(":")
        username, password = unquote(user), unquote(pw)
    base, hash_, fragment = text.partition("#")
    path, qmark, query = base.partition("?")
    query, secret = _split_params(query, "&") if qmark else ("", [])
    fragment, _dropped = _split_params(fragment, "&") if hash_ else ("", [])
    clean = path + ("?" + query if query else "") + ("#" + fragment if fragment else "")
    if not (had_userinfo or secret):
        return clean, None
    return clean, Credential(username, password, tuple(secret))


def credentials(url: str) -> tuple[str, str] | None:
    """``(user, password)`` from the URL's userinfo, or ``None``."""
    cred = split(url)[1]
    return cred.auth if cred else None


def host(url: str) -> str:
    """The host name of ``url`` (credentials ignored), or ``""`` when it has none or cannot be parsed."""
    try:
        return urlsplit(split(url)[0]).hostname or ""
    except ValueError:
        return ""
