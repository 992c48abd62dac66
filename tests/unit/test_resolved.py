"""A resolved stack (stack/resolved.py): every templated value renders once per load, keeps where it was
written, and the build steps read the rendered values."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from stackforge.builder.plan.plan import image_labels, make_plan
from stackforge.builder.run.run import target_ref
from stackforge.errors import UserError
from stackforge.stack import tags
from stackforge.stack.load import load
from stackforge.stack.resolved import resolve

REPO = Path(__file__).resolve().parents[2]


def test_one_load_renders_each_template_once(monkeypatch):
    seen: Counter = Counter()
    render = tags.render_template

    def counting(loaded, template, path, **kwargs):
        seen[path] += 1
        return render(loaded, template, path, **kwargs)

    monkeypatch.setattr(tags, "render_template", counting)
    loaded = load("post2", root=REPO)
    make_plan(loaded)
    image_labels(loaded)
    target_ref(loaded, "vllm-openai")
    make_plan(loaded)
    assert seen and max(seen.values()) == 1, [p for p, n in seen.items() if n > 1]
    assert ("tags", "local") in seen and ("labels", "com.mthreads.vllm.version") in seen
    assert ("targets", "final", "env", "MTGPU_TARGET") in seen
    assert not any(p[:2] in (("tags", "publish"), ("tags", "aliases")) for p in seen)  # rendered at publish time


def test_the_plan_carries_the_resolved_values():
    loaded = load("post2", root=REPO)
    resolved, plan = loaded.resolved, make_plan(loaded)
    assert plan.local_ref == str(resolved.local)
    assert {k.name: k.env for k in plan.kernels} == resolved.kernels
    assert {k.name: k.toolchain.env for k in plan.kernels if k.toolchain} == resolved.toolchains
    final = next(t for t in plan.target_stages if t.name == "final")
    assert final.env == resolved.targets["final"].env
    assert resolved.targets["final"].env["MTGPU_TARGET"] == "mp_31"
    musa = next(s for s in plan.system if s.name == "musa")
    link = resolved.value(("system", "musa", "symlinks", "/usr/local/musa"), "?")
    assert link.startswith("/usr/local/musa-") and f"|/usr/local/musa|{link}" in musa.spec
    assert image_labels(loaded)["com.mthreads.vllm.version"] == resolved.labels["com.mthreads.vllm.version"]


def test_each_value_keeps_its_template_and_position():
    loaded = load("post2", root=REPO)
    key = ("targets", "final", "env", "MTGPU_TARGET")
    found = loaded.resolved.rendered[key]
    assert "{{" in found.template and found.text == "mp_31"
    assert found.pos == loaded.position(key) and found.pos.file.endswith(".yaml") and found.pos.line
    assert loaded.resolved.value(("system", "os", "packages", 0, "name"), "as written") == "as written"


def test_a_load_resolves_once_and_a_new_load_again():
    loaded = load("example", root=REPO)
    assert loaded.resolved is loaded.resolved
    again = load("example", root=REPO, overrides=["tags.local=x:{{ platform.python }}"])
    assert str(again.resolved.local) == "x:3.11" and str(loaded.resolved.local) != "x:3.11"


def test_the_first_template_error_names_the_key_and_its_place():
    loaded = load("example", root=REPO, overrides=["kernels.markupsafe.env.X={{ nosuch }}"])
    with pytest.raises(UserError) as info:
        resolve(loaded)
    assert info.value.message.startswith("kernels.markupsafe.env.X: template uses an unknown value")
    assert info.value.file == "--set kernels.markupsafe.env.X={{ nosuch }}"
    with pytest.raises(UserError) as again:
        make_plan(loaded)
    assert again.value.message == info.value.message


def test_a_kernel_the_options_leave_out_is_not_rendered():
    """Its env is not the build's: a template there fails only when the options select the kernel."""
    root_args = ["kernels.vllm_rs.env.X={{ nosuch }}"]
    off = load("post2", root=REPO, overrides=[*root_args, "options.BUILD_VLLM_RS.value=0"])
    assert "vllm_rs" not in off.resolved.kernels and "vllm_rs" not in off.resolved.toolchains
    with pytest.raises(UserError, match="kernels.vllm_rs.env.X"):
        resolve(load("post2", root=REPO, overrides=[*root_args, "options.BUILD_VLLM_RS.value=1"]))


def test_a_layer_with_env_before_a_templated_layer_plans():
    """Each system layer reads its resolved values, whatever the layer before it declared."""
    loaded = load("post2", root=REPO, overrides=["system.os.env.X=1"])
    assert list(loaded.model.system or {}) == ["os", "musa"]
    stages = {s.name: s for s in make_plan(loaded).system}
    assert stages["os"].env == {"X": "1"}
    link = loaded.resolved.value(("system", "musa", "symlinks", "/usr/local/musa"), "?")
    assert f"|/usr/local/musa|{link}" in stages["musa"].spec
