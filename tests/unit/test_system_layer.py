"""System layers (``system:``): schema, grammar refusals with file:line, the rendered stages, and the
in-image scripts (images/system/apt-resolve.sh against a fake ``apt-cache``, the mirror rewrite)."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.render import SOURCE_IMAGES, render_dockerfile
from stackforge.errors import UserError
from stackforge.stack.load import load
from tests.fixtures.stack_support import make_root, parse_errors, run_cli

REPO = Path(__file__).resolve().parents[2]
RESOLVE = SOURCE_IMAGES / "system" / "apt-resolve.sh"
LAYER = SOURCE_IMAGES / "system" / "apt-layer.sh"

SYSTEM = """\
system:
  os:
    mirror: {from: "http://archive.ubuntu.com/ubuntu/", to: "http://mirrors.aliyun.com/ubuntu/"}
    packages: [gcc-12, "python{{ platform.python }}-dev"]
    symlinks:
      /usr/lib/x86_64-linux-gnu/libmkl_core.so.2: /usr/lib/x86_64-linux-gnu/libmkl_core.so
  musa:
    install: auto
    probe: mcc
    sources:
      musa: {url: "https://dl.mthreads.com/repo/repository/ubuntu2204/", suite: jammy, trusted: true}
    env: {MUSA_HOME: /usr/local/musa}
    path: [/usr/local/musa/bin]
    packages:
      - {name: musa-toolkit, candidates: ["musa-toolkit-{{ platform.musa_runtime | dashed }}"]}
      - name: libmudnn3
        candidates: ["libmudnn3-musa-{{ platform.musa_runtime | dashed }}", "libmudnn3-musa-{{ platform.musa_runtime | major }}"]
      - {name: libmthreads-mtml, line: "2.4.1"}
      - {name: mccl-s5000, version: 2.4.0-1}
    ld_dirs: [/usr/local/musa/lib]
    symlinks:
      /usr/local/musa: "/usr/local/musa-{{ platform.musa }}"
"""


def _without_system(root: Path) -> Path:
    """The root's post1 without its system layers (the fork's), so a test stack's layers are its own."""
    path = root / "stacks" / "post1.yaml"
    text = path.read_text()
    start = text.index("\nsystem:\n") + 1
    end = start + re.search(r"\n(?=[a-z_]+:)", text[start:]).start() + 1
    path.write_text(text[:start] + text[end:])
    return root


def _root(tmp_path: Path, system: str = SYSTEM) -> Path:
    root = make_root(tmp_path, {"sys.yaml": "inherits: post1\nname: sys\n" + textwrap.dedent(system)})
    return _without_system(root)


@pytest.fixture
def stack(tmp_path):
    return load("sys", _root(tmp_path))


def test_layers_load_in_order_with_their_values(stack):
    assert list(stack.model.system) == ["os", "musa"]
    musa = stack.model.system["musa"]
    assert musa.install == "auto" and musa.probe == "mcc"
    assert [p.name for p in stack.model.system["os"].packages] == ["gcc-12", "python{{ platform.python }}-dev"]
    assert musa.packages[2].line == "2.4.1" and musa.packages[3].version == "2.4.0-1"


def test_a_stack_without_system_keeps_its_fingerprint_and_stages(tmp_path):
    plain = load("post1", _without_system(make_root(tmp_path)))
    assert plain.model.system is None
    text = render_dockerfile(make_plan(plain))
    assert "RUN python3 -m venv /opt/venv\n\nFROM base AS deps" in text and "system-" not in text


