"""The night's plan: units grouped into shards by stack, kind of runner and the last nights' durations, with stable
ids and the runner labels each shard needs; and `stackforge nightly --plan` on a repository (no engine, no
registry)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from stackforge.errors import UserError
from stackforge.flows import night_plan as np
from stackforge.flows.nightly import Row, Summary
from tests.fixtures.stack_support import RootSpec, repo_root, run_cli


def unit(stack: str, target: str, seconds: float = 0.0, platform: str = "linux/amd64", device: bool = False):
    return np.Unit(stack=stack, target=target, platform=platform, device=device, estimate_s=seconds)


def keys(groups):
    return [[u.key.rsplit("/", 2)[0] for u in g] for g in groups]


def test_a_stack_stays_on_one_shard_by_default_and_each_stack_gets_its_own():
    units = [unit("a", "x", 10), unit("a", "y", 10), unit("b", "x", 5)]
    assert keys(np.pack(units, None)) == [["a/x", "a/y"], ["b/x"]]


def test_more_shards_than_stacks_splits_the_longest_stack_by_its_durations():
    units = [unit("a", "x", 100), unit("a", "y", 60), unit("a", "z", 50), unit("b", "x", 10)]
    groups = np.pack(units, 3)
    assert len(groups) == 3
    assert sorted(map(sorted, keys(groups))) == [["a/x"], ["a/y", "a/z"], ["b/x"]]


def test_fewer_shards_than_stacks_packs_longest_first_into_the_lightest():
    units = [unit(s, "t", t) for s, t in (("a", 60), ("b", 50), ("c", 40), ("d", 30), ("e", 20))]
    groups = np.pack(units, 2)
    loads = sorted(sum(u.estimate_s for u in g) for g in groups)
    assert loads == [90, 110]  # LPT: a | b c → a d | b c → a d e | b c (the heaviest shard 110 of 200)
    assert np.pack(list(reversed(units)), 2) == groups  # the order units arrive in changes nothing


def test_a_shard_id_is_its_units_whatever_their_order_and_names_its_platform_and_device():
    a = [unit("a", "x"), unit("a", "y")]
    assert np.shard_id(a, False) == np.shard_id(list(reversed(a)), False)
    assert np.shard_id(a, False) != np.shard_id(a[:1], False)
    assert np.shard_id(a, False).startswith("amd64-") and np.shard_id(a, True).startswith("amd64-dev-")
    arm = [unit("a", "x", platform="linux/arm64")]
    assert np.shard_id(arm, False).startswith("arm64-")
    # the estimate does not move the id: the same units give the same id every night
    assert np.shard_id([unit("a", "x", 99), unit("a", "y", 1)], False) == np.shard_id(a, False)


def test_each_kind_of_runner_gets_its_own_shards_and_labels():
    units = [
        unit("a", "x", 10),
        unit("a", "served", 10, device=True),  # a recipe needs the devices: the whole stack goes to a device runner
        unit("b", "x", 10),
        unit("c", "x", 10, platform="linux/arm64"),
    ]
    shards = np.group(units, None, runner_labels=["self-hosted", "musa-build"])
    kinds = {(s.platform, s.device): [u.key for u in s.units] for s in shards}
    assert kinds == {
        ("linux/amd64", True): ["a/served/linux/amd64", "a/x/linux/amd64"],
        ("linux/amd64", False): ["b/x/linux/amd64"],
        ("linux/arm64", False): ["c/x/linux/arm64"],
    }
    by_kind = {(s.platform, s.device): s for s in shards}
    assert by_kind["linux/amd64", True].runs_on == ["self-hosted", "musa-build", "linux", "x64", "device"]
    assert by_kind["linux/arm64", False].labels == ["linux", "arm64"]
    assert [s.estimate_s for s in shards] == sorted((s.estimate_s for s in shards), reverse=True)


def test_shards_out_of_range_is_an_error_naming_the_option():
    with pytest.raises(UserError) as exc:
        np.group([unit("a", "x")], 0)
    assert exc.value.file == "--shards"


def _night(nights, date: str, rows: list[tuple[str, str, float]], platform: str | None = None) -> None:
    """A night's summary as the nightly writes it (Summary.to_json)."""
    summary = Summary(date=date, registry="r.example/t")
    summary.rows = [Row(stack=s, target=t, status="published", duration_s=d, platform=platform) for s, t, d in rows]
    (nights / date).mkdir(parents=True)
    (nights / date / "summary.json").write_text(json.dumps(summary.to_json()))


