"""The one-process nightly over a stack that declares platform lines: every line built and gated (the build is a
stand-in callable that records which line it built), all published as one index through the publish callable
(``publish_platforms``'s place), a row per line. The decisions — what is published, when the aliases move, what each
row and the summary say — are the nightly's own."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stackforge.errors import BuildFailed, UserError
from stackforge.flows.nightly import (
    NightlyOptions,
    NightlyRun,
    Row,
    Summary,
    _baked,
    _one,
    _platform_lines,
    evidence_name,
    lines_of,
    night_lines,
    platforms_of,
)
from stackforge.flows.nightly_smoke import NightlyRecipes
from stackforge.publish.publisher import PublishOptions
from stackforge.recipes.load import load_recipe
from stackforge.smoke.report import RowResult, SmokeReport
from stackforge.smoke.run import SmokeOptions
from stackforge.stack.load import load
from stackforge.stack.resolved import ResolvedStack
from tests.fixtures.stack_support import RootSpec

REPO = Path(__file__).resolve().parents[2]
TAG = "registry.test/x/stackforge-example-multi:py3.11-markupsafe3.0.3-20261206-r1"
LATEST = "py3.11-latest"
DIGEST = {"amd64": "sha256:" + "a" * 64, "arm64": "sha256:" + "b" * 64}
INDEX = "sha256:" + "c" * 64


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(stacks=("example.yaml", "example-multi.yaml"))


class Fakes:
    """The build (``fail``: the lines whose gate fails), the index publish and the smoke, each recording its calls."""

    def __init__(self, root: Path, fail: tuple[str, ...] = (), smoke: str = "passed"):
        self.root, self.fail, self.smoke_status = root, fail, smoke
        self.built: list[tuple[str | None, str, bool]] = []  # (line, target, own)
        self.published: list[bool] = []  # move_aliases of each index publish
        self.single: list[str] = []  # the stacks publish_stack was asked for (never, for a stack of lines)
        self.tested: list[str] = []
        self.smoked: list[str] = []

    def build(self, stack, opts, **kw):
        line = stack.line
        self.built.append((line.name, opts["target"], line.own))
        kw["echo"]("#7 [deps 2/5] RUN pip install …")
        evidence = self.root / "build" / f"{stack.name}{line.suffix}" / "evidence" / "20261206T010203Z-001"
        evidence.mkdir(parents=True, exist_ok=True)
        machine = "aarch64" if line.arch == "aarch64" else "x86_64"
        gate = [f"PASS machine {machine}", "gate result: 8 PASS, 0 FAIL"]
        if line.name in self.fail:
            gate = [f"PASS machine {machine}", "FAIL import markupsafe expected=3.0.3 found=3.0.2"]
        (evidence / "gate.txt").write_text("\n".join(gate) + "\n")
        if line.name in self.fail:
            raise BuildFailed(f"{stack.name}/{opts['target']}: dependency gate failed")
        return SimpleNamespace(evidence=evidence, gate=gate)

    def publish_stack(self, stack, registry, **kw):
        self.single.append(stack.name)
        raise AssertionError("a stack of platform lines is published as one index")

    def publish_platforms(self, stack, registry, *, move_aliases=True, **kw):
        assert sorted(stack.platform_lines()) == ["amd64", "arm64"]
        self.published.append(move_aliases)
        status = "published" if len(self.published) == 1 else "already-published"
        aliases = {LATEST: "moved"} if move_aliases else {}
        index = SimpleNamespace(status=status, reference=TAG, digest=INDEX, aliases=aliases, scan=None)
        children = {
            name: SimpleNamespace(
                digest=DIGEST[name], scan={"verdict": "clear", "blocked": []} if name == "arm64" else None
            )
            for name in ("amd64", "arm64")
        }
        return SimpleNamespace(index=index, platforms=children)

    def test(self, stack, ref, where, workspace, engine=None):
        self.tested.append(stack.line.name)
        return SimpleNamespace(verdict="passed", reason="")

    def smoke(self, recipe, image, outdir, **kw):
        self.smoked.append(image)
        outdir.mkdir(parents=True)
        rep = SmokeReport(recipe.name, f"recipes/{recipe.name}.yaml", image)
        rep.rows = [RowResult("row0", "chat", self.smoke_status, None if self.smoke_status == "passed" else "it went")]
        return rep

    def run(self, recipes: NightlyRecipes | None = None) -> NightlyRun:
        return NightlyRun(
            registry="registry.test/x",
            date="20261206",
            publishing=PublishOptions(),
            workspace=None,  # type: ignore[arg-type]
            engine=SimpleNamespace(image_id=lambda ref: "sha256:" + "e" * 64),
            outdir=self.root / "night",
            echo=lambda line: None,
            build=self.build,
            options=lambda **kw: kw,
            publish=self.publish_stack,
            publish_platforms=self.publish_platforms,
            smoke=self.smoke,
            recipes=recipes or NightlyRecipes(),
            smoking=SmokeOptions(allow_missing_hardware=True),
        )


def multi(root: Path) -> ResolvedStack:
    return ResolvedStack.of(load("example-multi", root=root))


def recipes() -> NightlyRecipes:
    return NightlyRecipes({("example-multi", "escape"): [load_recipe(REPO, "qwen3-8b")]})


def test_every_line_is_built_and_published_as_one_index_a_row_per_platform(root):
    fakes = Fakes(root)
    rows = _platform_lines(fakes.run(), multi(root), "escape")
    assert fakes.built == [("amd64", "escape", True), ("arm64", "escape", False)]
    assert fakes.published == [True] and fakes.single == []  # one publish of the index, its aliases with it
    assert [(r.platform, r.status, r.tag, r.digest) for r in rows] == [
        ("linux/amd64", "published", TAG, DIGEST["amd64"]),
        ("linux/arm64", "published", TAG, DIGEST["arm64"]),
    ]
    assert all(r.ok and r.aliases == {LATEST: "moved"} and r.smoke == "none" for r in rows)
    assert rows[1].scan == {"verdict": "clear", "blocked": []} and rows[0].scan is None  # each line's own scan
    # each line's evidence is kept under its own name; the arm64 line's gate ran on aarch64
    assert [r.evidence for r in rows] == ["example-multi-escape", "example-multi-escape@arm64"]
    gate = (root / "night" / "example-multi-escape@arm64" / "gate.txt").read_text()
    assert gate.startswith("PASS machine aarch64")


def test_the_summary_has_a_row_per_platform(root):
    rows = _platform_lines(Fakes(root).run(), multi(root), "escape")
    summary = Summary("20261206", "registry.test/x", rows=rows)
    md = summary.markdown()
    assert f"| example-multi | escape | linux/amd64 | published | `{TAG}` | `{DIGEST['amd64']}` |" in md
    assert f"| example-multi | escape | linux/arm64 | published | `{TAG}` | `{DIGEST['arm64']}` |" in md
    doc = json.loads(json.dumps(summary.to_json()))
    assert [(r["stack"], r["target"], r["platform"]) for r in doc["rows"]] == [
        ("example-multi", "escape", "linux/amd64"),
        ("example-multi", "escape", "linux/arm64"),
    ]
    assert doc["counts"]["images"] == {"passed": 2, "failed": 0, "not_run": 0}


def test_a_line_that_fails_its_gate_publishes_nothing_of_the_stack(root):
    fakes = Fakes(root, fail=("arm64",))
    rows = _platform_lines(fakes.run(), multi(root), "escape")
    assert fakes.published == []  # one tag holds every line: none is published without the others
    amd, arm = rows
    assert (arm.platform, arm.status, arm.stage) == ("linux/arm64", "failed", "gate")
    assert arm.gate == "1 FAIL" and arm.tag is None and arm.evidence == "example-multi-escape@arm64"
    assert (amd.status, amd.stage, amd.tag, amd.aliases) == ("failed", "publish", None, {})
    assert amd.gate == "gate result: 8 PASS, 0 FAIL"  # its own line passed its gate
    assert "not published: linux/arm64 failed (gate)" in str(amd.reason)
    assert Summary("20261206", "r", rows=rows).verdict == "failed"


def test_the_own_line_runs_the_test_slices(root, monkeypatch):
    from stackforge.flows import nightly as nightly_mod

    monkeypatch.setattr(nightly_mod.slice_runs, "declared", lambda stack: [
        SimpleNamespace(target="escape", name="probe", slice=SimpleNamespace(nightly=True, hardware=SimpleNamespace(devices="none")))
    ])  # fmt: skip
    fakes = Fakes(root)
    run = NightlyRun(**{**fakes.run().__dict__, "test": fakes.test})
    rows = _platform_lines(run, multi(root), "escape")
    assert fakes.tested == ["amd64"]  # as for a stack of one line: the stack's own line (the host's)
    assert rows[0].tests == {"probe": "passed"} and rows[1].tests == {}


def test_the_aliases_move_with_the_index_after_the_own_lines_smoke_passed(root):
    fakes = Fakes(root)
    rows = _platform_lines(fakes.run(recipes()), multi(root), "escape")
    assert fakes.published == [False, True]  # the immutable tag first, then the aliases after the smoke
    assert len(fakes.smoked) == 1 and not fakes.smoked[0].endswith("-arm64")  # the own line's local image
    amd, arm = rows
    assert amd.smoke == "passed" and amd.smoke_recipes == {"qwen3-8b": "passed"}
    assert arm.smoke == "not-run" and arm.smoke_recipes == {}
    assert amd.aliases == arm.aliases == {LATEST: "moved"} and amd.ok and arm.ok


def test_a_failed_smoke_keeps_every_lines_aliases(root):
    fakes = Fakes(root, smoke="failed")
    rows = _platform_lines(fakes.run(recipes()), multi(root), "escape")
    assert fakes.published == [False]
    amd, arm = rows
    assert (amd.status, amd.stage) == ("failed", "smoke") and amd.aliases == {"*": "not moved: smoke failed"}
    assert arm.status == "published" and arm.aliases == {"*": "not moved: smoke failed on linux/amd64"}


def test_lines_of_a_stack(root):
    stack = multi(root)
    assert [line.line.name for line in lines_of(stack)] == ["amd64", "arm64"]
    assert platforms_of(stack) == ["linux/amd64", "linux/arm64"]
    assert lines_of(stack, every=False) == [stack] and platforms_of(stack, every=False) == ["linux/amd64"]
    plain = ResolvedStack.of(load("example", root=root))
    assert lines_of(plain) == [plain] and platforms_of(plain) == ["linux/amd64"]


def test_a_stack_of_one_line_keeps_its_one_row_and_names_its_platform(root):
    fakes = Fakes(root)
    fakes.publish_stack = lambda stack, registry, move_aliases=True, **kw: SimpleNamespace(  # type: ignore[method-assign]
        status="published", reference="r/x:t", digest=DIGEST["amd64"], aliases={LATEST: "moved"}
    )
    row = _one(fakes.run(), ResolvedStack.of(load("example", root=root)), "escape")
    assert (row.platform, row.status, row.evidence) == ("linux/amd64", "published", "example-escape")
    assert isinstance(row, Row) and fakes.published == []


def test_an_alias_move_that_fails_after_the_smoke_fails_the_row(root):
    """A stack of one line: the immutable tag is published, the smoke passes, then moving the aliases fails: the
    row fails at stage publish (its tag stays named: that much was published), and the night fails."""
    fakes = Fakes(root)
    moves: list[bool] = []

    def publish_stack(stack, registry, move_aliases=True, **kw):
        moves.append(move_aliases)
        if move_aliases:
            raise UserError("the registry refused the alias py3.11-latest")
        return SimpleNamespace(status="published", reference="r/x:t", digest=DIGEST["amd64"], aliases={})

    fakes.publish_stack = publish_stack  # type: ignore[method-assign]
    plan = NightlyRecipes({("example", "escape"): [load_recipe(REPO, "qwen3-8b")]})
    row = _one(fakes.run(plan), ResolvedStack.of(load("example", root=root)), "escape")
    assert moves == [False, True] and row.smoke == "passed"
    assert (row.status, row.stage, row.tag) == ("failed", "publish", "r/x:t")
    assert "refused the alias" in str(row.reason) and not row.ok
    assert Summary("20261206", "r", rows=[row]).verdict == "failed"


def test_evidence_names_of_platform_lines():
    taken: dict[str, tuple[str, ...]] = {}
    assert evidence_name("post2", "vllm", taken) == "post2-vllm"
    assert evidence_name("post2", "vllm", taken, "@arm64") == "post2-vllm@arm64"
    assert evidence_name("post2", "vllm", taken) == "post2-vllm"  # the same row, the same name
    clash = evidence_name("post2", "vllm@arm64", taken)
    assert clash.startswith("post2-vllm@arm64-") and len(clash) == len("post2-vllm@arm64-") + 10


def test_a_line_declared_not_buildable_is_left_out_and_the_summary_says_so():
    from stackforge.flows.night_records import NightSummary
    from stackforge.flows.nightly import not_buildable

    post2 = ResolvedStack.of(load("post2", root=REPO))  # its arm64 line names values no record states
    assert lines_of(post2) == [post2] and platforms_of(post2) == ["linux/amd64"]  # built as today: one image
    (note,) = not_buildable(post2)
    assert note.startswith("platform arm64 (linux/arm64) is declared, not buildable: no record states ")
    summary = Summary("20261206", "r", rows=[Row("post2", "vllm-openai", "published", platform="linux/amd64")])
    summary.not_buildable = {"post2": [note]}
    assert f"Not built, `post2`: {note}." in summary.markdown()
    doc = json.loads(json.dumps(summary.to_json()))
    assert doc["not_buildable"] == {"post2": [note]}
    assert NightSummary.model_validate(doc).not_buildable == {"post2": [note]}
    assert "not_buildable" not in Summary("20261206", "r").to_json()


def test_a_publish_that_fails_after_the_smoke_fails_every_row_at_publish(root):
    from stackforge.errors import UserError

    fakes = Fakes(root)
    first = fakes.publish_platforms

    def flaky(stack, registry, *, move_aliases=True, **kw):
        if move_aliases:
            raise UserError("registry.test refused the alias")
        return first(stack, registry, move_aliases=move_aliases, **kw)

    run = NightlyRun(**{**fakes.run(recipes()).__dict__, "publish_platforms": flaky})
    rows = _platform_lines(run, multi(root), "escape")
    assert [(r.status, r.stage) for r in rows] == [("failed", "publish"), ("failed", "publish")]
    assert all("registry.test refused the alias" in str(r.reason) and r.tag == TAG for r in rows)


def test_the_preflight_asks_for_each_built_lines_own_base(root, monkeypatch):
    """A line whose base is not the stack's (example-multi's arm64 line) gets its own base-image row; the own line
    gets none (the stack's row asks for it)."""
    from stackforge.flows import doctor

    stack = multi(root)
    present: set[str] = set()
    workspace = SimpleNamespace(engine=SimpleNamespace(image_exists=lambda image: image in present))

    def unreachable(image, timeout):
        raise UserError(f"its registry cannot be asked for {image}")

    monkeypatch.setattr(doctor, "registry_digest", unreachable)
    rows = doctor.run_checks(doctor.line_base_checks(stack, lines_of(stack), workspace))  # type: ignore[arg-type]
    arm = stack.platform_lines()["arm64"].model.base.image
    assert arm != stack.model.base.image
    assert [(r.check, r.endpoint, r.key, r.status) for r in rows] == [
        ("base image (arm64)", arm, "platforms.arm64.with.base.image", doctor.FAIL)
    ]
    present.add(arm)
    rows = doctor.run_checks(doctor.line_base_checks(stack, lines_of(stack), workspace))  # type: ignore[arg-type]
    assert [(r.status, r.detail) for r in rows] == [(doctor.OK, "present in the engine")]


def test_a_missing_line_base_fails_the_preflight_before_anything_is_built(root, monkeypatch):
    from stackforge.flows import doctor
    from stackforge.flows import nightly as nightly_mod

    stack = multi(root)
    monkeypatch.setattr(doctor, "diagnose", lambda *a, **kw: [])  # the engine, registry and endpoints answer
    monkeypatch.setattr(doctor, "registry_digest", lambda image, timeout: (_ for _ in ()).throw(UserError("no")))
    workspace = SimpleNamespace(engine=SimpleNamespace(image_exists=lambda image: False))
    summary = Summary("20261206", "registry.test/x")
    options = nightly_mod.NightlyOptions(date="20261206", stacks=["example-multi"], echo=lambda line: None)
    assert nightly_mod._preflight(summary, [stack], options, "registry.test/x", workspace) is False  # type: ignore[arg-type]
    assert {(r.platform, r.stage) for r in summary.rows} == {("linux/amd64", "preflight"), ("linux/arm64", "preflight")}
    assert all("base image (arm64)" in str(r.reason) for r in summary.rows)


def test_a_shards_line_of_an_index_is_pushed_by_digest_untagged_and_only_the_own_line_is_smoked(root):
    """A sharded night: each line's unit is built by the shard of its platform and pushed by digest (``push_line``'s
    place); the merge tags the index. The arm64 line's row names no tag, and its smoke is not run: a recipe serves the
    image on the stack's own platform."""
    fakes, stack = Fakes(root), multi(root)
    pushes: list[tuple[str, bool]] = []

    def push_line(line, registry, *, move_aliases=False, **kw):
        pushes.append((line.line.name, move_aliases))
        return SimpleNamespace(status="pushed", reference=f"{registry}/stackforge-example-multi:", tag="",
                               repository=f"{registry}/stackforge-example-multi", digest=DIGEST[line.line.name],
                               aliases={}, scan=None)  # fmt: skip

    (arm,) = night_lines(stack, False, {"example-multi": "arm64"})
    assert arm.line is not None and (arm.line.name, arm.line.own) == ("arm64", False)
    assert platforms_of(stack, False, {"example-multi": "arm64"}) == ["linux/arm64"]
    run = NightlyRun(**{**fakes.run(recipes()).__dict__, "publish": push_line, "move_aliases": False})
    row = _one(run, arm, "escape")
    assert pushes == [("arm64", False)] and fakes.smoked == []
    assert (row.status, row.tag, row.digest, row.platform) == ("pushed", None, DIGEST["arm64"], "linux/arm64")
    assert row.pushed == f"registry.test/x/stackforge-example-multi@{DIGEST['arm64']}"  # what the shard reports
    assert row.ok and row.smoke == "not-run" and row.aliases == {}
    assert row.evidence == "example-multi-escape@arm64"
    (amd,) = night_lines(stack, False, {"example-multi": "amd64"})
    own = _one(run, amd, "escape")
    assert fakes.smoked and own.smoke == "passed" and own.tag is None and own.status == "pushed"
    with pytest.raises(UserError) as exc:
        night_lines(stack, False, {"example-multi": "riscv"})
    assert "platform line 'riscv' of example-multi" in exc.value.message


def test_a_shard_of_another_line_than_the_stacks_own_bakes_nothing_of_it(root):
    """A bake file carries no platform per target: the bake builds a stack's own line, so a shard that builds the
    arm64 line leaves the stack out of its bake (and its preflight asks for that line's base, not the stack's)."""
    stack = multi(root)
    assert _baked([stack], NightlyOptions()) == [stack]  # the one-process nightly bakes the own line
    assert _baked([stack], NightlyOptions(lines={"example-multi": "amd64"})) == [stack]
    assert _baked([stack], NightlyOptions(lines={"example-multi": "arm64"})) == []
