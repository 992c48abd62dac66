"""Run a declared test slice inside an image and judge its counts (``stackforge test``).

A slice (``tests:`` of a stack or of a recipe, :class:`stackforge.stack.model.Slice`) names test files (an
upstream's tree at the stack's pinned commit, or files of this repository), a pytest selection and the counts
pytest must report. The run:

1. the host's hardware: a slice that needs devices on a host without them is ``not-run`` (no container starts),
   unless ``allow_missing_hardware`` (the smoke's host facts and :func:`missing_hardware`);
2. the files are staged into a temporary directory at their relative paths;
3. ``docker run --rm --read-only --tmpfs /tmp --network none`` with the staged files mounted read-only at
   ``/slice`` (the working directory), a writable bind mount at ``/slice-out`` for the JUnit XML only, and
   ``--entrypoint python`` running ``-m pytest -p no:cacheprovider --junitxml=… -rA <selection>``;
4. the summary line gives the counts, the JUnit XML each test's outcome; a count that differs from the declared
   one fails the slice, naming the tests of each differing outcome and, against the previous result of the same
   slice in the evidence, every test whose outcome changed;
5. ``result.json``, ``junit.xml`` and ``pytest.txt`` (pytest's output) go to the evidence directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge import safeio
from stackforge.clients import upstream as upstreams
from stackforge.clients.containers import DeviceAccess, Mount, RunSpec
from stackforge.clients.engine import Engine
from stackforge.clients.proc import Exceeded
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.fslock import atomic_write
from stackforge.recipes.load import LoadedRecipe, list_recipes, load_recipe
from stackforge.recipes.model import Hardware
from stackforge.signals import Interrupted
from stackforge.smoke.pytest_result import Comparison, TestCase, compare, junit_counts, parse_junit, parse_summary
from stackforge.smoke.report import EXIT_FAILED, EXIT_NOT_RUN, FAILED, NOT_RUN, PASSED, one_line
from stackforge.smoke.run import PLATFORM_OPTIONS, HostFacts, host_facts, missing_hardware, tail
from stackforge.stack import targets as target_rules
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack
from stackforge.stack.model import Slice

RESULT_JSON = "result.json"
JUNIT_XML = "junit.xml"
#: the JUnit XML a test container may leave (a few thousand tests take a few MiB)
JUNIT_LIMIT = 64 << 20
#: what a test container may print (pytest's output, merged)
OUTPUT_LIMIT = 64 << 20
PYTEST_OUTPUT = "pytest.txt"
MOUNT, OUT_MOUNT = "/slice", "/slice-out"
#: Seconds ``docker run`` may take beyond the slice's timeout (starting and removing the container).
ENGINE_GRACE_S = 60
#: Tests named per moved outcome in the human output (result.json names them all).
MAX_NAMED = 20


@dataclass(frozen=True)
class SliceRef:
    """A declared slice and where it was declared: the stack itself, or a recipe (``owner`` its name)."""

    name: str  # the slice's name in results and evidence: <name> (stack) or <recipe>.<name> (recipe)
    slice: Slice
    owner: str | None = None  # the recipe declaring it; None: the stack
    target: str | None = None  # the image target it runs in (resolved)
    recipe: LoadedRecipe | None = field(default=None, compare=False, repr=False)  # where a recipe's keys are

    @property
    def declared_at(self) -> tuple[str, ...]:
        return ("tests", self.name.split(".", 1)[1] if self.owner else self.name)


@dataclass
class SliceResult:
    slice: str
    owner: str | None
    image: str
    image_id: str | None
    target: str | None
    verdict: str = NOT_RUN
    reason: str | None = None
    expected: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    summary_line: str | None = None
    deselected: int = 0
    warnings: int = 0
    pytest_exit: int | None = None
    moved: dict[str, Any] = field(default_factory=dict)  # {outcomes: {...}, changed: [...]}
    note: str | None = None  # the JUnit XML counts differently from the summary line
    tests: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    docker: list[str] = field(default_factory=list)
    started_at: str = ""
    duration_s: float = 0.0
    evidence: str | None = None

    @property
    def exit_code(self) -> int:
        return {PASSED: 0, FAILED: EXIT_FAILED}.get(self.verdict, EXIT_NOT_RUN)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code, "junit": JUNIT_XML, "output": PYTEST_OUTPUT}

    def lines(self) -> list[str]:
        """For people: verdict, slice and its counts against the expected ones on the first line; then each
        outcome whose count moved with its tests, and each test whose outcome changed since the previous run."""
        shown = [o for o in self.expected if self.expected[o] or self.counts.get(o)]
        counts = ", ".join(
            f"{self.counts.get(o, 0)} {o}"
            + ("" if self.counts.get(o, 0) == self.expected[o] else f" (expected {self.expected[o]})")
            for o in shown
        )
        moved = self.moved.get("outcomes") or {}
        head = f"{self.verdict.upper():8} {self.slice}: {counts or 'no counts'}"
        out = [head + (f" — {one_line(self.reason)}" if self.reason and not moved else "")]
        for outcome, d in moved.items():
            tests = d.get("tests") or []
            out.append(
                f"  {outcome} ({d.get('got')}, expected {d.get('expected')}): "
                + (", ".join(tests[:MAX_NAMED]) or "—")
                + (f" … (+{len(tests) - MAX_NAMED})" if len(tests) > MAX_NAMED else "")
            )
        out += [
            f"  changed: {c['test']}: {c['was']} → {c['now']}" for c in (self.moved.get("changed") or [])[:MAX_NAMED]
        ]
        return out


def declared(loaded: LoadedStack | ResolvedStack, overlay: str | None = None) -> list[SliceRef]:
    """The slices that run in an image of ``loaded``'s stack: the stack's own (target: as declared, else its first
    published target), then those of each recipe whose image is of this stack (target: as declared, else the
    recipe's), in recipe order. A recipe whose image carries an overlay counts only for an image of that
    ``overlay``."""
    first = next(iter(target_rules.published(loaded.model)), None)
    out = [SliceRef(name, sl, None, sl.target or first) for name, sl in loaded.model.tests.items()]
    for recipe in list_recipes(loaded.root):
        found = load_recipe(loaded.root, recipe)
        image = found.model.image
        if image.stack != loaded.name or not found.model.tests or image.overlay not in (None, overlay):
            continue
        out += [
            SliceRef(f"{recipe}.{n}", sl, recipe, sl.target or image.target, found)
            for n, sl in found.model.tests.items()
        ]
    return out


def image_mismatch(loaded: LoadedStack | ResolvedStack, labels: dict[str, str], refs: list[SliceRef]) -> list[str]:
    """Why an image's labels say it is not an image of ``loaded``'s stack as declared: its stack label, its pins,
    and the pinned commit of every upstream a slice reads (empty: it is)."""
    ns = "org.stackforge"
    stack = loaded.model
    out = []
    if labels.get(f"{ns}.stack") != stack.name:
        out.append(f"label {ns}.stack is {labels.get(f'{ns}.stack')!r}, not {stack.name!r}")
    for name, pkg in stack.packages.items():
        have = labels.get(f"{ns}.pin.{name}")
        if have != pkg.version:
            out.append(f"pin {name}: the image has {have or 'no label'}, stacks/{stack.name}.yaml pins {pkg.version}")
    for upstream in sorted({r.slice.files.upstream for r in refs if r.slice.files.upstream}):
        up = stack.upstreams.get(upstream)
        have = labels.get(f"{ns}.upstream.{upstream}")
        if up is not None and up.git is not None and have != up.pin:
            out.append(f"upstream {upstream}: the image was built from {have or 'no label'}, the stack pins {up.pin}")
    return out


# -- staging ---------------------------------------------------------------------------------------------


def stage(loaded: LoadedStack | ResolvedStack, ref: SliceRef, dest: Path, workspace: Workspace) -> dict[str, Any]:
    """Put the slice's files into ``dest`` at their relative paths; returns where they came from."""
    files = ref.slice.files
    at = (*ref.declared_at, "files", "paths")
    if files.upstream is None:
        missing = [p for p in files.paths if not (loaded.root / p).exists()]
        if missing:
            raise _placed(loaded, ref, at, f"no {', '.join(missing)} in the repository", "fix the paths")
        root = loaded.root.resolve()
        outside = [p for p in files.paths if not (loaded.root / p).resolve().is_relative_to(root)]
        if outside:
            raise _placed(loaded, ref, at, f"{', '.join(outside)} leads outside the repository", "name files in it")
        for path in files.paths:
            src, out = loaded.root / path, dest / path
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():  # links inside are kept as links: the container sees them, the host is not read
                shutil.copytree(src, out, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(src, out)
        return {"from": "repository", "paths": list(files.paths)}
    up = loaded.model.upstreams.get(files.upstream)
    if up is None or up.git is None or up.commit is None:
        raise _placed(
            loaded,
            ref,
            (*ref.declared_at, "files", "upstream"),
            f"the stack {loaded.name} has no git upstream {files.upstream!r} with a pinned commit",
            f"name one of: {', '.join(n for n, u in loaded.model.upstreams.items() if u.git) or 'none'}",
        )
    spec = upstreams.UpstreamSpec(git=up.git, tag=up.tag, commit=up.commit, name=files.upstream)
    credential = loaded.credentials.for_url(up.git) if up.git else None
    mirror = upstreams.fetch_upstream(
        spec, workspace.cache(), root=loaded.root, workspace=workspace, reuse=True, credential=credential
    )
    missing = upstreams.export_paths(mirror, up.commit, files.paths, dest)
    if missing:
        raise _placed(
            loaded,
            ref,
            at,
            f"upstream {files.upstream} at {up.commit[:12]} has no {', '.join(missing)}",
            "name paths of the upstream's tree at the commit the stack pins",
        )
    return {
        "from": "upstream",
        "upstream": files.upstream,
        "pin": up.pin,
        "commit": up.commit,
        "paths": list(files.paths),
    }


def _placed(loaded: LoadedStack | ResolvedStack, ref: SliceRef, at: tuple, message: str, fix: str) -> UserError:
    """An error at the slice's key ``at``: in the recipe that declares it, else in the stack's file."""
    text = f"{'.'.join(map(str, at))}: {message}"
    if ref.recipe is not None:
        return ref.recipe.error(text, at, fix, exit_code=2)
    return loaded.placed(UserError(text, fix=fix, exit_code=2), at)


# -- the container ---------------------------------------------------------------------------------------


def container_spec(
    ref: SliceRef, image: str, staged: Path, out: Path, devices: DeviceAccess | None, name: str
) -> RunSpec:
    """``docker run`` of the slice: read-only root, /tmp a tmpfs, no network, the files read-only, only the JUnit
    directory writable."""
    return RunSpec(
        image,
        [
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--rootdir={MOUNT}",
            f"--junitxml={OUT_MOUNT}/{JUNIT_XML}",
            "-o",
            "junit_family=xunit1",
            "-rA",
            *ref.slice.arguments(),
        ],
        entrypoint="python",
        name=name,
        labels={"org.stackforge.test.slice": ref.name},
        read_only=True,
        tmpfs=["/tmp"],
        network="none",
        devices=devices,
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        mounts=[Mount(staged, MOUNT, read_only=True), Mount(out, OUT_MOUNT)],
        workdir=MOUNT,
    )


def _pytest(engine: Engine, spec: RunSpec, name: str, timeout_s: int) -> tuple[int | None, str, str | None]:
    """(exit status or None when stopped, merged output, why it was stopped) of ``docker run``; a container
    that ran out of time or printed more than :data:`OUTPUT_LIMIT` is removed."""
    try:
        proc = engine.run_output(spec, timeout=timeout_s + ENGINE_GRACE_S, limit=OUTPUT_LIMIT)
    except Interrupted as intr:
        engine.remove_container(name)
        intr.notes.append(f"the test container {name} was removed")
        raise
    except subprocess.TimeoutExpired as exc:
        engine.remove_container(name)
        text = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else (exc.output or "")
        return None, text, f"pytest did not finish within {timeout_s} s"
    except Exceeded as exc:
        engine.remove_container(name)
        return None, exc.output.decode(errors="replace"), f"the test container printed more than {OUTPUT_LIMIT} bytes"
    return proc.returncode, proc.stdout or "", None


def read_junit(out: Path) -> tuple[str | None, str | None]:
    """(the JUnit XML the container left in ``out``, or None; why it was not taken). The container wrote it: a
    link is not followed, a FIFO or device not opened, and it is read within :data:`JUNIT_LIMIT`."""
    path = out / JUNIT_XML
    if not os.path.lexists(path):
        return None, None
    try:
        return safeio.read_text(path, limit=JUNIT_LIMIT, what="JUnit XML", follow=False), None
    except safeio.Malformed as exc:
        return None, f"the test container left {JUNIT_XML} that is not taken: {exc.message}"


# -- the run ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SliceTarget:
    """The image a slice runs in and where its evidence goes."""

    image: str
    image_id: str | None
    outdir: Path


def run_slice(
    loaded: LoadedStack | ResolvedStack,
    ref: SliceRef,
    where: SliceTarget,
    workspace: Workspace,
    *,
    allow_missing_hardware: bool = False,
    facts: HostFacts | None = None,
    engine: Engine | None = None,
) -> SliceResult:
    """Run one slice in ``where.image`` (with ``engine``, default the workspace's) and write its evidence into
    ``where.outdir``."""
    engine = engine if engine is not None else workspace.engine
    started = time.monotonic()
    result = SliceResult(ref.name, ref.owner, where.image, where.image_id, ref.target, started_at=_now())
    result.expected = ref.slice.expected()
    previous = previous_outcomes(where.outdir)
    hw = Hardware.model_validate(ref.slice.hardware.model_dump())
    facts = facts if facts is not None else host_facts(engine)
    missing = missing_hardware(hw, facts)
    result.hardware = {"declared": hw.devices, "count": hw.count, "missing": missing}
    if missing and not allow_missing_hardware:
        result.reason = f"not run: {missing}"
        return _finish(result, where.outdir, "", None, started)
    result.hardware["allowed_missing"] = bool(missing)
    with tempfile.TemporaryDirectory(prefix="stackforge-slice-") as tmp:
        staged, out = Path(tmp) / "files", Path(tmp) / "out"
        staged.mkdir()
        out.mkdir()
        out.chmod(0o777)  # the image's user may not be ours
        result.files = stage(loaded, ref, staged, workspace)
        name = container_name(ref.name)
        spec = container_spec(ref, where.image, staged, out, None if missing else PLATFORM_OPTIONS[hw.devices], name)
        result.docker = ["docker", *spec.argv()]
        code, output, stopped = _pytest(engine, spec, name, ref.slice.timeout_s)
        junit, refused = read_junit(out)
    result.pytest_exit = code
    judge(result, output, junit, previous, stopped or f"pytest did not finish within {ref.slice.timeout_s} s", refused)
    if missing and result.verdict == PASSED:
        result.verdict, result.reason = (
            NOT_RUN,
            f"passed without the declared hardware ({missing}): not a hardware result",
        )
    return _finish(result, where.outdir, output, junit, started)


def judge(
    result: SliceResult,
    output: str,
    junit: str | None,
    previous: dict[str, str] | None,
    stopped: str,
    junit_problem: str | None = None,
) -> None:
    """Fill ``result``'s counts, tests, moved tests and verdict from pytest's output and JUnit XML (``stopped``:
    why pytest has no exit status, when it has none; ``junit_problem``: why the JUnit XML was not taken)."""
    summary = parse_summary(output)
    cases: list[TestCase] = []
    if junit is not None:
        try:
            cases = parse_junit(junit, output)
        except ValueError as exc:
            junit_problem = str(exc)
    result.tests = [asdict(c) for c in cases]
    if result.pytest_exit is None:
        result.verdict, result.reason = (
            FAILED,
            f"{stopped}; last lines:\n{tail(output, 5)}",
        )
        return
    if summary is None:
        result.verdict = FAILED
        result.reason = f"pytest (exit {result.pytest_exit}) printed no summary line; last lines:\n{tail(output, 5)}"
        return
    result.counts, result.summary_line = summary.counts, summary.line
    result.deselected, result.warnings = summary.deselected, summary.warnings
    comparison: Comparison = compare(result.expected, summary.counts, cases, previous)
    result.moved = {"outcomes": comparison.differs, "changed": comparison.changed}
    if result.pytest_exit not in (0, 1, 5):
        result.verdict = FAILED
        result.reason = f"pytest exited {result.pytest_exit} ({summary.line}); last lines:\n{tail(output, 5)}"
    elif not comparison.ok:
        result.verdict, result.reason = FAILED, "; ".join(comparison.lines())
    elif junit is None or junit_problem:
        result.verdict, result.reason = FAILED, junit_problem or "pytest wrote no JUnit XML"
    else:
        result.verdict = PASSED
    if cases and junit_counts(cases) != summary.counts:  # e.g. a test that failed and then errored in teardown
        result.note = f"the JUnit XML counts {junit_counts(cases)}; the summary line (the verdict's) {summary.line!r}"


def previous_outcomes(outdir: Path) -> dict[str, str] | None:
    """``{test: outcome}`` of the result already in ``outdir`` (the previous run of the same slice), or None."""
    if not (outdir / RESULT_JSON).is_file():
        return None
    try:
        data = safeio.read_json(outdir / RESULT_JSON, what="previous result", follow=False)
        return {str(t["id"]): str(t["outcome"]) for t in data["tests"]} if data.get("tests") else None
    except (safeio.Malformed, KeyError, TypeError, AttributeError):
        return None


def container_name(slice_name: str) -> str:
    """Unique per run: the slice, this process and random hex (as a smoke container's name)."""
    return f"stackforge-slice-{slice_name.lower()}-{os.getpid()}-{os.urandom(3).hex()}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _finish(result: SliceResult, outdir: Path, output: str, junit: str | None, started: float) -> SliceResult:
    result.duration_s = round(time.monotonic() - started, 2)
    outdir.mkdir(parents=True, exist_ok=True)
    result.evidence = str(outdir)
    atomic_write(outdir / PYTEST_OUTPUT, output)
    if junit is not None:
        atomic_write(outdir / JUNIT_XML, junit)
    else:
        (outdir / JUNIT_XML).unlink(missing_ok=True)
    atomic_write(outdir / RESULT_JSON, json.dumps(result.to_json(), indent=2) + "\n")
    return result
