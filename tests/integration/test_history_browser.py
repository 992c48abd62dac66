"""The history site in a real headless browser (Debian's Chromium): every page loads, and the index shows what a
person looks for — the newest night first, a failed row visibly red."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stackforge.flows import history
from tests.fixtures import png
from tests.fixtures.nights import Image, write_night

FAILED_BACKGROUND = (0xFF, 0xD7, 0xD5)  # tr.failed td in images/docs/history.css.j2


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is not installed: run scripts/engine-setup.sh (as root on Debian it installs it)")
    return found


def _browser(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _site(tmp_path: Path) -> Path:
    root = tmp_path / "nightly"
    ok = {"vllm": "0.11.0+musa", "torch": "2.7.1+musa.4.3.0"}
    write_night(root, "20261129", [Image("post2", "vllm-openai", "sha256:" + "a" * 64, ok)])
    write_night(
        root,
        "20261130",
        [
            Image("post2", "vllm-openai", "sha256:" + "b" * 64, {**ok, "vllm": "0.11.1+musa"}),
            Image("post1", "vllm-openai", None, failed_at="gate"),
        ],
    )
    index, _ = history.history(root, tmp_path / "site")
    return index


def test_every_page_loads_without_an_error(chromium, tmp_path):
    index = _site(tmp_path)
    pages = [index, *sorted((index.parent / "images").glob("*.html"))]
    assert len(pages) == 3
    for page in pages:
        proc = _browser(chromium, tmp_path / "profile", "--dump-dom", page.as_uri())
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "<title>" in proc.stdout and "</body>" in proc.stdout, page
        console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Failed to load resource" in line]
        assert console == [], page
        for href in re.findall(r'href="([^"#]+)', proc.stdout):  # every link in the site goes to a file that is there
            if not href.startswith("https://"):  # a commit or a CI run: a link out, never loaded with the page
                assert (page.parent / href).resolve().is_file(), (page, href)


def test_the_index_shows_the_newest_night_first_and_the_failed_row_in_red(chromium, tmp_path):
    index = _site(tmp_path)
    dom = _browser(chromium, tmp_path / "profile", "--dump-dom", index.as_uri()).stdout
    assert re.findall(r"<h3[^>]*>Night (\d+)", dom) == ["20261130", "20261129"]
    shot = tmp_path / "index.png"
    proc = _browser(chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900", index.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    red = png.count(shot, FAILED_BACKGROUND)
    assert red > 20_000, f"{red} pixels of the failed row's colour: the failed row is not visibly marked"
    calm = tmp_path / "calm"
    write_night(calm / "nightly", "20261201", [Image("post2", "vllm-openai", "sha256:" + "c" * 64, {"vllm": "1"})])
    clean, _ = history.history(calm / "nightly", calm / "site")
    _browser(
        chromium, tmp_path / "profile", f"--screenshot={calm / 'index.png'}", "--window-size=1280,900", clean.as_uri()
    )
    assert png.count(calm / "index.png", FAILED_BACKGROUND) == 0  # no failure, no red
