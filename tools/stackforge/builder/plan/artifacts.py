"""Optional kernel outputs: a build toolchain installed before the offline build, and files besides wheels.

A kernel's ``toolchain`` becomes its own stage (``toolchain-<kernel>``, FROM deps, with network) holding only
the files it ``uses``; the kernel stage builds FROM it offline, so BuildKit caches the toolchain apart from the
build and neither reaches the image. A kernel's ``files`` are copied from its /out/files into the gate stage
after the wheels by ``images/kernels/install_files.py``, which keeps their mode and fails naming the key of a
file the build did not write.

The plan parts are pure; ``write_context`` and ``check_uses`` run while the build context is assembled.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stackforge.errors import UserError
from stackforge.fslock import atomic_write
from stackforge.stack.artifacts import writes_wheels
from stackforge.stack.load import LoadedStack
from stackforge.stack.model import Stack

#: Where the file installer and its spec live in the build context and the image.
CONTEXT_DIR = "kernels"
LABEL = "org.stackforge.kernels"

__all__ = [
    "KernelFile",
    "ToolchainStep",
    "check_uses",
    "files",
    "labels",
    "toolchain",
    "write_context",
    "writes_wheels",
]


@dataclass
class ToolchainStep:
    run: str
    env: dict[str, str]
    path_prefix: str  # "/a:/b", put in front of PATH ("" for none)
    uses: list[str] = field(default_factory=list)  # paths of the kernel's tree, copied into the toolchain stage
    image: str | None = None  # an offline build: the mirror's image of this stage, used instead of running it


@dataclass
class KernelFile:
    key: str  # the stack key, e.g. kernels.vllm_rs.files.vllm/vllm-rs
    kernel: str
    source: str  # relative to the kernel's /out/files
    dest: str  # absolute, or {site}/…


def toolchain(stack: Stack, kernel: str, env: dict[str, str]) -> ToolchainStep | None:
    """The kernel's toolchain step (None without one); ``env``: its rendered environment."""
    tc = stack.kernels[kernel].toolchain
    if tc is None:
        return None
    return ToolchainStep(tc.run, dict(env), ":".join(tc.path), list(tc.uses))


def files(stack: Stack, kernel: str) -> list[KernelFile]:
    return [
        KernelFile(f"kernels.{kernel}.files.{source}", kernel, source, dest)
        for source, dest in stack.kernels[kernel].files.items()
    ]


def labels(kernels: list[str]) -> dict[str, str]:
    """The kernel steps that ran (the build options select them)."""
    return {LABEL: ",".join(kernels)} if kernels else {}


def write_context(all_files: list[KernelFile], images: Path, staging: Path) -> None:
    """The installer and its spec, in the context's kernels/ directory (only when a kernel declares files)."""
    if not all_files:
        return
    out = staging / CONTEXT_DIR
    out.mkdir(parents=True)
    shutil.copy2(images / "kernels" / "install_files.py", out / "install_files.py")
    atomic_write(out / "files.json", json.dumps([asdict(f) for f in all_files], indent=2) + "\n")


def check_uses(loaded: LoadedStack, kernel: str, upstream: str, tree: Path) -> None:
    """Each path a toolchain ``uses`` is in the exported tree (a UserError naming the key otherwise)."""
    stack = loaded.model
    tc = stack.kernels[kernel].toolchain
    if tc is None:
        return
    root = tree.resolve()
    for i, rel in enumerate(tc.uses):
        path = tree / rel
        if path.is_symlink() or not path.exists() or not path.resolve().is_relative_to(root):
            pin = stack.upstreams[upstream]
            at = pin.pin if pin.commit else upstream
            raise UserError(
                f"kernels.{kernel}.toolchain.uses[{i}]: {rel} is not in {upstream}'s tree at {at}",
                **loaded.position(("kernels", kernel, "toolchain", "uses", i)).as_error_kwargs(),
                fix=f"name a file or directory of {upstream}'s tree (relative to its root)",
            )
