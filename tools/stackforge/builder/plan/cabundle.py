"""How the steps that download reach the CA bundle (``--ca-bundle``).

The bundle is public (certificates, no keys), so it needs no secret: it goes to BuildKit as a one-file named
build context, ``stackforge-cabundle`` (a directory in the build's private temporary directory, removed with
it), and each downloading step bind-mounts that file read-only. A BuildKit secret would do the same, but on
Docker's built-in BuildKit each step that mounts one waits 1–2 s before it starts (docs/build.md); a bind
mount does not. A bind mount never reaches a layer or the image history; unlike a secret, its content is
part of the step's cache key, so a different bundle re-runs the downloading steps. An engine whose
Dockerfile frontend takes no named contexts (BuildKit older than 0.10) gets the bundle as the secret
``cabundle`` instead.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

#: the named build context that holds the bundle, and the bundle's name in it
CONTEXT = "stackforge-cabundle"
FILE = "ca.pem"
#: the secret id of the bundle on an engine without named contexts
SECRET_ID = "cabundle"


@dataclass(frozen=True)
class CaMount:
    """The ``RUN`` mount flag that brings the bundle into a step, and where the step reads it."""

    flag: str
    path: str


BIND = CaMount(
    f"--mount=type=bind,from={CONTEXT},source={FILE},target=/run/stackforge/{FILE}", f"/run/stackforge/{FILE}"
)
SECRET = CaMount(f"--mount=type=secret,id={SECRET_ID}", f"/run/secrets/{SECRET_ID}")


def ca_mount(bundle: bool, named_contexts: bool = True) -> CaMount | None:
    """The mount of a build with a bundle (``bundle``) on an engine that takes named contexts or not; None
    without a bundle (the steps then declare no mount at all)."""
    if not bundle:
        return None
    return BIND if named_contexts else SECRET


def write_context(bundle: Path, parent: Path) -> dict[str, Path]:
    """Copy ``bundle`` into ``parent``/stackforge-cabundle/ca.pem: the ``--build-context`` of the build (a
    directory with that one file, so BuildKit transfers only it)."""
    directory = parent / CONTEXT
    directory.mkdir(mode=0o755, exist_ok=True)
    target = directory / FILE
    shutil.copyfile(bundle, target)
    target.chmod(0o644)
    return {CONTEXT: directory}
