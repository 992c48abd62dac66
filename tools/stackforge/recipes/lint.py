"""Check recipes against the repository (stack, target, overlay) and against a built image.

Against an image, two facts come from the image itself: the options its ``vllm serve --help=all``
lists (every serve flag of the recipe must be one), and the text of its entrypoint (every env override
must be read there as ``$NAME`` or ``${NAME…}``). The engine calls sit behind :class:`ImageProbe`, so
tests can hand in help text and entrypoint scripts.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from stackforge import grammar
from stackforge.clients.containers import isolated
from stackforge.errors import UserError
from stackforge.overlay.load import load_overlay
from stackforge.recipes.load import LoadedRecipe
from stackforge.recipes.numeric import BadReference, load_reference
from stackforge.stack.load import load_stack

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine

#: A long option as ``--help`` output lists it (``--enforce-eager, --no-enforce-eager``, ``--port PORT``).
HELP_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")
MAX_ENTRYPOINT = 1 << 20
SHELLS = ("sh", "bash", "dash")


class ImageProbe(Protocol):
    """What the image checks need from an image."""

    ref: str

    def serve_help(self) -> str:
        """The output of the image's ``vllm serve --help=all``."""
        ...

    def entrypoint(self) -> tuple[str, str]:
        """(where, text): the entrypoint script's path in the image (or ``-c``) and its text."""
        ...


class ProbeFailed(UserError):
    """The image could not answer a question a check asks (exit 1: a finding about the image)."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message, fix=fix, exit_code=1)


@dataclass
class DockerImage:
    """An image in the local engine, asked through ``docker run --rm --network=none``."""

    ref: str
    engine: Engine

    def __post_init__(self) -> None:
        reason = grammar.check_image_ref(self.ref)
        if reason:
            raise UserError(
                f"--image {self.ref!r}: {reason}",
                file="--image",
                fix="name a local image, e.g. vllm-musa:<tag> (stackforge tags STACK prints it)",
            )
        proc = self.engine.inspect_image(self.ref, "{{json .Config.Entrypoint}}", timeout=60)
        if proc.returncode != 0:
            raise UserError(
                f"no image {self.ref} in the engine",
                file="--image",
                fix="build it (stackforge build STACK --target T) or docker pull it",
            )
        self._entrypoint = json.loads(proc.stdout.strip() or "null") or []

    def _run(self, entrypoint: str, *argv: str) -> str:
        proc = self.engine.run(isolated(self.ref, entrypoint, *argv), timeout=300)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ProbeFailed(
                f"`{entrypoint} {' '.join(argv)}` failed in {self.ref} (exit {proc.returncode}): {' | '.join(tail)}",
                fix="check that the image is the recipe's image and that it starts",
            )
        return str(proc.stdout)

    def serve_help(self) -> str:
        return self._run("vllm", "serve", "--help=all")

    def entrypoint(self) -> tuple[str, str]:
        ep = [str(p) for p in self._entrypoint]
        if not ep:
            raise ProbeFailed(
                f"{self.ref} has no entrypoint", fix="the env overrides need an entrypoint that reads them"
            )
        if Path(ep[0]).name in SHELLS and len(ep) > 1:
            if ep[1] == "-c" and len(ep) > 2:
                return "-c", ep[2]
            ep = ep[1:]
        path = ep[0]
        if not path.startswith("/"):
            path = self._run("sh", "-c", 'command -v "$1"', "sh", path).strip()
        if grammar.check_absolute_path(path):
            raise ProbeFailed(f"the entrypoint of {self.ref} is not a file: {ep[0]!r}")
        text = self._run("head", "-c", str(MAX_ENTRYPOINT), path)
        return path, text


def help_flags(text: str) -> set[str]:
    """Every long option a ``--help`` text names."""
    return set(HELP_FLAG.findall(text))


def reads_env(text: str, name: str) -> bool:
    """Whether a shell script reads ``$NAME`` or ``${NAME…}``."""
    return re.search(rf"\$(?:{re.escape(name)}|\{{{re.escape(name)})(?![A-Za-z0-9_])", text) is not None


def check_repository(recipe: LoadedRecipe, root: Path) -> list[UserError]:
    """The recipe's image exists in the repository: the stack loads, the target is published, the overlay
    directory exists; a ``--port`` flag names one of the recipe's ports."""

    found: list[UserError] = []
    img = recipe.model.image
    try:
        stack = load_stack(img.stack, root=root)
    except UserError as err:
        found.append(
            recipe.error(
                f"image.stack: the stack {img.stack!r} does not load: {err.message}",
                ("image", "stack"),
                fix=f"run stackforge lint {img.stack}"
                if (Path(root) / "stacks" / f"{img.stack}.yaml").is_file()
                else "name a stack of stacks/ (stackforge list)",
            )
        )
        stack = None
    if stack is not None:
        target = stack.targets.get(img.target)
        published = [n for n, t in stack.targets.items() if t.published]
        if target is None or not target.published:
            found.append(
                recipe.error(
                    f"image.target: {img.stack} has no published target {img.target!r}",
                    ("image", "target"),
                    fix=f"use one of: {', '.join(published) or '(none)'}",
                )
            )
    if img.overlay is not None and not (Path(root) / "overlays" / img.overlay).is_dir():
        found.append(
            recipe.error(
                f"image.overlay: no overlays/{img.overlay}/ directory",
                ("image", "overlay"),
                fix="name an overlay of overlays/, or drop image.overlay",
            )
        )
    elif img.overlay is not None:
        found += _check_overlay(recipe, root, img.overlay)
    found += _check_references(recipe, root)
    for flag in [*recipe.model.flags(), *recipe.model.configuration_flags()]:
        port = flag.value
        if flag.name != "--port" or port is None or (port.isdigit() and int(port) in recipe.model.ports.values()):
            continue
        found.append(
            recipe.error(
                f"{'.'.join(map(str, flag.at))} is {port} but ports: declares {sorted(recipe.model.ports.values())}",
                flag.at,
                fix="make --port one of the ports, or add it to ports:",
            )
        )
    return found


