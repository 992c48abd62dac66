"""Fixtures every test may use: ``root``, a throw-away repository root.

A module says what its root holds by overriding ``root_spec`` (a tests.fixtures.stack_support.RootSpec); without
that, the root holds copies of the real stacks/post1.yaml and stacks/post2.yaml.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.stack_support import RootSpec, repo_root

pytest_plugins = [
    "tests.fixtures.run_share",  # what the run's processes share, and the run's end (docs/testing.md)
    "tests.fixtures.durations",  # the suite's time by module (STACKFORGE_DURATIONS, .ci/run)
]


@pytest.fixture
def root_spec() -> RootSpec:
    """What ``root`` holds; a module overrides this fixture."""
    return RootSpec()


@pytest.fixture
def root(tmp_path: Path, root_spec: RootSpec, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/repo`` holding what ``root_spec`` says, with its environment set for the test."""
    for name, value in root_spec.env.items():
        monkeypatch.setenv(name, value)
    return repo_root(tmp_path, root_spec)
