"""The SBOM document: valid CycloneDX 1.5, deterministic for one image, every distribution and package in it,
no credential in it, and read back as the scan's packages (Debian by source package)."""

from __future__ import annotations

import json

import pytest

from stackforge.builder.records import sbom
from stackforge.errors import UserError
from stackforge.osv import Ecosystem, Package
from tests.fixtures import hostile_files as hf

DPKG = (
    "libssl3\t3.0.11-1~deb12u1\tamd64\topenssl\t3.0.11-1~deb12u1\n"
    "openssl\t3.0.11-1~deb12u1\tamd64\t\t\n"  # a binary package built from the source of its own name
    "zlib1g\t1:1.2.13.dfsg-1\tamd64\tzlib\t1:1.2.13.dfsg-1\n"
    "garbage line\n"
)
DISTS = [
    {"name": "torch", "version": "2.11.0.post2+musa5.2.0", "index": "mthreads", "phase": "vendor", "sha256": "ab" * 32},
    {"name": "Jinja2", "version": "3.1.4", "index": "https://user:s3cret@pypi.example/simple", "phase": "public"},
    {"name": "pip", "version": "23.0.1", "index": None, "phase": None, "sha256": None},
]


def make(image_id: str = "sha256:" + "1" * 64) -> str:
    return sbom.document("vllm-openai:post2", image_id, "2026-09-29T10:15:30.123456789Z", DISTS, sbom.parse_dpkg(DPKG))


def test_dpkg_lines_parse_with_their_source():
    debs = sbom.parse_dpkg(DPKG)
    assert [(d.name, d.source, d.source_version) for d in debs] == [
        ("libssl3", "openssl", "3.0.11-1~deb12u1"),
        ("openssl", "openssl", "3.0.11-1~deb12u1"),
        ("zlib1g", "zlib", "1:1.2.13.dfsg-1"),
    ]


