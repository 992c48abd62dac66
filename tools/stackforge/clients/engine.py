"""The build engine: BuildKit driven through ``docker buildx``.

Everything else in stackforge talks to the engine through :class:`Engine`'s verbs (``run``, ``exec``, ``pull``,
``tag``, ``inspect_image``, …: typed arguments, a docker ``run`` as a
:class:`~stackforge.clients.containers.RunSpec`); nothing else spawns ``docker`` or hands it a command line
(``cli``, ``stream`` and ``sdk`` are this floor's own: scripts/layers.py refuses them, and any import of the
docker SDK, elsewhere). Builds go through the ``docker buildx`` CLI (the Python SDK has no buildx); image queries
(:meth:`Engine.image_attrs`, ``image_labels``, ``image_config``, ``image_created``, ``image_layers``) also go through the CLI so that
they always reach the same daemon as the builds (the CLI honours docker contexts, the SDK does not).
:meth:`Engine.sdk` is a docker SDK client bound to that same daemon, for what this floor asks the API directly
(the streamed export of :meth:`Engine.export_image`, the layer and content stores' questions).

The pure half (argument assembly, version parsing) is separate functions so it can
be unit-tested without an engine.

Secrets (private-index credentials) are passed only as BuildKit secrets (``--secret id=…,src=…``):
they are mounted at ``/run/secrets/<id>`` for the RUN steps that ask for them and never land in a layer
or in the image history. Named build contexts (``--build-context NAME=DIR``) carry host files that are
not private, e.g. the CA bundle, to a read-only bind mount of the steps that need them.
Build args do land in the history, so :meth:`BuildCommand.argv` refuses build args that
look like credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from stackforge import progress, safeio, signals
from stackforge.clients import credentials
from stackforge.clients import proc as bounded
from stackforge.clients.containers import RunSpec
from stackforge.errors import BuildFailed, UserError, clip, printable
from stackforge.urls import redact_text

SETUP_FIX = "run scripts/engine-setup.sh (as root on Debian it installs and starts dockerd + buildx)"

#: BuildKit needs this for ``RUN --mount=type=cache|secret`` (without a ``# syntax=`` line).
MIN_BUILDKIT = (0, 8)
#: First BuildKit release that honours SOURCE_DATE_EPOCH.
SOURCE_DATE_EPOCH_BUILDKIT = (0, 11)
#: First BuildKit whose built-in Dockerfile frontend takes ``RUN --network=none`` without a ``# syntax=`` line
#: (the flag left the labs channel in Dockerfile 1.3, BuildKit 0.9; 0.11 is the first release we run it on).
RUN_NETWORK_BUILDKIT = (0, 11)
#: First BuildKit whose built-in Dockerfile frontend (1.4) takes named build contexts (``--build-context``,
#: ``RUN --mount=type=bind,from=NAME``).
NAMED_CONTEXT_BUILDKIT = (0, 10)
#: First buildx whose ``bake`` checks the files a bake definition reads outside the working directory (a warning
#: in 0.19, refused from 0.20 unless each is granted with ``--allow=fs.read=PATH``); older ones refuse that flag.
BAKE_READS_BUILDX = (0, 19)
#: BuildKit embedded in each Docker Engine major release, for the ``docker`` driver when the builder reports
#: no usable version (distribution builds, e.g. Debian's, say ``v0.0.0+unknown``).
DOCKER_EMBEDDED_BUILDKIT = {20: (0, 8), 23: (0, 11), 24: (0, 12), 25: (0, 12), 26: (0, 13), 27: (0, 15), 28: (0, 20)}

_SECRET_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREDENTIAL_NAME = re.compile(r"(PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|API_?KEY)", re.I)
_URL_WITH_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]+:[^/@\s]+@", re.I)


# --------------------------------------------------------------------------- pure helpers


def parse_version(text: str) -> tuple[int, ...]:
    """``"v0.13.1+ds1"`` -> ``(0, 13, 1)``; ``"v0.8+unknown"`` -> ``(0, 8)``."""
    m = re.search(r"v?(\d+(?:\.\d+)*)", text or "")
    if not m:
        raise ValueError(f"no version number in {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def effective_buildkit(reported: str | None, driver: str | None, server_version: str | None) -> tuple[int, int]:
    """The BuildKit (major, minor) a builder runs: what it reports, or for the ``docker`` driver with no usable
    version (``v0.0.0+unknown``) the one embedded in the daemon's Docker Engine release. ``(0, 0)`` when
    neither says."""
    try:
        parts = parse_version(reported or "") + (0, 0)
        level = (parts[0], parts[1])
    except ValueError:
        level = (0, 0)
    if level > (0, 0) or driver != "docker" or not server_version:
        return level
    try:
        major = parse_version(server_version)[0]
    except ValueError:
        return (0, 0)
    known = [m for m in DOCKER_EMBEDDED_BUILDKIT if m <= major]
    return DOCKER_EMBEDDED_BUILDKIT[max(known)] if known else (0, 0)


def parse_buildx_version(output: str) -> str:
    """Version from ``docker buildx version`` output.

    ``github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3`` -> ``0.13.1+ds1``;
    ``github.com/docker/buildx v0.17.1 257815a`` -> ``0.17.1``.
    """
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "buildx" in parts[0]:
            return parts[1].removeprefix("v")
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?\S*)", output)
    if not m:
        raise ValueError(f"cannot read a buildx version from {output!r}")
    return m.group(1)


def parse_buildx_inspect(output: str) -> dict[str, str | None]:
    """Builder name, driver, status and BuildKit version from ``docker buildx inspect``.

    Handles both the old (``Buildkit: v0.8``) and the new (``BuildKit version: v0.8``) layout.
    """
    info: dict[str, str | None] = {"name": None, "driver": None, "status": None, "buildkit": None}
    for line in output.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "name" and info["name"] is None:
            info["name"] = value
        elif key == "driver" and info["driver"] is None:
            info["driver"] = value
        elif key == "status" and info["status"] is None:
            info["status"] = value
        elif key in ("buildkit", "buildkit version") and value and info["buildkit"] is None:
            info["buildkit"] = value
    return info


#: a build cache record's id as BuildKit lists it (``docker buildx du``)
_RECORD_ID = re.compile(r"^[a-z0-9]{10,64}$")


def parse_cache_mounts(output: str) -> list[tuple[str, str]]:
    """(record id, cache mount id) of each record ``docker buildx du --verbose`` lists with a ``Description`` of
    a cache mount (``cached mount /root/.cache/pip from exec … with id "/stackforge-pip"``; the engine's built-in
    builder prefixes the id with ``/``). A record whose id or description does not read so is left out."""
    found: list[tuple[str, str]] = []
    for block in output.split("\n\n"):
        fields = dict(line.partition(":")[::2] for line in block.splitlines() if ":" in line)
        record = fields.get("ID", "").strip()
        m = re.search(r' with id "/?([^"]+)"$', fields.get("Description", "").strip())
        if m and _RECORD_ID.match(record):
            found.append((record, m.group(1)))
    return found


def parse_buildx_endpoint(output: str) -> str | None:
    """The endpoint of the first node ``docker buildx inspect`` lists: a docker context's name, or an address
    (``unix://…``, ``tcp://…``) for the builders buildx runs itself."""
    nodes = False
    for line in output.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key.strip().lower() == "nodes":
            nodes = True
        elif nodes and key.strip().lower() == "endpoint" and value.strip():
            return value.strip()
    return None


def check_build_args(build_args: Mapping[str, str]) -> None:
    """Refuse build args that would leak a credential into the image history."""
    for name, value in build_args.items():
        if not _ARG_NAME.match(name):
            raise UserError(f"invalid build arg name {name!r}", fix="use letters, digits and underscores")
        if _CREDENTIAL_NAME.search(name):
            raise UserError(
                f"build arg {name} looks like a credential; build args are recorded in the image history",
                fix=f"pass it as a BuildKit secret instead (secrets=[('{name.lower()}', PATH)]) "
                "and read /run/secrets/<id> in the RUN step that needs it",
            )
        if _URL_WITH_PASSWORD.search(str(value)):
            raise UserError(
                f"build arg {name} holds a URL with a password; build args are recorded in the image history",
                fix="drop the credentials from the URL and pass them as a BuildKit secret",
            )


@dataclass(frozen=True)
class BuildCommand:
    """A ``docker buildx build``: its options; :meth:`argv` is the command (no I/O, no validation of paths)."""

    context: str | os.PathLike
    dockerfile: str | os.PathLike | None = None
    target: str | None = None
    tags: Sequence[str] = ()
    build_args: Mapping[str, str] | None = None
    secrets: Iterable[tuple[str, str | os.PathLike]] = ()
    contexts: Mapping[str, str | os.PathLike] | None = None
    labels: Mapping[str, str] | None = None
    load: bool = True
    progress: str = "plain"
    metadata_file: str | os.PathLike | None = None
    builder: str | None = None
    no_cache: bool = False
    extra_args: Sequence[str] = ()
    docker: str = "docker"
    platform: str | None = None  # the OCI platform to build for (linux/arm64), when not the builder's own

    def argv(self) -> list[str]:
        """The argv. Secrets become ``--secret id=ID,src=PATH`` and nothing else, named contexts
        ``--build-context NAME=DIR``; build args are checked with :func:`check_build_args`."""
        args = dict(self.build_args or {})
        check_build_args(args)
        cmd = [self.docker, "buildx"]
        if self.builder:
            cmd += ["--builder", self.builder]
        cmd += ["build", f"--progress={self.progress}"]
        if self.platform:
            cmd += ["--platform", self.platform]
        if self.dockerfile is not None:
            cmd += ["--file", os.fspath(self.dockerfile)]
        if self.target:
            cmd += ["--target", self.target]
        for tag in self.tags:
            cmd += ["--tag", tag]
        for name in args:
            cmd += ["--build-arg", f"{name}={args[name]}"]
        seen: set[str] = set()
        for sid, src in self.secrets:
            if not _SECRET_ID.match(sid):
                raise UserError(f"invalid secret id {sid!r}", fix="use letters, digits, '.', '_' and '-'")
            if sid in seen:
                raise UserError(f"secret id {sid!r} given twice")
            seen.add(sid)
            src = os.fspath(src)
            if "," in src:
                raise UserError(
                    f"secret {sid}: path {src!r} contains a comma, which buildx cannot parse",
                    fix="move the file to a path without commas",
                )
            cmd += ["--secret", f"id={sid},src={src}"]
        for name, path in (self.contexts or {}).items():
            if not _SECRET_ID.match(name):
                raise UserError(f"invalid build context name {name!r}", fix="use letters, digits, '.', '_' and '-'")
            cmd += ["--build-context", f"{name}={os.fspath(path)}"]
        for key, value in (self.labels or {}).items():
            cmd += ["--label", f"{key}={value}"]
        if self.load:
            cmd.append("--load")
        if self.no_cache:
            cmd.append("--no-cache")
        if self.metadata_file is not None:
            cmd += ["--metadata-file", os.fspath(self.metadata_file)]
        cmd += list(self.extra_args)
        cmd.append(os.fspath(self.context))
        return cmd


def bake_command(
    plan_file: str | os.PathLike[str],
    *,
    builder: str | None = None,
    no_cache: bool = False,
    metadata_file: str | os.PathLike[str] | None = None,
    targets: Sequence[str] | None = None,
    docker: str = "docker",
    reads: Sequence[str | os.PathLike[str]] = (),
) -> list[str]:
    """The ``docker buildx bake`` argv of a bake file (``targets``: the ones to build, default all; ``reads``: the
    files and directories it may read, each granted by its own ``--allow=fs.read``)."""
    cmd = [docker, "buildx"]
    if builder:
        cmd += ["--builder", builder]
    cmd += ["bake", "--file", os.fspath(plan_file), "--progress=plain"]
    cmd += [f"--allow=fs.read={os.fspath(path)}" for path in reads]
    if no_cache:
        cmd.append("--no-cache")
    if metadata_file is not None:
        cmd += ["--metadata-file", os.fspath(metadata_file)]
    return cmd + list(targets or [])


# --------------------------------------------------------------------------- engine


class BuildResult(NamedTuple):
    """Outcome of :meth:`Engine.build`; unpacks as ``(returncode, log)``."""

    returncode: int
    log: str


#: what one docker CLI command may print (an inspect of every image, a container's answer through exec)
CLI_OUTPUT_LIMIT = 256 << 20


@dataclass(frozen=True)
class EngineInfo:
    server_version: str
    buildx_version: str
    builder: str | None
    driver: str | None
    buildkit_version: str | None


class Engine:
    """BuildKit via ``docker buildx``.

    ``docker`` is the CLI to run; ``builder`` selects a buildx builder (default: the
    current one, ``default`` on a plain dockerd).
    """

    def __init__(
        self,
        docker: str = "docker",
        builder: str | None = None,
        env: Mapping[str, str] | None = None,
        memo: Path | None = None,
    ):
        self.docker = docker
        #: the directory where facts read the slow way are remembered (:meth:`config_digest`); None: not kept
        self.memo = memo
        self.builder = builder
        self.env = dict(os.environ if env is None else env)
        self._inspect: dict[str, str | None] | None = None
        self._server: str | None = None
        self._buildx_version: str | None = None  # the plugin's, asked once per engine object
        self._config_checked = False
        self._bound = builder is None
        #: held while the builder's context is chosen: threads sharing this engine (the platforms of one verify) wait
        #: for it, never running a command in the context it replaces (re-entrant: the choice runs docker itself)
        self._binding = threading.RLock()
        self._choosing = False
        self._containerd_store: bool | None = None

    def _bind(self) -> None:
        """A ``docker``-driver builder of another docker context (a second engine, scripts/second-engine.sh) builds
        into that context's daemon, and buildx refuses it from any other context: every command of this engine
        (builds, images, containers, the SDK) then runs in that context. Other builders are left as they are (a
        docker-container, remote or kubernetes builder loads what it builds into the current context's daemon).
        Once per engine; another thread asking meanwhile waits for the choice."""
        with self._binding:
            if self._bound or self._choosing:
                return
            self._choosing = True
            try:
                self._choose_context()
            finally:
                self._bound, self._choosing = True, False

    def _choose_context(self) -> None:
        assert self.builder is not None
        proc = self.cli("buildx", "inspect", self.builder, timeout=30)
        if proc.returncode != 0:
            return  # check() says why
        info, endpoint = parse_buildx_inspect(proc.stdout), parse_buildx_endpoint(proc.stdout)
        if info.get("driver") != "docker" or not endpoint or "://" in endpoint:
            return
        current = self.cli("context", "show", timeout=10)
        if current.returncode == 0 and current.stdout.strip() != endpoint:
            self.env.pop("DOCKER_HOST", None)
            self.env["DOCKER_CONTEXT"] = endpoint

    @property
    def context(self) -> str | None:
        """The docker context this engine's commands run in when its builder chose one (None: the caller's)."""
        if not self._bound:
            self._bind()
        return self.env.get("DOCKER_CONTEXT") if self.builder else None

    # -- plumbing
    def _check_config(self) -> None:
        """The docker CLI reads its config.json before anything else and waits forever on a FIFO (a huge one it
        reads whole): such a config is refused here, once per engine, before the CLI is run."""
        if self._config_checked:
            return
        config = credentials.docker_config_file(self.env)
        if os.path.lexists(config):
            try:
                safeio.read_bytes(config, limit=credentials.DOCKER_CONFIG_LIMIT, what="docker config")
            except safeio.Malformed as exc:
                exc.fix = "repair it (docker login rewrites it), or point DOCKER_CONFIG at another directory"
                raise
        self._config_checked = True

    def cli(self, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``docker ARGS`` against this engine, bounded in time and in what it prints (its text decoded with
        undecodable bytes replaced: a container's answer through ``exec`` is not trusted to be UTF-8); engine
        trouble is a UserError."""
        if not self._bound:
            self._bind()
        argv = [self.docker, *args]
        self._check_config()
        try:
            done = bounded.run(argv, timeout=timeout, limit=CLI_OUTPUT_LIMIT, env=self.env)
        except FileNotFoundError:
            raise UserError(f"'{self.docker}' (the docker CLI) is not installed", fix=SETUP_FIX) from None
        if done.stopped == "timeout":
            raise UserError(f"'{self.docker} {' '.join(args)}' did not answer within {timeout:.0f} s", fix=SETUP_FIX)
        if done.stopped == "output":
            raise UserError(f"'{self.docker} {' '.join(args)}' printed more than {CLI_OUTPUT_LIMIT} bytes (stopped)")
        proc = subprocess.CompletedProcess(argv, done.returncode or 0, done.text(), done.text("stderr"))
        if check and proc.returncode != 0:
            raise UserError(f"'{self.docker} {' '.join(args)}' failed: {_last_line(proc.stderr)}", fix=SETUP_FIX)
        return proc

    def _merged(self, *args: str, timeout: float, limit: int = bounded.OUTPUT_LIMIT) -> subprocess.CompletedProcess:
        """``docker ARGS`` with stderr merged into stdout (undecodable bytes replaced): output a person reads, such
        as a container's log or a report command's, at most ``limit`` bytes of it. A timeout
        (``subprocess.TimeoutExpired``, its ``output`` what was printed), more output than ``limit``
        (:class:`bounded.Exceeded`) or a CLI that does not start (``OSError``) is raised, for the caller to record;
        the CLI is stopped either way (a container it started is the caller's to remove)."""
        if not self._bound:
            self._bind()
        argv = [self.docker, *args]
        self._check_config()
        done = bounded.run(argv, timeout=timeout, limit=limit, env=self.env, merge=True)
        if done.stopped == "timeout":
            raise subprocess.TimeoutExpired(argv, timeout, output=done.stdout)
        if done.stopped == "output":
            raise bounded.Exceeded(argv, limit, done.stdout)
        return subprocess.CompletedProcess(argv, done.returncode or 0, done.text(), None)

    def _buildx(self, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        pre = ["buildx", "--builder", self.builder] if self.builder else ["buildx"]
        return self.cli(*pre, *args, timeout=timeout, check=check)

    # -- checks and versions
    def check(self) -> EngineInfo:
        """Raise :class:`UserError` (with the fix) unless daemon, buildx and BuildKit are usable."""
        if shutil.which(self.docker, path=self.env.get("PATH")) is None and not os.path.isabs(self.docker):
            raise UserError("the docker CLI is not installed (no 'docker' on PATH)", fix=SETUP_FIX)
        info = self.cli("version", "--format", "{{.Server.Version}}", timeout=20)
        if info.returncode != 0 or not info.stdout.strip():
            raise daemon_error(info.stderr)
        self._server = info.stdout.strip()
        buildx = self.buildx_version()
        insp = self._inspect_builder()
        bk = insp.get("buildkit")
        if not bk:
            raise UserError(
                f"buildx builder {insp.get('name') or self.builder or 'default'} reports no BuildKit version "
                f"(status {insp.get('status')})",
                fix=f"check 'docker buildx inspect --bootstrap'; {SETUP_FIX}",
            )
        if self.buildkit_level() < MIN_BUILDKIT:
            raise UserError(
                f"BuildKit {bk} is too old; stackforge needs >= {'.'.join(map(str, MIN_BUILDKIT))}",
                fix="upgrade Docker Engine (>= 20.10) or use a newer buildx builder",
            )
        return EngineInfo(
            server_version=info.stdout.strip(),
            buildx_version=buildx,
            builder=insp.get("name"),
            driver=insp.get("driver"),
            buildkit_version=bk,
        )

    def _inspect_builder(self) -> dict[str, str | None]:
        if self._inspect is None:
            proc = self._buildx("inspect", timeout=30)
            if proc.returncode != 0:
                raise UserError(f"'docker buildx inspect' failed: {_last_line(proc.stderr)}", fix=SETUP_FIX)
            info = parse_buildx_inspect(proc.stdout)
            if not info.get("buildkit"):
                # A docker-container/remote builder that is not booted yet reports no version.
                proc = self._buildx("inspect", "--bootstrap", timeout=300)
                if proc.returncode == 0:
                    info = parse_buildx_inspect(proc.stdout)
            self._inspect = info
        return self._inspect

    def buildx_version(self) -> str:
        """The buildx plugin's version (``docker buildx version``, asked once: :meth:`check` and every bake use it)."""
        if self._buildx_version is None:
            proc = self.cli("buildx", "version", timeout=20)
            if proc.returncode != 0:
                raise UserError("the docker buildx plugin is missing ('docker buildx version' fails)", fix=SETUP_FIX)
            self._buildx_version = parse_buildx_version(proc.stdout)
        return self._buildx_version

    def buildkit_version(self) -> str:
        """BuildKit version of the current (or chosen) builder as it reports it, e.g. ``v0.8+unknown``; with the
        release it is taken for when that says nothing, e.g. ``v0.0.0+unknown (Docker 26: 0.13)``."""
        insp = self._inspect_builder()
        bk = insp.get("buildkit")
        if not bk:
            raise UserError("the buildx builder reports no BuildKit version", fix=SETUP_FIX)
        level = self.buildkit_level()
        if level != effective_buildkit(bk, None, None) and level > (0, 0):
            return f"{bk} (Docker {self.server_version()}: {level[0]}.{level[1]})"
        return bk

    def server_version(self) -> str:
        """The daemon's version (``docker version``), asked once."""
        if self._server is None:
            self._server = self.daemon_version()
        return self._server

    def daemon_version(self, timeout: float = 20) -> str:
        """The daemon's version, asked now (``docker version``); a daemon that does not answer is a UserError that
        says why (:func:`daemon_error`)."""
        proc = self.cli("version", "--format", "{{.Server.Version}}", timeout=timeout)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise daemon_error(redact_text(proc.stderr or proc.stdout or ""))
        return proc.stdout.strip()

    def server_platform(self) -> str:
        """The daemon's own OCI platform (``linux/amd64``) as ``docker version`` says it; empty when it does not."""
        proc = self.cli("version", "--format", "{{.Server.Os}}/{{.Server.Arch}}", timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def runtimes(self) -> tuple[str, ...]:
        """The container runtimes the daemon offers (``docker info``), sorted; none when it does not say."""
        proc = self.cli("info", "--format", "{{json .Runtimes}}", timeout=30)
        try:
            return tuple(sorted(json.loads(proc.stdout or "{}") or {})) if proc.returncode == 0 else ()
        except ValueError:
            return ()

    def buildkit_level(self) -> tuple[int, int]:
        """(major, minor) of the BuildKit the builds run on (see :func:`effective_buildkit`)."""
        insp = self._inspect_builder()
        server = self.server_version() if insp.get("driver") == "docker" else None
        return effective_buildkit(insp.get("buildkit"), insp.get("driver"), server)

    def supports_source_date_epoch(self) -> bool:
        """True when BuildKit honours SOURCE_DATE_EPOCH (0.11 and later)."""
        return self.buildkit_level() >= SOURCE_DATE_EPOCH_BUILDKIT

    def supports_run_network(self) -> bool:
        """True when the Dockerfile frontend takes ``RUN --network=none`` as it is."""
        return self.buildkit_level() >= RUN_NETWORK_BUILDKIT

    def supports_named_contexts(self) -> bool:
        """True when the Dockerfile frontend takes named build contexts (``RUN --mount=type=bind,from=NAME``)."""
        return self.buildkit_level() >= NAMED_CONTEXT_BUILDKIT

    # -- images
    def image_exists(self, ref: str) -> bool:
        return self.image_id(ref) is not None

    def image_id(self, ref: str) -> str | None:
        """``sha256:…`` id of a local image, or None when there is no such image."""
        proc = self.cli("image", "inspect", "--format", "{{.Id}}", ref, timeout=30)
        if proc.returncode != 0:
            if _no_such_image(proc.stderr):
                return None
            raise UserError(f"'docker image inspect {ref}' failed: {_last_line(proc.stderr)}", fix=SETUP_FIX)
        return proc.stdout.strip() or None

    def remove_image(self, ref: str, force: bool = False) -> bool:
        """Remove a local image (tag). Returns False when it did not exist."""
        if not self.image_exists(ref):
            return False
        args = ["image", "rm"] + (["--force"] if force else []) + [ref]
        self.cli(*args, timeout=60, check=True)
        return True

    def discard_image(self, ref: str, *, prune: bool = True) -> bool:
        """``docker image rm`` of a reference (``prune=False``: its untagged parents stay); a failure is not raised:
        True when it was removed."""
        args = ["image", "rm"] + ([] if prune else ["--no-prune"]) + [ref]
        return self.cli(*args, timeout=120).returncode == 0

    def inspect_image(self, ref: str, template: str, *, timeout: float = 30) -> subprocess.CompletedProcess:
        """``docker image inspect --format TEMPLATE REF``: the caller reads the exit status (no such image) and the
        answer."""
        return self.cli("image", "inspect", "--format", template, ref, timeout=timeout)

    def image_attrs(self, ref: str) -> dict[str, Any]:
        """What the engine knows of the local image ``ref`` (a name or an id), as its API reports it
        (``docker image inspect``: ``Id``, ``RepoTags``, ``RepoDigests``, ``Created``, ``Config``, ``Os``,
        ``Architecture``, ``Variant``, ``Size``, …). An image the engine does not hold is :class:`NoSuchImage`
        (naming ``ref``); an engine that cannot answer, or answers with something else than one image's
        description, is a :class:`UserError`."""
        proc = self.cli("image", "inspect", "--", ref, timeout=30)
        if proc.returncode != 0:
            if _no_such_image(proc.stderr):
                raise NoSuchImage(ref)
            raise UserError(f"'docker image inspect {ref}' failed: {_last_line(proc.stderr)}", fix=SETUP_FIX)
        return parse_image_attrs(ref, proc.stdout)

    def image_labels(self, ref: str) -> dict[str, str]:
        """The labels of the local image ``ref`` (its config's ``Labels``; none: empty); :class:`NoSuchImage` when
        the engine does not hold it."""
        return labels_of(self.image_attrs(ref))

    def image_config(self, ref: str) -> dict[str, Any]:
        """The ``Config`` of the local image ``ref`` (``Labels``, ``Env``, ``WorkingDir``, ``Cmd``, ``Entrypoint``, …;
        none: empty); :class:`NoSuchImage` when the engine does not hold it."""
        return config_of(self.image_attrs(ref))

    def image_created(self, ref: str) -> str | None:
        """When the local image ``ref`` says it was made (its ``Created``, RFC 3339 as the engine writes it); None
        when it does not say. :class:`NoSuchImage` when the engine does not hold it."""
        created = self.image_attrs(ref).get("Created")
        return created if isinstance(created, str) and created else None

    def image_layers(self, ref: str) -> list[str]:
        """The diff ids of the local image ``ref``'s layers, bottom first (its ``RootFS.Layers``; none: empty);
        :class:`NoSuchImage` when the engine does not hold it."""
        return layers_of(self.image_attrs(ref))

    def export_image(self, ref: str, *, chunk_size: int = 2 << 20) -> Iterator[bytes]:
        """The image archive of ``ref`` (``docker save``'s tar; pass an image id so that a re-tag meanwhile cannot
        change what is read) as it streams from the engine, ``chunk_size`` bytes at a time, without a temporary
        file. Nothing is asked before the first chunk is; an engine that refuses (no such image) or breaks off is
        a :class:`BuildFailed` naming ``ref``."""
        import docker.errors  # the SDK's stream of GET /images/{name}/get
        import requests

        try:
            yield from self.sdk().api.get_image(ref, chunk_size=chunk_size)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise BuildFailed(
                f"exporting {ref} from the engine failed: {clip(redact_text(str(exc)))}",
                fix="check the engine (docker info) and re-run",
            ) from None

    def image_ids(self, refs: Sequence[str]) -> list[str] | None:
        """The image id of each reference (one ``docker image inspect``); None when any is missing."""
        proc = self.cli("image", "inspect", "--format", "{{.Id}}", "--", *refs, timeout=30)
        ids = proc.stdout.split()
        return ids if proc.returncode == 0 and len(ids) == len(refs) else None

    def uses_containerd_store(self) -> bool:
        """Whether the daemon keeps its images in the containerd image store (``docker info``), asked once."""
        if self._containerd_store is None:
            proc = self.cli("info", "--format", "{{json .DriverStatus}}", timeout=30)
            if proc.returncode != 0:
                raise daemon_error(redact_text(proc.stderr or proc.stdout or ""))
            try:
                status = json.loads(proc.stdout or "null")
            except ValueError:
                status = None
            from stackforge.clients import contentstore

            self._containerd_store = contentstore.uses_containerd_store({"DriverStatus": status})
        return self._containerd_store

    def config_digest(self, image_id: str, platform: tuple[str, str, str | None] | None = None) -> str:
        """The digest of the config of the local image ``image_id``: the image's identity both image stores agree
        on. The classic store names an image by it; the containerd store by its manifest's or index's digest, so
        there it is read from the manifest of ``platform`` (os, architecture, variant; default: the image's own, as
        ``docker image inspect`` reports it): from the content store, else from the engine's export (remembered
        in ``memo``, so a remote engine exports an image once). One that cannot be read is a UserError."""
        if not self.uses_containerd_store():
            return image_id
        from stackforge.clients import contentstore, layerstore

        if platform is None:
            proc = self.inspect_image(image_id, '{{json .Os}} {{json .Architecture}} {{json (index . "Variant")}}')
            try:
                os_, arch, variant = (json.loads(word) for word in proc.stdout.split())
            except ValueError:
                os_ = arch = variant = None
            if proc.returncode != 0 or not os_ or not arch:
                raise UserError(f"'docker image inspect {image_id}' names no platform: {_last_line(proc.stderr)}")
            platform = (str(os_), str(arch), str(variant) if variant else None)
        try:
            return contentstore.config_digest(self, image_id, platform, self.memo)
        except layerstore.Unusable as exc:
            raise UserError(
                f"cannot read the config digest of image {image_id} ({'/'.join(p for p in platform if p)}) on the "
                f"containerd image store: {exc}",
                fix="check the engine (docker info) and that the image holds that platform (docker image inspect)",
            ) from None

    def tag(self, source: str, ref: str, *, check: bool = False) -> bool:
        """``docker tag SOURCE REF``; True when it was tagged (``check``: a failure is a UserError)."""
        return self.cli("tag", source, ref, timeout=60, check=check).returncode == 0

    def pull(self, ref: str, *, timeout: float = 1800) -> subprocess.CompletedProcess:
        """``docker pull REF``: the caller reads the exit status and says what a failure means to it."""
        return self.cli("pull", ref, timeout=timeout)

    def load(self, archive: str | os.PathLike[str], *, timeout: float = 3600) -> None:
        """``docker load`` of an image archive; a failure is a UserError."""
        self.cli("load", "--input", os.fspath(archive), timeout=timeout, check=True)

    def save(self, ref: str, out: str | os.PathLike[str], *, timeout: float = 3600) -> subprocess.CompletedProcess:
        """``docker save`` of ``ref`` into the file ``out`` (not atomic: see :func:`save_image`)."""
        return self.cli("save", "--output", os.fspath(out), ref, timeout=timeout)

    def history(self, ref: str) -> str:
        """``docker history --no-trunc`` of an image (every layer's command, untruncated)."""
        return self.cli("history", "--no-trunc", ref, timeout=30, check=True).stdout

    # -- containers
    def run(self, spec: RunSpec, *, timeout: float) -> subprocess.CompletedProcess:
        """``docker run`` of ``spec``, its stdout and stderr apart (a detached run prints the container's id); the
        caller reads the exit status."""
        return self.cli(*spec.argv(), timeout=timeout)

    def run_output(
        self, spec: RunSpec, *, timeout: float, limit: int = bounded.OUTPUT_LIMIT
    ) -> subprocess.CompletedProcess:
        """``docker run`` of ``spec`` with stderr merged into stdout, at most ``limit`` bytes of it: output a person
        reads (a report, a test run). A timeout (``subprocess.TimeoutExpired``), more output than ``limit``
        (:class:`bounded.Exceeded`) or a CLI that does not start (``OSError``) is raised, for the caller to record;
        a container that was named is the caller's to remove."""
        return self._merged(*spec.argv(), timeout=timeout, limit=limit)

    def exec(self, container: str, argv: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess:
        """``docker exec CONTAINER ARGV…``: a command in a running container; its answer is not trusted to be
        UTF-8 (undecodable bytes replaced)."""
        return self.cli("exec", container, *argv, timeout=timeout)

    def container_state(self, container: str, template: str) -> str | None:
        """``docker container inspect --format TEMPLATE``'s answer (e.g. ``{{.State.Running}}``); None when there
        is no such container."""
        proc = self.cli("container", "inspect", "--format", template, container, timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def container_logs(self, container: str, *, timeout: float = 60) -> str:
        """The container's log, stdout and stderr as they came; its head when it is over the output cap, empty
        when the engine cannot tell."""
        try:
            proc = self._merged("logs", container, timeout=timeout)
        except bounded.Exceeded as exc:
            return exc.output.decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return proc.stdout if proc.returncode == 0 else ""

    def port(self, container: str, port: int) -> list[str]:
        """The host addresses (``127.0.0.1:49153``) the container's TCP ``port`` is published on."""
        proc = self.cli("port", container, f"{port}/tcp", timeout=30)
        return (proc.stdout or "").splitlines()

    def stop(self, container: str, *, grace: int = 10) -> None:
        """``docker stop`` with ``grace`` seconds between SIGTERM and SIGKILL; a failure is not raised."""
        self.cli("stop", "--time", str(grace), container, timeout=grace + 60)

    def remove_container(self, container: str, *, volumes: bool = False) -> bool:
        """``docker rm --force`` (``volumes``: with its anonymous volumes); True when it was removed."""
        args = ["rm", "--force", *(["--volumes"] if volumes else []), container]
        return self.cli(*args, timeout=120).returncode == 0

    def create(self, image: str, *command: str) -> subprocess.CompletedProcess:
        """``docker create IMAGE COMMAND…`` (never started): its stdout is the container's id."""
        return self.cli("create", image, *command, timeout=120)

    def copy_out(self, container: str, source: str, dest: str | os.PathLike[str]) -> bool:
        """``docker cp CONTAINER:SOURCE DEST``; True when it copied."""
        return self.cli("cp", f"{container}:{source}", os.fspath(dest), timeout=120).returncode == 0

    # -- build cache
    def drop_cache_mounts(self, suffix: str) -> list[str]:
        """Remove the builder's cache mounts whose id ends with ``suffix`` (a clean build's own, once it has
        ended), one ``docker buildx prune --filter id=RECORD`` each; the records removed. A mount still in use
        stays; an engine that cannot list them removes nothing."""
        if not suffix:
            return []
        listed = self._buildx("du", "--verbose", "--filter", "type=exec.cachemount", timeout=120)
        if listed.returncode != 0:
            return []
        records = [record for record, mount in parse_cache_mounts(listed.stdout) if mount.endswith(suffix)]
        gone: set[str] = set()
        if len(records) > 1:
            # One prune for all: the engine's own builder reads an id filter as a regular expression (the daemon
            # hands BuildKit ``id~=…``), and lists what it removed. A builder that matches ids exactly removes
            # nothing here, and each record is then removed on its own.
            both = self._buildx("prune", "--force", "--filter", f"id=^({'|'.join(records)})$")
            if both.returncode == 0:
                listed_ids = {line.split()[0].rstrip("*") for line in both.stdout.splitlines() if line.strip()}
                gone = listed_ids & set(records)
        dropped = []
        for record in records:
            if record in gone or self._buildx("prune", "--force", "--filter", f"id={record}").returncode == 0:
                dropped.append(record)
        return dropped

    def sdk(self) -> Any:  # docker.DockerClient (the docker package has no type information)
        """A docker SDK client for the daemon the CLI uses (current context or DOCKER_HOST): ``clients/``'s own;
        everything else asks the engine's verbs."""
        import docker  # local import: only callers of sdk() need the package

        if self.env.get("DOCKER_HOST"):
            return docker.DockerClient(base_url=self.env["DOCKER_HOST"])
        proc = self.cli("context", "inspect", "--format", "{{.Endpoints.docker.Host}}", timeout=10)
        host = proc.stdout.strip() if proc.returncode == 0 else ""
        return docker.DockerClient(base_url=host or "unix:///var/run/docker.sock")

    # -- builds
    def build(
        self,
        context: str | os.PathLike,
        dockerfile: str | os.PathLike | None = None,
        *,
        secrets: Iterable[tuple[str, str | os.PathLike]] = (),
        contexts: Mapping[str, str | os.PathLike] | None = None,
        builder: str | None = None,
        on_line: Callable[[str], None] | None = None,
        log_file: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> BuildResult:
        """Run ``docker buildx build --progress=plain`` and stream its output.

        ``options`` are :class:`BuildCommand`'s (target, tags, build_args, contexts, labels, load, metadata_file,
        no_cache, extra_args, platform); ``builder`` defaults to the engine's. Each output line (without the newline) goes to ``on_line`` and to ``log_file``
        (appended, flushed per line) as it arrives. Returns ``(returncode, full log)``;
        a failing build is not an exception here (callers decide), a missing secret file, named context
        directory or engine is a :class:`UserError`.
        """
        secret_paths = [(sid, Path(src)) for sid, src in secrets]
        for sid, path in secret_paths:
            if not path.is_file():
                raise UserError(f"secret {sid}: file {path} does not exist", fix="create it or drop the secret")
        for name, directory in (contexts or {}).items():
            if not Path(directory).is_dir():
                raise UserError(f"build context {name}: directory {directory} does not exist", fix="create it")
        cmd = BuildCommand(
            context,
            dockerfile=dockerfile,
            secrets=secret_paths,
            contexts=contexts,
            builder=builder or self.builder,
            docker=self.docker,
            **options,
        ).argv()
        return self.stream(cmd, on_line=on_line, log_file=log_file, env=env)

    def bake(
        self,
        plan_file: str | os.PathLike[str],
        *,
        no_cache: bool = False,
        metadata_file: str | os.PathLike[str] | None = None,
        targets: Sequence[str] | None = None,
        on_line: Callable[[str], None] | None = None,
        log_file: str | os.PathLike[str] | None = None,
        reads: Sequence[str | os.PathLike[str]] = (),
    ) -> BuildResult:
        """``docker buildx bake`` of a bake file with this engine's builder, streamed as :meth:`build` streams;
        a failing bake is not raised. ``reads``: the contexts, Dockerfiles and secret files the definition names,
        granted to a buildx that checks them (and not named to one that would refuse the flag)."""
        grant = reads if parse_version(self.buildx_version()) >= BAKE_READS_BUILDX else ()
        cmd = bake_command(
            plan_file,
            builder=self.builder,
            no_cache=no_cache,
            metadata_file=metadata_file,
            targets=targets,
            docker=self.docker,
            reads=grant,
        )
        return self.stream(cmd, on_line=on_line, log_file=log_file)

    def stream(
        self,
        cmd: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        log_file: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BuildResult:
        """Run an engine command (build, bake), streaming each output line to ``on_line`` and ``log_file``
        (appended, flushed per line). Returns ``(returncode, full log)``; a failure is not raised."""
        self._check_config()
        if not self._bound:
            self._bind()
        run_env = dict(self.env)
        run_env.update(env or {})
        lines: list[str] = []
        with contextlib.ExitStack() as scope:
            log = scope.enter_context(open(log_file, "a", encoding="utf-8")) if log_file is not None else None
            if log:
                log.write("$ " + " ".join(cmd) + "\n")
                log.flush()
            signals.checkpoint()  # stopped work starts no build
            try:
                # Its own session: a signal to stackforge does not reach it by accident, and
                # stop_group() ends it with every process it started.
                proc = subprocess.Popen(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=run_env,
                    text=True,
                    encoding="utf-8",
                    errors="replace",
                    bufsize=1,
                    start_new_session=True,
                )
            except FileNotFoundError:
                raise UserError(f"'{self.docker}' (the docker CLI) is not installed", fix=SETUP_FIX) from None
            assert proc.stdout is not None
            try:
                # stopped from another thread (signals.Stop), it is ended as stop_group() begins: SIGTERM
                with signals.while_running(lambda: _signal_group(proc, signal.SIGTERM)):
                    for raw in proc.stdout:
                        line = raw.rstrip("\n")
                        lines.append(line)
                        if log:
                            log.write(line + "\n")
                            log.flush()
                        if on_line:
                            on_line(line)
                    rc = proc.wait()
                signals.checkpoint()
            except BaseException:
                stop_group(proc)
                raise
        return BuildResult(rc, "\n".join(lines) + ("\n" if lines else ""))


def _signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send ``sig`` to ``proc``'s process group; False when the group is gone (or not ours to signal)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End ``proc`` and its process group (started with ``start_new_session``): SIGTERM first, so
    buildx cancels the build in BuildKit, then SIGKILL after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _signal_group(proc, sig):
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    _signal_group(proc, signal.SIGKILL)  # anything of the group still running after the leader exited
    proc.wait()


_DENIED = re.compile(
    r"permission denied while trying to connect to the (?:Docker daemon )?socket at (?:unix://)?(\S+?):? "
)
_NOT_RUNNING = re.compile(r"Cannot connect to the Docker daemon at (?:unix://)?(\S+?)\.? Is the docker daemon running")


def daemon_error(stderr: str | None) -> UserError:
    """Why no daemon answered, from the docker CLI's own words: a socket this user may not open is named with the
    way to get access; a daemon that does not run, with the way to start one."""
    text = stderr or ""
    denied = _DENIED.search(text)
    if denied:
        return UserError(
            f"this user may not use the Docker daemon's socket {denied.group(1)} (permission denied)",
            fix="add the user to the 'docker' group (sudo usermod -aG docker $USER) and log in again (or run "
            "`newgrp docker`); or set DOCKER_HOST to a daemon this user can reach, e.g. a rootless dockerd "
            "(unix://$XDG_RUNTIME_DIR/docker.sock)",
        )
    down = _NOT_RUNNING.search(text)
    if down:
        return UserError(f"no Docker daemon runs at {down.group(1)}", fix=SETUP_FIX)
    return UserError(f"no Docker daemon answers: {clip(_last_line(text)) or 'docker version failed'}", fix=SETUP_FIX)


class NoSuchImage(UserError):
    """The engine holds no image of this reference; ``ref`` is the reference asked for."""

    def __init__(self, ref: str) -> None:
        super().__init__(
            f"image {printable(ref)} is not in the local engine",
            fix=f"pull it (docker pull {printable(ref)}) or build it (stackforge build STACK)",
        )
        self.ref = ref


def _no_such_image(stderr: str | None) -> bool:
    """The docker CLI's words for an image it does not hold (``No such image: …``, ``… not found``)."""
    text = (stderr or "").lower()
    return "no such image" in text or "not found" in text


def parse_image_attrs(ref: str, text: str) -> dict[str, Any]:
    """The one image description in ``docker image inspect REF``'s answer (a JSON list of one object); anything
    else is a :class:`UserError` naming ``ref``."""
    try:
        doc = json.loads(text or "null")
    except ValueError:
        doc = None
    if not (isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], dict)):
        raise UserError(f"'docker image inspect {printable(ref)}' answered no single image description", fix=SETUP_FIX)
    return doc[0]


def config_of(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """An image description's ``Config`` (empty when it has none: an image of ``scratch`` may say ``null``)."""
    config = attrs.get("Config")
    return dict(config) if isinstance(config, dict) else {}


def labels_of(attrs: Mapping[str, Any]) -> dict[str, str]:
    """An image description's labels (``Config.Labels``; ``null`` or none: empty), each name and value a string:
    an entry that is not one is left out."""
    labels = config_of(attrs).get("Labels")
    if not isinstance(labels, dict):
        return {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def layers_of(attrs: Mapping[str, Any]) -> list[str]:
    """An image description's layers (``RootFS.Layers``: diff ids, bottom first); empty when it lists none."""
    rootfs = attrs.get("RootFS")
    layers = rootfs.get("Layers") if isinstance(rootfs, dict) else None
    return [str(layer) for layer in layers] if isinstance(layers, list) else []


def platform_of(attrs: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """An image description's (os, architecture, variant); ``linux`` when it names no os, an empty architecture
    when it names none, None when it names no variant."""
    variant = attrs.get("Variant")
    return str(attrs.get("Os") or "linux"), str(attrs.get("Architecture") or ""), str(variant) if variant else None


def _last_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def save_image(engine: Engine, ref: str, out: Path, what: str) -> None:
    """``docker save`` of ``ref`` into ``out``, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with progress.step(f"save {what}"):
        proc = engine.save(ref, tmp)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise UserError(f"docker save {ref} failed: {proc.stderr.strip()[-300:]}", fix="check the engine and the disk")
    os.replace(tmp, out)


#: a file stackforge reads out of an image (its stack files, an overlay's declaration): the image is not trusted
IMAGE_FILE_LIMIT = 16 << 20


def image_files(engine: Engine, image: str, directory: str) -> dict[str, bytes]:
    """The regular files directly in ``directory`` of ``image`` (links, and files over :data:`IMAGE_FILE_LIMIT`,
    left out): read from the engine's layer store when it can serve, else copied out of a created, never started,
    container; empty when the image has no such directory."""
    from stackforge.clients import layerstore

    files = layerstore.read_image(engine, engine.image_id(image), lambda tree: tree.files(directory, IMAGE_FILE_LIMIT))
    if files is not None:
        return files
    proc = engine.create(image, "true")
    if proc.returncode != 0:
        raise UserError(f"cannot read {directory} of {image}: {proc.stderr.strip()[-300:]}")
    cid = proc.stdout.strip()
    try:
        with tempfile.TemporaryDirectory(prefix="stackforge-image-") as tmp:
            if not engine.copy_out(cid, f"{directory}/.", tmp):
                return {}
            return {
                p.name: p.read_bytes()
                for p in sorted(Path(tmp).iterdir())
                if not p.is_symlink() and p.is_file() and p.stat().st_size <= IMAGE_FILE_LIMIT
            }
    finally:
        engine.remove_container(cid)
