"""An upstream is read by attribute, typed by ``clients.upstream.UpstreamPin``: the stack's own upstream and an
``UpstreamSpec`` both serve; an sdist is fetched only with its index URL, and a missing pin is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackforge.clients import upstream as up
from stackforge.errors import UserError
from stackforge.patches import ops
from stackforge.stack.load import load

REPO = Path(__file__).resolve().parents[2]


def test_the_stacks_upstream_and_a_spec_describe_the_same_pin():
    stack = load("example", REPO).model
    model = stack.upstreams["markupsafe"]
    assert up.describe(model) == "markupsafe==3.0.3 (sdist)"
    spec = up.UpstreamSpec(git="https://example.com/x.git", tag="v1", commit="a" * 40)
    assert up.describe(spec) == f"v1 ({'a' * 12})" and up.pinned_commit(spec) == "a" * 40


def test_the_stacks_sdist_gets_its_index_url_before_it_is_fetched():
    stack = load("example", REPO).model
    model = stack.upstreams["markupsafe"]
    with pytest.raises(UserError, match="markupsafe==3.0.3 is given without its index URL"):
        up.sdist_of(model)
    resolved = ops._resolve_sdist_index(stack, model)
    sdist = up.sdist_of(resolved)
    assert sdist == up.SdistSpec("https://pypi.org/simple", "markupsafe", "3.0.3", model.sdist.sha256)
    assert resolved.patches == "patches/markupsafe" and up.sdist_of(up.UpstreamSpec(git="g")) is None


def test_an_upstream_without_a_pinned_commit_is_named():
    with pytest.raises(UserError, match="the upstream https://example.com/x.git has no pinned commit") as err:
        up.pinned_commit(up.UpstreamSpec(git="https://example.com/x.git", tag="v1"))
    assert "upstreams.<name>.commit" in str(err.value.fix)


def test_field_is_gone():
    assert not hasattr(up, "field")