def test_expected_times_are_the_median_of_the_newest_nights_before_this_one(tmp_path):
    nights = tmp_path / "nights"
    for day, secs in (("20261101", 999), ("20261102", 10), ("20261103", 30), ("20261104", 20), ("20261110", 5000)):
        _night(nights, day, [("a", "x", secs), ("b", "y", secs / 10)])
    (nights / "20261105").mkdir()
    (nights / "20261105" / "summary.json").write_text("{not json")
    read = np.read_durations(nights, newest=3, before="20261110")
    assert read.nights == ["20261104", "20261103", "20261102"]  # the newest 3 before the night; 20261110 is later
    assert read.estimate("a", "x") == 20 and read.estimate("b", "y") == 2
    assert read.estimate("c", "z") is None
    assert len(read.unreadable) == 1 and "summary.json" in read.unreadable[0]
    units = np.estimate([unit("a", "x"), unit("b", "y"), unit("c", "z")], read)
    assert [u.estimate_s for u in units] == [20, 2, 11]  # a unit no night recorded: the median of the others


def test_a_units_expected_time_is_its_own_platforms(tmp_path):
    """A one-process night has a row per platform line: the emulated arm64 build says nothing of the amd64 unit."""
    nights = tmp_path / "nights"
    _night(nights, "20261101", [("a", "x", 30)])  # a night before rows named a platform: counts for any platform
    for day, amd, arm in (("20261102", 10, 900), ("20261103", 20, 1100)):
        summary = Summary(date=day, registry="r.example/t")
        summary.rows = [Row("a", "x", "published", duration_s=amd, platform="linux/amd64"),
                        Row("a", "x", "published", duration_s=arm, platform="linux/arm64")]  # fmt: skip
        (nights / day).mkdir(parents=True)
        (nights / day / "summary.json").write_text(json.dumps(summary.to_json()))
    read = np.read_durations(nights)
    assert read.estimate("a", "x", "linux/amd64") == 20 and read.estimate("a", "x", "linux/arm64") == 900
    assert read.estimate("a", "x") == 30  # no platform asked: the rows that name none
    (planned,) = np.estimate([unit("a", "x")], read)
    assert planned.estimate_s == 20


def test_a_plan_reads_back_through_its_model_and_carries_the_ci_matrix():
    plan = np.make_plan([unit("a", "x", 3), unit("b", "y", 2)], [], np.PlanOptions(date="20261201", shards=2))
    doc = plan.to_json()
    assert doc["schema"] == "stackforge.nightly-plan/v1" and doc["date"] == "20261201"
    include = doc["matrix"]["include"]
    assert [i["shard"] for i in include] == [s.id for s in plan.shards]
    assert all(i["runs_on"] == ["linux", "x64"] for i in include)
    recorded = {k: v for k, v in doc.items() if k != "matrix"}
    assert np.Plan.model_validate(recorded) == plan
    with pytest.raises(UserError) as exc:
        plan.shard("amd64-0000000000")
    assert exc.value.file == "--shard" and plan.shards[0].id in exc.value.message


UNLOCKED = "indexes:\n  pypi: {lock: false}\n"


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(
        stacks=("example.yaml", "post1.yaml", "post2.yaml"),
        stack_files={
            "night-a.yaml": "name: night-a\ninherits: example\nnightly: true\n" + UNLOCKED
            + "targets:\n  plain: {entrypoint: [python3]}\n",
            "night-b.yaml": "name: night-b\ninherits: example\nnightly: true\n" + UNLOCKED,
            "night-broken.yaml": "name: night-broken\ninherits: example\nnightly: true\nno_such_key: 1\n",
        },
        edit=lambda root: [p.write_text(p.read_text().replace("nightly: true   #", "nightly: false   #"))
                           for p in (root / "stacks").glob("post*.yaml")],
    )  # fmt: skip


def test_the_plan_command_groups_the_nightly_stacks_and_names_one_that_does_not_load(tmp_path, root_spec, capsys):
    root = repo_root(tmp_path, root_spec)
    _night(root / "build" / "nightly", "20261130", [("night-a", "escape", 300), ("night-a", "plain", 100), ("night-b", "escape", 50)])  # fmt: skip
    rc, out, err = run_cli(capsys, root, "nightly", "--plan", "--json", "--shards", "3", "--runner-label", "musa-build")
    assert rc == 0, err
    plan = json.loads(out)
    units = [[f"{u['stack']}/{u['target']}" for u in s["units"]] for s in plan["shards"]]
    assert units == [["night-a/escape"], ["night-a/plain"], ["night-b/escape"]]  # night-a split: 3 shards, 2 stacks
    assert [s["estimate_s"] for s in plan["shards"]] == [300, 100, 50]
    assert plan["durations_from"] == ["20261130"]
    assert all(s["runs_on"] == ["musa-build", "linux", "x64"] for s in plan["shards"])
    assert [p["stack"] for p in plan["problems"]] == ["night-broken"]
    assert "no_such_key" in plan["problems"][0]["reason"]
    rc, again, _ = run_cli(capsys, root, "nightly", "--plan", "--json", "--shards", "3", "--runner-label", "musa-build")
    assert again == out  # the same repository and nights: the same plan, the same ids


