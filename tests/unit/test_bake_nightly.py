"""The bake plan and the nightly's stack selection and summary (no engine: plans and data only)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.builder.run import bake as bakemod
from stackforge.clients.engine import bake_command
from stackforge.errors import UserError
from stackforge.flows.nightly import NightlyOptions, Row, Summary, _gate_summary, _host_free, nightly, select_stacks
from stackforge.stack.load import load
from tests.fixtures.stack_support import RootSpec, make_root

REPO = Path(__file__).resolve().parents[2]


def copy_stacks(dest):
    """The repository's stacks, with none of them nightly: these tests declare their own nightly stacks."""
    shutil.copytree(REPO / "stacks", dest)
    for path in dest.glob("*.yaml"):
        path.write_text(re.sub(r"(?m)^nightly: true\b.*$", "nightly: false", path.read_text()))


# The example's lock is its own (stacks/locks/example/); these children install without one.
UNLOCKED = "indexes:\n  pypi: {lock: false}\n"


def _no_nightly(root: Path) -> None:
    """None of the repository's stacks is nightly: these tests declare their own nightly stacks."""
    for path in (root / "stacks").glob("*.yaml"):
        if path.name not in ("nightly-good.yaml", "nightly-bad.yaml"):
            path.write_text(re.sub(r"(?m)^nightly: true\b.*$", "nightly: false", path.read_text()))


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(
        parts=("stacks", "patches"),
        stack_files={
            "nightly-good.yaml": "name: nightly-good\ninherits: example\nnightly: true\n" + UNLOCKED,
            "nightly-bad.yaml": "name: nightly-bad\ninherits: example\nnightly: true\n"
            + UNLOCKED
            + "packages:\n  markupsafe: {version: 3.0.2, index: pypi}\n",
        },
        edit=_no_nightly,
    )


def item(name="s-t", **kw):
    defaults = dict(
        name=name, stack="s", target="t", ref="img:1", context=Path("/ctx"), dockerfile=Path("/ctx/Dockerfile")
    )
    defaults.update(kw)
    return bakemod.BakeTarget(**defaults)


def test_target_names_are_bake_safe():
    assert bakemod.target_name("post2", "vllm-openai") == "post2-vllm-openai"
    assert bakemod.target_name("a.b", "c d") == "a_b-c_d"


def test_plan_has_one_group_and_a_target_per_stack_and_target():
    items = [
        item(
            "a-x",
            stack="a",
            target="x",
            args={"SOURCE_DATE_EPOCH": "1"},
            secrets=[("netrc", "/s/a.netrc")],
            contexts={"stackforge-cabundle": "/s/a/stackforge-cabundle"},
        ),
        item("b-x", stack="b", target="x", ref="img:2"),
    ]
    doc = bakemod.plan(items)
    assert doc["group"] == {"default": {"targets": ["a-x", "b-x"]}}
    a = doc["target"]["a-x"]
    assert a == {
        "context": "/ctx",
        "dockerfile": "/ctx/Dockerfile",
        "target": "x",
        "tags": ["img:1"],
        "args": {"SOURCE_DATE_EPOCH": "1"},
        "secret": ["id=netrc,src=/s/a.netrc"],
        "contexts": {"stackforge-cabundle": "/s/a/stackforge-cabundle"},
        "output": ["type=docker"],
    }
    assert "output" not in bakemod.plan(items, load=False)["target"]["b-x"]
    with pytest.raises(UserError, match="same bake target name"):
        bakemod.plan([item("same"), item("same")])


def test_bake_command():
    cmd = bake_command(Path("/w/bake.json"), builder="k8s", no_cache=True, metadata_file=Path("/w/m.json"))
    assert cmd == [
        "docker",
        "buildx",
        "--builder",
        "k8s",
        "bake",
        "--file",
        "/w/bake.json",
        "--progress=plain",
        "--no-cache",
        "--metadata-file",
        "/w/m.json",
    ]
    assert bake_command(Path("p.json"))[:3] == ["docker", "buildx", "bake"]
    granted = bake_command(Path("p.json"), reads=[Path("/w/ctx"), "/tmp/s/netrc"])
    assert granted[3:] == [
        "--file",
        "p.json",
        "--progress=plain",
        "--allow=fs.read=/w/ctx",
        "--allow=fs.read=/tmp/s/netrc",
    ]


