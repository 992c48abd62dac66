"""After the pip phases: post-install patches, steps in the installed environment, requirement rules,
and the upstream trees a kernel builds against.

The plan parts are pure; ``write_context`` and ``in_tree_series`` read the repository and the exported
trees on the host while the build context is assembled.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from stackforge.errors import UserError
from stackforge.fslock import atomic_write
from stackforge.stack import installed
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack

#: Where the post-install step's spec, patches and report live in the build context and the image.
CONTEXT_DIR = "installed"
IMAGE_DIR = "/stackforge/installed"
REPORT = f"{IMAGE_DIR}/report.txt"
LABEL = "org.stackforge.postinstall"


@dataclass
class PostInstallPatch:
    key: str  # the stack key, e.g. post_install[0]
    dist: str
    specifier: str  # e.g. <0.2.6
    patch: str  # repository-relative path of the patch
    file: str  # its name in the context's installed/ directory
    expect: str  # applied | skipped, from the stack's pin of dist


@dataclass
class Step:
    name: str
    env: dict[str, str]
    run: str


def post_install(stack: Stack) -> list[PostInstallPatch]:
    return [
        PostInstallPatch(
            f"post_install[{i}]", e.dist, e.specifier, e.patch, f"{i:02d}-{e.dist}.patch", installed.expected(stack, i)
        )
        for i, e in enumerate(stack.post_install)
    ]


def steps(stack: Stack, env: dict[str, dict[str, str]]) -> list[Step]:
    """The stack's steps; ``env``: each one's environment (the tuning, then its own, rendered)."""
    return [Step(name, dict(env[name]), step.run) for name, step in stack.steps.items()]


def gate_extras(stack: Stack) -> dict:
    """The gate spec's keys for the requirement rules and the post-install report (none when unused)."""
    out: dict = {}
    if stack.rules.requires:
        out["requires"] = [r.model_dump() for r in stack.rules.requires]
    if stack.post_install:
        out["post_install_report"] = REPORT
    return out


def write_context(loaded: LoadedStack, patches: list[PostInstallPatch], staging: Path, images: Path) -> dict[str, str]:
    """Copy the post-install script and patches into the context; {dist: 'sha256:<hex>:applied|skipped'}."""
    if not patches:
        return {}
    root = loaded.root
    out_dir = staging / CONTEXT_DIR
    out_dir.mkdir(parents=True)
    shutil.copy2(images / "installed" / "post_install.py", out_dir / "post_install.py")
    records, spec = {}, []
    for i, entry in enumerate(patches):
        path = root / entry.patch
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(root.resolve()):
            raise UserError(
                f"post_install[{i}].patch: {entry.patch} is not a file of the repository",
                **loaded.position(("post_install", i, "patch")).as_error_kwargs(),
                fix="check the patch in (a unified diff relative to site-packages)",
            )
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (out_dir / entry.file).write_bytes(data)
        spec.append({**asdict(entry), "sha256": digest})
        records[entry.dist] = f"sha256:{digest}:{entry.expect}"
    atomic_write(out_dir / "post_install.json", json.dumps(spec, indent=2) + "\n")
    return records


def labels(records: dict[str, str]) -> dict[str, str]:
    return {f"{LABEL}.{dist}": value for dist, value in records.items()}


def naming_key(loaded: LoadedStack, name: str, err: UserError) -> UserError:
    """A failure applying an in-tree series, reported against the stack key that asked for it."""
    src = loaded.model.upstreams[name].patches_from
    assert src is not None
    return UserError(
        f"upstreams.{name}.patches_from ({src.upstream}:{src.path}): {err.message}"
        + (f" [{err.location()}]" if err.file else ""),
        **loaded.position(("upstreams", name, "patches_from")).as_error_kwargs(),
        fix=err.fix,
    )
