"""The plugin's image contract (``upstreams.vllm_musa.contract``): post1 and post2 hold every line of it, a stack
that does not fails lint and render naming the contract's line, the stack's lines say what the facts recorded
from the module at the pin say, and ``verify`` checks the image's configuration against them."""

from __future__ import annotations

import pytest

from stackforge.builder.context.prepare import lint, prepare_dockerfile
from stackforge.builder.plan import contract
from stackforge.builder.plan.plan import gate_spec, image_labels
from stackforge.errors import UserError
from stackforge.stack.load import StackInvalid, fingerprint, load
from stackforge.stack.model import CONTRACT_CHECKS
from tests.fixtures import facts
from tests.fixtures.image_scripts import load as load_image_script
from tests.fixtures.stack_support import REPO, make_root

MODULE = "vllm_musa:tests/test_inplace_porting_contract.py"

#: where the fork's build arguments come from, in the stack's terms (facts ``contract.build_args``: the plugin's
#: commit, its tag, the vLLM tag its third_party/PINS names)
BUILD_ARGS = {
    "${VLLM_MUSA_COMMIT}": "{{ upstreams.vllm_musa.commit }}",
    "${VLLM_MUSA_REF}": "{{ upstreams.vllm_musa.tag }}",
    "${VLLM_TAG}": "{{ upstreams.vllm.tag }}",
}


def contract_findings(name: str, *overrides: str) -> list[str]:
    loaded = load(name, root=REPO, overrides=list(overrides))
    return [f.render(loaded) for f in lint(loaded) if f.rule == "contract"]


@pytest.mark.parametrize("name", ["post1", "post2"])
def test_post_stacks_hold_every_line_of_the_plugins_image_contract(name):
    assert contract_findings(name) == []
    assert len(load(name, root=REPO).model.upstreams["vllm_musa"].contract.lines) == 33


def test_the_stacks_contract_is_the_one_the_facts_recorded_from_the_module_at_the_pin():
    """Every line the facts say holds of an image is in post1's contract, saying the same (nothing dropped or
    softened), and the stack names no line the facts do not."""
    data = facts.contract()
    up = load("post1", root=REPO).model.upstreams["vllm_musa"]
    assert up.commit == data["commit"] and up.contract.file == data["module"]
    recorded = {e["line"]: e["holds"] for e in data["lines"] if "holds" in e}
    declared = {}
    for cl in up.contract.lines:
        check = {k: getattr(cl, k) for k in CONTRACT_CHECKS if k in cl.model_fields_set}
        [(kind, value)] = check.items()
        if kind in ("installs_file",):
            value = value.model_dump(exclude_defaults=True)
        elif kind == "constrained":
            value = {k: v.model_dump(exclude_defaults=True) for k, v in value}
        elif kind == "labels":
            value = {k: next((a for a, s in BUILD_ARGS.items() if s == v), v) for k, v in value.items()}
        declared[cl.line] = {**({"target": cl.target} if cl.target else {}), kind: value}
        if cl.kernel is not None:  # the plugin's setup.py installs vLLM: the stack's vllm kernel builds it
            assert (cl.kernel, cl.line) == ("vllm", 422)
    assert declared == recorded


