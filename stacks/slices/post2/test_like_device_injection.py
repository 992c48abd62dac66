"""Probe A of the post1 -> post2 record (shared/seeds/000_e1b4ed0a9c7daeaa.txt:178), on a MUSA device in the post2
image: torchada 0.1.90 keeps the *_like family on its input's device under a CPU device context (before 0.1.90 it
re-added them as out=-style factories, so torch.zeros_like(x) of a MUSA tensor returned a CPU tensor whose host
pointer kernels then took for a device address), and an explicit device="cpu" is still honoured.

The record: ctx_cpu_zero_like_is_musa=True, default_cpu_*_like_is_musa=True (all three),
explicit_cpu_still_cpu=True. Declared in stacks/post2.yaml (tests.probes) as a slice that needs a device.
"""

import pytest
import torchada  # noqa: F401  (importing it patches torch, as the image's own imports do)
import torch

LIKE = ("zeros_like", "ones_like", "rand_like")


@pytest.fixture
def musa():
    return torch.ones(8, device="musa")


def test_ctx_cpu_zeros_like_is_musa(musa):
    with torch.device("cpu"):
        assert torch.zeros_like(musa).device.type == "musa"


@pytest.mark.parametrize("name", LIKE)
def test_default_cpu_like_is_musa(musa, name):
    torch.set_default_device("cpu")
    try:
        assert getattr(torch, name)(musa).device.type == "musa"
    finally:
        torch.set_default_device(None)


def test_explicit_cpu_is_still_cpu(musa):
    assert torch.zeros_like(musa, device="cpu").device.type == "cpu"