def test_a_target_reads_its_context_dockerfile_secrets_and_named_contexts(tmp_path):
    ctx, secret, named = tmp_path / "ctx", tmp_path / "s" / "netrc", tmp_path / "named"
    for d in (ctx, named, secret.parent):
        d.mkdir()
    (ctx / "Dockerfile").write_text("FROM x\n")
    secret.write_text("machine x\n")
    target = item(context=ctx, dockerfile=ctx / "Dockerfile", secrets=[("netrc", str(secret)), ("gone", str(tmp_path / "no"))],
                  contexts={"cabundle": str(named), "later": bakemod.SECRET_PLACEHOLDER})  # fmt: skip
    assert target.reads() == [str(ctx), str(ctx / "Dockerfile"), str(secret), str(named)]


@pytest.mark.parametrize(
    ("buildx", "granted"), [("0.29.1+ds1", True), ("0.19.0", True), ("0.18.0", False), ("0.13.1+ds1", False)]
)
def test_the_engine_grants_a_bake_its_reads_only_where_buildx_checks_them(monkeypatch, buildx, granted):
    from stackforge.clients.engine import BuildResult, Engine

    engine, seen = Engine(), []

    def stream(cmd, **kw):
        seen.append(cmd)
        return BuildResult(0, "")

    monkeypatch.setattr(engine, "buildx_version", lambda: buildx)
    monkeypatch.setattr(engine, "stream", stream)
    engine.bake(Path("/w/bake.json"), reads=["/w/ctx"])
    assert ("--allow=fs.read=/w/ctx" in seen[0]) is granted
    assert not any(a.startswith("--allow") for a in seen[0]) or granted


def test_stack_targets(root):
    stack = load("example", root=root)
    assert bakemod.stack_targets(stack, None) == list(stack.model.targets)
    assert bakemod.stack_targets(stack, ["nope", "escape"]) == ["escape"]
    with pytest.raises(UserError, match="has no target"):
        bakemod.stack_targets(stack, ["nope"])


def test_bake_print_renders_the_matrix_of_nightly_stacks(root):
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), "bake", "--print", "--ca-bundle", "none"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["group"]["default"]["targets"] == ["nightly-bad-escape", "nightly-good-escape"]
    good = doc["target"]["nightly-good-escape"]
    # paths relative to the repository (run the bake there, or send the plan to another builder)
    assert good["context"] == "build/nightly-good/context" and good["dockerfile"] == "../Dockerfile"
    assert good["target"] == "escape" and good["output"] == ["type=docker"] and "secret" not in good
    assert (root / good["context"] / good["dockerfile"]).resolve() == root / "build" / "nightly-good" / "Dockerfile"
    assert str(root) not in proc.stdout


def test_bake_print_names_no_host_file_for_a_secret(root, tmp_path):
    bundle = tmp_path / "corp-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), "bake", "--print", "--ca-bundle", str(bundle)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    good = json.loads(proc.stdout)["target"]["nightly-good-escape"]
    # the CA bundle is a named context (bind-mounted by the steps that download), not a secret
    assert "secret" not in good
    assert good["contexts"] == {
        "stackforge-cabundle": "(on the host that runs the bake: a directory holding the CA bundle (--ca-bundle) as ca.pem)"
    }
    assert str(tmp_path) not in proc.stdout


def test_bake_without_nightly_stacks_says_what_to_do(tmp_path):
    r = tmp_path / "repo"
    copy_stacks(r / "stacks")
    shutil.copytree(REPO / "patches", r / "patches")
    proc = subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(r), "bake", "--print"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "nightly: true" in proc.stderr and "fix:" in proc.stderr


