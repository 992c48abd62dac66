"""Hostile templates: a stack's tag, label, env and rule templates (and a repository's Dockerfile
template) render in a sandbox; an escape attempt is refused with exit 2, names the key and its
place, runs nothing (the canary file is never created) and writes no Dockerfile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from stackforge.builder.plan.render import SOURCE_IMAGES

REPO = Path(__file__).resolve().parents[2]
CANARY = "pwned"
# {c} is replaced by the canary's absolute path.
SYSTEM = "__init__.__globals__.os.system('touch {c}')"


def make_root(tmp_path: Path, stack: str | None = None, dockerfile: str | None = None) -> Path:
    """A repository root with the example stack, its patches and images/ (optionally a hostile
    stack file ``stacks/hostile.yaml`` or a hostile ``images/Dockerfile.j2``)."""
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    shutil.copy(REPO / "stacks" / "example.yaml", root / "stacks" / "example.yaml")
    shutil.copytree(REPO / "stacks" / "locks" / "example", root / "stacks" / "locks" / "example")
    shutil.copytree(REPO / "patches" / "markupsafe", root / "patches" / "markupsafe")
    shutil.copytree(SOURCE_IMAGES, root / "images", ignore=shutil.ignore_patterns("__pycache__"))
    if stack is not None:
        (root / "stacks" / "hostile.yaml").write_text(textwrap.dedent(stack), encoding="utf-8")
    if dockerfile is not None:
        (root / "images" / "Dockerfile.j2").write_text(dockerfile, encoding="utf-8")
    return root


def run(root: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )


@dataclass
class Case:
    id: str
    args: list[str]  # {c}: the canary path; the stack is 'example' unless a stack file is given
    key: str  # the key the message must name
    where: str = "--set"  # start of the error location
    stack: str | None = None
    dockerfile: str | None = None
    message: str = ""


def s(key: str, value: str) -> list[str]:
    return ["--set", f"{key}={value}"]


CASES = [
    Case(
        "cycler-globals-lint",
        ["lint", "example", *s("tags.local", "x:{{ cycler.%s }}" % SYSTEM)],
        "tags.local",
        message="private attribute '__globals__'",
    ),
    Case("joiner-globals-show", ["show", "example", *s("tags.local", "x:{{ joiner.%s }}" % SYSTEM)], "tags.local"),
    Case(
        "namespace-globals-tags", ["tags", "example", *s("tags.local", "x:{{ namespace.%s }}" % SYSTEM)], "tags.local"
    ),
    Case(
        "lipsum-globals-render",
        ["render", "example", "--no-sources", *s("tags.local", "x:{{ lipsum.__globals__['os'].system('touch {c}') }}")],
        "tags.local",
    ),
    Case(
        "class-mro-subclasses",
        ["lint", "example", *s("tags.local", "x:{{ platform.__class__.__mro__[1].__subclasses__() }}")],
        "tags.local",
        message="private attribute",
    ),
    Case(
        "getitem-dunder",
        ["show", "example", *s("tags.local", "x:{{ platform['__class__'] }}")],
        "tags.local",
        message="private attribute '__class__'",
    ),
    Case(
        "attr-filter",
        ["lint", "example", *s("tags.local", "x:{{ platform.os|attr('__class__') }}")],
        "tags.local",
        message="filter 'attr'",
    ),
    Case(
        "self-context", ["lint", "example", *s("tags.local", "x:{{ self._TemplateReference__context }}")], "tags.local"
    ),
    Case(
        "range-huge-loop",
        ["lint", "example", *s("tags.local", "x:{% for i in range(10**12) %}{% endfor %}y")],
        "tags.local",
        message="a loop",
    ),
    Case(
        "range-is-gone",
        ["lint", "example", *s("tags.local", "x:{{ range(10)|join }}")],
        "tags.local",
        message="'range' is undefined",
    ),
    Case("string-repeat", ["lint", "example", *s("tags.local", "x:{{ 'x' * 10**9 }}")], "tags.local", message="'*'"),
    Case(
        "percent-format",
        ["tags", "example", "--registry", "r.example.com/t", *s("tags.publish", "x:{{ '%0999999999d' % 1 }}")],
        "tags.publish",
        message="'%'",
    ),
    Case(
        "replace-growth",
        ["lint", "example", *s("tags.local", "x:{{ platform.python" + "|replace('', platform.os)" * 5 + " }}")],
        "tags.local",
        message="longer than",
    ),
    Case(
        "set-assignment",
        ["lint", "example", *s("tags.local", "{% set x = platform %}x:{{ x.os }}")],
        "tags.local",
        message="an assignment",
    ),
    Case(
        "include-file",
        ["lint", "example", *s("tags.local", "x:{% include '/etc/passwd' %}")],
        "tags.local",
        message="an include",
    ),
    Case("method-call", ["show", "example", *s("tags.local", "x:{{ platform.os.upper() }}")], "tags.local"),
    Case(
        "alias-globals",
        ["tags", "example", "--registry", "r.example.com/t", *s("tags.aliases", '["x:{{ cycler.%s }}"]' % SYSTEM)],
        "tags.aliases.0",
    ),
    Case(
        "label-globals",
        ["lint", "example", *s("labels", '{org.example.x: "{{ joiner.%s }}"}' % SYSTEM)],
        "labels.org.example.x",
    ),
    Case(
        "kernel-env-globals",
        ["render", "example", "--no-sources", *s("kernels.markupsafe.env.X", "{{ cycler.%s }}" % SYSTEM)],
        "kernels.markupsafe.env.X",
    ),
    Case(
        "built-for-globals",
        [
            "lint",
            "example",
            *s("rules.built_for", '[{package: idna, for: packaging, local: "{{ cycler.%s }}"}]' % SYSTEM),
        ],
        "rules.built_for.0.local",
    ),
    Case(
        "stack-file-tag",
        ["render", "hostile", "--no-sources"],
        "tags.local",
        where="stacks/hostile.yaml:5:",
        stack="""\
             name: hostile
             inherits: example
             indexes: {pypi: {lock: false}}
             tags:
               local: "x:{{ cycler.%s }}"
             """
        % SYSTEM.replace("'", "''"),
    ),
    Case(
        "stack-file-label",
        ["lint", "hostile"],
        "labels.org.example.x",
        where="stacks/hostile.yaml:4:",
        stack="""\
             name: hostile
             inherits: example
             labels:
               org.example.x: "{{ namespace.%s }}"
             """
        % SYSTEM,
    ),
    Case(
        "dockerfile-template-globals",
        ["render", "example", "--no-sources"],
        "images/Dockerfile.j2",
        where="images/Dockerfile.j2",
        dockerfile="FROM x\n{{ cycler.%s }}\n" % SYSTEM,
    ),
    Case(
        "dockerfile-template-class",
        ["render", "example", "--no-sources"],
        "images/Dockerfile.j2",
        where="images/Dockerfile.j2",
        dockerfile="FROM x\n{{ plan.__class__.__init__.__globals__ }}\n",
    ),
    Case(
        "dockerfile-template-repeat",
        ["render", "example", "--no-sources"],
        "images/Dockerfile.j2",
        where="images/Dockerfile.j2",
        dockerfile="FROM x\n{{ 'x' * 10**9 }}\n",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_template_is_refused(tmp_path, case):
    canary = tmp_path / CANARY
    root = make_root(
        tmp_path,
        case.stack.replace("{c}", str(canary)) if case.stack else None,
        case.dockerfile.replace("{c}", str(canary)) if case.dockerfile else None,
    )
    out = tmp_path / "out"
    args = [a.replace("{c}", str(canary)) for a in case.args]
    if args[0] == "render":
        args += ["--out", str(out)]
    proc = run(root, tmp_path, *args)
    assert not canary.exists(), "the template ran host code"
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    first = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert first.startswith(f"error: {case.where}"), proc.stderr
    assert case.key in proc.stderr, proc.stderr
    assert case.message in proc.stderr, proc.stderr
    assert "\n  fix: " in proc.stderr, proc.stderr
    assert not (out / "Dockerfile").exists(), "a Dockerfile was written"
    assert proc.stdout == "" or "ok" not in proc.stdout


def test_the_example_still_renders(tmp_path):
    """The sandbox keeps every template of the shipped stacks working (the baseline of the table above)."""
    root = make_root(tmp_path)
    proc = run(root, tmp_path, "render", "example", "--no-sources", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "out" / "Dockerfile").read_text(encoding="utf-8")
    assert '"org.opencontainers.image.description"="Example train — markupsafe' in text
    assert "\\u2014" not in text


@pytest.mark.parametrize("use", ["render_built_for", "built_for_pattern"])
def test_newest_and_bump_render_built_for_rules_in_the_sandbox(use, tmp_path, monkeypatch):
    """`newest` and `bump` read the built-for rules without linting first: the same sandbox applies."""
    from stackforge.errors import UserError
    from stackforge.freshness import lines

    monkeypatch.chdir(tmp_path)
    template = "{{ cycler.%s }}" % SYSTEM.format(c=tmp_path / CANARY)
    with pytest.raises(UserError) as exc:
        getattr(lines, use)(template, "2.11.0.post2+musa5.2.0" if use == "render_built_for" else "musa5.2.0")
    assert exc.value.message.startswith("rules.built_for: template refused")
    assert not (tmp_path / CANARY).exists()


@pytest.mark.parametrize("template", ["stackforge-example:v1-{{ date }}", "stackforge-example:v1-r{{ revision }}"])
def test_tags_and_publish_refuse_a_publish_template_without_date_and_revision_alike(tmp_path, template):
    """`tags --registry` prints no reference `publish` would then refuse: both make one check of the template."""
    root = make_root(tmp_path)
    bad = s("tags.publish", template)
    tags = run(root, tmp_path, "tags", "example", "--registry", "r.example.com/t", *bad)
    publish = run(root, tmp_path, "publish", "example", "--registry", "r.example.com/t", *bad)
    errors = []
    for proc in (tags, publish):
        assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr and proc.stdout == ""
        errors.append([line for line in proc.stderr.splitlines() if not line.startswith("note: ")])
    assert errors[0] == errors[1], errors
    head, fix = errors[0]
    assert head.startswith(f"error: --set tags.publish={template}: tags.publish: "), head
    assert "followed by the revision once" in head
    assert fix == "  fix: write the publish tag as …{{ date }}…{{ revision }}…"
    assert not (root / "build").exists()
