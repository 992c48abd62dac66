"""Value grammars shared by the stack, recipe and overlay schemas: model ids, serve flags and arguments, URL
paths, regular expressions, one-line words, ports, and an entrypoint's env override."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from stackforge.stack.model import Strict, _grammar

#: A model id as vLLM takes it: a Hugging Face ``owner/name`` (or ``name``), or an absolute path in the container.
MODEL_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$|^(?:/[A-Za-z0-9._-]+)+$")


SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


#: A long option of ``vllm serve``, written with dashes as its ``--help`` lists it.
FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]{0,63}(?:\.[a-z0-9_-]{1,63})*$")


URL_PATH = re.compile(r"^/[A-Za-z0-9._~/-]{0,255}$")


NUMBER = re.compile(r"^-[0-9][0-9.e+-]*$")


MAX_VALUE = 4096


MAX_REGEX = 512


def _model_id(text: str) -> str | None:
    if MODEL_ID.match(text) and ".." not in text.split("/"):
        return None
    return f"{text!r} is not a model id (owner/name as the hub names it, or an absolute path in the container)"


def _served_name(text: str) -> str | None:
    return None if SERVED_NAME.match(text) else f"{text!r} is not a served model name"


def _flag(text: str) -> str | None:
    if FLAG.match(text):
        return None
    return f"{text!r} is not a long option of vllm serve (write --name-with-dashes)"


def _argument(text: str) -> str | None:
    """A container argument: one line of printable text that the engine cannot read as an option."""
    if len(text) > MAX_VALUE:
        return f"is {len(text)} characters long (at most {MAX_VALUE})"
    if text.startswith("-") and not NUMBER.match(text):
        return f"{text!r} starts with '-' and would be read as an option"
    return None


def _url_path(text: str) -> str | None:
    if URL_PATH.match(text) and ".." not in text.split("/"):
        return None
    return f"{text!r} is not a URL path such as /v1/models (no query, no '..', no spaces)"


def _regex(text: str) -> str | None:
    if len(text) > MAX_REGEX:
        return f"the regular expression is {len(text)} characters long (at most {MAX_REGEX})"
    try:
        re.compile(text)
    except re.error as exc:
        return f"{text!r} is not a regular expression: {exc}"
    return None


def _words(text: str) -> str | None:
    if not text.strip():
        return "is empty"
    return None if len(text) <= 200 else f"is {len(text)} characters long (at most 200)"


ModelId = Annotated[str, _grammar(_model_id)]


ServedName = Annotated[str, _grammar(_served_name)]


Flag = Annotated[str, _grammar(_flag)]


Argument = Annotated[str, _grammar(_argument)]


UrlPath = Annotated[str, _grammar(_url_path)]


Regex = Annotated[str, _grammar(_regex)]


Words = Annotated[str, _grammar(_words)]


Port = Annotated[int, Field(ge=1, le=65535)]


class EnvOverride(Strict):
    default: Argument = Field(description="the value the entrypoint uses when the variable is not set")
    description: Words = Field(description="what the variable changes, one line")

    @field_validator("default", mode="before")
    @classmethod
    def _text(cls, value: object) -> object:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f'{value!r} was read as a number; quote it so it stays as written, e.g. "{value}"')
        return value
