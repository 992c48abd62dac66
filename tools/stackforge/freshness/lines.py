"""The line of a pin: which files on an index count as "the same line" as a pinned version.

"Newer" only means something within the *line* the pin belongs to. The line is fixed by the pinned
version's own files on the index:

* **Tags.** Among the pinned version's wheels, the one that installs on the stack's platform
  (``platform.python`` → ``cp310``, ``platform.arch`` → ``x86_64``, Linux/glibc of ``platform.os``) is
  chosen, best tag first; its tags are the line's tags. A candidate version belongs to the line only if
  one of its wheels carries one of those exact tags -- same python tag, same ABI, same platform. A
  ``cp312`` or an ``aarch64`` build is another line, and so is a pure-Python ``py3-none-any`` line next
  to a compiled one. A pin that only exists as an sdist has an sdist line. A pin the index does not list
  at all falls back to "any wheel that installs on the stack's platform", so a replacement can still
  be suggested.

* **Local-label family.** The local label names the vendor build, and a different label is a different
  line: ``+musa5.2.0`` and ``+musa5.2.1mp22`` never compare with each other, however the versions
  sort. Nothing is stripped: the family of an ordinary pin is its *whole* local label (or "no label").
  A *built-for* package (``rules.built_for``, e.g. deep_ep built for torch) is the exception: its label
  is rendered from a template (``{{ for.local }}torch{{ for.public }}``) whose ``for.local`` part is the
  MUSA family (``musa5.2.0``) and whose ``for.public`` part moves with the package it is built for. Its
  line is therefore "the label the template gives for the stack's own torch pin": deep_ep's newest for
  a post1 stack is the newest ``+musa5.2.0torch2.11.0.post1`` build, and builds for other torch versions
  are reported separately (they become reachable when the train moves, see ``freshness.bump``).

Yanked files never count as newer; pre-releases count only when the pin itself is one.

A ``Catalog`` holds the index pages of a stack's packages (fetched concurrently, one client per index)
and answers these questions for ``freshness.newest`` and ``freshness.bump``.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from jinja2.sandbox import SecurityError
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.version import Version

from stackforge import progress
from stackforge.clients.index import IndexClient, IndexFile, IndexQueryError, IndexUnreachable, ProjectPage
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.stack import tags
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin
from stackforge.stack.platforms import glibc_of


def standalone(version: str) -> str:
    """A regex matching ``version`` where it stands alone: ``2.11.0.post1`` does not match inside
    ``2.11.0.post10`` or ``12.11.0.post1``."""
    return rf"(?<![0-9.]){re.escape(version)}(?![0-9A-Za-z]|\.[0-9A-Za-z])"


def _render_rule(template: str, data: dict) -> str:
    """A built-for template of the stack's rules, rendered in the stack-template sandbox."""
    try:
        return tags.render_sandboxed(template, data)
    except (tags.TemplateRefused, SecurityError, jinja2.TemplateError) as exc:
        raise UserError(f"rules.built_for: template refused: {exc}", fix=tags.TEMPLATE_FIX) from None


# --------------------------------------------------------------------------------------------------
# Platform → wheel tags


def target_tags(stack: Stack) -> list[Tag]:
    """Wheel tags that install on the stack's platform, most specific first."""
    major, minor = (int(x) for x in stack.platform.python.split(".")[:2])
    arch = stack.platform.arch
    glibc_max = glibc_of(stack.platform.os)
    platforms = [f"manylinux_{glibc_max[0]}_{m}_{arch}" for m in range(glibc_max[1], 4, -1)]
    legacy = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
    out_platforms = []
    for p in platforms:
        out_platforms.append(p)
        minor_ = int(p.split("_")[2])
        if (2, minor_) in legacy:
            out_platforms.append(f"{legacy[(2, minor_)]}_{arch}")
    out_platforms.append(f"linux_{arch}")
    interp = f"cp{major}{minor}"
    tags = list(cpython_tags((major, minor), platforms=out_platforms))
    tags += list(compatible_tags((major, minor), interpreter=interp, platforms=out_platforms))
    return list(dict.fromkeys(tags))


def _rank(file: IndexFile, ranks: dict[Tag, int]) -> int | None:
    best = None
    for t in file.tags:
        r = ranks.get(t)
        if r is not None and (best is None or r < best):
            best = r
    return best


# --------------------------------------------------------------------------------------------------
# Lines


