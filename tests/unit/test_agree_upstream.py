"""`upstreams.<name>.agree`: the stack against its plugin's own files, from real local git upstreams — checked by
`stackforge lint` from the host's mirror cache (a note when the pinned commit is not fetched), by render and build
from the exported tree, and by `stackforge drift` against a newer revision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackforge.builder.context.prepare import prepare_dockerfile
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.stack.load import StackInvalid, fingerprint, load
from tests.fixtures.gitrepo import GitRepo
from tests.fixtures.stack_support import RootSpec, make_root, run_cli

MUSA_TXT = "# Common dependencies\n-r common.txt\n-r musa_private.txt\n"
PRIVATE = "# MUSA self-built wheels\ntorch==2.11.0.post2+musa5.2.0\nflash_mla==0.2.7+musa\n"
COMMON_1 = "mooncake-transfer-engine==0.3.12.post1\nnumpy==1.26\n"
COMMON_2 = "mooncake-transfer-engine==0.3.13\nnumpy==1.26\nhuggingface_hub<2.0\n"
#: the plugin's Dockerfile pins Mooncake's musa build by a build argument in two stages (lines 5 and 8)
DOCKERFILE_1 = """\
ARG BASE_IMAGE=ubuntu:22.04
FROM ${BASE_IMAGE} AS base
# the transfer engine, binary-only
FROM base AS mooncake
ARG MOONCAKE_VERSION=0.3.13
RUN python -m pip install --only-binary=:all: "mooncake-transfer-engine-musa==${MOONCAKE_VERSION}"
FROM mooncake AS final
ARG MOONCAKE_VERSION=0.3.13
LABEL com.mthreads.vllm-musa.mooncake-version="${MOONCAKE_VERSION}"
"""
DOCKERFILE_2 = DOCKERFILE_1.replace("ARG MOONCAKE_VERSION=0.3.13", "ARG MOONCAKE_VERSION=0.3.13.post1")


class Upstreams:
    """A vLLM-like upstream tagged v0.28.0, and a plugin with two commits on main: the second moves the
    Mooncake pin 0.3.12.post1 -> 0.3.13, adds huggingface_hub<2.0 and names vLLM v0.29.0 in third_party/PINS."""

    def __init__(self, base: Path):
        self.vllm = GitRepo.init(base / "vllm")
        self.vllm.write("setup.py", "# vllm\n")
        self.vllm_commit = self.vllm.commit("vLLM 0.28.0")
        self.vllm.tag("v0.28.0")
        self.plugin = GitRepo.init(base / "plugin")
        self.plugin.write("requirements/musa.txt", MUSA_TXT)
        self.plugin.write("requirements/musa_private.txt", PRIVATE)
        self.plugin.write("requirements/common.txt", COMMON_1)
        self.plugin.write("third_party/PINS", f"# pins\nVLLM_TAG=v0.28.0\nVLLM_COMMIT={self.vllm_commit}\n")
        self.plugin.write("docker/musa.Dockerfile", DOCKERFILE_1)
        self.first = self.plugin.commit("plugin 0.1.24")
        self.plugin.tag("v0.1.24")
        self.plugin.write("requirements/common.txt", COMMON_2)
        self.plugin.write("third_party/PINS", f"# pins\nVLLM_TAG=v0.29.0\nVLLM_COMMIT={'d' * 40}\n")
        self.plugin.write("docker/musa.Dockerfile", DOCKERFILE_2)
        self.second = self.plugin.commit("move Mooncake, cap huggingface_hub, vLLM 0.29.0")


def stack_text(up: Upstreams, agree: str = "") -> str:
    agree = agree or (
        "      requirements: [requirements/musa_private.txt, requirements/common.txt]\n"
        "      keys: {third_party/PINS: {VLLM_TAG: upstreams.vllm.tag, VLLM_COMMIT: upstreams.vllm.commit}}\n"
    )
    return f"""\
name: agr
platform: {{os: debian12, python: "3.11"}}
base: {{image: "stackforge/base:bookworm"}}
indexes:
  vend: {{url: "https://vendor.example/simple", role: vendor, deps_from: pub}}
  pub:  {{url: "https://pypi.example/simple", role: public}}
