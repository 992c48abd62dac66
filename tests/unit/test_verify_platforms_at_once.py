"""``verify REF --all-platforms [--rebuild]`` checks the platforms of an index at once (``flows/operator.py``
``each_platform``): the platforms' checks run side by side, their lines come out in the index's order, a failure in
one keeps the other's lines, an exception in one stops the others and is raised, an interrupt of the main thread
stops the others' processes (``signals.Stop``) and is raised with what they noted; no thread is left running. The
checks here are stand-ins for ``_verify_image`` that meet each other (a barrier, an event), never a clock."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from stackforge import signals
from stackforge.builder.run.verify import Verification
from stackforge.clients.registry import OCI_INDEX, OCI_MANIFEST, RetryPolicy
from stackforge.errors import UserError
from stackforge.flows import operator
from tests.fixtures.stub_registry import StubRegistry, digest_of
from tests.unit.test_stop_threads import GUARD, gone, run_until_stopped, sleeper, wait_for

REPO = "team/multi"
TAG = "v1-20261206-r1"
ONE_TRY = RetryPolicy(attempts=1)


def index_of(reg: StubRegistry, arches: tuple[str, ...]) -> dict[str, str]:
    """An index of one small image per architecture under TAG; {platform: digest}."""
    digests = {
        f"linux/{a}": reg.put_image(REPO, None, json.dumps({"architecture": a}).encode(), [a.encode()]) for a in arches
    }
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": d,
                "size": len(reg.manifests[d][0]),
                "platform": {"os": "linux", "architecture": p.split("/")[1]},
            }
            for p, d in digests.items()
        ],
    }
    body = json.dumps(doc).encode()
    with reg.lock:
        reg.manifests[digest_of(body)] = (body, OCI_INDEX)
        reg.tags.setdefault(REPO, {})[TAG] = digest_of(body)
    return digests


def platform_of(index: tuple[str, str] | None) -> str:
    assert index is not None
    return index[1]


def stand_in(monkeypatch, checks: dict) -> None:
    """``_verify_image`` answered by ``checks[platform](v)``, which adds its lines to ``v`` (the platform's own
    Verification) or raises."""

    def verify_image(ref, engine, policy, key, rebuild_from, client, reference, manifest, index=None, echo=None):
        v = Verification(ref, "?")
        checks[platform_of(index)](v)
        return v

    monkeypatch.setattr(operator, "_verify_image", verify_image)


def no_platform_thread_left() -> bool:
    return not [t for t in threading.enumerate() if t.name.startswith("verify-platform") and t.is_alive()]


def test_the_platforms_run_at_once_and_their_lines_keep_the_index_order(monkeypatch):
    """Both checks are under way before either ends (each waits for the other at a barrier: one after the other
    they would never meet); the arm64 check ends first, yet the amd64 section comes first, as the index lists it.
    A failure in one is lines like any other: the other's are all there, the failures summed; the last platform's
    stack and record values are the verification's, as when they ran one after the other."""
    met = threading.Barrier(2, timeout=GUARD)
    arm_done = threading.Event()

    def amd(v: Verification) -> None:
        met.wait()
        assert arm_done.wait(GUARD)  # ends after arm64 has ended
        v.add(True, "record  amd64's record")
        v.add(False, "rebuild differs: config a rebuilt, b published")
        v.stack, v.record_tests = "multi-amd64", {"amd": 1}

    def arm(v: Verification) -> None:
        met.wait()
        v.add(True, "record  arm64's record")
        v.add(True, "rebuild identical: config c")
        v.stack, v.record_tests, v.record_smoke = "multi-arm64", {"arm": 1}, {"s": 1}
        arm_done.set()

    stand_in(monkeypatch, {"linux/amd64": amd, "linux/arm64": arm})
    with StubRegistry() as reg:
        d = index_of(reg, ("amd64", "arm64"))
        ref = f"{reg.address}/{REPO}:{TAG}"
        v = operator.verify_ref(ref, engine=None, policy=ONE_TRY, all_platforms=True)  # type: ignore[arg-type]
    repo = f"{reg.address}/{REPO}"
    assert v.lines[1:] == [
        f"PASS platform linux/amd64 {repo}@{d['linux/amd64']}",
        "PASS record  amd64's record",
        "FAIL rebuild differs: config a rebuilt, b published",
        f"PASS platform linux/arm64 {repo}@{d['linux/arm64']}",
        "PASS record  arm64's record",
        "PASS rebuild identical: config c",
    ]
    assert v.lines[0].startswith("PASS index   ") and v.failed == 1
    assert (v.stack, v.record_tests, v.record_smoke) == ("multi-arm64", {"arm": 1}, {"s": 1})
    assert no_platform_thread_left()


