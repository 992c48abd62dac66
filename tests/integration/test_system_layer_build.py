"""System layers built for real: a small stack whose ``musa`` layer installs from the stand-in MUSA apt
repository (tests/fixtures/apt_repo.py) on loopback, through the production CLI (``--network host``).

The layer resolves the runtime line 5.2 against a source that also serves 5.1 and the traps (2.4.10-1 next
to 2.4.1-1, 5.20.0-1 next to 5.2.0-1, a missing first candidate name), installs in one apt transaction,
writes its loader dirs and links, and records what it installed. ``install: auto`` keeps a base that
already has ``mcc``; ``never`` skips; a version line with no match fails naming the package and the key.
"""

from __future__ import annotations

import pytest

from stackforge.builder.records import evidence as evidence_dirs
from tests.fixtures import apt_repo, run_names
from tests.fixtures import musa_builds as mb
from tests.fixtures.stack_support import RootSpec, repo_root

pytestmark = pytest.mark.engine

TAG = run_names.namespaced("sysapt:musa{{ platform.musa_runtime }}")

STACK = """\
name: sysapt
platform: {{os: debian12, python: "3.11", musa: 5.2.0, musa_runtime: "5.2"}}
base: {{image: {base}}}
indexes: {{}}
packages: {{}}
gate: {{read_only: false, abi: false}}
tags: {{local: "{tag}"}}
targets: {{main: {{cmd: [bash]}}}}
system:
  os:
    packages: [libnuma1]
  musa:
    install: auto
    probe: mcc
    sources:
      musa: {{url: "{repo}", suite: {suite}, components: [main], trusted: true}}
    env: {{MUSA_HOME: /usr/local/musa}}
    path: [/usr/local/musa/bin]
    packages:
      - {{name: musa-toolkit, candidates: ["musa-toolkit-{{{{ platform.musa_runtime | dashed }}}}"]}}
      - {{name: musa-musart, candidates: ["musa-musart-{{{{ platform.musa_runtime | dashed }}}}"]}}
      - {{name: libmthreads-compute, line: "{{{{ platform.musa_runtime }}}}"}}
      - name: libmudnn3
        candidates: ["libmudnn3-musa-{{{{ platform.musa_runtime | dashed }}}}", "libmudnn3-musa-{{{{ platform.musa_runtime | major }}}}"]
      - {{name: libmthreads-mtml, line: "2.4.1"}}
      - {{name: mccl-s5000, line: "2.4.0"}}
    ld_dirs: [/usr/local/musa/lib, /usr/local/musa/mudnn/lib]
    symlinks:
      /usr/local/musa: "/usr/local/musa-{{{{ platform.musa }}}}"
"""

MUSA = [
    "musa-toolkit-5-2",
    "musa-musart-5-2",
    "libmthreads-compute",
    "libmudnn3-musa-5",
    "libmthreads-mtml",
    "mccl-s5000",
]


@pytest.fixture(scope="module")
def repo_url(tmp_path_factory):
    root = apt_repo.write_repository(apt_repo.musa_debs(), tmp_path_factory.mktemp("apt") / "repo")
    with apt_repo.serve(root) as url:
        yield url


@pytest.fixture(scope="module")
def root(tmp_path_factory, repo_url, base_image):
    """A repository with the sysapt stack alone (one for the module: the shared ``root`` is one per test)."""
    text = STACK.format(base=base_image, tag=TAG, repo=repo_url, suite=apt_repo.SUITE)
    return repo_root(tmp_path_factory.mktemp("sysroot"), RootSpec(stacks=(), stack_files={"sysapt.yaml": text}))


