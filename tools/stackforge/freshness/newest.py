"""Is each pin the newest of its line? Per package: pinned, newest in line (see ``freshness.lines``), its
publish time, size and sha256; per release train: how far apart its members were published; per
built-for package: whether a build exists for the pinned (and the newest) version it is built for.

Publish times are the index's PEP 700 ``upload-time``; where the index gives none the report says
``unknown`` and no train-spread verdict is made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from stackforge.clients.index import (
    IndexClient,
    IndexFile,
    IndexUnreachable,
    ProjectNotFound,
    ProjectPage,
    format_time,
)
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.freshness import lines
from stackforge.freshness.lines import (
    built_for_pattern,
    load_catalog,
    sortable_version,
    versions_in_line,
)
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin
from stackforge.urls import redact

DEFAULT_TRAIN_WINDOW = 3600.0  # seconds: train members published further apart than this are flagged

STATUS_NEWEST = "newest"
STATUS_NEWER = "newer exists"
STATUS_MISSING = "pin missing from index"
STATUS_UNKNOWN = "unknown"


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
        ts = [t.timestamp() for t in self.times.values() if t is not None]
        if not self.times or len(ts) != len(self.times):
            return None
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
        first = min(t for t in self.times.values() if t is not None)
        verdict = "FAR APART" if self.far_apart else "together"
        return (
            f"train {self.name} ({self.which}: {vers}): published {verdict}, within "
            f"{_duration(self.spread)} from {format_time(first)}"
        )

    def to_json(self) -> dict:
        return {
            "train": self.name,
            "which": self.which,
            "members": self.members,
            "upload_times": {m: format_time(t, iso=True) for m, t in self.times.items()},
            "spread_seconds": self.spread,
            "far_apart": self.far_apart,
        }


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
            head += f"; for the newest {self.for_} {self.newest_for}: " + (
                "build present" if self.has_build_for_newest else "NO BUILD yet"
            )
        others = ", ".join(self.builds_for)
        return head + (f" (builds exist for {self.for_} {others})" if others else "")

    def to_json(self) -> dict:
        return {
            "package": self.package,
            "for": self.for_,
            "for_version": self.for_version,
            "expected_local": self.expected_local,
            "has_build": self.has_build,
            "builds_for": self.builds_for,
            "newest_for": self.newest_for,
            "has_build_for_newest": self.has_build_for_newest,
        }


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
        return {
            "stack": self.stack,
            "target": self.target,
            "indexes": self.indexes,
            "packages": [p.to_json() for p in self.packages],
            "trains": [t.to_json() for t in self.trains],
            "built_for": [b.to_json() for b in self.built_for],
            "seconds": round(self.seconds, 3),
            "exit_code": self.exit_code,
        }

    def render(self) -> str:
        head = ["package", "pinned", "newest in line", "published", "size", "sha256", "status"]
        rows: list[list[str]] = []
        for p in self.packages:
            f = p.file
            rows.append(
                [
                    p.name,
                    p.pinned,
                    p.newest or "-",
                    format_time(f.upload_time) if f else "-",
                    (str(f.size) if f.size is not None else "unknown") if f else "-",
                    (f.sha256[:16] + "…" if f.sha256 else "unknown") if f else "-",
                    p.status,
                ]
            )
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        out = [f"stack {self.stack} — target {self.target}"]
        out += [f"index {n}: {d}" for n, d in self.indexes.items()]
        out.append("")
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        for r in rows:
            out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        out.append("")
        out.append("lines:")
        silent: dict[str, list[str]] = {}  # an unreachable index: its packages named once, its cause above
        for p in self.packages:
            if p.note.startswith(UNREACHABLE_NOTE) and not p.line:
                silent.setdefault(p.note, []).append(p.name)
                continue
            pinned = (
                f"; pinned {p.pinned} published {format_time(p.pinned_file.upload_time)}"
                if p.pinned_file and p.status != STATUS_NEWEST
                else ""
            )
            out.append(f"  {p.name}: {p.line or '-'}{pinned}" + (f" — {p.note}" if p.note else ""))
        out.extend(f"  {', '.join(names)}: {note}" for note, names in silent.items())
        if self.trains:
            out.append("")
            out.extend(t.describe() for t in self.trains)
        if self.built_for:
            out.append("")
            out.extend(b.describe() for b in self.built_for)
        counts: dict[str, int] = {}
        for p in self.packages:
            counts[p.status] = counts.get(p.status, 0) + 1
        out.append("")
        out.append(
            f"{len(self.packages)} packages: "
            + ", ".join(f"{n} {s}" for s, n in counts.items())
            + f" ({self.seconds:.2f} s)"
        )
        return "\n".join(out)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _target_text(stack: Stack) -> str:
    p = stack.platform
    return f"python {p.python}, {p.arch}, {p.os}"


UNREACHABLE_NOTE = "cannot reach index"


def newest(
    loaded: LoadedStack | ResolvedStack,
    *,
    packages: list[str] | None = None,
    cache_dir: Path | None = None,
    clients: dict[str, IndexClient] | None = None,
    workspace: Workspace | None = None,
    train_window: float = DEFAULT_TRAIN_WINDOW,
) -> NewestReport:
    """Per package: pinned, newest in line, its upload time / size / sha256, status; trains; built-for.
    The indexes are asked with the workspace's credentials (default: the workspace at the stack's root)."""
    stack = loaded.model
    start = time.monotonic()
    names = packages or list(stack.packages)
    for n in names:
        if n not in stack.packages:
            raise UserError(f"package '{n}' is not in stack {stack.name}", fix=f"packages: {', '.join(stack.packages)}")
    # Built-for checks need the for-package's page too.
    needed = list(dict.fromkeys(names + [bf.for_ for bf in stack.rules.built_for if bf.package in names]))
    catalog, clients = load_catalog(loaded, needed, cache_dir=cache_dir, clients=clients, workspace=workspace)
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
            rep.note = "; ".join(
                filter(
                    None, [rep.note, "the pinned version is available only yanked" + (f" ({reason})" if reason else "")]
                )
            )
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
        others: set[str] = set()
        for f in page.files:
            if f.version is None or f.version.local is None:
                continue
            match = pattern.match(f.version.local)
            if match and match.groupdict().get("public") and (line.kind != "wheel" or line.tags & f.tags):
                others.add(match.group("public"))
        bf_rep = BuiltForReport(
            bf.package,
            bf.for_,
            for_pin,
            expected or "",
            has,
            sorted(others - {Pin(for_pin).public}, key=sortable_version),
        )
        fr = reports.get(bf.for_)
        if fr and fr.newest and Version(fr.newest) > Version(for_pin):
            bf_rep.newest_for = fr.newest
            nl = catalog.line(bf.package, versions={bf.for_: fr.newest})
            bf_rep.has_build_for_newest = bool(versions_in_line(page, nl, allow_pre=False))
        built.append(bf_rep)

    indexes: dict[str, str] = {}
    for iname in dict.fromkeys(stack.packages[n].index for n in needed):
        on_index = [catalog.page(n) for n in needed if stack.packages[n].index == iname]
        fmts = {p.format for p in on_index if p is not None}
        indexes[iname] = f"{clients[iname].display_url} ({'/'.join(sorted(fmts)) or 'no answer'})"
        cause = lines.unreachable(catalog, [n for n in needed if stack.packages[n].index == iname])
        if cause is not None:
            indexes[iname] += f": unreachable ({cause}); redirect: {lines.redirect(iname)}"
            for n in names:
                if stack.packages[n].index == iname and isinstance(catalog.pages.get(n), IndexUnreachable):
                    reports[n].note = f"{UNREACHABLE_NOTE} '{iname}' (its line above)"
    return NewestReport(
        stack.name, _target_text(stack), [reports[n] for n in names], trains, built, indexes, time.monotonic() - start
    )
