"""An upstream's image contract (``upstreams.<name>.contract``): its contract test, line by line, held to the
Dockerfile the stack renders (lint and render) and to the image it builds (``verify``).

The fork's own contract test greps its Dockerfile: ``ARG MOONCAKE_VERSION=0.3.13`` in the mooncake stage, the
label ``com.mthreads.vllm-musa.mooncake-version``, ``WORKDIR /vllm-workspace``, no
``org.opencontainers.image.created``, ``MTHREADS_VISIBLE_DEVICES=all`` and never a baked ``MUSA_VISIBLE_DEVICES``,
the gate's exact-version set and order, and so on. A stack records each assertion it is held to as a
:class:`~stackforge.stack.model.ContractLine` (the assertion's line, what it says, and one check in the stack's
terms: a target of the same name as the fork's stage, a label, an env value, a pip phase, a gate setting). This
module evaluates each line on what the stack renders — the target's labels, ENV, WORKDIR, CMD and ENTRYPOINT as
its stage and the stages it builds on set them, the image labels of the plan, every stage's ENV, the pip phases,
the gate spec — and each failing line is a finding at the contract's file and line (``vllm_musa:tests/
test_inplace_porting_contract.py:272: contract: …``), with the stack key of the line in its message.
:func:`image_lines` checks the lines about the image's configuration against an image's own config.
Pure: no I/O but the stack.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from stackforge.builder.plan.plan import image_labels
from stackforge.stack import tags
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import ContractLine, Stack
from stackforge.stack.rules import Finding

CREATED = "org.opencontainers.image.created"


def lines(loaded: LoadedStack) -> Iterator[tuple[str, str, int, ContractLine]]:
    """(upstream, contract file, index, line) of every contract line of the stack."""
    for name, up in loaded.model.upstreams.items():
        if up.contract is not None:
            for i, line in enumerate(up.contract.lines):
                yield name, up.contract.file, i, line


def chain(stack: Stack, target: str) -> list[str]:
    """``target`` and the targets it builds on, nearest first."""
    out = [target]
    while (parent := stack.targets[out[-1]].from_) is not None and parent not in out:
        out.append(parent)
    return out


def target_env(loaded: LoadedStack, target: str) -> dict[str, str]:
    """The ENV a target's image has as the stack declares it: the system layers', then each target's of its chain."""
    stack, out = loaded.model, {}
    for layer in (stack.system or {}).values():
        out.update(layer.env)
    for name in reversed(chain(stack, target)):
        out.update(loaded.resolved.targets[name].env)
    return out


def target_labels(loaded: LoadedStack, target: str) -> dict[str, str]:
    """The labels a target's image carries: the image's (with ``created`` when the stack sets it), then each
    target's of its chain."""
    out = dict(image_labels(loaded, created="<the sources' time>" if loaded.model.labels_created else None))
    for name in reversed(chain(loaded.model, target)):
        out.update(loaded.resolved.targets[name].labels)
    return out


def _nearest(stack: Stack, target: str, field: str) -> Any:
    for name in chain(stack, target):
        value = getattr(stack.targets[name], field)
        if value is not None:
            return value
    return None


def every_env(loaded: LoadedStack) -> dict[str, set[str]]:
    """NAME -> where the rendered Dockerfile sets it (ENV or a build step's environment)."""
    stack, resolved = loaded.model, loaded.resolved
    out: dict[str, set[str]] = {}

    def add(where: str, env: dict[str, str]) -> None:
        for name in env:
            out.setdefault(name, set()).add(where)

    for lname, layer in (stack.system or {}).items():
        add(f"system.{lname}.env", layer.env)
    for tname, t in stack.targets.items():
        add(f"targets.{tname}.env", resolved.targets[tname].env)
        for lname, layer in (t.system or {}).items():
            add(f"targets.{tname}.system.{lname}.env", layer.env)
        for kname, env in resolved.targets[tname].kernels.items():
            add(f"targets.{tname}.kernels.{kname}.env", env)
    for kname, env in resolved.kernels.items():
        add(f"kernels.{kname}.env", env)
    for kname, env in resolved.toolchains.items():
        add(f"kernels.{kname}.toolchain.env", env)
    add("tuning", stack.tuning)
    return out