def test_at_most_platforms_at_once_run_together(monkeypatch):
    """Three platforms with a cap of two: two threads check them, the third platform after one of the first two."""
    monkeypatch.setattr(operator, "PLATFORMS_AT_ONCE", 2)
    met = threading.Barrier(2, timeout=GUARD)
    threads: dict[str, str] = {}

    def check(first_two: bool):
        def run(v: Verification) -> None:
            threads[v.image] = threading.current_thread().name
            if first_two:
                met.wait()
            v.add(True, "record  ok")

        return run

    stand_in(monkeypatch, {"linux/amd64": check(True), "linux/arm64": check(True), "linux/ppc64le": check(False)})
    with StubRegistry() as reg:
        index_of(reg, ("amd64", "arm64", "ppc64le"))
        v = operator.verify_ref(f"{reg.address}/{REPO}:{TAG}", None, ONE_TRY, all_platforms=True)  # type: ignore[arg-type]
    assert [line.split()[2] for line in v.lines if line.startswith("PASS platform")] == [
        "linux/amd64",
        "linux/arm64",
        "linux/ppc64le",
    ]
    assert len(threads) == 3 and len(set(threads.values())) == 2
    assert not v.failed and no_platform_thread_left()


def test_an_exception_in_one_platform_stops_the_other_and_is_raised(monkeypatch, tmp_path):
    """The arm64 check runs a process; the amd64 check raises a UserError: the arm64 process is ended, its thread
    raises Interrupted where it ran (its unwinding runs), and the UserError is what verify raises, with no thread
    left behind."""
    unwound: list[str] = []
    pidfile = sleeper(tmp_path, "arm64")

    def amd(v: Verification) -> None:
        wait_for(pidfile)
        raise UserError("docker pull amd64 failed: no such host", fix="check the registry")

    def arm(v: Verification) -> None:
        try:
            run_until_stopped(pidfile)
        except signals.Interrupted as intr:
            unwound.append(f"interrupted by {intr.name}")
            raise
        v.add(True, "record  never reached")

    stand_in(monkeypatch, {"linux/amd64": amd, "linux/arm64": arm})
    with StubRegistry() as reg:
        index_of(reg, ("amd64", "arm64"))
        with pytest.raises(UserError) as err:
            operator.verify_ref(f"{reg.address}/{REPO}:{TAG}", None, ONE_TRY, all_platforms=True)  # type: ignore[arg-type]
    assert err.value.message == "docker pull amd64 failed: no such host"
    assert unwound == ["interrupted by SIGTERM"]  # stopped, as a SIGTERM stops a build
    assert gone(int(pidfile.read_text())) and no_platform_thread_left()


def test_an_interrupt_stops_every_platform_and_says_what_each_left(monkeypatch, tmp_path):
    """SIGINT reaches the main thread (the only one with a handler) while both platforms run processes: both
    processes are ended, each platform's thread raises Interrupted and notes its cleanup, and verify raises the
    interrupt with those notes, each naming its platform."""
    pids = {p: sleeper(tmp_path, p.replace("/", "-")) for p in ("linux/amd64", "linux/arm64")}

    def running(platform: str, interrupt: bool):
        def run(v: Verification) -> None:
            if interrupt:
                wait_for(pids["linux/arm64"])
                os.kill(os.getpid(), signal.SIGINT)
            try:
                run_until_stopped(pids[platform])
            except signals.Interrupted as intr:
                intr.notes.append(f"{platform}'s tag put back")
                raise

        return run

    stand_in(monkeypatch, {"linux/amd64": running("linux/amd64", True), "linux/arm64": running("linux/arm64", False)})
    with StubRegistry() as reg:
        index_of(reg, ("amd64", "arm64"))
        with pytest.raises(signals.Interrupted) as exc, signals.handle_signals():
            operator.verify_ref(f"{reg.address}/{REPO}:{TAG}", None, ONE_TRY, all_platforms=True)  # type: ignore[arg-type]
    assert exc.value.exit_code == 130
    # the amd64 check may have been stopped before its process started: then it noted its cleanup all the same
    assert exc.value.notes == ["linux/amd64: linux/amd64's tag put back", "linux/arm64: linux/arm64's tag put back"]
    assert exc.value.render().startswith("error: interrupted by SIGINT; linux/amd64: ")
    assert gone(int(pids["linux/arm64"].read_text())) and no_platform_thread_left()
    amd = pids["linux/amd64"].read_text().strip() if pids["linux/amd64"].is_file() else ""
    assert not amd or gone(int(amd))


