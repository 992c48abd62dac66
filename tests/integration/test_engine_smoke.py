"""The engine end to end: cache and secret mounts, log streaming, the CA bundle (as a secret and as a bind mount of
a named context), a push."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import urllib.request
from pathlib import Path

import pytest

from stackforge.builder.plan import cabundle
from stackforge.clients.engine import Engine
from tests.fixtures import run_names

pytestmark = pytest.mark.engine

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _write(dirpath: Path, text: str) -> Path:
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "Dockerfile").write_text(text, encoding="utf-8")
    return dirpath / "Dockerfile"


@pytest.fixture
def tag(engine: Engine, request):
    ref = f"{run_names.NS}/{request.node.name.lower().replace('_', '-')[:60]}:{secrets.token_hex(4)}"
    yield ref
    engine.remove_image(ref, force=True)


def test_cache_and_secret_mounts_keep_the_secret_out_of_the_image(engine, base_image, tag, tmp_path):
    token = "tok-" + secrets.token_hex(16)
    secret_file = tmp_path / "tok"
    secret_file.write_text(token, encoding="utf-8")
    ctx = tmp_path / "ctx"
    _write(
        ctx,
        f"""FROM {base_image}
RUN --mount=type=cache,target=/root/.cache/x echo cached > /root/.cache/x/probe && cat /root/.cache/x/probe
RUN --mount=type=secret,id=tok echo "secret-bytes=$(wc -c < /run/secrets/tok)" && echo built > /built
""",
    )
    streamed: list[str] = []
    log_file = tmp_path / "build.log"
    rc, log = engine.build(
        ctx,
        ctx / "Dockerfile",
        tags=[tag],
        secrets=[("tok", secret_file)],
        no_cache=True,
        on_line=streamed.append,
        log_file=log_file,
    )
    assert rc == 0, log
    # the secret was mounted for the RUN step that asked for it ...
    assert f"secret-bytes={len(token)}" in log
    # ... and every output line went to the callback and to the log file as well.
    assert streamed and "\n".join(streamed) + "\n" == log
    assert log_file.read_text(encoding="utf-8").endswith(log)
    assert engine.image_exists(tag)
    assert engine.image_id(tag).startswith("sha256:")
    history = engine.history(tag)
    assert "secret-bytes=" in history  # the history is really the one of this build
    assert token not in history
    # nothing of the secret in the filesystem, and the cache mount did not become a layer
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            tag,
            "sh",
            "-c",
            "cat /built; ls /run/secrets 2>/dev/null; ls /root/.cache/x 2>/dev/null; true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["built"]
    assert token not in out.stdout


def test_failed_build_returns_nonzero_and_the_log(engine, base_image, tmp_path):
    ctx = tmp_path / "ctx"
    _write(ctx, f"FROM {base_image}\nRUN echo about-to-fail && exit 3\n")
    rc, log = engine.build(ctx, ctx / "Dockerfile", tags=[], load=False, no_cache=True)
    assert rc != 0
    assert "about-to-fail" in log


def test_pip_inside_a_build_trusts_the_cabundle_secret(engine, base_image, tag, tmp_path):
    """HTTPS to PyPI from inside a build, with the host CA bundle passed as a secret only."""
    assert HOST_CA_BUNDLE.is_file(), f"{HOST_CA_BUNDLE} missing on the host"
    ctx = tmp_path / "ctx"
    _write(
        ctx,
        f"""FROM {base_image}
RUN python3 -m venv /opt/venv
RUN --mount=type=secret,id=cabundle --mount=type=cache,target=/root/.cache/pip \\
    PIP_CERT=/run/secrets/cabundle /opt/venv/bin/pip download --no-deps -d /opt/dl six==1.16.0
