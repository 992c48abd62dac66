"""A pip phase: one ``pip install`` step against one index, as the plan, the requirement files and the locks
see it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PipPhase:
    """One `pip install` step against one index."""

    name: str  # e.g. "mthreads-nodeps", "pypi", "mthreads-deps"
    index: str  # index whose URL pip uses
    index_url: str  # credential-free URL: written into the Dockerfile as part of the cache key
    requirements: str  # context path of the requirements file
    no_deps: bool
    require_hashes: bool
    pins: list[str]  # "name==version" lines
    lock: str | None = None  # the lock file this phase installs from (repository-relative)
    credentials: bool = False  # mount the netrc secret: only for a private index or one with credentials
    key: str = ""  # the stack key the phase comes from, named when it fails
    checks_pins: bool = True  # preserve checks the vendor pins after it (not the installer: none is installed yet)
    constraints: str | None = None  # context path of its constraints file (the vendor pins), -c
    report: str = ""  # image path of the phase's record (pip report, preserve lines), read by the inventory
    files: list[dict] = field(default_factory=list)  # requirement files: [{upstream, path}]
    no_index: bool = False  # a requirement phase of a locked index: proves offline that the lock installed it all
    mirror: str | None = None  # context path of its index's tree in an offline build (builder/mirror/offline.py)

    def lock_key(self) -> str:
        """The lock this phase installs from (see builder/locks/locks.py): its index's, or ``<vendor>-deps``; the
        installer phase has none (its hashes are the stack's ``base.pip.sha256``)."""
        if self.name == INSTALLER:
            return INSTALLER
        return self.name if self.name.endswith("-deps") else self.index


INSTALLER = "installer"
