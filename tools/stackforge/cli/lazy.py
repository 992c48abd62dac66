"""A verb's library, imported when the verb runs rather than when the parser is built.

``stackforge --help`` builds every verb's parser; importing every verb's library for that (the
stack model, Jinja, the engine and registry clients, pyelftools) would cost more than the help
itself. A verb module therefore names its library with :func:`lazy` and a ``TYPE_CHECKING``
import for the type checker::

    if TYPE_CHECKING:
        from stackforge.freshness import newest as freshness
        from stackforge.builder.run.run import build
    else:
        freshness = lazy("stackforge.freshness.newest")
        build = lazy("stackforge.builder.run.run", "build")

The module is imported (through the ordinary, thread-safe import machinery) on the first attribute
access or call. Constants a parser needs at build time are written in the verb module itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _Lazy:
    __slots__ = ("_attr", "_module", "_name")

    def __init__(self, name: str, attr: str | None) -> None:
        self._name = name
        self._attr = attr
        self._module: ModuleType | None = None

    def _load(self) -> ModuleType:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return self._module

    def __getattr__(self, attr: str) -> Any:
        target = self._load() if self._attr is None else getattr(self._load(), self._attr)
        return getattr(target, attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._attr is None:
            raise TypeError(f"module {self._name} is not callable")
        return getattr(self._load(), self._attr)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<lazy {self._name}{'.' + self._attr if self._attr else ''}>"


def lazy(module: str, attr: str | None = None) -> Any:
    """``module`` (or its callable ``attr``, looked up at each call so a patched attribute is seen),
    imported on first use."""
    return _Lazy(module, attr)
