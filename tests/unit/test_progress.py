"""Progress lines: on stderr, with durations and byte counts, silenced by STACKFORGE_PROGRESS=0."""

from __future__ import annotations

import time

import pytest

from stackforge import progress


def test_a_step_says_when_it_starts_and_how_long_it_took(capsys):
    with progress.step("fetch vllm (git)"):
        pass
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[0] == "stackforge: fetch vllm (git)…"
    assert lines[1].startswith("stackforge: fetch vllm (git): done in ") and lines[1].endswith(" s")


def test_a_failing_step_says_it_failed(capsys):
    with pytest.raises(RuntimeError), progress.step("pull base"):
        raise RuntimeError("x")
    assert capsys.readouterr().err.splitlines()[1].startswith("stackforge: pull base: failed after ")


def test_a_transfer_reports_bytes_while_it_runs_and_at_the_end(capsys, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    with progress.transfer("upload layer", total=3 * 1024 * 1024) as t:
        for at in (1.0, 6.0, 8.0):  # within the interval, past it (a running line), within it again
            now[0] = at
            t.advance(1024 * 1024)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "stackforge: upload layer: 2.0 MiB of 3.0 MiB (341.3 KiB/s)",
        "stackforge: upload layer: 3.0 MiB of 3.0 MiB (384.0 KiB/s) in 8.0 s",
    ]


def test_silenced(capsys, monkeypatch):
    monkeypatch.setenv("STACKFORGE_PROGRESS", "0")
    with progress.step("x"):
        progress.note("y")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 2**30, "5.0 GiB")])
def test_human_bytes(n, text):
    assert progress.human_bytes(n) == text


def test_an_upload_body_counts_what_was_read_and_keeps_its_length(capsys, monkeypatch):
    import io

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    t = progress.Transfer("upload sha256:ab", 10, None)
    t.done = 7  # an earlier attempt
    body = progress.CountingReader(io.BytesIO(b"0123456789"), 10, t)
    assert t.done == 0 and len(body) == 10  # a retry starts from byte 0; Content-Length is known
    now[0] = 6.0
    assert body.read(4) == b"0123" and len(body) == 6
    assert capsys.readouterr().err == "stackforge: upload sha256:ab: 4 B of 10 B (1 B/s)\n"
    assert body.read() == b"456789" and len(body) == 0 and t.done == 10


def test_a_long_step_says_it_is_still_running_until_it_ends(monkeypatch):
    monkeypatch.setenv("STACKFORGE_PROGRESS", "1")
    lines: list[str] = []
    with progress.step("fetch vllm (git)", lines.append, heartbeat=0.05):
        time.sleep(0.3)
    beats = [line for line in lines if "still running after" in line]
    assert (
        len(beats) >= 3
        and lines[0] == "stackforge: fetch vllm (git)…"
        and lines[-1].startswith("stackforge: fetch vllm (git): done in")
    )
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count  # the heartbeat ends with the step


def test_a_short_or_failing_step_has_no_heartbeat_left_behind(monkeypatch):
    monkeypatch.setenv("STACKFORGE_PROGRESS", "1")
    lines: list[str] = []
    with progress.step("tag", lines.append, heartbeat=10):
        pass
    assert [line for line in lines if "still running" in line] == []
    with pytest.raises(RuntimeError), progress.step("pull", lines.append, heartbeat=0.05):
        time.sleep(0.12)
        raise RuntimeError("no")
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count and lines[-1].startswith("stackforge: pull: failed after")
