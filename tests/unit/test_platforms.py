"""Platform lines: a stack declares the CPU platforms one tag publishes, each with what differs; the rules run on
every line, a line that mixes MUSA build labels is a finding naming both, and post2 declares the aarch64 line the
post2 record names (tests/fixtures/facts/seeds.yaml ``platforms``)."""

from __future__ import annotations

import json

import pytest

from stackforge.errors import UserError
from stackforge.stack import platforms
from stackforge.stack.load import StackInvalid, fingerprint, load
from tests.fixtures import facts
from tests.fixtures.stack_support import RootSpec, make_root, parse_errors, repo_root, run_cli

ARM_TORCH = "platforms.arm64.with.packages.torch.version"

# A small two-line stack: its own line is amd64, arm64 changes the train's label, the base and a library path.
TWO = """\
name: two
platform: {os: debian12, python: "3.11", arch: x86_64, musa: 5.2.0, musa_runtime: "5.2"}
base: {image: "stackforge/base:bookworm"}
indexes:
  pypi: {url: "https://pypi.org/simple", role: public}
packages:
  torch: {version: 2.11.0.post2+musa5.2.0, index: pypi}
  torch_musa: {version: 2.11.0.post2+musa5.2.0, index: pypi}
  helper: {version: 1.0.0+musa5.2.0torch2.11.0.post2, index: pypi}
system:
  libs:
    packages: [zlib1g]
    ld_dirs: [/usr/lib/x86_64-linux-gnu]
    symlinks: {/usr/lib/libz.so: "/usr/lib/{{ platform.triplet }}/libz.so.1"}
rules:
  trains:
    - {name: torch, members: [torch, torch_musa], agree: [post, local]}
tags: {local: "two:{{ platform.arch }}"}
targets:
  escape: {cmd: [python]}
platforms:
  amd64: {arch: x86_64, local: musa5.2.0}
  arm64:
    arch: aarch64
    local: musa5.2.1mp22
    with:
      platform: {musa: 5.2.1}
      base: {image: "stackforge/base:bookworm-arm64"}
      packages:
        torch: {version: 2.11.0.post1+musa5.2.1mp22}
        torch_musa: {version: 2.11.0.post1+musa5.2.1mp22}
      system:
        libs: {ld_dirs: [/usr/lib/aarch64-linux-gnu]}
    unknown:
      packages.helper: no aarch64 build is named
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_root(tmp_path_factory.mktemp("platforms"), {"two.yaml": TWO})


def write(root, name: str, text: str) -> None:
    (root / "stacks" / f"{name}.yaml").write_text(text, encoding="utf-8")


def line_no(root, name: str, has: str) -> int:
    lines = (root / "stacks" / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, start=1) if has in line)


def test_each_line_is_the_stack_with_what_differs(root):
    loaded = load("two", root=root)
    lines = loaded.platform_lines()
    assert list(lines) == ["amd64", "arm64"]
    amd, arm = lines["amd64"].model, lines["arm64"].model
    assert (amd.platform.arch, arm.platform.arch) == ("x86_64", "aarch64")
    assert (amd.platform.musa, arm.platform.musa) == ("5.2.0", "5.2.1")
    assert arm.packages["torch"].version == "2.11.0.post1+musa5.2.1mp22"
    assert arm.packages["helper"].version == amd.packages["helper"].version  # not changed: the stack's
    assert arm.base.image.endswith("bookworm-arm64") and amd.base.image == "stackforge/base:bookworm"
    assert arm.system["libs"].ld_dirs == ["/usr/lib/aarch64-linux-gnu"]  # a list: replaced
    # the triplet of each line's architecture, in a templated value
    link = ("system", "libs", "symlinks", "/usr/lib/libz.so")
    assert lines["arm64"].resolved.value(link, "") == "/usr/lib/aarch64-linux-gnu/libz.so.1"
    assert lines["amd64"].resolved.value(link, "") == "/usr/lib/x86_64-linux-gnu/libz.so.1"
    assert arm.platforms == {} and loaded.line is not None and loaded.line.name == "amd64"
    assert loaded.for_platform("linux/arm64") is lines["arm64"] and loaded.for_platform("aarch64") is lines["arm64"]
    with pytest.raises(UserError, match="has no platform 'ppc64le'") as err:
        loaded.for_platform("ppc64le")
    assert "arm64 (linux/arm64)" in (err.value.fix or "")


def test_own_line_keeps_the_stack_fingerprint_and_other_lines_have_their_own(root):
    loaded = load("two", root=root)
    lines = loaded.platform_lines()
    assert fingerprint(lines["amd64"].model) == fingerprint(loaded.model)
    assert fingerprint(lines["arm64"].model) != fingerprint(loaded.model)
    moved = load("two", root=root, overrides=["platforms.arm64.with.base.image=other/base:1"])
    assert fingerprint(moved.model) == fingerprint(loaded.model)  # another line's change: not this line's image
    assert fingerprint(moved.platform_lines()["arm64"].model) != fingerprint(lines["arm64"].model)


def test_a_line_value_is_located_at_the_line(root):
    loaded = load("two", root=root).platform_lines()["arm64"]
    pos = loaded.position(("packages", "torch", "version"))
    assert (pos.file, pos.line) == ("stacks/two.yaml", line_no(root, "two", "torch: {version: 2.11.0.post1"))
    shared = loaded.position(("packages", "helper", "version"))
    assert shared.line == line_no(root, "two", "helper: {version")


def test_clean_lines_lint_clean_and_unknown_values_are_named(root, capsys):
    rc, out, err = run_cli(capsys, root, "lint", "two")
    assert rc == 0, out + err
    assert "platform arm64 (linux/arm64) is declared, not buildable: no record states packages.helper" in err


def test_a_line_mixing_build_labels_is_a_finding_naming_both(root, capsys):
    rc, out, _ = run_cli(
        capsys, root, "lint", "two", "--set", "platforms.arm64.with.packages.torch_musa.version=2.11.0.post1+musa5.2.0"
    )
    assert rc == 1
    head = next(line for line in out.splitlines() if "platform-line" in line)
    assert head.startswith("--set platforms.arm64.with.packages.torch_musa.version=")
    assert "(platform arm64)" in head
    assert "+musa5.2.1mp22" in head and "+musa5.2.0" in head
    assert f"platforms.arm64.local, stacks/two.yaml:{line_no(root, 'two', 'local: musa5.2.1mp22')}" in head


def test_a_finding_on_a_line_value_names_its_file_and_line(root, capsys):
    text = TWO.replace(
        "torch_musa: {version: 2.11.0.post1+musa5.2.1mp22}", "torch_musa: {version: 2.11.0.post1+musa5.2.0}"
    )
    write(root, "mixed", text.replace("name: two", "name: mixed"))
    rc, out, _ = run_cli(capsys, root, "lint", "mixed", "--json")
    assert rc == 1
    found = json.loads(out)["stacks"][0]["findings"]
    at = line_no(root, "mixed", "torch_musa: {version: 2.11.0.post1+musa5.2.0}")
    line_rule = [f for f in found if f["rule"] == "platform-line"]
    assert [(f["file"], f["line"], f["platforms"]) for f in line_rule] == [("stacks/mixed.yaml", at, ["arm64"])]
    assert {f["rule"] for f in found} == {"platform-line", "train"}  # the train rule of that line too


def test_a_stack_without_lines_is_one_line_and_mixing_there_is_a_finding(root, capsys):
    text = TWO.split("platforms:\n")[0].replace("name: two", "name: single")
    write(
        root, "single", text.replace("helper: {version: 1.0.0+musa5.2.0torch", "helper: {version: 1.0.0+musa5.2.1torch")
    )
    loaded = load("single", root=root)
    assert list(loaded.platform_lines()) == ["amd64"] and loaded.platform_lines()["amd64"] is loaded
    rc, out, _ = run_cli(capsys, root, "lint", "single")
    assert rc == 1 and "platform-line: helper 1.0.0+musa5.2.1torch2.11.0.post2 is a +musa5.2.1 build" in out
    assert "(platform" not in out  # one line: nothing to name


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("platforms.amd64.with.packages.torch.version=1.0", "is the stack's own platform"),
        ("platforms.arm64.arch=x86_64", "x86_64 is also line 'amd64'"),
        ("platforms.amd64.arch=aarch64", "no line is the stack's own platform (platform.arch x86_64)"),
        ("platforms.arm64.with.tags.local=x", "'tags' is the stack's, the same on every platform"),
        (
            "platforms.arm64.with.packages.torch.verison=1",
            "unknown key 'verison' in platforms.arm64.with.packages.torch",
        ),
        ("platforms.arm64.with.packages.torch.version=>=2", "is a range"),
        ("platforms.arm64.unknown={packages.nothing: why}", "'packages.nothing' names no value of the line"),
        ("platforms.arm64.local=+musa", "is not a local-version label"),
    ],
)
def test_a_bad_line_is_refused_at_its_line(root, capsys, edit, message):
    rc, _, err = run_cli(capsys, root, "show", "two", "--set", edit)
    assert rc == 2, err
    errors = parse_errors(err)
    assert any(message in e["message"] for e in errors), err


def test_a_line_value_refused_by_the_model_names_the_line_in_the_file(root, capsys):
    write(
        root,
        "bad",
        TWO.replace("name: two", "name: bad").replace(
            "platform: {musa: 5.2.1}", "platform: {musa: 5.2.1, gpu_arch: 7}"
        ),
    )
    with pytest.raises(StackInvalid) as err:
        load("bad", root=root)
    assert err.value.file == "stacks/bad.yaml" and err.value.line == line_no(root, "bad", "gpu_arch: 7")


def test_null_removes_what_a_line_does_not_have():
    base = {"system": {"os": {"packages": ["a"], "symlinks": {"/x": "/y"}}}}
    assert platforms.merge(base, {"system": {"os": {"symlinks": None}}}) == {"system": {"os": {"packages": ["a"]}}}
    assert base["system"]["os"]["symlinks"] == {"/x": "/y"}  # unchanged


def test_a_line_drops_the_positions_below_what_it_replaces_or_removes():
    at = {
        p: f"{i}"
        for i, p in enumerate(
            [
                ("name",),
                ("packages",),
                ("packages", "torch"),
                ("packages", "torch", "version"),
                ("packages", "torchvision", "version"),
                ("system", "os", "packages", 0),
                ("system", "os", "symlinks", "/x"),
                ("platforms", "amd64", "arch"),
                ("platforms", "arm64", "arch"),
                ("platforms", "arm64", "with", "packages", "torch"),
                ("platforms", "arm64", "with", "system", "os", "symlinks"),
            ]
        )
    }
    with_data = {"packages": {"torch": "2.11.0"}, "system": {"os": {"symlinks": None}}}
    assert platforms.line_positions(at, "arm64", with_data) == {
        ("name",): "0",
        ("packages",): "1",
        ("packages", "torch"): "9",  # the line's own value, where the line wrote it
        ("packages", "torchvision", "version"): "4",
        ("system", "os", "packages", 0): "5",
        ("system", "os", "symlinks"): "10",
        ("platforms", "arm64", "arch"): "8",
        ("platforms", "arm64", "with", "packages", "torch"): "9",
        ("platforms", "arm64", "with", "system", "os", "symlinks"): "10",
        ("platform", "arch"): "8",
    }
    assert platforms.line_positions(at, "amd64", {}) == {
        p: v for p, v in at.items() if p[:2] != ("platforms", "arm64")
    } | {("platform", "arch"): "7"}


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("2.11.0.post2+musa5.2.0", "musa5.2.0"),
        ("2.11.0.post1+musa5.2.1mp22", "musa5.2.1mp22"),
        ("1.1.0+musa5.2.0torch2.11.0.post2", "musa5.2.0"),
        ("1.1.0+musa5.2.1mp22torch2.11.0.post1", "musa5.2.1mp22"),
        ("0.2.7+musa", None),
        ("0.1.12+musa.2", None),
        ("0.2.7", None),
    ],
)
def test_musa_line_of_a_label(version, line):
    assert platforms.musa_line(version) == line


# ------------------------------------------------------------------ post2's aarch64 line, from the record


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return make_root(tmp_path_factory.mktemp("post2-lines"))


def test_post2_declares_the_aarch64_line_the_record_names(real):
    fact = facts.seeds()["platforms"]
    lines = load("post2", root=real).platform_lines()
    assert {n: ln.line.oci for n, ln in lines.items() if ln.line} == {"amd64": "linux/amd64", "arm64": "linux/arm64"}
    assert lines["amd64"].line.local == fact["x86_64"]["local"]
    arm = lines["arm64"]
    assert arm.line.local == fact["aarch64"]["local"]
    for name, read in fact["aarch64"]["read"].items():
        have = arm.model.platform.musa if name == "musa" else arm.model.packages[name].version
        assert have == read["version"], name
    # every value the record does not state is declared unknown by the stack, and only those
    assert {k for k in fact["aarch64"]["unknown"] if "." in k} <= set(arm.line.unknown)
    assert all(
        platforms.musa_line(arm.model.packages[p].version) in (None, "musa5.2.1mp22")
        for p in arm.model.packages
        if not platforms.covers(arm.line.unknown, ("packages", p))
    )


def test_lint_post2_passes_and_moving_the_aarch64_torch_fails_naming_the_line(real, capsys):
    rc, out, err = run_cli(capsys, real, "lint", "post2")
    assert rc == 0, out + err
    rc, out, _ = run_cli(capsys, real, "lint", "post2", "--set", f"{ARM_TORCH}=2.11.0.post2+musa5.2.0")
    assert rc == 1
    found = [line for line in out.splitlines() if "platform-line" in line]
    assert len(found) == 1 and "platform line 'arm64' (linux/arm64)" in found[0]
    assert "mixes +musa5.2.1mp22 and +musa5.2.0" in found[0]
    assert f"stacks/post2.yaml:{line_no(real, 'post2', 'local: musa5.2.1mp22')}" in found[0]


def test_show_post2_json_lists_the_platforms(real, capsys):
    rc, out, _ = run_cli(capsys, real, "show", "post2", "--json")
    assert rc == 0
    rows = {r["name"]: r for r in json.loads(out)["platforms"]}
    assert rows["arm64"]["platform"] == "linux/arm64" and rows["arm64"]["triplet"] == "aarch64-linux-gnu"
    assert rows["arm64"]["pins"]["torch"] == "2.11.0.post1+musa5.2.1mp22"
    assert rows["arm64"]["pins"]["deep_ep"] == "unknown"
    assert rows["amd64"]["fingerprint"] == json.loads(out)["fingerprint"]


def test_audit_keeps_the_versions_another_line_pins(real):
    """post2 moved the x86_64 train off post1; the aarch64 line still pins post1, so its versions are current."""
    from stackforge.freshness.audit import stale_tokens

    post1, post2 = load("post1", root=real), load("post2", root=real)
    alone = {t.text for t in stale_tokens(post1.model, post2.model)}
    lines = tuple(ln.model for ln in post2.platform_lines().values())
    with_lines = {t.text for t in stale_tokens(post1.model, post2.model, lines)}
    assert {"2.11.0.post1", "0.26.0.post1"} <= alone
    assert not {"2.11.0.post1", "0.26.0.post1"} & with_lines
    assert "2.11.0.post1+musa5.2.0" in with_lines  # the x86_64 post1 build itself is still stale


# ------------------------------------------------------------------ render: one Dockerfile per platform line


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    return repo_root(tmp_path_factory.mktemp("multi"), RootSpec(parts=("stacks", "patches")))


def test_render_all_platforms_writes_a_dockerfile_per_line(multi, capsys):
    rc, out, err = run_cli(capsys, multi, "render", "example-multi", "--platform", "all", "--no-sources")
    assert rc == 0, err
    own = (multi / "build" / "example-multi" / "Dockerfile").read_text(encoding="utf-8")
    arm = (multi / "build" / "example-multi@arm64" / "Dockerfile").read_text(encoding="utf-8")
    assert "FROM stackforge/base:bookworm AS base" in own and "FROM stackforge/base:bookworm-arm64 AS base" in arm
    assert "stacks/locks/example-multi@arm64/pypi.txt" in arm and "@arm64" not in own
    assert "platform:   arm64 (linux/arm64)" in out and "platform:   amd64 (linux/amd64)" in out
    rc, out, _ = run_cli(capsys, multi, "render", "example-multi", "--platform", "all", "--no-sources", "--json")
    assert rc == 0 and set(json.loads(out)["platforms"]) == {"amd64", "arm64"}


def test_render_refuses_a_line_with_unknown_values(multi, capsys):
    rc, _, err = run_cli(capsys, multi, "render", "post2", "--platform", "arm64", "--no-sources")
    assert rc == 1
    (error,) = parse_errors(err)
    assert (error["file"], error["line"]) == ("stacks/post2.yaml", line_no(multi, "post2", "    unknown:"))
    assert "platform arm64 (linux/arm64) of stack 'post2' is declared, not buildable" in error["message"]
    assert not (multi / "build" / "post2@arm64" / "Dockerfile").exists()
    rc, _, err = run_cli(capsys, multi, "render", "post2", "--platform", "all", "--no-sources")
    assert rc == 1 and not (multi / "build" / "post2" / "Dockerfile").exists()  # nothing of any line written


def test_each_line_has_its_own_lock(multi, capsys, tmp_path):
    arm_lock = multi / "stacks" / "locks" / "example-multi@arm64" / "pypi.txt"
    text = arm_lock.read_text(encoding="utf-8")
    assert "manylinux_2_36_aarch64" in text.splitlines()[0]
    try:
        arm_lock.unlink()
        rc, out, _ = run_cli(capsys, multi, "lint", "example-multi")
        assert rc == 1
        assert "lock (platform arm64): index 'pypi' is declared `lock: true` but " in out
        assert "fix: run: stackforge lock example-multi --platform arm64" in out
        # the amd64 lock in its place is refused: it was resolved for the other architecture
        own = (multi / "stacks" / "locks" / "example-multi" / "pypi.txt").read_text(encoding="utf-8")
        arm_lock.write_text(own, encoding="utf-8")
        rc, out, _ = run_cli(capsys, multi, "lint", "example-multi")
        assert rc == 1 and "the lock was resolved for CPython 3.11 on manylinux_2_36_x86_64" in out
    finally:
        arm_lock.write_text(text, encoding="utf-8")
    rc, out, _ = run_cli(capsys, multi, "lock", "--check", "example-multi", "--json")
    assert rc == 0 and [r.get("platform") for r in json.loads(out)] == [None, "arm64"]


# ------------------------------------------------------------------ the gate says which machine ran it


def test_the_gate_checks_it_runs_on_the_stacks_platform(monkeypatch):
    import io
    import platform as host

    from tests.fixtures.image_scripts import load as load_script

    gate = load_script("gate")
    monkeypatch.setattr(host, "machine", lambda: "aarch64")
    assert gate.check_machine("aarch64") == (True, "PASS machine aarch64")
    ok, line = gate.check_machine("x86_64")
    assert not ok and line == "FAIL machine aarch64 (the gate ran on aarch64; the stack's platform.arch is x86_64)"
    out = io.StringIO()
    assert gate.run({"machine": "x86_64"}, out=out) == 1
    assert out.getvalue().splitlines()[0].startswith("FAIL machine aarch64")
    out = io.StringIO()
    assert gate.run({"machine": "aarch64"}, out=out, read_only=True) == 0
    assert out.getvalue().splitlines()[0] == "read-only: PASS machine aarch64"


def test_the_gate_spec_names_the_lines_machine(root):
    from stackforge.builder.plan.plan import gate_spec
    from stackforge.builder.run.run import gate_lines

    lines = load("two", root=root).platform_lines()
    assert [gate_spec(ln.model)["machine"] for ln in lines.values()] == ["x86_64", "aarch64"]
    log = "#12 0.41 PASS machine aarch64\n#12 0.52 read-only: PASS machine aarch64\nother\n"
    assert gate_lines(log) == ["PASS machine aarch64", "read-only: PASS machine aarch64"]


def test_a_build_for_a_platform_names_it_to_buildx():
    from stackforge.clients.engine import BuildCommand

    argv = BuildCommand("ctx", platform="linux/arm64", builder="arm-node").argv()
    assert argv[:6] == ["docker", "buildx", "--builder", "arm-node", "build", "--progress=plain"]
    assert argv[6:8] == ["--platform", "linux/arm64"]
    assert "--platform" not in BuildCommand("ctx").argv()


def test_the_abi_check_says_which_machine_resolved_along_which_path(monkeypatch):
    import io
    import platform as host

    from tests.fixtures.image_scripts import load as load_script

    abi = load_script("abi")
    monkeypatch.setattr(host, "machine", lambda: "aarch64")
    out = io.StringIO()
    abi.run({"abi": {"packages": ["no-such-dist-here"], "library_path": ["/usr/lib/aarch64-linux-gnu"]}}, out=out)
    first = out.getvalue().splitlines()[0]
    assert first.startswith("PASS abi   machine    aarch64 LD_LIBRARY_PATH=")
    assert "/usr/lib/aarch64-linux-gnu" in first


# ------------------------------------------------------------------ the index


def test_the_index_lists_each_platform_once_in_order_and_its_bytes_depend_on_its_images_only():
    from stackforge.publish.platforms import Child, PreparedIndex, index_body

    amd = Child("linux/amd64", "sha256:" + "a" * 64, 1000, "application/vnd.oci.image.manifest.v1+json")
    arm = Child("linux/arm64", "sha256:" + "b" * 64, 1001, "application/vnd.oci.image.manifest.v1+json")
    index = PreparedIndex([amd, arm])
    doc = json.loads(index.manifest)
    assert doc["mediaType"] == "application/vnd.oci.image.index.v1+json" and doc["schemaVersion"] == 2
    assert [(m["platform"]["os"], m["platform"]["architecture"], m["digest"], m["size"]) for m in doc["manifests"]] == [
        ("linux", "amd64", amd.digest, 1000),
        ("linux", "arm64", arm.digest, 1001),
    ]
    assert PreparedIndex([amd, arm]).digest == index.digest == index.image_id  # same images: same index
    assert PreparedIndex([amd, Child("linux/arm64", "sha256:" + "c" * 64, 1001, arm.media_type)]).digest != index.digest
    assert index.size == len(index.manifest) + 2001
    with pytest.raises(Exception, match="two images for one platform"):
        index_body([amd, amd])


def test_a_rebuild_builds_the_line_of_the_published_images_platform(tmp_path, monkeypatch):
    from stackforge.flows import rebuild as rebuild_mod
    from stackforge.publish.record_schema import PublishRecord
    from tests.fixtures.records import a_record

    rec = PublishRecord.model_validate(
        a_record(
            "sha256:" + "a" * 64, stack="two", stack_files={"two.yaml": {"sha256": "sha256:" + "d" * 64, "text": TWO}}
        )
    )
    checkout = tmp_path / "checkout"
    (checkout / "stacks").mkdir(parents=True)
    built = []

    class Stop(Exception):
        pass

    def build(loaded, opts, engine=None, echo=None):
        built.append(loaded)
        raise Stop

    monkeypatch.setattr(rebuild_mod, "build", build)
    engine = type("E", (), {"image_id": lambda self, ref: None})()
    for arch, line in (("arm64", "arm64"), ("amd64", "amd64")):
        client = type(
            "C",
            (),
            {"config_of": lambda self, m, a=arch: {"os": "linux", "architecture": a}},
        )()
        with pytest.raises(Stop):
            rebuild_mod.rebuild(
                rec,
                checkout,
                client,
                "sha256:" + "a" * 64,
                {"config": {"digest": "sha256:" + "e" * 64, "size": 9}},
                engine,
            )
        assert built[-1].line.name == line and built[-1].model.platform.arch == (
            "aarch64" if arch == "arm64" else "x86_64"
        )


def test_an_index_is_read_for_its_platforms_and_one_is_picked_by_any_of_its_names():
    from stackforge.flows.operator import _matches, index_entries

    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    doc = {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"digest": a, "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": b, "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": b, "annotations": {"vnd.docker.reference.type": "attestation-manifest"}},  # no platform
            {"digest": "sha256:bad", "platform": {"os": "linux", "architecture": "riscv64"}},  # not a digest
            {"digest": a, "platform": {"os": "linux;rm", "architecture": "amd64"}},  # not a platform
        ],
    }
    assert index_entries(doc) == [("linux/amd64", a), ("linux/arm64", b)]
    assert index_entries({"mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}) is None
    assert [p for p, _ in index_entries(doc) if _matches(p, "aarch64")] == ["linux/arm64"]
    assert [p for p, _ in index_entries(doc) if _matches(p, "arm64")] == ["linux/arm64"]
    assert [p for p, _ in index_entries(doc) if _matches(p, "linux/amd64")] == ["linux/amd64"]
    assert [p for p, _ in index_entries(doc) if _matches(p, "ppc64le")] == []


def test_diff_shows_platforms_as_rows(root, capsys):
    moved = TWO.replace("name: two", "name: moved").replace(
        "torch: {version: 2.11.0.post1+musa5.2.1mp22}", "torch: {version: 2.11.0.post2+musa5.2.1mp22}"
    )
    write(root, "moved", moved)
    rc, out, _ = run_cli(capsys, root, "diff", "two", "moved")
    assert rc == 0
    table = out.split("| platform | before | after | note |\n| --- | --- | --- | --- |\n")[1].splitlines()
    assert table == ["| linux/arm64 torch | 2.11.0.post1+musa5.2.1mp22 | 2.11.0.post2+musa5.2.1mp22 |  |"]
    write(root, "single2", TWO.split("platforms:\n")[0].replace("name: two", "name: single2"))
    rc, out, _ = run_cli(capsys, root, "diff", "single2", "two", "--json")
    assert json.loads(out)["platforms"] == [
        {"package": "linux/arm64", "before": "—", "after": "+musa5.2.1mp22 line",
         "note": "added; declared, not buildable: 1 values unknown"}
    ]  # fmt: skip
    rc, out, _ = run_cli(capsys, root, "diff", "single2", "single2", "--json")
    assert "platforms" not in json.loads(out)  # one platform on both sides: the table as it always was


def test_an_index_entry_whose_digest_is_not_a_digest_is_not_listed():
    """What an index lists is asked for again by its digest (a line pushed again, a record's tag): an entry naming a
    path or anything but ``sha256:<64 hex>`` is not a child of the index."""
    from stackforge.clients.registry import OCI_INDEX, Manifest
    from stackforge.publish import platforms

    good = "sha256:" + "a" * 64
    entries = [
        {"digest": good, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": "../../other/manifests/latest", "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": "sha256:" + "B" * 64, "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": 7, "platform": {"os": "linux", "architecture": "arm64"}},
    ]
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    assert platforms._listed(Manifest(body=body, media_type=OCI_INDEX, header_digest=None)) == [(good, "linux/amd64")]
