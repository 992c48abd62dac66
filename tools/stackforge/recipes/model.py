"""The recipe schema: what ``recipes/<name>.yaml`` may say, as pydantic models.

Every value that later reaches a container argument, an environment variable, a URL path, a shell
line of the generated docs or a regular expression has a grammar checked on load. The loader
(``recipes/load.py``) turns unknown keys and type errors into errors naming the file, line and column.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from stackforge.recipes.numeric import DumpReplay, Numeric
from stackforge.stack.model import EnvName, Name, Slice, Strict
from stackforge.stack.values import (
    MAX_VALUE,
    Argument,
    EnvOverride,
    Flag,
    ModelId,
    Port,
    Regex,
    ServedName,
    UrlPath,
    Words,
    _argument,
    _flag,
)


class ImageRef(Strict):
    stack: Name = Field(description="the stack (stacks/<stack>.yaml) whose image serves the recipe, e.g. post2")
    target: Name = Field(description="the stack's published target, e.g. vllm-openai")
    overlay: Name | None = Field(None, description="an overlay (overlays/<overlay>/) layered on the target's image")


class ModelSpec(Strict):
    id: ModelId = Field(description="the model vLLM serves: a hub id (owner/name) or an absolute path in the container")
    served_name: ServedName | None = Field(
        None, description="the name clients send as `model` (vllm serve --served-model-name); default: the id"
    )
    via: Literal["argument", "env"] = Field(
        "argument",
        description="argument: the id is the first container argument (`vllm serve MODEL …`); env: the image's "
        "entrypoint reads it from an env override whose default is the id",
    )

    @property
    def name(self) -> str:
        """What a client sends as ``model``."""
        return self.served_name or self.id


class Readiness(Strict):
    port: Name | None = Field(None, description="the ports: entry polled (default: the first port)")
    path: UrlPath = Field("/v1/models", description="GET this path until it answers 200")
    timeout_s: int = Field(600, ge=1, le=86400, description="seconds to wait for readiness before the run fails")


class Needs(Strict):
    overlay: Name | None = Field(
        None, description="the overlay the recipe cannot work without; image.overlay must name it"
    )
    note: Words | None = Field(None, description="the precondition in words, shown where a reader chooses the image")


class Hardware(Strict):
    devices: Literal["mthreads", "none"] = Field(
        "mthreads", description="the accelerator the container needs (none: runs on any host)"
    )
    count: int = Field(1, ge=0, le=64, description="how many devices")
    min_memory_gib: int | None = Field(None, ge=1, le=4096, description="device memory each device needs, GiB")


class Chat(Strict):
    """One chat completion whose answer must contain a word; with ``repeat``, the same request sent N times must
    answer the same text each time (seeded sampling is deterministic)."""

    multiline_fields = frozenset({"prompt"})

    prompt: Annotated[str, Field(min_length=1, max_length=MAX_VALUE)] = Field(description="the user message")
    contains: Words | None = Field(None, description="the answer must contain this text (case-insensitive)")
    max_tokens: int = Field(64, ge=1, le=32768, description="max_tokens of the request")
    temperature: float = Field(
        0.0, ge=0.0, le=2.0, description="temperature of the request (0: greedy; OpenAI's range 0 to 2)"
    )
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="seed of the request (per-request sampling)")
    repeat: int = Field(1, ge=1, le=20, description="send the request this many times; every answer must be equal")

    @model_validator(mode="after")
    def _checks_something(self) -> Chat:
        if self.contains is None and self.repeat == 1:
            raise ValueError("a chat row checks nothing: give contains, or repeat >= 2 (the same answer N times)")
        if self.repeat > 1 and self.temperature > 0 and self.seed is None:
            raise ValueError(
                f"repeat {self.repeat} at temperature {self.temperature:g} without a seed: unseeded sampling may "
                "answer differently each time; add a seed (e.g. seed: 1234) or set temperature: 0"
            )
        return self


class Turns(Strict):
    """A multi-turn conversation: each turn sends the history so far and must answer with ``status``."""

    multiline_fields = frozenset({"prompt"})

    count: int = Field(ge=1, le=100, description="how many turns")
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_VALUE)] = Field(
        "Go on.", description="the user message of every turn"
    )
    status: int = Field(200, ge=100, le=599, description="the HTTP status every turn must answer with")
    max_tokens: int = Field(32, ge=1, le=32768, description="max_tokens of each request")


class Get(Strict):
    """A GET of a path that must answer ``status`` (e.g. a second server's model list)."""

    path: UrlPath = Field(description="the URL path")
    status: int = Field(200, ge=100, le=599, description="the expected HTTP status")


#: The most lines a log row counts to (a bound above it could never be checked against a kept log).
MAX_LOG_COUNT = 1_000_000


class LogLine(Strict):
    """Lines of the server's own log (never inferred from the env it was given): by default at least one must
    match; ``count`` (exactly N, 0: the line must not occur) or ``min``/``max`` bound how many do."""

    regex: Regex = Field(
        description="a Python regular expression searched in each log line, e.g. 'Using FLASH_ATTN backend'"
    )
    count: int | None = Field(
        None, ge=0, le=MAX_LOG_COUNT, description="exactly this many lines match (0: no line may match)"
    )
    min: int | None = Field(None, ge=0, le=MAX_LOG_COUNT, description="at least this many lines match")
    max: int | None = Field(None, ge=0, le=MAX_LOG_COUNT, description="at most this many lines match")

    @model_validator(mode="after")
    def _bounds(self) -> LogLine:
        if self.count is not None and (self.min is not None or self.max is not None):
            raise ValueError("log: give count (exactly N) or min/max (a range), not both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"log: min {self.min} is above max {self.max}; swap them")
        return self

    def bounds(self) -> tuple[int, int | None]:
        """(least, most) matching lines; most None: no upper bound. Without count/min/max: at least one."""
        if self.count is not None:
            return self.count, self.count
        if self.min is None and self.max is None:
            return 1, None
        return self.min or 0, self.max

    def expectation(self) -> str:
        """The bound in words, e.g. 'no line', 'exactly 2 lines', 'at least 1 line'."""
        least, most = self.bounds()

        def lines(n: int) -> str:
            return f"{n} line" + ("" if n == 1 else "s")

        if most is None:
            return f"at least {lines(least)}"
        if least == most:
            return "no line" if most == 0 else f"exactly {lines(most)}"
        return f"at most {lines(most)}" if least == 0 else f"between {least} and {lines(most)}"


ROW_KINDS = ("chat", "turns", "get", "log", "numeric", "dump")


class SmokeRow(Strict):
    """One smoke row: exactly one of chat, turns, get, log, numeric, dump."""

    name: Name = Field(description="the row's name in results and evidence")
    port: Name | None = Field(None, description="the ports: entry the request goes to (default: the readiness port)")
    chat: Chat | None = Field(None, description="a chat completion whose answer contains a word")
    turns: Turns | None = Field(None, description="a multi-turn chat, every turn answering with a status")
    get: Get | None = Field(None, description="a GET of a path answering with a status")
    log: LogLine | None = Field(None, description="a line the server's log must contain")
    numeric: Numeric | None = Field(
        None, description="numbers a command prints in the container, compared with a reference file"
    )
    dump: DumpReplay | None = Field(
        None, description="a MATE Level-10 dump of a command, replayed by the image's tool and compared"
    )

    @model_validator(mode="after")
    def _one(self) -> SmokeRow:
        given = [k for k in ROW_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"smoke row {self.name!r} declares {', '.join(given) or 'nothing'}; write exactly one of "
                f"{', '.join(ROW_KINDS)}"
            )
        if (self.kind in ("log", "dump") or (self.numeric and self.numeric.run)) and self.port is not None:
            raise ValueError(f"smoke row {self.name!r}: a {self.kind} row reads the container, not a port; drop port")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ROW_KINDS if getattr(self, k) is not None)

    @property
    def check(self) -> Chat | Turns | Get | LogLine | Numeric | DumpReplay:
        """The row's typed request or expectation."""
        found = self.chat or self.turns or self.get or self.log or self.numeric or self.dump
        assert found is not None  # _one guarantees exactly one
        return found


#: A recipe's name: its file's stem (a file name and a docs page name).
RECIPE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")


def _flag_list(items: list) -> dict[str, str | bool]:
    """The list form of serve: ['--flag value', '--flag=value', '--bare'] as the mapping form."""
    out: dict[str, str | bool] = {}
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise ValueError(f"serve[{i}]: write '--flag value' as a string")
        name, _, value = text.strip().partition(" ")
        if "=" in name and not value:
            name, _, value = name.partition("=")
        value = value.strip()
        for reason in (_flag(name), _argument(value) if value else None):
            if reason:
                raise ValueError(f"serve[{i}]: {reason}")
        if name in out:
            raise ValueError(f"serve[{i}]: {name} is given twice")
        out[name] = value or True
    return out


ServeFlags = dict[Flag, Argument | Literal[True]]


def _serve_shape(value: object) -> object:
    """serve: as a list of '--flag value' strings, or a mapping whose values are text or true."""
    if isinstance(value, list):
        return _flag_list(value)
    if isinstance(value, dict):
        for key, item in value.items():
            if item is False or item is None:
                raise ValueError(f"{key}: write true for a bare flag, or leave the flag out")
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                raise ValueError(f'{key}: {item!r} was read as a number; quote it, e.g. "{item}"')
    return value


class Configuration(Strict):
    """A named serve configuration of the recipe: the same image, model and rows with some serve flags, env
    values or the chat rows' token budget changed (e.g. a re-run with a larger ``max_tokens``)."""

    multiline_fields = frozenset({"notes"})

    name: Name = Field(description="the configuration's name (stackforge smoke RECIPE --configuration NAME)")
    description: Words = Field(description="one line: what this configuration changes and why")
    serve: ServeFlags = Field(
        default_factory=dict,
        description="vllm serve options added to the recipe's, or replacing the recipe's option of the same name",
    )
    env: dict[EnvName, Argument] = Field(
        default_factory=dict, description="values for the recipe's env overrides (each must be declared in env:)"
    )
    max_tokens: int | None = Field(
        None, ge=1, le=32768, description="max_tokens of every chat and turns row (default: each row's own)"
    )
    notes: str | None = Field(None, max_length=4096, description="Markdown shown with the configuration")

    @field_validator("serve", mode="before")
    @classmethod
    def _serve(cls, value: object) -> object:
        return _serve_shape(value)

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, value: object) -> object:
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(item, str):
                    raise ValueError(f'{key}: {item!r} is not text; quote it, e.g. "{item}"')
        return value


