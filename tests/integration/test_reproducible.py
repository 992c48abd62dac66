"""Two clean builds of one stack, from two clones made as two hosts would make them, publish one digest: the
second clone is checked out under umask 077 at another time (with its own copy of the templates and image scripts,
so they too carry that host's modes and times) and built and published under another time zone and locale.
`verify REF --rebuild`, run from a third clone made yet another way, rebuilds a published image from its record and
says it is identical, or names the first layer, file and field that differ."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from stackforge.builder.plan.render import SOURCE_IMAGES
from tests.fixtures import run_names
from tests.fixtures.hostcopy import copy_as_checkout, listing, seconds

pytestmark = [pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
DATE = "20261202"
INIT = "src/markupsafe/__init__.py"


LOCALE = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_TIME", "LC_COLLATE")


@dataclass(frozen=True)
class Host:
    """How a host makes its clone and runs stackforge: its umask, time zone, locale and checkout time (None: the
    files keep this checkout's times and the package's own templates are used)."""

    umask: int
    tz: str
    locale: dict[str, str]
    checked_out: int | None = None


FIRST = Host(0o022, "UTC", {"LC_ALL": "C.UTF-8"})
SECOND = Host(0o077, "Asia/Shanghai", {"LANG": "C", "LC_ALL": "C"}, checked_out=1546300800)  # 2019-01-01
THIRD = Host(0o027, "America/Los_Angeles", {}, checked_out=1893456000)  # 2030-01-01, ahead of the clock


def stackforge(root: Path, *args: str, host: Host = FIRST) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LOCALE}
    env.update(host.locale, TZ=host.tz, STACKFORGE_CACHE=str(REPO / "build" / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(root), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        umask=host.umask,
        timeout=1800,
    )


def clone(into: Path, host: Host = FIRST) -> Path:
    """The parts of a checkout a build reads; a host with a checkout time gets its own images/ too (a repository's
    own templates and image scripts are the ones it builds with)."""
    into.mkdir(parents=True)
    if host.checked_out is None:
        shutil.copytree(REPO / "stacks", into / "stacks")
        shutil.copytree(REPO / "patches", into / "patches")
        return into
    for part in ("stacks", "patches"):
        copy_as_checkout(REPO / part, into / part, umask=host.umask, mtime=host.checked_out)
    copy_as_checkout(SOURCE_IMAGES, into / "images", umask=host.umask, mtime=host.checked_out, ignore=["__pycache__"])
    return into


@pytest.fixture(scope="module")
def two_publishes(tmp_path_factory, base_image, registry):
    """The example stack built with --no-cache in two clones made as two hosts would, each published to its own
    repository."""
    tag = f"{run_names.NS}/example:repro-{uuid.uuid4().hex[:8]}"
    out = []
    for name, host in (("first", FIRST), ("second", SECOND)):
        root = clone(tmp_path_factory.mktemp(f"repro-{name}") / "some" / "where" / name, host)
        built = stackforge(root, "build", "example", "--no-cache", "--json", "--set", f"tags.local={tag}", host=host)
        assert built.returncode == 0, built.stderr[-3000:]
        repo = f"{registry}/{name}{uuid.uuid4().hex[:6]}"
        pub = stackforge(
            root,
            "publish",
            "example",
            "--registry",
            repo,
            "--date",
            DATE,
            "--json",
            "--set",
            f"tags.local={tag}",
            host=host,
        )
        assert pub.returncode == 0, pub.stderr[-3000:]
        out.append((root, json.loads(built.stdout), json.loads(pub.stdout)))
    yield out, tag
    subprocess.run(["docker", "image", "rm", tag], capture_output=True)


def test_two_clean_clones_publish_one_digest(two_publishes):
    (root_a, built_a, pub_a), (root_b, built_b, pub_b) = two_publishes[0]
    assert (root_b / "images" / "gate" / "preserve.py").stat().st_mode & 0o777 == 0o600  # made as that host would
    # What COPY takes of the two contexts besides the bytes: one mode rule, one time (the layer epoch).
    context_a, context_b = (r / "build" / "example" / "context" for r in (root_a, root_b))
    assert listing(context_b) == listing(context_a)
    epoch = re.search(r'"org\.stackforge\.epoch"="(\d+)"', (root_a / "build" / "example" / "Dockerfile").read_text())
    assert epoch and {t for _, t in seconds(listing(context_a))} == {int(epoch.group(1))}
    assert built_a["image_id"] != built_b["image_id"]  # the engine's images differ (build times) ...
    assert pub_a["digest"] == pub_b["digest"] and pub_a["image_id"] == pub_b["image_id"]  # ... the published do not
    assert pub_a["repository"] != pub_b["repository"]
    assert (pub_a["gated_image_id"], pub_b["gated_image_id"]) == (built_a["image_id"], built_b["image_id"])


def test_verify_rebuild_says_identical(two_publishes, tmp_path):
    _, _, pub = two_publishes[0][0]
    ref = f"{pub['repository']}:{pub['tag']}"
    third = clone(tmp_path / "third", THIRD)  # another umask, time zone, locale and checkout time
    proc = stackforge(third, "verify", ref, "--rebuild", host=THIRD)
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
