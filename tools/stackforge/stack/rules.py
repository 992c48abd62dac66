"""Release-train rules. Each rule is a small function of the stack that returns findings.

What a rule checks is declared by data in the stack (``rules:``): which packages form a
train and which parts of their versions must agree, which package is built for which,
which packages share one version, which must be vendor builds, and declared minimums.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jinja2
from jinja2.sandbox import SecurityError
from packaging.version import Version

from stackforge import localver
from stackforge.errors import UserError
from stackforge.stack import platforms, tags
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin
from stackforge.stack.yamlsrc import Pos


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str
    path: tuple
    fix: str
    #: where the finding is when it is not in the stack (a lock file): the file (relative to the root) and line
    file: str | None = None
    line: int | None = None
    #: the platform lines the finding holds on, when the stack's own line (its platform.arch) is not one of them
    platforms: tuple[str, ...] = ()
    #: where the finding is, when it was placed on a platform line's positions (``on_lines``)
    at: Pos | None = None

    @classmethod
    def on_pin(cls, rule: str, message: str, package: str, fix: str) -> Finding:
        """A finding about the version the stack pins for ``package`` (located at that pin)."""
        return cls(rule, message, ("packages", package, "version"), fix)

    def located(self, loaded: LoadedStack | ResolvedStack) -> dict:
        pos = self.at or loaded.position(self.path)
        file, line, col = (self.file, self.line, None) if self.file else (pos.file, pos.line, pos.col)
        return {
            "rule": self.rule,
            "message": self.message,
            "fix": self.fix,
            "file": file,
            "line": line,
            "col": col,
            **({"platforms": list(self.platforms)} if self.platforms else {}),
        }

    def render(self, loaded: LoadedStack | ResolvedStack) -> str:
        d = self.located(loaded)
        loc = d["file"] + (f":{d['line']}" if d["line"] else "") + (f":{d['col']}" if d["line"] and d["col"] else "")
        on = f" (platform {', '.join(self.platforms)})" if self.platforms else ""
        return f"{loc}: {self.rule}{on}: {self.message}\n  fix: {self.fix}"


def _pin(stack: Stack, name: str) -> Pin:
    return Pin(stack.packages[name].version)


def check_trains(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """Train members move together: same postN (among members that carry one) and same local label."""
    stack = loaded.model
    out = []
    for train in stack.rules.trains:
        pins = {m: _pin(stack, m) for m in train.members}
        lead = train.members[0]
        if "post" in train.agree:
            posts = {m: p.post for m, p in pins.items() if p.post is not None}
            if len(set(posts.values())) > 1:
                want_post = posts.get(lead, max(posts.values()))
                for m, post in posts.items():
                    if post != want_post:
                        out.append(
                            Finding.on_pin(
                                "train",
                                f"{m} {pins[m].version} is at post{post} but train '{train.name}' is at "
                                f"post{want_post} ({lead} {pins[lead].version})",
                                m,
                                f"move {m} to its post{want_post} build with the rest of the train",
                            )
                        )
        if "local" in train.agree:
            want_local = pins[lead].local
            for m, p in pins.items():
                if localver.local(p.version) != localver.local(pins[lead].version):
                    label = f"local label '+{p.local}'" if p.local else "no local label"
                    out.append(
                        Finding.on_pin(
                            "train",
                            f"{m} {p.version} has {label} but train '{train.name}' uses "
                            + (f"'+{want_local}'" if want_local else "no local label")
                            + f" ({lead} {pins[lead].version})",
                            m,
                            f"pin the +{want_local} build of {m}"
                            if want_local
                            else f"pin the build of {m} without a local label",
                        )
                    )
        if "release" in train.agree:
            want_release = pins[lead].release
            for m, p in pins.items():
                if p.release != want_release:
                    out.append(
                        Finding.on_pin(
                            "train",
                            f"{m} release {p.release} differs from {lead} release {want_release}",
                            m,
                            f"pin {m} {want_release}",
                        )
                    )
    return out


def check_built_for(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """A package built against another names that package's exact version in its local label."""
    stack = loaded.model
    out = []
    for i, bf in enumerate(stack.rules.built_for):
        target = _pin(stack, bf.for_)
        try:
            want = tags.render_sandboxed(bf.local, {"for": target.as_context()})
        except (tags.TemplateRefused, SecurityError) as exc:
            raise UserError(
                f"rules.built_for.{i}.local: template refused: {exc}",
                **loaded.position(("rules", "built_for", i, "local")).as_error_kwargs(),
                fix=tags.TEMPLATE_FIX,
            ) from None
        except jinja2.TemplateError as exc:
            out.append(
                Finding(
                    "built-for",
                    f"template error in rules.built_for[{i}].local: {exc}",
                    ("rules", "built_for", i, "local"),
                    "use {{ for.local }}, {{ for.public }}, {{ for.release }} or {{ for.version }}",
                )
            )
            continue
        have = _pin(stack, bf.package)
        if localver.local(have.version) != (localver.local(f"0+{want}") if localver.valid(f"0+{want}") else want):
            built = f"is built for '+{have.local}'" if have.local else "names no build (no local label)"
            out.append(
                Finding.on_pin(
                    "built-for",
                    f"{bf.package} {have.version} {built}, but this stack's "
                    f"{bf.for_} is {target.version} (expected local label '+{want}')",
                    bf.package,
                    f"pin {bf.package}=={have.public}+{want}, or check the index for a build against {bf.for_} "
                    f"{target.version}",
                )
            )
    return out


