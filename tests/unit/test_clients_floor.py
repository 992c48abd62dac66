"""The clients floor is the only door to other programs: nothing outside ``stackforge/clients/`` starts a
process (docker, git, pip, uv) or reads a credential file on its own (``clients/credentials.py`` resolves them)."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tools" / "stackforge"
SPAWNERS = {("subprocess", name) for name in ("run", "Popen", "call", "check_call", "check_output", "getoutput")} | {
    ("os", name) for name in ("system", "popen", "execv", "execvp", "execve", "spawnv", "spawnvp", "posix_spawn")
}
#: processes that are neither the engine, git nor an installer, each with its reason
ALLOWED = {
    ("builder/mirror/apt.py", "subprocess.run"): "dpkg-deb reads a .deb's control fields for the mirror's apt tree",
}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
        ):
            yield node.lineno, (node.func.value.id, node.func.attr)


def _outside_clients(package: Path = PACKAGE):
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if not rel.startswith(("clients/", "images/")):  # images/: scripts that run inside images, not on the host
            yield rel, path


def spawns(package: Path = PACKAGE) -> list[str]:
    found = []
    for rel, path in _outside_clients(package):
        for line, call in _calls(ast.parse(path.read_text())):
            if call in SPAWNERS and (rel, ".".join(call)) not in ALLOWED:
                found.append(f"{rel}:{line}: {'.'.join(call)}")
    return found


def test_only_the_clients_start_processes():
    assert spawns() == []


def test_the_allowed_exceptions_still_exist():
    """An exception nobody needs any more is taken off the list."""
    for rel, call in ALLOWED:
        module, attr = call.split(".")
        assert (module, attr) in {c for _, c in _calls(ast.parse((PACKAGE / rel).read_text()))}, rel


def test_a_process_started_by_a_step_is_found(tmp_path):
    copy = tmp_path / "stackforge"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    step = copy / "smoke" / "run.py"
    lines = step.read_text().count("\n")
    step.write_text(step.read_text() + "subprocess.run(['docker', 'ps'])\n")
    (copy / "clients" / "git.py").write_text((copy / "clients" / "git.py").read_text() + "subprocess.run(['git'])\n")
    assert spawns(copy) == [f"smoke/run.py:{lines + 1}: subprocess.run"]


#: how code reads a credential source: an environment variable that holds one, or a file docker, pip or git keep
#: one in (a message may name them; only clients/ reads them)
READS = re.compile(
    r"""(?:environ(?:\.get)?\(?\[?|getenv\()\s*["'](?:STACKFORGE_REGISTRY_(?:USER|PASSWORD)|STACKFORGE_INDEX_|NETRC|DOCKER_CONFIG)"""
    r"""|["']\.netrc["']|["']config\.json["']"""
)


def test_no_step_reads_a_credential_file_or_variable():
    found = [f"{rel}: {m.group(0)}" for rel, path in _outside_clients() for m in READS.finditer(path.read_text())]
    assert found == []


def test_a_step_that_reads_a_credential_is_found(tmp_path):
    step = "import os\nuser = os.environ.get('STACKFORGE_REGISTRY_USER')\nhome = Path.home() / '.netrc'\n"
    message = "fix='set STACKFORGE_REGISTRY_USER and STACKFORGE_REGISTRY_PASSWORD'"
    assert [m.group(0) for m in READS.finditer(step)] == ["environ.get('STACKFORGE_REGISTRY_USER", "'.netrc'"]
    assert list(READS.finditer(message)) == []
