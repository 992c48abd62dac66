"""The stack model's core schema kept between processes (stack/schemacache.py): used only when it is this code's,
the user's own and intact, never loading code from the file, and giving the model exactly the schema pydantic
builds."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.stack import model, schemacache
from tests.fixtures.stack_support import make_root

TOOLS = Path(__file__).resolve().parents[2] / "tools"

#: in a fresh interpreter: load every stack of the root, say whether pydantic generated the stack model's schema
#: (its model schema for Stack), and print what the loads gave
PROBE = """
import json, sys
from pathlib import Path
from pydantic._internal import _generate_schema as gen
generated = []
original = gen.GenerateSchema._model_schema
def counted(self, cls):
    generated.append(cls.__name__)
    return original(self, cls)
gen.GenerateSchema._model_schema = counted
from stackforge.errors import UserError
from stackforge.stack import load, model, schemacache
root = Path(sys.argv[1])
out = {}
for name in sorted(p.stem for p in (root / "stacks").glob("*.yaml")):
    try:
        loaded = load.load(name, root)
        out[name] = [load.resolved(line.model) for line in loaded.platform_lines().values()]
    except UserError as err:
        out[name] = err.render()
schemacache.keep()  # as the command line does when a command succeeds
print(json.dumps({"generated": "Stack" in generated, "loads": out, "schema": load.json_schema()}))
"""


def _probe(root: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(TOOLS), "STACKFORGE_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(root)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def schema():
    model.Stack.model_rebuild()
    return model.Stack.__pydantic_core_schema__


def _kept(cache: Path) -> Path:
    (found,) = (cache / "schema").glob("*.schema")
    return found


def test_sources_are_the_modules_the_model_is_made_of():
    code = "import sys, stackforge.stack.model; print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'stackforge'))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(TOOLS)}
    )
    loaded = {Path(f).relative_to(TOOLS / "stackforge").as_posix() for f in proc.stdout.split()}
    assert loaded == set(schemacache.SOURCES)


def test_a_kept_schema_validates_as_the_built_one(tmp_path):
    root = make_root(tmp_path, {"bad.yaml": "name: bad\ninherits: post1\nplatform: {python: 3.10}\n"})
    cache = tmp_path / "cache"
    built = _probe(root, cache)
    assert built["generated"] and _kept(cache).stat().st_mode & 0o777 == 0o600
    kept = _probe(root, cache)
    assert not kept["generated"]  # pydantic built the validator from the kept schema
    assert kept["loads"] == built["loads"] and kept["schema"] == built["schema"]
    assert "3.10" in kept["loads"]["bad"] and "post2" in kept["loads"]  # an error and a stack, as built


def test_the_file_reads_back_as_the_schema_pydantic_built(tmp_path, schema):
    k = schemacache.key()
    assert k and schemacache.write(tmp_path, k, schema)
    assert schemacache._equal(schemacache.read(tmp_path, k), schema)
    assert schemacache.read(tmp_path, "0" * 64) is None  # another code's key


@pytest.mark.parametrize(
    "spoil",
    [
        "group-writable",
        "world-writable",
        "symlink",
        "payload-changed",
        "truncated",
        "other-key",
        "too-big",
    ],
)
def test_a_file_that_is_not_ours_and_intact_is_not_used(tmp_path, schema, spoil):
    k = schemacache.key()
    assert k and schemacache.write(tmp_path, k, schema)
    path = next(tmp_path.glob("*.schema"))
    data = path.read_bytes()
    if spoil == "group-writable":
        path.chmod(0o620)
    elif spoil == "world-writable":
        path.chmod(0o602)
    elif spoil == "symlink":
        real = tmp_path / "real"
        path.rename(real)
        path.symlink_to(real)
    elif spoil == "payload-changed":
        path.write_bytes(data.replace(b"x86_64", b"x86_65"))
    elif spoil == "truncated":
        path.write_bytes(data[:-100])
    elif spoil == "other-key":
        path.write_bytes(data.replace(k.encode(), b"0" * 64, 1))
    elif spoil == "too-big":
        path.write_bytes(data + b"\0" * schemacache.MAX_BYTES)
    assert schemacache.read(tmp_path, k) is None


def test_a_file_naming_code_loads_no_code(tmp_path):
    """A payload with a global (here os.system) is refused by the reader, even with a matching digest."""
    k = "1" * 64
    payload = pickle.dumps({"type": "any", "x": os.system}, protocol=5)
    path = tmp_path / f"{k}.schema"
    path.write_bytes(schemacache._head(k, payload) + b"\n\n" + payload)
    path.chmod(0o600)
    assert schemacache.read(tmp_path, k) is None
    with pytest.raises(pickle.UnpicklingError):
        schemacache.loads(payload)


def test_a_path_to_anything_but_the_model_is_refused():
    for pid in [("func", "os", "system"), ("cls", "BaseModel"), ("attr", "Stack", "model_validate"), ("x",)]:
        with pytest.raises(schemacache._Unnamed):
            schemacache._resolve(pid)


def test_a_schema_holding_an_object_the_model_does_not_define_is_not_kept(tmp_path, schema):
    alien = {**schema, "metadata": {"f": lambda value: value}}
    assert schemacache.dumps(alien) is None
    assert not schemacache.write(tmp_path, "2" * 64, alien) and not list(tmp_path.iterdir())


def test_a_command_keeps_the_schema_only_when_it_succeeds(tmp_path):
    root = make_root(tmp_path, {"bad.yaml": "name: bad\ninherits: post1\nplatform: {python: 3.10}\n"})
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(TOOLS), "STACKFORGE_CACHE": str(cache)}
    argv = [sys.executable, "-m", "stackforge", "--root", str(root), "list"]
    refused = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "bad" in refused.stdout
    assert not cache.exists()  # a refused command writes nothing, this cache included
    (root / "stacks" / "bad.yaml").unlink()
    assert subprocess.run(argv, capture_output=True, text=True, env=env).returncode == 0
    assert _kept(cache).is_file()
