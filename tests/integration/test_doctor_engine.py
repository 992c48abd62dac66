"""`stackforge doctor` with the engine: its rows say what the real engine is and can do."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import musa_builds as mb

pytestmark = pytest.mark.engine


def test_the_engine_rows_name_the_versions_and_the_base_image_is_found_in_the_engine(base_image):
    proc = mb.stackforge(
        "doctor",
        "example",
        "--json",
        "--timeout",
        "5",
        "--set",
        f"base.image={base_image}",
        "--set",
        "indexes.pypi.url=http://127.0.0.1:9/simple",
    )
    rows = {r["check"]: r for r in json.loads(proc.stdout)}
    assert rows["engine"]["status"] == "ok" and rows["engine"]["detail"].startswith("server ")
    assert rows["buildx"]["status"] == "ok" and "BuildKit v" in rows["buildx"]["detail"]
    assert "SOURCE_DATE_EPOCH: " in rows["buildx"]["detail"]
    assert rows["base image"]["detail"] == "present in the engine"
    assert rows["index pypi"]["status"] == "fail" and proc.returncode == 1  # the one endpoint pointed nowhere
