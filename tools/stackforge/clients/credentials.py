"""Where the credentials for an index or an upstream URL come from: one resolver for every path.

Order, first found wins:

1. what was split off the URL itself (userinfo and sensitive query parameters, ``urls.split``);
   the stack loader splits them at load time and records them here (``remember``), so a caller
   holding only the clean URL finds them too;
2. ``STACKFORGE_INDEX_<NAME>_USERNAME`` / ``STACKFORGE_INDEX_<NAME>_PASSWORD`` for the stack index
   ``<NAME>`` (upper-cased, every non-alphanumeric character replaced by ``_``);
3. the ``machine`` entry for the URL's host in ``$NETRC`` or ``~/.netrc``.

The build's netrc secret, the host-side sdist fetch and git fetch, ``stackforge lock`` and
``stackforge newest`` all ask the run's ``Workspace`` (``index_credential`` / ``url_credential``,
thin over ``for_index`` / ``for_url``); none reads credentials on its own.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from netrc import NetrcParseError, netrc
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.urls import Credential, host, split

if TYPE_CHECKING:
    from stackforge.stack.load import LoadedStack  # stack.load imports this module

_KNOWN: dict[str, tuple[str | None, Credential | None]] = {}  # clean URL -> (index name, URL credential)
_LOCK = threading.Lock()


def _key(url: str) -> str:
    return str(url).rstrip("/")


def remember(clean_url: str, credential: Credential | None, index_name: str | None = None) -> None:
    """Record what the loader split off ``clean_url`` (and which stack index it is) for ``for_url``.
    The stack loaded last decides: a URL it gives without a credential has none from the URL."""
    with _LOCK:
        _KNOWN[_key(clean_url)] = (index_name, credential)


def env_credentials(index_name: str, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """``(user, password)`` for the stack index ``index_name`` from the environment, or ``None``.
    A password alone (a token) is sent with an empty user name."""
    env = os.environ if environ is None else environ
    key = re.sub(r"[^A-Za-z0-9]", "_", index_name).upper()
    user = env.get(f"STACKFORGE_INDEX_{key}_USERNAME")
    password = env.get(f"STACKFORGE_INDEX_{key}_PASSWORD")
    if user is None and password is None:
        return None
    return (user or "", password or "")


def netrc_file(environ: Mapping[str, str] | None = None) -> Path:
    """The netrc file index and git credentials are read from: ``$NETRC``, else ``~/.netrc``."""
    env = os.environ if environ is None else environ
    return Path(env.get("NETRC") or os.path.expanduser("~/.netrc"))


def docker_config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The docker client's configuration directory (registry logins, the current buildx builder)."""
    env = os.environ if environ is None else environ
    return Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker")


def docker_config_file(environ: Mapping[str, str] | None = None) -> Path:
    """The docker client's configuration file: registry logins (``auths``) and credential helpers."""
    return docker_config_dir(environ) / "config.json"


def netrc_credentials(hostname: str, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """``(login, password)`` for ``hostname`` from ``$NETRC`` or ``~/.netrc``; ``None`` when absent or unreadable."""
    if not hostname:
        return None
    path = netrc_file(environ)
    try:
        found = netrc(str(path)).authenticators(hostname) if path.is_file() else None
    except (NetrcParseError, OSError):
        return None
    if not found:
        return None
    login, _account, password = found
    return (login or "", password or "")


def resolve(
    url: str, index_name: str | None = None, url_credential: Credential | None = None, *, remembered: bool = True
) -> Credential | None:
    """The credential for ``url`` (userinfo in it is honoured too): URL > environment > netrc.
    ``remembered``: also look up what the stack loader split off this URL (``remember``)."""
    clean, in_url = split(url)
    if in_url is None and url_credential is None and remembered:
        with _LOCK:
            known_name, url_credential = _KNOWN.get(_key(clean), (None, None))
        index_name = index_name or known_name
    cred = in_url or url_credential
    if cred is not None:
        return cred
    if index_name:
        env = env_credentials(index_name)
        if env is not None:
            return Credential(env[0], env[1], (), "env")
    found = netrc_credentials(host(clean))
    return Credential(found[0], found[1], (), "netrc") if found else None


def for_index(loaded: LoadedStack, index_name: str) -> Credential | None:
    """The credential of the index ``index_name`` of a loaded stack (what its URL carried, split off at load)."""
    url = loaded.model.indexes[index_name].url
    return resolve(url, index_name, loaded.credentials.get(index_name), remembered=False)


def for_url(url: str) -> Credential | None:
    """The credential for a URL the caller holds without its stack (an sdist index, a git upstream)."""
    return resolve(url)


def netrc_entries(pairs: list[tuple[str, Credential | None]]) -> str:
    """netrc text with one ``machine`` line per ``(url, credential)`` that has a user or password.
    Values are quoted, so a password with spaces or quotes survives."""
    lines = {}
    for url, cred in pairs:
        h = host(url)
        if h and cred is not None and cred.auth and h not in lines:
            user, password = cred.auth
            lines[h] = f"machine {h} login {_netrc_quote(user)} password {_netrc_quote(password)}\n"
    return "".join(lines.values())


def _netrc_quote(value: str) -> str:
    """A netrc token: bare when it is plain, else double-quoted with ``\\`` escapes (curl, pip, Python 3.11+)."""
    if value and re.fullmatch(r"[A-Za-z0-9._~!$%&*+,/:;=?@^|-]+", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextmanager
def private_dir(prefix: str) -> Iterator[Path]:
    """A mode-0700 temporary directory for secret files, removed on exit (also on an exception)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        path.chmod(0o700)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` created with mode 0600 (never readable by others, not even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def for_registry(
    host: str, env: Mapping[str, str] | None = None, docker_config: Path | None = None
) -> tuple[str, str] | None:
    """``(user, password)`` for registry ``host``: ``STACKFORGE_REGISTRY_USER``/``_PASSWORD``, else the ``auths``
    entry of the docker client config (``docker login`` without a credential helper); ``None`` when neither."""
    environ: Mapping[str, str] = os.environ if env is None else env
    user, password = environ.get("STACKFORGE_REGISTRY_USER"), environ.get("STACKFORGE_REGISTRY_PASSWORD")
    if user and password:
        return user, password
    if docker_config is None:
        docker_config = docker_config_file(environ)
    try:
        auths = json.loads(Path(docker_config).read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v2/", f"http://{host}/v2/"):
        entry = auths.get(key)
        if entry and entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return user, password
    return None
