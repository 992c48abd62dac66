"""scripts/base-image.sh builds the toolchain layer from the Dockerfile the package ships, on a fresh machine
(no base image yet): run against a recording `docker` on PATH, it must hand buildx a Dockerfile and a context
that exist in this checkout."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "base-image.sh"

# A docker that answers what base-image.sh asks: the daemon and buildx are there, the rootfs image is present,
# the final image is missing until `buildx build` ran; every build's arguments are recorded one per line.
FAKE_DOCKER = """#!/usr/bin/env bash
state=$(dirname "$0")
case "$1 $2" in
  "info "*|"buildx version") exit 0 ;;
  "image inspect")
    if [ "$3" = --format ]; then echo 1; exit 0; fi
    case "$3" in *-rootfs:*) exit 0 ;; esac
    [ -e "$state/built" ] ;;
  "buildx build")
    printf '%s\\n' "$@" > "$state/build-args"; touch "$state/built" ;;
  *) echo "fake docker: unexpected: $*" >&2; exit 3 ;;
esac
"""


def test_the_toolchain_layer_is_built_from_the_packaged_dockerfile(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STACKFORGE_LOG_DIR=str(tmp_path / "log"))
    run = subprocess.run(["bash", str(SCRIPT), "stackforge-test/base:fresh"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    args = (bin_dir / "build-args").read_text().splitlines()
    dockerfile = Path(args[args.index("-f") + 1])
    context = Path(args[-1])
    assert dockerfile.is_file(), shlex.join(args)
    assert context.is_dir(), shlex.join(args)
    assert dockerfile.parent == context
    assert "FROM" in dockerfile.read_text()
    assert "-t" in args and args[args.index("-t") + 1] == "stackforge-test/base:fresh"
