"""Child, intermediate and alias targets: schema, cross-key checks with file:line, plan and template shape."""

from __future__ import annotations

import pytest

from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.render import render_dockerfile
from stackforge.builder.run.bake import stack_targets
from stackforge.builder.run.run import default_target, target_ref
from stackforge.errors import UserError
from stackforge.stack.load import StackInvalid, load
from stackforge.stack.tags import local_ref
from tests.fixtures.stack_support import locate, make_root

CHILD = """\
name: child
inherits: post2
targets:
  vllm-openai:
    from: vllm-omni
"""


def errors(exc: StackInvalid) -> list[str]:
    return [p.render() for p in exc.problems]


def test_the_real_chain_orders_parents_first_and_publishes_three_targets():
    stack = load("post2")
    plan = make_plan(stack)
    stages = {t.name: t for t in plan.target_stages}
    assert [t.name for t in plan.target_stages] == ["mooncake", "final", "vllm-openai", "vllm-omni", "default"]
    assert [(t.parent, t.root, t.alias, t.publish) for t in stages.values()] == [
        ("gate", True, False, False),
        ("mooncake", False, False, False),
        ("final", False, False, True),
        ("vllm-openai", False, False, True),
        ("vllm-openai", False, True, True),
    ]
    omni = stages["vllm-omni"]
    assert omni.labels["org.stackforge.repin.tilelang-musa"] == "0.1.8+musa.3"
    assert omni.labels["com.mthreads.vllm-omni.revision"] == stack.model.upstreams["vllm_omni"].commit
    assert [(p.name, p.repin, p.no_deps, p.credentials) for p in omni.pip] == [
        ("tilelang", ["tilelang-musa==0.1.8+musa.3"], True, True),
        ("omni", [], False, False),
    ]
    assert [s.stage for s in omni.system] == ["system-vllm-omni.media"]
    assert "package targets.vllm-omni.system.media.packages.0|ffmpeg|any|-|ffmpeg" in omni.system[0].spec
    # build, bake and publish see only the published targets; the first one carries the stack's own tag
    assert default_target(stack, None) == "vllm-openai"
    assert stack_targets(stack, None) == ["vllm-openai", "vllm-omni", "default"]
    assert target_ref(stack, "vllm-openai") == str(local_ref(stack))
    assert target_ref(stack, "default").endswith("-default")
    with pytest.raises(UserError, match="target 'final' of stack 'post2' is publish: false"):
        default_target(stack, "final")


def test_the_template_writes_an_alias_as_a_bare_stage_and_labels_the_stack_once():
    stack = load("post2")
    text = render_dockerfile(make_plan(stack), {"org.stackforge.stack": "post2"})
    stages = text.split("\nFROM ")
    default = next(s for s in stages if s.startswith("vllm-openai AS default"))
    assert default.strip() == "vllm-openai AS default"
    assert text.count('"org.stackforge.stack"="post2"') == 1  # on the root target only; children inherit it
    kernel = next(s for s in stages if s.startswith("vllm-openai AS kernel-vllm-omni.vllm_omni"))
    assert "PIP_NO_INDEX=1" in kernel
    omni = next(s for s in stages if s.startswith("vllm-openai AS vllm-omni"))
    assert "--mount=type=bind,from=kernel-vllm-omni.vllm_omni,source=/out/wheels" in omni
    assert "COPY --from=src-vllm_omni / /vllm-workspace/vllm-omni" in omni
    assert "--repin tilelang-musa==0.1.8+musa.3" in omni
    assert omni.index("pip phase targets.vllm-omni.pip.tilelang") < omni.index("pip phase targets.vllm-omni.pip.omni")


def test_a_cycle_in_from_is_a_load_error_with_file_and_line(tmp_path):
    root = make_root(tmp_path, {"child.yaml": CHILD})
    with pytest.raises(StackInvalid) as exc:
        load("child", root=root)
    line, _ = locate(root / "stacks" / "child.yaml", "from: vllm-omni", "vllm-omni")
    (msg,) = errors(exc.value)
    assert f"child.yaml:{line}:" in msg
    assert "targets.vllm-openai.from: targets build on each other: vllm-openai -> vllm-omni -> vllm-openai" in msg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("targets.default.from=vllm-open", "targets.default.from: unknown target 'vllm-open'"),
        ("targets.vllm-omni.sources={nope: /x}", "targets.vllm-omni.sources.nope: unknown upstream 'nope'"),
        ("targets.vllm-omni.pip.omni.index=pipy", "targets.vllm-omni.pip.omni.index: unknown index 'pipy'"),
        ("targets.vllm-omni.pip.omni.repin=true", "repin: true takes exact pins"),
        (
            "targets.vllm-omni.pip.tilelang.requirements=[numpy==1.26.4]",
            "'numpy==1.26.4' re-pins a package no vendor index of the stack provides",
        ),
        ("targets.vllm-omni.pip.omni.requirements=['--index-url=http://x']", "options, URLs and paths are refused"),
        ("targets.vllm-omni.pip.omni.requirements=['x @ file:///etc']", "options, URLs and paths are refused"),
        ("targets.vllm-openai.publish=false", None),
        ("targets.vllm-omni.workdir=relative", "workdir"),
    ],
)
def test_bad_target_values_name_the_key(override, message):
    if message is None:  # an unpublished vllm-openai: the others still publish, so it loads
        stack = load("post2", overrides=[override])
        assert stack_targets(stack, None) == ["vllm-omni", "default"]
        return
    with pytest.raises(StackInvalid) as exc:
        load("post2", overrides=[override])
    assert any(message in e for e in errors(exc.value)), errors(exc.value)


def test_every_target_unpublished_is_an_error():
    sets = [f"targets.{t}.publish=false" for t in ("vllm-openai", "vllm-omni", "default")]
    with pytest.raises(StackInvalid) as exc:
        load("post2", overrides=sets)
    assert any("every target is publish: false" in e for e in errors(exc.value))


def test_target_env_is_rendered_from_the_platform(tmp_path):
    """The final image keeps the GPU architecture variables the plugin's JIT reads, derived from platform.gpu_arch."""
    root = make_root(tmp_path)
    for arch, torch_arch, mate_arch in ((["mp_31"], "31", "3.1"), (["mp_22", "mp_31"], "22,31", "2.2,3.1")):
        stack = load("post2", root, [f"platform.gpu_arch=[{', '.join(arch)}]"])
        (final,) = [t for t in make_plan(stack).target_stages if t.name == "final"]
        assert final.env == {
            "MTHREADS_VISIBLE_DEVICES": "all",
            "MTGPU_TARGET": ",".join(arch),
            "TORCH_MUSA_ARCH_LIST": torch_arch,
            "MATE_MUSA_ARCH_LIST": mate_arch,
        }
