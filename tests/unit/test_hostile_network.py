"""Network answers are hostile input: credentials stay on their origin, every read is bounded in bytes and in
total time, and malformed answers are errors, not tracebacks.

Every server here is a real HTTP server on 127.0.0.1 (:mod:`tests.fixtures.hostile_server`, or the stub
registry); each one stops by itself, so a client that does not stop cannot hang the suite.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time

import pytest

from stackforge import netread
from stackforge.clients.registry import OCI_INDEX, RegistryClient, RegistryError, RetryPolicy, parse_repository
from stackforge.errors import UserError
from stackforge.flows import operator
from stackforge.publish import record as records
from stackforge.publish.record_schema import PublishRecord
from tests.fixtures.hostile_server import Answer, HostileServer, endless, ok, redirect, trickle
from tests.fixtures.records import a_record as publisher_record
from tests.fixtures.stub_registry import StubRegistry, digest_of

REPO = "team/vllm"
SECRET = ("user", "s3cret-pw")
BASIC = "Basic " + base64.b64encode(b"user:s3cret-pw").decode()
ONE_TRY = RetryPolicy(attempts=1, total_seconds=3.0)


def client_of(server, *, policy: RetryPolicy = ONE_TRY, credentials=SECRET) -> RegistryClient:
    return RegistryClient(parse_repository(f"{server.address}/{REPO}"), policy=policy, credentials=credentials)


def basic_auth(inner):
    """``inner`` behind Basic authentication (a 401 challenge without it)."""

    def answer(h):
        if h.headers.get("Authorization") != BASIC:
            return h.reply(401, b"", {"WWW-Authenticate": 'Basic realm="registry"'})
        return inner(h)

    return answer


def tags_page(tags, link: str | None = None):
    headers = {"Link": f'<{link}>; rel="next"'} if link else {}
    return ok({"name": REPO, "tags": tags}, headers=headers)


@pytest.fixture
def counted(monkeypatch):
    """Bytes the client read off the wire through netread (the memory check)."""
    total = {"read": 0}
    real = netread._read1

    def counting(resp):
        data = real(resp)
        total["read"] += len(data)
        return data

    monkeypatch.setattr(netread, "_read1", counting)
    return total


# --------------------------------------------------------------------------------------------------
# Credentials stay on their origin; pagination is bounded


def test_a_tag_list_link_to_another_host_gets_no_password_and_is_refused():
    with HostileServer({r"/tags/list": ok({"tags": []})}, lifetime=20) as other:
        page = tags_page(["a"], f"{other.url}/v2/{REPO}/tags/list?last=a")
        with HostileServer({r"/tags/list": basic_auth(page)}, lifetime=20) as reg:
            with pytest.raises(RegistryError, match="another origin"):
                client_of(reg).list_tags()
            assert reg.authorized(), "the registry itself got the credential"
        assert other.seen == [] and other.authorized() == []


def test_a_tag_list_link_naming_itself_is_read_once():
    with HostileServer(lifetime=10) as reg:
        reg.routes[r"/tags/list"] = tags_page(["a"], f"/v2/{REPO}/tags/list?n=1000")
        started = time.monotonic()
        assert client_of(reg).list_tags() == ["a"]
        assert len(reg.seen) == 1 and time.monotonic() - started < 5


def test_a_tag_list_that_never_ends_stops_at_the_page_limit():
    def next_page(h):
        n = int(h.path.rsplit("=", 1)[-1]) if "last=" in h.path else 0
        return tags_page([f"t{n}"], f"/v2/{REPO}/tags/list?n=1&last={n + 1}")(h)

    with HostileServer({r"/tags/list": next_page}, lifetime=20) as reg:
        with pytest.raises(RegistryError, match=f"longer than {netread.PAGE_LIMIT} pages"):
            client_of(reg, policy=RetryPolicy(attempts=1, total_seconds=15)).list_tags()
        assert len(reg.seen) == netread.PAGE_LIMIT


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_a_blob_redirected_to_storage_on_another_host_carries_no_credential(auth):
    blob = b"config bytes"
    digest = digest_of(blob)
    with HostileServer({r"/storage/": ok(blob)}, lifetime=20) as storage:
        moved = redirect(f"http://localhost:{storage.port}/storage/{digest}")
        with HostileServer(lifetime=20) as reg:
            if auth == "basic":
                reg.routes[r"/blobs/"] = basic_auth(moved)
            else:

                def bearer(h):
                    if h.headers.get("Authorization") != "Bearer tok-123":
                        realm = f'Bearer realm="{reg.url}/token",service="reg"'
                        return h.reply(401, b"", {"WWW-Authenticate": realm})
                    return moved(h)

                reg.routes[r"/token"] = basic_auth(ok({"token": "tok-123"}))
                reg.routes[r"/blobs/"] = bearer
            assert client_of(reg).get_blob(digest, size=len(blob)) == blob
            assert reg.authorized()
        assert len(storage.seen) == 1 and storage.authorized() == []


# --------------------------------------------------------------------------------------------------
# Sizes and deadlines


def test_an_endless_manifest_is_cut_off_at_4_mib(counted):
    with HostileServer({r"/manifests/": endless(head=b'{"a": "')}, lifetime=30) as reg:
        started = time.monotonic()
        with pytest.raises(RegistryError, match=f"manifest larger than {netread.MANIFEST_LIMIT} bytes"):
            client_of(reg).get_manifest("v1")
        assert time.monotonic() - started < ONE_TRY.total_seconds + 1
    assert counted["read"] <= netread.MANIFEST_LIMIT + netread.CHUNK


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "status-line"])
def test_a_registry_that_trickles_is_given_up_on_at_the_deadline(headers_too):
    with HostileServer({r"/manifests/": trickle(every=0.3, headers_too=headers_too)}, lifetime=30) as reg:
        started = time.monotonic()
        with pytest.raises(RegistryError, match=r"no complete answer within 2 s") as err:
            client_of(reg, policy=RetryPolicy(attempts=3, total_seconds=2.0)).get_manifest("v1")
        assert time.monotonic() - started < 3.5
        assert reg.address in str(err.value)


# --------------------------------------------------------------------------------------------------
# Malformed answers are errors


@pytest.mark.parametrize("tags", [[1, 2], [{"a": 1}], "v1", ["ok", None]])
def test_a_tag_list_whose_tags_are_not_strings_is_refused(tags):
    with HostileServer({r"/tags/list": ok({"tags": tags})}, lifetime=20) as reg:
        with pytest.raises(RegistryError, match="not .*strings"):
            client_of(reg).list_tags()


def put_raw(reg: StubRegistry, tag: str, body: bytes, media: str = OCI_INDEX) -> str:
    d = digest_of(body)
    with reg.lock:
        reg.manifests[d] = (body, media)
        reg.tags.setdefault(REPO, {})[tag] = d
    return d


def an_image(reg: StubRegistry) -> str:
    return reg.put_image(REPO, "v1-20260929-r1", b'{"config": 1}', [b"layer"])


@pytest.mark.parametrize(
    "index,problem",
    [
        ([1, 2], "a JSON list, not an object"),
        ({"manifests": {"a": 1}}, "no list of manifests"),
        ({"manifests": [{"artifactType": records.ARTIFACT_TYPE, "mediaType": "x", "size": 2}]}, "no sha256 digest"),
        (
            {
                "manifests": [
                    {"artifactType": records.ARTIFACT_TYPE, "digest": "sha256:zz", "mediaType": "x", "size": 2}
                ]
            },
            "no sha256 digest",
        ),
        (
            {"manifests": [{"artifactType": records.ARTIFACT_TYPE, "digest": "sha256:" + "a" * 64, "mediaType": "x"}]},
            "declares no size",
        ),
    ],
    ids=["a-list", "manifests-not-a-list", "no-digest", "bad-digest", "no-size"],
)
def test_a_malformed_fallback_index_or_referrer_is_an_error_before_it_is_followed(index, problem):
    with StubRegistry() as reg:
        digest = an_image(reg)
        put_raw(reg, records.fallback_tag(digest), json.dumps(index).encode())
        client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"), policy=ONE_TRY)
        reg.requests.clear()
        with pytest.raises(RegistryError, match=problem):
            records.fetch(client, digest)
        followed = [path for _, path in reg.requests if "/manifests/sha256:" in path]
    assert followed == []


class NoEngine:
    """An engine that records what it was asked and does nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __getattr__(self, verb: str):
        def used(*args: object, **_kw: object):
            self.calls.append((verb, *map(str, args)))
            raise AssertionError(f"the engine was used: {verb} {args}")

        return used


