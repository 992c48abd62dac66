"""The stack model's core schema, kept between processes.

pydantic builds a model's core schema in Python the first time the model validates, in every process: for the
stack model (47 classes, one schema) that is about 12 ms, a tenth of a first ``stackforge list``. The schema is
a function of the code alone (the model's modules and pydantic), so it is kept as bytecode is: a process that
built it writes it to ``<cache>/schema/`` (when its command succeeds: ``keep``), and a later process whose code is the same gives it to pydantic
instead of building it again (``Stack.__get_pydantic_core_schema__``, pydantic's hook for a type's own schema).

The schema is plain data but for the model's classes and the functions it validates with. The file holds the
data, and for each class or function a path to where the model defines it (a class by name, a validator by its
class and name, an ``Annotated`` validator by its field and place), resolved against the classes of the process
that reads it: no code is read from the file. A file is used only when

- its key is this process's: the bytes of the model's modules (``SOURCES``), the versions of pydantic,
  pydantic_core and Python, and this format;
- it is a regular file of the user who runs stackforge, writable by no one else, under ``MAX_BYTES``, and the
  sha256 it carries is that of its content;
- every path in it names a class or function of the model (an unpickler that loads no global: anything else
  fails the read).

Otherwise pydantic builds the schema as it would without this module, and the file is written anew. A file is
written only from a schema that reads back equal to the one pydantic built, in the process that built it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
import stat
import sys
import threading
import typing
from pathlib import Path
from typing import Any

import pydantic
import pydantic_core
from pydantic import BaseModel

from stackforge.clients.workspace import cache_dir
from stackforge.stack import model

FORMAT = b"stackforge-schema 1"
#: the modules the model is made of (relative to the package): a change to any of them is a new key
#: (tests/unit/test_schema_cache.py checks that these are the stackforge modules stack/model.py imports)
SOURCES = ("__init__.py", "grammar.py", "stack/__init__.py", "stack/model.py", "urls.py")
PACKAGE = Path(__file__).resolve().parents[1]
MAX_BYTES = 1 << 20  # the schema is about 50 KiB
KEEP = 4  # files kept (other keys: another checkout, another pydantic)
#: modules whose functions a schema may name, besides the model's classes and fields
FUNCTION_MODULES = ("stackforge.stack.model", "stackforge.grammar", "pydantic._internal._validators")
#: the kinds of validator pydantic keeps on a model class (its ``__pydantic_decorators__``)
_DECORATOR_KINDS = (
    "validators",
    "field_validators",
    "root_validators",
    "field_serializers",
    "model_serializers",
    "model_validators",
)


class _Unnamed(Exception):
    """An object of the schema with no path to where the model defines it: the schema is not kept."""


def key() -> str | None:
    """The key of this process's code; None when a module's source cannot be read."""
    h = hashlib.sha256(FORMAT + b"\0")
    h.update(f"{sys.version}\0{pydantic.VERSION}\0{pydantic_core.__version__}\0".encode())
    for rel in SOURCES:
        try:
            source = (PACKAGE / rel).read_bytes()
        except OSError:
            return None
        h.update(f"{rel}\0{len(source)}\0".encode())
        h.update(source)
    return h.hexdigest()


# --------------------------------------------------------------------------- paths to the model's objects


def _class(qualname: str) -> type[BaseModel]:
    found = getattr(model, qualname, None)
    if not (isinstance(found, type) and issubclass(found, BaseModel) and found.__module__ == model.__name__):
        raise _Unnamed(qualname)
    return found


def _walk_annotation(annotation: Any, out: list) -> None:
    for meta in getattr(annotation, "__metadata__", ()):
        out.append(meta)
    for arg in typing.get_args(annotation):
        if not isinstance(arg, (str, int, bool, type(None))):
            _walk_annotation(arg, out)


@functools.cache
def _field_objects(cls: type[BaseModel], field: str) -> tuple:
    """The objects a field's schema may hold, in a fixed order: its metadata, the metadata within its
    annotation, its default factory."""
    info = cls.model_fields[field]
    out: list = list(info.metadata)
    _walk_annotation(info.annotation, out)
    if info.default_factory is not None:
        out.append(info.default_factory)
    return tuple(out)


def _resolve(pid: tuple) -> Any:
    """The object a path names in this process (``_Unnamed`` when none)."""
    kind = pid[0]
    if kind == "cls":
        return _class(pid[1])
    if kind == "dec":
        _, qualname, category, name = pid
        if category not in _DECORATOR_KINDS:
            raise _Unnamed(category)
        return getattr(_class(qualname).__pydantic_decorators__, category)[name].func
    if kind == "attr":
        _, qualname, name = pid
        if name != "__get_pydantic_json_schema__":
            raise _Unnamed(name)
        return getattr(_class(qualname), name)
    if kind == "meta":
        _, qualname, field, index, attr = pid
        found = _field_objects(_class(qualname), field)[index]
        return getattr(found, attr) if attr else found
    if kind == "func":
        _, module_name, name = pid
        if module_name not in FUNCTION_MODULES or module_name not in sys.modules:
            raise _Unnamed(module_name)
        found = getattr(sys.modules[module_name], name, None)
        if not callable(found) or getattr(found, "__module__", None) != module_name:
            raise _Unnamed(name)
        return found
    if kind == "partial":
        _, func, args, keywords = pid
        return functools.partial(_resolve(func), *args, **dict(keywords))
    raise _Unnamed(kind)


def _path_of(obj: Any) -> tuple:
    """A path ``_resolve`` takes back to ``obj`` (``_Unnamed`` when there is none)."""
    for pid in _candidates(obj):
        try:
            found = _resolve(pid)
        except (_Unnamed, KeyError, IndexError, AttributeError, TypeError):
            continue
        if found is obj or (type(found) is type(obj) and _same(found, obj)):
            return pid
    raise _Unnamed(repr(obj))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, functools.partial):
        return a.func == b.func and a.args == b.args and a.keywords == b.keywords
    return bool(a == b)  # bound methods: the same function of the same object


@functools.cache
def _classes() -> tuple[type[BaseModel], ...]:
    found = [c for c in vars(model).values() if isinstance(c, type) and issubclass(c, BaseModel)]
    return tuple(c for c in found if c.__module__ == model.__name__)


def _candidates(obj: Any):
    """Paths that may name ``obj`` (``_path_of`` keeps the first that does)."""
    if isinstance(obj, type):
        yield ("cls", obj.__qualname__)
        return
    if isinstance(obj, functools.partial):
        if all(isinstance(v, (str, int, float, bool, type(None))) for v in (*obj.args, *obj.keywords.values())):
            yield ("partial", _path_of(obj.func), obj.args, tuple(sorted(obj.keywords.items())))
        return
    index = _index(_classes())
    owner = getattr(obj, "__self__", None)
    for place in index.get(("dec", id(obj)), ()):
        yield ("dec", *place)
    if isinstance(owner, type):
        decorators = owner.__dict__.get("__pydantic_decorators__")
        for category in _DECORATOR_KINDS:  # a bound method equal to the one the class holds
            for name, dec in getattr(decorators, category, {}).items():
                if dec.func == obj:
                    yield ("dec", owner.__qualname__, category, name)
        yield ("attr", owner.__qualname__, getattr(obj, "__name__", ""))
        return
    for place in index.get(id(obj), ()):
        yield ("meta", *place, "")
    if owner is not None:
        for place in index.get(id(owner), ()):
            yield ("meta", *place, getattr(obj, "__name__", ""))
    for place in index.get(("func", id(obj)), ()):
        yield ("meta", *place, "func")
    yield ("func", getattr(obj, "__module__", ""), getattr(obj, "__qualname__", ""))


@functools.cache
def _index(classes: tuple[type[BaseModel], ...]) -> dict[Any, list[tuple]]:
    """Where each object of the classes' schemas is, by its id: a field's (class, field, place); ``("func",
    id)``: the object whose ``func`` it is (an AfterValidator's function); ``("dec", id)``: a validator's
    (class, kind, name)."""
    index: dict[Any, list[tuple]] = {}
    for cls in classes:
        decorators = cls.__dict__.get("__pydantic_decorators__")
        for category in _DECORATOR_KINDS:
            for name, dec in getattr(decorators, category, {}).items():
                index.setdefault(("dec", id(dec.func)), []).append((cls.__qualname__, category, name))
        for field in cls.model_fields:
            for i, found in enumerate(_field_objects(cls, field)):
                index.setdefault(id(found), []).append((cls.__qualname__, field, i))
                func = getattr(found, "func", None)
                if func is not None:
                    index.setdefault(("func", id(func)), []).append((cls.__qualname__, field, i))
    return index


_PLAIN = (dict, list, tuple, str, int, float, bool, type(None), bytes, set, frozenset)


class _Writer(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5)
        self._paths: dict[int, tuple] = {}

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _PLAIN:
            return None
        if id(obj) not in self._paths:
            self._paths[id(obj)] = _path_of(obj)
        return self._paths[id(obj)]


class _Reader(pickle.Unpickler):
    """Loads plain data and the model's objects by path; no global (no class, no function) from the file."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._found: dict[tuple, Any] = {}

    def find_class(self, module_name: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module_name}.{name}: a kept schema names no global")

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError("not a path")
        if pid not in self._found:
            try:
                self._found[pid] = _resolve(pid)
            except (_Unnamed, KeyError, IndexError, AttributeError, TypeError, ValueError) as exc:
                raise pickle.UnpicklingError(f"no such object of the model: {pid!r}") from exc
        return self._found[pid]


def dumps(schema: Any) -> bytes | None:
    """The schema as a kept file's payload; None when it holds an object with no path, or does not read back
    equal to itself."""
    buf = io.BytesIO()
    try:
        _Writer(buf).dump(schema)
        payload = buf.getvalue()
        if not _equal(loads(payload), schema):
            return None
    except (_Unnamed, pickle.PicklingError, pickle.UnpicklingError, RecursionError, TypeError):
        return None
    return payload


def _equal(a: Any, b: Any) -> bool:
    """Whether two schemas are the same data with the same objects (a partial: the same function and arguments)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a is b or _same(a, b)


def loads(payload: bytes) -> Any:
    return _Reader(payload).load()


# --------------------------------------------------------------------------- the file


def _file(cache: Path, k: str) -> Path:
    return cache / f"{k}.schema"


def read(cache: Path, k: str) -> Any:
    """The schema kept under ``cache`` for key ``k``; None when there is none that may be used."""
    try:
        fd = os.open(_file(cache, k), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            or (hasattr(os, "getuid") and info.st_uid != os.getuid())
            or info.st_size > MAX_BYTES
        ):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    head, sep, payload = data.partition(b"\n\n")
    if not sep or head != _head(k, payload):
        return None
    try:
        return loads(payload)
    except Exception:  # any fault of the file is a miss: pydantic builds the schema
        return None


def _head(k: str, payload: bytes) -> bytes:
    return FORMAT + b"\n" + k.encode() + b"\nsha256:" + hashlib.sha256(payload).hexdigest().encode()


def write(cache: Path, k: str, schema: Any) -> bool:
    """Keep ``schema`` under ``cache`` for key ``k`` (the oldest files beyond KEEP removed); False when it is not
    kept (an object with no path, a directory that cannot be written)."""
    payload = dumps(schema)
    if payload is None:
        return False
    target = _file(cache, k)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_head(k, payload) + b"\n\n" + payload)
        os.replace(tmp, target)
        kept = sorted(cache.glob("*.schema"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True


# --------------------------------------------------------------------------- the model


_ready = False
_lock = threading.Lock()


def user_cache() -> Path | None:
    """``schema/`` of ``$STACKFORGE_CACHE``, else of the user's cache (never a repository's: the schema is a
    function of the code); None when there is no home to hold it."""
    try:
        return cache_dir(None, "schema")
    except (RuntimeError, KeyError, OSError):
        return None


#: the schema this process built, to keep when it ends well (``keep``): (cache, key, schema)
_built: list[tuple[Path, str, Any]] = []


def build(cache: Path | None) -> None:
    """Build the stack model's validator now, from the schema kept under ``cache`` when there is one for this
    code, else as pydantic builds it (and ``keep`` keeps it under ``cache``). Once per process; ``cache`` None:
    build only."""
    global _ready
    with _lock:  # one build, whichever thread loads a stack first
        if not (_ready or model.Stack.__pydantic_complete__):
            _build(cache)
        _ready = True


def _build(cache: Path | None) -> None:
    k = key() if cache is not None else None
    kept = read(cache, k) if cache is not None and k is not None else None
    if kept is not None:
        model.offer_schema(kept)
        try:
            model.Stack.model_rebuild()
            return
        except Exception:  # a schema pydantic_core refuses: built as if none were kept
            pass
        finally:
            model.offer_schema(None)
    model.Stack.model_rebuild(force=True)
    if cache is not None and k is not None:
        _built[:] = [(cache, k, model.Stack.__pydantic_core_schema__)]


def keep() -> None:
    """Write the schema this process built (if it built one) for the processes after it. The command line calls
    it when a command succeeds, so that a refused command writes nothing, a cache included."""
    while _built:
        try:
            write(*_built.pop())
        except Exception:  # the cache only saves time: nothing about it fails a command
            pass
