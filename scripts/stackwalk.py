"""Walk the stack value through one build, statically: from ``cli/build.py:cmd_build`` (``stackforge build
STACK``), follow every call whose callee takes the stack value, to the functions that take it no further.

A function *takes the stack* when one of its parameters is annotated with a stack type (``LoadedStack``, or
``ResolvedStack``; ``X | None``, ``list[X]`` count) or, unannotated, is named ``loaded``. A call is
followed from a function that holds the stack (``cmd_build``, which loads it, or one that takes it) to a
function that takes it; callees are found by name: a function of the same module, an imported function or
module attribute (also ``lazy(...)`` imports), a nested function; a method call ``x.f(...)`` reaches every
method ``f`` that takes the stack. Each distinct function reached is one *stop*.

usage: python scripts/stackwalk.py [PACKAGE_DIR] [--list]   (default: tools/stackforge). Prints the stops,
their files, and how many functions take ``LoadedStack`` (in the package and in ``builder/``).
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

STACK_TYPES = ("LoadedStack", "ResolvedStack")
START = ("stackforge.cli.build", "cmd_build")


@dataclass
class Func:
    module: str
    qual: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    annotated: set[str] = field(default_factory=set)  # stack types named in its parameter annotations
    takes: bool = False


def _names_in(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    text = ast.unparse(annotation)
    return {t for t in STACK_TYPES if t in text}


def _collect(pkg: Path) -> tuple[dict[tuple[str, str], Func], dict[str, dict[str, tuple[str, str | None]]]]:
    funcs: dict[tuple[str, str], Func] = {}
    imports: dict[str, dict[str, tuple[str, str | None]]] = {}  # module -> local name -> (module, attr|None)
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        mod = ".".join(parts)
        tree = ast.parse(path.read_text(), str(path))
        names: dict[str, tuple[str, str | None]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    names[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = (alias.name, None)
            elif (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "lazy"
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                args = [a.value for a in node.value.args if isinstance(a, ast.Constant)]
                if args:
                    names[node.targets[0].id] = (args[0], args[1] if len(args) > 1 else None)
        imports[mod] = names

        def visit(body: list[ast.stmt], prefix: str, mod: str = mod) -> None:
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qual = prefix + node.name
                    f = Func(mod, qual, node)
                    a = node.args
                    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                        found = _names_in(arg.annotation)
                        f.annotated |= found
                        if found or (arg.annotation is None and arg.arg == "loaded"):
                            f.takes = True
                    funcs[(mod, qual)] = f
                    visit(node.body, qual + ".", mod)
                elif isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + ".", mod)

        visit(tree.body, "")
    return funcs, imports


def _callees(f: Func, funcs: dict, imports: dict, by_method: dict[str, list]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    names = imports.get(f.module, {})
    for node in ast.walk(f.node):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name):
            for cand in (f"{f.qual}.{fn.id}", fn.id):
                if (f.module, cand) in funcs:
                    out.add((f.module, cand))
                    break
            else:
                if fn.id in names:
                    mod, attr = names[fn.id]
                    if attr and (mod, attr) in funcs:
                        out.add((mod, attr))
        elif isinstance(fn, ast.Attribute):
            base = fn.value
            if isinstance(base, ast.Name) and base.id in names:
                mod, attr = names[base.id]
                target = f"{mod}.{attr}" if attr else mod
                if (target, fn.attr) in funcs:
                    out.add((target, fn.attr))
                    continue
                if attr and (mod, f"{attr}.{fn.attr}") in funcs:  # Class.method
                    out.add((mod, f"{attr}.{fn.attr}"))
                    continue
            out.update(by_method.get(fn.attr, []))
    return out


def walk(pkg: Path) -> tuple[list[Func], dict[tuple[str, str], Func]]:
    funcs, imports = _collect(pkg)
    by_method: dict[str, list] = {}
    for key, f in funcs.items():
        if "." in f.qual and f.takes:
            by_method.setdefault(f.qual.rsplit(".", 1)[1], []).append(key)
    seen = {START}
    queue = deque([START])
    while queue:
        f = funcs[queue.popleft()]
        for key in _callees(f, funcs, imports, by_method):
            if key not in seen and funcs[key].takes:
                seen.add(key)
                queue.append(key)
    return [funcs[k] for k in sorted(seen)], funcs


def main(argv: list[str]) -> int:
    listing = "--list" in argv
    args = [a for a in argv if a != "--list"]
    pkg = Path(args[0] if args else "tools/stackforge")
    stops, funcs = walk(pkg)
    files = {f.module for f in stops}
    if listing:
        for f in stops:
            print(f"  {f.module}:{f.qual}  [{', '.join(sorted(f.annotated)) or 'loaded'}]")
    loaded = [f for f in funcs.values() if "LoadedStack" in f.annotated]
    builder = [f for f in loaded if f.module.startswith("stackforge.builder")]
    print(f"walk of `stackforge build STACK`: {len(stops)} stops in {len(files)} files")
    print(f"functions taking LoadedStack: {len(loaded)} ({len(builder)} in builder/)")
    for t in STACK_TYPES[1:]:
        print(f"functions taking {t}: {sum(t in f.annotated for f in funcs.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