def test_a_record_of_another_image_is_refused_before_anything_is_pulled():
    with StubRegistry() as reg:
        digest = an_image(reg)
        other = reg.put_image(REPO, "other", b'{"config": 2}', [b"other layer"])
        body, media = reg.manifests[other]
        client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"), policy=ONE_TRY)
        subject = {"mediaType": media, "digest": other, "size": len(body)}
        records.attach(client, PublishRecord.model_validate(a_record(digest)), subject, "2026-09-29T10:00:00Z")
        with reg.lock:  # the fallback tag of the pulled image lists the other image's record
            reg.tags[REPO][records.fallback_tag(digest)] = reg.tags[REPO][records.fallback_tag(other)]
        engine = NoEngine()
        v = operator.verify_ref(f"{reg.address}/{REPO}@{digest}", engine, ONE_TRY)
    assert v.failed and engine.calls == []
    assert any("not a record of this image" in line for line in v.lines), v.lines


def a_record(digest: str) -> dict:
    """A record of the publisher's shape with nothing in its stack files, pins, labels or gate."""
    return publisher_record(digest, tags=["v1-20260929-r1"], stack_files={}, pins={}, labels={}, gate={})


@pytest.mark.parametrize(
    "ref",
    [
        "user:s3cret-pw@127.0.0.1:5000/team/vllm:v1",
        "https://user:s3cret-pw@127.0.0.1:5000/team/vllm:v1",
        "127.0.0.1:5000/team/vllm:v1?token=s3cret-pw",
    ],
)
def test_a_password_in_a_verify_reference_is_never_printed_back(ref):
    with pytest.raises(UserError) as err:
        operator.verify_ref(ref, NoEngine())
    assert "s3cret-pw" not in err.value.render()
    assert "error:" in err.value.render()


