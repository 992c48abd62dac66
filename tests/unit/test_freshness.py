"""Lines, coherent train moves and stale-reference tokens, on hand-made index pages (no HTTP)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from packaging.tags import Tag
from packaging.version import Version

from stackforge.builder.plan.resolve import Target
from stackforge.clients.index import IndexFile, ProjectPage
from stackforge.errors import UserError
from stackforge.freshness import audit, bump, lines, newest
from stackforge.stack import platforms
from stackforge.stack.load import load, load_stack

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 9, 23, 11, 59, tzinfo=timezone.utc)
X86 = "cp310-cp310-linux_x86_64"


def page(name: str, *files: str | tuple) -> ProjectPage:
    """files: "version[@tags]" strings, or (spec, {"yanked": ..., "time": ...}) tuples."""
    out = []
    for spec in files:
        opts = {}
        if isinstance(spec, tuple):
            spec, opts = spec
        version, _, tags = spec.partition("@")
        tags = tags or X86
        fn = f"{name}-{version}.tar.gz" if tags == "sdist" else f"{name}-{version}-{tags}.whl"
        out.append(
            IndexFile(
                fn, f"https://idx.example/{fn}", {"sha256": "0" * 64}, 10, opts.get("time"), opts.get("yanked", False)
            )
        )
    return ProjectPage(name, f"https://idx.example/simple/{name}/", out, "json")


@pytest.fixture(scope="module")
def post1():
    return load_stack("post1", root=ROOT)


@pytest.fixture(scope="module")
def post2():
    return load_stack("post2", root=ROOT)


def test_target_tags_follow_the_stack_platform(post1):
    tags = lines.target_tags(post1)
    assert tags[0] == Tag("cp310", "cp310", "manylinux_2_35_x86_64")
    for t in [
        Tag("cp310", "cp310", "linux_x86_64"),
        Tag("cp310", "abi3", "manylinux2014_x86_64"),
        Tag("py3", "none", "any"),
        Tag("cp310", "none", "linux_x86_64"),
    ]:
        assert t in tags
    for t in [
        Tag("cp312", "cp312", "linux_x86_64"),
        Tag("cp310", "cp310", "linux_aarch64"),
        Tag("cp310", "cp310", "manylinux_2_39_x86_64"),
    ]:
        assert t not in tags


def _line(stack, pg, pinned, local=None):
    ranks = {t: i for i, t in enumerate(lines.target_tags(stack))}
    return lines.line_for(pg, pinned, ranks, local=local)


def test_line_is_same_tags_and_same_local_label(post1):
    pg = page(
        "torch",
        "2.11.0.post1+musa5.2.0",
        "2.11.0.post1+musa5.2.0@cp312-cp312-linux_x86_64",
        "2.11.0.post2+musa5.2.0@cp312-cp312-linux_x86_64",  # other python: another line
        "2.11.0.post1+musa5.2.1mp22",  # same tags, other MUSA family
        "2.11.0.post3+musa5.2.1mp22@cp310-cp310-linux_aarch64",  # other platform and family
        ("2.11.0.post4+musa5.2.0", {"yanked": "broken"}),  # yanked never counts as newer
        "2.12.0rc1+musa5.2.0",  # pre-release, pin is final
        "2.11.0.post2+musa5.2.0",
    )
    line = _line(post1, pg, "2.11.0.post1+musa5.2.0")
    assert line.kind == "wheel" and line.local == "musa5.2.0"
    assert line.tags == frozenset({Tag("cp310", "cp310", "linux_x86_64")})
    got = lines.versions_in_line(pg, line, allow_pre=False, keep=Version("2.11.0.post1+musa5.2.0"))
    assert [str(v) for v in got] == ["2.11.0.post2+musa5.2.0", "2.11.0.post1+musa5.2.0"]
    assert all("cp310-cp310-linux_x86_64" in f.filename for f in got.values())
    mp22 = _line(post1, pg, "2.11.0.post1+musa5.2.1mp22")
    assert [str(v) for v in lines.versions_in_line(pg, mp22, allow_pre=False)] == ["2.11.0.post1+musa5.2.1mp22"]


def test_pure_python_and_sdist_lines(post1):
    pg = page(
        "torchada", "0.1.83@py3-none-any", "0.1.90@py3-none-any", "0.1.91@sdist", "0.1.92@cp310-cp310-linux_x86_64"
    )
    line = _line(post1, pg, "0.1.83")
    assert line.describe() == "py3-none-any (no local label)"
    assert next(iter(lines.versions_in_line(pg, line, allow_pre=False))) == Version("0.1.90")
    sd = page("x", "1.0@sdist", "1.1@sdist", "1.2")
    sline = _line(post1, sd, "1.0")
    assert sline.kind == "sdist"
    assert [str(v) for v in lines.versions_in_line(sd, sline, allow_pre=False)] == ["1.1", "1.0"]


def test_missing_pin_falls_back_to_installable_wheels(post1):
    pg = page("triton", "3.3.0", "3.4.0@cp310-cp310-linux_aarch64")
    line = _line(post1, pg, "3.2.0")
    assert line.kind == "compatible"
    assert [str(v) for v in lines.versions_in_line(pg, line, allow_pre=False)] == ["3.3.0"]


def test_built_for_template_and_pattern():
    tpl = "{{ for.local }}torch{{ for.public }}"
    assert lines.render_built_for(tpl, "2.11.0.post2+musa5.2.0") == "musa5.2.0torch2.11.0.post2"
    rx = lines.built_for_pattern(tpl, "musa5.2.0")
    assert rx.match("musa5.2.0torch2.11.0.post1").group("public") == "2.11.0.post1"
    assert rx.match("musa5.2.1mp22torch2.11.0.post1") is None


def test_train_window_verdict():
    rep = newest.TrainReport(
        "torch",
        "newest",
        {"torch": "a", "torchaudio": "b"},
        {"torch": T0, "torchaudio": T0 + timedelta(minutes=1)},
        3600,
    )
    assert rep.spread == 60 and not rep.far_apart and "together" in rep.describe()
    late = newest.TrainReport(
        "torch", "newest", {"torch": "a", "torchaudio": "b"}, {"torch": T0, "torchaudio": T0 + timedelta(days=3)}, 3600
    )
    assert late.far_apart and "FAR APART" in late.describe()
    unknown = newest.TrainReport(
        "torch", "newest", {"torch": "a", "torchaudio": "b"}, {"torch": T0, "torchaudio": None}, 3600
    )
    assert unknown.spread is None and not unknown.far_apart and "unknown" in unknown.describe()


def _pages(**extra):
    pages = {
        "torch": page(
            "torch",
            "2.11.0.post1+musa5.2.0",
            "2.11.0.post2+musa5.2.0",
            "2.11.0.post3+musa5.2.0",
            "2.11.0.post4+musa5.2.1mp22",
        ),
        "torch_musa": page("torch_musa", "2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0", "2.11.0.post3+musa5.2.0"),
        "torchvision": page("torchvision", "0.26.0.post1+musa5.2.0", "0.26.0.post2+musa5.2.0"),
        "torchaudio": page("torchaudio", "2.11.0+musa5.2.0", "2.11.0.post2+musa5.2.0"),
        "deep_ep": page(
            "deep_ep",
            "1.1.0+musa5.2.0torch2.11.0.post1",
            "1.1.0+musa5.2.0torch2.11.0.post2",
            "1.1.0+musa5.2.0torch2.11.0.post3",
        ),
        "torchada": page("torchada", "0.1.83@py3-none-any", "0.1.90@py3-none-any", "0.1.91@py3-none-any"),
    }
    pages.update(extra)
    return pages


def test_bump_takes_the_newest_coherent_release(post1):
    cat = lines.Catalog(post1, _pages())
    plan = bump.plan_bump(post1, cat, new_name="next")
    moved = {m.package: m.after for m in plan.moves}
    # post3 exists for torch and torch_musa only, so the train stops at post2.
    assert moved == {
        "torch": "2.11.0.post2+musa5.2.0",
        "torch_musa": "2.11.0.post2+musa5.2.0",
        "torchvision": "0.26.0.post2+musa5.2.0",
        "torchaudio": "2.11.0.post2+musa5.2.0",
        "deep_ep": "1.1.0+musa5.2.0torch2.11.0.post2",
        "torchada": "0.1.91",
    }
    assert plan.ok
    assert any("2.11.0.post3+musa5.2.0 is not coherent: torchvision" in n for n in plan.notes)
    assert [m.package for m in plan.moves][:4] == ["torch", "torch_musa", "torchvision", "torchaudio"]


def test_bump_keeps_a_member_without_its_own_post_release(post1):
    cat = lines.Catalog(post1, _pages(torchaudio=page("torchaudio", "2.11.0+musa5.2.0")))
    plan = bump.plan_bump(post1, cat, new_name="next")
    moved = {m.package for m in plan.moves}
    assert "torchaudio" not in moved and "torch" in moved and plan.ok


def test_bump_reports_the_missing_built_for_build(post1):
    cat = lines.Catalog(post1, _pages(deep_ep=page("deep_ep", "1.1.0+musa5.2.0torch2.11.0.post1")))
    plan = bump.plan_bump(post1, cat, new_name="next")
    assert not plan.ok
    (problem,) = plan.problems
    assert problem.startswith("deep_ep: no build for torch 2.11.0.post2+musa5.2.0")
    assert "+musa5.2.0torch2.11.0.post2" in problem and "builds exist for torch 2.11.0.post1" in problem


def test_bump_unknown_train_is_a_user_error(post1):
    with pytest.raises(UserError, match="no train named cuda"):
        bump.plan_bump(post1, lines.Catalog(post1, _pages()), new_name="n", trains=["cuda"])


def test_rendered_bump_is_yaml_with_quoted_numbers(post1):
    plan = bump.BumpPlan(
        "post1",
        "next",
        [
            bump.Move("triton", "3.2.0", "3.3", "x"),
            bump.Move("torch", "2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0", "t"),
        ],
        [],
        [],
    )
    data = yaml.safe_load(bump.render_bump(post1, plan))
    assert data["inherits"] == "post1" and data["name"] == "next"
    assert data["packages"]["triton"] == {"version": "3.3"}
    assert data["description"] == "MUSA 5.2.0 release train, torch 2.11.0.post2"


def test_stale_tokens_for_post1_to_post2(post1, post2):
    tokens = {t.text: t for t in audit.stale_tokens(post1, post2)}
    assert set(tokens) == {
        "2.11.0.post1+musa5.2.0",
        "2.11.0.post1_musa5.2.0",
        "2.11.0.post1",
        "0.26.0.post1+musa5.2.0",
        "0.26.0.post1_musa5.2.0",
        "0.26.0.post1",
        "2.11.0+musa5.2.0",
        "2.11.0_musa5.2.0",
        "1.1.0+musa5.2.0torch2.11.0.post1",
        "1.1.0_musa5.2.0torch2.11.0.post1",
        "0.1.83",
    }
    assert tokens["0.1.83"].after == "0.1.90"


@pytest.mark.parametrize(
    "line,hit",
    [
        ("pip install torch==2.11.0.post1+musa5.2.0", True),
        ("vllm:v0.28.0-ph1-5.2.0-torch2.11.0.post1-latest", True),
        ("pinned to 2.11.0.post1.", True),
        ("torch 2.11.0.post10", False),
        ("12.11.0.post1", False),
        ("2.11.0.post1a", False),
    ],
)
def test_stale_token_boundaries(line, hit):
    tok = audit.StaleToken("2.11.0.post1", "torch", "2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0")
    import re

    assert bool(re.search(tok.pattern(), line)) is hit


def test_allow_list_parsing(tmp_path):
    f = tmp_path / "allow.txt"
    f.write_text("# comment\nstacks/post1.yaml\ntests/**  2.11.0.post1   # fixtures model post1\ndocs/history/\n")
    rules = audit.load_allow_list(f, "allow.txt")
    assert [(r.glob, r.token) for r in rules] == [
        ("stacks/post1.yaml", None),
        ("tests/**", "2.11.0.post1"),
        ("docs/history/", None),
    ]
    assert rules[1].matches("tests/unit/test_x.py", "2.11.0.post1")
    assert not rules[1].matches("tests/unit/test_x.py", "0.1.83")
    assert rules[2].matches("docs/history/2026/notes.md", "0.1.83")
    assert not rules[0].matches("stacks/post2.yaml", "0.1.83")
    f.write_text("a b c\n")
    with pytest.raises(UserError) as err:
        audit.load_allow_list(f, "allow.txt")
    assert err.value.line == 1


def test_write_bump_that_fails_lint_leaves_no_file(tmp_path):
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "stacks", root / "stacks")
    shutil.copytree(ROOT / "patches", root / "patches")
    loaded = load("post1", root=root)
    before = loaded.model.packages["torchvision"].version
    plan = bump.BumpPlan(
        "post1", "half", [bump.Move("torchvision", before, "0.26.0.post2+musa5.2.0", "x")], [], []
    )  # torchvision alone leaves its train
    with pytest.raises(UserError) as exc:
        bump.write_bump(loaded, plan)
    assert exc.value.exit_code == 1
    assert "would not pass lint, so it was not written" in exc.value.message and "torchvision" in exc.value.message
    assert exc.value.fix == "check the index for the builds named above"
    assert not (root / "stacks" / "half.yaml").exists()


@pytest.mark.parametrize("os_label", [*platforms.GLIBC, "someos1.0"])
def test_lock_and_newest_take_one_glibc_for_each_base_os(post1, os_label):
    """`lock` resolves for the base OS's glibc and `newest` reads wheel tags by it: the same table, the same
    newest manylinux tag; an OS the table does not name runs manylinux2014 (glibc 2.17) and nothing newer."""
    stack = post1.model_copy(update={"platform": post1.platform.model_copy(update={"os": os_label})})
    glibc = platforms.GLIBC.get(os_label, (2, 17))
    newest_tag = f"manylinux_2_{glibc[1]}_x86_64"
    assert Target.of(stack).platforms[0] == newest_tag
    assert lines.target_tags(stack)[0].platform == newest_tag
    newer = f"manylinux_2_{glibc[1] + 1}_x86_64"
    assert newer not in Target.of(stack).platforms
    assert all(t.platform != newer for t in lines.target_tags(stack))
