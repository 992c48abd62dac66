"""`stackforge verify` ends with one line of what it checked (and ``--json`` carries the same list): the kinds
of checks from its PASS/FAIL lines, the pins and stack files by name, the gate's output lines, and what the
publish record says of tests and smoke ("none recorded" when it holds none)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stackforge.builder.plan.plan import LABEL_NS
from stackforge.builder.records import evidence
from stackforge.builder.run import verify as verifymod
from stackforge.builder.run.verify import Verification, local_record, verify
from stackforge.cli.publish import print_verification
from stackforge.stack.load import fingerprint, load
from tests.fixtures.stack_support import make_root

REPO = Path(__file__).resolve().parents[2]
GATE = [f"PASS import {n:<10} version=1.0" for n in ("torch", "vllm", "numpy")] + ["gate result: 3 PASS, 0 FAIL"]


@pytest.fixture
def gate(monkeypatch):
    """The gate and ABI scripts' answers, instead of a container (their lines as the scripts print them)."""
    ran: list[str] = []

    def run_gate(loaded, image, engine, script="gate.py"):
        ran.append(script)
        return True, GATE if script == "gate.py" else ["PASS needed libmusa.so.4 => /usr/local/musa/lib/libmusa.so.4"]

    monkeypatch.setattr(verifymod, "run_gate", run_gate)
    return ran


def labels_of(loaded) -> dict[str, str]:
    stack = loaded.model
    labels = {f"{LABEL_NS}.stack": stack.name, f"{LABEL_NS}.fingerprint": fingerprint(stack)}
    labels.update({f"{LABEL_NS}.pin.{n}": p.version for n, p in stack.packages.items()})
    labels.update({f"{LABEL_NS}.option.{n}": str(o.value) for n, o in stack.options.items()})
    return labels


def test_a_local_verify_names_what_it_checked_with_counts(gate):
    loaded = load("post2", root=REPO)
    v = verify(loaded, "img:1", labels_of(loaded), engine=object())  # type: ignore[arg-type]
    pins = len(loaded.model.packages)
    checked = {c["what"]: c for c in v.checked()}
    assert checked["pins"] == {"what": "pins", "count": pins, "ok": True}
    assert checked["gate"]["count"] == len(GATE) and checked["read-only gate"]["ok"] is True
    assert checked["tests"]["count"] is None and checked["smoke"]["count"] is None
    line = v.summary("img:1 against post2")
    assert line.startswith(f"verified img:1 against post2: labels, {pins} pins, ")
    assert f", fingerprint, gate {len(GATE)} lines, abi 1 line, read-only gate, tests: none recorded, " in line
    assert line.endswith("smoke: none recorded — 0 failed")


def test_a_failed_check_is_marked_and_counted(gate):
    loaded = load("post2", root=REPO)
    labels = labels_of(loaded)
    labels[f"{LABEL_NS}.pin.torch"] = "0.0.1"
    v = verify(loaded, "img:1", labels, engine=object())  # type: ignore[arg-type]
    line = v.summary("img:1 against post2")
    assert line.startswith("NOT verified img:1 against post2: labels, ")
    assert f"{len(loaded.model.packages)} pins (FAILED)" in line and line.endswith("— 1 failed")
    assert {c["what"]: c["ok"] for c in v.checked()}["pins"] is False


def test_a_published_verify_counts_stack_files_and_reads_tests_and_smoke_from_the_record(gate):
    loaded = load("post2", root=REPO)
    v = Verification("reg/x@sha256:" + "a" * 64, "post2")
    v.add(True, "digest  reg/x:t resolves to sha256:…")
    v.add(True, "record  sha256:… found via referrers (created 2026-09-29)")
    v.add(True, "record  digest=sha256:… matches the pulled digest")
    v.add(True, "image   id=sha256:b record=sha256:b")
    for name in ("post2.yaml", "base.yaml", "overrides.json"):
        v.add(True, f"stack   {name} sha256 image=sha256:c label=sha256:c")
    v.add(True, "stack   /stackforge/stack/ holds base.yaml, overrides.json, post2.yaml; the label names …")
    local = verify(loaded, v.image, labels_of(loaded), engine=object())  # type: ignore[arg-type]
    v.lines.extend(local.lines)  # as verify_ref appends the local checks
    v.record_tests = {"vllm-read": {"verdict": "passed", "counts": {"passed": 60, "xfailed": 4}}}
    v.record_smoke = {"qwen3-8b": {"verdict": "passed", "rows": []}, "dsv2": {"verdict": "not-run", "rows": []}}
    line = v.summary("reg/x:t")
    assert line.startswith("verified reg/x:t: digest, record, image id, 3 stack files, labels, ")
    assert line.endswith(
        f"gate {len(GATE)} lines, abi 1 line, read-only gate, tests 1/1 slices passed, "
        "smoke 1/2 recipes passed (1 not-run) — 0 failed"
    )
    checked = {c["what"]: c for c in v.checked()}
    assert checked["smoke"] == {"what": "smoke", "count": 2, "ok": None, "verdicts": {"passed": 1, "not-run": 1}}
    assert checked["tests"]["ok"] is True


def test_the_cli_ends_with_the_summary_and_json_carries_the_same_list(gate, capsys):
    loaded = load("post2", root=REPO)
    v = verify(loaded, "reg/x:t", labels_of(loaded), engine=object())  # type: ignore[arg-type]
    assert print_verification(SimpleNamespace(json=False), v, "verify reg/x:t") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == v.summary("reg/x:t") and out[-1].startswith("verified reg/x:t: labels, ")
    assert sum(line.startswith("verified ") for line in out) == 1  # one summary line, the last
    assert print_verification(SimpleNamespace(json=True), v, "pull reg/x:t") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checked"] == v.checked() and doc["summary"] == v.summary("reg/x:t (pulled)")
    v.add(False, "record  digest=sha256:0 does not match the pulled digest")
    assert print_verification(SimpleNamespace(json=False), v, "verify reg/x:t") == 1
    assert capsys.readouterr().out.splitlines()[-1].endswith("— 1 failed, refused")


def test_a_local_verify_reads_the_record_its_published_build_kept(tmp_path, gate):
    loaded = load("post2", root=make_root(tmp_path))
    root = loaded.root / "build" / "post2" / "evidence"
    root.mkdir(parents=True)
    build = evidence.new_build(root)
    (build / evidence.RESULT).write_text(json.dumps({"ok": True, "image_id": "sha256:" + "1" * 64}))
    assert local_record(loaded, "sha256:" + "1" * 64) is None  # built, never published
    smoke = {"qwen3-8b": {"verdict": "passed", "rows": [{"name": "capital", "status": "passed"}]}}
    (build / "record.json").write_text(json.dumps({"attached": {}, "record": {"smoke": smoke}}))
    assert local_record(loaded, "sha256:" + "1" * 64) == {"smoke": smoke}
    assert local_record(loaded, "sha256:" + "2" * 64) is None  # another image: no build here made it
    v = verify(loaded, "img:1", labels_of(loaded), engine=object())  # type: ignore[arg-type]
    v.record_smoke = smoke
    assert v.summary("img:1 against post2").endswith("tests: none recorded, smoke 1/1 recipes passed — 0 failed")
