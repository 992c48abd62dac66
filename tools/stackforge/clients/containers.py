"""What a ``docker run`` gets, as values: :class:`RunSpec` (one container: image, command, isolation, mounts,
environment), :class:`DeviceAccess` (how a container reaches an accelerator), :class:`ContainerSpec` (a server
started detached, as the smoke starts one) and :class:`DockerContainer` (that server in the local engine).

:meth:`RunSpec.argv` is the one place a container's options become docker arguments; the engine's verbs
(:meth:`stackforge.clients.engine.Engine.run` and its kin) take the spec, so nothing above this floor writes a
docker command line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stackforge.errors import UserError

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine


@dataclass(frozen=True)
class Mount:
    """A host directory bind-mounted at ``target`` (read-only when ``read_only``)."""

    source: str | os.PathLike[str]
    target: str
    read_only: bool = False

    def arg(self) -> str:
        return f"{os.fspath(self.source)}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class DeviceAccess:
    """How a container gets an accelerator: the engine's container runtime that exposes it, the environment that
    runtime reads, and the IPC namespace (vLLM's workers share memory over /dev/shm)."""

    runtime: str
    env: Mapping[str, str] = field(default_factory=dict)
    ipc: str | None = None

    def argv(self) -> list[str]:
        """The options, as recorded in the evidence."""
        out = [f"--runtime={self.runtime}"]
        for key, value in self.env.items():
            out += ["--env", f"{key}={value}"]
        return [*out, f"--ipc={self.ipc}"] if self.ipc else out


@dataclass(frozen=True)
class RunSpec:
    """One ``docker run``: ``image`` with ``command`` (after the image's entrypoint, or ``entrypoint``).

    ``remove``: ``--rm``; ``detach``: ``-d``; ``network``: the container's network (``none``: no network);
    ``read_only``: a read-only root (``tmpfs`` the writable directories); ``mounts``: bind mounts; ``ports``:
    container ports each published on a free loopback port; ``devices``: an accelerator's options.
    """

    image: str
    command: Sequence[str] = ()
    entrypoint: str | None = None
    name: str | None = None
    remove: bool = True
    detach: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    read_only: bool = False
    tmpfs: Sequence[str] = ()
    network: str | None = None
    devices: DeviceAccess | None = None
    ports: Sequence[int] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    workdir: str | None = None

    def argv(self) -> list[str]:
        """``run`` and its arguments (without the ``docker`` in front)."""
        out = ["run"]
        if self.remove:
            out.append("--rm")
        if self.detach:
            out.append("-d")
        if self.name is not None:
            out += ["--name", self.name]
        for key, value in self.labels.items():
            out += ["--label", f"{key}={value}"]
        if self.read_only:
            out.append("--read-only")
        for path in self.tmpfs:
            out += ["--tmpfs", path]
        if self.network is not None:
            out.append(f"--network={self.network}")
        if self.devices is not None:
            out += self.devices.argv()
        for port in self.ports:
            out += ["--publish", f"127.0.0.1::{port}/tcp"]
        for key, value in self.env.items():
            out += ["--env", f"{key}={value}"]
        for mount in self.mounts:
            out += ["--volume", mount.arg()]
        if self.workdir is not None:
            out += ["--workdir", self.workdir]
        if self.entrypoint is not None:
            out += ["--entrypoint", self.entrypoint]
        return [*out, self.image, *self.command]


def isolated(image: str, entrypoint: str, *command: str) -> RunSpec:
    """A one-off ``docker run --rm --network none --entrypoint ENTRYPOINT IMAGE COMMAND…``: what a step reads out
    of an image it built."""
    return RunSpec(image, command, entrypoint=entrypoint, network="none")


@dataclass
class ContainerSpec:
    """A server started detached (``docker run -d``): its name, image, arguments after the image's entrypoint,
    environment, the ports it serves (name -> container port), device access and labels. :meth:`argv` is also
    recorded in the evidence, so a reviewer can rerun it."""

    name: str
    image: str
    args: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    devices: DeviceAccess | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def run_spec(self, shown_env: dict[str, str] | None = None) -> RunSpec:
        env = shown_env if shown_env is not None else self.env
        return RunSpec(
            self.image,
            self.args,
            name=self.name,
            remove=False,
            detach=True,
            labels=self.labels,
            devices=self.devices,
            ports=list(self.ports.values()),
            env=env,
        )

    def argv(self, shown_env: dict[str, str] | None = None) -> list[str]:
        """The ``docker run`` arguments (``shown_env``: the environment as the evidence shows it)."""
        return self.run_spec(shown_env).argv()


def _one_line(text: str | None, limit: int = 300) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if len(lines) > 3:  # the first line says what happened, the last ones (a log's tail) why
        lines = [lines[0], "…", *lines[-2:]]
    first = " | ".join(lines)
    return first if len(first) <= limit else first[: limit - 1] + "…"


class DockerContainer:
    """A container of the local engine, started detached from ``spec``; removed again when the start fails."""

    def __init__(self, engine: Engine, spec: ContainerSpec):
        self.engine, self.spec = engine, spec
        proc = engine.run(spec.run_spec(), timeout=300)
        if proc.returncode != 0:
            self.remove()
            raise UserError(
                f"docker run of {spec.image} failed: {_one_line(proc.stderr or proc.stdout)}",
                fix="check the image reference and the engine (the platform's device options need its runtime)",
            )

    def running(self) -> bool:
        return self.engine.container_state(self.spec.name, "{{.State.Running}}") == "true"

    def exit_code(self) -> int | None:
        code = self.engine.container_state(self.spec.name, "{{.State.ExitCode}}")
        return int(code) if code and code.lstrip("-").isdigit() else None

    def logs(self) -> str:
        """The container's log (stdout and stderr as they came), its head when it is over the engine's cap; empty
        when the engine cannot tell."""
        return self.engine.container_logs(self.spec.name, timeout=60)

    def exec(self, argv: Sequence[str], timeout: float = 120) -> tuple[int, str]:
        proc = self.engine.exec(self.spec.name, argv, timeout=timeout)
        return proc.returncode, proc.stdout if proc.returncode == 0 else (proc.stderr or proc.stdout)

    def address(self, port: int) -> str:
        for line in self.engine.port(self.spec.name, port):
            if line.startswith("127.0.0.1:"):
                return line.strip()
        raise UserError(f"container port {port} of {self.spec.name} is not published on 127.0.0.1")

    def stop(self, grace: int = 10) -> None:
        self.engine.stop(self.spec.name, grace=grace)

    def remove(self) -> None:
        self.engine.remove_container(self.spec.name, volumes=True)

    def exists(self) -> bool:
        return self.engine.container_state(self.spec.name, "{{.Id}}") is not None
