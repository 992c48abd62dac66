"""Publish a local image under an immutable, never-overwritten tag.

The algorithm (one registry repository, one tag scheme ``<head><YYYYMMDD><mid><N><tail>``):

1. Read the image's identity (its config digest = the image id any node gets on pull).
2. List the repository's tags. If a tag of this date already holds this image,
   report it and publish nothing (only finish moving aliases, see 7).
3. Export the image (``docker save`` stream), compress its layers deterministically
   and build an OCI image manifest. Upload every blob the registry lacks.
4. PUT the manifest *by digest*: the registry now holds the image, but no tag names it.
   A failure up to here leaves no tag at all; a re-run reuses the uploaded blobs.
5. Under a host-local lock for the repository: re-list the tags, take the first
   revision of the date that the list lacks (a gap left by a deleted tag is reused),
   HEAD that tag right before writing it; if it appeared meanwhile, take the next free
   one. PUT the manifest under the tag.
6. Re-read the manifest by tag and compare the digest of the bytes received with the
   pushed digest (and the config digest with the image id); read it once more
   ``settle_seconds`` after the tag was written (by default SETTLE_FACTOR times this publisher's own
   HEAD→PUT time for the tag, see below). Work that does not depend on that verdict (``during_settle``:
   e.g. preparing the publish record) and the first re-read itself run in the pause, which sleeps only
   for what is left of it. A failed check (a rewritten manifest, a config blob that does not
   hash to the image id, a missing layer) fails the publish and rolls the tag back where
   the registry allows deletion, never deleting a manifest that another tag holds; a tag
   taken over by a concurrent publisher on another host makes this one move on to the
   next revision.
7. Only then move the declared aliases (e.g. ``…-latest``) and verify each.

The OCI distribution API has no conditional PUT, so two publishers on different
hosts can still both write one immutable tag: both HEAD it while it is free, both PUT it, and the
later PUT replaces the earlier. Only the earlier writer can tell (the later one reads back its own
image), and only once the later PUT has landed. That PUT left its publisher's HEAD before our PUT
landed (a HEAD after it finds the tag taken), so it lands at most that publisher's HEAD→PUT gap after
our write: a re-read that late is sound. Step 6 re-reads after ``settle_seconds``; the publisher whose
write was replaced re-tags its image under the next revision, so the end state has distinct
revisions, each holding the image its publisher reports. For a moment the replaced tag named the
other image. Publishers on one host never race: step 5 runs under an exclusive file lock.
The peer's gap is not known here; the default pause takes it to be at most SETTLE_FACTOR times
this publisher's own HEAD→PUT time to the same registry (the publishers of one repository run on
alike links: CI runners of one site). No check without a pause exists with this API: the later PUT
leaves no trace but the replaced tag, and a marker that could (an extra tag) would stay in the
repository for good on registries that delete no tag on its own. Against a peer on a link more than
SETTLE_FACTOR times slower, set ``settle_seconds`` (:class:`PublishOptions`) to that peer's gap.

Here: :class:`Publisher` (the steps above), :func:`publish` (one call, with its evidence record
``publish.json`` on success or ``publish-failed.json`` on failure, see :func:`write_evidence`).
The tag scheme is ``scheme.py``, the image export (step 3) ``oci.py``, the registry client
``registry.py``, and publishing a built stack ``stack.py``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import progress
from stackforge.clients.engine import Engine
from stackforge.clients.registry import (
    DOCKER_MANIFEST,
    OCI_MANIFEST,
    Manifest,
    RegistryClient,
    RegistryError,
    Repository,
    RetryPolicy,
    parse_repository,
    sha256_digest,
    with_retries,
)
from stackforge.clients.workspace import cache_dir
from stackforge.errors import BuildFailed, UserError, clip
from stackforge.fslock import flock_wait
from stackforge.publish.codec import codec
from stackforge.publish.oci import ImageSource, LayerCache, PreparedImage, PublishedImages
from stackforge.publish.transfer import UPLOADS, Uploader
from stackforge.signals import Interrupted
from stackforge.stack.scheme import TagScheme, first_free_revision, validate_date
from stackforge.urls import redact_text

# --------------------------------------------------------------------------------------------
# Push log
# --------------------------------------------------------------------------------------------


#: PUTs of the manifest by digest while the registry answers MANIFEST_BLOB_UNKNOWN for blobs it accepted, and the
#: pause before the next one (seconds, times the attempt)
BLOB_UNKNOWN_ATTEMPTS = 3
BLOB_UNKNOWN_PAUSE = 0.5

#: the settled re-read of a written tag comes this many times this publisher's own HEAD→PUT time for the tag
#: after the write: room for a peer whose HEAD→PUT gap to the registry is that much longer than ours
SETTLE_FACTOR = 4.0


@dataclass
class PushLog:
    echo: Callable[[str], None] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)

    def __call__(self, event: str, **fields: Any) -> None:
        entry = {"t": round(time.monotonic() - self.start, 3), "event": event, **fields}
        self.events.append(entry)
        if self.echo:
            detail = " ".join(f"{k}={v}" for k, v in fields.items())
            self.echo(f"publish: {event} {detail}".rstrip())


# --------------------------------------------------------------------------------------------
# Host-local lock
# --------------------------------------------------------------------------------------------


def default_lock_dir() -> Path:
    return Path(os.environ.get("STACKFORGE_LOCK_DIR") or Path(tempfile.gettempdir()) / "stackforge-locks")


@contextmanager
def repository_lock(
    repository: Repository, lock_dir: Path, *, timeout: float, log: Callable[..., None]
) -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{repository.host}/{repository.name}".encode()).hexdigest()[:20]
    path = lock_dir / f"publish-{key}.lock"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        if not flock_wait(fd, timeout, lambda: log("lock-wait", lock=str(path)), poll=0.05):
            raise BuildFailed(
                f"another publisher on this host held {path} for more than {timeout:.0f} s; no tag was created",
                fix="wait for it to finish and re-run",
            )
        yield
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# The algorithm
# --------------------------------------------------------------------------------------------


@dataclass
class PublishResult:
    status: str  # "published" | "already-published" | "pushed" (by digest only, no tag)
    repository: str
    tag: str
    digest: str
    image_id: str
    size: int | None
    aliases: dict[str, str]
    verification: dict[str, Any]
    push_log: list[dict[str, Any]]
    started_at: str
    finished_at: str
    duration_s: float
    source: str
    local_size: int | None = None
    #: the local image's id when publishing normalized it (``image_id`` is then what a pull gives)
    gated_image_id: str | None = None
    #: the vulnerability gate's verdict (builder/records/vulns.py ScanReport.summary()); None: not scanned
    scan: dict[str, Any] | None = None

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"

    def evidence(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "repository": self.repository,
            "tag": self.tag,
            "reference": self.reference,
            "digest": self.digest,
            "pinned_reference": f"{self.repository}@{self.digest}",
            "image_id": self.image_id,
            **({"gated_image_id": self.gated_image_id} if self.gated_image_id else {}),
            "source": self.source,
            "size": self.size,
            "local_size": self.local_size,
            "aliases": self.aliases,
            "verification": self.verification,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "push_log": self.push_log,
        }


@dataclass
class _Found:
    tag: str
    manifest: Manifest


class _TagTaken(Exception):
    def __init__(self, digest: str | None):
        self.digest = digest


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


#: the image config key where BuildKit writes an inline cache export's records (``--cache-to type=inline``)
BUILD_CACHE_KEY = "moby.buildkit.cache.v0"


def _without_build_cache(config: bytes) -> Any:
    """The image config ``config`` without :data:`BUILD_CACHE_KEY` (None when it is not a JSON object)."""
    try:
        doc = json.loads(config)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    doc.pop(BUILD_CACHE_KEY, None)
    return doc


def _config_digest(manifest: Manifest) -> str | None:
    try:
        doc = manifest.json()
    except ValueError:
        return None
    if doc.get("mediaType") in (OCI_MANIFEST, DOCKER_MANIFEST) or "config" in doc:
        cfg = doc.get("config") or {}
        return cfg.get("digest")
    return None


def _manifest_size(manifest: Manifest) -> int | None:
    try:
        doc = manifest.json()
        blobs = {d["digest"]: d["size"] for d in [doc["config"], *doc["layers"]]}
    except (ValueError, KeyError, TypeError):
        return None
    return len(manifest.body) + sum(blobs.values())


@dataclass(frozen=True)
class TrustOptions:
    """What a stack's publish proves about its image before any tag or alias names it.

    ``sign_key``: a PEM private key (Ed25519 or ECDSA P-256): signed provenance is attached before any tag.
    ``osv``: an OSV database directory: the build's SBOM is scanned and no alias moves while a finding at or above
    ``fail_on`` stands (the immutable tag is published either way); ``osv_max_age``: how old its snapshot may be
    before the gate refuses it (None: 7 days).
    """

    sign_key: Path | None = None
    osv: Path | None = None
    fail_on: str = "high"
    osv_max_age: _dt.timedelta | None = None


@dataclass(frozen=True)
class PublishOptions:
    """How a publish pushes, as ``stackforge publish``'s flags (or the nightly) decide: built once by the verb
    and passed down to :func:`publish`.

    ``layer_cache``: True for the default directory (``$STACKFORGE_CACHE/layers`` or ``~/.cache/stackforge/layers``),
    a path, or False for none; it also remembers which repositories received each layer, so a publish to another
    repository of the same registry mounts it from there. ``mount_from``: more repository names of the same registry
    to mount layers from. ``compression``: the layer codec (gzip, zstd or none, see ``codec.py``); ``level``: its
    level (None: the codec's default); one codec and level give the same blob for a layer everywhere.
    ``settle_seconds``: the pause before the tag is re-read (None: see :meth:`Publisher.settle`). ``echo``: where
    the push log's lines go. ``trust``: the signing and the vulnerability gate of a stack's publish.
    """

    policy: RetryPolicy | None = None
    #: None: the stack's tags.compression, else gzip
    compression: str | None = None
    level: int | None = None
    mount_from: tuple[str, ...] | list[str] = ()
    lock_dir: Path | None = None
    verify_pull: bool = False
    workdir: Path | None = None
    layer_cache: Path | bool | None = True
    settle_seconds: float | None = None
    echo: Callable[[str], None] | None = None
    trust: TrustOptions = field(default_factory=TrustOptions)


@dataclass(frozen=True)
class PublishHooks:
    """Work a publish runs at points of its timeline (see :class:`Publisher`): ``during_settle`` with the result it
    is about to report, in the settle pause (its failure is logged, never fatal); ``before_tag`` with (manifest
    digest, image id) once the registry holds the image by digest and before any tag names it (its failure fails
    the publish with no tag written); ``listed``, for a push by digest only, once the image is exported."""

    during_settle: Callable[[PublishResult], object] | None = None
    before_tag: Callable[[str, str], object] | None = None
    #: a push by digest only (``tag_it=False``): asked once the image is exported, the digests of the images already
    #: published for its platform (the children the date's indexes list for it, :func:`platforms.listed_children`);
    #: one that is the image, or is it but for BuildKit's cache records (:meth:`Publisher._same_content`), is reported
    #: instead of a new push, so an index over the same lines is the index already tagged
    listed: Callable[[RegistryClient], list[str]] | None = None


@dataclass
class Publisher:
    client: RegistryClient
    image: ImageSource
    scheme: TagScheme
    date: str
    aliases: tuple[str, ...] = ()
    #: how it pushes (codec and level, mount sources, lock directory, pull check, work directory, layer cache, the
    #: settle pause: see :class:`PublishOptions`); its ``policy`` is the client's and its ``echo`` the log's
    options: PublishOptions = field(default_factory=PublishOptions)
    uploads: int = UPLOADS
    lock_timeout: float = 600.0
    engine: Engine | None = None
    log: PushLog = field(default_factory=PushLog)
    max_revisions: int = 100
    #: ``during_settle``: called with the result this publish is about to report (its aliases as they would move)
    #: while the settle pause runs; its failure is logged, never fatal: the same work is done again after the
    #: verdict. ``before_tag``: called with (manifest digest, image id) once the registry holds the image by digest
    #: and before any tag or alias names it (e.g. attaching signed provenance); its failure fails the publish with
    #: no tag written
    hooks: PublishHooks = field(default_factory=PublishHooks)
    #: False: push the image by digest only and write no tag (a platform's image under an index, which the index's
    #: publish tags: publish/platforms.py); the result's status is "pushed" and its tag empty
    tag_it: bool = True

    def __post_init__(self) -> None:
        o = self.options
        self.compression = o.compression or "gzip"
        self.level = o.level  # None: the codec's default (codec.py)
        self.mount_from = tuple(o.mount_from)
        self.lock_dir = o.lock_dir or default_lock_dir()
        self.verify_pull = o.verify_pull
        self.workdir = o.workdir
        self.layer_cache = cache_dir(None, "layers") if o.layer_cache is True else (o.layer_cache or None)
        #: the pause between the tag write and its settled re-read; None: SETTLE_FACTOR times the HEAD→PUT time
        #: this publisher measured for the tag
        self.settle_seconds = o.settle_seconds
        self.repository = self.client.repository
        self.started_at = _now()
        self.t0 = time.monotonic()
        self.prepared: PreparedImage | None = None
        self.tag_written: str | None = None
        self.head_to_put = 0.0  # seconds from the HEAD of the tag to the answer of its PUT
        self.tag_attempted: str | None = None
        self._verified: dict[str, Any] = {}
        for alias in self.aliases:
            self.scheme.check_alias(alias)
        self.codec = codec(self.compression, self.level)

    # -- small helpers -----------------------------------------------------------------------

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        return with_retries(fn, what=what, policy=self.client.policy, log=self.log)

    def _holds_image(self, tag: str, image_id: str, digest: str | None) -> Manifest | None:
        m = self.client.get_manifest(tag)
        if m is None:
            return None
        if digest is not None and m.digest == digest:
            return m
        if _config_digest(m) == image_id:
            return m
        if self._same_content(m):
            return m
        return None

    def _same_content(self, m: Manifest) -> bool:
        """Whether ``m`` is the prepared image but for BuildKit's cache records: the same layers and the same config
        once :data:`BUILD_CACHE_KEY` is set aside. Two hosts that build one image from each other's registry cache
        (the shards of a night) write the same layers and config, but each its own record of the cache graph it
        took them from; a re-run on another host is then the image already published, not a new revision."""
        img = self.prepared
        if img is None or img.config.data is None:
            return False
        try:
            doc = m.json()
        except ValueError:
            return False
        layers = doc.get("layers")
        if not isinstance(layers, list):
            return False
        if [x.get("digest") if isinstance(x, dict) else None for x in layers] != [b.digest for b in img.layers]:
            return False
        try:
            config, theirs = self.client.config_blob(doc)
        except RegistryError:
            return False
        same = _without_build_cache(theirs) == _without_build_cache(img.config.data)
        if same:
            self.log("same-content", tag_config=config, image_id=img.image_id)
        return same

    def _find_published(
        self, tags: list[str], image_id: str, digest: str | None, skip: set[str]
    ) -> tuple[str, Manifest] | None:
        for _rev, tag in sorted(self.scheme.revisions(tags, self.date).items()):
            if tag in skip:
                continue
            skip.add(tag)
            m = self._holds_image(tag, image_id, digest)
            if m is not None:
                return tag, m
        return None

    def _tag_digest(self, tag: str) -> str | None:
        return tag_digest(self.client, tag)

    def _result(
        self,
        status: str,
        tag: str,
        digest: str,
        image_id: str,
        aliases: dict[str, str],
        verification: dict[str, Any],
        size: int | None = None,
    ) -> PublishResult:
        return PublishResult(
            status=status,
            repository=str(self.repository),
            tag=tag,
            digest=digest,
            image_id=image_id,
            size=self.prepared.size if self.prepared else size,
            aliases=aliases,
            verification=verification,
            push_log=self.log.events,
            started_at=self.started_at,
            finished_at=_now(),
            duration_s=round(time.monotonic() - self.t0, 3),
            source=self.image.description,
            local_size=getattr(self.image, "local_size", None),
            gated_image_id=self.image.image_id if self.image.image_id != image_id else None,
        )

    def left_behind(self) -> str:
        """After a failure: say truthfully whether a tag of ours exists (one quick look, no retries)."""
        tag = self.tag_written or self.tag_attempted
        if tag is None:
            return "no tag was created"
        digest = self.prepared.digest if self.prepared else None
        try:
            client = RegistryClient(
                self.repository,
                policy=RetryPolicy(attempts=1, total_seconds=10),
                credentials=self.client.credentials,
                timeout=(5.0, 10.0),
            )
            current = client.head_manifest(tag)
        except RegistryError:
            return (
                f"tag {tag} may have been written (the registry stopped answering); "
                "a re-run finds it and verifies it, or publishes under the next free revision"
            )
        if current is None:
            return "no tag was created"
        if current.digest == digest:
            return f"tag {tag} holds the pushed image but was not verified; a re-run verifies it"
        return f"tag {tag} belongs to another image; nothing of this publish is tagged"

    # -- steps --------------------------------------------------------------------------------

    def run(self) -> PublishResult:
        self.log("start", repository=str(self.repository), date=self.date, source=self.image.description)
        try:
            self.client.ping()
        except RegistryError as exc:
            raise UserError(
                f"registry {self.repository.host} is not usable: {exc}",
                fix=f"check --registry and that {self.repository.base_url}/v2/ answers; no tag was created",
            ) from None
        if self.image.image_id is None and hasattr(self.image, "inspect"):
            self.image.inspect()

        checked: set[str] = set()
        tags = self.client.list_tags()
        self.log("tags", count=len(tags), of_date=sorted(self.scheme.revisions(tags, self.date)))
        pre_checked = self.image.image_id is not None
        images = self._published_images()
        if pre_checked and self.tag_it:
            # Cheap path: the image id is known without exporting the image (and, for a normalized image, what it
            # was published as last time).
            local = self.image.image_id
            assert local is not None
            known = images.get(local) if images is not None else None
            digest, config = known if known is not None else (None, local)
            found = self._find_published(tags, config, digest, checked if known is None else set())
            if found:
                return self._already(found, tags, config)

        with tempfile.TemporaryDirectory(prefix="stackforge-publish-", dir=self.workdir) as tmp:
            level = self.codec.level if self.codec is not None else None
            self.log("export", source=self.image.description, compression=self.compression, level=level)
            cache = (
                LayerCache(self.layer_cache, lambda d, i: uploader.available(d, i), key=self.codec.key)
                if self.layer_cache is not None and self.codec is not None
                else None
            )
            uploader = Uploader(
                self.client, self.log, cache=cache, mount_from=self.mount_from, workers=self.uploads, echo=self.log.echo
            )
            try:
                # With the image id known and not yet published, each layer uploads as soon as it is compressed.
                with progress.step(f"export the layers of {self.image.description}", self.log.echo):
                    self.prepared = img = self.image.prepare(
                        Path(tmp),
                        compression=self.compression,
                        log=self.log,
                        cache=cache,
                        level=level,
                        sink=uploader.submit if pre_checked else None,
                    )
                self.log(
                    "exported",
                    image_id=img.image_id,
                    digest=img.digest,
                    layers=len(img.layers),
                    size=img.size,
                    layers_already_in_registry=cache.hits if cache else 0,
                )
                kept = self._listed_image(img) if not self.tag_it else None
                if kept is not None:
                    return self._pushed_before(kept, img)
                if self.tag_it and (not pre_checked or img.source_id is not None):
                    # A normalized image's tags were looked at by the local id only: look again by digest.
                    skip = checked if not pre_checked else set()
                    found = self._find_published(tags, img.image_id, img.digest, skip)
                    checked |= skip
                    if found:
                        return self._already(found, tags)
                self._upload_blobs(img, uploader)
            finally:
                uploader.close()
        self._put_by_digest(img)
        if images is not None and img.source_id is not None:
            images.put(img.source_id, img.digest, img.image_id)
        if self.hooks.before_tag is not None:
            self.hooks.before_tag(img.digest, img.image_id)
        if not self.tag_it:
            self.log("pushed-by-digest", digest=img.digest, size=len(img.manifest), media_type=img.manifest_media_type)
            return self._result("pushed", "", img.digest, img.image_id, {}, {})
        with repository_lock(self.repository, self.lock_dir, timeout=self.lock_timeout, log=self.log):
            outcome = self._tag(img, checked)
            if not isinstance(outcome, _Found):
                tag, verification = outcome
                aliases = self._advance_aliases(tag, img.manifest, img.manifest_media_type, img.digest)
        if isinstance(outcome, _Found):
            return self._already((outcome.tag, outcome.manifest), self.client.list_tags())
        if self.verify_pull:
            verification["pull"] = self._verify_pull(tag, img.image_id)
        self.log("done", tag=tag, digest=img.digest)
        return self._result("published", tag, img.digest, img.image_id, aliases, verification)

    def _listed_image(self, img: PreparedImage) -> Manifest | None:
        """The first image of the ``listed`` hook that ``img`` is (by digest, config or content), or None."""
        listed = self.hooks.listed
        for digest in listed(self.client) if listed is not None else []:
            m = self.client.get_manifest(digest)
            if m is None or m.digest != digest:  # not the bytes the index names
                continue
            if m.digest == img.digest or _config_digest(m) == img.image_id or self._same_content(m):
                return m
        return None

    def _pushed_before(self, m: Manifest, img: PreparedImage) -> PublishResult:
        """The result of a push by digest whose image the registry holds already as ``m`` (the ``listed`` hook): nothing
        uploaded, its provenance signed for ``m`` (as :meth:`_already` does for a tag)."""
        image_id = _config_digest(m) or img.image_id
        self.log("already-pushed", digest=m.digest, image_id=image_id)
        self.log("pushed-by-digest", digest=m.digest, size=len(m.body), media_type=m.media_type or OCI_MANIFEST)
        if self.hooks.before_tag is not None:
            self.hooks.before_tag(m.digest, image_id)
        return self._result("pushed", "", m.digest, image_id, {}, {"already_pushed": True})

    def _published_images(self) -> PublishedImages | None:
        if self.layer_cache is None or self.codec is None:
            return None
        return PublishedImages(self.layer_cache / "images", self.codec.key)

    def _already(self, found: tuple[str, Manifest], tags: list[str], image_id: str | None = None) -> PublishResult:
        tag, manifest = found
        image_id = self.prepared.image_id if self.prepared else image_id or self.image.image_id
        assert image_id is not None
        ours, config = image_id, _config_digest(manifest)
        self.log("already-published", tag=tag, digest=manifest.digest)
        verification: dict[str, Any] = {
            "tag_digest": manifest.digest,
            "config_digest": config,
            "image_id_matches": config == ours,
        }
        if (
            config is not None
            and config != ours
            and manifest.digest != (self.prepared.digest if self.prepared else None)
        ):
            # the same layers and config but BuildKit's cache records (see _same_content): the image id is the one a
            # pull of the tag gives
            verification["same_content"] = True
            image_id = config
        if self.hooks.before_tag is not None:
            self.hooks.before_tag(manifest.digest, image_id)
        with repository_lock(self.repository, self.lock_dir, timeout=self.lock_timeout, log=self.log):
            aliases = self._advance_aliases(tag, manifest.body, manifest.media_type or OCI_MANIFEST, manifest.digest)
        if self.verify_pull:
            verification["pull"] = self._verify_pull(tag, image_id)
        return self._result(
            "already-published", tag, manifest.digest, image_id, aliases, verification, size=_manifest_size(manifest)
        )

    def _upload_blobs(self, img: PreparedImage, uploader: Uploader) -> None:
        t = time.monotonic()
        with progress.step(f"upload the blobs the registry lacks to {self.repository}", self.log.echo):
            done = uploader.push_all(img.unique_blobs())
        self.log("blobs", seconds=round(time.monotonic() - t, 3), **uploader.counts, pushed=len(done))

    def _put_by_digest(self, img: PreparedImage) -> None:
        for attempt in range(1, BLOB_UNKNOWN_ATTEMPTS + 1):
            try:
                got = self.client.put_manifest(img.digest, img.manifest, img.manifest_media_type)
                break
            except RegistryError as exc:
                if "MANIFEST_BLOB_UNKNOWN" not in exc.codes or attempt == BLOB_UNKNOWN_ATTEMPTS:
                    raise
                # Every blob was accepted moments ago. A registry can lose sight of one for a moment while
                # another publisher pushes the same blob (distribution's filesystem driver rewrites the
                # repository's link file in place): look again, then ask once more.
                missing = [b.digest for b in img.unique_blobs() if not self.client.blob_exists(b.digest)]
                self.log("manifest-blob-unknown", attempt=attempt, missing=missing)
                time.sleep(BLOB_UNKNOWN_PAUSE * attempt)
        self.log("manifest-by-digest", digest=img.digest, registry_digest=got)
        if got and got != img.digest:
            raise BuildFailed(
                f"the registry stored the manifest as {got}, not {img.digest}; no tag was created",
                fix="a proxy between here and the registry alters manifests; publish around it",
            )

    def _claim(self, tag: str, img: PreparedImage) -> str:
        """HEAD the tag right before writing it; write only while it is free. Retries re-check."""

        first = time.monotonic()

        def attempt() -> str:
            t = time.monotonic()
            current = self._tag_digest(tag)
            if current is not None:
                if current == img.digest:
                    # An earlier attempt's PUT landed although its answer was lost: its HEAD→PUT gap lies
                    # within the time since the first attempt's HEAD.
                    self.head_to_put = time.monotonic() - first
                    self.log("tag-found-written", tag=tag, head_to_put=round(self.head_to_put, 3))
                    return "ours"
                raise _TagTaken(current)
            self.tag_attempted = tag
            got = self.client.put_manifest_once(tag, img.manifest, img.manifest_media_type)
            self.tag_written = tag
            self.head_to_put = time.monotonic() - t
            self.log("tag-written", tag=tag, registry_digest=got, head_to_put=round(self.head_to_put, 3))
            return "written"

        return self._retry(f"tag {tag}", attempt)

    def _tag(self, img: PreparedImage, checked: set[str]) -> tuple[str, dict[str, Any]] | _Found:
        taken: set[int] = set()
        for _ in range(self.max_revisions):
            tags = self.client.list_tags()
            found = self._find_published(tags, img.image_id, img.digest, checked)
            if found:
                self.log("published-meanwhile", tag=found[0])
                return _Found(*found)
            revisions = set(self.scheme.revisions(tags, self.date)) | taken
            revision = first_free_revision(revisions)
            tag = self.scheme.tag(self.date, revision)
            self.log("tag-candidate", tag=tag)
            try:
                self._claim(tag, img)
            except _TagTaken as exc:
                self.log("tag-appeared", tag=tag, digest=exc.digest)
                taken.add(revision)
                checked.discard(tag)
                continue
            written_at = time.monotonic()  # the PUT has answered: it landed at or before this
            verdict = self._verify_tag(tag, img)
            settle = self.settle()
            if verdict is not None and settle > 0:
                # A publisher on another host that HEADed this tag before our PUT may still write it:
                # read it once more when a pause longer than its HEAD→PUT gap has passed since our write.
                self._meanwhile(tag, img)
                elapsed = time.monotonic() - written_at
                left = settle - elapsed
                self.log(
                    "settle",
                    tag=tag,
                    settle=round(settle, 3),
                    since_write=round(elapsed, 3),
                    sleep=round(max(left, 0.0), 3),
                )
                if left > 0:
                    time.sleep(left)
                verdict = self._verify_tag(tag, img, again=True)
            if verdict is None:
                taken.add(revision)
                continue
            return tag, verdict
        raise BuildFailed(f"no free revision found after {self.max_revisions} tries for date {self.date}")

    def settle(self) -> float:
        """The pause before the settled re-read: ``settle_seconds``, or by default SETTLE_FACTOR times this
        publisher's HEAD→PUT time for the tag (the window a peer's PUT can still land in, see the module)."""
        if self.settle_seconds is not None:
            return self.settle_seconds
        return SETTLE_FACTOR * self.head_to_put

    def _meanwhile(self, tag: str, img: PreparedImage) -> None:
        """Run ``during_settle`` with the result this publish would report if the settled re-read confirms ``tag``."""
        if self.hooks.during_settle is None:
            return
        t = time.monotonic()
        try:
            newest = self.scheme.newest([*self.client.list_tags(), tag]) if self.aliases else tag
            aliases = {a: "moved" if newest == tag else f"not moved: {newest} is newer" for a in self.aliases}
            self.hooks.during_settle(self._result("published", tag, img.digest, img.image_id, aliases, {}))
        except Exception as exc:  # the work is redone after the verdict
            self.log("settle-work-failed", error=str(exc))
        else:
            self.log("settle-work", seconds=round(time.monotonic() - t, 3))

    def _verify_tag(self, tag: str, img: PreparedImage, again: bool = False) -> dict[str, Any] | None:
        """Re-read the tag. Returns the verification record, None when a concurrent publisher took it."""
        m = self.client.get_manifest(tag)
        if m is None:
            raise BuildFailed(
                f"tag {tag} vanished right after it was written", fix="check the registry; re-run the publish"
            )
        config_digest = _config_digest(m)
        ok = m.digest == img.digest and (m.header_digest in (None, img.digest))
        self.log(
            "tag-reread-settled" if again else "tag-reread",
            tag=tag,
            digest=m.digest,
            header_digest=m.header_digest,
            expected=img.digest,
            ok=ok,
        )
        if ok:
            if again:
                return {**self._verified, "settled_reread": True, "settle_seconds": round(self.settle(), 3)}
            config = self.client.get_blob(img.config.digest)
            config_ok = sha256_digest(config) == img.image_id
            if not config_ok:
                raise BuildFailed(
                    f"config blob {img.config.digest} read back from the registry does not hash to the "
                    f"image id {img.image_id}. " + self._remove_tag(tag, img.digest),
                    fix="check the registry's storage; re-run the publish",
                )
            missing = [
                b.digest for b in img.unique_blobs() if b is not img.config and not self.client.blob_exists(b.digest)
            ]
            if missing:
                raise BuildFailed(
                    f"the registry lacks layer(s) {', '.join(missing)} of {tag}. " + self._remove_tag(tag, img.digest),
                    fix="check the registry's storage; re-run the publish",
                )
            self._verified = {
                "tag_digest": m.digest,
                "header_digest": m.header_digest,
                "pushed_digest": img.digest,
                "config_digest": img.image_id,
                "image_id_matches": True,
                "layers_present": len(img.unique_blobs()) - 1,
            }
            return {
                **self._verified,
                "settled_reread": again,
                "settle_seconds": round(self.settle(), 3) if again else 0,
            }
        if config_digest is not None and config_digest != img.image_id and m.header_digest in (None, m.digest):
            # Another image now holds the tag: a publisher on another host wrote it between our HEAD and PUT.
            self.log("tag-lost", tag=tag, digest=m.digest, image_id=config_digest)
            self.tag_written = self.tag_attempted = None
            return None
        rolled_back = self._roll_back(tag, m, img)
        raise BuildFailed(
            f"manifest digest mismatch for {self.repository}:{tag}: pushed {img.digest}, the tag returns {m.digest}"
            + (f" (registry header {m.header_digest})" if m.header_digest and m.header_digest != m.digest else "")
            + "; the manifest was altered between here and the registry. "
            + rolled_back,
            fix="publish around the proxy that rewrites manifests, then re-run",
        )

    def _roll_back(self, tag: str, m: Manifest, img: PreparedImage) -> str:
        """The tag read back differently from what was pushed: delete it. Returns what is left, as a sentence."""
        stored = self._tag_digest(tag)
        if stored is None:
            self.tag_written = self.tag_attempted = None
            return "The tag is gone."
        if stored == img.digest:
            return (
                f"The registry itself holds the pushed manifest under {tag}, but it cannot be verified from here. "
                + self._remove_tag(tag, stored)
            )
        return self._remove_tag(tag, stored)

    def _remove_tag(self, tag: str, digest: str) -> str:
        """Delete ``tag`` (written by this publish, holding ``digest``) after its verification failed.

        A DELETE by digest also removes every other tag of that manifest, so it is used only when no
        other tag holds it; otherwise only a DELETE of the tag itself (OCI distribution 1.1) is tried,
        which docker-registry 2.x refuses. Returns what is left, as a sentence for the error message.
        """
        try:
            stored = self._tag_digest(tag)
            if stored is None:
                self.tag_written = self.tag_attempted = None
                return "The tag is gone; no tag remains."
            if stored != digest:
                self.tag_written = self.tag_attempted = None
                return f"Tag {tag} now holds another image ({stored}); nothing of this publish is tagged."
            others = [t for t in self.client.list_tags() if t != tag and self._tag_digest(t) == digest]
        except RegistryError as exc:
            self.log("rollback-failed", tag=tag, digest=digest, error=str(exc))
            return (
                f"The registry stopped answering during the roll-back: tag {tag} may still point to {digest}; "
                "re-run the publish, or have the registry's administrator delete the tag."
            )
        try:
            deleted = self.client.delete_manifest(tag if others else digest)
        except RegistryError as exc:
            deleted = False
            self.log("rollback-failed", tag=tag, digest=digest, error=str(exc))
        try:
            gone = deleted and self._tag_digest(tag) is None
        except RegistryError:
            gone = False
        if gone:
            self.tag_written = self.tag_attempted = None
            self.log("rolled-back", tag=tag, digest=digest, kept=others)
            if others:
                return f"Rolled back: tag {tag} was deleted ({', '.join(others)} still hold {digest}); no tag of this publish remains."
            return f"Rolled back: the manifest {digest} and the tag {tag} were deleted; no tag remains."
        self.log("rollback-impossible", tag=tag, digest=digest, others=others)
        if others:
            return (
                f"The registry does not delete a tag on its own, and deleting the manifest {digest} would also remove "
                f"{', '.join(others)}: tag {tag} points to {digest} and must be deleted by the registry's administrator."
            )
        return (
            f"The registry does not allow deleting it: tag {tag} points to {digest} and must be deleted by "
            "the registry's administrator."
        )

    def _advance_aliases(self, tag: str, body: bytes, media_type: str, digest: str) -> dict[str, str]:
        """Point the aliases at ``tag`` only when it is the newest immutable tag (:func:`advance_aliases`). Called
        under the host lock."""
        return advance_aliases(self.client, self.scheme, tag, body, media_type, digest, self.aliases, self.log)

    def _verify_pull(self, tag: str, image_id: str) -> dict[str, Any]:
        """Pull the tag through the engine, as a node would, and compare the image id."""
        ref = self.repository.ref(tag)
        engine = self.engine or Engine()
        t = time.monotonic()
        had = engine.image_id(ref)
        pulled = engine.pull(ref)
        if pulled.returncode != 0:
            raise BuildFailed(
                f"re-pull of {ref} failed: {clip(redact_text(pulled.stderr or pulled.stdout))}",
                fix="check the registry from the engine's side",
            )
        got = engine.image_id(ref)
        ok = got == image_id
        self.log("re-pull", reference=ref, image_id=got, ok=ok)
        if not ok:
            raise BuildFailed(f"re-pull of {ref} yields image id {got}, the published image is {image_id}")
        if had is None:
            # Drop the pulled name again when the image keeps another one, so the engine is left as it was.
            tags = engine.image_attrs(image_id).get("RepoTags") or []
            if len(tags) > 1:
                engine.remove_image(ref)
        return {"reference": ref, "image_id": got, "identical": ok, "seconds": round(time.monotonic() - t, 3)}


def tag_digest(client: RegistryClient, tag: str) -> str | None:
    """The digest ``tag`` holds now (None: no such tag)."""
    info = client.head_manifest(tag)
    if info is None:
        return None
    if info.digest:
        return info.digest
    m = client.get_manifest(tag)
    return m.digest if m else None


def advance_aliases(
    client: RegistryClient,
    scheme: TagScheme,
    tag: str,
    body: bytes,
    media_type: str,
    digest: str,
    aliases: tuple[str, ...] | list[str],
    log: Callable[..., None],
) -> dict[str, str]:
    """Point ``aliases`` at ``tag`` (whose manifest is ``body``, ``digest``) only when it is the newest immutable
    tag by (date, revision); call under the repository's host lock (:func:`repository_lock`).

    The registry's tag list is read afresh, so an older ``--date`` or a revision filling a gap below a newer one
    leaves every alias where it is (``not moved: … is newer``)."""
    if not aliases:
        return {}
    newest = scheme.newest([*client.list_tags(), tag])
    out: dict[str, str] = {}
    for alias in aliases:
        if newest != tag:
            out[alias] = f"not moved: {newest} is newer"
            log("alias-kept", alias=alias, tag=tag, newest=newest)
        elif tag_digest(client, alias) == digest:
            out[alias] = "unchanged"
        else:
            out.update(_move_aliases_raw(client, body, media_type, digest, [alias], log, after=tag))
    return out


def _move_aliases_raw(
    client: RegistryClient,
    body: bytes,
    media_type: str,
    digest: str,
    aliases: list[str],
    log: Callable[..., None],
    after: str | None = None,
) -> dict[str, str]:
    out: dict[str, str] = {}
    for alias in aliases:
        try:
            before = tag_digest(client, alias)
            client.put_manifest(alias, body, media_type)
            m = client.get_manifest(alias)
        except RegistryError as exc:
            raise BuildFailed(
                f"alias {alias} could not be moved: {exc}. The immutable tag {after or ''} is published and verified",
                fix="re-run the same publish to move the alias",
            ) from None
        if m is None or m.digest != digest:
            raise BuildFailed(
                f"alias {alias} reads back as {m.digest if m else 'missing'}, expected {digest}",
                fix="re-run the same publish; check for a proxy that alters manifests",
            )
        out[alias] = "moved" if before != digest else "unchanged"
        log("alias", alias=alias, digest=digest, previous=before)
    return out


def publish(
    image: ImageSource,
    repository: Repository | str,
    scheme: TagScheme,
    date: str | None = None,
    options: PublishOptions | None = None,
    *,
    aliases: tuple[str, ...] | list[str] = (),
    client: RegistryClient | None = None,
    engine: Engine | None = None,
    evidence: Path | None = None,
    extra: dict[str, Any] | None = None,
    hooks: PublishHooks | None = None,
    tag_it: bool = True,
) -> PublishResult:
    """Publish ``image`` to ``repository`` under the first free revision of ``date``, as ``options`` say. See the
    module docstring. ``tag_it=False``: push it by digest only, or report the image of the ``listed`` hook it
    already is (see :class:`Publisher`).

    Raises ``UserError`` for bad input (exit 2) and ``BuildFailed`` (exit 1) when the publish
    fails; either way no new immutable tag is left behind unless the message says otherwise.
    When ``evidence`` is given, a success writes ``publish.json`` there and a failure writes
    ``publish-failed.json`` (an earlier ``publish.json`` stays), with ``extra`` fields (e.g. stack, target) first.
    ``hooks``: work to run in the settle pause and work that must be done before a tag names the image (see
    :class:`PublishHooks`).
    """
    options = options or PublishOptions()
    date = validate_date(date)
    repo = parse_repository(repository) if isinstance(repository, str) else repository
    log = PushLog(echo=options.echo)
    if client is None:
        client = RegistryClient(repo, policy=options.policy or RetryPolicy(), log=log)
    else:
        client.log = client.log or log
    pub = Publisher(
        client=client,
        image=image,
        scheme=scheme,
        date=date,
        aliases=tuple(aliases),
        options=options,
        engine=engine,
        log=log,
        hooks=hooks or PublishHooks(),
        tag_it=tag_it,
    )
    try:
        try:
            result = pub.run()
        except RegistryError as exc:
            left = pub.left_behind()
            raise BuildFailed(
                f"publish to {repo} failed: {exc}; {left}",
                fix="re-run the same command once the registry answers; uploaded blobs are reused",
            ) from None
    except (UserError, Interrupted) as err:
        interrupted = isinstance(err, Interrupted)
        message = f"interrupted by {err.name}; {pub.left_behind()}" if isinstance(err, Interrupted) else err.message
        log("interrupted" if interrupted else "failed", error=message)
        if evidence is not None:
            path = write_evidence(
                evidence,
                {
                    "status": "interrupted" if interrupted else "failed",
                    **(extra or {}),
                    "repository": str(repo),
                    "error": message,
                    "tag_left": pub.tag_written,
                    "image_id": pub.prepared.image_id if pub.prepared else image.image_id,
                    "started_at": pub.started_at,
                    "finished_at": _now(),
                    "duration_s": round(time.monotonic() - pub.t0, 3),
                    "push_log": log.events,
                },
                name=FAILED_RECORD,
            )
            if isinstance(err, Interrupted):
                err.notes.append(f"publish stopped: {message.split('; ', 1)[1]} (record: {path})")
        raise
    if evidence is not None:
        write_evidence(evidence, {**(extra or {}), **result.evidence()})
    return result


PUBLISHED_RECORD = "publish.json"
FAILED_RECORD = "publish-failed.json"


def write_evidence(evidence_dir: Path, record: dict[str, Any], name: str = PUBLISHED_RECORD) -> Path:
    """Write ``record`` to ``evidence_dir/name`` atomically (a unique temp file, then ``os.replace``).

    ``publish.json`` holds the last successful publish and only a success writes it; a failure goes to
    ``publish-failed.json``, which a later success removes, so neither file ever describes the other.
    """
    evidence_dir.mkdir(parents=True, exist_ok=True)
    path = evidence_dir / name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=evidence_dir)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(record, indent=2, sort_keys=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if name == PUBLISHED_RECORD:
        (evidence_dir / FAILED_RECORD).unlink(missing_ok=True)
    return path


def stderr_echo(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
