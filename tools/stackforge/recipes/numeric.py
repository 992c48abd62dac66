"""The smoke rows that compare numbers: a command's printed values against a reference file (``numeric``), and a
MATE Level-10 dump replayed by the image's own tool against the run that wrote it (``dump``).

Commands are argv lists run inside the container with no shell: the first word is a command name or an
absolute path (never a shell), every word is one line of printable text. Where the numbers come from is one of
two documented formats (:data:`FORMATS`); the parsers live in ``smoke/numbers.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from stackforge import grammar
from stackforge.stack.model import EnvName, Strict, _grammar
from stackforge.stack.values import MAX_VALUE

#: How a command prints its numbers.
#: ``json``: the last non-empty line of its output is a JSON object of name -> number.
#: ``mate-log``: MATE's API log at MATE_LOGLEVEL >= 5 (``mate/api_logging.py``): each ``Output value:`` block's
#: tensor statistics (min, max, mean, nan_count, inf_count), named ``<function>#<call>.<stat>`` (a tuple's
#: tensors ``<function>#<call>[<i>].<stat>``).
FORMATS = ("json", "mate-log")
Format = Literal["json", "mate-log"]
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox"})
MAX_ARGV = 64


def _program(word: str) -> str | None:
    """The first word of a command: a command name on the image's PATH or an absolute path; never a shell."""
    reason = grammar.check_command(word) if not word.startswith("/") else grammar.check_absolute_path(word)
    if reason:
        return f"{reason} (the first word of a command: a program name such as python, or an absolute path)"
    if word.rsplit("/", 1)[-1] in SHELLS:
        return f"{word!r} is a shell; a row's command runs without one: write the program and its arguments"
    return None


def _word(word: str) -> str | None:
    if len(word) > MAX_VALUE:
        return f"is {len(word)} characters long (at most {MAX_VALUE})"
    return grammar.check_text(word)


Program = Annotated[str, _grammar(_program)]
Word = Annotated[str, _grammar(_word)]


def _reference(path: str) -> str | None:
    reason = grammar.check_relative_path(path)
    if reason or path.endswith("/") or not path.endswith(".json"):
        return (
            f"{path!r} is not a .json file relative to the repository root (e.g. "
            "recipes/references/<recipe>/<row>.json; no '..', no leading '/')"
        )
    return None


Reference = Annotated[str, _grammar(_reference)]


class Command(Strict):
    """An argv list run inside the container (``docker exec``), no shell."""

    argv: list[Word] = Field(min_length=1, max_length=MAX_ARGV, description="the program and its arguments")
    timeout_s: int = Field(300, ge=1, le=7200, description="seconds the command may run before the row fails")

    @model_validator(mode="after")
    def _first(self) -> Command:
        reason = _program(self.argv[0])
        if reason:
            raise ValueError(f"argv[0]: {reason}")
        return self


class Tolerance(Strict):
    """A value passes when ``|value - expected| <= abs + rel * |expected|`` (numpy.isclose's rule)."""

    abs: float = Field(default=0.0, ge=0, le=1e12, description="absolute tolerance")
    rel: float = Field(default=0.0, ge=0, le=1, description="relative tolerance, a fraction of |expected|")

    @model_validator(mode="after")
    def _some(self) -> Tolerance:
        if self.abs == 0 and self.rel == 0:
            raise ValueError("a tolerance of 0 compares floats for equality; give abs, rel or both, e.g. {abs: 1e-3}")
        return self

    def allows(self, value: float, expected: float) -> bool:
        return abs(value - expected) <= self.abs + self.rel * abs(expected)


class Logprobs(Strict):
    """A greedy chat request asking for logprobs (vLLM: ``choices[0].logprobs.content[i].logprob``); the values
    are named ``<i>:<token>``, so a changed token is a missing and an extra name."""

    multiline_fields = frozenset({"prompt"})

    prompt: Annotated[str, Field(min_length=1, max_length=MAX_VALUE)] = Field(description="the user message")
    max_tokens: int = Field(8, ge=1, le=256, description="max_tokens of the request (one value per token)")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="seed of the request")


