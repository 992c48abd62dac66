"""A resolved stack: every templated value of a stack rendered once, each kept with where it was written.

A stack's templates (``tags.local``, ``labels``, a kernel's and a step's ``env``, a kernel toolchain's
``env``, a target's ``labels``, ``env``, kernels and steps, and the system layers' package names, candidates,
versions, lines and symlink targets, the stack's and each target's) render in the sandbox of
``stack/tags.py``. :func:`resolve` renders them all, in the order a build reads them, and the first template
that fails is the UserError ``tags.render_template`` raises (the key, file:line:col, the fix).
``LoadedStack.resolved`` resolves a load once, when a value is first needed: ``lint``, ``show``, ``tags``,
``render``, ``build`` and the plan read plain values from it, and a later check (a system value's grammar)
names the position kept with each value.

(``stack.load.resolved(stack)`` is another thing: the stack's values as plain data, templates unrendered.)

Not here: the publish references (``tags.publish``, ``tags.aliases``). They depend on the registry, the date
and the revision, known only at publish time, so ``tags.publish_ref`` and ``tags.alias_refs`` render them
then, from the context resolved here (:attr:`Resolved.context`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge.clients.credentials import StackCredentials
from stackforge.errors import UserError
from stackforge.stack import platforms as lines_of
from stackforge.stack import tags
from stackforge.stack import targets as target_rules
from stackforge.stack.model import Stack, SystemLayer
from stackforge.stack.yamlsrc import Pos

if TYPE_CHECKING:
    from stackforge.stack.load import LoadedStack


def selected(stack: Stack, when: dict[str, str]) -> bool:
    """Whether a step whose ``when`` names build options runs with the stack's option values."""
    return all(stack.options[name].value == want for name, want in when.items())


def is_template(text: str) -> bool:
    """A system layer's value is a template when it holds ``{{`` or ``{%`` (else it is used as written)."""
    return "{{" in text or "{%" in text


@dataclass(frozen=True)
class Rendered:
    """One templated value: the rendered text, the template as written and where it was written."""

    text: str
    template: str
    pos: Pos


@dataclass(frozen=True)
class TargetValues:
    """A target's rendered values: its labels and ENV, and the env of its selected kernels and of its steps."""

    labels: dict[str, str]
    env: dict[str, str]
    kernels: dict[str, dict[str, str]]
    steps: dict[str, dict[str, str]]


@dataclass(frozen=True)
class Resolved:
    """Every templated value of one load, rendered. A step's env is the stack's ``tuning``, then its own.
    Shared by every reader of the load: a reader that changes a value copies it first."""

    local: tags.Ref  # tags.local, checked against the reference grammar
    labels: dict[str, str]
    kernels: dict[str, dict[str, str]]  # the selected kernels' step env
    toolchains: dict[str, dict[str, str]]  # the toolchain env of each selected kernel that has a toolchain
    steps: dict[str, dict[str, str]]
    targets: dict[str, TargetValues]
    rendered: dict[tuple, Rendered]  # every value rendered from a template, by its stack key path
    context: dict[str, Any]  # what a template may use (the publish references add date and revision)

    def value(self, path: tuple, written: str) -> str:
        """The value at ``path`` as the build uses it: rendered when it is a template, else as ``written``."""
        found = self.rendered.get(tuple(path))
        return found.text if found is not None else written


class _Renderer:
    def __init__(self, loaded: LoadedStack):
        self.loaded = loaded
        self.context = tags.context(loaded.model)
        self.rendered: dict[tuple, Rendered] = {}

    def __call__(self, template: str, path: tuple) -> str:
        text = tags.render_template(self.loaded, template, path, data=self.context)
        self.rendered[path] = Rendered(text, template, self.loaded.position(path))
        return text

    def each(self, values: dict[str, str], path: tuple) -> dict[str, str]:
        return {key: self(value, (*path, key)) for key, value in values.items()}

    def step_env(self, env: dict[str, str], path: tuple) -> dict[str, str]:
        """The environment of a build step: the stack's tuning, then the step's own ``env`` (at ``path``)."""
        return {**self.loaded.model.tuning, **self.each(env, path)}

    def system(self, layers: dict[str, SystemLayer], at: tuple) -> None:
        for short, layer in layers.items():
            base = (*at, short)
            for i, pkg in enumerate(layer.packages):
                where = (*base, "packages", i)
                written = [((*where, "name"), pkg.name)]
                written += [((*where, "candidates", j), c) for j, c in enumerate(pkg.candidates)]
                if pkg.version is not None:
                    written.append(((*where, "version"), pkg.version))
                elif pkg.line is not None:
                    written.append(((*where, "line"), pkg.line))
                for path, text in written:
                    if is_template(text):
                        self(text, path)
            for link, target in layer.symlinks.items():
                if is_template(target):
                    self(target, (*base, "symlinks", link))


