"""The test run's namespace check (tests/fixtures/run_names.py): what a docker command line creates, which of
those names are the run's own, and the shim that records the command lines."""

from __future__ import annotations

import subprocess

import pytest

from tests.fixtures import run_names as rn


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (
            ["buildx", "--builder", "b", "build", "--progress=plain", "--tag", "a/b:c", "-t", "d:e", "."],
            ["a/b:c", "d:e"],
        ),
        (["buildx", "build", "--tag=x/y:z", "--load", "."], ["x/y:z"]),
        (["build", "-f", "Dockerfile", "-t", "old:1", "."], ["old:1"]),
        (["tag", "src:1", "dst:2"], ["dst:2"]),
        (["image", "tag", "src:1", "dst:2"], ["dst:2"]),
        (["import", "-", "imported:1"], ["imported:1"]),
        (["image", "import", "-c", "CMD x", "-", "imported:2"], ["imported:2"]),
        (["commit", "-m", "msg", "ctr", "committed:1"], ["committed:1"]),
        (["run", "-d", "--name", "box", "-p", "127.0.0.1::80", "img"], ["box"]),
        (["container", "create", "--name=box2", "img"], ["box2"]),
        (["pull", "reg.example/x:1"], ["reg.example/x:1"]),
        (["--context", "default", "tag", "a", "b:1"], ["b:1"]),
        (["run", "--rm", "img", "--name", "inside"], []),  # an argument of the container's command
        (["image", "rm", "-f", "gone:1"], []),
        (["image", "inspect", "x"], []),
        (["push", "127.0.0.1:5000/x:1"], []),
    ],
)
def test_created_names(argv, names):
    assert rn.created(argv) == names


def test_only_names_outside_the_namespace_are_foreign():
    commands = [
        ["tag", "x", rn.image("example", "built")],
        ["run", "--name", rn.container("jev"), "img"],
        ["tag", "x", "127.0.0.1:41234/ns/example:1"],
        ["tag", "x", "stackforge/base:bookworm"],
        ["run", "--name", "stackforge-smoke-qwen3-8b-4242-0a1b2c", "img"],
        ["buildx", "build", "-t", "stackforge-mirror/toolchain:post2-vllm_rs-building-4242-0a1b2c", "."],
        ["tag", "s", "stackforge-mirror/toolchain:post2-vllm_rs-0123456789ab"],
        ["buildx", "build", "-t", "stackforge-test/example:built", "."],
        ["tag", "x", "vllm-musa:ubuntu22.04_py3.11"],
        ["tag", "y", "vllm-musa:ubuntu22.04_py3.11"],
        ["run", "--name", "stackforge-test-jev", "img"],
        ["tag", "x", "stackforge-mirror/toolchain:post2-vllm_rs-building"],
    ]
    assert rn.foreign(commands) == [
        "stackforge-test/example:built",
        "vllm-musa:ubuntu22.04_py3.11",
        "stackforge-test-jev",
        "stackforge-mirror/toolchain:post2-vllm_rs-building",
    ]
    assert rn.foreign(commands, shared=())[:1] == ["stackforge/base:bookworm"]


def test_stack_tag_puts_the_stacks_own_template_in_the_namespace():
    override = rn.stack_tag("example")
    assert override.startswith(f"tags.local={rn.NS}/stackforge-example:py{{{{ platform.python }}}}")


def test_the_shim_records_each_command_line_and_runs_the_real_cli(tmp_path):
    real = tmp_path / "real-docker"
    real.write_text('#!/bin/sh\necho "real: $*"\nexit 3\n')
    real.chmod(0o755)
    shim = rn.install_shim(str(real), tmp_path / "shim")
    first = subprocess.run([str(shim / "docker"), "tag", "a b", "c:1"], capture_output=True, text=True)
    second = subprocess.run([str(shim / "docker"), "image", "ls", ""], capture_output=True, text=True)
    assert (first.returncode, first.stdout) == (3, "real: tag a b c:1\n")  # exit status and output pass through
    assert second.returncode == 3
    assert rn.recorded(shim) == [["tag", "a b", "c:1"], ["image", "ls", ""]]
