"""In-place source edits of an exported upstream tree (upstreams.<name>.edits), applied on the host."""

from __future__ import annotations

import pytest

from stackforge.builder.plan import edits
from stackforge.builder.plan.plan import image_labels
from stackforge.errors import UserError
from stackforge.stack.load import load
from tests.fixtures.stack_support import make_root

OLD = "from enum import Enum, StrEnum"


@pytest.fixture
def post2(tmp_path):
    return load("post2", make_root(tmp_path))


def tree(tmp_path, text: str):
    path = tmp_path / "tree" / "vllm_omni" / "diffusion" / "data.py"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return tmp_path / "tree", path


def test_the_fork_fix_applies_once_and_is_labelled(post2, tmp_path):
    root, path = tree(tmp_path, f"import os\n{OLD}\nfrom typing import Any\n")
    assert edits.apply(post2, "vllm_omni", root) == ["vllm_omni/diffusion/data.py"]
    assert path.read_text() == (
        "import os\nfrom enum import Enum\ntry:\n    from enum import StrEnum\nexcept ImportError:\n"
        "    from strenum import StrEnum\nfrom typing import Any\n"
    )
    label = image_labels(post2)["org.stackforge.edits.vllm_omni"]
    assert label == edits.digest(post2.model, "vllm_omni") and label.startswith("sha256:")
    assert "org.stackforge.edits.vllm" not in image_labels(post2)  # no edits declared there


@pytest.mark.parametrize(
    ("text", "seen"), [("from enum import Enum\n", "does not occur"), (OLD + "\n" + OLD, "occurs 2 times")]
)
def test_an_edit_that_does_not_match_exactly_once_names_the_key_and_line(post2, tmp_path, text, seen):
    root, path = tree(tmp_path, text)
    with pytest.raises(UserError) as err:
        edits.apply(post2, "vllm_omni", root)
    assert err.value.message.startswith(f"upstreams.vllm_omni.edits[0]: the text to replace {seen} in ")
    assert err.value.file == "stacks/post1.yaml" and err.value.line is not None
    assert path.read_text() == text  # nothing half-applied


def test_an_edit_of_a_missing_file_or_a_link_out_of_the_tree_is_refused(post2, tmp_path):
    root = tmp_path / "tree"
    (root / "vllm_omni" / "diffusion").mkdir(parents=True)
    with pytest.raises(UserError, match="is not a file of upstream vllm_omni"):
        edits.apply(post2, "vllm_omni", root)
    outside = tmp_path / "outside.py"
    outside.write_text(OLD)
    (root / "vllm_omni" / "diffusion" / "data.py").symlink_to(outside)
    with pytest.raises(UserError, match="is not a file of upstream vllm_omni"):
        edits.apply(post2, "vllm_omni", root)
    assert outside.read_text() == OLD


def test_edit_paths_are_relative_and_stay_in_the_tree(tmp_path):
    root = make_root(tmp_path)
    with pytest.raises(UserError, match="edits"):
        load("post2", root, ["upstreams.vllm_omni.edits=[{path: ../x.py, old: a, new: b}]"])
    with pytest.raises(UserError, match="edits"):
        load("post2", root, ["upstreams.vllm_omni.edits=[{path: x.py, old: '', new: b}]"])