class Numeric(Strict):
    """Numbers from a command (or a chat request's logprobs); each must match the reference file's within the
    tolerance, no name missing or extra."""

    run: Command | None = Field(None, description="the command inside the container: {argv: [...], timeout_s}")
    logprobs: Logprobs | None = Field(
        None, description="instead of run: a greedy chat request whose token logprobs are the numbers"
    )
    format: Format = Field("json", description="how the command prints its numbers: json (last line) or mate-log")
    reference: Reference = Field(
        description="a JSON object {name: number} in the repository, e.g. recipes/references/<recipe>/<row>.json"
    )
    tolerance: Tolerance = Field(description="{abs, rel}: how far a value may be from the reference")

    @model_validator(mode="after")
    def _source(self) -> Numeric:
        if (self.run is None) == (self.logprobs is None):
            raise ValueError("a numeric row reads its numbers from exactly one of run (a command) or logprobs")
        return self


#: MATE's Level-10 dump, as mate/api_logging.py reads it: MATE_LOGLEVEL=10 dumps every @mate_api call into
#: MATE_DUMP_DIR (the seed's article calls the level MATE_DUMP_LEVEL; MATE's code reads MATE_LOGLEVEL).
LEVEL_ENV = "MATE_LOGLEVEL"
DUMP_DIR_ENV = "MATE_DUMP_DIR"


class DumpReplay(Strict):
    """Run a command with MATE's Level-10 dump on, list the dumps it wrote (``mate list-dumps DIR``), replay each
    (``mate replay --dir DUMP``: the tool's own comparison must pass) and compare the replay's logged output
    statistics with the run's within the tolerance."""

    run: Command = Field(description="the command that calls MATE (run with the dump level and a fresh dump dir)")
    tool: list[Word] = Field(
        default_factory=lambda: ["python", "-m", "mate"],
        min_length=1,
        max_length=8,
        description="how the image runs MATE's CLI (list-dumps, replay)",
    )
    level: int = Field(10, ge=10, le=10, description="the dump level (MATE dumps tensors at 10)")
    level_env: EnvName = Field(LEVEL_ENV, description="the variable MATE reads the level from")
    dir_env: EnvName = Field(DUMP_DIR_ENV, description="the variable MATE reads the dump directory from")
    replay_level: int = Field(5, ge=5, le=9, description="the log level of the replay (5: tensor statistics)")
    tolerance: Tolerance = Field(description="{abs, rel}: how far a replayed statistic may be from the run's")

    @model_validator(mode="after")
    def _tool(self) -> DumpReplay:
        reason = _program(self.tool[0])
        if reason:
            raise ValueError(f"tool[0]: {reason}")
        return self


MAX_REFERENCE = 1 << 20


class BadReference(ValueError):
    """A reference file that cannot be used (the message says why and how to fix it)."""


def reference_path(root: Path, rel: str) -> Path:
    """``rel`` under ``root``, refusing a path (or a symlink) that leads outside the repository."""
    base = Path(root).resolve()
    path = (base / rel).resolve()
    if not path.is_relative_to(base):
        raise BadReference(f"{rel} leads outside the repository ({path}); keep reference files in the repository")
    return path


def load_reference(root: Path, rel: str) -> dict[str, float]:
    """The reference file's values: a JSON object {name: number} (no booleans, no NaN or infinities)."""
    path = reference_path(root, rel)
    if not path.is_file():
        raise BadReference(f"no reference file {rel}; write it as a JSON object {{name: number}}")
    text = path.read_text(encoding="utf-8", errors="replace")[: MAX_REFERENCE + 1]
    if len(text) > MAX_REFERENCE:
        raise BadReference(f"{rel} is larger than {MAX_REFERENCE} bytes")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadReference(f"{rel} is not JSON: {exc}") from None
    values = numbers_of(data)
    if isinstance(values, str):
        raise BadReference(f"{rel}: {values}")
    return values


def numbers_of(data: object) -> dict[str, float] | str:
    """``data`` as {name: number}, or the reason it is not one."""
    if not isinstance(data, dict) or not data:
        return "write a non-empty JSON object {name: number}"
    out: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{name!r} is {value!r}, not a finite number"
        out[str(name)] = float(value)
    return out
