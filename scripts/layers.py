"""The package's floors, checked: an import may reach down, never up, and never sideways into another unit
of the same floor. A unit built in rooms (``builder/``) keeps the same rule among its rooms. Imports inside
functions count; imports under ``if TYPE_CHECKING:`` (annotations only, never run) do not. The engine is reached
through its verbs only: a call that hands docker its arguments raw (``engine.cli(…)``, ``engine.stream(argv)``) or
reaches past the verbs to the docker SDK (``engine.sdk()``, ``import docker``, ``from docker.errors import …``,
``importlib.import_module("docker")``) outside ``clients/`` is refused as well.

usage: python scripts/layers.py [PACKAGE_DIR]   (default: tools/stackforge); exit 1 and one line per
upward or sideways import, naming the file, the line and the floors, and one per raw engine call or SDK use.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

#: bottom to top. A floor is a list of units (a subpackage or a top-level module); units of one floor are
#: independent of each other, except in the base floor, whose small modules may use each other.
FLOORS: list[list[str]] = [
    [
        "errors",
        "urls",
        "grammar",
        "fslock",
        "progress",
        "signals",
        "localver",
        "netread",
        "digests",
        "osv",
        "safeio",
        "extras",
        "buildinfo",
    ],
    ["clients"],
    ["stack"],
    ["patches"],
    ["builder"],
    ["freshness", "publish"],
    ["overlay"],
    ["recipes"],
    ["smoke"],
    ["flows"],
    ["cli"],
    ["__main__"],
]
SHARED_FLOOR = 0
#: units built in rooms: each unit's subpackages, bottom to top, by the rule of FLOORS (down only, never
#: sideways between two rooms of one floor; a room's own modules may use each other). Every module of such a
#: unit sits in a room: only its ``__init__`` stays at the top.
ROOMS: dict[str, list[list[str]]] = {
    "builder": [
        ["plan"],
        ["mirror", "records"],
        ["sources"],
        ["locks"],
        ["context"],
        ["run"],
    ],
}
PACKAGE = "stackforge"
#: the engine client's methods that take a docker command line as it is, or hand out the docker SDK's client;
#: only ``clients/`` calls them
RAW_ENGINE_CALLS = frozenset({"cli", "stream", "_merged", "_buildx", "run_merged", "sdk"})
#: the docker SDK's package: only ``clients/`` imports it
SDK_PACKAGE = "docker"
ENGINE_UNIT = "clients"


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    source: str
    target: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}: {self.why}"


def floor_of(unit: str) -> int | None:
    return next((i for i, units in enumerate(FLOORS) if unit in units), None)


def unit_of(module: str, package_dir: Path) -> str | None:
    """The unit of a dotted module inside the package (``stackforge.builder.run.run`` → ``builder``); a name the
    package's ``__init__`` defines (``stackforge.__version__``) is the package itself."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1 or not ((package_dir / parts[1]).is_dir() or (package_dir / f"{parts[1]}.py").is_file()):
        return PACKAGE
    return parts[1]


def room_of(module: str) -> str | None:
    """The room of a dotted module inside a unit built in rooms (``stackforge.builder.plan.render`` → ``plan``);
    None for the unit itself (``stackforge.builder``)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else None


def room_floor(unit: str, room: str) -> int | None:
    return next((i for i, rooms in enumerate(ROOMS[unit]) if room in rooms), None)


def _room_violation(path: Path, line: int, unit: str, source: str, target: str) -> Violation | None:
    """An import from room ``source`` to room ``target`` of ``unit`` against the rooms' order, or None."""
    src_floor, dst_floor = room_floor(unit, source), room_floor(unit, target)
    src, dst = f"{unit}.{source}", f"{unit}.{target}"
    if dst_floor is None:
        return Violation(path, line, src, dst, "a room on no floor")
    if src_floor is not None and dst_floor > src_floor:
        return Violation(path, line, src, dst, f"up from room floor {src_floor} to {dst_floor} of {unit}/")
    if src_floor is not None and dst_floor == src_floor and source != target:
        return Violation(path, line, src, dst, f"sideways on room floor {src_floor} of {unit}/")
    return None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


@functools.lru_cache(maxsize=4096)
def _imports_in(text: str, filename: str, module: str, is_package: bool) -> tuple[tuple[int, str], ...]:
    """:func:`imported` of a module's source: a file read again unchanged in one process (the floors' tests check
    trees that differ in one file) is not parsed again."""
    return tuple(imported(ast.parse(text, filename), module, is_package))