def test_spec_files_carry_rendered_and_checked_values(stack):
    stages = make_plan(stack).system
    assert [(s.stage, s.parent) for s in stages] == [("system-os", "base"), ("system-musa", "system-os")]
    os_spec, musa_spec = stages[0].spec.splitlines(), stages[1].spec.splitlines()
    assert "mirror http://archive.ubuntu.com/ubuntu/ http://mirrors.aliyun.com/ubuntu/" in os_spec
    assert "package system.os.packages.1|python3.10-dev|any|-|python3.10-dev" in os_spec
    assert musa_spec[:4] == [
        "layer musa",
        "install auto",
        "probe mcc",
        "source deb [trusted=yes] https://dl.mthreads.com/repo/repository/ubuntu2204/ jammy main",
    ]
    assert "package system.musa.packages.0|musa-toolkit|any|-|musa-toolkit-5-2" in musa_spec
    assert "package system.musa.packages.1|libmudnn3|any|-|libmudnn3-musa-5-2 libmudnn3-musa-5" in musa_spec
    assert "package system.musa.packages.2|libmthreads-mtml|line|2.4.1|libmthreads-mtml" in musa_spec
    assert "package system.musa.packages.3|mccl-s5000|exact|2.4.0-1|mccl-s5000" in musa_spec
    assert "link system.musa.symlinks./usr/local/musa|/usr/local/musa|/usr/local/musa-5.2.0" in musa_spec


def test_the_dockerfile_has_system_stages_between_base_and_the_venv(stack):
    text = render_dockerfile(make_plan(stack))
    order = [
        text.index(s)
        for s in (
            "AS base\n",
            "FROM base AS system-os\n",
            "FROM system-os AS system-musa\n",
            "FROM system-musa AS venv\nRUN python3 -m venv /opt/venv",
            "FROM venv AS deps\n",
        )
    ]
    assert order == sorted(order)
    assert text.count("RUN python3 -m venv") == 1
    stages = text.split("\nFROM venv AS deps\n")[0]  # the stack's layers (the omni target has its own)
    assert stages.count("--mount=type=cache,target=/var/cache/apt,id=stackforge-apt-cache,sharing=locked") == 2
    assert stages.count("--mount=type=cache,target=/var/lib/apt,id=stackforge-apt-lib,sharing=locked") == 2
    assert 'ENV MUSA_HOME="/usr/local/musa"\nENV PATH=/usr/local/musa/bin:$PATH\n' in text
    assert "sh /stackforge/system/apt-layer.sh /stackforge/system/musa.spec" in text
    assert "rm -rf /var/lib/apt" not in text