def test_select_stacks_reports_load_and_lint_failures_and_skips_non_nightly(root):
    (root / "stacks" / "broken.yaml").write_text("name: broken\ninherits: example\nnightly: true\npackges: {}\n")
    (root / "stacks" / "unlinted.yaml").write_text(
        "name: unlinted\ninherits: post2\nnightly: true\npackages:\n  torchvision: {version: 0.26.0.post1+musa5.2.0}\n"
    )
    loaded, rows = select_stacks(root, None)
    assert sorted(s.name for s in loaded) == ["nightly-bad", "nightly-good"]
    by = {r.stack: r for r in rows}
    assert by["broken"].stage == "load" and "packges" in by["broken"].reason
    assert by["unlinted"].stage == "lint" and "torchvision" in by["unlinted"].reason
    assert all(r.status == "failed" for r in rows)
    named, _ = select_stacks(root, ["example"])  # named stacks need no nightly flag
    assert [s.name for s in named] == ["example"]


def test_gate_summary():
    assert _gate_summary(["PASS import a", "gate result: 5 PASS, 0 FAIL"]) == "gate result: 5 PASS, 0 FAIL"
    assert _gate_summary(["PASS import a", "FAIL import b expected=1 found=2"]) == "1 FAIL"
    assert _gate_summary([]) is None


def test_summary_rows_markdown_and_json(tmp_path):
    s = Summary(date="20260929", registry="r.example.com/x", duration_s=12.0)
    s.rows = [
        Row(
            "good",
            "escape",
            "published",
            tag="r/x:t-20260929-r1",
            digest="sha256:" + "a" * 64,
            gate="gate result: 5 PASS, 0 FAIL",
            duration_s=3.2,
            platform="linux/amd64",
        ),
        Row(
            "bad",
            "escape",
            "failed",
            stage="gate",
            gate="gate result: 5 PASS, 1 FAIL",
            reason="bad/escape: dependency gate failed:\n  FAIL import markupsafe expected=3.0.2 | found=3.0.3",
        ),
    ]
    assert not s.ok
    md = s.markdown()
    assert "| stack | target | platform | status |" in md
    assert "| good | escape | linux/amd64 | published | `r/x:t-20260929-r1` |" in md
    assert "| bad | escape |  | FAILED (gate) |" in md  # a row of no known platform leaves its cell empty
    assert "FAILED (gate)" in md and "expected=3.0.2 \\| found=3.0.3" in md
    assert "1 of 2 passed" in md
    doc = s.to_json()
    assert doc["ok"] is False and [r["status"] for r in doc["rows"]] == ["published", "failed"]
    assert doc["rows"][1]["stage"] == "gate"
    assert doc["rows"][0]["platform"] == "linux/amd64" and "platform" not in doc["rows"][1]
    assert Summary(date="d", registry="r").ok is False  # nothing ran: not a success


def test_select_stacks_applies_overrides_to_every_stack(root):
    loaded, rows = select_stacks(root, None, overrides=["description=from --set"])
    assert rows == [] and sorted(s.name for s in loaded) == ["nightly-bad", "nightly-good"]
    assert all(s.model.description == "from --set" for s in loaded)
    named, _ = select_stacks(root, ["example", "post2"], overrides=["description=named"])
    assert [s.model.description for s in named] == ["named", "named"]


def test_select_stacks_applies_each_stack_its_own_overrides(root):
    own = {"nightly-good": ["description=good"], "example": ["description=ex"]}
    asked = []

    def for_stack(name):
        asked.append(name)
        return ["gate.prepare=[]", *own.get(name, [])]

    loaded, rows = select_stacks(root, None, overrides=for_stack)
    assert rows == [] and {s.name: s.model.description for s in loaded}["nightly-good"] == "good"
    assert {s.name: s.model.description for s in loaded}["nightly-bad"] != "good"
    assert "nightly-bad" in asked and "nightly-good" in asked
    named, _ = select_stacks(root, ["example", "post2"], overrides=for_stack)
    assert named[0].model.description == "ex" and named[1].model.description != "ex"


