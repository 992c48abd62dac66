"""What ``verify`` reads of a pulled image (``flows/operator.py`` ``_described``): the engine's description, or,
where the containerd image store names the image by its manifest and describes no platform and no config (Docker
28, for a manifest whose layers it did not fetch because it held their snapshots), the config blob the manifest
names, read from the registry with its digest checked, and a note saying so. A registry that serves something else
is a failed check, not a crash."""

from __future__ import annotations

import json

from stackforge.builder.run.verify import Verification
from stackforge.clients.engine import config_of, labels_of, platform_of
from stackforge.clients.registry import RegistryClient, RetryPolicy, parse_repository
from stackforge.flows import operator
from tests.fixtures.stub_registry import StubRegistry, digest_of

REPO = "team/x"
CONFIG = {
    "architecture": "arm64",
    "os": "linux",
    "created": "2026-09-29T00:00:00Z",
    "config": {"Labels": {"org.stackforge.stack": "x"}, "Env": ["A=1"], "WorkingDir": "/srv"},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "1" * 64]},
}


class Engine:
    """The engine's answer to ``docker image inspect``, and the references it was asked for."""

    def __init__(self, attrs: dict) -> None:
        self.attrs, self.asked = attrs, []

    def image_attrs(self, ref: str) -> dict:
        self.asked.append(ref)
        return dict(self.attrs)


def described(reg: StubRegistry, engine: Engine, config: bytes = json.dumps(CONFIG).encode()):
    digest = reg.put_image(REPO, "t", config, [b"layer"])
    client = RegistryClient(parse_repository(f"{reg.address}/{REPO}"), policy=RetryPolicy(attempts=1))
    manifest = client.get_manifest(digest)
    v = Verification(f"{reg.address}/{REPO}@{digest}", "?")
    engine.attrs = {**engine.attrs, "Id": engine.attrs.get("Id") or digest}
    return operator._described(engine, v.image, manifest, client, v), v, digest  # type: ignore[arg-type]


def test_the_engine_s_description_is_used_when_it_gives_one(monkeypatch):
    blobs: list[str] = []
    monkeypatch.setattr(RegistryClient, "get_blob", lambda self, digest, **kw: blobs.append(digest))
    for attrs in (
        {"Id": "sha256:" + "c" * 64, "Os": "linux", "Architecture": "amd64", "Config": {"Labels": {"from": "engine"}}},
        {"Os": "linux", "Architecture": "amd64", "Config": {"Labels": {"from": "engine"}}},  # named by its manifest
    ):
        with StubRegistry() as reg:
            got, v, _ = described(reg, Engine(attrs))
        assert labels_of(got) == {"from": "engine"} and v.lines == [] and not v.failed
    assert blobs == []


def test_a_manifest_the_engine_holds_but_does_not_describe_is_read_from_its_config_blob():
    with StubRegistry() as reg:
        engine = Engine({"Os": "", "Architecture": "", "Config": {"Labels": None}, "RootFS": {}})
        attrs, v, digest = described(reg, engine)
    assert attrs["Id"] == digest  # still the engine's name of the image
    assert labels_of(attrs) == {"org.stackforge.stack": "x"}
    assert config_of(attrs)["Env"] == ["A=1"] and platform_of(attrs)[:2] == ("linux", "arm64")
    assert attrs["RootFS"]["Layers"] == CONFIG["rootfs"]["diff_ids"] and attrs["Created"] == CONFIG["created"]
    assert not v.failed and len(v.lines) == 1
    config_digest = digest_of(json.dumps(CONFIG).encode())
    assert v.lines[0].startswith(f"note    the engine reports no config for {digest}") and config_digest in v.lines[0]


def test_a_config_blob_that_is_no_json_object_is_a_failed_check():
    for body, words in ((b"[1, 2]", "is not a JSON object"), (b"\xff not json", "cannot be read")):
        with StubRegistry() as reg:
            engine = Engine({"Os": "", "Architecture": "", "Config": {"Labels": None}})
            attrs, v, _ = described(reg, engine, body)
        assert v.failed == 1 and words in v.lines[0] and v.lines[0].startswith("FAIL image ")
        assert labels_of(attrs) == {}