def _files(stack: Stack) -> Iterator[tuple[str, Any]]:
    for pname, phase in stack.requirements.items():
        for i, item in enumerate(phase.files):
            yield f"requirements.{pname}.files[{i}]", item
    for tname, t in stack.targets.items():
        for pname, tphase in t.pip.items():
            for i, item in enumerate(tphase.files):
                yield f"targets.{tname}.pip.{pname}.files[{i}]", item


def _render(loaded: LoadedStack, value: str, path: tuple) -> str:
    return tags.render_template(loaded, value, path) if "{{" in value or "{%" in value else value


def _check(loaded: LoadedStack, path: tuple, cl: ContractLine) -> str | None:
    """What the stack has where the line wants something else (None: the line holds)."""
    stack = loaded.model
    if cl.target is not None and cl.target not in stack.targets:
        return f"the stack declares no target {cl.target!r} (the fork's stage of that name)"
    target = cl.target
    if cl.labels is not None:
        have = target_labels(loaded, target) if target else image_labels(loaded)
        if not target and stack.labels_created:
            have[CREATED] = "<the sources' time>"
        for key, want in cl.labels.items():
            want = _render(loaded, want, (*path, "labels", key))
            if have.get(key) != want:
                where = f"target {target}" if target else "the image"
                return f"{where} labels {key}={have[key]!r}" if key in have else f"{where} carries no label {key}"
        return None
    if cl.no_labels is not None:
        for key in cl.no_labels:
            if key == CREATED and stack.labels_created:
                return f"the image is labelled {CREATED} (created_label is true)"
            for tname in stack.targets:
                if key in target_labels(loaded, tname):
                    return f"target {tname} carries the label {key}"
        return None
    if cl.env is not None:
        if cl.kernel is not None:
            if cl.kernel not in loaded.resolved.kernels:
                return f"the stack declares no kernel {cl.kernel!r}"
            have, where = dict(loaded.resolved.kernels[cl.kernel]), f"kernel {cl.kernel}"
        elif target is not None:
            have, where = target_env(loaded, target), f"target {target}"
        else:
            return "env: names no target or kernel"
        for key, value in cl.env.items():
            if value is None and key in have:
                return f"{where} sets {key}={have[key]}"
            if value is not None and have.get(key) != value:
                return f"{where} sets {key}={have[key]}" if key in have else f"{where} does not set {key}"
        return None
    if cl.no_env is not None:
        found = every_env(loaded)
        for key in cl.no_env:
            if key in found:
                return f"{key} is set in {', '.join(sorted(found[key]))}"
        return None
    if "workdir" in cl.model_fields_set or "cmd" in cl.model_fields_set or "entrypoint" in cl.model_fields_set:
        field = next(f for f in ("workdir", "cmd", "entrypoint") if f in cl.model_fields_set)
        if target is None:
            return f"{field}: names no target"
        have = _nearest(stack, target, field)
        want = getattr(cl, field)
        if have != want:
            return f"target {target}'s {field} is {have!r}" if have is not None else f"target {target} sets no {field}"
        return None
    if cl.installs is not None or cl.only_binary is not None or cl.checks_version is not None:
        return _target_phase_check(stack, target, cl)
    if cl.installs_file is not None or cl.constrained is not None:
        return _file_check(stack, cl)
    return _gate_check(loaded, cl)


def _target_phase_check(stack: Stack, target: str | None, cl: ContractLine) -> str | None:
    if target is None:
        return "names no target"
    phases = stack.targets[target].pip
    if cl.checks_version is not None:
        call = re.compile(r"version\(\s*[\"']" + re.escape(cl.checks_version) + r"[\"']\s*\)")
        if not any(call.search(c.code) for c in stack.targets[target].checks):
            return f"no check of target {target} reads version({cl.checks_version!r})"
        return None
    name = canonicalize_name(Requirement(cl.installs).name if cl.installs else str(cl.only_binary))
    want = str(Requirement(cl.installs).specifier) if cl.installs else None
    for pname, ph in phases.items():
        for text in ph.requirements:
            req = Requirement(text)
            if canonicalize_name(req.name) != name:
                continue
            key = f"targets.{target}.pip.{pname}"
            if want is not None and str(req.specifier) != want:
                return f"{key} installs {text}"
            if cl.index is not None and stack.indexes[ph.index].role != cl.index:
                return f"{key} installs it from {ph.index}, a {stack.indexes[ph.index].role} index"
            if cl.only_binary is not None and not ph.only_binary:
                return f"{key} is not only_binary"
            return None
    return f"no pip phase of target {target} installs {name}"


