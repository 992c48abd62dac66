"""Can this host build the stack? The engine, and every endpoint the stack needs, checked at once.

``diagnose(loaded, workspace)`` checks, concurrently and each with a timeout:

- the engine: the docker CLI and daemon, buildx, the builder's BuildKit and whether it honours
  ``SOURCE_DATE_EPOCH`` (a stack-independent check, done once per run);
- the base image: present in the engine, else its manifest in its registry (Docker Hub for a reference
  without a host);
- every git upstream: ``git ls-remote`` of its URL for the pinned tag (a local repository: the pinned
  commit is in it), with the credential the workspace resolves for it;
- every package index: the project page of one package the stack takes from it, with its credential
  (HTTP 401/403 is "credentials missing or refused"; a 404 names the package);
- every apt source of a system layer (stack and targets): ``dists/<suite>/InRelease`` or ``Release``.

Each failed check carries the ``--set`` key that redirects it and its ``make image ARGS='--set …'``
spelling. Nothing secret is printed: URLs are redacted, credentials travel only in the requests (and only to
the origin they are for).

The timeout is per check, start to end, not per read: an endpoint check runs in a thread of its own and is
failed when it has not finished in time, whatever the server does (one byte a second, an endless page); its
reads are bounded in size (:mod:`stackforge.netread`).
"""

from __future__ import annotations

import functools
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urljoin

import requests

from stackforge import netread
from stackforge.clients.git import git
from stackforge.clients.index import IndexClient, IndexQueryError, ProjectNotFound
from stackforge.clients.registry import (
    RegistryClient,
    RegistryError,
    Repository,
    RetryPolicy,
    is_loopback_host,
    parse_repository,
)
from stackforge.clients.upstream import git_credential_env, resolve_git_url
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError, clip
from stackforge.grammar import split_host, split_tag
from stackforge.stack import tags
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import Stack, SystemLayer
from stackforge.urls import redact, redact_text
from stackforge.urls import split as split_credentials

OK, FAIL, SKIP = "ok", "fail", "skip"
DEFAULT_TIMEOUT = 10.0


@dataclass
class Check:
    """One row of the doctor's table."""

    stack: str  # "" for the engine
    check: str  # what was checked, e.g. "index mthreads"
    endpoint: str  # redacted
    status: str = SKIP  # ok | fail | skip
    detail: str = ""
    key: str | None = None  # the --set key that redirects it
    placeholder: str = "URL"  # what the key's value is
    seconds: float = 0.0
    run: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    limit: float | None = field(default=None, repr=False, compare=False)  # seconds the whole check may take

    @property
    def set_value(self) -> str | None:
        return f"{self.key}=<{self.placeholder}>" if self.key else None

    def fixes(self) -> tuple[str, str] | None:
        """(CLI spelling, make spelling) of the redirect, for a failed check with a key."""
        if self.status != FAIL or not self.key:
            return None
        value = self.set_value
        return f"--set {value}", f"make image STACK={self.stack} ARGS='--set {value}'"

    def to_json(self) -> dict:
        data = {k: v for k, v in asdict(self).items() if k != "run"}
        fixes = self.fixes()
        data["set"] = fixes[0] if fixes else None
        data["make"] = fixes[1] if fixes else None
        return data


# --------------------------------------------------------------------------- the checks


def engine_checks(workspace: Workspace) -> list[Check]:
    """The engine rows (no stack)."""

    def docker() -> str:
        if shutil.which("docker") is None:
            raise UserError("no docker CLI on PATH", fix="install the engine: make engine")
        try:
            version = workspace.engine.daemon_version(timeout=DEFAULT_TIMEOUT)
        except UserError as err:
            raise UserError(f"{err.message}; fix: {err.fix}") from None
        return f"server {version}"

    def buildkit() -> str:
        engine = workspace.engine
        sde = "yes" if engine.supports_source_date_epoch() else "no (needs BuildKit 0.11 or newer)"
        net = "yes" if engine.supports_run_network() else "no (needs BuildKit 0.11 or newer)"
        return (
            f"buildx {engine.buildx_version()}, BuildKit {engine.buildkit_version()}, SOURCE_DATE_EPOCH: {sde}, "
            f"RUN --network=none: {net}"
        )

    return [
        Check("", "engine", "docker", run=docker),
        Check("", "buildx", "docker buildx", run=buildkit),
    ]