def build(root, out, *sets: str):
    args = ["--root", str(root), "build", "sysapt", "--network", "host", "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    return mb.stackforge(*args)


def run(ref: str, script: str) -> str:
    return mb.docker("run", "--rm", "--network=none", "--entrypoint", "sh", ref, "-c", script).stdout


@pytest.fixture(scope="module")
def happy(root, tmp_path_factory):
    out = tmp_path_factory.mktemp("happy")
    proc = build(root, out)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stdout.strip().splitlines()[-1], out


def test_the_line_and_the_traps_resolve_to_the_exact_versions(happy):
    ref, out = happy
    installed = dict(
        line.split(" ", 1) for line in run(ref, "dpkg-query -W -f '${Package} ${Version}\\n'").splitlines()
    )
    assert installed["musa-toolkit-5-2"] == "5.2.0-1"
    assert installed["musa-musart-5-2"] == "5.2.0-1"
    assert installed["libmthreads-compute"] == "5.2.0-1"  # not 5.20.0-1
    assert installed["libmthreads-mtml"] == "2.4.1-1"  # not 2.4.10-1
    assert installed["libmudnn3-musa-5"] == "3.0.0-1"  # the second candidate name
    assert installed["mccl-s5000"] == "2.4.0-1"
    assert "musa-toolkit-5-1" not in installed and "libmublas-5-1" not in installed
    assert "libnuma1" in installed


def test_the_layer_is_one_apt_transaction(happy):
    ref, _ = happy
    entries = run(ref, "cat /var/log/apt/history.log").split("\nStart-Date:")
    with_musa = [e for e in entries if "musa-toolkit-5-2" in e]
    assert len(with_musa) == 1
    install = next(line for line in with_musa[0].splitlines() if line.startswith("Install:"))
    assert all(f"{name}:amd64" in install for name in MUSA), install
    assert "--allow-downgrades --no-install-recommends" in with_musa[0]


def test_loader_dirs_links_env_and_venv(happy):
    ref, _ = happy
    out = run(
        ref,
        "cat /etc/ld.so.conf.d/musa.conf; readlink /usr/local/musa; ldconfig -p | grep libmusart; "
        "command -v mcc; echo MUSA_HOME=$MUSA_HOME; /opt/venv/bin/python -c 'import sys; print(sys.prefix)'",
    )
    lines = out.splitlines()
    assert lines[:3] == ["/usr/local/musa/lib", "/usr/local/musa/mudnn/lib", "/usr/local/musa-5.2.0"]
    assert "libmusart.so.5 (libc6,x86-64) => /usr/local/musa/lib/libmusart.so.5" in out
    assert "/usr/local/musa/bin/mcc" in lines and "MUSA_HOME=/usr/local/musa" in lines and "/opt/venv" in lines


def test_the_evidence_lists_resolutions_and_installed_packages(happy):
    ref, out = happy
    text = (evidence_dirs.newest(out / "evidence") / "system.txt").read_text()
    assert text == run(ref, "cat /stackforge/system/packages.txt")
    assert "resolved musa-toolkit: musa-toolkit-5-2" in text
    assert "resolved libmthreads-mtml: libmthreads-mtml=2.4.1-1" in text
    assert "resolved libmthreads-compute: libmthreads-compute=5.2.0-1" in text
    assert "resolved libmudnn3: libmudnn3-musa-5" in text
    assert "layer musa: install=auto: 6 package(s) in one apt transaction" in text
    assert "\ninstalled:\n" in text and "\nlibmthreads-mtml 2.4.1-1\n" in text


def test_auto_keeps_a_base_that_has_the_probe(happy, root, tmp_path_factory):
    ref, _ = happy
    out = tmp_path_factory.mktemp("kept")
    # Line 5.1 would install musa-toolkit-5-1: the base already has mcc, so nothing is installed. (A 5.1 runtime
    # line goes with a 5.1 toolkit, or lint refuses the stack; the kept base's /usr/local/musa stays as it is.)
    proc = build(
        root, out, f"base.image={ref}", "platform.musa_runtime=5.1", "platform.musa=5.1.0", "system.musa.symlinks={}"
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    kept = proc.stdout.strip().splitlines()[-1]
    text = (evidence_dirs.newest(out / "evidence") / "system.txt").read_text()
    assert "layer musa: install=auto: kept the base's stack (mcc is /usr/local/musa/bin/mcc)" in text
    assert "musa-toolkit-5-1" not in run(kept, "dpkg-query -W -f '${Package}\\n'")


def test_never_skips_the_layer(root, tmp_path_factory):
    out = tmp_path_factory.mktemp("never")
    proc = build(root, out, "system.musa.install=never")
    assert proc.returncode == 0, proc.stderr[-6000:]
    ref = proc.stdout.strip().splitlines()[-1]
    assert "layer musa: install=never: skipped" in (evidence_dirs.newest(out / "evidence") / "system.txt").read_text()
    assert not run(ref, "dpkg-query -W -f '${Package}\\n' | grep musa || true").strip()


def test_a_line_without_a_match_fails_naming_the_package_and_key(root, tmp_path_factory):
    out = tmp_path_factory.mktemp("bad")
    tag = run_names.image("sysapt", "musa9.9")
    proc = build(root, out, "platform.musa_runtime=9.9", "platform.musa=9.9.0", "system.musa.install=always")
    assert proc.returncode != 0
    assert "error: system.musa.packages.2 (libmthreads-compute): no version of line 9.9" in proc.stderr
    assert "system.musa.packages.0 (musa-toolkit): no package" in proc.stderr
    assert mb.image_id(tag) is None
    assert "error: system.musa.packages.2" in (evidence_dirs.newest(out / "evidence") / "system.txt").read_text()
