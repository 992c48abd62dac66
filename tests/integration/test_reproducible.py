"""Two clean builds of one stack, from two clones in different directories at different times, publish one digest;
`verify REF --rebuild` rebuilds a published image from its record and says it is identical, or names the first
layer, file and field that differ."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.fixtures import musa_builds, run_names

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20261202"
INIT = "src/markupsafe/__init__.py"


def stackforge(root: Path, *args: str) -> subprocess.CompletedProcess:
    return musa_builds.stackforge("--root", str(root), *args, env={"STACKFORGE_CACHE": str(REPO / "build" / "cache")})


def clone(into: Path) -> Path:
    into.mkdir(parents=True)
    shutil.copytree(REPO / "stacks", into / "stacks")
    shutil.copytree(REPO / "patches", into / "patches")
    return into


@pytest.fixture(scope="module")
def two_publishes(tmp_path_factory, base_image, registry):
    """The example stack built with --no-cache in two clones, each published to its own repository."""
    tag = f"{run_names.NS}/example:repro-{uuid.uuid4().hex[:8]}"
    out = []
    for name in ("first", "second"):
        root = clone(tmp_path_factory.mktemp(f"repro-{name}") / "some" / "where" / name)
        built = stackforge(root, "build", "example", "--no-cache", "--json", "--set", f"tags.local={tag}")
        assert built.returncode == 0, built.stderr[-3000:]
        repo = f"{registry}/{name}{uuid.uuid4().hex[:6]}"
        pub = stackforge(
            root, "publish", "example", "--registry", repo, "--date", DATE, "--json", "--set", f"tags.local={tag}"
        )
        assert pub.returncode == 0, pub.stderr[-3000:]
        out.append((root, json.loads(built.stdout), json.loads(pub.stdout)))
    yield out, tag
    subprocess.run(["docker", "image", "rm", tag], capture_output=True)


def test_two_clean_clones_publish_one_digest(two_publishes):
    (_, built_a, pub_a), (_, built_b, pub_b) = two_publishes[0]
    assert built_a["image_id"] != built_b["image_id"]  # the engine's images differ (build times) ...
    assert pub_a["digest"] == pub_b["digest"] and pub_a["image_id"] == pub_b["image_id"]  # ... the published do not
    assert pub_a["repository"] != pub_b["repository"]
    assert (pub_a["gated_image_id"], pub_b["gated_image_id"]) == (built_a["image_id"], built_b["image_id"])


def test_verify_rebuild_says_identical(two_publishes):
    root, _, pub = two_publishes[0][0]
    ref = f"{pub['repository']}:{pub['tag']}"
    proc = stackforge(root, "verify", ref, "--rebuild")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"PASS rebuild identical: config {pub['image_id']}" in proc.stdout
    assert "rebuild" in proc.stdout.splitlines()[-1]  # the summary names the check


def test_verify_rebuild_names_the_first_differing_layer_file_and_field(two_publishes, tmp_path):
    (root, built, pub), tag = two_publishes[0][0], two_publishes[1]
    # A checkout whose patch series is not the one the image was built from: one more patch, a comment line added
    # to markupsafe's __init__.py, which reaches the installed package.
    other = clone(tmp_path / "other")
    source = (root / "build" / "example" / "context" / "src" / "markupsafe" / INIT).read_text().splitlines(True)
    edited = ["# rebuilt from another series\n", *source]
    patch = "".join(difflib.unified_diff(source, edited, f"a/{INIT}", f"b/{INIT}"))
    (other / "patches" / "markupsafe" / "0002-Comment.patch").write_text(
        "From: t <t@example.invalid>\nSubject: comment\n\n" + patch
    )
    with open(other / "patches" / "markupsafe" / "series", "a") as fh:
        fh.write("0002-Comment.patch\n")
    before = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
    proc = stackforge(other, "verify", f"{pub['repository']}:{pub['tag']}", "--rebuild", "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = json.loads(proc.stdout)["lines"]
    layer = next(line for line in lines if line.startswith("FAIL rebuild layer"))
    assert "pip install --no-index --no-deps /stackforge/wheels/markupsafe" in layer, layer
    assert "/opt/venv/lib/python3.11/site-packages/markupsafe/__init__.py: content differs" in layer, layer
    assert any(line.startswith("FAIL rebuild config config.Labels.org.stackforge.") for line in lines), lines
    # The local tag the stack names is where it was.
    after = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
    assert after.stdout == before.stdout and built["tag"] == tag
