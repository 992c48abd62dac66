"""Secrets never leak: a canary credential in the private index URL and a canary in an extra CA bundle.

post2 is built from the stand-ins with the vendor index requiring HTTP basic auth whose password is a
fresh canary (``--set indexes.mthreads.url=http://user:CANARY@127.0.0.1:P/simple``) and with
``--ca-bundle`` pointing at a bundle whose first line is a comment carrying a second canary (bind-mounted
from a named build context, not a secret, but it must not stay anywhere either). The build
must succeed (so the credential really reached pip), and neither canary -- nor the base64 of the
basic-auth pair a header would carry -- may appear in ``docker history --no-trunc``, ``docker inspect``
(labels included), any layer of ``docker save``, the build log or the CLI output, or the build
directory (evidence bundle, Dockerfile, context).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
import secrets
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures import musa_builds as mb

pytestmark = pytest.mark.engine

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def canary_build(standins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secrets")
    password = "CANARYpw" + secrets.token_hex(12)
    ca_canary = "CANARYca" + secrets.token_hex(12)
    bundle = tmp / "extra-ca.pem"
    bundle.write_text(
        f"# {ca_canary}: an extra CA bundle for the build's downloads\n"
        + (SYSTEM_BUNDLE.read_text() if SYSTEM_BUNDLE.is_file() else "")
    )
    # A fresh port on every run: the pip phases cannot come from the cache, so the credential is used.
    ep = standins.endpoints(
        standins.specs("post2"), label="auth-", auth={"mthreads": ("builder", password)}, stable_port=False
    )
    server = ep.servers["mthreads"]
    server.reset_log()
    overrides = standins.overrides(ep)
    assert f"indexes.mthreads.url=http://builder:{password}@127.0.0.1:{server.port}/simple" in overrides
    build = standins.build("post2", overrides, "--ca-bundle", str(bundle), label="post2-secrets")
    assert build.ok, build.describe()
    image = build.image
    canaries = {
        "password": password,
        "basic-auth header": base64.b64encode(f"builder:{password}".encode()).decode(),
        "CA bundle comment": ca_canary,
    }
    return build, image, canaries, server, bundle


def _found(text: str | bytes, canaries: dict[str, str]) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [what for what, value in canaries.items() if value.encode() in data]


def test_the_credential_reached_pip_only_as_a_secret(canary_build, standins):
    build, _image, _canaries, server, bundle = canary_build
    vendor_pins = [n for n, p in standins.stack("post2").packages.items() if p.index == "mthreads"]
    # The index refuses anonymous requests...
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{server.url}/torch/", timeout=10)
    assert refused.value.code == 401
    # ...and pip fetched every vendor wheel from it, authorised: the netrc secret carried the credential.
    files = [r for r in server.requests if r.path.startswith("/files/") and r.status == 200]
    assert len(files) == len(vendor_pins) and all(r.authorized for r in files), [r.path for r in server.requests]
    # The credential went to BuildKit as a secret, the CA bundle as a one-file named context that the
    # downloading steps bind-mount (the command line names paths, never contents).
    command = next(l for l in build.log.splitlines() if l.startswith("$ docker buildx build"))
    assert re.search(r"--secret id=netrc,src=\S+", command)
    assert "id=cabundle" not in command
    context = re.search(r"--build-context stackforge-cabundle=(\S+)", command)
    assert context and str(bundle) not in command
    assert not Path(context.group(1)).exists()  # removed with the build's other secrets


def test_no_canary_in_history_inspect_or_labels(canary_build):
    _build, image, canaries, server, _bundle = canary_build
    history = mb.docker("history", "--no-trunc", image).stdout
    assert f"127.0.0.1:{server.port}/simple" in history  # the index URL is there, without its credential
    assert _found(history, canaries) == []
    inspect = mb.docker("inspect", image).stdout
    assert _found(inspect, canaries) == []
    labels = json.loads(inspect)[0]["Config"]["Labels"]
    assert labels["org.stackforge.pin.torch"] == "2.11.0.post2+musa5.2.0"
    assert _found(json.dumps(labels), canaries) == []


def test_no_canary_in_any_layer(canary_build, tmp_path):
    _build, image, canaries, _server, _bundle = canary_build
    archive = tmp_path / "image.tar"
    mb.docker("save", "-o", str(archive), image)
    expected_layers = len(json.loads(mb.docker("inspect", image).stdout)[0]["RootFS"]["Layers"])
    scanned_layers, leaks = 0, []
    with tarfile.open(archive) as outer:
        for member in outer.getmembers():
            if not member.isfile():
                continue
            data = outer.extractfile(member).read()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            leaks += [(member.name, what) for what in _found(data, canaries)]
            if len(data) >= 512 and data[257:262] == b"ustar":  # a layer: look inside it too, file by file
                scanned_layers += 1
                with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                    for entry in layer.getmembers():
                        leaks += [
                            (f"{member.name}:{entry.name}", what)
                            for what in _found(entry.name + entry.linkname, canaries)
                        ]
                        # not even an empty mount point of the bundle stays behind
                        if re.search(r"(^|/)(run/stackforge|run/secrets)(/|$)|(^|/)ca\.pem$", entry.name):
                            leaks.append((f"{member.name}:{entry.name}", "mount point"))
    assert scanned_layers >= expected_layers > 0
    assert leaks == []


def test_no_canary_in_build_log_output_or_build_directory(canary_build):
    build, _image, canaries, _server, _bundle = canary_build
    assert _found(build.proc.stdout + build.proc.stderr, canaries) == []
    assert (build.evidence / "build.log").stat().st_size > 0
    scanned = []
    for path in sorted(build.out.rglob("*")):
        if path.is_file():
            scanned.append(path.relative_to(build.out).as_posix())
            assert _found(path.read_bytes(), canaries) == [], path
    # The build's own evidence directory (one per build) was among the files scanned.
    evidence = build.evidence.relative_to(build.out).as_posix()
    assert evidence.startswith("evidence/") and evidence != "evidence/latest"
    for name in (
        f"{evidence}/build.log",
        f"{evidence}/inputs.json",
        f"{evidence}/gate.txt",
        f"{evidence}/Dockerfile",
        f"{evidence}/result.json",
        "Dockerfile",
    ):
        assert name in scanned
    inputs = json.loads((build.evidence / "inputs.json").read_text())
    assert inputs["resolved"]["indexes"]["mthreads"]["url"].startswith("http://127.0.0.1:")