upstreams:
  vllm: {{git: "{up.vllm.path}", tag: v0.28.0, commit: "{up.vllm_commit}"}}
  plugin:
    git: "{up.plugin.path}"
    tag: v0.1.24
    commit: "{up.first}"
    agree:
{agree}packages:
  torch:      {{version: "2.11.0.post2+musa5.2.0", index: vend}}
  flash_mla:  {{version: "0.2.7", index: vend}}
  mooncake-transfer-engine: {{version: "0.3.12.post1", index: pub}}
  numpy:      {{version: "1.26.0", index: pub}}
requirements:
  plugin:
    index: pub
    files: [{{upstream: plugin, path: requirements/musa.txt}}]
tags: {{local: "agr:1"}}
targets: {{run: {{entrypoint: [python3]}}}}
"""


@pytest.fixture
def up(tmp_path):
    return Upstreams(tmp_path / "upstreams")


@pytest.fixture
def root_spec(tmp_path, up) -> RootSpec:
    return RootSpec(stack_files={"agr.yaml": stack_text(up)}, env={"STACKFORGE_CACHE": str(tmp_path / "cache")})


def test_lint_notes_an_upstream_that_is_not_fetched_and_checks_it_once_it_is(capsys, root, up, tmp_path):
    rc, out, err = run_cli(capsys, root, "lint", "agr")
    assert rc == 0, err
    assert out == "agr: ok\n"
    assert err == (
        f"note: agr: not checked: upstream plugin at {up.first} is not fetched (run stackforge render agr, "
        "or stackforge lint --upstreams agr)\n"
    )
    assert not (tmp_path / "cache" / "git").exists()  # lint fetched nothing
    rc, out, err = run_cli(capsys, root, "lint", "agr", "--json")
    assert rc == 0 and json.loads(out)["notes"] == [
        f"agr: not checked: upstream plugin at {up.first} is not fetched (run stackforge render agr, "
        "or stackforge lint --upstreams agr)"
    ]
    # --upstreams fetches the pinned commit, then compares
    rc, out, err = run_cli(capsys, root, "lint", "--upstreams", "agr")
    assert rc == 1, err
    assert out.splitlines() == [
        "plugin:requirements/musa_private.txt:3: agree: 'flash_mla==0.2.7+musa' pins flash_mla 0.2.7+musa, but the "
        "stack pins flash_mla 0.2.7",
        "  fix: pin packages.flash_mla.version: '0.2.7+musa' (the upstream's), or add "
        "upstreams.plugin.agree.except.flash_mla: <why they differ>",
    ]
    # the commit is cached now: plain lint compares without asking the upstream anything
    up.plugin.git("tag", "-d", "v0.1.24")  # the cache answers, not the repository
    rc, out2, err = run_cli(capsys, root, "lint", "agr", "--json")
    assert rc == 1 and err == ""
    data = json.loads(out2)
    assert data["ok"] is False
    [stack] = data["stacks"]
    assert "notes" not in data and set(stack) == {"stack", "findings"}
    assert stack["findings"] == [
        {
            "rule": "agree",
            "message": "'flash_mla==0.2.7+musa' pins flash_mla 0.2.7+musa, but the stack pins flash_mla 0.2.7",
            "fix": "pin packages.flash_mla.version: '0.2.7+musa' (the upstream's), or add "
            "upstreams.plugin.agree.except.flash_mla: <why they differ>",
            "file": "plugin:requirements/musa_private.txt",
            "line": 3,
            "col": None,
            "kind": "pin",
            "package": "flash_mla",
            "stack": "0.2.7",
            "upstream": "==0.2.7+musa",
        }
    ]


def test_a_reasoned_except_is_the_way_past_and_a_stale_one_is_a_finding(capsys, root, up):
    base = (
        "      requirements: [requirements/musa_private.txt, requirements/common.txt]\n"
        "      except:\n"
        "        flash_mla: the +musa build is not on the vendor index yet\n"
    )
    (root / "stacks" / "agr.yaml").write_text(stack_text(up, base))
    rc, out, err = run_cli(capsys, root, "lint", "--upstreams", "agr")
    assert (rc, out) == (0, "agr: ok\n"), err
    stale = base + "        numpy: numpy differs\n"
    (root / "stacks" / "agr.yaml").write_text(stack_text(up, stale))
    rc, out, err = run_cli(capsys, root, "lint", "agr")
    assert rc == 1
    assert out.splitlines()[0] == (
        "plugin:requirements/common.txt:2: agree: upstreams.plugin.agree.except.numpy is stale: the upstream's "
        "'numpy==1.26' agrees with the stack's 1.26.0"
    )
    # pinning the upstream's version makes the except stale; without it, the stack is clean
    (root / "stacks" / "agr.yaml").write_text(stack_text(up, base))
    rc, out, err = run_cli(capsys, root, "lint", "agr", "--set", "packages.flash_mla.version=0.2.7+musa")
    assert rc == 1 and out.splitlines()[0] == (
        "plugin:requirements/musa_private.txt:3: agree: upstreams.plugin.agree.except.flash_mla is stale: the "
        "upstream's 'flash_mla==0.2.7+musa' agrees with the stack's 0.2.7+musa"
    )
    (root / "stacks" / "agr.yaml").write_text(stack_text(up))
    rc, out, err = run_cli(capsys, root, "lint", "agr", "--set", "packages.flash_mla.version=0.2.7+musa")
    assert (rc, out) == (0, "agr: ok\n"), out


@pytest.mark.parametrize(
    "agree, message",
    [
        ("      except: {flash_mla: ''}\n", "an except needs its reason"),
        ("      except: {flash_mla: '   '}\n", "an except needs its reason"),
        ("      except: {torchvision: why}\n", "upstreams.plugin.agree.except: 'torchvision' is not a pin"),
        ("      requirements: [../outside.txt]\n", "is not a relative path inside the repository"),
        ("      keys: {third_party/PINS: {VLLM_TAG: upstreams.vlm.tag}}\n", "'upstreams.vlm.tag' names no value"),
        ("      keys: {third_party/PINS: {VLLM_TAG: tag}}\n", "is not a stack key"),
        ("      exceptions: {flash_mla: why}\n", "exceptions"),
    ],
)
def test_an_invalid_agree_block_is_refused_on_load(tmp_path, up, agree, message):
    root = make_root(tmp_path, {"agr.yaml": stack_text(up, agree)})
    with pytest.raises(StackInvalid) as info:
        load("agr", root=root)
    assert message in info.value.render()


def test_a_compared_value_the_stack_leaves_unset_is_a_finding_not_a_load_error(capsys, root, up):
    rc, out, err = run_cli(capsys, root, "lint", "--upstreams", "agr", "--set", "upstreams.vllm.tag=null")
    assert rc == 1, err
    assert (
        "plugin:third_party/PINS:2: agree: VLLM_TAG=v0.28.0, but the stack sets no upstreams.vllm.tag"
        in out.splitlines()
    )


def test_the_agree_block_is_not_part_of_the_fingerprint(tmp_path, up):
    one = load("agr", root=make_root(tmp_path / "a", {"agr.yaml": stack_text(up)}))
    other = load("agr", root=make_root(tmp_path / "b", {"agr.yaml": stack_text(up, "      except: {torch: why}\n")}))
    assert fingerprint(one.model) == fingerprint(other.model)


def test_a_child_stack_takes_its_parents_except_away_with_null(tmp_path, up):
    child = "name: agr2\ninherits: agr\nupstreams:\n  plugin:\n    agree:\n      except: {flash_mla: null}\n"
    parent = stack_text(up, "      except: {flash_mla: why, torch: why not}\n")
    loaded = load("agr2", root=make_root(tmp_path, {"agr.yaml": parent, "agr2.yaml": child}))
    agree = loaded.model.upstreams["plugin"].agree
    assert agree is not None and agree.except_ == {"torch": "why not"}


def test_render_fails_on_a_disagreement_naming_the_line_and_writes_nothing(root, up, tmp_path):
    loaded = load("agr", root=root)
    out = tmp_path / "out"
    with pytest.raises(UserError) as info:
        prepare_dockerfile(loaded, out=out, sources=True, workspace=Workspace.at(root))
    err = info.value
    assert (err.file, err.line, err.exit_code) == ("plugin:requirements/musa_private.txt", 3, 1)
    assert err.message == (
        f"stack 'agr' disagrees with upstream plugin at v0.1.24@{up.first}: 'flash_mla==0.2.7+musa' pins flash_mla "
        "0.2.7+musa, but the stack pins flash_mla 0.2.7; nothing was built"
    )
    assert not (out / "context").exists() and not (out / "Dockerfile").exists()


def test_render_checks_every_disagreement_of_the_files_and_keys_at_once(root, up, tmp_path):
    up.vllm.tag("v0.27.0")  # the same commit under another tag: the plugin's PINS names v0.28.0
    loaded = load("agr", root=root, overrides=["upstreams.vllm.tag=v0.27.0", "packages.numpy.version=1.26.4"])
    with pytest.raises(UserError) as info:
        prepare_dockerfile(loaded, out=tmp_path / "out", sources=True, workspace=Workspace.at(root))
    text = info.value.message
    assert text.splitlines()[0] == (
        f"stack 'agr' disagrees with upstream plugin at v0.1.24@{up.first} in 3 places; nothing was built:"
    )
    assert "plugin:requirements/musa_private.txt:3: agree: 'flash_mla==0.2.7+musa' pins" in text
    assert (
        "plugin:requirements/common.txt:2: agree: 'numpy==1.26' pins numpy 1.26, but the stack pins numpy 1.26.4"
        in text
    )
    assert "plugin:third_party/PINS:2: agree: VLLM_TAG=v0.28.0, but the stack's upstreams.vllm.tag is v0.27.0" in text


def test_render_with_agreeing_pins_leaves_the_vendor_lines_to_the_vendor_phase(root, up, tmp_path):
    loaded = load("agr", root=root, overrides=["packages.flash_mla.version=0.2.7+musa"])
    out = tmp_path / "out"
    prepared = prepare_dockerfile(loaded, out=out, sources=True, workspace=Workspace.at(root))
    assert prepared.ctx.dockerfile.is_file()
    manifest = json.loads((out / "context" / "deps" / "requirements.json").read_text())
    assert [(d["package"], d["where"], d["pin"], d["excepted"]) for d in manifest[0]["dropped"]] == [
        ("torch", "plugin:requirements/musa_private.txt:2", "2.11.0.post2+musa5.2.0", None),
        ("flash_mla", "plugin:requirements/musa_private.txt:3", "0.2.7+musa", None),
    ]
    text = (out / "context" / "deps" / "requirements" / "plugin.txt").read_text().splitlines()
    assert text[-2:] == ["mooncake-transfer-engine==0.3.12.post1", "numpy==1.26"]


def test_without_an_agree_block_a_disagreeing_vendor_line_still_fails_the_requirement_phase(root, up, tmp_path):
    text = (
        stack_text(up)
        .replace("    agree:\n", "")
        .replace(
            "      requirements: [requirements/musa_private.txt, requirements/common.txt]\n"
            "      keys: {third_party/PINS: {VLLM_TAG: upstreams.vllm.tag, VLLM_COMMIT: upstreams.vllm.commit}}\n",
            "",
        )
    )
    (root / "stacks" / "agr.yaml").write_text(text)
    with pytest.raises(UserError) as info:
        prepare_dockerfile(load("agr", root=root), out=tmp_path / "out", sources=True, workspace=Workspace.at(root))
    err = info.value
    assert (err.file, err.line) == ("plugin:requirements/musa_private.txt", 3)
    assert err.message.startswith("requirements.plugin.files[0]: 'flash_mla==0.2.7+musa' pins flash_mla 0.2.7+musa")


# ------------------------------------------------------------------------------------- a Dockerfile's build arguments

#: the agree block of a stack whose mooncake target pins the plugin's Mooncake build (args: the Dockerfile's)
ARGS = (
    "      requirements: [requirements/musa_private.txt]\n"
    "      args: {docker/musa.Dockerfile: {MOONCAKE_VERSION: mooncake-transfer-engine-musa}}\n"
)


def args_stack(up: Upstreams, mooncake: str = "0.3.13", agree: str = ARGS) -> str:
    return (
        stack_text(up, agree)
        .replace('version: "0.2.7", index: vend}', 'version: "0.2.7+musa", index: vend}')
        .replace(
            "targets: {run: {entrypoint: [python3]}}",
            "targets:\n  mooncake:\n    publish: false\n    pip:\n      mooncake:\n        index: pub\n"
            f'        only_binary: true\n        requirements: ["mooncake-transfer-engine-musa=={mooncake}"]\n'
            "  run: {from: mooncake, entrypoint: [python3]}",
        )
    )


def test_a_dockerfile_build_argument_disagreement_fails_render_naming_the_file_and_line(tmp_path, up):
    root = make_root(tmp_path, {"agr.yaml": args_stack(up)})
    prepared = prepare_dockerfile(
        load("agr", root=root), out=tmp_path / "ok", sources=True, workspace=Workspace.at(root)
    )
    assert prepared.ctx.dockerfile.is_file()  # both stages' ARG lines agree with the target's pin
    up.plugin.write("docker/musa.Dockerfile", DOCKERFILE_1.replace("0.3.13\nLABEL", "0.3.12.post1\nLABEL"))
    moved = up.plugin.commit("the final stage's label moves alone")
    loaded = load("agr", root=root, overrides=[f"upstreams.plugin.commit={moved}", "upstreams.plugin.tag=null"])
    out = tmp_path / "out"
    with pytest.raises(UserError) as info:
        prepare_dockerfile(loaded, out=out, sources=True, workspace=Workspace.at(root))
    err = info.value
    assert (err.file, err.line, err.exit_code) == ("plugin:docker/musa.Dockerfile", 8, 1)
    assert err.message == (
        f"stack 'agr' disagrees with upstream plugin at {moved}: 'ARG MOONCAKE_VERSION=0.3.12.post1' (stage final) "
        "pins mooncake-transfer-engine-musa 0.3.12.post1, but the stack pins mooncake-transfer-engine-musa 0.3.13; "
        "nothing was built"
    )
    assert err.fix == (
        "pin targets.mooncake.pip.mooncake.requirements[0]: 'mooncake-transfer-engine-musa==0.3.12.post1' (the "
        "upstream's), or add upstreams.plugin.agree.except.mooncake-transfer-engine-musa: <why they differ>"
    )
    assert not (out / "Dockerfile").exists()


def test_lint_holds_a_build_argument_to_the_targets_pin_with_excepts_as_for_a_requirement(capsys, tmp_path, up):
    root = make_root(tmp_path, {"agr.yaml": args_stack(up, "0.3.12.post1")})
    rc, out, err = run_cli(capsys, root, "lint", "--upstreams", "agr")
    assert rc == 1, err
    assert [line for line in out.splitlines() if not line.startswith("  ")] == [
        "plugin:docker/musa.Dockerfile:5: agree: 'ARG MOONCAKE_VERSION=0.3.13' (stage mooncake) pins "
        "mooncake-transfer-engine-musa 0.3.13, but the stack pins mooncake-transfer-engine-musa 0.3.12.post1",
        "plugin:docker/musa.Dockerfile:8: agree: 'ARG MOONCAKE_VERSION=0.3.13' (stage final) pins "
        "mooncake-transfer-engine-musa 0.3.13, but the stack pins mooncake-transfer-engine-musa 0.3.12.post1",
    ]
    reason = "      except: {mooncake-transfer-engine-musa: the 0.3.13 wheel is not on our mirror yet}\n"
    (root / "stacks" / "agr.yaml").write_text(args_stack(up, "0.3.12.post1", ARGS + reason))
    assert run_cli(capsys, root, "lint", "agr")[:2] == (0, "agr: ok\n")
    (root / "stacks" / "agr.yaml").write_text(args_stack(up, "0.3.13", ARGS + reason))
    rc, out, err = run_cli(capsys, root, "lint", "agr")
    assert rc == 1 and out.splitlines()[0] == (
        "plugin:docker/musa.Dockerfile:5: agree: upstreams.plugin.agree.except.mooncake-transfer-engine-musa is "
        "stale: the upstream's 'ARG MOONCAKE_VERSION=0.3.13' (stage mooncake) agrees with the stack's 0.3.13"
    )
    # a build argument the Dockerfile does not declare is a finding too
    other = ARGS.replace("{MOONCAKE_VERSION:", "{MOONCAKE_RELEASE:")
    (root / "stacks" / "agr.yaml").write_text(args_stack(up, "0.3.13", other))
    rc, out, err = run_cli(capsys, root, "lint", "agr")
    assert rc == 1 and out.splitlines()[0] == (
        "plugin:docker/musa.Dockerfile: agree: docker/musa.Dockerfile declares no ARG MOONCAKE_RELEASE=<version> "
        "(in any stage) to compare with the stack's mooncake-transfer-engine-musa"
    )


def test_drift_reads_each_stages_build_argument_at_the_newer_revision(capsys, tmp_path, up):
    root = make_root(tmp_path, {"agr.yaml": args_stack(up)})
    rc, out, err = run_cli(capsys, root, "drift", "agr", "--json")
    assert rc == 1, err
    rows = [r for r in json.loads(out)["upstreams"][0]["rows"] if r["package"] == "mooncake-transfer-engine-musa"]
    assert [(r["change"], r["before"], r["after"], r["where"], r["stack"], r["agrees"]) for r in rows] == [
        ("moved", "==0.3.13", "==0.3.13.post1", "docker/musa.Dockerfile:5", "0.3.13", False),
        ("moved", "==0.3.13", "==0.3.13.post1", "docker/musa.Dockerfile:8", "0.3.13", False),
    ]


# --------------------------------------------------------------------------------------------------------- drift


def test_drift_against_the_default_branch_names_what_moved_with_its_lines(capsys, root, up):
    rc, out, err = run_cli(capsys, root, "drift", "agr")
    assert rc == 1, err
    lines = out.splitlines()
    assert lines[0] == f"agr: upstream plugin v0.1.24@{up.first} → main@{up.second[:12]}: 4 change(s)"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:8]]
    d = "d" * 40
    assert rows == [
        ["change", "package", "stack", "v0.1.24", "main", "where"],
        ["-" * len(rows[1][0])] + rows[1][1:],  # the header rule
        [
            "moved",
            "mooncake-transfer-engine",
            "0.3.12.post1 (differs)",
            "==0.3.12.post1",
            "==0.3.13",
            "requirements/common.txt:1",
        ],
        ["constraint", "huggingface-hub", "", "", "<2.0", "requirements/common.txt:3"],
        ["key", "VLLM_COMMIT", f"{up.vllm_commit} (differs)", up.vllm_commit, d, "third_party/PINS:3"],
        ["key", "VLLM_TAG", "v0.28.0 (differs)", "v0.28.0", "v0.29.0", "third_party/PINS:2"],
    ]
    assert set(rows[1][0]) == {"-"}
    assert lines[8] == f"  third_party/PINS at main: VLLM_TAG=v0.29.0 (line 2), VLLM_COMMIT={d} (line 3)"

    rc, out, err = run_cli(capsys, root, "drift", "agr", "--json")
    assert rc == 1, err
    data = json.loads(out)
    assert (data["stack"], data["drifted"]) == ("agr", True)
    [plugin] = data["upstreams"]
    assert plugin["pinned"] == {"pin": f"v0.1.24@{up.first}", "commit": up.first}
    assert plugin["at"] == {"ref": "main", "commit": up.second}
    assert plugin["rows"][:2] == [
        {
            "change": "moved",
            "package": "mooncake-transfer-engine",
            "stack": "0.3.12.post1",
            "before": "==0.3.12.post1",
            "after": "==0.3.13",
            "where": "requirements/common.txt:1",
            "agrees": False,
        },
        {
            "change": "constraint",
            "package": "huggingface-hub",
            "stack": None,
            "before": None,
            "after": "<2.0",
            "where": "requirements/common.txt:3",
            "agrees": None,
        },
    ]
    assert plugin["keys"] == {
        "third_party/PINS": {
            "VLLM_TAG": {"value": "v0.29.0", "line": 2, "stack": "v0.28.0"},
            "VLLM_COMMIT": {"value": d, "line": 3, "stack": up.vllm_commit},
        }
    }


def test_drift_at_the_pinned_tag_is_none_and_a_stack_pin_meets_a_new_constraint(capsys, root, up):
    rc, out, err = run_cli(capsys, root, "drift", "agr", "--at", "v0.1.24")
    assert rc == 0, err
    assert out.splitlines() == [
        f"agr: upstream plugin v0.1.24@{up.first} → v0.1.24@{up.first[:12]}: no drift",
        f"  third_party/PINS at v0.1.24: VLLM_TAG=v0.28.0 (line 2), VLLM_COMMIT={up.vllm_commit} (line 3)",
    ]
    # a stack that pins huggingface-hub sees whether its pin meets the new constraint; --at a commit id works
    extra = "packages.huggingface-hub={version: 0.35.3, index: pub}"
    rc, out, err = run_cli(capsys, root, "drift", "agr", "--at", up.second, "--json", "--set", extra)
    assert rc == 1, err
    hub = next(r for r in json.loads(out)["upstreams"][0]["rows"] if r["package"] == "huggingface-hub")
    assert (hub["stack"], hub["after"], hub["agrees"]) == ("0.35.3", "<2.0", True)


def test_drift_offline_answers_from_the_cache_once_fetched(capsys, root, up):
    rc, out, err = run_cli(capsys, root, "drift", "agr", "--offline")
    assert rc == 2 and out == ""
    assert err.startswith(f"error: upstream plugin at {up.first} is not fetched\n")
    assert run_cli(capsys, root, "drift", "agr")[0] == 1  # fetches, records the default branch
    up.plugin.write("requirements/common.txt", COMMON_1)
    up.plugin.commit("back to 0.3.12.post1")  # not fetched: the cache still says main is the second commit
    rc, out, err = run_cli(capsys, root, "drift", "agr", "--offline", "--json")
    assert rc == 1 and json.loads(out)["upstreams"][0]["at"]["commit"] == up.second
    rc, out, err = run_cli(capsys, root, "drift", "agr", "--json")  # fetched again: only the keys moved
    assert rc == 1 and [r["change"] for r in json.loads(out)["upstreams"][0]["rows"]] == ["key", "key"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--upstream", "vllm"], "--upstream vllm: upstreams.vllm declares no agree: (nothing to compare)"),
        (["--upstream", "nope"], "--upstream nope: stack 'agr' has no upstream 'nope'"),
        (["--at", "no-such-branch"], "--at no-such-branch: neither a branch, a tag nor a commit of upstream plugin"),
        (["--at=--upload-pack=x"], "--at --upload-pack=x: neither a branch"),
    ],
)
def test_drift_bad_input_exits_2_with_one_error(capsys, root, args, message):
    rc, out, err = run_cli(capsys, root, "drift", "agr", *args)
    assert (rc, out) == (2, "")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), err
    assert "Traceback" not in err


def test_drift_of_a_stack_without_agree_is_bad_input(capsys, tmp_path, up):
    text = stack_text(up, "      requirements: []\n").replace("    agree:\n      requirements: []\n", "")
    root = make_root(tmp_path, {"plain.yaml": text.replace("name: agr", "name: plain")})
    rc, out, err = run_cli(capsys, root, "drift", "plain")
    assert (rc, out) == (2, "")
    assert err.startswith("error: stack 'plain' has no upstream that declares agree: (nothing to compare)")


# ------------------------------------------------------------------ post1 and post2 against the plugin stand-in


@pytest.fixture(scope="module")
def plugin_standins(tmp_path_factory):
    """vllm, the plugin (its requirement files and third_party/PINS on their upstream lines, from the facts),
    FlashInfer and vllm-omni stand-ins at the tags the stacks pin."""
    from tests.fixtures import musa_standins as ms

    repo = Path(__file__).resolve().parents[2]
    return ms.make_upstreams(tmp_path_factory.mktemp("agree-upstreams"), load("post2", root=repo).model)


@pytest.mark.parametrize("name", ["post1", "post2"])
def test_post_stacks_agree_with_the_plugin_and_post1_excepts_its_train(name, plugin_standins, tmp_path, monkeypatch):
    import shutil

    from stackforge.builder.context.context import assemble
    from tests.fixtures import facts, standin_slices
    from tests.fixtures import musa_standins as ms
    from tests.fixtures.stack_support import REPO

    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    root = make_root(tmp_path)
    shutil.copytree(REPO / "patches", root / "patches")
    loaded = load(name, root=root, overrides=ms.upstream_overrides(plugin_standins))
    ctx = assemble(loaded, tmp_path / "out")
    manifest = json.loads((ctx.context_dir / "deps" / "requirements.json").read_text())
    common = next(p for p in manifest if p["phase"] == "requirements.vllm-common")
    dropped = {d["package"]: d for d in common["dropped"] if not d["public"]}
    plugin = facts.plugin_vendor_pins()
    assert set(dropped) == set(plugin)  # every line of musa_private.txt names a vendor pin, left to the vendor phase
    for package, (line, version) in plugin.items():
        assert dropped[package]["where"] == f"vllm_musa:requirements/musa_private.txt:{line}"
        assert dropped[package]["pin"] == loaded.model.packages[package].version
    excepted = {p for p, d in dropped.items() if d["excepted"]}
    assert excepted == ({"torch", "torch_musa", "torchvision", "torchaudio", "deep_ep"} if name == "post1" else set())
    # the plugin's torchada==0.1.90 (common.txt, read as vLLM's constraint and through musa.txt): post1 pins the
    # post1 train's 0.1.83 and says why, so its public phase installs that and the line is left out; post2 agrees
    public = [(d["package"], d["requirement"], d["pin"], bool(d["excepted"])) for d in common["dropped"] if d["public"]]
    assert public == ([("torchada", "torchada==0.1.90", "0.1.83", True)] * 2 if name == "post1" else [])
    constraints = (ctx.context_dir / "deps" / "requirements" / "vllm-common.constraints.txt").read_text()
    own = constraints.split("# the upstream's own constraints\n", 1)[1].splitlines()
    plugin_common = [  # the plugin's common.txt as the stand-in carries it (facts/vllm-musa.yaml), as pip reads it
        "transformers==5.5.3",
        "huggingface_hub<2.0,>=1.27.0",
        "mthreads-ml-py>=2.4.1",
        "numpy==1.26",
        "openai>=2.24.0",
        "einops",
        "ray<=2.48.0,>=2.47.1",
    ]
    assert own == (plugin_common if name == "post1" else ["torchada==0.1.90", *plugin_common])
    # lint, from the mirror the render filled, agrees too
    from stackforge.builder.sources.agree import lint_upstreams

    result = lint_upstreams(loaded, Workspace.at(root))
    assert (result.findings, result.notes, result.checked) == ([], [], ["vllm_musa"])
    # Mooncake moved by --set: the plugin's Dockerfile's build argument names it, in each stage that declares it
    moved = "targets.mooncake.pip.mooncake.requirements=[mooncake-transfer-engine-musa==0.3.12.post1]"
    loaded = load(name, root=root, overrides=[*ms.upstream_overrides(plugin_standins), moved])
    found = lint_upstreams(loaded, Workspace.at(root)).findings
    dockerfile = standin_slices.contract_dockerfile().splitlines()
    assert [(f.path, f.line, f.spec) for f in found] == [
        ("docker/musa.Dockerfile", n, "==0.3.13")
        for n, text in enumerate(dockerfile, 1)
        if text == "ARG MOONCAKE_VERSION=0.3.13"
    ]
    assert len(found) == 2  # the mooncake and the final stage


def test_the_nightly_summary_has_a_drift_column_with_n_a_and_its_reason(root, up, tmp_path, monkeypatch):
    from stackforge.flows.nightly import Row, Summary
    from stackforge.freshness.drift import nightly_cell

    summary = Summary("20260929", "r", rows=[Row("agr", "run", "published")])
    summary.drift = {
        "agr": nightly_cell(load("agr", root=root), Workspace.at(root)),
        "post2": nightly_cell(load("post2", root=root, overrides=["upstreams.vllm_musa.git=/nonexistent/plugin"])),
    }
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "empty-cache"))
    summary.drift["offline"] = nightly_cell(load("agr", root=root), fetch=False)
    md = summary.markdown().splitlines()
    i = md.index("| stack | upstream pins drifted | what drifted |")
    assert md[i + 2] == (
        "| agr | yes | plugin: moved mooncake-transfer-engine ==0.3.12.post1 → ==0.3.13 (requirements/common.txt:1); "
        "plugin: constraint huggingface-hub ∅ → <2.0 (requirements/common.txt:3); "
        f"plugin: key VLLM_COMMIT {up.vllm_commit} → {'d' * 40} (third_party/PINS:3); "
        "plugin: key VLLM_TAG v0.28.0 → v0.29.0 (third_party/PINS:2) |"
    )
    assert md[i + 3] == "| post2 | n/a | upstream git path /nonexistent/plugin does not exist |"
    assert md[i + 4] == (f"| offline | n/a | upstream plugin at {up.first} is not fetched |")
    data = json.loads(json.dumps(summary.to_json()))["drift"]
    assert data["agr"]["drifted"] is True and data["agr"]["rows"] == 4
    assert data["post2"] == {"error": "n/a: upstream git path /nonexistent/plugin does not exist"}
