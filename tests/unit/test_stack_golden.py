"""Golden outputs of `stackforge show / diff / tags` on the real stacks.

The golden files live in tests/unit/golden/. After an intended change to the stacks
or the output format, regenerate them and review the diff:

    STACKFORGE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_stack_golden.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.fixtures.stack_support import REPO, make_root, run_cli

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("STACKFORGE_UPDATE_GOLDEN") == "1"

LOCAL_TAG = "vllm-musa:ubuntu22.04_py3.10_musa_runtime_5.2_pytorch_release_2.11.0.post2_musa5.2.0"
PUBLISH_REF = "registry.mthreads.com/mcconline/inference/vllm:v0.28.0-ph1-5.2.0-torch2.11.0.post2-20260929-r2"
PUBLISH_ARGS = ("--registry", "registry.mthreads.com/mcconline/inference", "--date", "20260929", "--revision", "2")

# A host path (the image's own paths such as /out/wheels are fine).
ABSOLUTE = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|Users|var|private|mnt|opt|srv)/")


def check_golden(name: str, text: str) -> None:
    assert str(REPO) not in text, "output embeds the repository path"
    assert not ABSOLUTE.search(text), f"output embeds a host path: {ABSOLUTE.search(text).group(0)!r}"
    compare_golden(name, text)


def compare_golden(name: str, text: str) -> None:
    """``text`` equals tests/unit/golden/NAME; under STACKFORGE_UPDATE_GOLDEN=1 it is written there instead."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"missing {path.relative_to(REPO)}; create it with STACKFORGE_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"output differs from {path.relative_to(REPO)}; if the change is intended, regenerate with "
        "STACKFORGE_UPDATE_GOLDEN=1 and review the diff"
    )


GOLDEN_CASES = [
    ("show_post2.txt", ("show", "post2")),
    ("show_post2.json", ("show", "post2", "--json")),
    ("diff_post1_post2.md", ("diff", "post1", "post2")),
    ("diff_post1_post2.json", ("diff", "post1", "post2", "--format", "json")),
    ("tags_post2.txt", ("tags", "post2")),
    ("tags_post2_publish.txt", ("tags", "post2", *PUBLISH_ARGS)),
]


@pytest.mark.parametrize("golden,args", GOLDEN_CASES, ids=[c[0] for c in GOLDEN_CASES])
def test_golden_output(capsys, golden, args):
    rc, out, err = run_cli(capsys, REPO, *args)
    assert (rc, err) == (0, "")
    check_golden(golden, out)


@pytest.mark.parametrize("golden,args", GOLDEN_CASES, ids=[c[0] for c in GOLDEN_CASES])
def test_output_does_not_depend_on_where_the_repository_is(tmp_path, capsys, golden, args):
    """The same stacks under another root print byte-for-byte the same thing."""
    _, here, _ = run_cli(capsys, REPO, *args)
    rc, there, err = run_cli(capsys, make_root(tmp_path), *args)
    assert (rc, err) == (0, "")
    assert str(tmp_path) not in there
    assert there == here


def test_tags_post2_prints_the_local_tag(capsys):
    rc, out, err = run_cli(capsys, REPO, "tags", "post2")
    assert (rc, err) == (0, "")
    assert out == LOCAL_TAG + "\n"


def test_tags_post2_with_registry_prints_the_publish_reference(capsys):
    rc, out, err = run_cli(capsys, REPO, "tags", "post2", *PUBLISH_ARGS)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == LOCAL_TAG
    assert lines[1] == PUBLISH_REF
    # the rest are the moving aliases, under the same registry and repository
    assert lines[2:] and all(line.startswith("registry.mthreads.com/mcconline/inference/vllm:") for line in lines[2:])


def test_tags_without_revision_says_so_on_stderr(capsys):
    rc, out, err = run_cli(
        capsys, REPO, "tags", "post2", "--registry", "registry.example.com/team", "--date", "20260929"
    )
    assert rc == 0
    assert out.splitlines()[1] == "registry.example.com/team/vllm:v0.28.0-ph1-5.2.0-torch2.11.0.post2-20260929-r1"
    assert "revision 1 shown" in err


