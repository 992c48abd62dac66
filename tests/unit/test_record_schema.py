"""The publish record as a model: the JSON it writes is the JSON it was given (keys, order, bytes), reading
refuses a bad record naming the key, older records still read, and docs/record-schema.json is current."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from pydantic import BaseModel

from stackforge.cli.main import main
from stackforge.errors import UserError
from stackforge.publish import record as records
from stackforge.publish import record_schema
from stackforge.publish.record_schema import OverlayPart, PublishRecord
from stackforge.stack.load import load
from tests.fixtures.records import a_record

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "a" * 64


def full_record() -> dict:
    """A record as today's writer makes it: the head, the details (inputs fingerprint, build id) and an overlay."""
    rec = a_record(DIGEST)
    keys = list(rec)
    at = keys.index("labels")
    rec = {**{k: rec[k] for k in keys[:at]}, "inputs_fingerprint": None, **{k: rec[k] for k in keys[at:]}}
    rec["smoke"] = {"chat": {"verdict": "passed", "rows": [{"name": "reply", "status": "passed"}]}}
    rec["build_id"] = "20260929-101500-1"
    rec["overlay"] = {
        "name": "jev",
        "fingerprint": "sha256:" + "1" * 64,
        "definition": {"sha256": "sha256:" + "2" * 64, "text": "base: {stack: post2}\n"},
        "base": {"identity": None, "image_id": "sha256:" + "3" * 64, "ref": None},
        "ranges": {"vllm": "sha256:" + "4" * 64},
        "changed": {},
        "files": "sha256:" + "6" * 64,
    }
    return rec


def test_the_record_writes_the_keys_it_was_given_in_their_order_and_bytes():
    for rec in (full_record(), a_record(DIGEST)):
        model = PublishRecord.model_validate(rec)
        assert json.dumps(model.data()) == json.dumps(rec)  # same keys, same order, same values
        assert records.body_of(model) == (json.dumps(rec, indent=2, sort_keys=True) + "\n").encode()


def test_the_model_built_from_keywords_writes_the_same_record():
    rec = full_record()
    assert PublishRecord(**rec).data() == rec and list(PublishRecord(**rec).data()) == list(rec)


def test_older_records_and_keys_of_a_newer_writer_still_read():
    older = a_record(DIGEST)  # no inputs_fingerprint, build_id, overlay
    assert record_schema.problems(older) == [] and record_schema.parse(older).overlay is None
    newer = {**full_record(), "provenance": {"builder": "x"}}
    assert record_schema.parse(newer).data()["provenance"] == {"builder": "x"}


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"digest": "sha256:zz"}, "digest: not a sha256 digest"),
        ({"tags": ["v1", 3]}, "tags: not a list of tags"),
        ({"labels": {"a": 1}}, "labels: not an object of strings"),
        ({"stack_files": {"example.yaml": {"text": "x"}}}, "stack_files: an entry without a sha256"),
        ({"gate": {"gate": [1]}}, "gate: at gate.0"),
        ({"overlay": []}, "overlay: not an object"),
        ({"overlay": None}, "overlay: not an object"),
        ({"image_id": 7}, "image_id: missing or not a str"),
    ],
)
def test_a_bad_record_is_a_user_error_naming_the_key(changes, named):
    with pytest.raises(UserError, match="not a stackforge.publish-record/v1 record") as err:
        record_schema.parse({**a_record(DIGEST), **changes}, "the record sha256:ff")
    assert named in err.value.message and "the record sha256:ff" in err.value.message


def test_the_json_schema_accepts_the_records_the_model_accepts_and_refuses_others():
    schema = record_schema.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(full_record())) == []
    assert list(validator.iter_errors(a_record(DIGEST))) == []
    assert list(validator.iter_errors(a_record(DIGEST, schema="other/v9")))
    assert list(validator.iter_errors(a_record("sha256:zz")))
    assert list(validator.iter_errors({**a_record(DIGEST), "overlay": None}))


def test_every_field_is_described():
    models: set[type[BaseModel]] = {
        c for c in vars(record_schema).values() if isinstance(c, type) and issubclass(c, record_schema.Part)
    } - {record_schema.Part}
    assert {PublishRecord, OverlayPart, record_schema.FileEntry, record_schema.SmokeRow} <= models
    for cls in models:
        assert (cls.__doc__ or "").strip(), cls.__name__
        for name, info in cls.model_fields.items():
            assert (info.description or "").strip(), f"{cls.__name__}.{name} has no description"


