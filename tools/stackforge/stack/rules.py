"""Release-train rules. Each rule is a small function of the stack that returns findings.

What a rule checks is declared by data in the stack (``rules:``): which packages form a
train and which parts of their versions must agree, which package is built for which,
which packages share one version, which must be vendor builds, and declared minimums.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
from jinja2.sandbox import SecurityError
from packaging.version import Version

from stackforge.errors import UserError
from stackforge.stack import tags
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack
from stackforge.stack.pins import Pin


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str
    path: tuple
    fix: str
    #: where the finding is when it is not in the stack (a lock file): the file (relative to the root) and line
    file: str | None = None
    line: int | None = None

    @classmethod
    def on_pin(cls, rule: str, message: str, package: str, fix: str) -> Finding:
        """A finding about the version the stack pins for ``package`` (located at that pin)."""
        return cls(rule, message, ("packages", package, "version"), fix)

    def located(self, loaded: LoadedStack) -> dict:
        pos = loaded.position(self.path)
        file, line, col = (self.file, self.line, None) if self.file else (pos.file, pos.line, pos.col)
        return {
            "rule": self.rule,
            "message": self.message,
            "fix": self.fix,
            "file": file,
            "line": line,
            "col": col,
        }

    def render(self, loaded: LoadedStack) -> str:
        d = self.located(loaded)
        loc = d["file"] + (f":{d['line']}" if d["line"] else "") + (f":{d['col']}" if d["line"] and d["col"] else "")
        return f"{loc}: {self.rule}: {self.message}\n  fix: {self.fix}"


def _pin(stack: Stack, name: str) -> Pin:
    return Pin(stack.packages[name].version)


def check_trains(loaded: LoadedStack) -> list[Finding]:
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
                if p.local != want_local:
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


def check_built_for(loaded: LoadedStack) -> list[Finding]:
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
        if have.local != want:
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


def check_aligned(loaded: LoadedStack) -> list[Finding]:
    """An aligned family (a library and its wrappers) shares one version."""
    stack = loaded.model
    out = []
    for fam in stack.rules.aligned:
        lead = fam.members[0]
        want = stack.packages[lead].version
        for m in fam.members[1:]:
            have = stack.packages[m].version
            if have != want:
                out.append(
                    Finding.on_pin(
                        "aligned",
                        f"{m} {have} differs from {lead} {want}; family '{fam.name}' moves as one version",
                        m,
                        f"pin {m} {want}",
                    )
                )
    return out


def check_vendor_build(loaded: LoadedStack) -> list[Finding]:
    """A package that must be the vendor's build carries the vendor's local label."""
    stack = loaded.model
    out = []
    for vb in stack.rules.vendor_build:
        pin = _pin(stack, vb.package)
        if not (pin.local or "").startswith(vb.local_prefix):
            out.append(
                Finding.on_pin(
                    "vendor-build",
                    f"{vb.package} {pin.version} is not a '+{vb.local_prefix}' build",
                    vb.package,
                    f"pin the vendor build, e.g. {pin.public}+{vb.local_prefix}.1",
                )
            )
    return out


def check_minimums(loaded: LoadedStack) -> list[Finding]:
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


def check_indexes(loaded: LoadedStack) -> list[Finding]:
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


def check_locks(loaded: LoadedStack) -> list[Finding]:
    """An index declared ``lock: true`` has its lock file: deleting it never drops ``--require-hashes``; and
    each lock file passes the check render and build make before they use it (``build/locks.read_lock``)."""
    stack = loaded.model
    from stackforge.build.locks import DEPS, expects_lock, lock_keys, lock_path, read_lock

    out = []
    for key in lock_keys(stack):
        name = key if key in stack.indexes else key[: -len(DEPS)]
        path = lock_path(loaded, key)
        try:
            read_lock(loaded, key)
        except UserError as err:
            out.append(
                Finding(
                    "lock",
                    err.message.removesuffix("; the lock was not used"),
                    ("indexes", name, "lock"),
                    err.fix or f"run: stackforge lock {stack.name}",
                    file=str(err.file or path.relative_to(loaded.root).as_posix()),
                    line=err.line,
                )
            )
            continue
        if expects_lock(stack, name) and not path.is_file():
            rel = path.relative_to(loaded.root).as_posix()
            out.append(
                Finding(
                    "lock",
                    f"index '{name}' is declared `lock: true` but {rel} is missing",
                    ("indexes", name, "lock"),
                    f"run: stackforge lock {stack.name} (or restore {rel} from version control)",
                )
            )
    return out


RULES = [check_trains, check_built_for, check_aligned, check_vendor_build, check_minimums, check_indexes, check_locks]


def lint(loaded: LoadedStack) -> list[Finding]:
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(loaded))
    return findings
