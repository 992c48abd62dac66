"""The build plan: everything the Dockerfile and the build need, derived from the stack.

Pure: no I/O. ``show``, ``render --dry-run`` and tests read it directly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from packaging.utils import canonicalize_name

from stackforge.builder.plan import artifacts, edits, installed
from stackforge.builder.plan.phases import INSTALLER as INSTALLER
from stackforge.builder.plan.phases import PipPhase as PipPhase
from stackforge.builder.plan.requirements import guarded, requirement_phases
from stackforge.builder.plan.system import SystemStage, system_stages
from stackforge.builder.plan.targets import TargetStage, target_stages
from stackforge.stack.load import LoadedStack, fingerprint
from stackforge.stack.model import Stack
from stackforge.stack.resolved import Resolved, selected
from stackforge.urls import redact

LABEL_NS = "org.stackforge"


@dataclass
class KernelStep:
    name: str
    upstream: str
    env: dict[str, str]
    run: str
    trees: dict[str, str] = field(default_factory=dict)  # other upstream -> path inside this tree
    toolchain: artifacts.ToolchainStep | None = None  # installed with network before the offline build
    files: list[artifacts.KernelFile] = field(default_factory=list)  # installed in the gate after the wheels
    wheels: bool = True  # its /out/wheels are installed
    # kernels.<k>.build_requires as pip phases of a buildenv-<k> stage (None: it builds after every phase, in deps)
    build_env: list[PipPhase] | None = None


@dataclass
class Plan:
    stack: str
    fingerprint: str
    base_image: str
    python: str
    local_ref: str
    phases: list[PipPhase]
    upstreams: list[str]
    kernels: list[KernelStep]
    gate: dict
    gate_prepare: list[str]
    targets: dict[str, dict]
    post_install: list[installed.PostInstallPatch] = field(default_factory=list)
    steps: list[installed.Step] = field(default_factory=list)
    system: list[SystemStage] = field(default_factory=list)  # apt layers, each a stage after base
    target_stages: list[TargetStage] = field(default_factory=list)  # targets, a parent before its children

    @property
    def wheel_kernels(self) -> list[KernelStep]:
        return [k for k in self.kernels if k.wheels]

    @property
    def own_env_kernels(self) -> list[KernelStep]:
        """The kernels that build in an environment of their own (``build_requires``), not in deps."""
        return [k for k in self.kernels if k.build_env is not None]

    @property
    def files(self) -> list[artifacts.KernelFile]:
        return [f for k in self.kernels for f in k.files]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def pip_phases(stack: Stack, locked: frozenset[str] = frozenset()) -> list[PipPhase]:
    """Vendor wheels first (--no-deps), then public pins, then the vendor wheels' own dependencies.

    ``locked`` names the locks that exist (builder/locks/locks.py keys: an index, or ``<vendor>-deps``): their
    phases require hashes."""
    by_index: dict[str, list[str]] = {name: [] for name in stack.indexes}
    hashes: dict[str, bool] = {name: True for name in stack.indexes}
    for pname, pkg in stack.packages.items():
        by_index[pkg.index].append(pname)
        hashes[pkg.index] &= bool(pkg.sha256)
    for name in locked:
        hashes[name] = True

    def pins(index: str) -> list[str]:
        return [f"{n}=={stack.packages[n].version}" for n in by_index[index]]

    phases: list[PipPhase] = installer_phase(stack)
    for name, idx in stack.indexes.items():
        if idx.role == "vendor" and by_index[name]:
            phases.append(
                PipPhase(f"{name}-nodeps", name, redact(idx.url), f"deps/{name}.txt", True, hashes[name], pins(name))
            )
    for name, idx in stack.indexes.items():
        if idx.role == "public" and by_index[name]:
            phases.append(PipPhase(name, name, redact(idx.url), f"deps/{name}.txt", False, hashes[name], pins(name)))
    phases += requirement_phases(stack)
    for name, idx in stack.indexes.items():
        if idx.role == "vendor" and idx.deps_from and by_index[name]:
            src = stack.indexes[idx.deps_from]
            # Already-installed exact pins; pip resolves only what they require, from the public index.
            phases.append(
                PipPhase(
                    f"{name}-deps",
                    idx.deps_from,
                    redact(src.url),
                    f"deps/{name}.deps.txt",
                    False,
                    f"{name}-deps" in locked,
                    pins(name),
                )
            )
    return guarded(stack, phases)


def build_env(stack: Stack, kernel: str, phases: list[PipPhase]) -> list[PipPhase] | None:
    """The pip phases of kernel ``kernel``'s own build environment (``build_requires``), or None when it builds
    in the whole installed one. Each is a pin phase of ``phases`` (the installer, a vendor ``--no-deps`` phase,
    a public phase) cut down to the pins the kernel names, in the same order, from the same index with the same
    hashes or lock, and ``--no-deps``: the environment holds exactly what the stack lists."""
    names = stack.kernels[kernel].build_requires
    if names is None:
        return None
    wanted = {canonicalize_name(n) for n in names}
    out = []
    for ph in phases:
        if ph.name == INSTALLER:
            out.append(replace(ph, key=f"kernels.{kernel}.build_requires"))
            continue
        if ph.files or ph.name not in (ph.index, f"{ph.index}-nodeps"):
            continue  # a requirement phase, or the vendor wheels' dependencies: never part of it
        pins = [p for p in ph.pins if canonicalize_name(p.split("==", 1)[0]) in wanted]
        if pins:
            out.append(
                replace(
                    ph,
                    requirements=f"deps/buildenv-{kernel}/{ph.name}.txt",
                    no_deps=True,
                    pins=pins,
                    key=f"kernels.{kernel}.build_requires",
                    checks_pins=False,
                    constraints=None,
                    report="",
                )
            )
    return out


def installer_phase(stack: Stack) -> list[PipPhase]:
    """The pip the other phases run with (``base.pip``), installed first from the first public index."""
    pip = stack.base.pip
    public = next((n for n, i in stack.indexes.items() if i.role == "public"), None)
    if pip is None or public is None:
        return []
    url = redact(stack.indexes[public].url)
    phase = PipPhase(INSTALLER, public, url, f"deps/{INSTALLER}.txt", True, bool(pip.sha256), [f"pip=={pip.version}"])
    phase.key, phase.checks_pins = "base.pip", False
    return [phase]


def pip_check_allow(stack: Stack) -> list[dict]:
    """Unmet requirements pip check may report: the stack's own (``gate.pip_check_allow``), and each package an
    upstream's ``agree.except`` excuses, as a requirement of that upstream's distribution (the plugin's wheel
    requires the train its revision pins; the stack says why it pins another)."""
    out = [a.model_dump() for a in stack.gate.pip_check_allow]
    for name, up in stack.upstreams.items():
        for package, reason in (up.agree.except_ if up.agree else {}).items():
            out.append({"dist": name, "requires": package, "reason": f"upstreams.{name}.agree.except: {reason}"})
    return out


def gate_spec(stack: Stack) -> dict:
    return {
        "stack": stack.name,
        "machine": stack.platform.arch,
        "python": stack.platform.python,
        "packages": [
            {"name": n, "dist": n, "import": p.import_name, "mode": p.gate, "version": p.version}
            | ({"exact": True} if canonicalize_name(n) in {canonicalize_name(e) for e in stack.gate.exact} else {})
            for n, p in stack.packages.items()
        ],
        "imports": [i.model_dump() for i in stack.gate.imports],
        "probes": [p.model_dump() for p in stack.gate.probes if selected(stack, p.when)],
        "read_only": stack.gate.read_only,
        "pip_check": True,
        "pip": stack.base.pip.version if stack.base.pip else None,
        "pip_check_allow": pip_check_allow(stack),
        "abi": {
            "packages": [n for n, p in stack.packages.items() if stack.indexes[p.index].role == "vendor"]
            if stack.gate.abi
            else [],
            "library_path": list(stack.gate.library_path),
        },
        **installed.gate_extras(stack),
    }


#: The stack's layer epoch (seconds): the base image's creation time, else the sources' SOURCE_DATE_EPOCH. Every
#: build stage declares it as SOURCE_DATE_EPOCH (hash-checked .pyc files), and the publisher clamps file times to
#: it (``publish/normalize.py``). An upstream bump does not move it, so layers under the upstream keep their bytes.
EPOCH_LABEL = "org.stackforge.epoch"
#: How many layers of the image are the base image's: the publisher leaves them as they are (they are the base's own
#: registry blobs), and normalizes the layers above.
BASE_LAYERS_LABEL = "org.stackforge.base.layers"


def image_labels(
    loaded: LoadedStack,
    *,
    base_digest: str | None = None,
    created: str | None = None,
    series: dict[str, str] | None = None,
    inputs: str | None = None,
    base_id: str | None = None,
    post_install: dict[str, str] | None = None,
    epoch: int | None = None,
    base_layers: int | None = None,
) -> dict[str, str]:
    """OCI labels + one label per pin + the input fingerprint. ``created`` only when reproducible; ``epoch``:
    the layer epoch (:data:`EPOCH_LABEL`)."""
    stack = loaded.model
    out: dict[str, str] = {
        "org.opencontainers.image.title": f"{stack.name}",
        "org.opencontainers.image.description": stack.description,
    }
    if stack.upstreams:
        name = stack.source or next(iter(stack.upstreams))
        up = stack.upstreams[name]
        if up.git:
            out["org.opencontainers.image.source"] = redact(up.git) if "://" in up.git else up.git
            out["org.opencontainers.image.revision"] = up.commit or ""
            out["org.opencontainers.image.version"] = up.tag or ""
        elif up.sdist:
            out["org.opencontainers.image.source"] = f"{redact(stack.indexes[up.sdist.index].url)}/{up.sdist.name}/"
            out["org.opencontainers.image.version"] = up.sdist.version
    if created:
        out["org.opencontainers.image.created"] = created
    if epoch is not None:
        out[EPOCH_LABEL] = str(epoch)
    if base_layers is not None:
        out[BASE_LAYERS_LABEL] = str(base_layers)
    out["org.opencontainers.image.base.name"] = stack.base.image
    if base_digest:  # a registry manifest digest; a local-only base has none
        out["org.opencontainers.image.base.digest"] = base_digest
    if base_id:
        out[f"{LABEL_NS}.base.id"] = base_id
    out[f"{LABEL_NS}.stack"] = stack.name
    out[f"{LABEL_NS}.fingerprint"] = fingerprint(stack)
    if inputs:
        out[f"{LABEL_NS}.inputs"] = inputs
    for uname, up in stack.upstreams.items():
        if up.git:
            out[f"{LABEL_NS}.upstream.{uname}"] = up.pin
        elif up.sdist:
            out[f"{LABEL_NS}.upstream.{uname}"] = f"{up.sdist.name}=={up.sdist.version}@sha256:{up.sdist.sha256}"
    for uname, digest in (series or {}).items():
        out[f"{LABEL_NS}.series.{uname}"] = digest
    for uname in stack.upstreams:
        declared = edits.digest(stack, uname)
        if declared:
            out[f"{edits.LABEL}.{uname}"] = declared
    out.update(installed.labels(post_install or {}))
    for pname, pkg in stack.packages.items():
        out[f"{LABEL_NS}.pin.{pname}"] = pkg.version
    for oname, option in stack.options.items():
        out[f"{LABEL_NS}.option.{oname}"] = option.value
    out.update(artifacts.labels([n for n, k in stack.kernels.items() if selected(stack, k.when)]))
    out.update(loaded.resolved.labels)
    return out


def kernel_steps(stack: Stack, resolved: Resolved) -> list[KernelStep]:
    """The kernel steps the build options select; each one's environment is the stack's tuning, then its own
    (rendered) env."""
    return [
        KernelStep(
            n,
            k.upstream,
            dict(resolved.kernels[n]),
            k.run,
            dict(k.trees),
            artifacts.toolchain(stack, n, resolved.toolchains.get(n, {})),
            artifacts.files(stack, n),
            artifacts.writes_wheels(stack, n),
        )
        for n, k in stack.kernels.items()
        if selected(stack, k.when)
    ]


def make_plan(loaded: LoadedStack, locks: dict[str, str] | None = None) -> Plan:
    """``locks``: {index: repository-relative lock file} for the indexes that have one."""
    stack, locks = loaded.model, locks or {}
    resolved = loaded.resolved  # every template renders (or refuses) before anything is written
    phases = pip_phases(stack, frozenset(locks))
    credentials = loaded.credentials
    for phase in phases:
        # Third-party build scripts of a public phase never see the vendor credentials.
        phase.credentials = stack.indexes[phase.index].private or phase.index in credentials
        if phase.require_hashes and phase.lock_key() in locks:
            phase.lock = locks[phase.lock_key()]
        elif phase.files and phase.index in locks:  # its index's lock holds its closure (builder/locks/reqlocks.py)
            phase.lock, phase.no_index, phase.credentials = locks[phase.index], True, False
    kernels = kernel_steps(stack, resolved)
    for k in kernels:
        k.build_env = build_env(stack, k.name, phases)
    return Plan(
        stack=stack.name,
        fingerprint=fingerprint(stack),
        base_image=stack.base.image,
        python=stack.base.python,
        local_ref=str(resolved.local),
        phases=phases,
        upstreams=list(stack.upstreams),
        kernels=kernels,
        gate=gate_spec(stack),
        gate_prepare=list(stack.gate.prepare),
        targets={
            n: {
                **t.model_dump(include={"entrypoint", "cmd", "env"}),
                **t.model_dump(by_alias=True, exclude_defaults=True, exclude={"entrypoint", "cmd", "env"}),
            }
            for n, t in stack.targets.items()
        },
        post_install=installed.post_install(stack),
        steps=installed.steps(stack, resolved.steps),
        system=system_stages(loaded, resolved),
        target_stages=target_stages(loaded, resolved),
    )