def stack_checks(
    loaded: LoadedStack | ResolvedStack, workspace: Workspace, timeout: float = DEFAULT_TIMEOUT, *, engine: bool = True
) -> list[Check]:
    """One row per endpoint the stack needs (``engine=False``: the base image is asked of its registry only)."""
    stack = loaded.model
    name = stack.name
    rows = [_base_check(loaded.model, workspace if engine else None, timeout)]
    for uname, up in stack.upstreams.items():
        if up.git:
            rows.append(_git_check(loaded, workspace, uname, timeout))
    for iname in stack.indexes:
        rows.append(_index_check(loaded, workspace, iname, timeout))
    for row in rows:
        row.limit = timeout
    for path, layer in _system_layers(loaded.model):
        label = ".".join(path[-1:])
        for sname, src in layer.sources.items():
            row = Check(
                name,
                f"apt {label}.{sname}",
                redact(src.url),
                key=".".join((*path, "sources", sname, "url")),
                run=functools.partial(_apt, src.url, src.suite, timeout),
                limit=timeout,
            )
            rows.append(_unless_never(row, layer))
        if layer.mirror is not None:
            row = Check(
                name,
                f"apt {label} mirror",
                redact(layer.mirror.to),
                key=".".join((*path, "mirror", "to")),
                run=functools.partial(_reachable, layer.mirror.to, timeout),
                limit=timeout,
            )
            rows.append(_unless_never(row, layer))
    return rows


def _unless_never(row: Check, layer: SystemLayer) -> Check:
    """A layer that never installs needs none of its endpoints: its rows are skipped, saying why."""
    if layer.install == "never":
        row.run = None
        row.detail = "not needed: the layer's install is never"
    return row


def _base_check(
    stack: Stack, workspace: Workspace | None, timeout: float, check: str = "base image", key: str = "base.image"
) -> Check:
    image = stack.base.image

    def run() -> str:
        if workspace is not None and workspace.engine.image_exists(image):
            return "present in the engine"
        digest = registry_digest(image, timeout)
        return f"not in the engine; its registry has it ({digest})" if workspace else f"its registry has it ({digest})"

    return Check(stack.name, check, image, key=key, placeholder="IMAGE", run=run)


def line_base_checks(
    stack: LoadedStack | ResolvedStack,
    lines: Sequence[LoadedStack | ResolvedStack],
    workspace: Workspace,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Check]:
    """A ``base image`` row for each of ``lines`` (platform lines of ``stack`` that will be built) whose base is
    not the stack's own: present in the engine, or its registry has it."""
    rows = []
    for line in lines:
        if line.line is None or line.line.own or line.model.base.image == stack.model.base.image:
            continue
        name = line.line.name
        row = _base_check(line.model, workspace, timeout, f"base image ({name})", f"platforms.{name}.with.base.image")
        row.limit = timeout
        rows.append(row)
    return rows


def probe_policy(timeout: float) -> RetryPolicy:
    """How a registry probe tries: twice, the second try at most 0.1 s after the first, all within ``timeout``: one
    transient fault (a connection reset, a 503) is not a failed check, and an unreachable registry still answers
    at once."""
    return RetryPolicy(attempts=2, base_delay=0.1, max_delay=0.1, total_seconds=timeout)


def registry_digest(image: str, timeout: float) -> str | None:
    """The manifest digest ``image``'s registry answers for it (Docker Hub for a reference without a host);
    a UserError when the registry cannot be reached or does not have it."""

    name, _, digest = image.partition("@")
    host, path = split_host(name)
    path, tag = split_tag(path)
    if host is None or host in ("docker.io", "index.docker.io"):
        host, path = "registry-1.docker.io", path if "/" in path else f"library/{path}"
    repo = Repository(host=host, name=path, scheme="http" if is_loopback_host(host) else "https")
    client = RegistryClient(repo, policy=probe_policy(timeout), timeout=(timeout, timeout))
    try:
        info = client.head_manifest(digest or tag or "latest")
    except (RegistryError, requests.RequestException) as exc:
        raise UserError(f"its registry cannot be asked: {clip(redact_text(str(exc)))}") from None
    if info is None:
        raise UserError(f"its registry {host} has no {path}:{digest or tag or 'latest'}")
    return info.digest