def test_signed_by_copies_the_key_and_names_it(tmp_path):
    root = _root(
        tmp_path,
        """\
        system:
          musa:
            sources:
              musa: {url: "https://example.com/apt", suite: jammy, signed_by: keys/musa.asc}
            packages: [musa-toolkit-5-2]
        """,
    )
    (root / "keys").mkdir()
    (root / "keys" / "musa.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    stage = make_plan(load("sys", root)).system[0]
    assert (
        "source deb [signed-by=/etc/apt/keyrings/stackforge-musa/musa.asc] https://example.com/apt jammy main"
        in stage.spec
    )
    assert stage.keys == {"system/keys/musa/musa.asc": str(root / "keys" / "musa.asc")}
    assert "COPY system/keys/musa/ /etc/apt/keyrings/stackforge-musa/" in render_dockerfile(
        make_plan(load("sys", root))
    )


@pytest.mark.parametrize(
    "value, key, problem",
    [
        ('{musa: {sources: {m: {url: "https://h/apt;id", suite: jammy}}}}', "system.musa.sources.m.url", "';'"),
        ('{musa: {sources: {m: {url: "https://h/apt", suite: "jam my"}}}}', "system.musa.sources.m.suite", "apt suite"),
        (
            '{musa: {sources: {m: {url: "https://h/a", suite: j, components: ["ma$in"]}}}}',
            "system.musa.sources.m.components.0",
            "apt component",
        ),
        ('{musa: {packages: ["Bad_Name"]}}', "system.musa.packages.0", "Debian package name"),
        ('{musa: {packages: [{name: x1, line: "5.2; rm"}]}}', "system.musa.packages.0.line", "Debian version"),
        ('{musa: {packages: [{name: x1, line: "5.2", version: 5.2.0-1}]}}', "system.musa.packages.0", "not both"),
        ("{musa: {ld_dirs: [/usr/local/../etc]}}", "system.musa.ld_dirs.0", "absolute path"),
        ("{musa: {ld_dirs: [usr/lib]}}", "system.musa.ld_dirs.0", "absolute path"),
        ('{musa: {symlinks: {/usr/local/musa: "../x"}}}', "system.musa.symlinks", "absolute path"),
        ("{musa: {install: auto}}", "system.musa", "needs a probe"),
        ('{musa: {install: auto, probe: "mcc;id"}}', "system.musa.probe", "command name"),
        ('{musa: {mirror: {from: "file:///x", to: "http://m/"}}}', "system.musa.mirror.from", "http"),
        ("{Musa: {}}", "system", "layer name"),
        ('{musa: {path: ["/usr/bin:/x"]}}', "system.musa.path.0", "absolute path"),
    ],
)
def test_bad_values_are_refused_on_load_naming_the_key(tmp_path, capsys, value, key, problem):
    rc, _, err = run_cli(capsys, make_root(tmp_path), "show", "post1", "--set", f"system={value}")
    assert rc == 2, err
    assert key in err and problem in err, err


def test_a_refusal_in_the_file_names_its_line(tmp_path, capsys):
    root = _root(tmp_path, SYSTEM.replace("suite: jammy", "suite: jam..my"))
    rc, _, err = run_cli(capsys, root, "show", "sys")
    assert rc == 2
    errors = parse_errors(err)
    line = next(
        n for n, text in enumerate((root / "stacks" / "sys.yaml").read_text().splitlines(), 1) if "jam..my" in text
    )
    assert any(e["file"].endswith("sys.yaml") and e["line"] == line and "suite" in e["message"] for e in errors), err


def test_a_template_that_renders_a_bad_name_is_refused_at_its_key(tmp_path):
    root = _root(
        tmp_path,
        SYSTEM.replace("musa-toolkit-{{ platform.musa_runtime | dashed }}", "musa toolkit {{ platform.musa_runtime }}"),
    )
    with pytest.raises(UserError) as exc:
        make_plan(load("sys", root))
    assert "system.musa.packages.0.candidates.0" in str(exc.value) and "Debian package name" in str(exc.value)
    assert exc.value.line is not None


def test_system_stage_names_are_reserved_for_targets(tmp_path, capsys):
    root = make_root(tmp_path)
    rc, _, err = run_cli(capsys, root, "show", "post1", "--set", "targets={system-x: {}}")
    assert rc == 2 and "reserved" in err
    rc, _, err = run_cli(capsys, root, "show", "post1", "--set", "targets={venv: {}}")
    assert rc == 2 and "reserved" in err


# --------------------------------------------------------------------------- the resolver script

MADISON = {
    "libmthreads-mtml": ["2.4.10-1", "2.4.1-1"],
    "libmthreads-compute": ["5.20.0-1", "5.2.0-1", "5.1.0-1"],
    "musa-toolkit-5-2": ["5.2.1", "5.2.0-1"],
    "libmudnn3-musa-5": ["3.0.0-1"],
    "mccl-s5000": ["1:2.4.0-1", "2.3.0-1"],
    "only-longer": ["2.4.1.3-1", "2.4.10-1"],
}


@pytest.fixture
def fake_apt(tmp_path):
    """A fake ``apt-cache`` on PATH answering ``madison`` and ``policy`` from MADISON."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    table = tmp_path / "madison.txt"
    table.write_text("".join(f"{n} {v}\n" for n, vs in MADISON.items() for v in vs))
    script = bindir / "apt-cache"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        cmd=$1 pkg=$2
        case "$cmd" in
          madison) awk -v p="$pkg" '$1 == p {{ printf " %s | %s | http://127.0.0.1/ s/main amd64 Packages\\n", $1, $2 }}' {table} ;;
          policy) awk -v p="$pkg" '$1 == p {{ print p ":"; exit }}' {table} ;;
        esac
        """)
    )
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def resolve(env, *lines: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(RESOLVE)], input="\n".join(lines) + "\n", env=env, capture_output=True, text=True)


def test_an_exact_version_beats_a_longer_one_with_the_same_prefix(fake_apt):
    proc = resolve(
        fake_apt,
        "k.0|libmthreads-mtml|line|2.4.1|libmthreads-mtml",
        "k.1|libmthreads-compute|line|5.2|libmthreads-compute",
        "k.2|musa-toolkit|line|5.2|musa-toolkit-5-2",
        "k.3|only-longer|line|2.4.1|only-longer",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "resolved libmthreads-mtml: libmthreads-mtml=2.4.1-1",
        "resolved libmthreads-compute: libmthreads-compute=5.2.0-1",  # never 5.20.0-1
        "resolved musa-toolkit: musa-toolkit-5-2=5.2.1",  # the line's newest: 5.2.1 over 5.2.0-1
        "resolved only-longer: only-longer=2.4.1.3-1",  # a longer version of the line, never 2.4.10
    ]


