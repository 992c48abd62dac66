"""Index credentials given on the command line never come back out of a command that reads a stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.urls import credentials, redact, redact_text, split

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-canary-7781"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(REPO), *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ["show", "post2"],
        ["show", "post2", "--json"],
        ["render", "post2", "--no-sources", "--json", "--out", "{tmp}"],
        ["lint", "post2"],
    ],
)
def test_a_credential_in_an_index_url_is_never_printed(args, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = run(*args, "--set", f"indexes.mthreads.url=https://user:{SECRET}@vendor.example/simple")
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    if args[0] == "lint":
        assert proc.stdout == "post2: ok\n"  # the stack with the overridden URL loads and lints clean
    else:
        assert "vendor.example" in proc.stdout  # the URL is shown, without its credential
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


@pytest.mark.parametrize(
    "url",
    [
        f"ftp://user:{SECRET}@vendor.example/simple",  # wrong scheme: the error repeats the URL
        f"https://user:{SECRET}@vendor.example:99999/simple",  # bad port: no traceback either
    ],
)
def test_errors_about_a_url_do_not_repeat_its_credential(url):
    proc = run("show", "post2", "--set", f"indexes.mthreads.url={url}")
    assert proc.returncode == 2
    assert SECRET not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: --set indexes.mthreads.url=")


def test_url_helpers():
    assert redact(f"https://u:{SECRET}@h:8080/simple") == "https://***@h:8080/simple"
    assert credentials(f"https://u:{SECRET}@h/simple") == ("u", SECRET)
    assert split(f"https://u:{SECRET}@h:8080/simple")[0] == "https://h:8080/simple"
    assert (
        redact_text(f"--set a.url=http://u:{SECRET}@h/x and https://t@h2/y")
        == "--set a.url=http://***@h/x and https://***@h2/y"
    )
    assert redact("https://h:99999999/x") == "https://h:99999999/x"
    assert redact(f"https://u:{SECRET}@h:99999999/x") == "https://***@h:99999999/x"