def _git_check(loaded: LoadedStack | ResolvedStack, workspace: Workspace, uname: str, timeout: float) -> Check:
    up = loaded.model.upstreams[uname]
    url, in_url = split_credentials(str(up.git))

    def run() -> str:
        target = resolve_git_url(url, loaded.root)
        if (
            not target.startswith(("http://", "https://", "ssh://", "git://", "file://"))
            and "@" not in target.split("/")[0]
        ):
            # A local repository: the pinned commit must be in it.
            res = git(target, "cat-file", "-e", f"{up.commit}^{{commit}}", check=False)
            if not res.ok:
                raise UserError(f"the pinned commit {up.commit} is not in the local repository")
            return "local repository holds the pinned commit"
        credential = in_url or loaded.credentials.for_url(target)
        args = ["ls-remote", target] + ([f"refs/tags/{up.tag}"] if up.tag else [])
        res = git(None, *args, check=False, env=git_credential_env(target, credential), timeout=timeout)
        if not res.ok:
            raise UserError(redact_text(res.output.strip().splitlines()[-1] if res.output.strip() else "git failed"))
        if up.tag and not res.stdout.strip():
            raise UserError(f"reachable, but it has no tag {up.tag}")
        return f"reachable{', tag ' + up.tag + ' present' if up.tag else ''}"

    return Check(loaded.name, f"git {uname}", redact(url), key=f"upstreams.{uname}.git", run=run)


def _index_check(loaded: LoadedStack | ResolvedStack, workspace: Workspace, iname: str, timeout: float) -> Check:
    stack = loaded.model
    idx = stack.indexes[iname]
    served = [p for p, pkg in stack.packages.items() if pkg.index == iname]
    project = served[0] if served else None

    def run() -> str:
        client = IndexClient(
            idx.url, credential=loaded.credentials.for_index(iname), timeout=timeout, page_seconds=timeout
        )
        if project is None:
            status = _status(client.url, timeout, auth=client.auth, params=client.params_for(client.url))
            if status in (401, 403):
                raise UserError(f"HTTP {status} (credentials missing or refused)")
            if status >= 400:
                raise UserError(f"HTTP {status}")
            return f"reachable (HTTP {status})"
        try:
            page = client.project(project)
        except ProjectNotFound:
            raise UserError(f"reachable, but it does not serve {project} (HTTP 404)") from None
        except IndexQueryError as err:
            shown = redact(client.project_url(project))
            message = err.message.replace(f"cannot reach {shown}", "cannot reach it").replace(f"{shown}: ", "")
            found = REASON.search(message)
            if message.startswith("cannot reach it") and found:
                message = f"cannot reach it: {found.group(0)}"
            raise UserError(message) from None
        return f"serves {project} ({len(page.files)} files)"

    fix = "INDEX-URL"
    return Check(loaded.name, f"index {iname}", redact(idx.url), key=f"indexes.{iname}.url", placeholder=fix, run=run)


def _system_layers(stack: Stack) -> Iterable[tuple[tuple[str, ...], SystemLayer]]:
    """(key path, layer) of every system layer: the stack's, then each target's."""
    for lname, layer in (stack.system or {}).items():
        yield ("system", lname), layer
    for tname, target in stack.targets.items():
        for lname, layer in (target.system or {}).items():
            yield ("targets", tname, "system", lname), layer


REASON = re.compile(
    r"Failed to resolve '[^']*'|Name or service not known|Connection refused|Read timed out|timed out|"
    r"No route to host|Network is unreachable|certificate verify failed[^)\"]*|Connection reset by peer"
)


def reason(exc: BaseException) -> str:
    """The cause of a request failure in a few words (requests nests it deep in its message)."""
    text = redact_text(str(exc))
    found = REASON.search(text)
    return f"{type(exc).__name__}: {found.group(0) if found else text[-160:]}"


