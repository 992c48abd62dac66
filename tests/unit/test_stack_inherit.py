"""Multi-level inheritance (a → post2 → post1): merged values, and positions that name
the file that actually wrote each value."""

from __future__ import annotations

import json

import pytest

from stackforge.builder.context import prepare
from stackforge.stack.load import load
from stackforge.stack.yamlsrc import Pos
from tests.fixtures.stack_support import RootSpec, locate, parse_errors, run_cli

A = """\
name: a
inherits: post2
description: child of post2
platform:
  gpu_arch: [mp_22, mp_31]
packages:
  torchvision:
    version: 0.26.0.post1+musa5.2.0
  newpkg:
    version: 1.0.0
    index: pypi
gate:
  imports:
    - {module: vllm}
"""


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(stack_files={"a.yaml": A})


@pytest.fixture
def loaded(root):
    return load("a", root=root)


@pytest.fixture
def stack(loaded):
    return loaded.model


def at(root, file, line_has, value):
    return Pos(f"stacks/{file}", *locate(root / "stacks" / file, line_has, value))


def triple(pos: Pos) -> tuple:
    return pos.file, pos.line, pos.col


def test_chain_of_files(loaded, stack):
    assert loaded.files == ["stacks/post1.yaml", "stacks/post2.yaml", "stacks/a.yaml"]
    assert stack.name == "a"
    assert stack.inherits == "post2"


def test_values_merge_from_every_level(stack):
    assert stack.description == "child of post2"  # a
    assert stack.packages["torch"].version == "2.11.0.post2+musa5.2.0"  # post2
    assert stack.packages["torchvision"].version == "0.26.0.post1+musa5.2.0"  # a
    assert stack.packages["torchvision"].index == "mthreads"  # post1, below a's override
    assert stack.packages["mate-mubin"].gate == "metadata"  # post1
    assert stack.platform.gpu_arch == ["mp_22", "mp_31"]  # a list is replaced, not merged
    assert stack.platform.python == "3.10"  # post1
    assert [i.module for i in stack.gate.imports] == ["vllm"]


def test_package_order_is_the_first_declaration_with_new_packages_last(stack):
    names = list(stack.packages)
    assert names[:3] == ["torchada", "numpy", "torch"]
    assert names.index("torchvision") == 4
    assert names[-1] == "newpkg"


def test_positions_point_at_the_file_that_wrote_the_value(root, loaded):
    assert loaded.position(("description",)) == Pos("stacks/a.yaml", 3, 14)
    assert loaded.position(("packages", "torchvision", "version")) == Pos("stacks/a.yaml", 8, 14)
    assert loaded.position(("packages", "newpkg", "index")) == Pos("stacks/a.yaml", 11, 12)
    assert loaded.position(("platform", "gpu_arch", 1)) == Pos("stacks/a.yaml", 5, 21)
    assert loaded.position(("packages", "torch", "version")) == at(root, "post2.yaml", "  torch:", "2.11.0.post2")
    assert loaded.position(("packages", "torchada", "version")) == at(root, "post2.yaml", "  torchada:", "0.1.90")
    assert loaded.position(("packages", "torchvision", "index")) == at(root, "post1.yaml", "  torchvision:", "mthreads")
    assert loaded.position(("packages", "flash_mla", "version")) == at(root, "post1.yaml", "  flash_mla:", "0.2.7")
    assert loaded.position(("platform", "python")) == at(root, "post1.yaml", "  python:", '"3.10"')


def test_a_replaced_list_drops_the_parents_positions_below_it(root, loaded):
    # post1 lists five gate imports; a lists one. Item 1 no longer exists, so it must not point into post1.
    assert loaded.position(("gate", "imports", 0)) == Pos("stacks/a.yaml", 14, 7)
    assert loaded.position(("gate", "imports", 1)).file == "stacks/a.yaml"


def test_findings_point_at_each_level(root, capsys):
    b = (
        "name: b\ninherits: a\nrules:\n  minimums:\n"
        "    - {package: torchada, min: 0.1.95}\n    - {package: triton, min: 3.3.0}\n"
    )
    (root / "stacks" / "b.yaml").write_text(b, encoding="utf-8")
    rc, out, err = run_cli(capsys, root, "lint", "b", "--json")
    assert (rc, err) == (1, "")
    found = {  # (the plugin's image contract, which a moves away from, is test_contract.py's)
        (f["rule"], f["message"].split()[0]): (f["file"], f["line"], f["col"])
        for f in json.loads(out)["stacks"][0]["findings"]
        if f["rule"] != "contract"
    }
    assert found == {
        ("train", "torchvision"): ("stacks/a.yaml", 8, 14),
        ("minimum", "torchada"): triple(at(root, "post2.yaml", "  torchada:", "0.1.90")),
        ("minimum", "triton"): triple(at(root, "post1.yaml", "  triton:", "3.2.0")),
    }


