"""The registry client: reference parsing, bounded retries, pagination, auth — against in-process stubs."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import socket

import pytest
import requests

from stackforge.clients import credentials
from stackforge.clients.registry import (
    RegistryClient,
    RegistryError,
    RetriesExhausted,
    RetryPolicy,
    parse_registry,
    parse_repository,
    with_retries,
)
from stackforge.errors import UserError
from tests.fixtures.faulty_proxy import Fault, FaultyProxy
from tests.fixtures.stub_registry import StubRegistry

FAST = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.01, total_seconds=5)


# ---------------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    "text, host, name, scheme",
    [
        ("127.0.0.1:5000/mcconline/inference/vllm", "127.0.0.1:5000", "mcconline/inference/vllm", "http"),
        ("localhost:5000/a", "localhost:5000", "a", "http"),
        ("[::1]:5000/a/b", "[::1]:5000", "a/b", "http"),
        (
            "registry.mthreads.com/mcconline/inference/vllm",
            "registry.mthreads.com",
            "mcconline/inference/vllm",
            "https",
        ),
        ("reg.example.com:8443/team/x__y.z-w", "reg.example.com:8443", "team/x__y.z-w", "https"),
    ],
)
def test_parse_repository(text, host, name, scheme):
    repo = parse_repository(text)
    assert (repo.host, repo.name, repo.scheme) == (host, name, scheme)
    assert str(repo) == text
    assert repo.ref("t1") == f"{text}:t1"
    assert repo.ref("sha256:" + "a" * 64) == f"{text}@sha256:{'a' * 64}"


def test_parse_registry_allows_bare_host_and_child():
    reg = parse_registry("127.0.0.1:5000")
    assert str(reg) == "127.0.0.1:5000" and reg.name == ""
    assert str(reg.child("vllm")) == "127.0.0.1:5000/vllm"
    assert str(parse_registry("registry.example.com/team/").child("vllm")) == "registry.example.com/team/vllm"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "empty"),
        ("http://127.0.0.1:5000/a", "scheme"),
        ("mcconline/inference", "registry host"),
        ("127.0.0.1:5000/Upper", "lower-case"),
        ("127.0.0.1:5000/a:tag", "tag or a digest"),
        ("127.0.0.1:5000/a@sha256:" + "0" * 64, "tag or a digest"),
        ("127.0.0.1:5000/a//b", "invalid repository path"),
        ("bad_host.example.com/a", "registry host"),
    ],
)
def test_parse_registry_rejects(text, needle):
    with pytest.raises(UserError) as exc:
        parse_registry(text)
    assert needle in exc.value.render()
    assert exc.value.fix


def test_parse_repository_requires_a_name():
    with pytest.raises(UserError, match="names no repository"):
        parse_repository("127.0.0.1:5000")


# ------------------------------------------------------------------------------------- retries


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_retry_policy_backoff_is_exponential_capped_and_jittered():
    policy = RetryPolicy(attempts=10, base_delay=0.5, max_delay=4.0, total_seconds=100)
    rng = random.Random(1)
    for failures, upper in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (7, 4.0)]:
        draws = [policy.delay(failures, rng) for _ in range(200)]
        assert all(0 <= d <= upper for d in draws)
        assert max(draws) > upper * 0.8  # jitter spreads over the whole interval
        assert len({round(d, 6) for d in draws}) > 150


def test_with_retries_retries_transient_failures_then_succeeds():
    clock, calls, log = Clock(), [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RegistryError("HTTP 503", status=503, retryable=True)
        return "ok"

    out = with_retries(
        flaky,
        what="x",
        policy=RetryPolicy(attempts=5, base_delay=1, max_delay=8, total_seconds=60),
        log=lambda ev, **kw: log.append((ev, kw)),
        sleep=clock.sleep,
        clock=clock,
        rng=random.Random(0),
    )
    assert out == "ok" and len(calls) == 3
    assert [ev for ev, _ in log] == ["retry", "retry"]
    assert len(clock.sleeps) == 2 and clock.sleeps[0] <= 1 and clock.sleeps[1] <= 2


def test_with_retries_bounded_in_attempts():
    clock, calls = Clock(), []

    def always():
        calls.append(1)
        raise requests.ConnectionError("Connection reset by peer")

    with pytest.raises(RetriesExhausted) as exc:
        with_retries(
            always,
            what="upload",
            policy=RetryPolicy(attempts=4, base_delay=0.1, max_delay=1, total_seconds=600),
            sleep=clock.sleep,
            clock=clock,
        )
    assert len(calls) == 4
    assert "gave up after 4 attempt(s)" in str(exc.value) and "connection reset by peer" in str(exc.value)


def test_with_retries_bounded_in_total_time():
    clock, calls = Clock(), []

    def slow_failure():
        calls.append(1)
        clock.now += 10  # every attempt itself takes 10 s
        raise RegistryError("HTTP 502", status=502, retryable=True)

    with pytest.raises(RetriesExhausted):
        with_retries(
            slow_failure,
            what="x",
            policy=RetryPolicy(attempts=100, base_delay=0.1, max_delay=1, total_seconds=35),
            sleep=clock.sleep,
            clock=clock,
        )
    assert 3 <= len(calls) <= 4
    assert clock.now < 35 + 10 + 1


def test_with_retries_does_not_retry_client_errors():
    calls = []

    def denied():
        calls.append(1)
        raise RegistryError("HTTP 400 MANIFEST_INVALID", status=400, retryable=False)

    with pytest.raises(RegistryError, match="MANIFEST_INVALID"):
        with_retries(denied, what="x", policy=FAST)
    assert len(calls) == 1


def test_retry_after_is_honoured_up_to_max_delay():
    clock, calls = Clock(), []

    def limited():
        calls.append(1)
        if len(calls) == 1:
            raise RegistryError("HTTP 429", status=429, retryable=True, retry_after=3)
        if len(calls) == 2:
            raise RegistryError("HTTP 429", status=429, retryable=True, retry_after=3600)
        return 1

    with_retries(
        limited,
        what="x",
        policy=RetryPolicy(attempts=5, base_delay=0.01, max_delay=5, total_seconds=60),
        sleep=clock.sleep,
        clock=clock,
    )
    assert clock.sleeps[0] >= 3 and clock.sleeps[1] <= 5


# ------------------------------------------------------------------------------ client vs stub


@pytest.fixture
def stub():
    with StubRegistry() as reg:
        yield reg


def client_for(address: str, name: str = "team/app", **kw) -> RegistryClient:
    return RegistryClient(
        parse_repository(f"{address}/{name}"),
        policy=kw.pop("policy", FAST),
        credentials=kw.pop("credentials", None),
        **kw,
    )


def test_list_tags_follows_pagination():
    with StubRegistry(page_size=3) as reg:
        want = [f"t{i:02d}" for i in range(10)]
        for t in want:
            reg.put_image("team/app", t, json.dumps({"t": t, "rootfs": {"diff_ids": []}}).encode(), [])
        tags = client_for(reg.address).list_tags()
        assert sorted(tags) == want
        assert sum(1 for m, p in reg.requests if p.endswith("/tags/list")) == 4


def test_list_tags_of_unknown_repository_is_empty(stub):
    assert client_for(stub.address, "nobody/here").list_tags() == []


def test_manifest_head_get_put_by_digest_creates_no_tag(stub):
    c = client_for(stub.address)
    cfg = b'{"rootfs":{"diff_ids":[]}}'
    c.upload_blob("sha256:" + hashlib.sha256(cfg).hexdigest(), len(cfg), lambda: io.BytesIO(cfg))
    body = json.dumps(
        {
            "schemaVersion": 2,
            "config": {"digest": "sha256:" + hashlib.sha256(cfg).hexdigest(), "size": len(cfg)},
            "layers": [],
        }
    ).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert c.head_manifest(digest) is None
    assert c.put_manifest(digest, body, "application/vnd.oci.image.manifest.v1+json") == digest
    assert c.list_tags() == []
    info = c.head_manifest(digest)
    assert info.digest == digest and info.size == len(body)
    assert c.get_manifest(digest).digest == digest
    with pytest.raises(RegistryError) as exc:
        c.put_manifest("sha256:" + "0" * 64, body, "application/vnd.oci.image.manifest.v1+json")
    assert exc.value.status == 400 and "DIGEST_INVALID" in exc.value.codes


def test_upload_retries_through_503_and_reset(stub):
    with FaultyProxy(
        stub.address,
        [
            Fault("status", r"/blobs/uploads/", "POST", status=503),
            Fault("reset", r"/blobs/uploads/.+digest=", "PUT"),
            Fault("status", r"/blobs/uploads/.+digest=", "PUT", status=429, retry_after="0"),
        ],
    ) as proxy:
        events = []
        c = client_for(proxy.address, log=lambda ev, **kw: events.append(ev))
        data = b"x" * 5000
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        c.upload_blob(digest, len(data), lambda: io.BytesIO(data))
        assert stub.blobs[digest] == data
        assert events.count("retry") == 3
        assert [e.action for e in proxy.fired()] == ["status", "reset", "status"]


def test_unreachable_registry_gives_up_quickly_with_a_clear_cause():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    c = client_for(
        f"127.0.0.1:{port}", policy=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01, total_seconds=5)
    )
    with pytest.raises(RetriesExhausted, match="connection refused"):
        c.ping()


def test_bearer_token_flow():
    with StubRegistry(auth="bearer", credentials=("bob", "pw")) as reg:
        c = client_for(reg.address, credentials=("bob", "pw"))
        c.ping()
        assert c.list_tags() == []
        assert ("GET", "/token") in reg.requests
        bad = client_for(reg.address, credentials=("bob", "wrong"))
        with pytest.raises(RegistryError) as exc:
            bad.ping()
        assert exc.value.status == 401


def test_basic_auth_flow():
    with StubRegistry(auth="basic", credentials=("al", "pw")) as reg:
        client_for(reg.address, credentials=("al", "pw")).ping()
        with pytest.raises(RegistryError) as exc:
            client_for(reg.address, credentials=None).ping()
        assert exc.value.status == 401


def test_credentials_from_env_and_docker_config(tmp_path):
    assert credentials.for_registry(
        "r.example.com", env={"STACKFORGE_REGISTRY_USER": "u", "STACKFORGE_REGISTRY_PASSWORD": "p"}
    ) == ("u", "p")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {"https://r.example.com": {"auth": base64.b64encode(b"me:s3:cret").decode()}}}))
    assert credentials.for_registry("r.example.com", env={}, docker_config=cfg) == ("me", "s3:cret")
    assert credentials.for_registry("other.example.com", env={}, docker_config=cfg) is None
    assert credentials.for_registry("r.example.com", env={}, docker_config=tmp_path / "missing.json") is None