# --------------------------------------------------------------------------------------------------
# Package indexes and sdists


def simple_page(files: list[dict]) -> Answer:
    page = {"meta": {"api-version": "1.1"}, "name": "demo", "files": files}
    return ok(json.dumps(page).encode(), headers={"Content-Type": "application/vnd.pypi.simple.v1+json"})


def test_an_endless_index_page_is_cut_off_at_the_page_limit(counted):
    from stackforge.clients.index import IndexClient, IndexQueryError

    endless_page = endless("application/vnd.pypi.simple.v1+json", head=b'{"files": [')
    with HostileServer({r"/simple/demo/": endless_page}, lifetime=30) as index:
        started = time.monotonic()
        with pytest.raises(IndexQueryError, match=f"index page larger than {netread.INDEX_PAGE_LIMIT} bytes"):
            IndexClient(f"{index.url}/simple", credential=None).project("demo")
        assert time.monotonic() - started < 15
    assert counted["read"] <= netread.INDEX_PAGE_LIMIT + netread.CHUNK


def test_an_index_page_that_trickles_is_given_up_on_at_its_deadline():
    from stackforge.clients.index import IndexClient, IndexQueryError

    with HostileServer({r"/simple/demo/": trickle("application/vnd.pypi.simple.v1+json", every=0.3)}) as index:
        started = time.monotonic()
        with pytest.raises(IndexQueryError, match="timed out"):
            IndexClient(f"{index.url}/simple", credential=None, timeout=5, page_seconds=2).project("demo")
        assert time.monotonic() - started < 3.5


def sdist_spec(index_url: str, sha: str):
    from stackforge.clients.upstream import SdistSpec

    return SdistSpec(index_url, "demo", "1.0", sha)


def test_an_endless_sdist_stops_at_the_size_the_index_declares_and_nothing_is_kept(tmp_path, counted):
    from stackforge.clients import upstream as sources

    files = [{"filename": "demo-1.0.tar.gz", "url": "/files/demo-1.0.tar.gz", "hashes": {"sha256": "a" * 64},
              "size": 5000}]  # fmt: skip
    routes = {r"/simple/demo/": simple_page(files), r"/files/": endless("application/gzip")}
    with HostileServer(routes, lifetime=30) as index:
        started = time.monotonic()
        with pytest.raises(UserError, match="sdist larger than 5000 bytes") as err:
            sources.fetch_sdist(sdist_spec(f"{index.url}/simple", "a" * 64), tmp_path / "cache")
        assert time.monotonic() - started < 10
    assert index.address in err.value.message
    assert counted["read"] <= 5000 + netread.CHUNK
    assert list((tmp_path / "cache").rglob("*")) == [tmp_path / "cache" / "sdist"]


def test_an_index_credential_never_goes_to_a_file_on_another_host(tmp_path):
    from stackforge.clients import upstream as sources
    from stackforge.urls import Credential

    data = b"the sdist bytes"
    sha = __import__("hashlib").sha256(data).hexdigest()
    with HostileServer({r"/files/": ok(data)}, lifetime=20) as files_host:
        entry = {"filename": "demo-1.0.tar.gz", "url": f"http://localhost:{files_host.port}/files/demo-1.0.tar.gz",
                 "hashes": {"sha256": sha}, "size": len(data)}  # fmt: skip
        with HostileServer({r"/simple/demo/": basic_auth(simple_page([entry]))}, lifetime=20) as index:
            workspace = type("W", (), {"url_credential": lambda self, url: Credential(*SECRET, (), "env")})()
            got = sources.fetch_sdist(sdist_spec(f"{index.url}/simple", sha), tmp_path / "cache", workspace=workspace)
            assert index.authorized()
    assert got.read_bytes() == data
    assert len(files_host.seen) == 1 and files_host.authorized() == []


