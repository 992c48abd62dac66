"""The order of a rendered Dockerfile's stages keeps each built image's history its own.

Docker 26's Dockerfile frontend lets stages FROM one parent share the parent's history list: a stage the build
needs (by FROM, ``COPY --from`` or a ``--mount ... from=``) that descends from a stage of the target's own line
and is defined after that line's next stage writes its steps over the target's entries (measured: a sibling's
RUN lines named in place of the gate's). So every such side stage must come before the target's line moves on.
The rule is checked here on the golden Dockerfiles of the checked-in stacks, for each stage they can build
(test_trees_installed.py checks it on a stack with an ``installed`` stage).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
FROM = re.compile(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*$", re.I)
REF = re.compile(r"(?:--from=|[ ,]from=)([A-Za-z0-9_.-]+)")


@dataclass
class Stage:
    name: str
    parent: str
    index: int
    refs: set[str] = field(default_factory=set)


def stages(text: str) -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        m = FROM.match(line)
        if m:
            current = found[m.group(2)] = Stage(m.group(2), m.group(1), len(found))
        elif current is not None and not line.lstrip().startswith("#"):
            current.refs.update(REF.findall(line))
    return found


def violations(text: str, target: str, all_stages: dict[str, Stage] | None = None) -> list[str]:
    """Stages the build of ``target`` needs that share a parent's history with its line and come too late."""
    all_stages = stages(text) if all_stages is None else all_stages

    def line_of(name: str) -> list[str]:
        out = []
        while name in all_stages:
            out.append(name)
            name = all_stages[name].parent
        return out

    needed, todo = set(), [target]
    while todo:
        name = todo.pop()
        if name in all_stages and name not in needed:
            needed.add(name)
            todo += [all_stages[name].parent, *all_stages[name].refs]
    own = line_of(target)
    found = []
    for child, parent in itertools.pairwise(own):
        for side in sorted(needed - set(own)):
            branch = line_of(side)
            if parent in branch and child not in branch and all_stages[side].index > all_stages[child].index:
                found.append(f"{side} (from {parent}) is defined after {child}")
    return found


def every_violation(text: str) -> dict[str, list[str]]:
    """The violations of each stage a build can target, by stage (none: an empty dict)."""
    all_stages = stages(text)
    return {t: v for t in all_stages if (v := violations(text, t, all_stages))}


def test_the_rule_finds_a_side_stage_defined_after_the_line_moved_on():
    text = """FROM base:1 AS env
RUN echo env
FROM env AS gate
RUN echo gate
FROM env AS side
RUN echo side
FROM gate AS final
COPY --from=side /s /s
"""
    assert violations(text, "final") == ["side (from env) is defined after gate"]
    assert violations(text.replace("COPY --from=side /s /s", "RUN echo final"), "final") == []
    moved = "FROM base:1 AS env\nFROM env AS side\nFROM env AS gate\nFROM gate AS final\nCOPY --from=side /s /s\n"
    assert violations(moved, "final") == []


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("dockerfile_*.txt")))
def test_no_stage_a_build_needs_overwrites_its_line_s_history(name):
    text = (GOLDEN / name).read_text()
    assert {"gate", "gate-readonly"} <= set(stages(text)), "the golden Dockerfile has no read-only gate"
    bad = every_violation(text)
    assert not bad, bad
