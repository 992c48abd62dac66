"""Move a stack's release trains to their newest coherent release and write the child stack.

``plan_bump`` chooses the moves from a ``Catalog`` (``load_catalog``), ``render_bump`` gives the new
stack file (it ``inherits`` the old one and pins only what moved), ``write_bump`` writes, loads and
lints it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.version import Version

from stackforge.builder.context.prepare import lint_or_fail
from stackforge.errors import BuildFailed, UserError
from stackforge.freshness import lines as pin_lines
from stackforge.freshness.lines import (
    Catalog,
    built_for_pattern,
    sortable_version,
    standalone,
    versions_in_line,
)
from stackforge.stack.document import stack_path
from stackforge.stack.load import LoadedStack, load
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin


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


def _agrees(candidate: Version, leader: Version, agree: Collection[str]) -> int:
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
            raise UserError(
                f"no train named {', '.join(sorted(unknown))} in stack {stack.name}",
                fix=f"trains: {', '.join(t.name for t in stack.rules.trains) or 'none declared'}",
            )
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
            problems.append(
                f"train {train.name}: cannot query {', '.join(missing_pages)}: {_why(stack, catalog, missing_pages)}"
            )
            continue
        lines = {m: catalog.line(m) for m in train.members}
        member_cands = {m: catalog.candidates(m, lines[m]) for m in train.members}
        pins = {m: Version(stack.packages[m].version) for m in train.members}
        chosen: dict[str, Version] | None = None
        for v in member_cands[leader]:
            if v < pins[leader]:
                break
            pick = {leader: v}
            coherent = True
            for m in train.members[1:]:
                best: tuple[int, Version] | None = None
                for c in member_cands[m]:
                    if c < pins[m]:
                        break
                    score = _agrees(c, v, train.agree)
                    if score and (best is None or score > best[0]):
                        best = (score, c)
                        if score == 2:
                            break
                if best is None:
                    notes.append(f"train {train.name}: {leader} {v} is not coherent: {m} has no matching build")
                    coherent = False
                    break
                pick[m] = best[1]
            if coherent:
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
            problems.append(
                f"{bf.package}: cannot query its index, so no build for {bf.for_} {new_versions[bf.for_]} can be chosen"
            )
            continue
        line = catalog.line(bf.package, versions=new_versions)
        cands = versions_in_line(page, line, allow_pre=False)
        if not cands:
            idx = stack.packages[bf.package].index
            pattern = built_for_pattern(bf.local, Pin(stack.packages[bf.for_].version).local or "")
            have = sorted(
                {
                    m.group("public")
                    for f in page.files
                    if f.version and f.version.local
                    for m in [pattern.match(f.version.local)]
                    if m and m.groupdict().get("public")
                },
                key=sortable_version,
            )
            problems.append(
                f"{bf.package}: no build for {bf.for_} {new_versions[bf.for_]} on index '{idx}' "
                f"(wanted local label +{line.local}, {line.describe().split(' ')[0]}); "
                f"builds exist for {bf.for_} {', '.join(have) or 'nothing'}"
            )
            continue
        top = next(iter(cands))
        if str(top) != stack.packages[bf.package].version:
            new_versions[bf.package] = str(top)
            moves.append(
                Move(
                    bf.package,
                    stack.packages[bf.package].version,
                    str(top),
                    f"built for {bf.for_} {new_versions[bf.for_]}",
                )
            )

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
            problems.append(
                f"{mn.package}: must be >= {mn.min} once {mn.when.package if mn.when else 'the train'} "
                f"moves, but its index has no such version in line"
            )
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
    if (
        isinstance(loaded, str)
        and loaded == text
        and not text.startswith(("{", "[", "&", "*", "!", "|", ">", "'", '"', "%", "@", "`"))
    ):
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
            desc = re.sub(standalone(old_pub), new_pub, desc)
    return desc


def _why(stack: Stack, catalog: Catalog, names: list[str]) -> str:
    """Why pages could not be read: an index that gave no answer once (its cause and the redirect), every other
    failure with its own message."""
    out: list[str] = []
    for index in dict.fromkeys(stack.packages[n].index for n in names):
        on_index = [n for n in names if stack.packages[n].index == index]
        cause = pin_lines.unreachable(catalog, on_index)
        if cause is not None:
            out.append(f"index '{index}' is unreachable ({cause}); redirect: {pin_lines.redirect(index)}")
        else:
            out += [getattr(catalog.pages.get(n), "message", "no answer") for n in on_index]
    return "; ".join(dict.fromkeys(out))


def render_bump(stack: Stack, plan: BumpPlan, description: str | None = None) -> str:
    """The new stack file: ``inherits`` the old one and pins only what moved."""
    desc = description if description is not None else bump_description(stack, plan.moves)
    width = max((len(mv.package) for mv in plan.moves), default=0) + 1
    lines = [
        f"# {desc}: the {stack.name} declaration with the train moved."
        if desc
        else f"# The {stack.name} declaration with the train moved.",
        f"name: {plan.new}",
        f"inherits: {stack.name}",
    ]
    if desc:
        lines.append(f"description: {_yaml_scalar(desc)}")
    lines.append("packages:")
    for mv in plan.moves:
        key = mv.package if _yaml_scalar(mv.package) == mv.package else _yaml_scalar(mv.package)
        lines.append(f"  {(key + ':').ljust(width)} {{version: {_yaml_scalar(mv.after)}}}")
    return "\n".join(lines) + "\n"


def write_bump(loaded: LoadedStack, plan: BumpPlan, *, force: bool = False, description: str | None = None) -> Path:
    """Write ``stacks/<new>.yaml``, then load (with the old stack's ``--set`` overrides) and lint it; a file
    that fails either is removed again."""

    stack, root = loaded.model, loaded.root
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", plan.new):
        raise UserError(f"'{plan.new}' is not a usable stack name", fix="use letters, digits, '.', '_' and '-'")
    path = stack_path(root, plan.new)
    if path.exists() and not force:
        raise UserError(f"{path.relative_to(root)} already exists", fix="choose another --name, or pass --force")
    text = render_bump(stack, plan, description)
    previous = path.read_text() if path.exists() else None
    path.write_text(text)
    try:
        new = load(plan.new, root=root, overrides=loaded.overrides)
        lint_or_fail(new)
    except BuildFailed as err:  # lint findings, every one rendered
        _restore(path, previous)
        raise UserError(
            f"the bumped stack would not pass lint, so it was not written: {err.message}",
            fix="check the index for the builds named above",
            exit_code=1,
        ) from None
    except UserError:
        _restore(path, previous)
        raise
    return path


def _restore(path: Path, previous: str | None) -> None:
    if previous is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(previous)