""",
    )
    rc, log = engine.build(ctx, ctx / "Dockerfile", tags=[tag], secrets=[("cabundle", HOST_CA_BUNDLE)])
    assert rc == 0, log
    out = subprocess.run(
        ["docker", "run", "--rm", tag, "sh", "-c", "ls /opt/dl; find / -xdev -name cabundle 2>/dev/null; true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["six-1.16.0-py2.py3-none-any.whl"]


def test_pip_inside_a_build_trusts_the_named_context_bundle(engine, base_image, tag, tmp_path):
    """HTTPS to PyPI from inside a build, with the host CA bundle as stackforge passes it by default: a one-file
    named context, bind-mounted read-only by the step (builder/plan/cabundle.py); nothing of it stays in the image."""
    assert HOST_CA_BUNDLE.is_file(), f"{HOST_CA_BUNDLE} missing on the host"
    contexts = cabundle.write_context(HOST_CA_BUNDLE, tmp_path)
    ctx = tmp_path / "ctx"
    mount = cabundle.ca_mount(True)
    assert mount is not None
    _write(
        ctx,
        f"""FROM {base_image}
RUN python3 -m venv /opt/venv
RUN {mount.flag} \\
    PIP_CERT={mount.path} /opt/venv/bin/pip download --no-cache-dir --no-deps -d /opt/dl six==1.16.0
""",
    )
    rc, log = engine.build(ctx, ctx / "Dockerfile", tags=[tag], contexts=contexts, no_cache=True)
    assert rc == 0, log
    out = subprocess.run(
        ["docker", "run", "--rm", tag, "sh", "-c", "ls /opt/dl; ls -A /run; find / -xdev -name ca.pem 2>/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "six-1.16.0-py2.py3-none-any.whl" in out.stdout.split()
    assert "stackforge" not in out.stdout.split() and "ca.pem" not in out.stdout


def test_the_bundle_context_is_cached_by_content_not_by_copy(engine, base_image, tmp_path):
    """Each build copies the bundle afresh (new directory, new mtime): the steps that mount it stay cached
    while its bytes are the same, and run again when they change."""
    assert HOST_CA_BUNDLE.is_file(), f"{HOST_CA_BUNDLE} missing on the host"
    mount = cabundle.ca_mount(True)
    assert mount is not None
    ctx = tmp_path / "ctx"
    _write(ctx, f"FROM {base_image}\nRUN {mount.flag} echo run-{secrets.token_hex(6)}-$(date +%s%N) > /k\n")
    changed = tmp_path / "changed.pem"
    changed.write_text(HOST_CA_BUNDLE.read_text() + "# one more line\n")
    logs = []
    for n, bundle in enumerate((HOST_CA_BUNDLE, HOST_CA_BUNDLE, changed)):
        (tmp_path / f"c{n}").mkdir()
        contexts = cabundle.write_context(bundle, tmp_path / f"c{n}")
        rc, log = engine.build(ctx, ctx / "Dockerfile", contexts=contexts, load=False)
        assert rc == 0, log
        logs.append(log)
    step = re.compile(r"^#(\d+) \[stage-0 2/2\] RUN ", re.M)

    def cached(log: str) -> bool:
        m = step.search(log)
        assert m, log
        return f"#{m.group(1)} CACHED" in log

    assert [cached(log) for log in logs] == [False, True, False]


def test_registry_fixture_accepts_a_push(engine, registry, tmp_path):
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"http://{registry}/v2/", timeout=5) as r:
        assert r.status == 200
    # A one-file image: the push is what is tested, not how fast the engine compresses the base image's layers.
    (tmp_path / "smoke.txt").write_text(secrets.token_hex(8))
    tar = subprocess.run(["tar", "-C", str(tmp_path), "-c", "smoke.txt"], capture_output=True, check=True).stdout
    ref = f"{registry}/stackforge-test/base:smoke"
    subprocess.run(["docker", "import", "-", ref], input=tar, capture_output=True, check=True, timeout=60)
    try:
        push = subprocess.run(["docker", "push", ref], capture_output=True, text=True, timeout=600)
        assert push.returncode == 0, push.stderr
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{registry}/v2/stackforge-test/base/tags/list", timeout=5) as r:
            assert json.load(r) == {"name": "stackforge-test/base", "tags": ["smoke"]}
    finally:
        engine.remove_image(ref)
