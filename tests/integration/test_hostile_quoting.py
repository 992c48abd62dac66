"""The Dockerfile quoting of stackforge's template filters, read back through the real engine.

A tiny image (no stack build): LABEL and ENV words from ``dockerword`` and the ENTRYPOINT from
``execform``, then ``docker image inspect`` must show every value exactly as written — UTF-8,
'&', '<', '"', '\\', a literal ``$HOME`` and a newline inside an exec-form argument included.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from stackforge.builder.plan.render import dockerword, execform
from stackforge.clients.engine import Engine
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

LABELS = {
    "org.opencontainers.image.description": "Example train — a & b <c> 'single' \"double\" back\\slash",
    "org.example.dollar": "$HOME ${HOME} \\$HOME $$ cost: 5$",
    "org.example.edge": "ends with a backslash \\",
    "org.example.hash": "#not a comment = x \\n stays literal",
}
ENV = {"STACKFORGE_A": "$HOME & <b> — \"q\" \\ 'x'", "STACKFORGE_B": "=leading equals \\"}
ENTRYPOINT = ["python3", "-c", "print('$HOME & <b> — \"q\" \\\\')\nprint('second line')", "\u2028sep\u2029", "$PATH"]


def dockerfile(base: str) -> str:
    """The LABEL/ENV/ENTRYPOINT lines exactly as images/Dockerfile.j2 writes them."""
    labels = " \\\n      ".join(f"{dockerword(k)}={dockerword(v)}" for k, v in LABELS.items())
    env = " \\\n    ".join(f"{k}={dockerword(v)}" for k, v in ENV.items())
    return f"FROM {base}\nLABEL {labels}\nENV {env}\nENTRYPOINT {execform(ENTRYPOINT)}\n"


@pytest.fixture
def tag(engine: Engine):
    ref = f"{run_names.NS}/hostile-quoting:{secrets.token_hex(4)}"
    yield ref
    engine.remove_image(ref, force=True)


def test_labels_env_and_entrypoint_read_back_exactly(engine: Engine, base_image: str, tag: str, tmp_path: Path):
    text = dockerfile(base_image)
    assert text.count("\n") == 2 + len(LABELS) + len(ENV), "a value broke a Dockerfile line"
    (tmp_path / "Dockerfile").write_text(text, encoding="utf-8")
    proc = engine.cli("buildx", "build", "--load", "-t", tag, str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = engine.cli("image", "inspect", tag, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)[0]["Config"]
    for key, value in LABELS.items():
        assert config["Labels"].get(key) == value, (key, config["Labels"].get(key))
    for key, value in ENV.items():
        assert f"{key}={value}" in config["Env"], (key, config["Env"])
    assert config["Entrypoint"] == ENTRYPOINT
