"""The stack travels inside the image: ``/stackforge/stack/`` holds the stack files of its inheritance chain as
loaded (URL credentials redacted) and ``overrides.json`` (the ``--set`` values, redacted), and the label
``org.stackforge.stack.files`` names each file with its sha256 (``post1.yaml=sha256:… post2.yaml=sha256:…
overrides.json=sha256:…``), so ``stackforge verify`` can check an image with no checkout: the files are read
out of the image, their hashes checked against the label, and the stack loaded from them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from stackforge import safeio
from stackforge.builder.plan.plan import LABEL_NS
from stackforge.errors import UserError, printable
from stackforge.fslock import atomic_write
from stackforge.safeio import write_confined
from stackforge.stack.load import LoadedStack, load
from stackforge.stack.names import STACK_FILE, STACKS_DIR
from stackforge.urls import redact_text

LABEL = f"{LABEL_NS}.stack.files"
IMAGE_DIR = "/stackforge/stack"
CONTEXT_DIR = "stack"
OVERRIDES = "overrides.json"
ENTRY = re.compile(rf"^({STACK_FILE.pattern})=(sha256:[0-9a-f]{{64}})$")


def files(loaded: LoadedStack) -> dict[str, bytes]:
    """File name → bytes of what goes into the image: each stack file of the chain (parent first), then
    the overrides."""
    out: dict[str, bytes] = {}
    for display in loaded.files:
        text = (loaded.root / display).read_text(encoding="utf-8")
        out[Path(display).name] = redact_text(text).encode("utf-8")
    out[OVERRIDES] = (json.dumps([redact_text(o) for o in loaded.overrides], indent=2) + "\n").encode()
    return out


def stack_file_name(name: object, source: str) -> str:
    """``name`` when it is a stack file's name (:data:`STACK_FILE`: a plain name in stacks/, never a path); a name
    taken from an image or a record that is not one is refused before anything is written under it."""
    if not isinstance(name, str) or not STACK_FILE.fullmatch(name):
        raise safeio.Malformed(
            f"stack file name {printable(repr(name))} is not a file name of stacks/ (letters, digits, . _ -; .yaml "
            "or .json), so nothing is written under it",
            file=source,
            fix="the image or its record was not written by stackforge, or was altered",
        )
    return name


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def label(loaded: LoadedStack) -> str:
    return " ".join(f"{name}={digest(data)}" for name, data in files(loaded).items())


def write_context(loaded: LoadedStack, staging: Path) -> None:
    """``stack/`` of the build context (copied to ``/stackforge/stack/`` by the root targets)."""
    (staging / CONTEXT_DIR).mkdir(parents=True, exist_ok=True)
    for name, data in files(loaded).items():
        atomic_write(staging / CONTEXT_DIR / name, data)


def parse_label(value: str | None) -> dict[str, str]:
    """``{file name: sha256:…}`` from the label; an image without it (or with a malformed one) is an error."""
    if not value:
        raise UserError(
            f"the image carries no {LABEL} label: it holds no stack of its own (built by an older stackforge)",
            file="IMAGE",
            fix="verify it from a checkout: stackforge verify IMAGE --stack S",
        )
    out = {}
    for entry in value.split():
        m = ENTRY.match(entry)
        if m is None or m.group(1) in out:
            raise UserError(
                f"label {LABEL}: malformed entry {entry[:120]!r}",
                file="IMAGE",
                fix="the image was not built by stackforge, or its labels were altered",
            )
        out[m.group(1)] = m.group(2)
    if OVERRIDES not in out or len(out) < 2:
        raise UserError(
            f"label {LABEL} names no stack file or no {OVERRIDES}",
            file="IMAGE",
            fix="the image was not built by stackforge, or its labels were altered",
        )
    return out


def materialise(named: dict[str, bytes], into: Path) -> tuple[Path, list[str]]:
    """Write the embedded files as a repository at ``into`` (``stacks/<file>``); returns (root, overrides)."""
    (into / STACKS_DIR).mkdir(parents=True, exist_ok=True)
    for name, data in named.items():
        if name != OVERRIDES:
            write_confined(into / STACKS_DIR, stack_file_name(name, "IMAGE"), data, what="stack file", source="IMAGE")
    overrides = safeio.parse_json(named[OVERRIDES], source=f"{IMAGE_DIR}/{OVERRIDES}", what="overrides")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise UserError(f"{IMAGE_DIR}/{OVERRIDES}: not a list of --set values", file="IMAGE")
    return into, overrides


def load_embedded(files: dict[str, bytes], stack: str, into: Path) -> Any:
    """The stack ``stack`` loaded from the files embedded in an image (written as a repository at ``into``)."""
    root, overrides = materialise(files, into)
    return load(stack, root=root, overrides=overrides)