class ServeFlag(Strict):
    """One ``vllm serve`` option as the recipe declares it; ``at`` is its key path in the file."""

    name: Flag
    value: Argument | None = None
    at: tuple[str | int, ...] = ()

    def argv(self) -> list[str]:
        return [self.name] if self.value is None else [self.name, self.value]


class Recipe(Strict):
    multiline_fields = frozenset({"notes"})

    description: Words = Field(description="one line: what the recipe serves")
    image: ImageRef = Field(description="the image that serves it: {stack, target, overlay}")
    model: ModelSpec = Field(description="the model served: {id, served_name, via}")
    serve: ServeFlags = Field(
        default_factory=dict,
        description="vllm serve options: a mapping {--flag: value} (true: a bare flag) or a list of "
        "'--flag value' strings; each must exist in the image's own `vllm serve --help=all`",
    )
    env: dict[EnvName, EnvOverride] = Field(
        default_factory=dict,
        description="env overrides the image's entrypoint reads: {NAME: {default, description}}",
    )
    ports: dict[Name, Port] = Field(description="container ports by name, e.g. {api: 8000}; the first is the default")
    readiness: Readiness = Field(
        default_factory=lambda: Readiness.model_validate({}),
        description="when the server is ready: {port, path, timeout_s}",
    )
    needs: Needs = Field(default_factory=lambda: Needs.model_validate({}), description="preconditions: {overlay, note}")
    hardware: Hardware = Field(
        default_factory=lambda: Hardware.model_validate({}),
        description="what the host must have: {devices, count, min_memory_gib}",
    )
    smoke: list[SmokeRow] = Field(
        default_factory=list, description="smoke rows, in order: chat, turns, get, log, numeric or dump"
    )
    configurations: list[Configuration] = Field(
        default_factory=list,
        description="named serve configurations of this recipe (each the recipe with some serve flags, env values "
        "or the chat rows' max_tokens changed); the first is the default of stackforge smoke",
    )
    nightly: bool = Field(False, description="the nightly runs this recipe's smoke rows")
    tests: dict[Name, Slice] = Field(
        default_factory=dict,
        description="pytest slices `stackforge test` runs in the recipe's image (files from an upstream of "
        "image.stack at its pinned commit, or of this repository); target defaults to image.target",
    )
    notes: str | None = Field(
        None, max_length=16384, description="Markdown shown on the cookbook page (caveats, limits)"
    )

    @field_validator("serve", mode="before")
    @classmethod
    def _serve_shape(cls, value: object) -> object:
        return _serve_shape(value)

    def problems(self) -> list[tuple[str, tuple, str]]:
        """What the recipe says that does not fit together: (message, key path, fix) each."""
        out: list[tuple[str, tuple, str]] = []
        if not self.ports:
            out.append(("ports: no port declared", ("ports",), "declare the server's port, e.g. {api: 8000}"))
        seen: dict[int, str] = {}
        for name, port in self.ports.items():
            if port in seen:
                out.append(
                    (
                        f"ports.{name}: container port {port} is also ports.{seen[port]}",
                        ("ports", name),
                        "give each port its own number, or drop the repeated entry",
                    )
                )
            seen.setdefault(port, name)
        refs: list[tuple[tuple, str | None]] = [(("readiness", "port"), self.readiness.port)]
        refs += [(("smoke", i, "port"), row.port) for i, row in enumerate(self.smoke)]
        for path, ref in refs:
            if ref is not None and ref not in self.ports:
                out.append(
                    (
                        f"{'.'.join(map(str, path))}: no port named {ref!r}",
                        path,
                        f"use one of: {', '.join(self.ports)}",
                    )
                )
        names: set[str] = set()
        for i, row in enumerate(self.smoke):
            if row.name in names:
                out.append((f"smoke[{i}].name: {row.name!r} is used twice", ("smoke", i, "name"), "rename one row"))
            names.add(row.name)
        if self.needs.overlay is not None and self.needs.overlay != self.image.overlay:
            out.append(
                (
                    f"needs.overlay is {self.needs.overlay!r} but the image carries "
                    f"{'no overlay' if self.image.overlay is None else repr(self.image.overlay)}",
                    ("needs", "overlay"),
                    f"set image.overlay: {self.needs.overlay}",
                )
            )
        out += self._configuration_problems()
        if self.model.via == "env" and not any(e.default == self.model.id for e in self.env.values()):
            out.append(
                (
                    "model.via is env, but no env override defaults to model.id",
                    ("model", "via"),
                    f"declare it, e.g. env: {{MODEL: {{default: {self.model.id}, description: …}}}}",
                )
            )
        return out

    def _configuration_problems(self) -> list[tuple[str, tuple, str]]:
        out: list[tuple[str, tuple, str]] = []
        seen: set[str] = set()
        budgets = any(row.chat is not None or row.turns is not None for row in self.smoke)
        for i, conf in enumerate(self.configurations):
            at = ("configurations", i)
            if conf.name in seen:
                out.append((f"configurations[{i}].name: {conf.name!r} is used twice", (*at, "name"), "rename one"))
            seen.add(conf.name)
            for env in conf.env:
                if env not in self.env:
                    out.append(
                        (
                            f"configurations[{i}].env.{env}: the recipe declares no env override {env}",
                            (*at, "env", env),
                            f"declare it in env: (default and description), or drop it from {conf.name}",
                        )
                    )
            if conf.max_tokens is not None and not budgets:
                out.append(
                    (
                        f"configurations[{i}].max_tokens: the recipe has no chat or turns row to give it to",
                        (*at, "max_tokens"),
                        "drop max_tokens, or add a chat row",
                    )
                )
        return out

    def flags(self) -> list[ServeFlag]:
        """The serve options in order, each with its key path (for file:line in errors)."""
        return [
            ServeFlag(name=name, value=None if value is True else value, at=("serve", name))
            for name, value in self.serve.items()
        ]

    def configuration_flags(self) -> list[ServeFlag]:
        """Every configuration's own serve options, each with its key path (lint checks them like serve:)."""
        return [
            ServeFlag(name=name, value=None if value is True else value, at=("configurations", i, "serve", name))
            for i, conf in enumerate(self.configurations)
            for name, value in conf.serve.items()
        ]

    def configuration(self, name: str | None = None) -> Configuration | None:
        """The configuration called ``name`` (None: the first, the default); None when the recipe declares none.
        Raises ``KeyError`` naming the known ones for a name it does not declare."""
        if name is None:
            return self.configurations[0] if self.configurations else None
        for conf in self.configurations:
            if conf.name == name:
                return conf
        known = ", ".join(c.name for c in self.configurations)
        raise KeyError(f"no configuration {name!r} (the recipe declares {known or 'none'})")

    def configured(self, name: str | None = None) -> Recipe:
        """The recipe as configuration ``name`` (default: the first) runs it: its serve options added or
        replacing the recipe's of the same name, its env values as the overrides' defaults, its max_tokens on
        every chat and turns row. The recipe itself when it declares no configurations."""
        conf = self.configuration(name)
        if conf is None:
            return self
        env = {
            key: e.model_copy(update={"default": conf.env[key]}) if key in conf.env else e
            for key, e in self.env.items()
        }
        rows = [_with_budget(row, conf.max_tokens) for row in self.smoke]
        return self.model_copy(
            update={"serve": {**self.serve, **conf.serve}, "env": env, "smoke": rows, "configurations": []}
        )

    def default_port(self) -> str:
        return self.readiness.port or next(iter(self.ports))

    def container_args(self) -> list[str]:
        """The arguments after the image's entrypoint: the model (when passed as an argument), the served
        name, then the serve options in order."""
        args: list[str] = []
        if self.model.via == "argument":
            args.append(self.model.id)
            if self.model.served_name and not any(f.name == "--served-model-name" for f in self.flags()):
                args += ["--served-model-name", self.model.served_name]
        for flag in self.flags():
            args += flag.argv()
        return args


def _with_budget(row: SmokeRow, max_tokens: int | None) -> SmokeRow:
    """The row with ``max_tokens`` on its chat or turns request (unchanged when None or another kind)."""
    if max_tokens is None:
        return row
    if row.chat is not None:
        return row.model_copy(update={"chat": row.chat.model_copy(update={"max_tokens": max_tokens})})
    if row.turns is not None:
        return row.model_copy(update={"turns": row.turns.model_copy(update={"max_tokens": max_tokens})})
    return row
