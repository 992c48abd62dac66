"""Re-run a stack's dependency gate on a built image (the same script the build ran)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from stackforge.builder.plan.plan import gate_spec
from stackforge.builder.plan.render import images_dir
from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from stackforge.stack.load import LoadedStack


def run_gate(
    loaded: LoadedStack, image: str, engine: Engine | None = None, script: str = "gate.py"
) -> tuple[bool, list[str]]:
    """Run images/gate/<script> (of the stack's repository) with this stack's spec inside ``image``, with a
    read-only root filesystem and a writable /tmp, as a hardened runtime would; (all passed, output lines)."""
    engine = engine or Engine()
    engine.check()
    if not engine.image_exists(image):
        raise UserError(
            f"image '{image}' is not in the local engine",
            file="IMAGE",
            fix="build it (stackforge build STACK) or pull it first",
        )
    with tempfile.TemporaryDirectory(prefix="stackforge-gate-") as tmp:
        d = Path(tmp)
        for name in (script, "localver.py"):  # the scripts import the local-label rule from beside them
            (d / name).write_bytes((images_dir(loaded.root) / "gate" / name).read_bytes())
        (d / "gate.json").write_text(json.dumps(gate_spec(loaded.model)))
        d.chmod(0o755)
        proc = engine.cli(
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "-e",
            "PYTHONDONTWRITEBYTECODE=1",
            "--entrypoint",
            "python",
            "-v",
            f"{d}:/stackforge-gate:ro",
            image,
            f"/stackforge-gate/{script}",
            "/stackforge-gate/gate.json",
            timeout=600,
        )
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode == 0, lines
