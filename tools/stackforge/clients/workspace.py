"""What one run of stackforge works with on the host: the repository root, the caches, the
credential resolver, the CA bundle and the engine.

The CLI builds one :class:`Workspace` per run (``cli/main.py``, from ``--root`` and the verb's
``--ca-bundle`` / ``--builder``) and hands it to the library; a library function called without
one uses :meth:`Workspace.at` the stack's root (:func:`workspace_for`), or :meth:`Workspace.default`
when it holds no stack, so both ask the same questions the same way. A stack's credentials travel with the
stack (``StackCredentials``); a URL held without its stack asks the workspace (``url_credential``).

Every cache lives in one base directory: ``$STACKFORGE_CACHE`` when set, else
``<root>/build/cache`` inside the repository, else ``~/.cache/stackforge``
(``$XDG_CACHE_HOME/stackforge`` when that is set). Each kind of cache is a
subdirectory of it:

- ``git/`` and ``sdist/``: the upstream cache (bare mirrors, downloaded sdists);
  ``build.sources`` takes the base itself (``kind=""``) and adds these below it
- ``layers/``: the publisher's diff-id → blob cache
- ``index/``: package index pages, revalidated with ETag / Last-Modified
- ``wheels/``: wheels downloaded by ``stackforge wheel``
- ``list/``: the rows of ``stackforge list`` (``stack.listing``)
- ``schema/``: the stack model's core schema (``stack.schemacache``), a function of the code alone: under
  ``$STACKFORGE_CACHE`` or the user's cache, never in a repository
- ``build/``: the records that answer a no-op ``stackforge build`` (``build.uptodate``)
- ``engine/``: what an engine's export told (the config digest of an image a remote containerd-store engine
  names by its manifest's or index's digest: ``clients.contentstore``)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.clients import credentials
from stackforge.errors import UserError
from stackforge.urls import Credential

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine
    from stackforge.stack.load import LoadedStack
    from stackforge.stack.resolved import ResolvedStack

STACKS_DIR = "stacks"
CACHE_ENV = "STACKFORGE_CACHE"
CA_BUNDLE_ENV = "STACKFORGE_CA_BUNDLE"
SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def cache_dir(root: Path | None, kind: str) -> Path:
    """The cache directory of ``kind`` (``""``: the base directory) for the repository at ``root``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        base = Path(env)
    elif root is not None:
        base = Path(root) / "build" / "cache"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stackforge"
    return base / kind if kind else base


def ca_bundle_file(option: str | None) -> Path | None:
    """The CA bundle file an option names: ``"auto"`` is ``$STACKFORGE_CA_BUNDLE`` or the host's system
    bundle (none when the host has none), ``None`` / ``"none"`` is no bundle, else a PEM file that must exist."""
    if option is None or option == "none":
        return None
    if option == "auto":
        env = os.environ.get(CA_BUNDLE_ENV)
        if env:
            option = env
        else:
            return next((Path(p) for p in SYSTEM_CA_BUNDLES if Path(p).is_file()), None)
    path = Path(option)
    if not path.is_file():
        raise UserError(
            f"CA bundle {path} does not exist", file="--ca-bundle", fix="pass a PEM file, or --ca-bundle none"
        )
    return path


@dataclass(eq=False)
class Workspace:
    """The host side of one run.

    ``locate`` finds the repository root when it is first asked for (the CLI's ``--root`` checks run
    then, so a verb that needs no repository never fails on one); ``ca_bundle`` is the ``--ca-bundle``
    choice (``"auto"``, ``"none"``/``None`` or a path); ``builder`` the buildx builder the engine uses."""

    locate: Callable[[], Path] = field(repr=False)
    ca_bundle: str | None = "auto"
    builder: str | None = None
    #: fetch every upstream again even when the cache holds its pinned commit (``--refresh``)
    refresh: bool = False
    #: build from this mirror (``stackforge mirror``) with no network: ``build --offline --mirror DIR``
    mirror: Path | None = None

    @classmethod
    def at(cls, root: Path | str, *, ca_bundle: str | None = "auto", builder: str | None = None) -> Workspace:
        """The workspace of the repository at ``root`` (what a library call without one uses)."""
        fixed = Path(root)
        return cls(lambda: fixed, ca_bundle=ca_bundle, builder=builder)

    @classmethod
    def default(cls) -> Workspace:
        """The workspace of a library call made with neither a workspace nor a stack: the repository
        found upwards from the working directory (looked for only when asked), the default CA bundle."""
        return cls(find_root)

    @functools.cached_property
    def root(self) -> Path:
        """The repository root (a UserError when there is none)."""
        return self.locate()

    def cache(self, kind: str = "") -> Path:
        """The cache directory of ``kind`` (``""``: the base); outside a repository, the user's cache."""
        try:
            root: Path | None = self.root
        except UserError:
            root = None
        return cache_dir(root, kind)

    def ca_bundle_file(self) -> Path | None:
        """The CA bundle file of this run's ``ca_bundle`` choice (see :func:`ca_bundle_file`)."""
        return ca_bundle_file(self.ca_bundle)

    @functools.cached_property
    def engine(self) -> Engine:
        """The engine, created when first used (a verb that builds nothing never checks for one); its module is
        imported here, so a run that answers without the engine (``stackforge list``, a no-op build) never loads it."""
        from stackforge.clients.engine import Engine

        return Engine(builder=self.builder, memo=self.cache("engine"))

    def url_credential(self, url: str) -> Credential | None:
        """The credential for a URL held without its stack (``credentials.for_url``)."""
        return credentials.for_url(url)


def workspace_for(loaded: LoadedStack | ResolvedStack, workspace: Workspace | None) -> Workspace:
    """``workspace``, or the default one at the stack's repository root."""
    return workspace if workspace is not None else Workspace.at(loaded.root)


def find_root(start: Path | None = None) -> Path:
    """The repository root: the nearest directory upwards holding stacks/."""
    env = os.environ.get("STACKFORGE_ROOT")
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / STACKS_DIR).is_dir():
            return cand
    raise UserError(
        f"no {STACKS_DIR}/ directory here or in any parent of {here}",
        fix="run stackforge inside a stackforge repository, or pass --root DIR",
    )