def test_the_document_is_cyclonedx_and_lists_everything():
    doc = json.loads(make())
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    assert doc["metadata"]["timestamp"].startswith("2026-09-29T10:15:30")
    assert doc["metadata"]["component"]["version"] == "sha256:" + "1" * 64
    purls = sorted(c["purl"] for c in doc["components"])
    assert "pkg:pypi/torch@2.11.0.post2%2Bmusa5.2.0" in purls and "pkg:pypi/jinja2@3.1.4" in purls
    assert any(p.startswith("pkg:deb/debian/libssl3@3.0.11-1~deb12u1?") for p in purls)
    assert len(purls) == 6
    torch = next(c for c in doc["components"] if c["name"] == "torch")
    assert torch["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    assert {"name": "stackforge:index", "value": "mthreads"} in torch["properties"]
    assert "s3cret" not in json.dumps(doc)


def test_the_dependency_graph_names_every_component_under_the_image():
    doc = json.loads(make())
    graph = {d["ref"]: d.get("dependsOn", []) for d in doc["dependencies"]}
    refs = sorted(c["bom-ref"] for c in doc["components"])
    assert sorted(graph["image"]) == refs
    assert all(graph[ref] == [] for ref in refs)


def test_the_validator_holds_the_documents_to_the_schema():
    validator = sbom._validator()
    doc = json.loads(make())
    assert next(validator.iter_errors(doc), None) is None
    twice = dict(doc, components=[*doc["components"], doc["components"][0]])
    assert "not unique" in next(validator.iter_errors(twice)).message
    assert next(validator.iter_errors(dict(doc, specVersion=1.5)), None) is not None
    assert next(validator.iter_errors(dict(doc, serialNumber="not-a-urn")), None) is not None


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([{"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}], False),  # objects equal whatever their key order
        ([1, 1.0], False),  # JSON Schema: the same number
        ([True, 1], True),  # JSON Schema: a boolean is not a number
        ([[1, 2], [2, 1]], True),  # arrays in order
        ([None, False, 0, ""], True),
        ([{"a": None}, {"a": False}], True),
    ],
)
def test_unique_items_follows_json_schema_equality(items, unique):
    validator = sbom._validator()
    errors = list(sbom._unique_items(validator, True, items, {}))
    assert (not errors) is unique


def test_the_same_image_gives_the_same_bytes_and_another_image_another_serial():
    assert make() == make()
    assert json.loads(make("sha256:" + "2" * 64))["serialNumber"] != json.loads(make())["serialNumber"]


def test_packages_read_back_by_source_for_debian():
    assert sbom.packages(make()) == [
        Package("Debian", "openssl", "3.0.11-1~deb12u1"),
        Package("Debian", "zlib", "1:1.2.13.dfsg-1"),
        Package("PyPI", "Jinja2", "3.1.4"),
        Package("PyPI", "pip", "23.0.1"),
        Package("PyPI", "torch", "2.11.0.post2+musa5.2.0"),
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{}", "CycloneDX SBOM: bomFormat: Field required"),
        ("[]", "CycloneDX SBOM: (the document): Input should be a valid dictionary"),
        ("not json", "CycloneDX SBOM is not JSON"),
        (
            json.dumps({"bomFormat": "SPDX", "specVersion": "1.5", "components": []}),
            "CycloneDX SBOM: bomFormat: Input should be 'CycloneDX'",
        ),
        (
            json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.5", "components": {"name": "x"}}),
            "components: Input should be a valid list",
        ),
        (
            json.dumps(
                {"bomFormat": "CycloneDX", "specVersion": "1.5", "components": [{"name": "pip", "version": 23}]}
            ),
            "components[0].version: Input should be a valid string",
        ),
        (
            json.dumps(
                {
                    "bomFormat": "CycloneDX",
                    "specVersion": "1.5",
                    "components": [{"name": "a", "version": "1", "properties": "x"}],
                }
            ),
            "components[0].properties",
        ),
        ("[" * 100_000 + "]" * 100_000, "nests 100000 levels deep"),
        (b'{"bomFormat": "Cyclone\xff"}', "not UTF-8"),
    ],
)
def test_what_is_not_an_sbom_is_refused_naming_the_field(text, said):
    with pytest.raises(UserError) as err:
        sbom.packages(sbom.read(text, source="the SBOM attached to r/x:t"))
    assert said in err.value.message and err.value.render().startswith("error: the SBOM attached to r/x:t: ")


@pytest.mark.parametrize("maker", ["fifo", "zero_link", "deep_json", "not_utf8"])
def test_an_sbom_file_that_is_no_file_is_refused_at_once(tmp_path, maker):
    path = hf.SPECIALS[maker](tmp_path / "sbom.json")
    with pytest.raises(UserError) as err:
        hf.within(10, sbom.load, path)
    assert str(err.value.file) == str(path)


def test_the_release_is_in_the_document_and_read_back():
    """The image's os-release rides in the metadata; without it, Debian's base-files tells the release."""
    debs = sbom.parse_dpkg(DPKG + "base-files\t12.4+deb12u5\tamd64\t\t\n")
    text = sbom.document("i", "sha256:" + "1" * 64, None, DISTS, debs, {"ID": "ubuntu", "VERSION_ID": "22.04"})
    doc = json.loads(text)
    assert {"name": "stackforge:os:id", "value": "ubuntu"} in doc["metadata"]["properties"]
    assert next(sbom._validator().iter_errors(doc), None) is None
    bom = sbom.read(text, source="x")
    assert sbom.distribution(bom) == Ecosystem("Ubuntu", "22.04")
    assert {p.ecosystem for p in sbom.packages(bom)} == {"PyPI", "Ubuntu:22.04"}
    plain = sbom.read(sbom.document("i", "sha256:" + "1" * 64, None, DISTS, debs), source="x")
    assert sbom.distribution(plain) == Ecosystem("Debian", "12")
    assert Package("Debian:12", "openssl", "3.0.11-1~deb12u1") in sbom.packages(plain)
    jammy = sbom.parse_dpkg("base-files\t12ubuntu4.7\tamd64\t\t\n")
    bare = sbom.read(sbom.document("i", "sha256:" + "1" * 64, None, [], jammy), source="x")
    assert sbom.distribution(bare) == Ecosystem("Ubuntu")  # Ubuntu's base-files does not name its release


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n',
            {"ID": "debian", "VERSION_ID": "12"},
        ),
        ("ID=ubuntu\nVERSION_ID='22.04'\n", {"ID": "ubuntu", "VERSION_ID": "22.04"}),
        ("ID=\x1b[2Jubuntu\nVERSION_ID=22.04 ; rm -rf /\n", {}),
    ],
)
def test_os_release_keeps_plain_words_only(text, want):
    assert sbom.parse_os_release(text) == want


def test_warm_imports_the_validator_in_the_background():
    """A fresh process: after warm()'s thread ends, the schema validator is imported and document() is not
    the one paying for it."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from stackforge.builder.records import sbom\n"
        "assert 'cyclonedx.validation.json' not in sys.modules\n"
        "t = sbom.warm()\n"
        "assert t.daemon\n"
        "t.join(60)\n"
        "print('cyclonedx.validation.json' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