def test_a_plan_without_registry_records_nothing_and_a_shard_without_registry_is_refused(tmp_path, root_spec, capsys):
    root = repo_root(tmp_path, root_spec)
    rc, out, err = run_cli(capsys, root, "nightly", "--plan", "night-b")
    assert rc == 0 and "recorded" not in err and "night-b/escape" in out
    rc, out, err = run_cli(capsys, root, "nightly", "--shard", "amd64-0123456789")
    assert rc == 2 and "--registry is required" in err


def test_a_stack_of_platform_lines_has_a_unit_per_line_on_its_platforms_runner_and_a_refused_line_is_named(
    tmp_path, capsys
):
    """example-multi declares linux/amd64 and linux/arm64: a unit per line, each in a shard of its platform with that
    CPU's runner label; post2's aarch64 line names values no record states, so it is left out (as the one-process
    nightly leaves it out) and the plan says why."""
    root = repo_root(tmp_path, RootSpec(parts=("stacks",)))
    args = ("nightly", "--plan", "--json", "--runner-label", "self-hosted", "example-multi", "post2")
    rc, out, err = run_cli(capsys, root, *args)
    assert rc == 0, err
    plan = np.Plan.model_validate({k: v for k, v in json.loads(out).items() if k != "matrix"})
    multi = {(u.platform, u.line): s for s, u in plan.units() if u.stack == "example-multi"}
    assert set(multi) == {("linux/amd64", "amd64"), ("linux/arm64", "arm64")}
    arm, amd = multi["linux/arm64", "arm64"], multi["linux/amd64", "amd64"]
    assert arm.id.startswith("arm64-") and arm.runs_on == ["self-hosted", "linux", "arm64"]
    assert amd.id.startswith("amd64-") and amd.runs_on == ["self-hosted", "linux", "x64"]
    assert {u.platform for u in arm.units} == {"linux/arm64"}  # a shard is of one platform: its runner's
    post2 = [u for _, u in plan.units() if u.stack == "post2"]
    assert post2 and {(u.platform, u.line) for u in post2} == {("linux/amd64", None)}  # one line left: one image
    (note,) = plan.not_buildable["post2"]
    assert note.startswith("platform arm64 (linux/arm64) is declared, not buildable") and "packages.torchaudio" in note
    assert "post2: not built: platform arm64" in err
    # the (stack, target)s whose tag the merge makes an index: example-multi's, not post2's
    assert set(np.lines_of_plan(plan)) == {(u.stack, u.target) for _, u in plan.units() if u.stack == "example-multi"}
    rc, again, _ = run_cli(capsys, root, *args)
    assert again == out  # the same stacks: the same units under the same ids


def test_only_the_stacks_own_line_needs_a_device_and_a_lines_id_is_its_units():
    """The smoke runs on the stack's own line: its unit goes to a device runner, the other line's does not."""

    def line(name: str, arch: str, own: bool):
        return SimpleNamespace(line=SimpleNamespace(name=name, own=own), model=SimpleNamespace(platform=SimpleNamespace(arch=arch)))  # fmt: skip

    stack = SimpleNamespace(name="m")
    units = np.units_of([stack], lambda s: ["t"], lambda s, t: True,
                        lambda s: [line("amd64", "x86_64", True), line("arm64", "aarch64", False)])  # fmt: skip
    assert [(u.platform, u.line, u.device) for u in units] == [("linux/amd64", "amd64", True), ("linux/arm64", "arm64", False)]  # fmt: skip
    shards = np.group(units)
    assert {(s.platform, s.device, tuple(s.labels)) for s in shards} == {
        ("linux/amd64", True, ("linux", "x64", "device")),
        ("linux/arm64", False, ("linux", "arm64")),
    }
    # one line of its own (a stack without platforms:, or one whose other lines cannot be built): no line named, and the
    # unit's key — hence its shard's id — is what it was before stacks had lines
    (one,) = np.units_of([stack], lambda s: ["t"], lambda s, t: False, lambda s: [line("amd64", "x86_64", True)])
    assert one.line is None and one.key == "m/t/linux/amd64"
    assert np.shard_id([one], False) == np.shard_id([unit("m", "t")], False)
