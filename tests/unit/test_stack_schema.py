"""`stackforge schema`: a JSON Schema editors can use, that agrees with the loader."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from tests.fixtures.stack_support import REPO, run_cli


@pytest.fixture(scope="module")
def schema():
    from stackforge.stack.load import json_schema

    return json_schema()


def test_schema_command_prints_a_valid_json_schema(capsys):
    rc, out, err = run_cli(capsys, REPO, "schema")
    assert (rc, err) == (0, "")
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("name", ["post1", "post2"])
def test_schema_accepts_the_real_stacks(schema, name):
    data = yaml.safe_load((REPO / "stacks" / f"{name}.yaml").read_text(encoding="utf-8"))
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]
    assert errors == []


def test_schema_uses_the_file_spelling_of_aliased_keys(schema):
    # stacks write `for:` and `import:`, not the Python field names
    built_for = schema["$defs"]["BuiltFor"]["properties"]
    package = schema["$defs"]["Package"]["properties"]
    assert "for" in built_for and "for_" not in built_for
    assert "import" in package and "import_" not in package


def _post1():
    return yaml.safe_load((REPO / "stacks" / "post1.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "edit,expect",
    [
        (lambda d: d["platform"].__setitem__("pyhton", "3.10"), "'pyhton' was unexpected"),
        (lambda d: d.__setitem__("pakages", {}), "'pakages' was unexpected"),
        (lambda d: d["packages"]["torch"].__setitem__("verison", "2.11.0"), "'verison' was unexpected"),
        (lambda d: d["platform"].__setitem__("python", 3.10), "3.1 is not of type 'string'"),
        (lambda d: d["packages"]["mate"].__setitem__("gate", "prefixed"), "'prefixed' is not one of"),
        (lambda d: d["platform"].__setitem__("gpu_arch", "mp_31"), "'mp_31' is not of type 'array'"),
    ],
    ids=[
        "unknown-platform-key",
        "unknown-top-level-key",
        "unknown-package-key",
        "python-as-number",
        "gate-not-a-choice",
        "string-where-list",
    ],
)
def test_schema_rejects_what_the_loader_rejects(schema, edit, expect):
    data = _post1()
    edit(data)
    messages = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]
    assert any(expect in m for m in messages), messages


def test_schema_lets_a_child_state_only_what_it_changes(schema):
    child = yaml.safe_load((REPO / "stacks" / "post2.yaml").read_text(encoding="utf-8"))
    assert "platform" not in child and "tags" not in child
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(child)) == []