def resolve(loaded: LoadedStack) -> Resolved:
    """Render every templated value of the stack (see the module docstring); raises the first template error."""
    stack = loaded.model
    r = _Renderer(loaded)
    # a platform line that is not the stack's own is tagged apart locally (…-arm64): an engine's image store holds
    # one image per tag, and the lines meet under one tag only as the published index
    line = loaded.line
    apart = f"-{line.name}" if line is not None and not line.own else ""
    local = tags.checked_ref(loaded, r(stack.tags.local, ("tags", "local")) + apart, ("tags", "local"))
    labels = r.each(stack.labels, ("labels",))
    kernels: dict[str, dict[str, str]] = {}
    toolchains: dict[str, dict[str, str]] = {}
    for name, k in stack.kernels.items():
        if selected(stack, k.when):
            kernels[name] = r.step_env(k.env, ("kernels", name, "env"))
            if k.toolchain is not None:
                toolchains[name] = r.each(k.toolchain.env, ("kernels", name, "toolchain", "env"))
    steps = {name: r.step_env(s.env, ("steps", name, "env")) for name, s in stack.steps.items()}
    r.system(stack.system or {}, ("system",))
    targets: dict[str, TargetValues] = {}
    for tname in target_rules.order(stack):
        t, base = stack.targets[tname], ("targets", tname)
        t_labels = r.each(t.labels, (*base, "labels"))
        t_kernels = {
            kname: r.step_env(k.env, (*base, "kernels", kname, "env"))
            for kname, k in t.kernels.items()
            if selected(stack, k.when)
        }
        t_steps = {sname: r.step_env(s.env, (*base, "steps", sname, "env")) for sname, s in t.steps.items()}
        targets[tname] = TargetValues(t_labels, r.each(t.env, (*base, "env")), t_kernels, t_steps)
        r.system(t.system or {}, (*base, "system"))
    return Resolved(local, labels, kernels, toolchains, steps, targets, r.rendered, r.context)


@dataclass(frozen=True, eq=False)
class ResolvedStack:
    """The build's one input: a stack loaded and resolved, made once (``ResolvedStack.of``) and taken by every
    build step. It holds the validated model, every templated value rendered (``resolved``), the repository
    root, the files of the inheritance chain and the ``--set`` overrides, where each value and key was written,
    the credentials the stack names (``clients.credentials.StackCredentials``: each index's name and URL and what
    its URLs carried) and its platform lines, each resolved too."""

    model: Stack = dataclasses.field(repr=False)
    resolved: Resolved = dataclasses.field(repr=False)
    root: Path
    positions: Mapping[tuple, Pos] = dataclasses.field(repr=False)
    keypositions: Mapping[tuple, Pos] = dataclasses.field(repr=False)
    files: tuple[str, ...]
    overrides: tuple[str, ...] = dataclasses.field(repr=False)  # a --set value may carry a credential
    credentials: StackCredentials = dataclasses.field(repr=False)
    #: the platform line this stack is
    line: lines_of.Line | None = None
    #: every declared line as a resolved stack of its own, by name (empty when the stack declares no ``platforms:``)
    lines: Mapping[str, ResolvedStack] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, stack: LoadedStack | ResolvedStack) -> ResolvedStack:
        """The resolved value of a loaded stack (``stack`` itself when it is one): its templates rendered, each of
        its platform lines resolved. Raises the first template error (a UserError naming the key)."""
        if isinstance(stack, ResolvedStack):
            return stack
        lines = {name: cls.of(line) for name, line in stack.lines.items()}
        return cls(
            stack.model,
            stack.resolved,
            stack.root,
            stack.positions,
            stack.keypositions,
            tuple(stack.files),
            tuple(stack.overrides),
            stack.credentials,
            stack.line,
            lines,
        )

    @property
    def name(self) -> str:
        return self.model.name

    def platform_lines(self) -> dict[str, ResolvedStack]:
        """Every platform line of the stack as a stack of its own: the declared ones, else the stack itself."""
        if self.lines:
            return dict(self.lines)
        return {self.line.name if self.line else lines_of.ARCH_NAMES[self.model.platform.arch]: self}

    def for_platform(self, which: str) -> ResolvedStack:
        """The line named ``which`` (its name, OCI platform or architecture; see ``LoadedStack.for_platform``)."""
        from stackforge.stack.load import line_named

        return line_named(self.name, self.platform_lines(), which)

    def position(self, path: tuple) -> Pos:
        """Where the value at ``path`` (or its nearest declared parent) was written."""
        from stackforge.stack.load import position_of

        return position_of(tuple(path), self.positions, self.keypositions)

    def placed(self, err: UserError, path: tuple) -> UserError:
        """``err`` (its message, fix and exit code) placed at the stack key ``path``."""
        return UserError(err.message, **self.position(path).as_error_kwargs(), fix=err.fix, exit_code=err.exit_code)
