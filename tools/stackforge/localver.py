"""The local-label rule: when an installed version satisfies a pinned one (standard library only).

One rule for every place that compares a pin with a version: the stack's rules (train, aligned, built-for,
vendor build), the preserve check after each pip phase, the gate, ``verify`` (which re-runs the gate),
``diff`` and ``lock``. This file is also shipped into images beside the gate scripts (images/gate/localver.py
is a link to it), so it imports nothing outside the standard library.

A version is ``public[+local]`` (PEP 440): ``0.2.7+musa`` has the public version ``0.2.7`` and the local label
``musa``. Public versions compare as PEP 440 does (``1.26`` is ``1.26.0``); local labels compare after
normalisation (lower case, ``-`` and ``_`` read as ``.``).

==================  =====================  ==============================  ===========================
pin                 installed              verdict                         why
==================  =====================  ==============================  ===========================
``0.2.7``           ``0.2.7``              match                           the same version
``0.2.7``           ``0.2.7+musa``         match (a build of the pin)      pip's ``==0.2.7`` installs it
``0.2.7+musa``      ``0.2.7+musa``         match                           the pinned build
``0.2.7+musa``      ``0.2.7``              no match                        not the pinned build
``0.2.7+musa``      ``0.2.7+musa.2``       no match                        another build
any                 another public version no match                        another version
==================  =====================  ==============================  ===========================

What was installed is always recorded exactly as installed (``0.2.7+musa``), never as the pin.
A family that moves as one version (``rules.aligned``) aligns on the public version: ``mate 0.2.7`` and
``flash_attn_3 0.2.7+musa`` are aligned.
"""

from __future__ import annotations

import re

_VERSION = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc", "rc": "rc"}

#: the verdicts :func:`verdict` gives, in the order of the table above
MATCH, BUILD_OF_PIN, NOT_PINNED_BUILD, OTHER_BUILD, OTHER_VERSION = (
    "match",
    "build-of-pin",
    "not-the-pinned-build",
    "other-build",
    "other-version",
)


class InvalidVersion(ValueError):
    """Not a PEP 440 version."""


def _match(version: str) -> re.Match[str]:
    m = _VERSION.match(version)
    if m is None:
        raise InvalidVersion(f"not a PEP 440 version: {version!r}")
    return m


def public_key(version: str) -> tuple:
    """The public version as a comparable key (trailing zeros of the release dropped, spellings normalised)."""
    m = _match(version)
    release = [int(p) for p in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre = (_PRE[m["pre_l"].lower()], int(m["pre_n"] or 0)) if m["pre_l"] else None
    post = None
    if m["post_n1"] is not None:
        post = int(m["post_n1"])
    elif m["post_l"]:
        post = int(m["post_n2"] or 0)
    dev = int(m["dev_n"] or 0) if m["dev_l"] else None
    return (int(m["epoch"] or 0), tuple(release), pre, post, dev)


def local(version: str) -> str | None:
    """The normalised local label (``MUSA-5_2`` → ``musa.5.2``), or None."""
    label = _match(version)["local"]
    return re.sub(r"[-_]", ".", label.lower()) if label else None


def public(version: str) -> str:
    """The public part as written (``0.2.7+musa`` → ``0.2.7``)."""
    _match(version)
    return version.strip().split("+", 1)[0]


def valid(version: str) -> bool:
    return _VERSION.match(version) is not None


def same_public(a: str, b: str) -> bool:
    return public_key(a) == public_key(b)


def same_build(a: str, b: str) -> bool:
    """Exactly the same version: the same public version and the same local label (or none)."""
    return same_public(a, b) and local(a) == local(b)


def verdict(pin: str, installed: str) -> str:
    """How ``installed`` stands to ``pin``: one of the verdicts above (see the module's table)."""
    if not same_public(pin, installed):
        return OTHER_VERSION
    want, have = local(pin), local(installed)
    if want == have:
        return MATCH
    if want is None:
        return BUILD_OF_PIN
    return NOT_PINNED_BUILD if have is None else OTHER_BUILD


def matches(pin: str, installed: str) -> bool:
    """Whether ``installed`` satisfies ``pin`` (PEP 440's ``==``, as pip installs it)."""
    return verdict(pin, installed) in (MATCH, BUILD_OF_PIN)


def explain(pin: str, installed: str) -> str:
    """A few words on the verdict, for a report line: ``""`` when both are the same build."""
    v = verdict(pin, installed)
    return {
        MATCH: "",
        BUILD_OF_PIN: f"the +{local(installed)} build of the pin {pin}",
        NOT_PINNED_BUILD: f"no local label, but the pin is the +{local(pin)} build",
        OTHER_BUILD: f"the +{local(installed)} build, but the pin is the +{local(pin)} build",
        OTHER_VERSION: f"version {public(installed)}, but the pin is {public(pin)}",
    }[v]