def test_the_checked_in_schema_is_current():
    assert not record_schema.generate(REPO, check=True).stale, "run: stackforge schema --record --docs"


def test_schema_record_prints_it_and_docs_check_fails_on_a_stale_file(tmp_path: Path, capsys):
    shutil.copytree(REPO / "stacks", tmp_path / "stacks")
    assert main(["--root", str(tmp_path), "schema", "--record"]) == 0
    assert json.loads(capsys.readouterr().out) == record_schema.json_schema()
    assert main(["--root", str(tmp_path), "schema", "--record", "--docs", "--check"]) == 1
    out, err = capsys.readouterr()
    assert "docs/record-schema.json: out of date" in out and "fix: run: stackforge schema --record --docs" in err
    assert main(["--root", str(tmp_path), "schema", "--record", "--docs"]) == 0
    assert (tmp_path / record_schema.SCHEMA_FILE).read_text(encoding="utf-8") == record_schema.schema_text()
    assert main(["--root", str(tmp_path), "schema", "--record", "--docs", "--check"]) == 0
    assert not (tmp_path / "docs" / "stack-reference.md").exists()  # --record leaves the stack reference alone


def test_a_stack_record_holds_its_keys_in_the_order_they_were_always_written(tmp_path: Path):
    evidence = tmp_path / "20260929-101500-1"
    (evidence / "smoke" / "chat").mkdir(parents=True)
    (evidence / "gate.txt").write_text("gate result: 4 PASS, 0 FAIL\n")
    rows = [{"name": "reply", "status": "passed", "seconds": 2}, "not a row"]
    (evidence / "smoke" / "chat" / "smoke.json").write_text(json.dumps({"verdict": "passed", "rows": rows}))
    (evidence / "tests" / "contracts").mkdir(parents=True)
    slice_result = {"verdict": "failed", "counts": {"passed": 19, "failed": 1}, "expected": {"passed": 20}, "tests": []}
    (evidence / "tests" / "contracts" / "result.json").write_text(json.dumps(slice_result))
    published = SimpleNamespace(
        aliases={"v1-latest": "moved", "v1-stable": "not moved: newer"},
        repository="127.0.0.1:5000/team/vllm",
        digest=DIGEST,
        image_id="sha256:" + "b" * 64,
        tag="v1-20260929-r1",
    )
    made = records.make(load("example", REPO), "escape", evidence, published, {"org.stackforge.inputs": "i"})
    data = made.data()
    assert list(data) == [
        *("schema", "stack", "target", "repository", "digest", "image_id", "tags", "stack_files", "overrides"),
        *("pins", "options", "fingerprint", "inputs_fingerprint", "labels", "gate", "smoke", "tests", "build_id"),
    ]
    assert data["tags"] == ["v1-20260929-r1", "v1-latest"] and data["build_id"] == evidence.name
    assert data["gate"] == {"gate": ["gate result: 4 PASS, 0 FAIL"], "abi": [], "readonly": []}
    assert data["smoke"] == {"chat": {"verdict": "passed", "rows": [{"name": "reply", "status": "passed"}]}}
    assert data["tests"] == {
        "contracts": {"verdict": "failed", "counts": {"passed": 19, "failed": 1}, "expected": {"passed": 20}}
    }
    assert record_schema.parse(json.loads(records.body_of(made))) == made


@pytest.mark.parametrize("name", ["../../../tmp/owned.yaml", "/etc/cron.d/x.yaml", "sub/post2.yaml", "POST.yaml", "x"])
def test_a_record_naming_a_path_as_a_stack_file_is_refused(name):
    files = {name: {"sha256": "sha256:" + "0" * 64, "text": "owned"}}
    with pytest.raises(UserError) as err:
        record_schema.parse({**a_record(DIGEST), "stack_files": files}, "the record sha256:ff")
    assert "stack_files: the name" in err.value.message and "not a plain file name of stacks/" in err.value.message