def test_one_platform_runs_in_the_calling_thread(monkeypatch):
    """``--platform`` (one image of the index) is checked where verify runs, as before: no thread, and a signal there
    interrupts it directly."""
    seen = []

    def arm(v: Verification) -> None:
        seen.append(threading.current_thread() is threading.main_thread())
        v.add(True, "record  ok")

    stand_in(monkeypatch, {"linux/arm64": arm})
    with StubRegistry() as reg:
        index_of(reg, ("amd64", "arm64"))
        v = operator.verify_ref(f"{reg.address}/{REPO}:{TAG}", None, ONE_TRY, platform="arm64")  # type: ignore[arg-type]
    assert seen == [True] and v.lines[-1] == "PASS record  ok" and v.image.endswith(v.lines[1].split("@")[-1])


def test_the_lines_rebuild_under_tags_of_their_own_and_an_interrupted_rebuild_puts_the_tag_back(tmp_path, monkeypatch):
    """The two lines' rebuilds move two local tags (the arm64 line's ends in ``-arm64``), each held by its own lock
    while it is moved; a rebuild interrupted after its build moved the tag (the build drops a tag it moved, as an
    interrupted build does) puts back the tag as it was, as a finished one does."""
    from stackforge.flows import rebuild as rebuild_mod
    from stackforge.publish.record_schema import PublishRecord
    from tests.fixtures.records import a_record
    from tests.unit.test_platforms import TWO

    rec = PublishRecord.model_validate(
        a_record(
            "sha256:" + "a" * 64, stack="two", stack_files={"two.yaml": {"sha256": "sha256:" + "d" * 64, "text": TWO}}
        )
    )
    checkout = tmp_path / "checkout"
    (checkout / "stacks").mkdir(parents=True)
    before = "sha256:" + "b" * 64

    class Engine:
        def __init__(self) -> None:
            self.tags: dict[str, str | None] = {}

        def image_id(self, ref: str) -> str | None:
            return self.tags.setdefault(ref, before)

        def tag(self, source: str, ref: str) -> bool:
            self.tags[ref] = source
            return True

    held: dict[str, bool] = {}

    def build(loaded, opts, engine=None, echo=None):
        ref = rebuild_mod.target_ref(loaded, opts.target)
        held[ref] = rebuild_mod.tag_lock(ref).locked()
        engine.tags[ref] = None  # moved by the build, then dropped as an interrupted build drops it
        raise signals.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(rebuild_mod, "build", build)
    engine = Engine()
    for arch in ("amd64", "arm64"):
        config = {"os": "linux", "architecture": arch}
        client = type("C", (), {"config_of": lambda self, m, c=config: c})()
        manifest = {"config": {"digest": "sha256:" + "e" * 64, "size": 9}}
        with pytest.raises(signals.Interrupted):
            rebuild_mod.rebuild(rec, checkout, client, "sha256:" + "a" * 64, manifest, engine)  # type: ignore[arg-type]
    assert list(held) == ["two:x86_64", "two:aarch64-arm64"] and all(held.values())
    assert engine.tags == {"two:x86_64": before, "two:aarch64-arm64": before}  # each put back
    assert not any(rebuild_mod.tag_lock(ref).locked() for ref in held)


def test_at_once_each_rebuild_s_buildkit_lines_name_their_platform(monkeypatch, capsys, tmp_path):
    """Two builds' BuildKit logs meet on stderr (their step numbers alike): with --rebuild and more than one platform
    each line starts with its platform; one platform's, or a verify without --rebuild, passes none."""
    echoes: dict[str, object] = {}

    def verify_image(ref, engine, policy, key, rebuild_from, client, reference, manifest, index=None, echo=None):
        echoes[platform_of(index)] = echo
        if echo is not None:
            echo("#5 [wheels 1/3] RUN pip wheel")
        return Verification(ref, "?")

    monkeypatch.setattr(operator, "_verify_image", verify_image)
    with StubRegistry() as reg:
        index_of(reg, ("amd64", "arm64"))
        ref = f"{reg.address}/{REPO}:{TAG}"
        operator.verify_ref(ref, None, ONE_TRY, rebuild_from=tmp_path, all_platforms=True)  # type: ignore[arg-type]
        err = capsys.readouterr().err.splitlines()
        assert sorted(err) == ["linux/amd64 #5 [wheels 1/3] RUN pip wheel", "linux/arm64 #5 [wheels 1/3] RUN pip wheel"]
        operator.verify_ref(ref, None, ONE_TRY, all_platforms=True)  # type: ignore[arg-type]
        assert echoes == {"linux/amd64": None, "linux/arm64": None}
        operator.verify_ref(ref, None, ONE_TRY, rebuild_from=tmp_path, platform="arm64")  # type: ignore[arg-type]
        assert echoes["linux/arm64"] is None and capsys.readouterr().err == ""