def test_tags_post1(capsys):
    rc, out, _ = run_cli(capsys, REPO, "tags", "post1", *PUBLISH_ARGS)
    assert rc == 0
    assert out.splitlines()[:2] == [
        "vllm-musa:ubuntu22.04_py3.10_musa_runtime_5.2_pytorch_release_2.11.0.post1_musa5.2.0",
        "registry.mthreads.com/mcconline/inference/vllm:v0.28.0-ph1-5.2.0-torch2.11.0.post1-20260929-r2",
    ]


def test_show_text_and_json_agree(capsys):
    _, text, _ = run_cli(capsys, REPO, "show", "post2")
    _, raw, _ = run_cli(capsys, REPO, "show", "post2", "--json")
    info = json.loads(raw)
    assert info["local_tag"] == LOCAL_TAG
    assert info["files"] == ["stacks/post1.yaml", "stacks/post2.yaml"]
    assert info["stack"]["name"] == "post2"
    assert info["stack"]["packages"]["torchaudio"]["version"] == "2.11.0.post2+musa5.2.0"
    # inherited from post1, untouched by post2
    assert info["stack"]["packages"]["torchaudio"]["index"] == "mthreads"
    assert info["stack"]["platform"]["python"] == "3.10"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", info["fingerprint"])
    assert f"fingerprint:  {info['fingerprint']}\n" in text
    assert f"local tag:    {LOCAL_TAG}\n" in text


def test_fingerprint_follows_the_inputs(capsys):
    def fp(*extra):
        rc, raw, err = run_cli(capsys, REPO, "show", "post2", "--json", *extra)
        assert (rc, err) == (0, "")
        return json.loads(raw)

    plain, again = fp(), fp()
    moved = fp("--set", "base.image=stackforge/base:bookworm")
    assert plain["fingerprint"] == again["fingerprint"]
    assert moved["fingerprint"] != plain["fingerprint"]
    assert moved["overrides"] == ["base.image=stackforge/base:bookworm"]
    assert moved["stack"]["base"]["image"] == "stackforge/base:bookworm"
    # the tag is derived from the pins, not from the base image
    assert moved["local_tag"] == plain["local_tag"]


def test_diff_markdown_and_json_carry_the_same_rows(capsys):
    _, md, _ = run_cli(capsys, REPO, "diff", "post1", "post2")
    _, raw, _ = run_cli(capsys, REPO, "diff", "post1", "post2", "--format", "json")
    d = json.loads(raw)
    assert (d["old"], d["new"]) == ("post1", "post2")
    assert [r["package"] for r in d["changed"]] == [
        "torchada",
        "torch",
        "torch_musa",
        "torchvision",
        "torchaudio",
        "deep_ep",
    ]
    assert d["added"] == [] and d["removed"] == []
    torchaudio = next(r for r in d["changed"] if r["package"] == "torchaudio")
    assert (torchaudio["before"], torchaudio["after"]) == ("2.11.0+musa5.2.0", "2.11.0.post2+musa5.2.0")
    lines = md.splitlines()
    assert lines[:2] == ["| package | before | after | note |", "| --- | --- | --- | --- |"]
    rows = [*d["changed"], *d["added"], *d["removed"], *d["unchanged"]]
    assert lines[2 : 2 + len(rows)] == [
        f"| {r['package']} | {r['before']} | {r['after']} | {r['note']} |" for r in rows
    ]
    # post1 → post2 changes pins, and drops post1's exceptions to the plugin's pins for the post1 train
    assert [(r["package"], r["after"]) for r in d["other"]] == [
        (f"upstreams.vllm_musa.agree.except.{n}", "—")
        for n in ("torch", "torch_musa", "torchvision", "torchaudio", "deep_ep", "torchada")
    ]
