"""The Python installers stackforge runs on the host: uv resolves a public index's lock (``stackforge lock``),
pip downloads a mirror's files (``stackforge mirror``). Each runs with none of this host's ``UV_*``, ``PIP_*`` or
``NETRC`` settings, and an index credential reaches it only through files in a private directory, never on
the command line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from stackforge import extras
from stackforge.clients import credentials
from stackforge.clients import proc as bounded
from stackforge.errors import UserError
from stackforge.urls import Credential

PIP_MIN = (23, 0)  # --report format 1 and --dry-run


UV_MIN = (0, 13)  # pylock.toml output, --python-platform <arch>-manylinux_2_X


def check_pip() -> None:
    """The host's pip can download for another target (``stackforge mirror``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("pip")
    except PackageNotFoundError:
        have = None
    parts = tuple(int(p) for p in re.findall(r"\d+", have or "")[:2])
    if have is None or parts < PIP_MIN:
        found = f"pip {have}" if have else "no pip"
        raise UserError(
            f"`stackforge mirror` downloads with pip and found {found} for {sys.executable}",
            fix=f"run: {sys.executable} -m pip install 'pip>={PIP_MIN[0]}.{PIP_MIN[1]}' "
            "(or: python -m ensurepip --upgrade)",
        )


def find_uv() -> str:
    """The uv binary `stackforge lock` resolves with: the ``uv`` package's (the ``lock`` extra:
    ``stackforge[lock]``), else ``uv`` on PATH; it must be at least :data:`UV_MIN`."""
    path: str | None = None
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found,unused-ignore]

        path = find_uv_bin()
    except (ImportError, FileNotFoundError):
        path = shutil.which("uv")
    want = f"uv>={UV_MIN[0]}.{UV_MIN[1]}"
    fix = (
        f"install the lock extra: {extras.install_hint('lock')}; a developer's `make venv` installs it "
        f"(it brings {want})"
    )
    if path is None:
        raise UserError(
            "`stackforge lock` resolves with uv's resolver (for the stack's Python and platform), which the "
            f"operator's install of stackforge leaves out: no uv for {sys.executable} nor on PATH",
            fix=fix,
        )
    try:
        said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        said = ""
    have = tuple(int(p) for p in re.findall(r"\d+", said)[:2])
    if have < UV_MIN:
        raise UserError(
            f"`stackforge lock` needs {want} and found {said.strip() or 'no working uv'} at {path}", fix=fix
        )
    return path


def uv_env(tmp: Path, url: str, credential: Credential | None, ca_bundle: Path | None, cache: Path) -> dict[str, str]:
    """uv's environment: none of this host's UV_*, PIP_* or NETRC settings; the index (``UV_DEFAULT_INDEX``,
    holding a query credential when there is one) and a user/password credential (a netrc file in the private
    directory ``tmp``) never on the command line; the workspace's CA bundle and cache."""

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_")) and k != "NETRC"}
    env.update(
        {
            "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_CACHE_DIR": str(cache),
            "UV_NO_PROGRESS": "1",
            "UV_DEFAULT_INDEX": url,
        }
    )
    if credential is not None:
        text = credentials.netrc_entries([(url, credential)])
        if text:
            env["NETRC"] = str(credentials.write_secret(tmp / "netrc", text))
        if credential.query:
            env["UV_DEFAULT_INDEX"] = credential.with_query(url)
    if ca_bundle:
        env["SSL_CERT_FILE"] = str(ca_bundle)
    return env


def pip_env(tmp: Path, url: str, credential, ca_bundle: Path | None) -> tuple[dict[str, str], list[str]]:
    """pip's environment for ``stackforge mirror`` (no PIP_* or NETRC of this host; the credential through files
    in ``tmp``) and its index arguments."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "NETRC"}
    env.update(pip_credentials(tmp, url, credential))
    if ca_bundle:
        env["PIP_CERT"] = str(ca_bundle)
    index_args = [] if credential is not None and credential.query else ["--index-url", url]
    return env, index_args


def pip_credentials(tmp: Path, url: str, credential) -> dict[str, str]:
    """Environment that gives pip the index credential through files in the private directory ``tmp``
    (never on the command line, never in the lock): a netrc (``NETRC``) for user/password, and a pip
    configuration file holding the index URL when the credential has query parameters."""
    env = {"PIP_CONFIG_FILE": os.devnull}
    if credential is None:
        return env
    text = credentials.netrc_entries([(url, credential)])
    if text:
        env["NETRC"] = str(credentials.write_secret(tmp / "netrc", text))
    if credential.query:
        conf = credentials.write_secret(tmp / "pip.conf", f"[global]\nindex-url = {credential.with_query(url)}\n")
        env["PIP_CONFIG_FILE"] = str(conf)
    return env


# pip download with its marker environment replaced by the target's (argv[1] is the environment as JSON):
# ``pip download`` has no option for the markers of another interpreter. `stackforge lock` resolves with uv
# (builder/plan/resolve.py) and needs no such hook; the mirror still downloads with pip.
PIP_SHIM = """import json, runpy, sys
env = json.loads(sys.argv.pop(1))
from pip._vendor.packaging import markers
host = markers.default_environment
markers.default_environment = lambda: {**host(), **env}
sys.argv[0] = "pip"
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


#: how long one resolution or download run may take (an index that stops answering is given up on)
RESOLVER_SECONDS = 3600.0


def run_uv(uv: str, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``uv ARGS`` in ``cwd`` with ``env`` (from :func:`uv_env`); its output captured, a failure not raised."""
    return bounded.completed([uv, *args], timeout=RESOLVER_SECONDS, env=env, cwd=cwd)


def pip_download(
    args: list[str], markers: dict[str, str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess:
    """``pip download ARGS`` for the target whose environment markers are ``markers`` (through :data:`PIP_SHIM`),
    with ``env`` (from :func:`pip_env`); its output captured, a failure not raised."""
    cmd = [sys.executable, "-c", PIP_SHIM, json.dumps(markers), "download", *args]
    return bounded.completed(cmd, timeout=RESOLVER_SECONDS, env=env, cwd=cwd)
