"""The base image's identity a build records is the same on either image store: its config's digest (the classic
store's image id; on the containerd store, whose id is the manifest's or index's digest and which reports a
repository digest for a loaded image too, the config of the build's platform), and a registry digest only when the
stack pins one. The engine's own name for the base is kept apart, for the no-op build's question to that engine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from stackforge.builder.plan.plan import image_labels
from stackforge.builder.run import run
from stackforge.clients.engine import Engine
from stackforge.errors import BuildFailed, UserError
from stackforge.stack.load import load
from tests.fixtures.stack_support import REPO

CONFIG = "sha256:" + "c" * 64  # the base's config: what both stores agree on
INDEX = "sha256:" + "1" * 64  # the containerd store's name for it (the loaded image's manifest or index)
REGISTRY = "sha256:" + "2" * 64  # the digest a registry serves it by
ARM_CONFIG = "sha256:" + "a" * 64


class Store:
    """What ``docker image inspect`` of the base and the config lookup answer on one image store."""

    def __init__(self, containerd: bool, repo_digests: list[str] | None = None):
        self.containerd = containerd
        image_id = INDEX if containerd else CONFIG
        # the containerd store names every tagged image by a repository digest of its own id
        self.info = {"Id": image_id, "RepoDigests": [f"stackforge/base@{image_id}"] if containerd else [],
                     "Created": "2026-12-06T14:08:28.918152582Z", "Layers": 2, "Os": "linux",
                     "Architecture": "amd64", "Variant": None}  # fmt: skip
        self.info["RepoDigests"] += repo_digests or []
        self.asked: list[tuple] = []

    def inspect_image(self, ref: str, template: str, *, timeout: float = 30) -> SimpleNamespace:
        assert template == run.INSPECT
        return SimpleNamespace(returncode=0, stdout=json.dumps(self.info), stderr="")

    def image_exists(self, ref: str) -> bool:
        return True

    def config_digest(self, image_id: str, platform=None) -> str:
        self.asked.append((image_id, platform))
        if not self.containerd:
            return image_id
        assert image_id == INDEX
        return {"amd64": CONFIG, "arm64": ARM_CONFIG}[platform[1]]


CLASSIC, CONTAINERD = (lambda **kw: Store(False, **kw)), (lambda **kw: Store(True, **kw))


def identity(store: Store, overrides: list[str] | None = None, line: str | None = None):
    loaded = load("example-multi", root=REPO, overrides=overrides)
    return run.base_identity(store, loaded.for_platform(line) if line else loaded)  # type: ignore[arg-type]


def test_both_stores_record_one_identity_the_config_digest():
    classic, containerd = identity(CLASSIC()), identity(CONTAINERD())
    assert (classic.id, classic.digest, classic.engine_id) == (CONFIG, None, CONFIG)
    assert (containerd.id, containerd.digest, containerd.engine_id) == (CONFIG, None, INDEX)
    # the containerd store's repository digest of a loaded image is its own name, not a registry's: not recorded
    loaded = load("example-multi", root=REPO)
    labels = [image_labels(loaded, base_digest=b.digest, base_id=b.id, base_layers=b.layers)
              for b in (classic, containerd)]  # fmt: skip
    assert labels[0] == labels[1] and labels[0]["org.stackforge.base.id"] == CONFIG
    assert "org.opencontainers.image.base.digest" not in labels[0]


def test_a_lines_base_is_the_config_of_its_platform():
    store = CONTAINERD()
    assert identity(store, line="arm64").id == ARM_CONFIG
    assert store.asked == [(INDEX, ("linux", "arm64", None))]
    store = CONTAINERD()
    identity(store, line="amd64")
    assert store.asked == [(INDEX, ("linux", "amd64", None))]


def test_a_pinned_registry_digest_is_recorded_on_both_stores():
    pin = [f"base.digest={REGISTRY}"]
    classic = identity(CLASSIC(repo_digests=[f"stackforge/base@{REGISTRY}"]), pin)
    # on the containerd store an image pulled by that digest is named by it
    store = CONTAINERD()
    store.info["Id"] = REGISTRY
    store.config_digest = lambda image_id, platform=None: CONFIG  # type: ignore[method-assign]
    containerd = identity(store, pin)
    assert (classic.digest, classic.id) == (containerd.digest, containerd.id) == (REGISTRY, CONFIG)


def test_a_pin_on_the_config_digest_is_no_registry_digest():
    for store in (CLASSIC(), CONTAINERD()):
        base = identity(store, [f"base.digest={CONFIG}"])
        assert (base.digest, base.id) == (None, CONFIG)


def test_a_pin_the_engine_does_not_know_the_base_by_is_refused():
    other = "sha256:" + "9" * 64
    for store in (CLASSIC(), CONTAINERD()):
        with pytest.raises(BuildFailed) as err:
            identity(store, [f"base.digest={other}"])
        assert f"the stack pins {other}" in err.value.message and CONFIG in err.value.message


class _CliEngine(Engine):
    """An Engine whose docker CLI answers from a table (``docker info`` and ``image inspect``)."""

    def __init__(self, answers: dict[str, SimpleNamespace]):
        super().__init__()
        self.answers = answers

    def cli(self, *args: str, timeout: float = 60, check: bool = False):
        return self.answers[args[0]]


def test_the_engine_reads_the_config_digest_only_on_the_containerd_store(monkeypatch):
    classic = _CliEngine({"info": SimpleNamespace(returncode=0, stdout='[["Backing Filesystem","extfs"]]\n')})
    assert classic.config_digest(CONFIG) == CONFIG  # its id is the config's digest
    asked = []

    def read(engine, image_id, platform, memo=None):
        asked.append((image_id, platform))
        return CONFIG

    monkeypatch.setattr("stackforge.clients.contentstore.config_digest", read)
    ctrd = _CliEngine({
        "info": SimpleNamespace(returncode=0, stdout='[["driver-type","io.containerd.snapshotter.v1"]]\n'),
        "image": SimpleNamespace(returncode=0, stdout='"linux" "arm64" "v8"\n', stderr=""),
    })  # fmt: skip
    assert ctrd.config_digest(INDEX) == CONFIG and asked == [(INDEX, ("linux", "arm64", "v8"))]
    assert ctrd.config_digest(INDEX, ("linux", "amd64", None)) == CONFIG and asked[-1][1] == ("linux", "amd64", None)

    from stackforge.clients.layerstore import Unusable

    def unreadable(engine, image_id, platform, memo=None):
        raise Unusable("the engine is not on a local socket; exporting it failed: gone")

    monkeypatch.setattr("stackforge.clients.contentstore.config_digest", unreadable)
    with pytest.raises(UserError, match=r"cannot read the config digest of image .* \(linux/amd64\).*gone"):
        ctrd.config_digest(INDEX, ("linux", "amd64", None))