def _status(
    url: str,
    timeout: float,
    deadline: netread.Deadline | None = None,
    auth: tuple[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> int:
    """The HTTP status of a GET of ``url`` within ``deadline`` (else ``timeout`` from now); its body is not
    kept (a short one is read to free the connection). ``auth`` goes only to ``url``'s own origin."""
    deadline = deadline or netread.Deadline(timeout, "one check")
    try:
        with netread.guard(deadline, url):
            resp = netread.session(trust_env=True).get(
                url, auth=auth, params=params, timeout=deadline.timeout(timeout), stream=True
            )
            netread.release(resp, deadline)
    except netread.Exceeded:
        raise UserError(f"cannot reach it: timed out (no answer within {deadline.seconds:g} s)") from None
    except requests.RequestException as exc:
        raise UserError(f"cannot reach it: {reason(exc)}") from None
    return resp.status_code


def _reachable(url: str, timeout: float) -> str:
    status = _status(url, timeout)
    if status >= 400:
        raise UserError(f"HTTP {status}")
    return f"reachable (HTTP {status})"


def _apt(url: str, suite: str, timeout: float) -> str:
    base = url.rstrip("/") + "/"
    last = ""
    deadline = netread.Deadline(timeout, "one check")  # both files within one timeout
    for name in ("InRelease", "Release"):
        status = _status(urljoin(base, f"dists/{suite}/{name}"), timeout, deadline)
        if status == 200:
            return f"suite {suite} ({name})"
        last = f"HTTP {status} for dists/{suite}/{name}"
    raise UserError(f"reachable, but no suite {suite}: {last}")


# --------------------------------------------------------------------------- running


GRACE = 0.5  # past a check's limit, before it is failed from outside (its own reads give up at the limit)


def _outcome(row: Check) -> tuple[str, str, float]:
    """(status, detail, seconds) of running ``row``'s check; a UserError (or any error) is its failure."""
    assert row.run is not None
    started = time.monotonic()
    try:
        detail, status = row.run(), OK
    except UserError as err:
        status, detail = FAIL, err.message
    except Exception as exc:  # a check must never take the table down with it
        status, detail = FAIL, f"{type(exc).__name__}: {clip(redact_text(str(exc)))}"
    return status, detail, round(time.monotonic() - started, 2)


def _one(row: Check) -> Check:
    if row.run is not None:  # else skipped; the detail says why
        row.status, row.detail, row.seconds = _outcome(row)
    return row


def _within_limits(rows: list[Check]) -> None:
    """Run the rows with a limit each in a thread of its own (a daemon: one stuck in a read is left behind) and
    fail every one not done within its limit."""
    started = time.monotonic()
    outcomes: dict[int, tuple[str, str, float]] = {}

    def work(i: int, row: Check) -> None:
        outcomes[i] = _outcome(row)

    threads = [threading.Thread(target=work, args=(i, row), daemon=True) for i, row in enumerate(rows)]
    for thread in threads:
        thread.start()
    for i, (row, thread) in enumerate(zip(rows, threads)):
        assert row.limit is not None
        thread.join(max(0.0, started + row.limit + GRACE - time.monotonic()))
        if i in outcomes:
            row.status, row.detail, row.seconds = outcomes[i]
        else:
            row.status, row.seconds = FAIL, round(time.monotonic() - started, 2)
            row.detail = f"timed out: no answer within {row.limit:g} s (the limit for one check)"


def run_checks(rows: list[Check], *, workers: int = 8) -> list[Check]:
    """Run every row's check concurrently: the engine's on ``workers`` threads, each endpoint's (a row with a
    ``limit``) in its own thread, failed when it is not done within that limit."""
    rest = [r for r in rows if r.limit is None or r.run is None]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rest) or 1))) as pool:
        done = pool.map(_one, rest)
        _within_limits([r for r in rows if r.limit is not None and r.run is not None])
        list(done)
    return rows


_PUSH_FIX = (
    "check --registry, and the push credential (STACKFORGE_REGISTRY_USER/_PASSWORD, or the docker config's login)"
)