@dataclass
class Line:
    """Which files of a project count as the same line as a pin (see the module docstring)."""

    kind: str  # "wheel" (exact tags), "sdist", or "compatible" (pin missing: any installable wheel)
    tags: frozenset[Tag] = frozenset()
    local: str | None = None  # required local label (normalised), None = no label
    ranks: dict[Tag, int] = field(default_factory=dict, repr=False)
    note: str = ""

    def holds(self, f: IndexFile) -> bool:
        v = f.version
        if v is None or v.local != self.local:
            return False
        if self.kind == "sdist":
            return f.kind == "sdist"
        if f.kind != "wheel":
            return False
        if self.kind == "wheel":
            return bool(self.tags & f.tags)
        return _rank(f, self.ranks) is not None

    def best(self, files: list[IndexFile]) -> IndexFile | None:
        ok = [f for f in files if self.holds(f)]
        if not ok:
            return None
        return min(ok, key=lambda f: (_rank(f, self.ranks) if _rank(f, self.ranks) is not None else 10**6, f.filename))

    def describe(self) -> str:
        if self.kind == "sdist":
            tags = "sdist"
        elif self.kind == "wheel":
            tags = ",".join(sorted(str(t) for t in self.tags))
        else:
            tags = "any installable wheel"
        return f"{tags} {'+' + self.local if self.local else '(no local label)'}"


def _norm_local(version: str) -> str | None:
    return Version(version).local


def line_for(page: ProjectPage, pinned: str, ranks: dict[Tag, int], local: str | None = None) -> Line:
    """The line of ``pinned`` on ``page``; ``local`` overrides the required local label (built-for)."""
    want_local = _norm_local(pinned) if local is None else local
    pin_v = Version(pinned)
    pin_files = [f for f in page.files if f.version == pin_v]
    wheels = [f for f in pin_files if f.kind == "wheel"]
    installable = [(rank, f) for f in wheels if (rank := _rank(f, ranks)) is not None]
    if installable:
        best = min(installable, key=lambda rf: rf[0])[1]
        return Line("wheel", best.tags, want_local, ranks)
    if any(f.kind == "sdist" for f in pin_files):
        return Line("sdist", frozenset(), want_local, ranks)
    if wheels:
        tags = frozenset().union(*(f.tags for f in wheels))
        return Line("wheel", tags, want_local, ranks, note="the pinned version has no wheel for this platform")
    return Line("compatible", frozenset(), want_local, ranks)


def versions_in_line(
    page: ProjectPage, line: Line, *, allow_pre: bool, keep: Version | None = None
) -> dict[Version, IndexFile]:
    """Newest-first map version → the line's best file for it. Yanked files count only for ``keep``
    (the pin), and only when no non-yanked file of it is in the line (PEP 592, as pip selects)."""
    groups: dict[Version, list[IndexFile]] = {}
    for f in page.files:
        v = f.version
        if v is None or not line.holds(f):
            continue
        if f.is_yanked and v != keep:
            continue
        if (v.is_prerelease or v.is_devrelease) and not allow_pre and v != keep:
            continue
        groups.setdefault(v, []).append(f)
    out = {}
    for v in sorted(groups, reverse=True):
        # PEP 592: pip takes a yanked file only when nothing else matches the exact pin.
        best = line.best([f for f in groups[v] if not f.is_yanked]) or line.best(groups[v])
        if best is not None:
            out[v] = best
    return out


# --------------------------------------------------------------------------------------------------
# Built-for templates


def render_built_for(template: str, for_version: str) -> str:
    return _render_rule(template, {"for": Pin(for_version).as_context()})


def built_for_pattern(template: str, family_local: str) -> re.Pattern:
    """A regex over normalised local labels: ``for.local`` fixed to ``family_local``, the rest captured."""
    sentinels = {
        "local": "zzlocalzz",
        "public": "zzpubliczz",
        "release": "zzreleasezz",
        "version": "zzversionzz",
        "post": "zzpostzz",
    }
    text = _render_rule(template, {"for": sentinels}).lower()
    rx = re.escape(text)
    rx = rx.replace("zzlocalzz", re.escape((Version("0+" + family_local).local or "") if family_local else ""))
    rx = rx.replace("zzpubliczz", r"(?P<public>[0-9][0-9a-z.]*?)")
    rx = rx.replace("zzreleasezz", r"(?P<release>[0-9][0-9.]*?)")
    rx = rx.replace("zzversionzz", r"(?P<version>[0-9][0-9a-z.]*?)")
    rx = rx.replace("zzpostzz", r"(?P<post>[0-9]+)")
    return re.compile(f"^{rx}$")


# --------------------------------------------------------------------------------------------------
# Querying every package of a stack