def _file_check(stack: Stack, cl: ContractLine) -> str | None:
    if cl.installs_file is not None:
        want = (cl.installs_file.upstream, cl.installs_file.path)
        if not any((f.upstream, f.path) == want and not f.constraint for _, f in _files(stack)):
            return f"no requirement phase installs {want[0]}:{want[1]}"
        return None
    assert cl.constrained is not None
    file, by = cl.constrained.file, cl.constrained.by
    for pname, phase in stack.requirements.items():
        items = [(f.upstream, f.path, f.constraint) for f in phase.files]
        if (file.upstream, file.path, False) in items:
            if (by.upstream, by.path, True) not in items:
                return f"requirements.{pname} installs {file.upstream}:{file.path} without {by.upstream}:{by.path} as a constraint"
            return None
    return f"no requirement phase installs {file.upstream}:{file.path}"


def _gate_check(loaded: LoadedStack, cl: ContractLine) -> str | None:
    stack = loaded.model
    packages = [canonicalize_name(n) for n in stack.packages]
    if cl.gate_pins is not None:
        missing = [n for n in cl.gate_pins if canonicalize_name(n) not in packages]
        return f"the gate checks no pin of {', '.join(missing)}" if missing else None
    if cl.gate_exact is not None:
        exact = {canonicalize_name(n) for n in stack.gate.exact}
        missing = [n for n in cl.gate_exact if canonicalize_name(n) not in exact]
        return f"gate.exact does not name {', '.join(missing)}" if missing else None
    if cl.gate_order is not None:
        missing = [n for n in cl.gate_order if canonicalize_name(n) not in packages]
        if missing:
            return f"the gate checks no pin of {', '.join(missing)}"
        at = [packages.index(canonicalize_name(n)) for n in cl.gate_order]
        return None if at == sorted(at) else f"the gate checks them in the order {', '.join(stack.packages)}"
    if cl.gate_imports is not None:
        imported = {i.module for i in stack.gate.imports} | {p.import_name for p in stack.packages.values()}
        missing = [m for m in cl.gate_imports if m not in imported]
        return f"the gate imports no {', '.join(missing)}" if missing else None
    if cl.options is not None:
        for key, want in cl.options.items():
            if key not in stack.options:
                return f"the stack declares no option {key}"
            option = stack.options[key]
            chosen = loaded.position(("options", key, "value")).file.startswith("--set ")
            if chosen and want in option.choices:
                continue  # the build's choice, as the fork's BUILD_ARG=… build_image.sh; the default is the file's
            if option.value != want:
                return f"options.{key} is {option.value!r}"
        return None
    assert cl.stages is not None
    for before, after in zip(cl.stages, cl.stages[1:]):
        if after not in stack.targets or before not in stack.targets:
            return f"the stack declares no target {after if after not in stack.targets else before!r}"
        if stack.targets[after].from_ != before:
            return f"target {after} builds on {stack.targets[after].from_ or 'the gate'}, not on {before}"
    if cl.stages and cl.stages[0] not in stack.targets:
        return f"the stack declares no target {cl.stages[0]!r}"
    return None