def test_exact_versions_and_epochs(fake_apt):
    proc = resolve(fake_apt, "k.0|mccl|exact|2.4.0-1|mccl-s5000", "k.1|mccl|line|2.4.0|mccl-s5000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["resolved mccl: mccl-s5000=1:2.4.0-1"] * 2


def test_candidates_are_tried_in_order(fake_apt):
    proc = resolve(
        fake_apt,
        "k.0|libmudnn3|any|-|libmudnn3-musa-5-2 libmudnn3-musa-5",
        "k.1|libmudnn3|line|3.0|libmudnn3-musa-5-2 libmudnn3-musa-5",
        "k.2|mtml|line|2.4.1|missing-name libmthreads-mtml",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "resolved libmudnn3: libmudnn3-musa-5",
        "resolved libmudnn3: libmudnn3-musa-5=3.0.0-1",
        "resolved mtml: libmthreads-mtml=2.4.1-1",
    ]


def test_no_match_names_the_key_and_the_logical_package(fake_apt):
    proc = resolve(
        fake_apt,
        "system.musa.packages.4|libmthreads-mtml|line|2.5|libmthreads-mtml",
        "system.musa.packages.5|libmthreads-compute|line|5.3|libmthreads-compute",
        "system.musa.packages.0|musa-toolkit|any|-|musa-toolkit-9-9",
        "system.musa.packages.1|mccl|exact|2.4.0|mccl-s5000",
    )
    assert proc.returncode == 1
    err = proc.stderr.splitlines()
    assert err[0] == (
        "error: system.musa.packages.4 (libmthreads-mtml): no version of line 2.5 in the apt sources; "
        "candidates: libmthreads-mtml; versions found: libmthreads-mtml (2.4.10-1 2.4.1-1)"
    )
    assert err[1].startswith("error: system.musa.packages.5 (libmthreads-compute): no version of line 5.3 ")
    assert err[2].startswith("error: system.musa.packages.0 (musa-toolkit): no package in the apt sources")
    assert err[3].startswith("error: system.musa.packages.1 (mccl): no version 2.4.0 ")
    assert proc.stdout == ""


def test_the_mirror_rewrite_replaces_the_url_prefix_literally(tmp_path):
    sources = tmp_path / "sources.list"
    sources.write_text(
        "deb http://archive.ubuntu.com/ubuntu/ jammy main\ndeb http://security.ubuntu.com/ubuntu/ jammy-security main\n"
    )
    subprocess.run(
        [
            "sh",
            str(LAYER),
            "--rewrite",
            "http://archive.ubuntu.com/ubuntu/",
            "http://mirrors.aliyun.com/ubuntu/",
            str(sources),
            str(tmp_path / "absent.list"),
        ],
        check=True,
    )
    assert sources.read_text() == (
        "deb http://mirrors.aliyun.com/ubuntu/ jammy main\ndeb http://security.ubuntu.com/ubuntu/ jammy-security main\n"
    )


def test_post1_declares_the_forks_apt_base_and_devel_stages(tmp_path):
    stack = load("post1", make_root(tmp_path))
    assert stack.model.base.image == "ubuntu:22.04"
    stages = make_plan(stack).system
    assert [(s.stage, s.install, s.packages) for s in stages] == [
        ("system-os", "always", 45),
        ("system-musa", "auto", 19),
    ]
    musa = stages[1].spec.splitlines()
    assert "source deb [trusted=yes] https://dl.mthreads.com/repo/repository/ubuntu2204/ jammy main" in musa
    # The runtime line derives the suffix; mtml and mccl are pinned by version line.
    assert any(line.endswith("|musa-toolkit-5-2") for line in musa), musa
    assert any("libmthreads-mtml" in line and "|line|2.4.1|" in line for line in musa), musa