def registry_check(loaded: LoadedStack | ResolvedStack, registry: str, timeout: float = DEFAULT_TIMEOUT) -> Check:
    """Can this host push the stack's image to ``registry``: the registry answers and takes the credentials (an
    upload started and cancelled in the repository the publisher uses; nothing is stored)."""
    repository = tags.publish_ref(loaded, registry).repository

    def run() -> str:
        client = RegistryClient(
            parse_repository(repository, what="--registry"),
            policy=probe_policy(timeout),
            timeout=(timeout, timeout),
        )
        try:
            client.check_push()
        except (RegistryError, requests.RequestException) as exc:
            raise UserError(f"{clip(redact_text(str(exc)))}; fix: {_PUSH_FIX}") from None
        return "answers, and accepts a push (an upload started and cancelled)"

    return Check(loaded.name, "registry push", redact(repository), run=run, limit=timeout)


def registry_only_check(registry: str, timeout: float = DEFAULT_TIMEOUT) -> Check:
    """``doctor --registry R`` without a stack: can this host push to the repository ``R`` names (the registry
    answers and takes the credentials: an upload started and cancelled there). ``R`` without a repository path
    is refused: nothing can be pushed to a bare host, and which repository a stack's image goes to under it is
    the stack's to say."""
    try:
        repository = parse_repository(registry, what="--registry")
    except UserError as err:
        raise UserError(
            f"without a stack, doctor checks a push to the repository --registry names: {err.message}",
            file="--registry",
            fix="name the repository to check a push to (--registry HOST[:PORT]/PATH), or a stack "
            "(stackforge doctor STACK --registry R) to check the repository its image is published to",
        ) from None

    def run() -> str:
        client = RegistryClient(repository, policy=probe_policy(timeout), timeout=(timeout, timeout))
        try:
            client.check_push()
        except (RegistryError, requests.RequestException) as exc:
            raise UserError(f"{clip(redact_text(str(exc)))}; fix: {_PUSH_FIX}") from None
        return "answers, and accepts a push here (an upload started and cancelled)"

    return Check("", "registry push", redact(registry.strip().rstrip("/")), run=run, limit=timeout)


def diagnose(
    stacks: Sequence[LoadedStack | ResolvedStack],
    workspace: Workspace,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    engine: bool = True,
    registry: str | None = None,
) -> list[Check]:
    """Every row for these stacks (and the engine, once), checked; with ``registry``, each stack's push to it
    (without a stack: a push to the repository ``registry`` names)."""
    alone = registry_only_check(registry, timeout) if registry and not stacks else None
    host = run_checks(engine_checks(workspace)) if engine else []
    answers = all(r.status == OK for r in host)
    rows: list[Check] = []
    for loaded in stacks:
        rows += stack_checks(loaded, workspace, timeout, engine=engine)
        rows += [registry_check(loaded, registry, timeout)] if registry else []
    for row in rows:
        if row.check == "base image" and not answers:  # asked of the engine first: not a fault of the image
            row.run, row.key, row.detail = None, None, "not checked: the engine does not answer (its row above)"
    return host + run_checks(rows + ([alone] if alone else []))


def render_table(rows: list[Check]) -> str:
    """The table the CLI prints: one line per check, and under each failure the redirect in both spellings."""
    width = max([len(r.check) for r in rows] + [5])
    lines = []
    current = None
    for r in rows:
        if r.stack != current:
            current = r.stack
            lines.append(f"{r.stack or 'host'}:")
        lines.append(f"  {r.status:<4}  {r.check:<{width}}  {r.endpoint}: {r.detail}")
        fixes = r.fixes()
        if fixes:
            lines.append(f"        {'':<{width}}  redirect: {fixes[0]}")
            lines.append(f"        {'':<{width}}        or: {fixes[1]}")
    failed = sum(r.status == FAIL for r in rows)
    lines.append(f"doctor: {len(rows) - failed} ok, {failed} failed")
    return "\n".join(lines)


def exit_code(rows: list[Check]) -> int:
    return 1 if any(r.status == FAIL for r in rows) else 0
