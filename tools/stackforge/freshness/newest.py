"""Is this the newest? Index queries per pin (``newest``), train moves (``bump``), stale references (``audit``).

The line of a pin
-----------------
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
  are reported separately (they become reachable when the train moves, see ``bump``).

Yanked files never count as newer; pre-releases count only when the pin itself is one.

Publish times are the index's PEP 700 ``upload-time``; where the index gives none the report says
``unknown`` and no train-spread verdict is made.
"""
from __future__ import annotations

import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import jinja2
import yaml
from jinja2.sandbox import SecurityError
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.version import Version

from stackforge import credentials
from stackforge.errors import BuildFailed, UserError
from stackforge.freshness.index import (
    IndexClient,
    IndexFile,
    IndexQueryError,
    ProjectNotFound,
    ProjectPage,
    format_time,
)
from stackforge.stack import tags
from stackforge.stack.load import load_stack, stack_files, stack_path, stack_root
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin
from stackforge.urls import redact

# glibc of the base OS, for manylinux tags; other OS labels get the widest of these.
GLIBC = {"ubuntu20.04": (2, 31), "ubuntu22.04": (2, 35), "ubuntu24.04": (2, 39),
         "debian11": (2, 31), "debian12": (2, 36), "bookworm": (2, 36), "rockylinux8": (2, 28), "rockylinux9": (2, 34)}
DEFAULT_TRAIN_WINDOW = 3600.0  # seconds: train members published further apart than this are flagged

STATUS_NEWEST = "newest"
STATUS_NEWER = "newer exists"
STATUS_MISSING = "pin missing from index"
STATUS_UNKNOWN = "unknown"

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
    glibc_max = GLIBC.get(stack.platform.os, max(GLIBC.values()))
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
    installable = [f for f in wheels if _rank(f, ranks) is not None]
    if installable:
        best = min(installable, key=lambda f: _rank(f, ranks))
        return Line("wheel", best.tags, want_local, ranks)
    if any(f.kind == "sdist" for f in pin_files):
        return Line("sdist", frozenset(), want_local, ranks)
    if wheels:
        tags = frozenset().union(*(f.tags for f in wheels))
        return Line("wheel", tags, want_local, ranks, note="the pinned version has no wheel for this platform")
    return Line("compatible", frozenset(), want_local, ranks)


def versions_in_line(page: ProjectPage, line: Line, *, allow_pre: bool, keep: Version | None = None) -> dict[Version, IndexFile]:
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
    sentinels = {"local": "zzlocalzz", "public": "zzpubliczz", "release": "zzreleasezz",
                 "version": "zzversionzz", "post": "zzpostzz"}
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


def clients_for(stack: Stack, cache_dir: Path | None, *, max_workers: int = 8) -> dict[str, IndexClient]:
    """One client per stack index, with the credential ``credentials.for_index`` resolves for it."""
    out = {}
    for name, idx in stack.indexes.items():
        out[name] = IndexClient(idx.url, credential=credentials.for_index(stack, name), cache_dir=cache_dir,
                                max_workers=max_workers)
    return out


def fetch_pages(stack: Stack, names: list[str], clients: dict[str, IndexClient],
                max_workers: int = 16) -> dict[str, ProjectPage | IndexQueryError]:
    """Project pages for ``names`` (each from its own index), fetched concurrently."""

    def one(name: str):
        try:
            return clients[stack.packages[name].index].project(name)
        except IndexQueryError as exc:
            return exc

    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(names))) as pool:
        return dict(zip(names, pool.map(one, names)))


@dataclass
class PackageReport:
    name: str
    index: str
    pinned: str
    status: str
    line: str = ""
    newest: str | None = None
    file: IndexFile | None = None  # the newest version's file in the line
    note: str = ""
    pinned_file: IndexFile | None = None  # the pinned version's file in the line

    def to_json(self) -> dict:
        f = self.file
        return {
            "package": self.name,
            "index": self.index,
            "pinned": self.pinned,
            "line": self.line,
            "newest": self.newest,
            "status": self.status,
            "filename": f.filename if f else None,
            "url": redact(f.url) if f else None,
            "upload_time": format_time(f.upload_time, iso=True) if f else None,
            "size": f.size if f else None,
            "sha256": f.sha256 if f else None,
            "pinned_upload_time": format_time(self.pinned_file.upload_time, iso=True) if self.pinned_file else None,
            "pinned_sha256": self.pinned_file.sha256 if self.pinned_file else None,
            "pinned_yanked": self.pinned_file.is_yanked if self.pinned_file else None,
            "note": self.note,
        }