@pytest.mark.parametrize(
    "override, line, says",
    [
        ("created_label=true", 357, "but the image is labelled org.opencontainers.image.created"),
        (
            "targets.mooncake.pip.mooncake.requirements=[mooncake-transfer-engine-musa==0.3.12.post1]",
            241,
            "but targets.mooncake.pip.mooncake installs mooncake-transfer-engine-musa==0.3.12.post1",
        ),
        (
            "targets.mooncake.pip.mooncake.only_binary=false",
            243,
            "but targets.mooncake.pip.mooncake is not only_binary",
        ),
        ("targets.final.workdir=/workspace/vllm-musa", 194, "but target final's workdir is '/workspace/vllm-musa'"),
        ("targets.final.env.MTHREADS_VISIBLE_DEVICES=0", 401, "but target final sets MTHREADS_VISIBLE_DEVICES=0"),
        ("targets.mooncake.env.MTHREADS_VISIBLE_DEVICES=all", 239, "but target mooncake sets MTHREADS_VISIBLE_DEVICES"),
        (
            "targets.vllm-omni.env.MUSA_VISIBLE_DEVICES=all",
            400,
            "but MUSA_VISIBLE_DEVICES is set in targets.vllm-omni.env",
        ),
        ("tuning.MUSA_VISIBLE_DEVICES=0", 400, "but MUSA_VISIBLE_DEVICES is set in kernels."),
        ("targets.final.entrypoint=[vllm]", 269, "but target final's entrypoint is ['vllm']"),
        ("targets.final.cmd=[sh]", 268, "but target final's cmd is ['sh']"),
        ("gate.exact=[torch]", 171, "but gate.exact does not name torchada, torch_musa"),
        ("targets.final.from=null", 217, "but target final builds on the gate, not on mooncake"),
        ("kernels.vllm.env.VLLM_VERSION_OVERRIDE=0.28.1", 422, "but kernel vllm sets VLLM_VERSION_OVERRIDE=0.28.1"),
        (
            "labels={org.opencontainers.image.source: 'https://github.com/MooreThreads/vllm-musa.git'}",
            350,
            "but the image labels org.opencontainers.image.source='https://github.com/MooreThreads/vllm-musa.git'",
        ),
        ("targets.final.labels={}", 272, "but target final carries no label com.mthreads.vllm-musa.mooncake-version"),
        (
            "requirements.vllm-common.files=[{upstream: vllm, path: requirements/common.txt}, "
            "{upstream: vllm_musa, path: requirements/musa.txt}]",
            137,
            "but requirements.vllm-common installs vllm:requirements/common.txt without "
            "vllm_musa:requirements/common.txt as a constraint",
        ),
        ("gate.imports=[{module: vllm}]", 125, "but the gate imports no transformers, huggingface_hub"),
        (
            "targets.mooncake.checks=[]",
            244,
            "but no check of target mooncake reads version('mooncake-transfer-engine-musa')",
        ),
    ],
)
def test_a_stack_that_does_not_hold_a_line_fails_lint_naming_the_contracts_line(override, line, says):
    found = [f for f in contract_findings("post2", override) if f.startswith(f"{MODULE}:{line}: contract: ")]
    assert len(found) == 1 and says in found[0], contract_findings("post2", override)


def test_a_build_option_chosen_with_set_is_the_builds_choice_the_declared_default_is_the_contracts(tmp_path):
    """The fork's Dockerfile declares ARG BUILD_VLLM_RS=1 and its build script passes BUILD_VLLM_RS=0 when asked
    (the post2 record built so): a --set value is that choice; the value the stack file declares is the default."""
    assert contract_findings("post2", "options.BUILD_VLLM_RS.value=0") == []
    text = (REPO / "stacks" / "post1.yaml").read_text()
    declared = text.replace(
        '    value: "1"\n    description: build vllm-rs', '    value: "0"\n    description: build vllm-rs'
    )
    assert declared != text
    root = make_root(tmp_path, {"post1.yaml": declared, "post2.yaml": (REPO / "stacks" / "post2.yaml").read_text()})
    loaded = load("post2", root=root)
    found = [f.render(loaded) for f in lint(loaded) if f.rule == "contract"]
    assert len(found) == 1 and found[0].startswith(
        f"{MODULE}:261: contract: the image contract says ARG BUILD_VLLM_RS=1; but options.BUILD_VLLM_RS is '0'"
    )


def test_render_fails_on_a_contract_line_before_writing_anything(tmp_path):
    loaded = load("post2", root=REPO, overrides=["created_label=true"])
    with pytest.raises(UserError) as info:
        prepare_dockerfile(loaded, out=tmp_path / "out", sources=False)
    assert f"{MODULE}:357: contract: the image contract says no org.opencontainers.image.created label" in (
        info.value.message
    )
    assert not (tmp_path / "out" / "Dockerfile").exists()


def test_a_contract_line_checks_one_thing_and_the_contract_is_outside_the_fingerprint(tmp_path):
    with pytest.raises(StackInvalid, match="a contract line checks one thing; it gives workdir, cmd"):
        load(
            "post2",
            root=REPO,
            overrides=["upstreams.vllm_musa.contract.lines=[{line: 1, says: x, workdir: /a, cmd: [b]}]"],
        )
    with pytest.raises(StackInvalid, match="gate.exact: 'nope' is not a package of the stack"):
        load("post2", root=REPO, overrides=["gate.exact=[nope]"])
    plain = load("post2", root=REPO, overrides=["upstreams.vllm_musa.contract=null"])
    assert fingerprint(plain.model) == fingerprint(load("post2", root=REPO).model)


def test_the_post_images_leave_out_the_created_label_the_contract_forbids():
    loaded = load("post2", root=REPO)
    assert loaded.model.created_label is False and not loaded.model.labels_created
    assert "org.opencontainers.image.created" not in image_labels(loaded)
    assert image_labels(loaded)["org.opencontainers.image.source"] == "https://github.com/MooreThreads/vllm-musa"
    spec = gate_spec(loaded.model)
    assert [p["name"] for p in spec["packages"] if p.get("exact")] == [
        "torchada",
        "torch",
        "torch_musa",
        "torchvision",
        "torchaudio",
        "deep_ep",
    ]


