"""What a build takes from the host besides its context: the BuildKit secrets (a netrc with the stack's index
credentials) and the named context with the workspace's CA bundle (``builder/plan/cabundle.py``; the secret
``cabundle`` on an engine without named contexts), mounted into the steps that need them (never a build
argument, never in a layer)."""

from __future__ import annotations

from pathlib import Path
from typing import overload

from stackforge.builder.plan import cabundle
from stackforge.clients import credentials
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.stack.load import LoadedStack


def netrc_text(loaded: LoadedStack, workspace: Workspace | None = None) -> str:
    """netrc lines for the stack's indexes, from the workspace's resolver (``credentials.for_index``: the
    URL's own credentials split off at load time, STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD, ~/.netrc)."""
    ws = workspace_for(loaded, workspace)
    return credentials.netrc_entries(
        [(idx.url, ws.index_credential(loaded, name)) for name, idx in loaded.model.indexes.items()]
    )


@overload
def secret_files(
    loaded: LoadedStack, secrets_dir: Path, workspace: Workspace | None = None, *, ca_secret: bool = False
) -> list[tuple[str, Path]]: ...


@overload
def secret_files(
    loaded: LoadedStack, secrets_dir: None, workspace: Workspace | None = None, *, ca_secret: bool = False
) -> list[tuple[str, Path | None]]: ...


def secret_files(
    loaded: LoadedStack,
    secrets_dir: Path | None,
    workspace: Workspace | None = None,
    *,
    ca_secret: bool = False,
) -> list[tuple[str, Path]] | list[tuple[str, Path | None]]:
    """The BuildKit secrets of a build: a netrc with the index credentials (written into
    ``secrets_dir``, mode 600; ``None`` when no directory is given) and, with ``ca_secret`` (an engine
    without named contexts), the workspace's CA bundle."""
    ws = workspace_for(loaded, workspace)
    secrets: list[tuple[str, Path | None]] = []
    text = netrc_text(loaded, ws)
    if text:
        path = None
        if secrets_dir is not None:
            path = credentials.write_secret(secrets_dir / f"{loaded.name}.netrc", text)
        secrets.append(("netrc", path))
    bundle = ws.ca_bundle_file()
    if bundle is not None and ca_secret:
        secrets.append((cabundle.SECRET_ID, bundle))
    return secrets


def host_inputs(
    loaded: LoadedStack, secrets_dir: Path, named_contexts: bool, workspace: Workspace | None = None
) -> tuple[list[tuple[str, Path]], dict[str, Path]]:
    """The secrets and named contexts of one build, written into ``secrets_dir`` (the caller removes it):
    the CA bundle as the named context ``stackforge-cabundle`` when the engine takes ``named_contexts``,
    else as the secret ``cabundle``."""
    ws = workspace_for(loaded, workspace)
    secrets = secret_files(loaded, secrets_dir, ws, ca_secret=not named_contexts)
    bundle = ws.ca_bundle_file()
    contexts = cabundle.write_context(bundle, secrets_dir) if bundle is not None and named_contexts else {}
    return secrets, contexts