def test_a_git_upstream_redirected_to_another_host_does_not_take_the_credential_along(tmp_path):
    from stackforge.clients import upstream as sources

    with HostileServer({r".*": ok(b"no such repository", status=404)}, lifetime=20) as other:
        moved = redirect(lambda: f"{other.url}/repo.git/info/refs?service=git-upload-pack", 302)
        with HostileServer({r".*": moved}, lifetime=20) as origin:
            spec = sources.UpstreamSpec(git=f"http://user:s3cret-pw@{origin.address}/repo.git", commit="a" * 40)
            with pytest.raises(UserError) as err:
                sources.fetch_upstream(spec, tmp_path / "cache")
            assert origin.authorized()
    assert other.seen and other.authorized() == []
    assert "s3cret-pw" not in err.value.render()


def test_verify_against_a_registry_that_trickles_ends_within_its_budget(monkeypatch):
    monkeypatch.setattr(operator, "VERIFY_SECONDS", 3.0, raising=False)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}
    routes = {r"/manifests/v1$": ok(manifest), r"/(referrers|manifests)/": trickle(every=0.3)}
    with HostileServer(routes, lifetime=40) as reg:
        started = time.monotonic()
        try:
            v = operator.verify_ref(f"{reg.address}/{REPO}:v1", NoEngine(), RetryPolicy(attempts=3))
            failed = v.failed
        except UserError:
            failed = 1
        elapsed = time.monotonic() - started
    assert failed and elapsed < 3.0 + 1.5, elapsed


class SlowPullEngine:
    """An engine whose pull of a big image takes longer than a verify's registry budget, and which describes the
    image as the record does."""

    def __init__(self, pull_seconds: float, image_id: str) -> None:
        self.pull_seconds, self.image_id = pull_seconds, image_id

    def pull(self, ref: str, timeout: float):
        time.sleep(self.pull_seconds)
        return subprocess.CompletedProcess(["docker", "pull", ref], 0, "", "")

    def image_attrs(self, ref: str) -> dict:
        return {"Id": self.image_id, "Os": "linux", "Architecture": "amd64", "Config": {"Labels": {}}}


def test_the_registry_reads_after_a_long_pull_have_their_own_budget(monkeypatch):
    """The registry's budget bounds its own answers: the SBOM read after a pull that took longer than the whole
    budget is read, not refused as late."""
    monkeypatch.setattr(operator, "VERIFY_SECONDS", 1.0)
    with StubRegistry() as reg:
        digest = an_image(reg)
        body, media = reg.manifests[digest]
        client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"), policy=ONE_TRY)
        record = PublishRecord.model_validate(a_record(digest))
        records.attach(
            client, record, {"mediaType": media, "digest": digest, "size": len(body)}, "2026-09-29T10:00:00Z"
        )
        v = operator.verify_ref(f"{reg.address}/{REPO}@{digest}", SlowPullEngine(1.5, record.image_id), ONE_TRY)  # type: ignore[arg-type]
    assert f"note    no SBOM attached to {digest}" in v.lines, v.lines
    assert not any("cannot be read" in line or "budget" in line for line in v.lines), v.lines


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels"),
        (b'{"schema": "caf\xe9"}', "not UTF-8"),
        (b'{"a": NaN}', "not valid JSON"),
        (None, "stack_files: the name '../../../tmp/owned.yaml' is not a plain file name of stacks/"),
        ("tags", "tags: not a list of tags"),
    ],
)
def test_a_hostile_record_is_refused_before_anything_is_pulled_or_written(monkeypatch, tmp_path, body, said):
    """What a registry serves as the record: too deep, not UTF-8, not JSON, naming a path as a stack file, a tag
    docker would take as an option: one refusal, the engine never asked, nothing written."""
    with StubRegistry() as reg:
        digest = an_image(reg)
        body_, media = reg.manifests[digest]
        client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"), policy=ONE_TRY)
        rec = a_record(digest)
        if body is None:
            rec["stack_files"] = {"../../../tmp/owned.yaml": {"sha256": "sha256:" + "0" * 64, "text": "owned"}}
        if body == "tags":
            rec["tags"] = ["--output=/tmp/owned"]
        raw = body if isinstance(body, bytes) else json.dumps(rec).encode()
        monkeypatch.setattr(records, "body_of", lambda _record: raw)
        model = PublishRecord.model_validate(a_record(digest))
        records.attach(
            client, model, {"mediaType": media, "digest": digest, "size": len(body_)}, "2026-09-29T10:00:00Z"
        )
        engine = NoEngine()
        monkeypatch.chdir(tmp_path)
        try:
            v = operator.verify_ref(f"{reg.address}/{REPO}@{digest}", engine, ONE_TRY)
            text = "\n".join(v.lines)
            assert v.failed
        except (UserError, RegistryError) as err:
            text = err.render() if isinstance(err, UserError) else str(err)
    assert said in text and engine.calls == []
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "owned.yaml").exists()