@dataclass
class TrainReport:
    name: str
    which: str  # "pinned" or "newest"
    members: dict[str, str]  # member -> version
    times: dict[str, datetime | None]
    window: float

    @property
    def spread(self) -> float | None:
        if not self.times or any(t is None for t in self.times.values()):
            return None
        ts = [t.timestamp() for t in self.times.values()]
        return max(ts) - min(ts)

    @property
    def far_apart(self) -> bool:
        return self.spread is not None and self.spread > self.window

    def describe(self) -> str:
        vers = ", ".join(f"{m} {v}" for m, v in self.members.items())
        if not self.times:
            return f"train {self.name} ({self.which}): no files to date"
        if self.spread is None:
            unknown = [m for m, t in self.times.items() if t is None]
            return f"train {self.name} ({self.which}: {vers}): publish spread unknown (no upload-time for {', '.join(unknown)})"
        first = min(self.times.values())
        verdict = "FAR APART" if self.far_apart else "together"
        return (f"train {self.name} ({self.which}: {vers}): published {verdict}, within "
                f"{_duration(self.spread)} from {format_time(first)}")

    def to_json(self) -> dict:
        return {"train": self.name, "which": self.which, "members": self.members,
                "upload_times": {m: format_time(t, iso=True) for m, t in self.times.items()},
                "spread_seconds": self.spread, "far_apart": self.far_apart}


@dataclass
class BuiltForReport:
    package: str
    for_: str
    for_version: str
    expected_local: str
    has_build: bool
    builds_for: list[str]  # public versions of the for-package that have a build in the family
    newest_for: str | None = None  # the for-package's newest version in its line, when newer than the pin
    has_build_for_newest: bool | None = None

    def describe(self) -> str:
        head = f"{self.package} built for {self.for_} {self.for_version} (+{self.expected_local}): "
        head += "build present" if self.has_build else "NO BUILD on the index"
        if self.newest_for:
            head += (f"; for the newest {self.for_} {self.newest_for}: "
                     + ("build present" if self.has_build_for_newest else "NO BUILD yet"))
        others = ", ".join(self.builds_for)
        return head + (f" (builds exist for {self.for_} {others})" if others else "")

    def to_json(self) -> dict:
        return {"package": self.package, "for": self.for_, "for_version": self.for_version,
                "expected_local": self.expected_local, "has_build": self.has_build,
                "builds_for": self.builds_for, "newest_for": self.newest_for,
                "has_build_for_newest": self.has_build_for_newest}