def test_the_summary_says_which_overrides_each_rows_stack_was_loaded_with(root):
    """Both stacks fail to load (so nothing is built); the summary keeps each one's overrides, redacted."""
    own = {
        "nightly-good": ["packges.x=1", "indexes.pypi.url=https://user:s3cret@idx.example/simple"],
        "nightly-bad": ["packges.y=2"],
    }
    out = root / "out"
    summary = nightly(
        root,
        "127.0.0.1:9/team",
        NightlyOptions(
            date="20260929",
            out=out,
            overrides=lambda name: ["description=every", *own.get(name, [])],
            echo=lambda line: None,
        ),
    )
    rows = {r.stack: r for r in summary.rows}
    assert set(rows) == {"nightly-good", "nightly-bad"} and all(r.stage == "load" for r in rows.values())
    assert rows["nightly-bad"].overrides == ["description=every", "packges.y=2"]
    assert rows["nightly-good"].overrides == [
        "description=every",
        "packges.x=1",
        "indexes.pypi.url=https://***@idx.example/simple",
    ]
    assert summary.overrides == ["description=every"]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["overrides"] == ["description=every"]
    assert {r["stack"]: r["overrides"] for r in doc["rows"]} == {s: r.overrides for s, r in rows.items()}
    md = (out / "summary.md").read_text()
    assert "Overrides: `--set description=every`" in md
    assert "Overrides of `nightly-bad`: `--set packges.y=2`" in md
    assert (
        "Overrides of `nightly-good`: `--set packges.x=1` `--set indexes.pypi.url=https://***@idx.example/simple`" in md
    )
    assert "s3cret" not in md and "s3cret" not in json.dumps(doc)


def test_one_override_list_applies_to_every_row(root):
    options = NightlyOptions(date="20260929", out=root / "out", overrides=["packges.x=1"], echo=lambda line: None)
    summary = nightly(root, "127.0.0.1:9/team", options)
    assert summary.overrides == ["packges.x=1"] and all(r.overrides == ["packges.x=1"] for r in summary.rows)
    assert "Overrides of" not in summary.markdown()


def test_an_override_that_breaks_a_stack_fails_its_row_only_if_it_is_a_nightly_stack(root):
    """post1/post2 have no markupsafe upstream: the override makes them invalid, but they are not nightly stacks."""
    loaded, rows = select_stacks(root, None, overrides=["upstreams.markupsafe.sdist.version=3.0.3"])
    assert sorted(s.name for s in loaded) == ["nightly-bad", "nightly-good"] and rows == []
    loaded, rows = select_stacks(root, None, overrides=["upstreams.markupsafe.sdist.version=3.0.3", "packges.x=1"])
    assert loaded == [] and sorted(r.stack for r in rows) == ["nightly-bad", "nightly-good"]
    assert all(r.stage == "load" and "packges" in r.reason for r in rows)


def _run_nightly_command(monkeypatch, tmp_path, *sets):
    from stackforge.cli import nightly as cmd
    from stackforge.cli.main import build_parser

    seen = {}

    def fake_nightly(root, registry, options, **kw):
        seen.update(vars(options), **kw, registry=registry)
        return Summary(date="20260929", registry=registry, rows=[Row("s", "t", "published")])

    monkeypatch.setattr(cmd, "nightly", fake_nightly)
    (tmp_path / "stacks").mkdir(exist_ok=True)
    for name in ("post1", "post2"):
        (tmp_path / "stacks" / f"{name}.yaml").write_text(f"name: {name}\n")
    argv = ["--root", str(tmp_path), "nightly", "--registry", "127.0.0.1:5000/x", "--json"]
    for value in sets:
        argv += ["--set", value]
    args = build_parser().parse_args(argv)
    return args.func(args), seen


def test_nightly_command_takes_set_and_passes_it_on(monkeypatch, tmp_path):
    code, seen = _run_nightly_command(monkeypatch, tmp_path, "base.image=a/b:c", "description=d")
    assert code == 0 and seen["registry"] == "127.0.0.1:5000/x"
    assert seen["overrides"]("post1") == seen["overrides"]("post2") == ["base.image=a/b:c", "description=d"]


def test_nightly_command_passes_a_scoped_set_to_its_stack_only(monkeypatch, tmp_path):
    code, seen = _run_nightly_command(
        monkeypatch, tmp_path, "base.image=a/b:c", "post2:packages.torch.version=2.8.0", "description=x:y"
    )
    assert code == 0
    assert seen["overrides"]("post2") == ["base.image=a/b:c", "packages.torch.version=2.8.0", "description=x:y"]
    assert seen["overrides"]("post1") == ["base.image=a/b:c", "description=x:y"]