def test_four_levels(root):
    (root / "stacks" / "z.yaml").write_text(
        "name: z\ninherits: a\npackages:\n  newpkg: {version: 1.0.1}\n", encoding="utf-8"
    )
    loaded = load("z", root=root)
    stack = loaded.model
    assert loaded.files == ["stacks/post1.yaml", "stacks/post2.yaml", "stacks/a.yaml", "stacks/z.yaml"]
    assert stack.packages["newpkg"].version == "1.0.1"
    assert stack.packages["newpkg"].index == "pypi"
    assert loaded.position(("packages", "newpkg", "version")) == Pos("stacks/z.yaml", 4, 21)
    assert loaded.position(("packages", "newpkg", "index")) == Pos("stacks/a.yaml", 11, 12)
    assert stack.description == "child of post2"  # inherited from a


def test_an_error_in_an_ancestor_names_the_ancestor(root, capsys):
    post1 = root / "stacks" / "post1.yaml"
    post1.write_text(post1.read_text(encoding="utf-8").replace('python: "3.10"', "python: 3.10", 1), encoding="utf-8")
    rc, out, err = run_cli(capsys, root, "show", "a")
    assert (rc, out) == (2, "")
    (error,) = parse_errors(err)
    line, col = locate(post1, "  python:", "3.10")
    assert (error["file"], error["line"], error["col"]) == ("stacks/post1.yaml", line, col)
    assert "3.10 was read as a number" in error["message"]


def test_an_error_in_the_middle_file_names_the_middle_file(root, capsys):
    (root / "stacks" / "m.yaml").write_text("name: m\ninherits: post2\nplatform:\n  archh: x86_64\n", encoding="utf-8")
    (root / "stacks" / "c.yaml").write_text("name: c\ninherits: m\n", encoding="utf-8")
    rc, _, err = run_cli(capsys, root, "show", "c")
    assert rc == 2
    assert err == "error: stacks/m.yaml:4:3: unknown key 'archh' in platform\n  fix: did you mean 'arch'?\n"


def test_set_overrides_apply_on_top_of_the_whole_chain(root):
    loaded = load("a", root=root, overrides=["packages.torchvision.version=0.26.0.post2+musa5.2.0"])
    stack = loaded.model
    assert stack.packages["torchvision"].version == "0.26.0.post2+musa5.2.0"
    assert loaded.position(("packages", "torchvision", "version")) == Pos(
        "--set packages.torchvision.version=0.26.0.post2+musa5.2.0"
    )
    assert [f for f in prepare.lint(loaded) if f.rule != "contract"] == []  # a's own gpu_arch, gate: test_contract


def test_show_lists_the_chain(root, capsys):
    rc, out, _ = run_cli(capsys, root, "show", "a")
    assert rc == 0
    assert "files:        stacks/post1.yaml → stacks/post2.yaml → stacks/a.yaml\n" in out


def test_diff_against_the_parent(root, capsys):
    rc, out, err = run_cli(capsys, root, "diff", "post2", "a", "--format", "json")
    assert (rc, err) == (0, "")
    d = json.loads(out)
    assert [(r["package"], r["before"], r["after"]) for r in d["changed"]] == [
        ("torchvision", "0.26.0.post2+musa5.2.0", "0.26.0.post1+musa5.2.0")
    ]
    assert [(r["package"], r["after"]) for r in d["added"]] == [("newpkg", "1.0.0")]
    assert d["removed"] == []
    assert [(r["package"], r["before"], r["after"]) for r in d["other"]] == [
        ("platform.gpu_arch", "mp_31", "mp_22, mp_31")
    ]
    rc, out, _ = run_cli(capsys, root, "diff", "a", "post2", "--format", "json")
    assert [(r["package"], r["before"], r["after"]) for r in json.loads(out)["removed"]] == [("newpkg", "1.0.0", "—")]


def test_a_document_read_earlier_is_taken_once_and_only_for_its_own_root_name_and_overrides(root):
    """``load(read=…)`` takes a document already read (the prefetch's) instead of reading the files again; one
    read for other overrides, another stack or another root, or one a load has taken, is read again."""
    from stackforge.stack import document

    url = "indexes.pypi.url=https://someone:s3cret@pypi.example/simple"
    doc = document.read(root.resolve(), "a", [url])
    taken = load("a", root=root, overrides=[url], read=doc)
    assert doc.used and taken.model.indexes["pypi"].url == "https://pypi.example/simple"
    assert taken.credentials["pypi"].auth == ("someone", "s3cret")
    # Taken once: the loader split the credential off its data, so a second load reads the files again.
    again = load("a", root=root, overrides=[url], read=doc)
    assert again.credentials["pypi"].auth == ("someone", "s3cret")
    for other in (document.read(root.resolve(), "a", []), document.read(root.resolve(), "post2", [url])):
        assert (
            load("a", root=root, overrides=[url], read=other).model.indexes["pypi"].url == "https://pypi.example/simple"
        )
        assert not other.used
    # The document's values are what is validated: an edit to an unused document for the same stack shows.
    doc = document.read(root.resolve(), "a", [])
    doc.data["description"] = "as read earlier"
    assert load("a", root=root, read=doc).model.description == "as read earlier"