def check(loaded: LoadedStack) -> list[Finding]:
    """Every contract line the stack does not hold, as a finding at the contract's file and line (a lint rule:
    ``stackforge lint``, and render and build before anything is written)."""
    out = []
    for upstream, file, i, cl in lines(loaded):
        path = ("upstreams", upstream, "contract", "lines", i)
        have = _check(loaded, path, cl)
        if have is None:
            continue
        key = f"upstreams.{upstream}.contract.lines[{i}]"
        out.append(
            Finding(
                "contract",
                f"the image contract says {cl.says}; but {have} ({key})",
                path,
                f"make the stack hold it (the fork's image does), or correct {key} if it does not say what line "
                f"{cl.line} asserts",
                file=f"{upstream}:{file}",
                line=cl.line,
            )
        )
    return out


#: the lines :func:`image_lines` can check on an image's config, and how to read the config for each
IMAGE_CHECKS: dict[str, Callable[[dict], Any]] = {
    "labels": lambda c: c.get("Labels") or {},
    "no_labels": lambda c: c.get("Labels") or {},
    "env": lambda c: dict(e.split("=", 1) for e in (c.get("Env") or []) if "=" in e),
    "no_env": lambda c: dict(e.split("=", 1) for e in (c.get("Env") or []) if "=" in e),
    "workdir": lambda c: c.get("WorkingDir") or None,
    "cmd": lambda c: c.get("Cmd") or None,
    "entrypoint": lambda c: c.get("Entrypoint") or None,
}


def _rendered(loaded: LoadedStack, target: str, kind: str, keys: list[str]) -> Any:
    """What the stack renders for ``kind`` (of ``keys``) at ``target``: the value its image's config has."""
    if kind in ("labels", "no_labels"):
        labels = target_labels(loaded, target)
        return {k: labels.get(k) for k in keys}
    if kind in ("env", "no_env"):
        env = target_env(loaded, target)
        return {k: env.get(k) for k in keys}
    return _nearest(loaded.model, target, kind)


def image_lines(loaded: LoadedStack, config: dict) -> list[tuple[bool, str]]:
    """The contract lines about an image's configuration (labels, ENV, WORKDIR, CMD, ENTRYPOINT), checked on
    ``config`` (the image's ``Config``): ``(ok, text)`` per line. The image may be of any published target: a
    line about a target is checked when every published target renders the same value as that target (a line
    about what a later stage changes, such as the final stage's lack of an ENTRYPOINT, is not the image's)."""
    stack = loaded.model
    published = [n for n, t in stack.targets.items() if t.published]
    out = []
    for upstream, file, i, cl in lines(loaded):
        kind = next((k for k in IMAGE_CHECKS if k in cl.model_fields_set), None)
        if kind is None or cl.kernel is not None:
            continue
        if cl.target is not None:
            if cl.target not in stack.targets:
                continue
            keys = list(getattr(cl, kind) or []) if kind in ("labels", "no_labels", "env", "no_env") else []
            at = _rendered(loaded, cl.target, kind, keys)
            if any(_rendered(loaded, p, kind, keys) != at for p in published):
                continue
        have = IMAGE_CHECKS[kind](config)
        where = f"{upstream}:{file}:{cl.line}"
        path = ("upstreams", upstream, "contract", "lines", i)
        if kind == "labels":
            wanted = {k: _render(loaded, v, (*path, "labels", k)) for k, v in (cl.labels or {}).items()}
            bad = {k: have.get(k) for k, v in wanted.items() if have.get(k) != v}
            text = ", ".join(f"{k}={v}" for k, v in wanted.items())
        elif kind == "no_labels":
            bad = {k: have[k] for k in cl.no_labels or [] if k in have}
            text = "no label " + ", ".join(cl.no_labels or [])
        elif kind == "env":
            bad = {k: have.get(k) for k, v in (cl.env or {}).items() if have.get(k) != v}
            text = ", ".join(f"{k}={v}" if v is not None else f"no {k}" for k, v in (cl.env or {}).items())
        elif kind == "no_env":
            bad = {k: have[k] for k in cl.no_env or [] if k in have}
            text = "no ENV " + ", ".join(cl.no_env or [])
        else:
            want = getattr(cl, kind)
            bad = {kind: have} if have != want else {}
            text = f"{kind} {want}"
        seen = ", ".join(f"{k}={v}" for k, v in bad.items())
        out.append((not bad, f"contract {where} {text}" + (f" (the image: {seen})" if bad else "")))
    return out