def test_the_rebuild_writes_a_record_s_files_only_under_its_own_stacks(tmp_path):
    from stackforge.flows.rebuild import scratch_root

    checkout = tmp_path / "checkout"
    (checkout / "stacks").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (checkout / "stacks" / "example.yaml").symlink_to(outside / "example.yaml")  # a link in the checkout's stacks/
    good = PublishRecord.model_validate(a_record(DIGEST))
    root = scratch_root(good, checkout, tmp_path / "scratch")
    written = root / "stacks" / "example.yaml"
    assert not written.is_symlink() and written.read_text() == good.stack_files["example.yaml"].text
    assert list(outside.iterdir()) == []  # the link was replaced, not written through
    bad = PublishRecord.model_construct(
        **{**good.__dict__, "stack_files": {"../owned.yaml": good.stack_files["example.yaml"]}}
    )
    with pytest.raises(UserError, match="is not a file name of stacks/"):
        scratch_root(bad, checkout, tmp_path / "scratch2")
    assert not (tmp_path / "scratch2" / "owned.yaml").exists() and not (tmp_path / "owned.yaml").exists()


def test_verify_shows_the_scan_the_record_carries_waived_findings_with_their_reason():
    from stackforge.builder.run.verify import Verification
    from stackforge.flows.operator import scan_lines

    waived = {"id": "GHSA-xxxx", "package": "torchvision", "version": "0.26.0.post2+musa5.2.0", "severity": "high",
              "reason": "the vendor's build; no fixed release on its line", "expires": "2027-01-31",
              "waiver": "stacks/waivers.yaml:3"}  # fmt: skip
    cases = [
        ({"verdict": "waived", "fail_on": "high", "waived": [waived], "findings": 3}, 0, "waived GHSA-xxxx"),
        ({"verdict": "blocked", "fail_on": "high", "blocked": ["PYSEC-1"], "findings": 1}, 2, "blocked by PYSEC-1"),
        ({"verdict": "clear", "fail_on": "high", "findings": 0}, 0, "clear at high (0 findings)"),
        (None, 0, "none recorded"),
    ]
    for scan, failed, said in cases:
        rec = record_schema.parse({**a_record(DIGEST), **({"scan": scan} if scan else {})})
        v = Verification("img", "example")
        scan_lines(v, rec)
        assert v.failed == failed and any(said in line for line in v.lines), v.lines
        if scan and scan["verdict"] == "waived":
            assert any("the vendor's build" in line and "until 2027-01-31" in line for line in v.lines)
    with pytest.raises(UserError, match="scan"):
        record_schema.parse({**a_record(DIGEST), "scan": {"verdict": "fine", "fail_on": "high"}})


@pytest.mark.parametrize(
    "built_on, here, named",
    [("classic", True, True), ("containerd", False, True), ("classic", False, False), (None, True, False)],
)
def test_a_differing_rebuild_in_the_other_image_store_says_so(built_on, here, named):
    """The record names the image store the image was built in; a rebuild that differs in the other store says the
    two stores write different layers, and names the store to rebuild on. The record's key is validated."""
    from stackforge.flows.rebuild import compare

    engine = SimpleNamespace(uses_containerd_store=lambda: here)
    config = {"architecture": "amd64", "rootfs": {"diff_ids": []}, "config": {"Labels": {"a": "1"}}}
    rebuilt = {**config, "config": {"Labels": {"a": "2"}}}
    ours = SimpleNamespace(
        image_id="sha256:" + "c" * 64,
        digest=DIGEST,
        layers=[],
        config=SimpleNamespace(data=json.dumps(rebuilt).encode()),
    )
    manifest = {"config": {"digest": "sha256:" + "d" * 64}, "layers": []}
    lines = compare(ours, DIGEST, manifest, config, engine, built_on=built_on)  # type: ignore[arg-type]
    assert lines[0][0] is False and lines[0][1].startswith("rebuild differs")
    store = [text for ok, text in lines if "image store" in text]
    if named:
        other = "containerd" if here else "classic"
        assert store == [
            f"rebuild ran in the {other} image store, the image was built in the {built_on} one: the two write "
            f"different layers for one build; rebuild on a host of the {built_on} store to compare like with like"
        ]
    else:
        assert store == []
    assert records.image_store(engine) == ("containerd" if here else "classic")  # type: ignore[arg-type]
    assert record_schema.problems({**a_record(DIGEST), "image_store": "containerd"}) == []
    assert record_schema.problems({**a_record(DIGEST), "image_store": "zfs"}) == ["image_store: missing or not a str"]
