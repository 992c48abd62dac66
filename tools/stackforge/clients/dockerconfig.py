"""The docker client's ``config.json`` and a credential helper's answer, as typed models read within their bounds
(kept apart from ``credentials``, which the no-op build path imports without pydantic)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from stackforge import safeio
from stackforge.clients.credentials import DOCKER_CONFIG_LIMIT


class AuthEntry(BaseModel):
    model_config = ConfigDict(extra="allow")
    auth: str | None = None


class DockerConfig(BaseModel):
    """The keys of the docker client's ``config.json`` stackforge reads (the others are kept unread)."""

    model_config = ConfigDict(extra="allow")
    auths: dict[str, AuthEntry] = Field(default_factory=dict)
    credHelpers: dict[str, str] = Field(default_factory=dict)
    credsStore: str | None = None


class HelperAnswer(BaseModel):
    """A credential helper's answer to ``get``."""

    model_config = ConfigDict(extra="allow", strict=True)
    Username: str
    Secret: str


def read_docker_config(path: Path) -> DockerConfig | None:
    """The docker client config at ``path`` read within its bounds; None when there is none. A config that is
    not one (not a regular file, too large, not JSON, a key of the wrong type) is a UserError naming it."""
    if not os.path.lexists(path):
        return None
    fix = "repair it (docker login rewrites it), or point DOCKER_CONFIG at another directory"
    try:
        return safeio.load_model(DockerConfig, path, what="docker config", limit=DOCKER_CONFIG_LIMIT)
    except safeio.Malformed as exc:
        exc.fix = fix
        raise
