"""Run one recipe's smoke against an image: start, preflight, readiness, rows, stop, evidence.

The engine sits behind :class:`Container` (``docker run -d`` by ``clients.containers.DockerContainer``), so the
orchestration runs unchanged against any process that serves the recipe's ports. Order:

1. the host's hardware: a recipe that needs MUSA devices needs ``/dev/mtgpu*`` and the engine's
   ``mthreads`` runtime. Without them every row is ``not-run`` with the reason and no container starts,
   unless ``allow_missing_hardware`` (then the container starts without device options and the report
   records that the rows ran without the declared hardware);
2. ``docker run -d`` with the platform's device options (:data:`PLATFORM_OPTIONS`), the recipe's env
   defaults (and ``--env`` values), each declared port published on a free loopback port, the image's
   entrypoint with :meth:`Recipe.container_args`;
3. the preflight row, inside the container: devices visible, python/torch/vllm versions from the image's
   python, MUSA driver and runtime versions where present;
4. readiness: GET the readiness path until it answers 200, while the container still runs (a server
   that exits fails the run at once, with its last log lines) and within the timeout;
5. the recipe's rows in order (chat, turns, get, log); a server that dies during a row fails that row,
   and the rows after it are ``not-run``;
6. always (also on SIGINT/SIGTERM): the log is kept, the container stopped (how many log lines came before
   the stop is noted) and removed, vLLM's EngineDeadError triaged from the log (:mod:`stackforge.smoke.triage`:
   during the shutdown noted, while serving the row fails), and the evidence written.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stackforge import grammar, safeio
from stackforge.clients.containers import ContainerSpec, DeviceAccess, DockerContainer
from stackforge.clients.engine import Engine
from stackforge.clients.workspace import STACKS_DIR
from stackforge.errors import UserError
from stackforge.recipes.load import LoadedRecipe
from stackforge.recipes.model import Hardware, LogLine, Recipe, SmokeRow
from stackforge.signals import Interrupted
from stackforge.smoke import device_uuid, overlay_check, triage
from stackforge.smoke.checks import chat_body, chat_row, dump_row, numeric_row
from stackforge.smoke.checks import content_of as _content
from stackforge.smoke.checks import status_text as _status
from stackforge.smoke.report import FAILED, NOT_RUN, RowResult, SmokeReport, one_line, write_evidence

#: How a container gets the accelerator (one place): the MT container toolkit's runtime exposes the devices
#: MTHREADS_VISIBLE_DEVICES names (``docker info`` lists ``Runtimes: mthreads …`` once the toolkit is set
#: up); vLLM's workers share memory over /dev/shm, hence the host IPC namespace.
PLATFORM_OPTIONS: dict[str, DeviceAccess | None] = {
    "mthreads": DeviceAccess("mthreads", {"MTHREADS_VISIBLE_DEVICES": "all"}, ipc="host"),
    "none": None,
}
DEVICE_NODES = {"mthreads": "/dev/mtgpu*"}
RUNTIMES = {"mthreads": "mthreads"}
#: vLLM's own line naming the attention backend it chose.
BACKEND_LINE = re.compile(r"Using (\S+) backend")
LOG_TAIL = 20
ENV_ARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)

#: Run by the image's python inside the container: what the preflight row records.
PREFLIGHT = r"""
import glob, json, os, platform, sys
from importlib import metadata
def version(dist):
    try:
        return metadata.version(dist)
    except Exception:
        return None
def read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()[:200] or None
    except OSError:
        return None
home = os.environ.get("MUSA_HOME") or "/usr/local/musa"
runtime = next(filter(None, (read(os.path.join(home, n)) for n in ("version.txt", "version.json"))), None)
def uuids():
    # torch_musa (its import registers torch.musa) mirrors torch.cuda: a device's properties carry its uuid
    try:
        import torch
        try:
            import torch_musa  # noqa: F401
        except ImportError:
            pass
        musa = getattr(torch, "musa", None)
        if musa is not None and musa.is_available():
            found = [str(musa.get_device_properties(i).uuid) for i in range(musa.device_count())]
            if found:
                return found, "torch.musa.get_device_properties(i).uuid"
    except Exception:
        pass
    import re, shutil, subprocess
    if shutil.which("mthreads-gmi"):
        try:
            out = subprocess.run(["mthreads-gmi", "-q"], capture_output=True, text=True, timeout=60).stdout
        except Exception:
            out = ""
        found = re.findall(r"(?im)^\s*(?:GPU\s+)?UUID\s*:\s*(\S+)", out)
        if found:
            return found, "mthreads-gmi -q"
    return [], None
