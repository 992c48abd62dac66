"""Where the credentials for an index or an upstream URL come from: one resolver for every path.

Order, first found wins:

1. what was split off the URL itself (userinfo and sensitive query parameters, ``urls.split``);
   the stack loader splits them at load time into the stack's ``StackCredentials``, which travels with the
   stack (``LoadedStack.credentials``, ``ResolvedStack.credentials``) to the steps that fetch;
2. ``STACKFORGE_INDEX_<NAME>_USERNAME`` / ``STACKFORGE_INDEX_<NAME>_PASSWORD`` for the stack index
   ``<NAME>`` (upper-cased, every non-alphanumeric character replaced by ``_``);
3. the ``machine`` entry for the URL's host in ``$NETRC`` or ``~/.netrc``.

The build's netrc secret, the host-side sdist fetch and git fetch, ``stackforge lock`` and
``stackforge newest`` ask the stack's ``StackCredentials`` (``for_index`` / ``for_url``) and pass what it gives
to the client; a URL held without its stack asks ``for_url`` (environment and netrc). None reads credentials on
its own, and nothing is kept between loads.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.errors import UserError, printable
from stackforge.urls import Credential, host, split

if TYPE_CHECKING:
    from stackforge.clients.dockerconfig import AuthEntry
    from stackforge.stack.load import LoadedStack  # stack.load imports this module
    from stackforge.stack.resolved import ResolvedStack

_LOCK = threading.Lock()


def _key(url: str) -> str:
    return str(url).rstrip("/")


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


#: the docker client's config.json: a few logins and helper names (read by the resolver and checked before the
#: docker CLI, which waits forever on a FIFO, is run)
DOCKER_CONFIG_LIMIT = 4 << 20
#: a netrc file: a few machine lines
NETRC_LIMIT = 1 << 20


def netrc_credentials(hostname: str, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """``(login, password)`` for ``hostname`` from ``$NETRC`` or ``~/.netrc``; ``None`` when absent or unreadable."""
    if not hostname:
        return None
    path = netrc_file(environ)
    if not path.is_file():  # absent, or a FIFO or device (never opened)
        return None
    # with shlex, the bounded reads and the child processes: imported when a credential is looked up, not by the
    # commands that only load a stack
    import netrc

    from stackforge import safeio

    safeio.read_bytes(path, limit=NETRC_LIMIT, what="netrc")  # an endless or huge file is refused, not parsed

    try:
        found = netrc.netrc(str(path)).authenticators(hostname)
    except (netrc.NetrcParseError, OSError):
        return None
    if not found:
        return None
    login, _account, password = found
    return (login or "", password or "")


@dataclass(frozen=True)
class StackCredentials(Mapping[str, Credential]):
    """The credentials a stack names: for each of its indexes, its name and clean URL (the name says which
    ``STACKFORGE_INDEX_<NAME>_*`` variables hold one), and what the loader split off the stack's URLs (an index's
    or a git upstream's userinfo and sensitive query parameters). As a mapping: index name → what was split off
    that index's URL (only the indexes whose URL carried one). Made once per load and carried with the stack;
    ``for_index`` and ``for_url`` resolve from it, then the environment and netrc."""

    indexes: Mapping[str, str] = field(default_factory=dict)  # index name -> clean URL
    split_off: Mapping[str, Credential] = field(default_factory=dict, repr=False)  # clean URL -> what it carried

    def __getitem__(self, index_name: str) -> Credential:
        url = self.indexes.get(index_name)
        found = self.split_off.get(_key(url)) if url is not None else None
        if found is None:
            raise KeyError(index_name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (name for name, url in self.indexes.items() if _key(url) in self.split_off)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def for_index(self, index_name: str) -> Credential | None:
        """The credential of the stack's index ``index_name``: URL > environment > netrc."""
        return resolve(self.indexes[index_name], index_name, self.get(index_name))

    def for_url(self, url: str) -> Credential | None:
        """The credential for ``url`` (an index's or a git upstream's, or another the stack's steps reach): what
        the stack's URL carried, else the environment of the index it is, else netrc."""
        clean, _ = split(url)
        name = next((n for n, u in self.indexes.items() if _key(u) == _key(clean)), None)
        return resolve(url, name, self.split_off.get(_key(clean)))


def resolve(url: str, index_name: str | None = None, url_credential: Credential | None = None) -> Credential | None:
    """The credential for ``url`` (userinfo in it is honoured too, else ``url_credential``: what the stack's URL
    carried): URL > environment (``index_name``'s variables) > netrc."""
    clean, in_url = split(url)
    cred = in_url or url_credential
    if cred is not None:
        return cred
    if index_name:
        env = env_credentials(index_name)
        if env is not None:
            return Credential(env[0], env[1], (), "env")
    found = netrc_credentials(host(clean))
    return Credential(found[0], found[1], (), "netrc") if found else None


def for_index(loaded: LoadedStack | ResolvedStack, index_name: str) -> Credential | None:
    """The credential of the index ``index_name`` of a loaded stack (what its URL carried, split off at load)."""
    return loaded.credentials.for_index(index_name)


