"""The DeepEP probe of the post1 -> post2 record (shared/seeds/000_e1b4ed0a9c7daeaa.txt:91-92), on a MUSA device in
the post2 image: deep_ep imports (after torch_musa, which maps libmusa_kernels.so as the image's own imports do)
and has its Buffer. The record: "installed and imported in the image: deep_ep 1.1.0+musa5.2.0torch2.11.0.post2,
Buffer present: True". Declared in stacks/post2.yaml (tests.probes) as a slice that needs a device.
"""

from importlib.metadata import version


def test_deep_ep_imports_with_its_buffer():
    import torch_musa  # noqa: F401
    import deep_ep

    assert version("deep_ep").startswith("1.1.0+musa")
    assert hasattr(deep_ep, "Buffer")