visible_uuids, uuid_source = uuids() if "uuids" in sys.argv[1:] else ([], None)
print(json.dumps({
    "python": platform.python_version(),
    "versions": {d: version(d) for d in ("torch", "torch_musa", "vllm", "vllm_musa", "mate", "torchada")},
    "devices": sorted(glob.glob("/dev/mtgpu*")),
    "visible": {k: os.environ.get(k) for k in ("MTHREADS_VISIBLE_DEVICES", "MUSA_VISIBLE_DEVICES")},
    "musa_driver": read("/sys/module/mtgpu/version"),
    "musa_runtime": runtime,
    "musa_home": home if os.path.isdir(home) else None,
    "uuids": visible_uuids,
    "uuid_source": uuid_source,
}))
"""


# -- the host -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """What the host offers: device nodes and the engine's container runtimes."""

    nodes: tuple[str, ...]
    runtimes: tuple[str, ...]


def host_facts(engine: Engine) -> HostFacts:
    nodes = tuple(sorted(n for pattern in DEVICE_NODES.values() for n in glob.glob(pattern)))
    return HostFacts(nodes, engine.runtimes())


def missing_hardware(hw: Hardware, facts: HostFacts) -> str | None:
    """Why this host cannot give the container the recipe's devices (None: it can)."""
    if hw.devices == "none" or hw.count == 0:
        return None
    pattern = DEVICE_NODES[hw.devices]
    nodes = [n for n in facts.nodes if fnmatch.fnmatch(n, pattern)]
    if not nodes:
        return f"this host has no {hw.devices} device (no {pattern})"
    if RUNTIMES[hw.devices] not in facts.runtimes:
        return (
            f"the engine has no {RUNTIMES[hw.devices]} runtime (docker info lists: "
            f"{', '.join(facts.runtimes) or 'none'}); install and set up the MT container toolkit"
        )
    return None


# -- the container --------------------------------------------------------------------------------------


class Container(Protocol):
    """A started server: is it running, its log, a command inside it, where a port is reachable."""

    def running(self) -> bool: ...

    def exit_code(self) -> int | None: ...

    def logs(self) -> str: ...

    def exec(self, argv: Sequence[str], timeout: float = 120) -> tuple[int, str]: ...

    def address(self, port: int) -> str: ...

    def remove(self) -> None: ...


Launcher = Callable[[ContainerSpec], Container]


# -- readiness and HTTP ---------------------------------------------------------------------------------


@dataclass
class Ready:
    ok: bool
    waited_s: float
    attempts: int
    reason: str | None = None


def wait_ready(
    probe: Callable[[], int | None],
    alive: Callable[[], bool],
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 1.0,
) -> Ready:
    """Call ``probe`` (an HTTP status, None when nothing answers) until it gives 200; stop at once when
    ``alive`` says the server exited, or after ``timeout_s``."""
    start = clock()
    attempts, last = 0, None
    while True:
        if not alive():
            return Ready(False, round(clock() - start, 1), attempts, "the server exited before it was ready")
        attempts += 1
        last = probe()
        if last == 200:
            return Ready(True, round(clock() - start, 1), attempts)
        waited = clock() - start
        if waited >= timeout_s:
            answer = f"last answer HTTP {last}" if last is not None else "nothing answered"
            return Ready(False, round(waited, 1), attempts, f"not ready within {timeout_s:g} s ({answer})")
        sleep(min(interval, max(0.0, timeout_s - waited)))


