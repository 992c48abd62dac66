"""No function of the package takes more than 12 parameters: a longer list is an options object (a frozen
dataclass the CLI verb builds once and passes down)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tools" / "stackforge"
LIMIT = 12


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters of ``fn``, ``*args``/``**kwargs`` included, ``self``/``cls`` of a method not."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + [
        p.arg for p in (a.vararg, a.kwarg) if p is not None
    ]
    return len(names) - (1 if names[:1] in (["self"], ["cls"]) else 0)


def long_signatures(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameters(node) > LIMIT:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {parameters(node)} parameters")
    return out


def test_no_function_takes_more_than_twelve_parameters():
    assert long_signatures(PACKAGE) == [], "pass an options object (a frozen dataclass) instead"


def test_the_count_sees_methods_keyword_only_and_star_parameters(tmp_path: Path):
    pkg = tmp_path / "stackforge"
    pkg.mkdir()
    thirteen = ", ".join(f"a{i}" for i in range(11))
    (pkg / "m.py").write_text(
        f"class C:\n    def ok(self, {thirteen}, *, b): ...\n    def long(self, {thirteen}, *args, **kw): ...\n"
        f"def fine({thirteen}, b): ...\n"
    )
    assert long_signatures(pkg) == ["stackforge/m.py:3 long: 13 parameters"]
