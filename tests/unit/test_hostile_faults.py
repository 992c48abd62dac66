"""Two stackforges on one build directory, and a build directory that is full, read-only or forbidden.

No engine: renders run for real (subprocesses, in parallel); a build runs in-process against a
stand-in engine. Full and read-only file systems are real (a small tmpfs, a read-only bind mount)
where this machine lets the tests mount them; forbidden directories are simulated (root ignores
permission bits).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from stackforge import fslock
from stackforge.builder.records import evidence as evidence_dirs
from stackforge.cli.main import main
from stackforge.clients.engine import BuildResult, EngineInfo
from tests.fixtures.stack_support import RootSpec

REPO = Path(__file__).resolve().parents[2]

TINY = """\
name: {name}
description: one pin, no upstreams
platform: {{os: debian12, python: "3.11", arch: x86_64}}
base: {{image: stackforge/base:bookworm, python: python3}}
indexes:
  pypi: {{url: "https://pypi.org/simple", role: public}}
packages:
  idna: {{version: "3.10", index: pypi}}
tags:
  local: "stackforge-test/{name}:1"
targets:
  run: {{entrypoint: [python3]}}
"""

# A lock holder: takes the flock the way stackforge does, records its pid, holds it for argv[2] seconds.
HOLDER = """\
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0); os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def root_spec() -> RootSpec:
    """A repository with two small stacks and a gate directory big enough that a render takes a while."""
    return RootSpec(
        parts=("images",),
        stacks=(),
        stack_files={f"{name}.yaml": TINY.format(name=name) for name in ("tiny", "tiny2")},
        files={f"images/gate/bulk/f{i}": f"{i}\n" for i in range(1500)},
    )


def stackforge(root: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STACKFORGE_PROGRESS": "0", **env},
    )  # stderr: the error alone


def finish(proc: subprocess.Popen) -> SimpleNamespace:
    out, err = proc.communicate(timeout=120)
    return SimpleNamespace(rc=proc.returncode, out=out, err=err)


