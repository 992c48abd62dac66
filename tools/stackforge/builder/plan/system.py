"""System layers: the stack's ``system:`` apt layers as build stages (``system-<layer>``, after ``base``).

Each layer becomes a spec file (``system/<layer>.spec`` in the build context) that
``images/system/apt-layer.sh`` carries out inside the build: the mirror rewrite, the layer's apt sources,
the install mode (``auto`` keeps a base that has the probe command), the packages resolved by
``images/system/apt-resolve.sh`` against the sources (``apt-cache madison``) and installed in one apt
transaction, the loader directories and the symlinks. Every value is rendered (templates) and checked
against its grammar here (rendered once per load: ``stack/resolved.py``), before it reaches the spec file or the
Dockerfile.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from stackforge import grammar
from stackforge.errors import UserError
from stackforge.fslock import atomic_write
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack, SystemLayer
from stackforge.stack.resolved import Resolved

#: The image's evidence of the system layers: resolution lines, then every installed package.
EVIDENCE = "/stackforge/system/packages.txt"
_LOG_LINE = re.compile(r"^(?:#\d+ [\d.]+ )?((?:resolved |layer |error: system\.).*)$")


@dataclass
class SystemStage:
    name: str  # the layer's name
    stage: str  # system-<name>
    parent: str  # the stage it starts from
    install: str
    packages: int
    env: dict[str, str]
    path_prefix: str  # "/a:/b" put in front of PATH, or ""
    spec: str  # the text of system/<name>.spec
    keys: dict[str, str] = field(default_factory=dict)  # context file -> repository file (signed-by keys)
    mirror: str | None = None  # context path of the mirror's apt repository in an offline build (builder/mirror/apt.py)


def _value(loaded: LoadedStack, resolved: Resolved, path: tuple, text: str, check: Callable[[str], str | None]) -> str:
    """``text`` as the load resolved it (rendered when it is a template) checked against its grammar; errors
    name the key."""
    out = resolved.value(path, text)
    reason = check(out)
    if reason:
        key = ".".join(map(str, path))
        shown = f" (rendered from {text!r})" if out != text else ""
        raise UserError(
            f"{key}: {reason}{shown}",
            **loaded.position(path).as_error_kwargs(),
            fix="fix the value in the stack (or its --set)",
        )
    return out


def _source_line(
    loaded: LoadedStack,
    layer: str,
    name: str,
    keys: dict[str, str],
    where: tuple = ("system",),
    layers: dict[str, SystemLayer] | None = None,
    full: str | None = None,
) -> str:
    full = full or layer
    src = (layers if layers is not None else loaded.model.system or {})[layer].sources[name]
    path = (*where, layer, "sources", name)
    if "@" in urlsplit(src.url).netloc:
        raise UserError(
            f"{'.'.join(path)}.url: an apt source URL cannot carry credentials",
            **loaded.position((*path, "url")).as_error_kwargs(),
            fix="give apt its credentials in /etc/apt/auth.conf.d of the base image",
        )
    options = []
    if src.trusted:
        options.append("trusted=yes")
    if src.signed_by:
        root = loaded.root
        key = (root / src.signed_by).resolve()
        if not key.is_file() or not key.is_relative_to(root.resolve()):
            raise UserError(
                f"{'.'.join(path)}.signed_by: {src.signed_by} is not a file in the repository",
                **loaded.position((*path, "signed_by")).as_error_kwargs(),
                fix="check the key file into the repository and name it relative to its root",
            )
        suffix = ".asc" if key.suffix == ".asc" else ".gpg"
        keys[f"system/keys/{full}/{name}{suffix}"] = str(key)
        options.append(f"signed-by=/etc/apt/keyrings/stackforge-{full}/{name}{suffix}")
    opts = f"[{' '.join(options)}] " if options else ""
    return f"deb {opts}{src.url} {src.suite} {' '.join(src.components)}"


def system_stages(
    loaded: LoadedStack,
    resolved: Resolved,
    layers: dict[str, SystemLayer] | None = None,
    at: tuple = ("system",),
    parent: str = "base",
    prefix: str = "",
) -> list[SystemStage]:
    """The system layers in stack order, each a stage built on the previous one (the first on ``base``), with
    the values ``resolved`` rendered.

    A target's layers (``layers``, at stack key ``at``) start from ``parent`` and are named ``prefix<layer>``."""
    checked = partial(_value, loaded, resolved)
    out: list[SystemStage] = []
    for short, layer in (loaded.model.system or {} if layers is None else layers).items():
        name = prefix + short
        base = (*at, short)
        lines = [f"layer {name}", f"install {layer.install}"]
        if layer.probe:
            lines.append(f"probe {layer.probe}")
        if layer.mirror:
            lines.append(f"mirror {layer.mirror.from_} {layer.mirror.to}")
        keys: dict[str, str] = {}
        lines += [f"source {_source_line(loaded, short, s, keys, at, layers, name)}" for s in layer.sources]
        for i, pkg in enumerate(layer.packages):
            where = (*base, "packages", i)
            logical = checked((*where, "name"), pkg.name, grammar.check_apt_name)
            names = [
                checked((*where, "candidates", j), c, grammar.check_apt_name) for j, c in enumerate(pkg.candidates)
            ] or [logical]
            if pkg.version is not None:
                mode, want = "exact", checked((*where, "version"), pkg.version, grammar.check_apt_version)
            elif pkg.line is not None:
                mode, want = "line", checked((*where, "line"), pkg.line, grammar.check_apt_version)
            else:
                mode, want = "any", "-"
            lines.append(f"package {'.'.join(map(str, where))}|{logical}|{mode}|{want}|{' '.join(names)}")
        lines += [f"ld {d}" for d in layer.ld_dirs]
        for link, target in layer.symlinks.items():
            link_key: tuple = (*base, "symlinks", link)
            lines.append(f"link {'.'.join(link_key)}|{link}|{checked(link_key, target, grammar.check_absolute_path)}")
        for key, value in layer.env.items():
            reason = grammar.bad_char(value)
            if reason:
                raise UserError(
                    f"{'.'.join(base)}.env.{key}: contains {reason}",
                    **loaded.position((*base, "env", key)).as_error_kwargs(),
                    fix="one printable line",
                )
        out.append(
            SystemStage(
                name,
                f"system-{name}",
                parent,
                layer.install,
                len(layer.packages),
                dict(layer.env),
                ":".join(layer.path),
                "\n".join(lines) + "\n",
                keys,
            )
        )
        parent = f"system-{name}"
    return out


def write_context(stages: list[SystemStage], images: Path, staging: Path) -> None:
    """The layer scripts, each layer's spec file and its signed-by keys, into the build context."""
    if not stages:
        return
    shutil.copytree(
        images / "system", staging / "system", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
    )
    for st in stages:
        atomic_write(staging / "system" / f"{st.name}.spec", st.spec)
        for dest, src in st.keys.items():
            (staging / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, staging / dest)


def write_evidence(
    stack: Stack, engine, ref: str | None, log: str, evidence: Path, lines: list[str] | None = None
) -> None:
    """``evidence/system.txt``: the image's record (resolution lines and ``dpkg-query -W``) when ``ref``
    names the built image (or ``lines`` holds it, already read), else the layer lines of the build log."""
    if not stack.system:
        return
    lines = list(lines or [])
    if ref is not None and not lines:
        proc = engine.cli("run", "--rm", "--network=none", "--entrypoint", "cat", ref, EVIDENCE, timeout=300)
        lines = proc.stdout.splitlines() if proc.returncode == 0 else []
    if not lines:
        lines = list(dict.fromkeys(m.group(1) for m in map(_LOG_LINE.match, log.splitlines()) if m))
    atomic_write(evidence / "system.txt", "\n".join(lines) + "\n")
