"""The overlay schema: what ``overlays/<name>/overlay.yaml`` may say, as pydantic models.

An overlay is a small image layered on a release image: the base (a stack's target, built by stackforge, or a
registry image pinned by digest), a layered patch range per upstream (``overlays/<name>/patches/<upstream>/``,
copied into the installed package), extra files and an entrypoint with their sha256, env defaults, ports,
labels, checks and tag templates. Every value that reaches the Dockerfile, a shell line or a path has a grammar
checked on load; the loader (``overlay/load.py``) names the file, line and column of a refused value.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from stackforge import grammar
from stackforge.stack.model import EnvName, LabelKey, Module, Name, Probe, Sha256, Strict, _grammar
from stackforge.stack.values import EnvOverride, Port, Words

#: An overlay's name: its directory under overlays/ (a path component, a tag suffix, a label value).
OVERLAY_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
#: A file mode as octal text, e.g. "0644", "0755".
MODE = re.compile(r"^0?[0-7]{3}$")


def check_overlay_name(name: str) -> str | None:
    if OVERLAY_NAME.match(name):
        return None
    return f"{name!r} is not an overlay name (lower-case letters, digits, '.', '_', '-'; at most 64)"


def _pinned_image(ref: str) -> str | None:
    reason = grammar.check_image_ref(ref)
    if reason:
        return reason
    if "@" not in ref:
        return f"{ref!r} is not pinned: write registry/repository@sha256:<64 hex digits>"
    return None


def _overlay_path(path: str) -> str | None:
    """A file of the overlay directory: relative, no '.' or '..' component, not a directory."""
    if path.endswith("/") or grammar.check_relative_path(path):
        return f"{path!r} is not a file path relative to the overlay directory (e.g. files/entrypoint.sh; no '..')"
    return None


def _dest(path: str) -> str | None:
    if path == "/" or path.endswith("/") or grammar.check_absolute_path(path):
        return f"{path!r} is not an absolute file path in the image (no '..', no shell characters)"
    if path.startswith("/stackforge/"):
        return f"{path!r} is under /stackforge/, which holds stackforge's own records"
    return None


def _mode(text: str) -> str | None:
    return None if MODE.match(text) else f'{text!r} is not a file mode such as "0644" or "0755"'


OverlayName = Annotated[str, _grammar(check_overlay_name)]
PinnedImage = Annotated[str, _grammar(_pinned_image)]
OverlayPath = Annotated[str, _grammar(_overlay_path)]
Dest = Annotated[str, _grammar(_dest)]
Mode = Annotated[str, _grammar(_mode)]


def _quoted(value: object) -> object:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f'{value!r} was read as a number; quote it so it stays as written, e.g. "{value}"')
    return value


class OverlayBase(Strict):
    """What the overlay layers on: ``{stack, target}`` or ``{image}``."""

    stack: Name | None = Field(None, description="a stack (stacks/<stack>.yaml) whose target stackforge builds first")
    target: Name | None = Field(None, description="the stack's published target the overlay builds on")
    image: PinnedImage | None = Field(
        None, description="a registry image pinned by digest (registry/repo@sha256:<64 hex>), pulled by digest"
    )

    @model_validator(mode="after")
    def _one(self) -> OverlayBase:
        if self.image is not None and (self.stack or self.target):
            raise ValueError("write either {stack, target} or {image}, not both")
        if self.image is None and not (self.stack and self.target):
            raise ValueError("write {stack: NAME, target: NAME} (built by stackforge) or {image: REPO@sha256:…}")
        return self

    @property
    def digest(self) -> str | None:
        return self.image.partition("@")[2] if self.image else None


class Range(Strict):
    packages: list[Module] = Field(
        default_factory=list,
        description="the top-level directories of the upstream's tree that are installed packages, copied into "
        "site-packages (default: the upstream's name, e.g. vllm)",
    )


class OverlayFile(Strict):
    src: OverlayPath = Field(description="the file, relative to the overlay directory (e.g. files/interposer.py)")
    dest: Dest = Field(description="where it goes in the image: an absolute path")
    sha256: Sha256 = Field(description="the file's sha256 (64 hex digits), checked on the host before the build")
    mode: Mode = Field("0644", description='its mode in the image, octal text such as "0644" or "0755"')

    _mode = field_validator("mode", mode="before")(classmethod(lambda cls, v: _quoted(v)))


class Entrypoint(OverlayFile):
    mode: Mode = Field("0755", description='its mode in the image (default "0755")')


class OverlayTags(Strict):
    local: str = Field(
        description="the local tag: a template over the base stack's values and overlay.name, e.g. "
        "'vllm-musa:{{ upstreams.vllm.tag }}-{{ overlay.name }}'"
    )
    publish: str | None = Field(
        None, description="the immutable publish tag: a template holding {{ date }} then {{ revision }}"
    )


class Overlay(Strict):
    description: Words = Field(description="one line: what the overlay adds")
    base: OverlayBase = Field(description="what it layers on: {stack, target} or {image: REPO@sha256:…}")
    patches: dict[Name, Range] = Field(
        default_factory=dict,
        description="layered ranges by upstream (overlays/<name>/patches/<upstream>/, after the base series): "
        "{upstream: {packages}}; only files inside the installed packages may change",
    )
    files: list[OverlayFile] = Field(default_factory=list, description="extra files: [{src, dest, sha256, mode}]")
    entrypoint: Entrypoint | None = Field(None, description="the image's entrypoint script: {src, dest, sha256, mode}")
    env: dict[EnvName, EnvOverride] = Field(
        default_factory=dict, description="env overrides the entrypoint reads: {NAME: {default, description}} (ENV)"
    )
    ports: dict[Name, Port] = Field(default_factory=dict, description="container ports by name (EXPOSE)")
    labels: dict[LabelKey, str] = Field(default_factory=dict, description="labels; values are templates like the tags")
    checks: list[Probe] = Field(
        default_factory=list, description="probes run in the layered image after the range is installed"
    )
    tags: OverlayTags = Field(description="{local, publish} tag templates")

    def problems(self) -> list[tuple[str, tuple, str]]:
        """What the overlay says that does not fit together: (message, key path, fix) each."""
        out: list[tuple[str, tuple, str]] = []
        seen: dict[int, str] = {}
        for name, port in self.ports.items():
            if port in seen:
                out.append(
                    (
                        f"ports.{name}: port {port} is also ports.{seen[port]}",
                        ("ports", name),
                        "give each port its own number",
                    )
                )
            seen.setdefault(port, name)
        dests: dict[str, tuple] = {}
        entries: list[tuple[tuple, OverlayFile]] = [(("files", i), f) for i, f in enumerate(self.files)]
        if self.entrypoint is not None:
            entries.append((("entrypoint",), self.entrypoint))
        for at, f in entries:
            if f.dest in dests:
                out.append(
                    (
                        f"{'.'.join(map(str, at))}.dest: {f.dest} is also {'.'.join(map(str, dests[f.dest]))}.dest",
                        (*at, "dest"),
                        "give each file its own dest",
                    )
                )
            dests.setdefault(f.dest, at)
        names = [c.name for c in self.checks]
        for i, name in enumerate(names):
            if name in names[:i]:
                out.append((f"checks[{i}].name: {name!r} is used twice", ("checks", i, "name"), "rename one check"))
        return out
