"""The grammars of stack values that reach a Dockerfile, a shell line, a label or a file path,
and the one implementation of the OCI image reference grammar (``[host[:port]/]path[:tag][@digest]``).

Used by the loader (``stack/model.py``), the tag checks (``stack/tags.py``), the registry client's
reference parsing (``clients/registry.py``) and the publish tag scheme (``stack/scheme.py``).
Each ``check_*`` function returns ``None`` for a valid value and otherwise the reason, worded so it
completes "<key>: …" in an error message; ``split_*`` functions cut a reference into its parts.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# OCI distribution: tags, repository path components, registry host[:port].
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
PATH_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
REPO_PATH_RE = re.compile(rf"^{PATH_COMPONENT}(?:/{PATH_COMPONENT})*$")
#: A TCP port, 1-65535, without leading zeros.
PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
HOST_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    rf"|\[[0-9a-fA-F:]+\])(?::{PORT})?$"
)
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
#: The date in a publish tag.
DATE_RE = re.compile(r"^\d{8}$")

#: A name used as a map key: a stage-name suffix, a context directory, a cache directory, a file name.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# a distribution name as PEP 508 spells it (packages.<name>)
PROJECT_RE = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
LABEL_KEY_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?)*$")
PYTHON_RE = re.compile(r"^(?:/[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*|[A-Za-z0-9_][A-Za-z0-9._+-]*)$")
GIT_REF_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*(?:/[A-Za-z0-9_][A-Za-z0-9._+-]*)*$")
REL_PATH_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*/?$")
#: Characters a URL may hold beyond letters and digits: none of them means anything to a shell.
URL_CHARS = re.compile(r"^[A-Za-z0-9._~:/%+,=@\[\]-]*$")
GIT_URL_SCHEMES = ("https", "http", "ssh", "git", "file")

#: The control characters (Unicode category Cc: C0, DEL and C1) and the line separators Python's str.splitlines
#: sees besides them; the second leaves out \t (U+0009) and \n (U+000A), which multi-line values may hold.
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
CONTROL_MULTILINE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}


def bad_char(text: str, multiline: bool = False) -> str | None:
    """The first control character (or line separator) in ``text``, described; ``multiline`` allows \\n and \\t."""
    found = (CONTROL_MULTILINE_RE if multiline else CONTROL_RE).search(text)
    if found is None:
        return None
    ch = found.group()
    return _CONTROL_NAMES.get(ch, f"the control character U+{ord(ch):04X}")


def check_text(text: str, multiline: bool = False) -> str | None:
    bad = bad_char(text, multiline)
    return (
        f"contains {bad} (only printable characters{', newlines and tabs' if multiline else ''} are allowed)"
        if bad
        else None
    )


def check_name(name: str) -> str | None:
    if NAME_RE.match(name):
        return None
    return f"{name!r} is not a valid name"


def check_env_name(name: str) -> str | None:
    return None if ENV_NAME_RE.match(name) else f"{name!r} is not a valid environment variable name"


def check_module(name: str) -> str | None:
    return None if MODULE_RE.match(name) else f"{name!r} is not a Python module name (dotted identifiers)"


def check_label_key(key: str) -> str | None:
    if LABEL_KEY_RE.match(key):
        return None
    return f"{key!r} is not a label key in reverse-DNS notation"


def check_python(cmd: str) -> str | None:
    if PYTHON_RE.match(cmd):
        return None
    return f"{cmd!r} is not an interpreter command name or absolute path"


def check_git_ref(ref: str) -> str | None:
    if GIT_REF_RE.match(ref) and ".." not in ref and not ref.endswith((".lock", ".")) and "@{" not in ref:
        return None
    return f"{ref!r} is not a git tag name"


def check_relative_path(path: str) -> str | None:
    parts = path.rstrip("/").split("/")
    if REL_PATH_RE.match(path) and not any(p in (".", "..") for p in parts):
        return None
    return f"{path!r} is not a relative path inside the repository"


def check_digest(digest: str) -> str | None:
    return None if DIGEST_RE.match(digest) else f"{digest!r} is not a digest sha256:<64 lowercase hex digits>"


def check_tag(tag: str) -> str | None:
    """Return a reason when ``tag`` is not a valid OCI tag."""
    if TAG_RE.match(tag):
        return None
    if len(tag) > 128:
        return f"is {len(tag)} characters long (at most 128)"
    bad = sorted({c for c in tag if not re.match(r"[A-Za-z0-9._-]", c)})
    if bad:
        return "contains " + ", ".join(repr(c) for c in bad) + " (allowed: letters, digits, '.', '_', '-')"
    return "must start with a letter, digit or '_'"


def looks_like_host(component: str) -> bool:
    """Whether the first component of a reference names a registry (holds '.' or ':', or is localhost).

    As in docker's reference grammar, so ``mcconline/vllm`` is a path, not host ``mcconline``.
    """
    return "." in component or ":" in component or component == "localhost"


def split_host(repo: str) -> tuple[str | None, str]:
    """``[host[:port]/]path`` → (host or None, path)."""
    first, _, rest = repo.partition("/")
    return (first, rest) if rest and looks_like_host(first) else (None, repo)


def split_tag(name: str) -> tuple[str, str | None]:
    """``repository[:tag]`` → (repository, tag or None): the tag follows the last ':' after the last '/'."""
    slash, colon = name.rfind("/"), name.rfind(":")
    return (name[:colon], name[colon + 1 :]) if colon > slash else (name, None)


def check_repository(repo: str) -> str | None:
    """Return a reason when ``repo`` (optionally with a registry host) is not a valid repository name."""
    host, path = split_host(repo)
    if host is not None and not HOST_RE.match(host):
        port = re.fullmatch(r".*[^:]:([0-9]+)", host)
        if port and not re.fullmatch(PORT, port.group(1)):
            return f"registry host '{host}' has port {port.group(1)}, out of range (a port is 1-65535, no leading zero)"
        return f"registry host '{host}' is not a valid host[:port]"
    if not REPO_PATH_RE.match(path):
        return f"repository path '{path}' must be lowercase letters, digits and separators (., _, __, -) between '/'"
    return None


def check_image_ref(ref: str) -> str | None:
    """Return a reason when ``ref`` is not an image reference ``[host[:port]/]path[:tag][@sha256:…]``."""
    bad = bad_char(ref)
    if bad or " " in ref:
        return f"{ref!r} is not an image reference: it contains {bad or 'a space'}"
    name, at, digest = ref.partition("@")
    if at and not DIGEST_RE.match(digest):
        return f"{ref!r} is not an image reference: '@{digest}' is not sha256:<64 hex digits>"
    repo, tag = split_tag(name)
    reason = check_repository(repo) or (check_tag(tag) and f"tag '{tag}' {check_tag(tag)}" if tag is not None else None)
    return f"{ref!r} is not an image reference: {reason}" if reason else None


def check_url(url: str, shown: str, schemes: tuple[str, ...] = ("http", "https", "file")) -> str | None:
    """Return a reason when ``url`` is not a plain URL of ``schemes``; ``shown`` is the URL to name (redacted)."""
    bad = bad_char(url)
    if bad or any(c.isspace() for c in url):
        return f"'{shown}' is not a valid URL: it contains {bad or 'whitespace'}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        return f"'{shown}' is not a valid URL: {exc}"
    if parts.scheme not in schemes:
        named = (
            "http(s):// or file://"
            if set(schemes) == {"http", "https", "file"}
            else ", ".join(f"{s}://" for s in schemes)
        )
        return f"'{shown}' is not an {named} URL"
    host = parts.netloc.rpartition("@")[2]
    if parts.scheme != "file" and not (host and HOST_RE.match(host)):
        return f"'{shown}' is not a valid URL: no valid host"
    if parts.scheme == "file" and not parts.path.startswith("/"):
        return f"'{shown}' is not a valid URL: a file:// URL needs an absolute path"
    rest = f"{host}{parts.path}"
    if parts.query or parts.fragment or "?" in url or "#" in url or not URL_CHARS.match(rest):
        odd = sorted(
            {c for c in rest if not URL_CHARS.match(c)}
            | ({"?"} if "?" in url else set())
            | ({"#"} if "#" in url else set())
        )
        return f"'{shown}' is not a valid URL: it contains {', '.join(repr(c) for c in odd)}"
    return None


def check_git_source(src: str, shown: str) -> str | None:
    """A git URL (https, http, ssh, git, file), ``user@host:path`` or a local path; never an option or a helper."""
    bad = bad_char(src)
    if bad or any(c.isspace() for c in src):
        return f"'{shown}' is not a git URL or path: it contains {bad or 'whitespace'}"
    if src.startswith("-"):
        return f"'{shown}' is not a git URL or path: it starts with '-'"
    if re.match(r"^[A-Za-z0-9+._-]*::", src):
        return f"'{shown}' is not a git URL or path: transport helpers (<helper>::) are not allowed"
    if "://" in src:
        return (
            check_url(src, shown, GIT_URL_SCHEMES)
            if src.split("://", 1)[0] != "file"
            else check_url(src, shown, ("file",))
        )
    if any(c in src for c in "\"'`$;&|<>(){}*?\\!"):
        return f"'{shown}' is not a git URL or path: it contains shell characters"
    return None


# apt: Debian policy names and versions, apt source fields, absolute paths inside the image.
APT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{1,127}$")
APT_VERSION_RE = re.compile(r"^(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~-]{0,127}$")
APT_SUITE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,63})*$")
APT_COMPONENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ABS_PATH_RE = re.compile(r"^(?:/[A-Za-z0-9_+@][A-Za-z0-9._+@-]{0,254})+$|^/$")
COMMAND_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}$")


def check_apt_name(name: str) -> str | None:
    return None if APT_NAME_RE.match(name) else f"{name!r} is not a Debian package name (a-z, 0-9, '+', '.', '-')"


def check_apt_version(version: str) -> str | None:
    if APT_VERSION_RE.match(version):
        return None
    return f"{version!r} is not a Debian version such as 2.4.1-1 (or a version line such as 5.2)"


def check_apt_suite(suite: str) -> str | None:
    if APT_SUITE_RE.match(suite) and ".." not in suite:
        return None
    return f"{suite!r} is not an apt suite such as jammy or bookworm-updates"


def check_apt_component(component: str) -> str | None:
    return None if APT_COMPONENT_RE.match(component) else f"{component!r} is not an apt component such as main"


def check_absolute_path(path: str) -> str | None:
    """An absolute path inside the image: no '.' or '..' component, no empty component, no shell character."""
    parts = path.split("/")[1:]
    if ABS_PATH_RE.match(path) and not any(p in (".", "..") for p in parts):
        return None
    return f"{path!r} is not an absolute path (letters, digits, '.', '_', '+', '@', '-' between '/'; no '..')"


def check_command(name: str) -> str | None:
    return None if COMMAND_RE.match(name) else f"{name!r} is not a command name such as mcc"


SITE_PREFIX = "{site}/"


def check_file_source(path: str) -> str | None:
    """A file a kernel wrote under /out/files: a relative path, no '.' or '..' component, not a directory."""
    if path.endswith("/") or check_relative_path(path):
        return f"{path!r} is not a file path relative to the kernel's /out/files (e.g. vllm/vllm-rs; no '..')"
    return None


def check_file_dest(path: str) -> str | None:
    """Where a kernel's file is installed: an absolute path, or ``{site}/<relative path>`` (the venv's site-packages)."""
    if path.startswith(SITE_PREFIX):
        rest = path[len(SITE_PREFIX) :]
        if rest and not rest.endswith("/") and not check_relative_path(rest):
            return None
    elif path != "/" and not path.endswith("/") and not check_absolute_path(path):
        return None
    return f"{path!r} is not an absolute file path or {{site}}/<relative path> (no '..')"
