"""The pin table of a train move: package | before | after | note."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from stackforge import localver
from stackforge.stack.model import Stack


@dataclass
class Row:
    package: str
    before: str
    after: str
    note: str = ""


@dataclass
class StackDiff:
    old: str
    new: str
    changed: list[Row]
    added: list[Row]
    removed: list[Row]
    unchanged: list[Row]
    other: list[Row]  # upstreams, platform, base, indexes
    #: the platform lines other than the stacks' own, a row per pin that differs on a line (its OCI platform first)
    platforms: list[Row] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        if not self.platforms:
            data.pop("platforms")  # a stack of one platform: the table as it always was
        return json.dumps(data, indent=2)


def _notes(stack: Stack, name: str) -> list[str]:
    notes = []
    for train in stack.rules.trains:
        if name in train.members and name != train.members[0]:
            notes.append(f"moves with the {train.name} train")
    for bf in stack.rules.built_for:
        if bf.package == name:
            notes.append(f"built for {bf.for_} {stack.packages[bf.for_].version}")
    return notes


def _flatten(prefix: str, value, out: dict):
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = value if not isinstance(value, list) else ", ".join(map(str, value))


def _dump(value):
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


def diff_stacks(old: Stack, new: Stack) -> StackDiff:
    changed, added, removed, unchanged = [], [], [], []
    for name, pkg in new.packages.items():
        if name not in old.packages:
            added.append(Row(name, "—", pkg.version, "; ".join(["added", *_notes(new, name)])))
        elif not localver.same_build(old.packages[name].version, pkg.version):
            was = old.packages[name].version
            build = ["another build of the same version"] if localver.same_public(was, pkg.version) else []
            changed.append(Row(name, was, pkg.version, "; ".join([*build, *_notes(new, name)])))
        else:
            unchanged.append(Row(name, pkg.version, "unchanged"))
    for name, pkg in old.packages.items():
        if name not in new.packages:
            removed.append(Row(name, pkg.version, "—", "removed"))
    # Unchanged members of an aligned family are one row, as a person writes it: the family's public version,
    # and which members are which build of it.
    grouped: list[Row] = []
    taken: set[str] = set()
    by_name = {r.package: r for r in unchanged}
    for fam in new.rules.aligned:
        members = [m for m in fam.members if m in by_name]
        versions = [by_name[m].before for m in members]
        if len(members) > 1 and len({localver.public_key(v) for v in versions}) == 1:
            builds: dict[str, list[str]] = {}
            for m, v in zip(members, versions):
                if localver.local(v):
                    builds.setdefault(f"+{localver.local(v)}", []).append(m)
            note = "; ".join([f"{fam.name} family", *(f"{b} builds: {', '.join(ms)}" for b, ms in builds.items())])
            grouped.append(Row(", ".join(members), localver.public(versions[0]), "unchanged", note))
            taken.update(members)
    grouped.extend(r for r in unchanged if r.package not in taken)
    other = []
    for section in ("platform", "base", "indexes", "upstreams", "kernels"):
        a: dict[str, object] = {}
        b: dict[str, object] = {}
        _flatten(section, _dump(getattr(old, section)), a)
        _flatten(section, _dump(getattr(new, section)), b)
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                other.append(Row(key, str(a.get(key, "—")), str(b.get(key, "—"))))
    return StackDiff(old.name, new.name, changed, added, removed, grouped, other)


def platform_rows(old_lines: dict[str, Any], new_lines: dict[str, Any]) -> list[Row]:
    """The rows of the platform lines that are not a stack's own: ``{OCI platform: (Stack, Line)}`` of each side.
    A line on one side only is one row (its label, and what no record states); a line on both, a row per pin that
    moved on it."""
    rows = []
    for platform in [*old_lines, *(p for p in new_lines if p not in old_lines)]:
        before, after = old_lines.get(platform), new_lines.get(platform)
        if before is None or after is None:
            one = after if after is not None else before
            assert one is not None
            _, line = one
            label = f"+{line.local} line" if line.local else "line"
            unknown = f"; declared, not buildable: {len(line.unknown)} values unknown" if line.unknown else ""
            rows.append(Row(platform, "—" if before is None else label, label if before is None else "—",
                            ("added" if before is None else "removed") + unknown))  # fmt: skip
            continue
        for name, pkg in after[0].packages.items():
            was = before[0].packages.get(name)
            if was is None or not localver.same_build(was.version, pkg.version):
                rows.append(Row(f"{platform} {name}", was.version if was else "—", pkg.version))
    return rows


def to_markdown(d: StackDiff) -> str:
    lines = ["| package | before | after | note |", "| --- | --- | --- | --- |"]
    for row in [*d.changed, *d.added, *d.removed, *d.unchanged]:
        lines.append(f"| {row.package} | {row.before} | {row.after} | {row.note} |")
    if d.other:
        lines += ["", "| setting | before | after |", "| --- | --- | --- |"]
        lines += [f"| {r.package} | {r.before} | {r.after} |" for r in d.other]
    if d.platforms:
        lines += ["", "| platform | before | after | note |", "| --- | --- | --- | --- |"]
        lines += [f"| {r.package} | {r.before} | {r.after} | {r.note} |" for r in d.platforms]
    return "\n".join(lines) + "\n"