def test_nightly_command_refuses_a_scope_naming_no_stack_of_the_repository(monkeypatch, tmp_path):
    with pytest.raises(UserError) as err:
        _run_nightly_command(monkeypatch, tmp_path, "post9:description=d")
    assert "post9" in err.value.message and "post1, post2" in err.value.fix


def test_nightly_command_refuses_a_scope_naming_a_stack_the_run_does_not_build(monkeypatch, tmp_path):
    from stackforge.cli import nightly as cmd
    from stackforge.cli.main import build_parser

    monkeypatch.setattr(cmd, "nightly", lambda *a, **kw: pytest.fail("nightly ran despite the bad scope"))
    root = make_root(tmp_path)  # the real post1 (not nightly) and post2 (nightly: true)
    argv = ["--root", str(root), "nightly", "--registry", "127.0.0.1:5000/x", "--set", "post1:description=d"]
    args = build_parser().parse_args(argv)
    with pytest.raises(UserError) as err:
        args.func(args)
    assert "'post1' names a stack this command does not work on" in err.value.message
    assert "(post2)" in err.value.fix
    # Named on the command line, post1 is built, so the scope is fine.
    ok = build_parser().parse_args([*argv[:5], "post1", *argv[5:]])
    monkeypatch.setattr(
        cmd, "nightly", lambda *a, **kw: Summary(date="20260929", registry="r", rows=[Row("post1", "t", "published")])
    )
    assert ok.func(ok) == 0


def test_an_interrupted_bake_ends_its_log_with_the_signal_and_says_where_it_is(tmp_path):
    import signal

    from stackforge.signals import Interrupted

    class InterruptedEngine:
        def bake(self, plan_file, *, no_cache=False, metadata_file=None, on_line=None, log_file=None, reads=()):
            log_file.write_text("#1 building\n")
            raise Interrupted(signal.SIGINT)

    with pytest.raises(Interrupted) as exc:
        bakemod.run([item("a")], tmp_path, engine=InterruptedEngine())
    assert exc.value.exit_code == 130
    assert exc.value.render() == f"error: interrupted by SIGINT; the bake was stopped (log: {tmp_path / 'bake.log'})"
    lines = (tmp_path / "bake.log").read_text().splitlines()
    assert lines[0] == "#1 building" and lines[-1].startswith("stackforge: interrupted by SIGINT after ")
    assert json.loads((tmp_path / "bake.json").read_text())["group"]["default"]["targets"] == ["a"]


def test_a_summary_names_no_directory_of_the_host(tmp_path):
    """Paths inside the run directory by their own names, the repository's by their path in it."""
    out, root = tmp_path / "build" / "nightly" / "20260929", tmp_path
    text = f'{{"reason": "build failed (log: {root}/build/x/evidence/1/build.log)", "log": "{out}/bake.log"}}'
    assert (
        _host_free(text, out, root)
        == '{"reason": "build failed (log: build/x/evidence/1/build.log)", "log": "bake.log"}'
    )


@pytest.mark.parametrize("where", ["stacks", ".", "foreign"])
def test_the_nightly_never_writes_into_its_inputs_or_a_directory_of_other_files(root, where):
    out = root / where
    if where == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    options = NightlyOptions(date="20260929", out=out, overrides=["packges.x=1"], echo=lambda line: None)
    with pytest.raises(UserError) as err:
        nightly(root, "127.0.0.1:9/team", options)
    assert err.value.file == "--out"
    assert ("would delete what it reads" if where != "foreign" else "did not write") in err.value.message
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_a_night_directory_of_an_earlier_run_is_the_nightly_s_own(root):
    out = root / "night"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # written by a nightly before directories were marked
    options = NightlyOptions(date="20260929", out=out, overrides=["packges.x=1"], echo=lambda line: None)
    nightly(root, "127.0.0.1:9/team", options)
    assert (out / ".stackforge-output").read_text() == "stackforge nightly\n"