def check_aligned(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """An aligned family (a library and its wrappers) shares one public version; each member may be its own
    build of it (``mate 0.2.7`` beside ``flash_attn_3 0.2.7+musa``: the local-label rule)."""
    stack = loaded.model
    out = []
    for fam in stack.rules.aligned:
        lead = fam.members[0]
        want = stack.packages[lead].version
        for m in fam.members[1:]:
            have = stack.packages[m].version
            if not localver.same_public(have, want):
                label = f"+{localver.local(have)}" if localver.local(have) else ""
                out.append(
                    Finding.on_pin(
                        "aligned",
                        f"{m} {have} differs from {lead} {want}; family '{fam.name}' moves as one public version "
                        f"(each member may carry its own local label)",
                        m,
                        f"pin {m} {localver.public(want)}{label}",
                    )
                )
    return out


def check_vendor_build(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """A package that must be the vendor's build carries the vendor's local label."""
    stack = loaded.model
    out = []
    for vb in stack.rules.vendor_build:
        pin = _pin(stack, vb.package)
        if not (localver.local(pin.version) or "").startswith(vb.local_prefix.lower()):
            out.append(
                Finding.on_pin(
                    "vendor-build",
                    f"{vb.package} {pin.version} is not a '+{vb.local_prefix}' build",
                    vb.package,
                    f"pin the vendor build, e.g. {pin.public}+{vb.local_prefix}.1",
                )
            )
    return out


def check_minimums(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """Declared minimum versions, optionally conditional on another pin."""
    stack = loaded.model
    out = []
    for mn in stack.rules.minimums:
        if mn.when is not None and Version(stack.packages[mn.when.package].version) < Version(mn.when.min):
            continue
        have = stack.packages[mn.package].version
        if Version(have) < Version(mn.min):
            cond = f" when {mn.when.package} >= {mn.when.min}" if mn.when else ""
            out.append(
                Finding.on_pin(
                    "minimum",
                    f"{mn.package} {have} is below the declared minimum {mn.min}{cond}",
                    mn.package,
                    f"pin {mn.package} {mn.min} or newer",
                )
            )
    return out


def check_indexes(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """Vendor wheels come from a vendor index whose dependencies come from a public one."""
    stack = loaded.model
    out = []
    for name, idx in stack.indexes.items():
        if idx.role == "vendor" and idx.deps_from and stack.indexes[idx.deps_from].role != "public":
            out.append(
                Finding(
                    "index",
                    f"index '{name}' takes its dependencies from '{idx.deps_from}', which is not a public index",
                    ("indexes", name, "deps_from"),
                    "name a public index",
                )
            )
        if idx.role == "public" and idx.deps_from:
            out.append(
                Finding(
                    "index",
                    f"public index '{name}' cannot have deps_from",
                    ("indexes", name, "deps_from"),
                    "remove deps_from",
                )
            )
    return out


_RUNTIME_LABEL = re.compile(r"^musa(\d+)\.(\d+)(?:\.\d+)*")
_DASHED_LINE = re.compile(r"-(\d+)-(\d+)(?=-|$)")


def _line(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_runtime(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """``platform.musa_runtime`` is the MUSA line the train was built for (its ``+musaX.Y.Z`` label), the line of
    ``platform.musa``, and the line every runtime-suffixed apt package and MUSA version line resolves to."""
    stack = loaded.model
    runtime = stack.platform.musa_runtime
    if not runtime:
        return []
    want, at = _line(runtime), ("platform", "musa_runtime")
    out = []
    if stack.platform.musa and _line(stack.platform.musa) != want:
        out.append(
            Finding(
                "runtime",
                f"platform.musa_runtime {runtime} is not the line of platform.musa {stack.platform.musa}",
                at,
                f'set platform.musa_runtime to "{_line(stack.platform.musa)}"',
            )
        )
    for train in stack.rules.trains:
        lead = train.members[0]
        m = _RUNTIME_LABEL.match(localver.local(stack.packages[lead].version) or "")
        if m and f"{m[1]}.{m[2]}" != want:
            out.append(
                Finding(
                    "runtime",
                    f"train '{train.name}' is built for MUSA {m[1]}.{m[2]} ({lead} "
                    f"{stack.packages[lead].version}), but platform.musa_runtime is {runtime}",
                    at,
                    f'set platform.musa_runtime to "{m[1]}.{m[2]}", or pin the train\'s build for {runtime}',
                )
            )
    out += _apt_lines(loaded, want, at)
    return out


def _apt_lines(loaded: LoadedStack | ResolvedStack, want: str, at: tuple) -> list[Finding]:
    """Apt names with a runtime suffix (``musa-toolkit-5-1``) and MUSA version lines (``5.1``) of another line,
    as the load resolved them (``stack/resolved.py``)."""
    stack = loaded.model
    try:
        resolved = loaded.resolved
    except UserError:
        return []  # a template that fails is reported where its value is used (lint, render, build)
    out = []
    for layer_name, layer in (stack.system or {}).items():
        for i, pkg in enumerate(layer.packages):
            where = ("system", layer_name, "packages", i)
            written = [
                ((*where, "name"), pkg.name),
                *(((*where, "candidates", j), c) for j, c in enumerate(pkg.candidates)),
            ]
            for path, text in written:
                name = resolved.value(path, text)
                m = _DASHED_LINE.search(name)
                if m and m[1] == want.split(".")[0] and f"{m[1]}.{m[2]}" != want:
                    out.append(
                        Finding(
                            "runtime",
                            f"apt package {name} is of the MUSA {m[1]}.{m[2]} line, but "
                            f"platform.musa_runtime is {want}",
                            where,
                            "derive the suffix: {{ platform.musa_runtime | dashed }}",
                        )
                    )
            line = resolved.value((*where, "line"), pkg.line) if pkg.line else ""
            parts = line.split(".")
            if len(parts) >= 2 and parts[0] == want.split(".")[0] and _line(line) != want:
                out.append(
                    Finding(
                        "runtime",
                        f"apt package {pkg.name} is pinned to the {line} line, but platform.musa_runtime is {want}",
                        (*where, "line"),
                        'use line: "{{ platform.musa_runtime }}"',
                    )
                )
    return out


def _where(loaded: LoadedStack | ResolvedStack, path: tuple) -> str:
    pos = loaded.position(path)
    return pos.file + (f":{pos.line}" if pos.line else "")


def check_line(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    """A platform line's pins are builds of one MUSA line: every pin whose local label names a MUSA build line
    (``+musa5.2.0``, ``+musa5.2.1mp22``, ``+musa5.2.0torch2.11.0.post2``) names the line's (``platforms.<line>
    .local``; undeclared, the first train's lead pin's). A pin of another line is a finding naming both."""
    stack, line = loaded.model, loaded.line
    labels = {n: platforms.musa_line(p.version) for n, p in stack.packages.items()}
    labelled = {n: lab for n, lab in labels.items() if lab}
    if not labelled:
        return []
    name = f"'{line.name}' ({line.oci})" if line else f"of {stack.platform.arch}"
    if line is not None and line.local:
        want, source = line.local, f"platforms.{line.name}.local, {_where(loaded, ('platforms', line.name, 'local'))}"
    else:
        leads = [t.members[0] for t in stack.rules.trains if t.members[0] in labelled]
        lead = leads[0] if leads else next(iter(labelled))
        want = labelled[lead]
        source = f"{lead} {stack.packages[lead].version}, {_where(loaded, ('packages', lead, 'version'))}"
    out = []
    for pkg, label in labelled.items():
        if label.lower() != want.lower():
            out.append(
                Finding.on_pin(
                    "platform-line",
                    f"{pkg} {stack.packages[pkg].version} is a +{label} build, but platform line {name} is the "
                    f"+{want} line ({source}): the line mixes +{want} and +{label}",
                    pkg,
                    f"pin the +{want} build of {pkg} (or, if the line moved to +{label}, move every pin of it)",
                )
            )
    return out


RULES = [
    check_trains,
    check_built_for,
    check_aligned,
    check_vendor_build,
    check_minimums,
    check_indexes,
    check_runtime,
    check_line,
]


def on_lines(loaded: LoadedStack | ResolvedStack, rules: list) -> list[Finding]:
    """``rules`` run on every platform line of the stack. A finding at a key a line declares unknown is left
    out; each finding is placed at its line's position, and one that does not hold on the stack's own line
    names the lines it holds on."""
    lines = loaded.platform_lines()
    found: dict[tuple, tuple[Finding, list[str]]] = {}
    for name, line in lines.items():
        unknown = line.line.unknown if line.line else {}
        for rule in rules:
            for f in rule(line):
                if unknown and platforms.covers(unknown, f.path):
                    continue
                at = f.at or line.position(f.path)
                key = (f.rule, f.message, f.file, f.line, at)
                found.setdefault(key, (dataclasses.replace(f, at=at), []))[1].append(name)
    own = loaded.line.name if loaded.line else None
    return [
        dataclasses.replace(f, platforms=tuple(names)) if loaded.model.platforms and own not in names else f
        for f, names in found.values()
    ]


def lint(loaded: LoadedStack | ResolvedStack) -> list[Finding]:
    return on_lines(loaded, RULES)
