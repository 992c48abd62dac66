"""Target stages: the images a stack publishes, each built on the gate or on another target.

A target may add its own layers in its stage (written by ``images/target.j2``): apt layers (as ``system:``,
one transaction each), upstreams placed at a path in the image, wheels built offline from an upstream's
tree in their own stage (``kernel-<target>.<name>``, so the toolchain stays out of the image), pip phases,
steps, checks, env, workdir and labels. Every pip phase of a target runs with a constraints file generated
in the image from every installed vendor dist (``images/targets/constraints.py``) and through
``images/gate/preserve.py``; a phase declared ``repin: true`` installs another version of a vendor package,
which the preserve check then expects. The plan side is pure; ``write_context`` reads the upstream trees.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from stackforge import progress
from stackforge.builder.plan import installed
from stackforge.builder.plan import requirements as reqs
from stackforge.builder.plan.system import SystemStage, system_stages
from stackforge.builder.plan.system import write_context as write_system_context
from stackforge.fslock import atomic_write
from stackforge.stack import targets as rules
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack
from stackforge.stack.resolved import Resolved, selected
from stackforge.urls import redact

CONTEXT = "targets"  # context dir: targets/_bin (the scripts), targets/<target>/ (its files)
IMAGE = "/stackforge/targets"
LABEL_REPIN = "org.stackforge.repin"


@dataclass
class TargetPhase:
    name: str
    key: str  # targets.<t>.pip.<phase>
    index: str
    index_url: str  # credential-free
    requirements: str  # context path, also its image path below /stackforge/
    no_deps: bool
    only_binary: bool
    repin: list[str]  # name==version re-pins of this phase
    credentials: bool
    report: str
    lines: list[str] = field(default_factory=list)  # its own requirements (before the files)
    files: list[dict] = field(default_factory=list)
    mirror: str | None = None  # context path of its index's tree in an offline build (builder/mirror/offline.py)


@dataclass
class TargetKernel:
    stage: str  # kernel-<target>.<name>
    upstream: str
    env: dict[str, str]
    run: str
    trees: dict[str, str]


@dataclass
class TargetStage:
    name: str
    parent: str  # "gate" or the parent target
    root: bool  # builds on the gate: carries the stack's labels
    alias: bool  # only from: the parent's image under another name
    publish: bool
    labels: dict[str, str]
    env: dict[str, str]
    workdir: str | None
    entrypoint: list[str] | None
    cmd: list[str] | None
    system: list[SystemStage] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # upstream -> path in the image
    upstream_pins: dict[str, str] = field(default_factory=dict)  # upstream -> tag@commit
    kernels: list[TargetKernel] = field(default_factory=list)
    pip: list[TargetPhase] = field(default_factory=list)
    steps: list[installed.Step] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    healthcheck: dict | None = None  # HEALTHCHECK: {cmd, interval_s, timeout_s, retries, start_period_s}

    @property
    def scripts(self) -> bool:
        return bool(self.pip or self.checks)


def _pin(stack: Stack, name: str) -> str:
    up = stack.upstreams[name]
    if up.sdist is not None:
        return f"{up.sdist.name}=={up.sdist.version}@sha256:{up.sdist.sha256}"
    return up.pin


def target_stages(loaded: LoadedStack, resolved: Resolved) -> list[TargetStage]:
    """Every target, a parent before its children, with the values ``resolved`` rendered."""
    stack, credentials = loaded.model, loaded.credentials
    out: list[TargetStage] = []
    for tname in rules.order(stack):
        t = stack.targets[tname]
        base: tuple = ("targets", tname)
        values = resolved.targets[tname]
        labels = dict(values.labels)
        phases = []
        for n, (pname, ph) in enumerate(t.pip.items(), 1):
            repin = [str(Requirement(r)).replace(" ", "") for r in ph.requirements] if ph.repin else []
            for pin in repin:
                name, version = pin.split("==", 1)
                labels[f"{LABEL_REPIN}.{name}"] = version
            idx = stack.indexes[ph.index]
            phases.append(
                TargetPhase(
                    pname,
                    f"targets.{tname}.pip.{pname}",
                    ph.index,
                    redact(idx.url),
                    f"{CONTEXT}/{tname}/{pname}.txt",
                    ph.no_deps,
                    ph.only_binary,
                    repin,
                    idx.private or ph.index in credentials,
                    f"/stackforge/reports/target-{tname}-{n:02d}-{pname}.json",
                    list(ph.requirements),
                    [f.model_dump(exclude_defaults=True) for f in ph.files],
                )
            )
        kernels = [
            TargetKernel(
                f"kernel-{tname}.{kname}",
                k.upstream,
                dict(values.kernels[kname]),
                k.run,
                dict(k.trees),
            )
            for kname, k in t.kernels.items()
            if selected(stack, k.when)
        ]
        steps = [installed.Step(sname, dict(values.steps[sname]), step.run) for sname, step in t.steps.items()]
        out.append(
            TargetStage(
                name=tname,
                parent=t.from_ or "gate",
                root=t.from_ is None,
                alias=t.alias,
                publish=t.published,
                labels=labels,
                env=dict(values.env),
                workdir=t.workdir,
                entrypoint=t.entrypoint,
                cmd=t.cmd,
                system=system_stages(
                    loaded, resolved, t.system or {}, (*base, "system"), t.from_ or "gate", f"{tname}."
                ),
                sources=dict(t.sources),
                upstream_pins={u: _pin(stack, u) for u in t.sources},
                kernels=kernels,
                pip=phases,
                steps=steps,
                checks=[c.model_dump() for c in t.checks],
                healthcheck=t.healthcheck.model_dump() if t.healthcheck else None,
            )
        )
    return out


def write_context(
    loaded: LoadedStack,
    stages: list[TargetStage],
    images: Path,
    staging: Path,
    trees: dict[str, Path] | None,
    pins: dict[str, str],
) -> None:
    """The scripts, each target's requirement files (its own lines, then its upstream files read at the
    pinned commit like ``requirements:``), its checks and the record of its upstreams, into the context."""
    stack = loaded.model
    if any(st.scripts for st in stages):
        shutil.copytree(
            images / "targets", staging / CONTEXT / "_bin", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    write_system_context([s for st in stages for s in st.system], images, staging)
    for st in stages:
        tdir = staging / CONTEXT / st.name
        if st.sources:
            tdir.mkdir(parents=True, exist_ok=True)
            atomic_write(
                tdir / "upstreams.txt", "".join(f"{u} {st.upstream_pins[u]} {p}\n" for u, p in st.sources.items())
            )
        if st.checks:
            tdir.mkdir(parents=True, exist_ok=True)
            atomic_write(tdir / "checks.json", json.dumps(st.checks, indent=2) + "\n")
        for ph in st.pip:
            tdir.mkdir(parents=True, exist_ok=True)
            out = reqs.PhaseFiles(ph.key)
            if trees is None:
                out.requirements = ["# not read: no sources were fetched"] if ph.files else []
            elif ph.files:
                where = ("targets", st.name, "pip", ph.name)
                for i, item in enumerate(stack.targets[st.name].pip[ph.name].files):
                    reqs._Reader(
                        loaded,
                        ph.name,
                        i,
                        item.upstream,
                        trees[item.upstream],
                        pins.get(item.upstream, "?"),
                        out,
                        where,
                    ).read(item.path, item.constraint)
                if out.dropped:
                    progress.note(
                        f"{ph.key}: dropped {len(out.dropped)} requirement(s) a vendor index provides "
                        f"(the installed vendor dists win): {', '.join(d.package for d in out.dropped)}"
                    )
            head = [
                f"# {ph.key}"
                + (": " + ", ".join(f"{f['upstream']}:{f['path']}" for f in out.files) if out.files else "")
            ]
            dropped = [f"# dropped, a vendor index provides it: {d.requirement} ({d.where})" for d in out.dropped]
            extra = []
            if out.constraints:  # the upstream's own -c files, beside the generated vendor constraints
                own = f"{ph.requirements[:-4]}.upstream-constraints.txt"
                atomic_write(staging / own, "\n".join(out.constraints) + "\n")
                extra = [f"-c /stackforge/{own}"]
            atomic_write(
                staging / ph.requirements, "\n".join(head + dropped + ph.lines + out.requirements + extra) + "\n"
            )