def _check_references(recipe: LoadedRecipe, root: Path) -> list[UserError]:
    """Each numeric row's reference file is in the repository and holds {name: number}."""
    found = []
    for i, row in enumerate(recipe.model.smoke):
        if row.numeric is None:
            continue
        try:
            load_reference(root, row.numeric.reference)
        except BadReference as err:
            found.append(
                recipe.error(
                    f"smoke[{i}].numeric.reference: {err}",
                    ("smoke", i, "numeric", "reference"),
                    fix='write it as a JSON object, e.g. {"gemm.sum": 7.98}, from a run on a known-good image',
                )
            )
    return found


def _check_overlay(recipe: LoadedRecipe, root: Path, name: str) -> list[UserError]:
    """The overlay loads, and its entrypoint script (in the repository) reads every env override of the recipe."""

    try:
        ov = load_overlay(root, name, where="image.overlay")
    except UserError as err:
        return [
            recipe.error(
                f"image.overlay: overlays/{name} does not load: {err.message}",
                ("image", "overlay"),
                fix="run stackforge build STACK --overlay NAME to see every problem",
            )
        ]
    entry = ov.model.entrypoint
    if entry is None or not recipe.model.env:
        return []
    script = (
        (ov.dir / entry.src).read_text(encoding="utf-8", errors="replace") if (ov.dir / entry.src).is_file() else ""
    )
    return [
        recipe.error(
            f"env.{env}: the entrypoint of overlay {name} ({entry.src}) never reads ${env}",
            ("env", env),
            fix=f"drop env.{env}, or read ${{{env}:-default}} in overlays/{name}/{entry.src}",
        )
        for env in recipe.model.env
        if not reads_env(script, env)
    ]


def check_image(recipe: LoadedRecipe, image: ImageProbe) -> list[UserError]:
    """Every serve flag (the recipe's and each configuration's) is an option of the image's vllm serve; every
    env override is read by its entrypoint."""
    found: list[UserError] = []
    flags = [*recipe.model.flags(), *recipe.model.configuration_flags()]
    if flags:
        try:
            known = help_flags(image.serve_help())
        except ProbeFailed as err:
            return [recipe.error(err.message, ("serve",), err.fix)]
        if not known:
            return [
                recipe.error(
                    f"`vllm serve --help=all` in {image.ref} lists no options",
                    ("serve",),
                    "check that the image's vllm is a real vLLM CLI",
                )
            ]
        for flag in flags:
            base = flag.name.split(".", 1)[0]
            if base in known:
                continue
            near = difflib.get_close_matches(base, sorted(known), n=1, cutoff=0.75)
            found.append(
                recipe.error(
                    f"{'.'.join(map(str, flag.at[:-1]))}.{flag.name}: the image's vllm serve has no option {base} "
                    f"({image.ref})",
                    flag.at,
                    fix=f"did you mean {near[0]}?"
                    if near
                    else "remove it, or use an image whose vLLM has it (vllm serve --help=all lists the options)",
                )
            )
    if recipe.model.env:
        try:
            where, text = image.entrypoint()
        except ProbeFailed as err:
            return [*found, recipe.error(err.message, ("env",), err.fix)]
        for name in recipe.model.env:
            if not reads_env(text, name):
                found.append(
                    recipe.error(
                        f"env.{name}: the image's entrypoint ({where}) never reads ${name}, so the override changes "
                        f"nothing ({image.ref})",
                        ("env", name),
                        fix=f"drop env.{name}, or read ${{{name}:-default}} in the overlay's entrypoint",
                    )
                )
    return found


def as_finding(err: UserError) -> dict:
    """A finding as JSON: where, what, the fix."""
    return {
        "file": str(err.file) if err.file else None,
        "line": err.line,
        "col": err.col,
        "message": err.message,
        "fix": err.fix,
    }