def files(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` but the lock (which holds the last holder's pid)."""
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != fslock.LOCK_NAME
    }


def leftovers(d: Path) -> list[str]:
    """Staging directories and temporary files a failed or racing writer would leave."""
    return sorted(
        p.name
        for p in d.rglob("*")
        if p.name == "context.partial" or p.name.startswith(".context-") or p.name.endswith(".tmp")
    )


def assert_one_clean_error(res: SimpleNamespace, *needles: str) -> None:
    assert res.rc == 2, (res.out, res.err)
    assert "Traceback" not in res.err
    err = "".join(line for line in res.err.splitlines(True) if not line.startswith("note: "))  # notes are not errors
    assert err.startswith("error: ") and "\n  fix: " in err, res.err
    for needle in needles:
        assert needle in res.err.splitlines()[0] + res.err, (needle, res.err)


# --------------------------------------------------------------------------------------------
# Concurrency: the lock
# --------------------------------------------------------------------------------------------


def case_same_stack(root, tmp_path):
    """Four renders of one stack at once: all succeed, each output is the one a lone render writes."""
    reference = finish(stackforge(root, "render", "tiny", "--out", str(tmp_path / "ref")))
    assert reference.rc == 0, reference.err
    results = [finish(p) for p in [stackforge(root, "render", "tiny") for _ in range(4)]]
    bdir = root / "build" / "tiny"
    for res in results:
        assert res.rc == 0, res.err
        assert "Traceback" not in res.err
        assert res.out.replace(str(bdir), "OUT") == reference.out.replace(str(tmp_path / "ref"), "OUT")
    assert files(bdir / "context") == files(tmp_path / "ref" / "context")
    assert (bdir / "Dockerfile").read_bytes() == (tmp_path / "ref" / "Dockerfile").read_bytes()
    assert len(files(bdir / "context")) > 1500
    assert leftovers(bdir) == []


def case_different_stacks(root, tmp_path):
    """Renders of two stacks at once neither wait for nor disturb each other."""
    procs = [stackforge(root, "render", name) for name in ("tiny", "tiny2", "tiny", "tiny2")]
    results = [finish(p) for p in procs]
    assert [r.rc for r in results] == [0, 0, 0, 0], [r.err for r in results]
    for name in ("tiny", "tiny2"):
        bdir = root / "build" / name
        assert f'"org.stackforge.stack"="{name}"' in (bdir / "Dockerfile").read_text()
        assert (bdir / "context" / "gate" / "gate.json").is_file() and leftovers(bdir) == []
    for res, other in zip(results, ("tiny2", "tiny", "tiny2", "tiny")):
        assert f"/build/{other}/" not in res.err


@contextmanager
def held(lock: Path, seconds: float):
    lock.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def case_held_no_wait(root, tmp_path):
    """Another process holds build/tiny/: --no-wait refuses at once, names its pid and the fix, writes nothing."""
    bdir = root / "build" / "tiny"
    with held(fslock.lock_path(bdir), 60) as pid:
        res = finish(stackforge(root, "render", "tiny", "--no-wait"))
    assert_one_clean_error(
        res,
        f"another stackforge (pid {pid}) is writing",
        "--no-wait",
        "nothing was written",
        "--out DIR",
        str(fslock.lock_path(bdir)),
    )
    assert "waiting for another" not in res.err
    assert not bdir.exists()  # nothing was written: the lock lives beside the directory


def case_held_timeout(root, tmp_path):
    """A render waits (saying so, with the pid), then gives up after --lock-timeout with one clear error."""
    bdir = root / "build" / "tiny"
    with held(fslock.lock_path(bdir), 60) as pid:
        res = finish(stackforge(root, "render", "tiny", "--lock-timeout", "1"))
    assert f"waiting for another stackforge on {bdir}/ (pid {pid})…" in res.err
    assert_one_clean_error(
        SimpleNamespace(rc=res.rc, out=res.out, err=res.err.split("\n", 1)[1]),
        f"(pid {pid})",
        "gave up after waiting 1 s",
        "--lock-timeout SECONDS",
    )
    assert not bdir.exists()  # nothing was written: the lock lives beside the directory


def case_held_then_released(root, tmp_path):
    """When the holder ends (the kernel drops its lock), the waiting render goes on and succeeds."""
    bdir = root / "build" / "tiny"
    with held(fslock.lock_path(bdir), 60) as pid:
        proc = stackforge(root, "render", "tiny", "--lock-timeout", "60")
        waiting = proc.stderr.readline()  # the holder ends once the render says it waits
    assert waiting == f"waiting for another stackforge on {bdir}/ (pid {pid})…\n"
    res = finish(proc)
    assert res.rc == 0, res.err
    assert (bdir / "context" / "gate" / "gate.json").is_file() and leftovers(bdir) == []


LOCK_CASES = [
    pytest.param(case_same_stack, id="same-stack-4-renders-at-once"),
    pytest.param(case_different_stacks, id="different-stacks-in-parallel"),
    pytest.param(case_held_no_wait, id="held-elsewhere-no-wait-refuses-with-pid"),
    pytest.param(case_held_timeout, id="held-elsewhere-waits-then-gives-up"),
    pytest.param(case_held_then_released, id="held-elsewhere-then-released"),
]


@pytest.mark.parametrize("case", LOCK_CASES)
def test_concurrent_stackforges_on_one_build_directory(case, root, tmp_path):
    case(root, tmp_path)


# --------------------------------------------------------------------------------------------
# Full, read-only and forbidden file systems
# --------------------------------------------------------------------------------------------


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def mounts(tmp_path):
    """``make(kind, path)``: a read-only bind mount ("ro") or a 128 KiB tmpfs ("small") at ``path``."""
    made: list[Path] = []

    def make(kind: str, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if kind == "small":
            ok = _mount("-t", "tmpfs", "-o", "size=128k", "tmpfs", str(path))
        else:
            ok = _mount("--bind", str(path), str(path))
        if ok:
            made.append(path)
        if ok and kind == "ro":
            ok = _mount("-o", "remount,ro,bind", str(path))
        if not ok:
            pytest.skip(f"cannot mount a {kind} file system here (needs root and mount)")
        return path

    yield make
    for path in reversed(made):
        subprocess.run(["umount", str(path)], capture_output=True)


def fill(fs: Path) -> None:
    """Fill a small file system to the last byte."""
    with open(fs / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def run(root: Path, *args: str) -> SimpleNamespace:
    return finish(stackforge(root, *args))


def case_read_only_build_dir(root, tmp_path, mounts, monkeypatch):
    ro = mounts("ro", tmp_path / "ro")
    res = run(root, "render", "tiny", "--out", str(ro / "tiny"))
    assert_one_clean_error(res, f"cannot write {ro / '.tiny.lock'}: read-only file system", "--out DIR")
    assert list(ro.iterdir()) == []


def case_full_while_assembling(root, tmp_path, mounts, monkeypatch):
    """The disk fills between two renders: the second fails cleanly, the first one's output stays whole."""
    fs = mounts("small", tmp_path / "small")
    out = fs / "tiny"
    shutil.rmtree(root / "images" / "gate" / "bulk")  # a context that fits in 128 KiB
    assert run(root, "render", "tiny", "--out", str(out)).rc == 0
    before = files(out)
    fill(fs)
    res = run(root, "render", "tiny", "--out", str(out), "--set", "description=changed")
    assert_one_clean_error(res, f"cannot write {out}/", "no space left on device", "free space there", "--out DIR")
    assert leftovers(out) == [] and files(out) == before


def case_cache_read_only(root, tmp_path, mounts, monkeypatch):
    """An unwritable download cache ($STACKFORGE_CACHE) is named, with the variable that moves it."""
    ro = mounts("ro", tmp_path / "ro")
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copy(REPO / "stacks" / "example.yaml", root / "stacks")
    shutil.copytree(REPO / "stacks" / "locks" / "example", root / "stacks" / "locks" / "example")
    res = finish(stackforge(root, "render", "example", STACKFORGE_CACHE=str(ro / "cache"), STACKFORGE_PROGRESS="0"))
    assert_one_clean_error(res, f"cannot write {ro / 'cache'}", "read-only file system", "STACKFORGE_CACHE=DIR")
    assert leftovers(root / "build" / "example") == [] and not (root / "build" / "example" / "context").exists()


def case_permission_denied(root, tmp_path, mounts, monkeypatch, capsys):
    """A build directory this user may not create (simulated: root is never refused by mode bits)."""
    denied = tmp_path / "denied"
    real_mkdir = os.mkdir

    def mkdir(path, *a, **kw):
        if str(path).startswith(str(denied)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_mkdir(path, *a, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir)
    rc = main(["--root", str(root), "render", "tiny", "--out", str(denied / "tiny")])
    err = capsys.readouterr().err
    assert_one_clean_error(
        SimpleNamespace(rc=rc, out="", err=err),
        f"cannot write {denied}",
        "permission denied",
        "make it writable for this user",
    )
    assert not denied.exists()


class FillingEngine:
    """A stand-in engine whose build succeeds after its log fills the disk (as a huge build log would)."""

    def __init__(self, fs: Path):
        self.fs = fs
        self.builder = None

    def check(self):
        return EngineInfo("27.0", "0.13.1", None, "docker", "v0.13.1")

    def image_exists(self, image):
        return True

    def config_digest(self, image_id, platform=None):
        return image_id  # the classic store: the id is the config's digest

    def supports_source_date_epoch(self):
        return False

    def supports_run_network(self):
        return False

    def supports_named_contexts(self):
        return False

    def image_id(self, ref):
        return "sha256:" + "c" * 64

    def build(self, *args, log_file=None, **kw):
        fill(self.fs)
        return BuildResult(0, "#9 0.1 PASS import idna       version=3.10\n#9 0.1 gate result: 1 PASS, 0 FAIL\n")

    def inspect_image(self, ref, template, *, timeout=30):  # the base image's id and digests
        info = {"Id": f"sha256:{'b' * 64}", "RepoDigests": [], "Created": None, "Layers": 1}
        return subprocess.CompletedProcess([ref], 0, json.dumps(info) + "\n", "")

    def run(self, spec, *, timeout):  # a container run of the built image answers nothing
        return subprocess.CompletedProcess(spec.argv(), 1, "", "")


def case_full_while_writing_evidence(root, tmp_path, mounts, monkeypatch, capsys):
    fs = mounts("small", tmp_path / "small")
    out = fs / "tiny"
    shutil.rmtree(root / "images" / "gate" / "bulk")  # a context that fits in 128 KiB
    monkeypatch.setattr("stackforge.clients.engine.Engine", lambda **_: FillingEngine(fs))  # the workspace's
    monkeypatch.setenv("STACKFORGE_PROGRESS", "0")  # stderr holds the error alone
    rc = main(["--root", str(root), "build", "tiny", "--out", str(out), "--ca-bundle", "none"])
    err = capsys.readouterr().err
    (evidence,) = evidence_dirs.builds(out / "evidence")  # this build's own directory
    assert_one_clean_error(
        SimpleNamespace(rc=rc, out="", err=err),
        f"cannot write {evidence / 'gate.txt'}: no space left on device",
    )
    assert json.loads((evidence / "inputs.json").read_text())["stack"] == "tiny"  # whole, not truncated
    assert not (evidence / "result.json").exists() and leftovers(out) == []


FAULT_CASES = [
    pytest.param(case_read_only_build_dir, id="EROFS-build-dir"),
    pytest.param(case_full_while_assembling, id="ENOSPC-context"),
    pytest.param(case_full_while_writing_evidence, id="ENOSPC-evidence"),
    pytest.param(case_cache_read_only, id="EROFS-download-cache"),
    pytest.param(case_permission_denied, id="EACCES-build-dir"),
]


@pytest.mark.parametrize("case", FAULT_CASES)
def test_unwritable_build_directory_is_one_clear_error(case, root, tmp_path, mounts, monkeypatch, capsys):
    kwargs = {"capsys": capsys} if "capsys" in case.__code__.co_varnames else {}
    case(root, tmp_path, mounts, monkeypatch, **kwargs)


def test_lock_is_reentrant_and_released(tmp_path):
    """A build that assembles its context takes the lock once; after it, another process gets it at once."""
    bdir = tmp_path / "b"
    with fslock.stack_lock(bdir, timeout=0):
        with fslock.stack_lock(bdir, timeout=0):
            assert fslock.lock_path(bdir).read_text().strip() == str(os.getpid())
            assert not bdir.exists()  # taking the lock creates nothing inside the directory
    fd = os.open(fslock.lock_path(bdir), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