@dataclass
class NewestReport:
    stack: str
    target: str
    packages: list[PackageReport]
    trains: list[TrainReport]
    built_for: list[BuiltForReport]
    indexes: dict[str, str]
    seconds: float

    @property
    def exit_code(self) -> int:
        if any(p.status == STATUS_UNKNOWN for p in self.packages):
            return 2
        if any(p.status in (STATUS_NEWER, STATUS_MISSING) for p in self.packages):
            return 1
        if any(not b.has_build for b in self.built_for):
            return 1
        return 0

    def to_json(self) -> dict:
        return {"stack": self.stack, "target": self.target, "indexes": self.indexes,
                "packages": [p.to_json() for p in self.packages],
                "trains": [t.to_json() for t in self.trains],
                "built_for": [b.to_json() for b in self.built_for],
                "seconds": round(self.seconds, 3), "exit_code": self.exit_code}

    def render(self) -> str:
        head = ["package", "pinned", "newest in line", "published", "size", "sha256", "status"]
        rows = []
        for p in self.packages:
            f = p.file
            rows.append([
                p.name, p.pinned, p.newest or "-",
                format_time(f.upload_time) if f else "-",
                (str(f.size) if f.size is not None else "unknown") if f else "-",
                (f.sha256[:16] + "…" if f.sha256 else "unknown") if f else "-",
                p.status,
            ])
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        out = [f"stack {self.stack} — target {self.target}"]
        out += [f"index {n}: {d}" for n, d in self.indexes.items()]
        out.append("")
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        for r in rows:
            out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        out.append("")
        out.append("lines:")
        for p in self.packages:
            pinned = (f"; pinned {p.pinned} published {format_time(p.pinned_file.upload_time)}"
                      if p.pinned_file and p.status != STATUS_NEWEST else "")
            out.append(f"  {p.name}: {p.line or '-'}{pinned}" + (f" — {p.note}" if p.note else ""))
        if self.trains:
            out.append("")
            out.extend(t.describe() for t in self.trains)
        if self.built_for:
            out.append("")
            out.extend(b.describe() for b in self.built_for)
        counts = {}
        for p in self.packages:
            counts[p.status] = counts.get(p.status, 0) + 1
        out.append("")
        out.append(f"{len(self.packages)} packages: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                   + f" ({self.seconds:.2f} s)")
        return "\n".join(out)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


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

    def line(self, name: str, pinned: str | None = None, versions: dict[str, str] | None = None) -> Line | None:
        page = self.page(name)
        if page is None:
            return None
        pinned = pinned or self.stack.packages[name].version
        return line_for(page, pinned, self.ranks, local=self.expected_local(name, versions))

    def candidates(self, name: str, line: Line) -> dict[Version, IndexFile]:
        pin = Version(self.stack.packages[name].version)
        return versions_in_line(self.page(name), line, allow_pre=pin.is_prerelease, keep=pin)


def load_catalog(stack: Stack, names: list[str] | None = None, *, cache_dir: Path | None = None,
                 clients: dict[str, IndexClient] | None = None) -> tuple[Catalog, dict[str, IndexClient]]:
    names = list(names) if names else list(stack.packages)
    clients = clients or clients_for(stack, cache_dir)
    return Catalog(stack, fetch_pages(stack, names, clients)), clients


def _target_text(stack: Stack) -> str:
    p = stack.platform
    return f"python {p.python}, {p.arch}, {p.os}"


def newest(stack: Stack, *, packages: list[str] | None = None, cache_dir: Path | None = None,
           clients: dict[str, IndexClient] | None = None, train_window: float = DEFAULT_TRAIN_WINDOW) -> NewestReport:
    """Per package: pinned, newest in line, its upload time / size / sha256, status; trains; built-for."""
    start = time.monotonic()
    names = packages or list(stack.packages)
    for n in names:
        if n not in stack.packages:
            raise UserError(f"package '{n}' is not in stack {stack.name}",
                            fix=f"packages: {', '.join(stack.packages)}")
    # Built-for checks need the for-package's page too.
    needed = list(dict.fromkeys(names + [bf.for_ for bf in stack.rules.built_for if bf.package in names]))
    catalog, clients = load_catalog(stack, needed, cache_dir=cache_dir, clients=clients)
    reports: dict[str, PackageReport] = {}
    for name in needed:
        pkg = stack.packages[name]
        page = catalog.pages.get(name)
        if not isinstance(page, ProjectPage):
            err = page
            status = STATUS_MISSING if isinstance(err, ProjectNotFound) else STATUS_UNKNOWN
            reports[name] = PackageReport(name, pkg.index, pkg.version, status, note=err.message if err else "")
            continue
        line = catalog.line(name)
        cands = catalog.candidates(name, line)
        pin_v = Version(pkg.version)
        rep = PackageReport(name, pkg.index, pkg.version, STATUS_NEWEST, line=line.describe(), note=line.note)
        if cands:
            top = next(iter(cands))
            rep.newest, rep.file = str(top), cands[top]
        rep.pinned_file = cands.get(pin_v)
        if rep.pinned_file is not None and rep.pinned_file.is_yanked:
            reason = rep.pinned_file.yanked if isinstance(rep.pinned_file.yanked, str) else ""
            rep.note = "; ".join(filter(None, [rep.note, "the pinned version is available only yanked"
                                               + (f" ({reason})" if reason else "")]))
        if pin_v not in cands:
            rep.status = STATUS_MISSING
            if not any(f.version == pin_v for f in page.files):
                rep.note = "; ".join(filter(None, [rep.note, "the index lists no file of the pinned version"]))
            else:
                rep.note = "; ".join(filter(None, [rep.note, "the pinned version has no file in this line"]))
        elif rep.newest and Version(rep.newest) > pin_v:
            rep.status = STATUS_NEWER
        reports[name] = rep

    trains: list[TrainReport] = []
    for train in stack.rules.trains:
        members = [m for m in train.members if m in reports]
        if len(members) < 2:
            continue
        pinned_t, newest_t, pinned_v, newest_v = {}, {}, {}, {}
        for m in members:
            page = catalog.page(m)
            if page is None:
                continue
            line = catalog.line(m)
            cands = catalog.candidates(m, line)
            pv = Version(stack.packages[m].version)
            if pv in cands:
                pinned_v[m], pinned_t[m] = str(pv), cands[pv].upload_time
            if cands:
                top = next(iter(cands))
                newest_v[m], newest_t[m] = str(top), cands[top].upload_time
        trains.append(TrainReport(train.name, "pinned", pinned_v, pinned_t, train_window))
        if newest_v != pinned_v and newest_v:
            trains.append(TrainReport(train.name, "newest", newest_v, newest_t, train_window))

    built: list[BuiltForReport] = []
    for bf in stack.rules.built_for:
        if bf.package not in names:
            continue
        page = catalog.page(bf.package)
        if page is None:
            continue
        for_pin = stack.packages[bf.for_].version
        expected = catalog.expected_local(bf.package)
        line = catalog.line(bf.package)
        has = bool(catalog.candidates(bf.package, line))
        family = Pin(for_pin).local or ""
        pattern = built_for_pattern(bf.local, family)
        others = set()
        for f in page.files:
            if f.version is None or f.version.local is None:
                continue
            m = pattern.match(f.version.local)
            if m and m.groupdict().get("public") and (line.kind != "wheel" or line.tags & f.tags):
                others.add(m.group("public"))
        rep = BuiltForReport(bf.package, bf.for_, for_pin, expected or "", has,
                             sorted(others - {Pin(for_pin).public}, key=_safe_version))
        fr = reports.get(bf.for_)
        if fr and fr.newest and Version(fr.newest) > Version(for_pin):
            rep.newest_for = fr.newest
            nl = catalog.line(bf.package, versions={bf.for_: fr.newest})
            rep.has_build_for_newest = bool(versions_in_line(page, nl, allow_pre=False))
        built.append(rep)

    indexes = {}
    for iname in dict.fromkeys(stack.packages[n].index for n in needed):
        fmts = {catalog.pages[n].format for n in needed
                if stack.packages[n].index == iname and isinstance(catalog.pages.get(n), ProjectPage)}
        indexes[iname] = f"{clients[iname].display_url} ({'/'.join(sorted(fmts)) or 'no answer'})"
    return NewestReport(stack.name, _target_text(stack), [reports[n] for n in names], trains, built, indexes,
                        time.monotonic() - start)


def _safe_version(v: str):
    try:
        return Version(v)
    except Exception:  # noqa: BLE001 - sorting only
        return Version("0")


# --------------------------------------------------------------------------------------------------
# Bump


@dataclass
class Move:
    package: str
    before: str
    after: str
    reason: str


@dataclass
class BumpPlan:
    old: str
    new: str
    moves: list[Move]
    problems: list[str]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _agrees(candidate: Version, leader: Version, agree: list[str]) -> int:
    """2: agrees fully; 1: agrees with no post-release of its own (allowed by the train rule); 0: no."""
    if "local" in agree and candidate.local != leader.local:
        return 0
    if "release" in agree and candidate.release != leader.release:
        return 0
    if "post" in agree:
        if candidate.post == leader.post:
            return 2
        return 1 if candidate.post is None else 0
    return 2


def plan_bump(stack: Stack, catalog: Catalog, *, new_name: str, trains: list[str] | None = None) -> BumpPlan:
    """Move each selected train to its newest coherent release, then what the rules move with it.

    A coherent release: the leader (first member) at version V and every other member at its newest
    version in its own line, not older than its pin, whose post number and local label agree with V
    (``rules.trains[].agree``; a member with no post-release of its own is accepted, as the train rule
    does). The newest V for which every member has such a version wins. Then each built-for package
    moves to its newest build for the new version of what it is built for, and declared minimums that
    now apply move their package to its newest version in line.
    """
    selected = [t for t in stack.rules.trains if not trains or t.name in trains]
    if trains:
        unknown = set(trains) - {t.name for t in stack.rules.trains}
        if unknown:
            raise UserError(f"no train named {', '.join(sorted(unknown))} in stack {stack.name}",
                            fix=f"trains: {', '.join(t.name for t in stack.rules.trains) or 'none declared'}")
    if not selected:
        raise UserError(f"stack {stack.name} declares no train to move", fix="declare rules.trains in the stack")
    new_versions: dict[str, str] = {}
    moves: list[Move] = []
    problems: list[str] = []
    notes: list[str] = []

    for train in selected:
        leader = train.members[0]
        missing_pages = [m for m in train.members if catalog.page(m) is None]
        if missing_pages:
            problems.append(f"train {train.name}: cannot query {', '.join(missing_pages)}: "
                            + "; ".join(getattr(catalog.pages.get(m), "message", "no answer") for m in missing_pages))
            continue
        lines = {m: catalog.line(m) for m in train.members}
        cands = {m: catalog.candidates(m, lines[m]) for m in train.members}
        pins = {m: Version(stack.packages[m].version) for m in train.members}
        chosen: dict[str, Version] | None = None
        for v in cands[leader]:
            if v < pins[leader]:
                break
            pick = {leader: v}
            for m in train.members[1:]:
                best = None
                for c in cands[m]:
                    if c < pins[m]:
                        break
                    score = _agrees(c, v, train.agree)
                    if score and (best is None or score > best[0]):
                        best = (score, c)
                        if score == 2:
                            break
                if best is None:
                    notes.append(f"train {train.name}: {leader} {v} is not coherent: {m} has no matching build")
                    pick = None
                    break
                pick[m] = best[1]
            if pick:
                chosen = pick
                break
        if chosen is None:
            problems.append(f"train {train.name}: no coherent release at or above the pins on the index")
            continue
        for m in train.members:
            if chosen[m] != pins[m]:
                new_versions[m] = str(chosen[m])
                moves.append(Move(m, stack.packages[m].version, str(chosen[m]), f"train {train.name}"))
        if all(chosen[m] == pins[m] for m in train.members):
            notes.append(f"train {train.name} is already at its newest coherent release ({leader} {pins[leader]})")

    # Built-for packages follow what they are built for.
    for bf in stack.rules.built_for:
        if bf.for_ not in new_versions:
            continue
        page = catalog.page(bf.package)
        if page is None:
            problems.append(f"{bf.package}: cannot query its index, so no build for {bf.for_} "
                            f"{new_versions[bf.for_]} can be chosen")
            continue
        line = catalog.line(bf.package, versions=new_versions)
        cands = versions_in_line(page, line, allow_pre=False)
        if not cands:
            idx = stack.packages[bf.package].index
            pattern = built_for_pattern(bf.local, Pin(stack.packages[bf.for_].version).local or "")
            have = sorted({m.group("public") for f in page.files if f.version and f.version.local
                           for m in [pattern.match(f.version.local)] if m and m.groupdict().get("public")},
                          key=_safe_version)
            problems.append(
                f"{bf.package}: no build for {bf.for_} {new_versions[bf.for_]} on index '{idx}' "
                f"(wanted local label +{line.local}, {line.describe().split(' ')[0]}); "
                f"builds exist for {bf.for_} {', '.join(have) or 'nothing'}")
            continue
        top = next(iter(cands))
        if str(top) != stack.packages[bf.package].version:
            new_versions[bf.package] = str(top)
            moves.append(Move(bf.package, stack.packages[bf.package].version, str(top),
                              f"built for {bf.for_} {new_versions[bf.for_]}"))

    # Declared minimums that the move makes apply.
    def current(name: str) -> str:
        return new_versions.get(name, stack.packages[name].version)

    for mn in stack.rules.minimums:
        if mn.when is not None and Version(current(mn.when.package)) < Version(mn.when.min):
            continue
        if Version(current(mn.package)) >= Version(mn.min):
            continue
        page = catalog.page(mn.package)
        if page is None:
            problems.append(f"{mn.package}: below its minimum {mn.min} and its index cannot be queried")
            continue
        cands = catalog.candidates(mn.package, catalog.line(mn.package))
        ok = [v for v in cands if v >= Version(mn.min)]
        if not ok:
            problems.append(f"{mn.package}: must be >= {mn.min} once {mn.when.package if mn.when else 'the train'} "
                            f"moves, but its index has no such version in line")
            continue
        new_versions[mn.package] = str(ok[0])
        cond = f" with {mn.when.package} >= {mn.when.min}" if mn.when else ""
        moves.append(Move(mn.package, stack.packages[mn.package].version, str(ok[0]), f"minimum {mn.min}{cond}"))

    # Order: train members first, then everything else in stack order.
    order = [m for t in selected for m in t.members] + list(stack.packages)
    rank = {n: i for i, n in reversed(list(enumerate(order)))}
    moves.sort(key=lambda mv: rank.get(mv.package, 10**6))
    return BumpPlan(stack.name, new_name, moves, problems, notes)


def _yaml_scalar(text: str) -> str:
    loaded = yaml.safe_load(text)
    if isinstance(loaded, str) and loaded == text and not text.startswith(("{", "[", "&", "*", "!", "|", ">", "'", '"', "%", "@", "`")):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bump_description(stack: Stack, moves: list[Move]) -> str:
    """The old description with every moved version replaced (full version first, then its public part)."""
    desc = stack.description
    for mv in moves:
        if mv.before in desc:
            desc = desc.replace(mv.before, mv.after)
        else:
            old_pub, new_pub = Pin(mv.before).public, Pin(mv.after).public
            desc = re.sub(rf"(?<![0-9.]){re.escape(old_pub)}(?![0-9A-Za-z]|\.[0-9A-Za-z])", new_pub, desc)
    return desc


def render_bump(stack: Stack, plan: BumpPlan, description: str | None = None) -> str:
    """The new stack file: ``inherits`` the old one and pins only what moved."""
    desc = description if description is not None else bump_description(stack, plan.moves)
    width = max((len(mv.package) for mv in plan.moves), default=0) + 1
    lines = [f"# {desc}: the {stack.name} declaration with the train moved." if desc else
             f"# The {stack.name} declaration with the train moved.",
             f"name: {plan.new}",
             f"inherits: {stack.name}",
             f"description: {_yaml_scalar(desc)}" if desc else None,
             "packages:"]
    lines = [ln for ln in lines if ln is not None]
    for mv in plan.moves:
        key = mv.package if _yaml_scalar(mv.package) == mv.package else _yaml_scalar(mv.package)
        lines.append(f"  {(key + ':').ljust(width)} {{version: {_yaml_scalar(mv.after)}}}")
    return "\n".join(lines) + "\n"


def write_bump(stack: Stack, plan: BumpPlan, *, force: bool = False, description: str | None = None) -> Path:
    """Write ``stacks/<new>.yaml``, then load and lint it; a file that fails either is removed again."""
    from stackforge.build.run import (
        lint_or_fail,  # imported here to keep this module importable on its own
    )

    root = stack_root(stack)
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", plan.new):
        raise UserError(f"'{plan.new}' is not a usable stack name", fix="use letters, digits, '.', '_' and '-'")
    path = stack_path(root, plan.new)
    if path.exists() and not force:
        raise UserError(f"{path.relative_to(root)} already exists", fix="choose another --name, or pass --force")
    text = render_bump(stack, plan, description)
    previous = path.read_text() if path.exists() else None
    path.write_text(text)
    try:
        new = load_stack(plan.new, root=root, overrides=list(getattr(stack, "_overrides", [])))
        lint_or_fail(new)
    except BuildFailed as err:  # lint findings, every one rendered
        _restore(path, previous)
        raise UserError(f"the bumped stack would not pass lint, so it was not written: {err.message}",
                        fix="check the index for the builds named above", exit_code=1) from None
    except UserError:
        _restore(path, previous)
        raise
    return path


def _restore(path: Path, previous: str | None) -> None:
    if previous is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(previous)


# --------------------------------------------------------------------------------------------------
# Audit


ALLOW_FILE = "stacks/audit-allow.txt"
MAX_AUDIT_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class StaleToken:
    text: str
    package: str
    before: str
    after: str

    def pattern(self) -> str:
        return rf"(?<![0-9.]){re.escape(self.text)}(?![0-9A-Za-z]|\.[0-9A-Za-z])"


@dataclass
class AuditHit:
    path: str
    line: int
    col: int
    token: StaleToken
    text: str
    allowed_by: str | None = None

    def render(self) -> str:
        t = self.token
        return (f"{self.path}:{self.line}:{self.col}: {t.text} ({t.package} was {t.before}, now {t.after})"
                f"{' [allowed: ' + self.allowed_by + ']' if self.allowed_by else ''}\n    {self.text.strip()[:160]}")

    def to_json(self) -> dict:
        return {"path": self.path, "line": self.line, "col": self.col, "stale": self.token.text,
                "package": self.token.package, "before": self.token.before, "after": self.token.after,
                "text": self.text.rstrip("\n"), "allowed_by": self.allowed_by}


@dataclass
class AuditReport:
    stack: str
    against: str
    tokens: list[StaleToken]
    hits: list[AuditHit]
    files_scanned: int

    @property
    def findings(self) -> list[AuditHit]:
        return [h for h in self.hits if h.allowed_by is None]

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def to_json(self) -> dict:
        return {"stack": self.stack, "against": self.against, "files_scanned": self.files_scanned,
                "stale": [t.text for t in self.tokens],
                "findings": [h.to_json() for h in self.findings],
                "allowed": [h.to_json() for h in self.hits if h.allowed_by],
                "exit_code": self.exit_code}

    def render(self, show_allowed: bool = False) -> str:
        out = [f"audit {self.stack} against {self.against}: looking for "
               + (", ".join(t.text for t in self.tokens) or "nothing (no version moved)")]
        for h in self.hits:
            if h.allowed_by is None or show_allowed:
                out.append(h.render())
        allowed = len(self.hits) - len(self.findings)
        out.append(f"{len(self.findings)} stale reference(s) in {self.files_scanned} tracked text files"
                   + (f"; {allowed} allowed by {ALLOW_FILE} or the stack chain" if allowed else ""))
        return "\n".join(out)


def stale_tokens(old: Stack, new: Stack) -> list[StaleToken]:
    """The strings a tree should no longer contain once ``new`` replaces ``old``.

    Per package whose pin moved: the old version, its tag-safe form (``+`` → ``_``, as image tags write
    it), and its public part when that is not simply a prefix of the new public version (``2.11.0.post1``
    for torch, ``0.1.83`` for torchada; but not ``2.11.0`` for torchaudio ``2.11.0`` → ``2.11.0.post2``).
    Per upstream whose pin moved: the old tag and the old commit (also abbreviated, 7+ hex digits).
    Matches must stand alone: ``2.11.0.post1`` does not match inside ``2.11.0.post10`` or ``12.11.0.post1``.
    """
    tokens: dict[str, StaleToken] = {}
    new_versions = {p.version for p in new.packages.values()}
    for name, pkg in old.packages.items():
        after = new.packages[name].version if name in new.packages else "(removed)"
        if after == pkg.version:
            continue
        before = pkg.version
        cands = [before]
        if "+" in before:
            cands.append(before.replace("+", "_"))
            old_pub = Pin(before).public
            new_pub = Pin(after).public if after != "(removed)" else ""
            if old_pub != new_pub and not new_pub.startswith(old_pub + ".") and old_pub not in new_versions:
                cands.append(old_pub)
        for c in cands:
            if c not in new_versions:
                tokens.setdefault(c, StaleToken(c, name, before, after))
    for name, up in old.upstreams.items():
        nu = new.upstreams.get(name)
        if nu is None:
            continue
        if up.tag and up.tag != nu.tag:
            tokens.setdefault(up.tag, StaleToken(up.tag, f"upstream {name}", up.tag, nu.tag or "-"))
        if up.commit and up.commit != nu.commit:
            tokens.setdefault(up.commit, StaleToken(up.commit, f"upstream {name}", up.commit, nu.commit or "-"))
    return list(tokens.values())


def _commit_regex(commit: str) -> str:
    return rf"(?<![0-9a-fA-F]){re.escape(commit[:7])}[0-9a-f]{{0,{len(commit) - 7}}}(?![0-9a-fA-F])"


@dataclass
class AllowRule:
    glob: str
    token: str | None
    where: str

    def matches(self, path: str, token: str) -> bool:
        return _glob_match(path, self.glob) and (self.token is None or self.token == token)


def _glob_match(path: str, pattern: str) -> bool:
    if pattern.endswith("/"):
        pattern += "**"
    rx = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            rx += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            rx += ".*"
            i += 2
        else:
            ch = pattern[i]
            rx += "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch)
            i += 1
    return re.fullmatch(rx, path) is not None


def load_allow_list(path: Path, display: str = ALLOW_FILE) -> list[AllowRule]:
    """``stacks/audit-allow.txt``: one rule per line, ``GLOB [STALE-STRING]``, ``#`` starts a comment.

    ``GLOB`` matches repository paths (``*`` within a directory, ``**`` across directories, a trailing
    ``/`` means everything below). Without ``STALE-STRING`` every stale string is allowed in matching
    files; with it, only that one.
    """
    if not path.exists():
        return []
    rules_: list[AllowRule] = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) > 2:
            raise UserError(f"expected 'GLOB [STALE-STRING]', got {len(parts)} words", file=display, line=n, col=1,
                            fix="one glob and at most one version string per line; comments start with #")
        rules_.append(AllowRule(parts[0], parts[1] if len(parts) > 1 else None, f"{display}:{n}"))
    return rules_


