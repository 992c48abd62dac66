"""Index client parsing: PEP 691 JSON, PEP 503 HTML, PEP 700 fields, credentials and redaction."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from packaging.tags import Tag
from packaging.version import Version

from stackforge.clients.credentials import env_credentials
from stackforge.clients.index import (
    IndexFile,
    format_time,
    parse_html_page,
    parse_json_page,
    parse_time,
    redact,
    split_userinfo,
)

BASE = "https://index.example/simple/torch/"


def test_redact_hides_userinfo_and_keeps_the_rest():
    assert (
        redact("https://alice:s3cret@index.example:8443/simple/x/?q=1")
        == "https://***@index.example:8443/simple/x/?q=1"
    )
    assert redact("https://token@index.example/simple") == "https://***@index.example/simple"
    assert redact("https://index.example/simple") == "https://index.example/simple"


def test_split_userinfo_decodes_percent_escapes():
    url, cred = split_userinfo("http://al%40ice:p%3Aw@127.0.0.1:9/simple")
    assert url == "http://127.0.0.1:9/simple"
    assert cred == ("al@ice", "p:w")
    assert split_userinfo("http://127.0.0.1:9/simple") == ("http://127.0.0.1:9/simple", None)


def test_env_credentials_use_the_index_name():
    env = {"STACKFORGE_INDEX_MT_VENDOR_USERNAME": "bob", "STACKFORGE_INDEX_MT_VENDOR_PASSWORD": "pw"}
    assert env_credentials("mt-vendor", env) == ("bob", "pw")
    assert env_credentials("pypi", env) is None
    assert env_credentials("mt", {"STACKFORGE_INDEX_MT_PASSWORD": "tok"}) == ("", "tok")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2026-09-23T11:59:07.123456Z", datetime(2026, 9, 23, 11, 59, 7, 123456, tzinfo=timezone.utc)),
        ("2026-09-23T11:59:07Z", datetime(2026, 9, 23, 11, 59, 7, tzinfo=timezone.utc)),
        ("2026-09-23T19:59:07+08:00", datetime(2026, 9, 23, 11, 59, 7, tzinfo=timezone.utc)),
        ("2026-09-23T11:59:07.1234567891Z", datetime(2026, 9, 23, 11, 59, 7, 123456, tzinfo=timezone.utc)),
    ],
)
def test_parse_time_reads_pep700_timestamps(text, expected):
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", [None, "", "yesterday", "2026-13-45T99:00:00Z"])
def test_parse_time_never_invents_a_time(text):
    assert parse_time(text) is None
    assert format_time(parse_time(text)) == "unknown"
    assert format_time(parse_time(text), iso=True) is None


def test_json_page_keeps_what_the_index_declared():
    body = json.dumps(
        {
            "meta": {"api-version": "1.1"},
            "name": "torch",
            "versions": ["2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0"],
            "files": [
                {
                    "filename": "torch-2.11.0.post2+musa5.2.0-cp310-cp310-linux_x86_64.whl",
                    "url": "../../files/torch-2.11.0.post2%2Bmusa5.2.0-cp310-cp310-linux_x86_64.whl",
                    "hashes": {"SHA256": "AB" * 32},
                    "size": 74953528,
                    "upload-time": "2026-09-23T11:59:00.000000Z",
                    "yanked": False,
                    "requires-python": ">=3.10",
                },
                {
                    "filename": "torch-2.11.0.post1+musa5.2.0-cp310-cp310-linux_x86_64.whl",
                    "url": "https://cdn.example/t1.whl",
                    "hashes": {},
                    "yanked": "broken ABI",
                },
            ],
        }
    )
    page = parse_json_page(body, BASE, "torch")
    assert page.format == "json" and page.api_version == "1.1"
    assert page.versions == ["2.11.0.post1+musa5.2.0", "2.11.0.post2+musa5.2.0"]
    new, old = page.files
    assert new.url == "https://index.example/files/torch-2.11.0.post2%2Bmusa5.2.0-cp310-cp310-linux_x86_64.whl"
    assert new.sha256 == "ab" * 32
    assert new.size == 74953528
    assert new.upload_time == datetime(2026, 9, 23, 11, 59, tzinfo=timezone.utc)
    assert new.requires_python == ">=3.10"
    assert new.version == Version("2.11.0.post2+musa5.2.0")
    assert new.tags == frozenset({Tag("cp310", "cp310", "linux_x86_64")})
    assert new.kind == "wheel" and not new.is_yanked
    assert old.size is None and old.upload_time is None and old.sha256 is None
    assert old.is_yanked and old.yanked == "broken ABI"


def test_html_page_has_hashes_and_yanks_but_no_size_or_time():
    body = """<!DOCTYPE html><html><head><meta name="pypi:repository-version" content="1.0"></head><body>
    <a href="/files/torchada-0.1.90-py3-none-any.whl#sha256=CAFE" data-requires-python="&gt;=3.8">torchada-0.1.90-py3-none-any.whl</a>
    <a href="torchada-0.1.89.tar.gz" data-yanked="">torchada-0.1.89.tar.gz</a>
    <a href="torchada-0.1.88.tar.gz" data-yanked="bad &amp; broken">torchada-0.1.88.tar.gz</a>
    </body></html>"""
    page = parse_html_page(body, "https://pypi.example/simple/torchada/", "torchada")
    assert page.format == "html" and page.api_version == "1.0"
    whl, sd89, sd88 = page.files
    assert whl.url == "https://pypi.example/files/torchada-0.1.90-py3-none-any.whl"
    assert whl.hashes == {"sha256": "cafe"}
    assert whl.requires_python == ">=3.8"
    assert whl.size is None and whl.upload_time is None
    assert sd89.url == "https://pypi.example/simple/torchada/torchada-0.1.89.tar.gz"
    assert sd89.kind == "sdist" and sd89.yanked is True
    assert sd88.yanked == "bad & broken"


def test_index_file_json_redacts_urls():
    f = IndexFile("x-1.0-py3-none-any.whl", "https://u:pw@host/x-1.0-py3-none-any.whl", {"sha256": "00"}, 3)
    assert "pw" not in json.dumps(f.to_json())
    assert f.to_json()["upload_time"] is None


def test_unparseable_file_names_are_kept_as_other():
    f = IndexFile("README.txt", "https://host/README.txt")
    assert f.kind == "other" and f.version is None and f.tags == frozenset()