def http(method: str, url: str, body: dict | None = None, timeout: float = 300) -> tuple[int | None, str]:
    """(status, body text); status None when the connection failed (the text says how)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read(1 << 20).decode(errors="replace")
    except (OSError, ValueError) as exc:
        return None, str(getattr(exc, "reason", exc))


# -- rows -----------------------------------------------------------------------------------------------


@dataclass
class RowContext:
    recipe: Recipe
    addresses: dict[str, str]  # port name -> 127.0.0.1:N
    logs: Callable[[], str]
    request: Callable[..., tuple[int | None, str]] = http
    exec: Callable[..., tuple[int, str]] | None = None  # an argv inside the container (Container.exec)
    root: Path | None = None  # the repository the recipe's reference files are read from

    def url(self, row: SmokeRow, path: str) -> str:
        return f"http://{self.addresses[row.port or self.recipe.default_port()]}{path}"


def _chat_body(recipe: Recipe, messages: list[dict], max_tokens: int) -> dict:
    return chat_body(recipe.model.name, messages, max_tokens)


def run_row(row: SmokeRow, ctx: RowContext, result: RowResult | None = None) -> RowResult:
    """Evaluate one smoke row; its result carries what was asked and what came back."""
    out = result or RowResult(row.name, row.kind)
    if row.chat is not None:
        url = ctx.url(row, "/v1/chat/completions")
        return chat_row(row.chat, ctx.recipe.model.name, lambda body: ctx.request("POST", url, body), out)
    if row.numeric is not None:
        send = None
        if row.numeric.logprobs is not None:
            url = ctx.url(row, "/v1/chat/completions")
            send = (ctx.recipe.model.name, lambda body: ctx.request("POST", url, body))
        return numeric_row(row.numeric, ctx.exec, ctx.root, out, send)
    if row.dump is not None:
        if ctx.exec is None:
            return out.failed("a dump row runs a command in the container, and there is none")
        return dump_row(row.dump, row.name, ctx.exec, out)
    if row.turns is not None:
        turns = row.turns
        messages: list[dict] = []
        statuses: list[int | None] = []
        for i in range(turns.count):
            messages.append({"role": "user", "content": turns.prompt})
            status, text = ctx.request(
                "POST", ctx.url(row, "/v1/chat/completions"), _chat_body(ctx.recipe, list(messages), turns.max_tokens)
            )
            statuses.append(status)
            if status != turns.status:
                return out.failed(
                    f"turn {i + 1} of {turns.count} answered {_status(status, text)}, expected {turns.status}",
                    statuses=statuses,
                    expected=turns.status,
                )
            messages.append({"role": "assistant", "content": _content(text) or ""})
        return out.passed(statuses=statuses, expected=turns.status)
    if row.get is not None:
        get = row.get
        status, text = ctx.request("GET", ctx.url(row, get.path))
        details: dict[str, Any] = {"path": get.path, "status": status, "expected": get.status}
        if status != get.status:
            return out.failed(f"GET {get.path} answered {_status(status, text)}, expected {get.status}", **details)
        return out.passed(**details)
    assert row.log is not None
    return log_row(row.log, ctx.logs(), out)


#: How many matching lines a log row keeps in its details (the count is always whole).
LOG_LINES_KEPT = 20


def log_row(log: LogLine, text: str, out: RowResult) -> RowResult:
    """Count the log's lines matching ``log.regex`` against the row's bounds; the result names the lines."""
    pattern = re.compile(log.regex)
    lines = text.splitlines()
    found = [line for line in lines if pattern.search(line)]
    backends = sorted({m.group(1).rstrip(".") for line in lines for m in [BACKEND_LINE.search(line)] if m})
    least, most = log.bounds()
    details: dict[str, Any] = {
        "regex": log.regex,
        "expected": log.expectation(),
        "matches": len(found),
        "line": found[0] if found else None,
        "lines": found[:LOG_LINES_KEPT],
        "backends_in_log": backends,
    }
    if least <= len(found) and (most is None or len(found) <= most):
        return out.passed(**details)
    if not found:
        seen = f"the log says: {', '.join(f'Using {b} backend' for b in backends)}" if backends else ""
        want = "" if (least, most) == (1, None) else f", expected {log.expectation()}"
        return out.failed(
            f"no line of the server's log matches {log.regex!r}{want}" + (f"; {seen}" if seen else ""), **details
        )
    shown = " | ".join(one_line(line, 200) for line in found[:3]) + (" | …" if len(found) > 3 else "")
    return out.failed(
        f"{len(found)} line{'s' if len(found) != 1 else ''} of the server's log match {log.regex!r}, "
        f"expected {log.expectation()}: {shown}",
        **details,
    )


def preflight(container: Container, hw: Hardware, missing: str | None, device_uuids: Sequence[str] = ()) -> RowResult:
    """Inside the container: the devices it sees and the runtime versions (the image's python); with
    ``device_uuids`` (the lease's), the visible devices' uuids must be exactly those."""
    row = RowResult("preflight", "preflight")
    code, text = container.exec(["python", "-c", PREFLIGHT, *(["uuids"] if device_uuids else [])], timeout=120)
    if code != 0 and not container.running():
        return row.failed(f"the container exited (code {container.exit_code()}) before the preflight could run")
    if code != 0:
        return row.failed(f"the image's python did not answer the preflight (exit {code}): {one_line(text)}")
    try:
        facts = safeio.parse_json(text.strip().splitlines()[-1], source="the preflight")
    except (safeio.Malformed, IndexError):
        return row.failed(f"the preflight printed no JSON: {one_line(text)}")
    if not isinstance(facts, dict):
        return row.failed(f"the preflight printed no JSON object: {one_line(text)}")
    devices = facts.get("devices") or []
    if hw.devices != "none" and hw.count and missing is None and len(devices) < hw.count:
        return row.failed(f"{len(devices)} device(s) visible in the container, the recipe needs {hw.count}", **facts)
    if missing is not None:
        facts["note"] = f"ran without the declared hardware: {missing}"
    if device_uuids:
        return device_uuid.compare(row, facts, device_uuids)
    return row.passed(**facts)


# -- the run --------------------------------------------------------------------------------------------


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` values (names by the env grammar; values without control characters)."""
    out: dict[str, str] = {}
    for item in items:
        m = ENV_ARG.match(item)
        bad = grammar.bad_char(item) if m else None
        if not m or bad:
            raise UserError(
                f"--env {item!r}: {'contains ' + bad if bad else 'write NAME=VALUE'}",
                file="--env",
                fix="e.g. --env VLLM_LOGGING_LEVEL=DEBUG",
            )
        out[m.group(1)] = m.group(2)
    return out


def container_name(recipe: str) -> str:
    return f"stackforge-smoke-{recipe}-{os.getpid()}-{os.urandom(3).hex()}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class SmokeOptions:
    """How a smoke runs, as ``stackforge smoke``'s flags (or the nightly) decide: built once and passed to
    :func:`smoke`. ``env``: values for the recipe's env (``--env``); ``readiness_timeout``: instead of the
    recipe's; ``interval``: between readiness probes; ``configuration``: which of the recipe's configurations
    runs (``--configuration``; the recipe with that configuration's flags, env values and token budget)."""

    allow_missing_hardware: bool = False
    env: dict[str, str] | None = None
    readiness_timeout: float | None = None
    echo: Callable[[str], None] = lambda line: None
    interval: float = 1.0
    #: the repository numeric rows read reference files from (default: the recipe file's; with neither, those rows
    #: are not run and the report names them as not checked)
    root: Path | None = None
    configuration: str | None = None  # the recipe's configuration to run (None: its first, the default)
    #: the device uuids the lease granted (``--device-uuid``, ``$STACKFORGE_DEVICE_UUID``): the preflight fails
    #: when the container sees others, and cannot pass when it sees none
    device_uuids: tuple[str, ...] = ()


def _engine(engine: Engine | None) -> Engine:
    """The engine a smoke asks for the host's runtimes and starts its container with (the caller's to give unless
    it gives the host facts and a launcher)."""
    assert engine is not None, "smoke() needs an engine unless facts and launcher are given"
    return engine


def smoke(
    loaded: LoadedRecipe,
    image: str,
    outdir: Path,
    options: SmokeOptions | None = None,
    *,
    engine: Engine | None = None,
    launcher: Launcher | None = None,
    facts: HostFacts | None = None,
    image_id: str | None = None,
    request: Callable[..., tuple[int | None, str]] = http,
) -> SmokeReport:
    """Run the recipe's smoke against ``image`` as ``options`` say and write the evidence into ``outdir``."""
    options = options or SmokeOptions()
    allow_missing_hardware, echo = options.allow_missing_hardware, options.echo
    conf = loaded.model.configuration(options.configuration)
    recipe = loaded.model.configured(options.configuration)
    if engine is not None and (recipe.needs.overlay or recipe.image.overlay):  # before anything starts
        overlay_check.require_overlay(loaded, image, overlay_check.image_labels(engine, image))
    started = time.monotonic()
    report = SmokeReport(
        loaded.name,
        loaded.display,
        image,
        image_id,
        recipe.image.stack,
        recipe.image.target,
        recipe.image.overlay,
        started_at=_now(),
        configuration=conf.name if conf else None,
    )
    rows = [RowResult("preflight", "preflight"), RowResult("readiness", "readiness")]
    rows += [RowResult(r.name, r.kind) for r in recipe.smoke]
    report.rows = rows
    root = options.root or recipe_repository(loaded)
    report.checkout = str(root) if root is not None else None
    if root is None:  # the rows whose reference files are the repository's are not run (numeric_row says so)
        report.not_checked = [f"row {r.name} (reference {r.numeric.reference})" for r in recipe.smoke if r.numeric]
    hw = recipe.hardware
    facts = facts if facts is not None else host_facts(_engine(engine))
    missing = missing_hardware(hw, facts)
    report.hardware = {
        "declared": hw.devices,
        "count": hw.count,
        "min_memory_gib": hw.min_memory_gib,
        "device_nodes": list(facts.nodes),
        "runtimes": list(facts.runtimes),
        "missing": missing,
        "allowed_missing": bool(missing and allow_missing_hardware),
    }
    log = ""
    if missing and not allow_missing_hardware:
        for row in rows:
            row.skipped(f"not run: {missing}")
        report.error = f"{missing}; no container was started"
        return _finish(report, outdir, log, started)

    devices = None if missing else PLATFORM_OPTIONS[hw.devices]
    report.hardware["device_options"] = devices.argv() if devices is not None else []
    extra = options.env or {}
    spec = ContainerSpec(
        name=container_name(loaded.name),
        image=image,
        args=recipe.container_args(),
        env={**{k: e.default for k, e in recipe.env.items()}, **extra},
        ports=dict(recipe.ports),
        devices=devices,
        labels={"org.stackforge.smoke.recipe": loaded.name},
    )
    shown = {k: (v if k not in extra else "<set by --env>") for k, v in spec.env.items()}
    report.container = {"name": spec.name, "docker": ["docker", *spec.argv(shown)], "env": shown}
    start = launcher or (lambda s: DockerContainer(_engine(engine), s))
    echo(f"smoke: start {image} ({spec.name})" + (f", configuration {conf.name}" if conf else ""))
    container = start(spec)
    try:
        _run(
            report,
            container,
            recipe,
            missing,
            options.readiness_timeout,
            request,
            options.interval,
            echo,
            root=root,
            device_uuids=options.device_uuids,
        )
    except Interrupted as intr:
        for row in rows:
            if row.status == NOT_RUN and row.reason is None:
                row.skipped(f"not run: interrupted by {intr.name}")
        report.error = f"interrupted by {intr.name}"
        intr.notes.append(f"the smoke container {spec.name} was removed (evidence: {outdir})")
        raise
    finally:
        log = container.logs()
        stop = getattr(container, "stop", None)
        if callable(stop):  # the stop is marked in the log: an EngineDeadError after it is vLLM's shutdown
            report.log_marks["stop"] = len(log.splitlines())
            stop()
            log = container.logs() or log
        report.container["exit_code"] = container.exit_code()
        container.remove()
        report.container["removed"] = not (isinstance(container, DockerContainer) and container.exists())
        echo(f"smoke: removed {spec.name}")
        triage.apply(report, log, triage.LogMarks(report.log_marks.get("rows", {}), report.log_marks.get("stop")))
        _finish(report, outdir, log, started)
    return report


def _run(
    report: SmokeReport,
    container: Container,
    recipe: Recipe,
    missing: str | None,
    readiness_timeout: float | None,
    request: Callable[..., tuple[int | None, str]],
    interval: float,
    echo: Callable[[str], None],
    root: Path | None = None,
    device_uuids: Sequence[str] = (),
) -> None:
    rows = report.rows
    t = time.monotonic()
    rows[0] = _timed(preflight(container, recipe.hardware, missing, device_uuids), t)
    echo(f"smoke: preflight {rows[0].status}")

    ready_row = rows[1]
    timeout = readiness_timeout if readiness_timeout is not None else recipe.readiness.timeout_s
    t = time.monotonic()
    try:
        addresses = {name: container.address(port) for name, port in recipe.ports.items()}
    except UserError as err:
        if container.running():
            raise
        addresses, ready = {}, Ready(False, 0.0, 0, err.message)
    else:
        ready_url = f"http://{addresses[recipe.default_port()]}{recipe.readiness.path}"
        echo(f"smoke: wait for {ready_url} (up to {timeout:g} s)")
        ready = wait_ready(
            lambda: request("GET", ready_url, timeout=10)[0], container.running, timeout, interval=interval
        )
    details = {
        "url_path": recipe.readiness.path,
        "timeout_s": timeout,
        "waited_s": ready.waited_s,
        "attempts": ready.attempts,
    }
    if not ready.ok:
        reason = str(ready.reason)
        if not container.running():
            code = container.exit_code()
            reason = f"the server exited (code {code}) before it was ready; last log lines:\n{tail(container.logs())}"
        _timed(ready_row.failed(reason, **details), t)
        report.error = one_line(reason)
        for row in rows[2:]:
            row.skipped("not run: the server never became ready")
        return
    _timed(ready_row.passed(**details), t)
    echo(f"smoke: ready after {ready.waited_s:g} s")

    ctx = RowContext(recipe, addresses, container.logs, request, exec=container.exec, root=root)
    for i, step in enumerate(recipe.smoke):
        result = rows[2 + i]
        t = time.monotonic()
        first = _log_lines(container)
        run_row(step, ctx, result)
        report.log_marks.setdefault("rows", {})[step.name] = [first, _log_lines(container)]
        # A server that dies drops its connections a moment before its process is gone: after a failed row,
        # give it a few seconds to show whether it is exiting, so the row says why it failed.
        if not container.running() or (result.status == FAILED and _stops_within(container, EXIT_GRACE_S)):
            code = container.exit_code()
            report.log_marks["rows"][step.name][1] = _log_lines(container)  # what it logged while exiting
            why = f"the server exited (code {code}) during row {step.name!r}; last log lines:\n{tail(container.logs())}"
            result.failed(f"{result.reason}; {why}" if result.status == FAILED else why)
            _timed(result, t)
            report.error = one_line(why)
            for later in rows[3 + i :]:
                later.skipped(f"not run: the server exited during row {step.name!r}")
            return
        _timed(result, t)
        echo(f"smoke: {step.name} {result.status}")


def recipe_repository(loaded: LoadedRecipe) -> Path | None:
    """The repository a recipe file belongs to: the nearest directory upwards holding stacks/ (None for a file
    outside any repository)."""
    return recipe_repository_of(loaded.path)


def recipe_repository_of(path: Path) -> Path | None:
    """:func:`recipe_repository` of the recipe file at ``path``."""
    here = Path(path).resolve().parent
    return next((d for d in (here, *here.parents) if (d / STACKS_DIR).is_dir()), None)


EXIT_GRACE_S = 3.0


def _log_lines(container: Container) -> int:
    """How many lines the container's log holds now (a row's span, for the EngineDeadError triage)."""
    return len(container.logs().splitlines())


def _stops_within(container: Container, seconds: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not container.running():
            return True
        time.sleep(interval)
    return not container.running()


def tail(log: str, n: int = LOG_TAIL) -> str:
    return "\n".join(log.rstrip().splitlines()[-n:])


def _timed(row: RowResult, started: float) -> RowResult:
    row.duration_s = round(time.monotonic() - started, 2)
    return row


def _finish(report: SmokeReport, outdir: Path, log: str, started: float) -> SmokeReport:
    report.finished_at = _now()
    report.duration_s = round(time.monotonic() - started, 1)
    write_evidence(report, outdir, log)
    return report