def tracked_files(root: Path) -> list[str]:
    try:
        proc = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise UserError(f"{root}: cannot list tracked files with git ({exc})",
                        fix="run the audit inside a git checkout") from None
    return [p for p in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def audit(stack: Stack, against: Stack | None = None, *, allow_file: Path | None = None) -> AuditReport:
    """Scan the repository's tracked text files for versions ``stack`` moved away from."""
    root = stack_root(stack)
    if against is None:
        if not stack.inherits:
            raise UserError(f"stack {stack.name} has no parent to compare with", fix="pass --against OLD")
        against = load_stack(stack.inherits, root=root)
    tokens = stale_tokens(against, stack)
    allow_path = allow_file or (root / ALLOW_FILE)
    try:
        display = str(allow_path.resolve().relative_to(root.resolve()))
    except ValueError:
        display = str(allow_path)
    allow = load_allow_list(allow_path, display)
    # The old stack's own files declare the old pins by design.
    chain = set(stack_files(against))
    regexes = []
    for t in tokens:
        rx = _commit_regex(t.text) if re.fullmatch(r"[0-9a-f]{40}", t.text) else t.pattern()
        regexes.append((t, re.compile(rx)))
    hits: list[AuditHit] = []
    scanned = 0
    for rel in tracked_files(root):
        path = root / rel
        try:
            if not path.is_file() or path.stat().st_size > MAX_AUDIT_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        scanned += 1
        if not regexes:
            continue
        text = data.decode("utf-8", "replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for t, rx in regexes:
                for m in rx.finditer(line):
                    if len(t.text) == 40 and not t.text.startswith(m.group(0)):
                        continue
                    allowed = None
                    if rel in chain:
                        allowed = f"{rel} is part of stack {against.name}"
                    elif rel == display:
                        allowed = "the allow-list itself"
                    else:
                        for rule in allow:
                            if rule.matches(rel, t.text):
                                allowed = rule.where
                                break
                    hits.append(AuditHit(rel, lineno, m.start() + 1, t, line, allowed))
    # One line may hold both a full version and its public part: keep the longest match per position.
    hits = _dedupe(hits)
    return AuditReport(stack.name, against.name, tokens, hits, scanned)


def _dedupe(hits: list[AuditHit]) -> list[AuditHit]:
    out: list[AuditHit] = []
    for h in sorted(hits, key=lambda h: (h.path, h.line, h.col, -len(h.token.text))):
        if out and out[-1].path == h.path and out[-1].line == h.line:
            prev = out[-1]
            if prev.col <= h.col < prev.col + len(prev.token.text):
                continue
        out.append(h)
    return out