def test_the_gate_holds_an_exact_dist_to_the_pin_itself(monkeypatch):
    gate = load_image_script("gate")
    monkeypatch.setattr(gate, "_version", lambda dist: "0.1.90+local")
    pkg = {"name": "torchada", "dist": "packaging", "import": "packaging", "mode": "exact", "version": "0.1.90"}
    assert gate.check_package(pkg)[0]  # a build of the pin, which the local-label rule accepts
    ok, line = gate.check_package({**pkg, "exact": True})
    assert not ok and line.endswith(
        "expected=0.1.90 found=0.1.90+local (gate.exact: the pin itself, not a build of it)"
    )


def _config(loaded, target: str = "vllm-openai") -> dict:
    """An image Config as the engine reports it, for the stack's target as it renders."""
    env = contract.target_env(loaded, target)
    return {
        "Labels": contract.target_labels(loaded, target),
        "Env": [f"{k}={v}" for k, v in env.items()] + ["PATH=/opt/venv/bin:/usr/bin"],
        "WorkingDir": "/vllm-workspace",
        "Cmd": ["/bin/bash"],
        "Entrypoint": ["vllm", "serve"],
    }


def test_verify_checks_the_images_configuration_against_the_contract():
    loaded = load("post2", root=REPO)
    lines = contract.image_lines(loaded, _config(loaded))
    assert lines and all(ok for ok, _ in lines), [t for ok, t in lines if not ok]
    texts = [t for _, t in lines]
    # lines about the final and vllm-openai stages apply to every published image (each builds on them), but
    # not what a later stage changes: the mooncake stage's lack of MTHREADS_VISIBLE_DEVICES, final's of an
    # ENTRYPOINT
    assert f"contract {MODULE}:401 MTHREADS_VISIBLE_DEVICES=all" in texts
    assert f"contract {MODULE}:272 com.mthreads.vllm-musa.mooncake-version=0.3.13" in texts
    commit = loaded.model.upstreams["vllm_musa"].commit
    assert f"contract {MODULE}:351 org.opencontainers.image.revision={commit}" in texts
    assert not [t for t in texts if f"{MODULE}:239 " in t or f"{MODULE}:269 " in t]
    bad = _config(loaded)
    bad["Env"].append("MUSA_VISIBLE_DEVICES=all")
    bad["Labels"]["org.opencontainers.image.created"] = "2026-09-29T00:00:00Z"
    failed = [t for ok, t in contract.image_lines(loaded, bad) if not ok]
    assert failed == [
        f"contract {MODULE}:357 no label org.opencontainers.image.created (the image: "
        "org.opencontainers.image.created=2026-09-29T00:00:00Z)",
        f"contract {MODULE}:400 no ENV MUSA_VISIBLE_DEVICES (the image: MUSA_VISIBLE_DEVICES=all)",
    ]


def test_verify_adds_the_contract_lines_of_a_stack_image_not_of_an_overlays(monkeypatch):
    from stackforge.builder.plan.plan import LABEL_NS
    from stackforge.builder.run import verify as verifymod

    monkeypatch.setattr(verifymod, "run_gate", lambda loaded, image, engine, script="gate.py": (True, []))
    loaded = load("post2", root=REPO)
    config = _config(loaded)
    labels = {**config["Labels"], f"{LABEL_NS}.stack": "post2", f"{LABEL_NS}.fingerprint": fingerprint(loaded.model)}
    labels.update({f"{LABEL_NS}.pin.{n}": p.version for n, p in loaded.model.packages.items()})
    labels.update({f"{LABEL_NS}.option.{n}": o.value for n, o in loaded.model.options.items()})
    v = verifymod.verify(loaded, "img:1", labels, object(), config)  # type: ignore[arg-type]
    assert v.failed == 0, v.lines
    checked = {c["what"]: c for c in v.checked()}
    assert checked["contract lines"]["ok"] is True and checked["contract lines"]["count"] > 10
    config["Env"].append("MUSA_VISIBLE_DEVICES=0")
    v = verifymod.verify(loaded, "img:1", labels, object(), config)  # type: ignore[arg-type]
    assert v.failed == 1 and any(line.startswith(f"FAIL contract {MODULE}:400 ") for line in v.lines)
    overlay = {**labels, f"{LABEL_NS}.overlay": "jev"}
    v = verifymod.verify(loaded, "img:1", overlay, object(), config)  # type: ignore[arg-type]
    assert not [line for line in v.lines if " contract " in line]