def clients_for(
    loaded: LoadedStack | ResolvedStack,
    cache_dir: Path | None,
    *,
    max_workers: int = 8,
    reuse: dict[str, IndexClient] | None = None,
) -> dict[str, IndexClient]:
    """One client per stack index, with the credential the stack gives for it (``StackCredentials``). A client of ``reuse`` (by index name: e.g. the one ``prefetch.start``
    made, with the pages it has fetched) stands in for the new one only when it asks the same index the same
    way (``IndexClient.same_as``)."""
    out = {}
    for name, idx in loaded.model.indexes.items():
        client = IndexClient(
            idx.url, credential=loaded.credentials.for_index(name), cache_dir=cache_dir, max_workers=max_workers
        )
        earlier = (reuse or {}).get(name)
        out[name] = earlier if earlier is not None and earlier.same_as(client) else client
    return out


def fetch_pages(
    stack: Stack, names: list[str], clients: dict[str, IndexClient], max_workers: int = 32
) -> dict[str, ProjectPage | IndexQueryError]:
    """Project pages for ``names`` (each from its own index), fetched concurrently: one pool of at most
    ``max_workers`` threads across the packages and indexes (each index's client bounds its own connections);
    the result is in the order of ``names`` whatever order the answers come in."""

    def one(name: str):
        try:
            return clients[stack.packages[name].index].project(name)
        except IndexQueryError as exc:
            return exc

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(names))) as pool:
        return dict(zip(names, pool.map(one, names)))


class Catalog:
    """The index pages of a stack's packages plus the stack's platform: answers line questions."""

    def __init__(self, stack: Stack, pages: dict[str, ProjectPage | IndexQueryError]):
        self.stack = stack
        self.pages = pages
        self.tags = target_tags(stack)
        self.ranks = {t: i for i, t in enumerate(self.tags)}
        self._built_for = {bf.package: bf for bf in stack.rules.built_for}

    def page(self, name: str) -> ProjectPage | None:
        p = self.pages.get(name)
        return p if isinstance(p, ProjectPage) else None

    def expected_local(self, name: str, versions: dict[str, str] | None = None) -> str | None:
        """For a built-for package: the local label its build for the (given or pinned) for-version has."""
        bf = self._built_for.get(name)
        if bf is None:
            return None
        for_version = (versions or {}).get(bf.for_, self.stack.packages[bf.for_].version)
        return _norm_local("0+" + render_built_for(bf.local, for_version))

    def _answered(self, name: str) -> ProjectPage:
        page = self.page(name)
        if page is None:
            raise LookupError(f"the index gave no page for {name}; check catalog.page({name!r}) first")
        return page

    def line(self, name: str, pinned: str | None = None, versions: dict[str, str] | None = None) -> Line:
        """The line of ``name``'s pin (or of ``pinned``); only for a package whose page was fetched."""
        page = self._answered(name)
        pinned = pinned or self.stack.packages[name].version
        return line_for(page, pinned, self.ranks, local=self.expected_local(name, versions))

    def candidates(self, name: str, line: Line) -> dict[Version, IndexFile]:
        """Newest-first versions of ``name`` in ``line``; only for a package whose page was fetched."""
        pin = Version(self.stack.packages[name].version)
        return versions_in_line(self._answered(name), line, allow_pre=pin.is_prerelease, keep=pin)


def load_catalog(
    loaded: LoadedStack | ResolvedStack,
    names: list[str] | None = None,
    *,
    cache_dir: Path | None = None,
    clients: dict[str, IndexClient] | None = None,
    workspace: Workspace | None = None,
) -> tuple[Catalog, dict[str, IndexClient]]:
    """The index pages of ``names`` (default: every package of the stack), with the clients that fetched them
    (default: :func:`clients_for`); a query over more than one package is a progress step on stderr."""
    stack = loaded.model
    names = list(names) if names else list(stack.packages)
    clients = clients or clients_for(loaded, cache_dir)
    if len(names) < 2:
        return Catalog(stack, fetch_pages(stack, names, clients)), clients
    indexes = len({stack.packages[n].index for n in names})
    with progress.step(f"query {len(names)} packages on {indexes} {'index' if indexes == 1 else 'indexes'}"):
        pages = fetch_pages(stack, names, clients)
    return Catalog(stack, pages), clients


def sortable_version(v: str) -> Version:
    """``v`` as a sort key; a string that is no version sorts first."""
    try:
        return Version(v)
    except Exception:
        return Version("0")


def unreachable(catalog: Catalog, names: list[str]) -> str | None:
    """The cause, in a few words, when the index of ``names`` gave no answer to any of them (said once for the
    index instead of once per package); None when it answered at least once, or refused for another reason."""
    errors = [catalog.pages.get(n) for n in names]
    if not errors or not all(isinstance(e, IndexUnreachable) for e in errors):
        return None
    return "; ".join(dict.fromkeys(e.cause for e in errors if isinstance(e, IndexUnreachable)))


def redirect(index: str) -> str:
    """The ``--set`` that points the stack at another URL for index ``index`` (as ``stackforge doctor`` says it)."""
    return f"--set indexes.{index}.url=<URL>"