@functools.lru_cache(maxsize=4096)
def _raw_calls_in(text: str, filename: str) -> tuple[tuple[int, str], ...]:
    """(line, method or ``import …``) of each raw engine call and SDK import in a module's source (see
    :func:`raw_engine_calls`), parsed once per text in one process."""
    here: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, filename)):
        sdk = sdk_import(node)
        if sdk is not None:
            here.append((getattr(node, "lineno", 1), sdk))  # an import or a call: both have one
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RAW_ENGINE_CALLS:
            here.append((node.lineno, node.func.attr))
    return tuple(sorted(here, key=lambda c: c[0]))


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, dotted target) of every import that runs; ``from X import name`` yields ``X.name``."""
    skip = _type_checking_nodes(tree)
    base = module.split(".") if is_package else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            origin = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]) if node.level else node.module
            origin = (origin or "").strip(".")
            out.extend((node.lineno, f"{origin}.{alias.name}") for alias in node.names)
    return out


def _in_package(path: Path, package_dir: Path) -> bool:
    """Every directory from the package down to ``path`` is a Python package (holds ``__init__.py``)."""
    folder = path.parent
    while folder != package_dir.parent:
        if not (folder / "__init__.py").is_file():
            return False
        folder = folder.parent
    return True


def check(package_dir: Path) -> list[Violation]:
    found: list[Violation] = []
    for path in sorted(package_dir.rglob("*.py")):
        if not _in_package(path, package_dir):
            continue  # data shipped with the package (stackforge/images/: scripts that run inside images)
        rel = path.relative_to(package_dir.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        source = unit_of(module, package_dir)
        if source is None or source == PACKAGE:
            continue
        src_floor = floor_of(source)
        if src_floor is None:
            found.append(Violation(path, 1, source, "-", "a unit on no floor: add it to FLOORS in scripts/layers.py"))
            continue
        room = room_of(module) if source in ROOMS else None
        if source in ROOMS and room is not None and room_floor(source, room) is None:
            why = f"a room on no floor: add it to ROOMS[{source!r}] in scripts/layers.py"
            if module.count(".") == 2 and not is_package:
                why = f"a module outside every room of {source}/: move it into one (ROOMS in scripts/layers.py)"
            found.append(Violation(path, 1, f"{source}.{room}", "-", why))
            continue
        seen: set[tuple[int, str]] = set()
        for line, target_module in _imports_in(
            path.read_text(), str(path.relative_to(package_dir.parent)), module, is_package
        ):
            target = unit_of(target_module, package_dir)
            if target == source and room is not None:
                target_room = room_of(target_module)
                if target_room is not None and (line, f"{source}.{target_room}") not in seen:
                    seen.add((line, f"{source}.{target_room}"))
                    violation = _room_violation(path, line, source, room, target_room)
                    if violation:
                        found.append(violation)
                continue
            if target is None or target in (source, PACKAGE) or (line, target) in seen:
                continue
            seen.add((line, target))
            dst_floor = floor_of(target)
            if dst_floor is None:
                found.append(Violation(path, line, source, target, "a unit on no floor"))
            elif dst_floor > src_floor:
                found.append(Violation(path, line, source, target, f"up from floor {src_floor} to {dst_floor}"))
            elif dst_floor == src_floor and src_floor != SHARED_FLOOR:
                found.append(Violation(path, line, source, target, f"sideways on floor {src_floor}"))
    return found


@dataclass(frozen=True)
class RawCall:
    path: Path
    line: int
    #: the method called (``cli``, ``sdk``, …), or for an import of the SDK ``import docker.errors`` and the like
    method: str

    def __str__(self) -> str:
        what = self.method if self.method.startswith("import ") else f".{self.method}(…)"
        kind = "a use of the docker SDK" if self.method.startswith("import ") else "a raw engine call"
        return (
            f"{self.path}:{self.line}: {kind} ({what}) outside {ENGINE_UNIT}/: "
            "call a verb of the engine client (clients/engine.py) instead"
        )


def _is_sdk(module: str | None) -> bool:
    return module is not None and (module == SDK_PACKAGE or module.startswith(f"{SDK_PACKAGE}."))


def sdk_import(node: ast.AST) -> str | None:
    """``import docker.errors`` (as written, shortened) when ``node`` imports the docker SDK, in any form (``import
    docker``, ``from docker import errors``, ``importlib.import_module("docker")``, ``__import__("docker")``);
    None otherwise. A relative import (``from .docker import x``) is the package's own."""
    if isinstance(node, ast.Import):
        hit = next((a.name for a in node.names if _is_sdk(a.name)), None)
        return f"import {hit}" if hit else None
    if isinstance(node, ast.ImportFrom) and not node.level and _is_sdk(node.module):
        return f"import {node.module}"
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        name = node.args[0].value
        func = node.func
        dynamic = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
            isinstance(func, ast.Name) and func.id in ("__import__", "import_module")
        )
        if dynamic and isinstance(name, str) and _is_sdk(name):
            return f"import {name}"
    return None


def raw_engine_calls(package_dir: Path) -> list[RawCall]:
    """Every call of a method that passes docker its arguments raw or hands out the SDK (:data:`RAW_ENGINE_CALLS`),
    whatever the object, and every import of the docker SDK (:func:`sdk_import`, annotations-only imports too), in a
    module outside ``clients/``."""
    found: list[RawCall] = []
    for path in sorted(package_dir.rglob("*.py")):
        if not _in_package(path, package_dir):
            continue
        rel = path.relative_to(package_dir)
        if rel.parts[0] == ENGINE_UNIT:
            continue
        found.extend(
            RawCall(path, line, method)
            for line, method in _raw_calls_in(path.read_text(), str(path.relative_to(package_dir.parent)))
        )
    return found


def main(argv: list[str]) -> int:
    package_dir = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "tools" / PACKAGE
    found = check(package_dir)
    raw = raw_engine_calls(package_dir)
    for violation in [*found, *raw]:
        print(violation)
    if found:
        print(f"{len(found)} import(s) against the floors; the floors are listed in scripts/layers.py", file=sys.stderr)
    if raw:
        print(f"{len(raw)} raw engine call(s) or use(s) of the docker SDK outside {ENGINE_UNIT}/", file=sys.stderr)
    return 1 if found or raw else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
