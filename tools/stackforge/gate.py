"""Re-run a stack's dependency gate on a built image (the same script the build ran)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from .engine import Engine
from .errors import UserError
from .model import Stack
from .plan import gate_spec
from .render import images_dir


def run_gate(stack: Stack, image: str, engine: Engine | None = None) -> tuple[bool, list[str]]:
    """Run images/gate/gate.py with this stack's spec inside ``image``; (all passed, output lines)."""
    engine = engine or Engine()
    engine.check()
    if not engine.image_exists(image):
        raise UserError(f"image '{image}' is not in the local engine", file="IMAGE",
                        fix="build it (stackforge build STACK) or pull it first")
    with tempfile.TemporaryDirectory(prefix="stackforge-gate-") as tmp:
        d = Path(tmp)
        (d / "gate.py").write_bytes((images_dir() / "gate" / "gate.py").read_bytes())
        (d / "gate.json").write_text(json.dumps(gate_spec(stack)))
        proc = engine._run("run", "--rm", "--network=none", "--entrypoint", "python", "-v", f"{d}:/stackforge-gate:ro",
                           image, "/stackforge-gate/gate.py", "/stackforge-gate/gate.json", timeout=600)
    lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
    return proc.returncode == 0, lines