def for_url(url: str) -> Credential | None:
    """The credential for a URL the caller holds without its stack: what it carries, else netrc (a stack's URL
    asks the stack's ``StackCredentials.for_url``)."""
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
    """``(user, password)`` for registry ``host``, found as docker finds it: ``STACKFORGE_REGISTRY_USER``/``_PASSWORD``
    first; then the docker client config: the credential helper ``credHelpers`` names for the host, else its
    ``credsStore`` (each asked through the ``docker-credential-<name> get`` protocol), else the host's ``auths``
    entry (``docker login`` without a helper). ``None``: anonymous. A helper the config names but the host does
    not have is a UserError, as it is for docker; so is a config that cannot be read."""
    environ: Mapping[str, str] = os.environ if env is None else env
    user, password = environ.get("STACKFORGE_REGISTRY_USER"), environ.get("STACKFORGE_REGISTRY_PASSWORD")
    if user and password:
        return user, password
    path = Path(docker_config if docker_config is not None else docker_config_file(environ))
    from stackforge.clients.dockerconfig import read_docker_config  # pydantic: only when a registry is asked

    config = read_docker_config(path)
    if config is None:
        return None
    helper = config.credHelpers.get(host) or config.credsStore
    if helper:
        found = helper_get(helper, host, environ, path)
        if found is not None:
            return found
    return _auths_entry(config.auths, host)


def _server_keys(host: str) -> list[str]:
    """The keys docker stores a registry's login under (Docker Hub's is its v1 index URL)."""
    keys = [host, f"https://{host}", f"http://{host}", f"https://{host}/v2/", f"http://{host}/v2/"]
    if host in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        keys.insert(0, "https://index.docker.io/v1/")
    return keys


def _auths_entry(auths: Mapping[str, AuthEntry], host: str) -> tuple[str, str] | None:
    for key in _server_keys(host):
        entry = auths.get(key)
        if entry is not None and entry.auth:
            try:
                user, _, password = base64.b64decode(entry.auth, validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return user, password
    return None


#: what a credential helper says when it holds nothing for a server (exit status 1)
_NOT_FOUND = re.compile(r"credentials not found|not found in native keychain|no credentials", re.I)
HELPER_SECONDS = 30.0


_ASKED: dict[tuple[str, str, str], tuple[str, str] | None] = {}  # (helper, host, PATH) -> its answer, per run


def helper_get(name: str, host: str, environ: Mapping[str, str], config: Path) -> tuple[str, str] | None:
    """Ask ``docker-credential-<name>`` (the docker credential-helper protocol: the server on stdin, a JSON
    ``{"Username", "Secret"}`` on stdout) for each key docker may have stored ``host`` under; once per run."""
    memo = (name, host, environ.get("PATH", ""))
    with _LOCK:
        if memo in _ASKED:
            return _ASKED[memo]
    found = _ask_helper(name, host, environ, config)
    with _LOCK:
        _ASKED[memo] = found
    return found


#: a helper's name, as docker takes it: a bare program name suffix, never a path
_HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: what a helper may print for one answer
HELPER_OUTPUT_LIMIT = 1 << 20


def _ask_helper(name: str, host: str, environ: Mapping[str, str], config: Path) -> tuple[str, str] | None:
    if not _HELPER_NAME.fullmatch(name) or len(name) > 128:
        raise UserError(
            f"the credential helper {printable(repr(name))} named for {host} is not a bare name: a helper is the "
            "suffix of a docker-credential-<name> program on PATH",
            file=config,
            fix='name the helper as `docker login` writes it (for example "pass" or "secretservice")',
        )
    program = shutil.which(f"docker-credential-{name}", path=environ.get("PATH"))
    if program is None:
        raise UserError(
            f"{config} names the credential helper '{name}' for {host}, and docker-credential-{name} is not on PATH",
            fix=f"install docker-credential-{name}, or remove it from {config} (credsStore / credHelpers), or set "
            "STACKFORGE_REGISTRY_USER and STACKFORGE_REGISTRY_PASSWORD",
        )
    fix = "check the helper, or set STACKFORGE_REGISTRY_USER and STACKFORGE_REGISTRY_PASSWORD"
    from stackforge.clients import proc

    for key in _server_keys(host):
        try:
            done = proc.run([program, "get"], input=key, timeout=HELPER_SECONDS, limit=HELPER_OUTPUT_LIMIT, env=environ)
        except OSError as exc:
            raise UserError(f"docker-credential-{name} could not be started: {exc.strerror}", fix=fix) from None
        if done.stopped == "timeout":
            raise UserError(
                f"docker-credential-{name} gave no answer for {host} within {HELPER_SECONDS:g} s (stopped)",
                fix="check the helper (its keychain may wait to be unlocked)",
            )
        if done.stopped == "output":
            raise UserError(
                f"docker-credential-{name} printed more than {HELPER_OUTPUT_LIMIT} bytes for {host} (stopped)", fix=fix
            )
        if done.returncode != 0:
            if _NOT_FOUND.search(done.text("stdout") + done.text("stderr")):
                continue
            # What a helper prints may hold the secret itself: only its status and sizes are said.
            raise UserError(
                f"docker-credential-{name} failed for {host} (exit {done.returncode}; {len(done.stdout)} bytes on "
                f"stdout, {len(done.stderr)} on stderr, not shown: they may hold a secret)",
                fix=fix,
            )
        return _helper_answer(name, host, done.stdout)
    return None


def _helper_answer(name: str, host: str, data: bytes) -> tuple[str, str]:
    from stackforge import safeio
    from stackforge.clients.dockerconfig import HelperAnswer

    try:
        answer = safeio.parse_model(HelperAnswer, data, source=f"docker-credential-{name}", what="answer",
                                    limit=HELPER_OUTPUT_LIMIT)  # fmt: skip
    except safeio.Malformed:
        raise UserError(
            f"docker-credential-{name} answered for {host} with no Username and Secret (its answer is not shown)",
            fix="check the helper's version",
        ) from None
    if answer.Username == "<token>":  # an identity token: docker trades it at the registry's OAuth endpoint
        raise UserError(
            f"docker-credential-{name} holds an identity token for {host}, which stackforge cannot use",
            fix="set STACKFORGE_REGISTRY_USER and STACKFORGE_REGISTRY_PASSWORD (an access token as the password)",
        )
    return answer.Username, answer.Secret
