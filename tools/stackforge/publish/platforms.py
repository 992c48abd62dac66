"""One tag for every platform: an OCI image index over the platforms' images, tagged as one image is.

Each platform's image is pushed by digest first (``Publisher(tag_it=False)``: its blobs, its manifest, its signed
provenance before anything names it). The index lists their manifests, each with its platform, in the order the
stack declares its lines; its bytes depend on nothing but those manifests, so the same images give the same index
digest. :class:`IndexPublisher` then claims the first free ``-rN`` of the date for the index exactly as an image's
publish does (HEAD right before the PUT, the re-read, the settled re-read, the roll-back of a tag that reads back
altered), checks that the registry holds every platform's manifest under the index, and moves the aliases only
then: a platform that failed leaves no index and every alias where it was.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stackforge.clients.registry import OCI_INDEX, Manifest, sha256_digest
from stackforge.errors import BuildFailed
from stackforge.grammar import DIGEST_RE
from stackforge.publish.publisher import (
    Publisher,
    PublishOptions,
    PublishResult,
    PushLog,
    _Found,
    _now,
    repository_lock,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from stackforge.clients.registry import RegistryClient
    from stackforge.stack.scheme import TagScheme


@dataclass(frozen=True)
class Child:
    """One platform's image under the index: its pushed manifest and its OCI platform (``linux/arm64``)."""

    platform: str
    digest: str
    size: int
    media_type: str

    def descriptor(self) -> dict[str, Any]:
        os_name, _, rest = self.platform.partition("/")
        arch, _, variant = rest.partition("/")
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
            "platform": {"architecture": arch, "os": os_name, **({"variant": variant} if variant else {})},
        }


def index_body(children: list[Child]) -> bytes:
    """The index's bytes: a descriptor per platform, in the given order; compact and key-sorted, so equal
    children give equal bytes on every host."""
    platforms = [c.platform for c in children]
    if len(set(platforms)) != len(platforms):
        raise BuildFailed(f"two images for one platform in the index: {', '.join(platforms)}")
    doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [c.descriptor() for c in children]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class PreparedIndex:
    """The index as the publisher handles a prepared image: its bytes, media type and digest (its own "image id":
    an index has no config)."""

    children: list[Child]
    manifest: bytes = b""
    manifest_media_type: str = OCI_INDEX
    digest: str = ""
    size: int = 0
    source_id: None = None
    config: None = None

    def __post_init__(self) -> None:
        self.manifest = index_body(self.children)
        self.digest = sha256_digest(self.manifest)
        self.size = len(self.manifest) + sum(c.size for c in self.children)

    @property
    def image_id(self) -> str:
        return self.digest

    def unique_blobs(self) -> list:
        return []


@dataclass
class _IndexSource:
    """What the publisher's result says of its source."""

    description: str
    image_id: str
    local_size: int | None = None


@dataclass
class IndexPublisher(Publisher):
    """Tags an index whose platforms' images are already in the registry by digest."""

    index: PreparedIndex = field(default_factory=lambda: PreparedIndex([]))

    def run(self) -> PublishResult:
        self.prepared = img = self.index  # type: ignore[assignment]
        self.log("start-index", repository=str(self.repository), date=self.date, digest=img.digest,
                 platforms=[c.platform for c in img.children])  # fmt: skip
        self.client.ping()
        checked: set[str] = set()
        tags = self.client.list_tags()
        found = self._find_published(tags, img.digest, img.digest, checked)
        if found:
            return self._already(found, tags, img.digest)
        self._put_by_digest(img)  # type: ignore[arg-type]
        with repository_lock(self.repository, self.lock_dir, timeout=self.lock_timeout, log=self.log):
            outcome = self._tag(img, checked)  # type: ignore[arg-type]
            if not isinstance(outcome, _Found):
                tag, verification = outcome
                aliases = self._advance_aliases(tag, img.manifest, img.manifest_media_type, img.digest)
        if isinstance(outcome, _Found):
            return self._already((outcome.tag, outcome.manifest), self.client.list_tags(), img.digest)
        self.log("done", tag=tag, digest=img.digest)
        return self._result("published", tag, img.digest, img.digest, aliases, verification)

    def _already(self, found: tuple[str, Manifest], tags: list[str], image_id: str | None = None) -> PublishResult:
        tag, manifest = found
        self.log("already-published", tag=tag, digest=manifest.digest)
        verification = {"tag_digest": manifest.digest, "platforms": {c.platform: c.digest for c in self.index.children}}
        with repository_lock(self.repository, self.lock_dir, timeout=self.lock_timeout, log=self.log):
            aliases = self._advance_aliases(tag, manifest.body, manifest.media_type or OCI_INDEX, manifest.digest)
        return self._result("already-published", tag, manifest.digest, manifest.digest, aliases, verification)

    def _verify_tag(self, tag: str, img: Any, again: bool = False) -> dict[str, Any] | None:
        """Re-read the tag: the index's digest, and every platform's manifest present under it."""
        m = self.client.get_manifest(tag)
        if m is None:
            raise BuildFailed(f"tag {tag} vanished right after it was written", fix="check the registry; re-run")
        ok = m.digest == img.digest and m.header_digest in (None, img.digest)
        self.log("tag-reread-settled" if again else "tag-reread", tag=tag, digest=m.digest, expected=img.digest, ok=ok)
        if ok:
            if again:
                return {**self._verified, "settled_reread": True, "settle_seconds": round(self.settle(), 3)}
            missing = [c.platform for c in img.children if self.client.head_manifest(c.digest) is None]
            if missing:
                raise BuildFailed(
                    f"the registry lacks the image of {', '.join(missing)} under {tag}. "
                    + self._remove_tag(tag, img.digest),
                    fix="check the registry's storage; re-run the publish",
                )
            self._verified = {
                "tag_digest": m.digest,
                "header_digest": m.header_digest,
                "pushed_digest": img.digest,
                "platforms": {c.platform: c.digest for c in img.children},
                "manifests_present": len(img.children),
            }
            return {**self._verified, "settled_reread": again, "settle_seconds": 0}
        if _children(m) not in (None, [c.digest for c in img.children]) and m.header_digest in (None, m.digest):
            # Another index (or image) holds the tag: a publisher on another host wrote it between our HEAD and PUT.
            self.log("tag-lost", tag=tag, digest=m.digest)
            self.tag_written = self.tag_attempted = None
            return None
        rolled_back = self._roll_back(tag, m, img)
        raise BuildFailed(
            f"manifest digest mismatch for {self.repository}:{tag}: pushed {img.digest}, the tag returns {m.digest}; "
            "the index was altered between here and the registry. " + rolled_back,
            fix="publish around the proxy that rewrites manifests, then re-run",
        )


def _children(m: Manifest) -> list[str] | None:
    """The manifests an index lists (an image manifest: its own digest as its one entry); None when unreadable."""
    try:
        doc = m.json()
    except ValueError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("manifests"), list):
        return [str(d.get("digest")) for d in doc["manifests"] if isinstance(d, dict)]
    return [m.digest]


def publish_index(
    children: list[Child],
    client: RegistryClient,
    scheme: TagScheme,
    date: str,
    *,
    aliases: tuple[str, ...] = (),
    lock_dir: Path | None = None,
    settle_seconds: float | None = None,
    log: PushLog | None = None,
    description: str = "",
) -> PublishResult:
    """Tag the index over ``children`` (already pushed by digest) with the first free revision of ``date`` and
    move ``aliases`` after its verification; an index already published under a tag of the date is found."""
    index = PreparedIndex(children)
    pub = IndexPublisher(
        client=client,
        image=_IndexSource(description or f"index of {len(children)} platforms", index.digest),  # type: ignore[arg-type]
        scheme=scheme,
        date=date,
        aliases=aliases,
        options=PublishOptions(lock_dir=lock_dir, settle_seconds=settle_seconds, layer_cache=False),
        log=log or PushLog(),
        index=index,
    )
    t0 = time.monotonic()
    result = pub.run()
    pub.log("index", seconds=round(time.monotonic() - t0, 3), finished_at=_now())
    return result


def listing_tag(client: RegistryClient, scheme: TagScheme, date: str, digest: str, platform: str) -> str | None:
    """The newest tag of ``date`` (the scheme's ``-rN``) that holds an image index listing ``digest`` for
    ``platform`` (``linux/arm64``), or None: the tag a merge gave the index over a line already pushed by digest,
    which a record of that line attached again names (a re-run shard's record says no less than the merge's)."""
    for tag, m in _indexes_of(client, scheme, date):
        if (digest, platform) in _listed(m):
            return tag
    return None


def listed_children(client: RegistryClient, scheme: TagScheme, date: str, platform: str) -> list[str]:
    """The digests the indexes tagged on ``date`` list for ``platform``, the newest tag's first, each once: what a
    line pushed by digest again (a shard re-run after the merge) may already be."""
    out: list[str] = []
    for _tag, m in _indexes_of(client, scheme, date):
        out += [d for d, p in _listed(m) if p == platform and d not in out]
    return out


def _indexes_of(client: RegistryClient, scheme: TagScheme, date: str) -> Iterator[tuple[str, Manifest]]:
    """(tag, manifest) of each tag of ``date``, the newest revision first."""
    for _rev, tag in sorted(scheme.revisions(client.list_tags(), date).items(), reverse=True):
        m = client.get_manifest(tag)
        if m is not None:
            yield tag, m


def _listed(m: Manifest) -> list[tuple[str, str]]:
    """(digest, platform ``os/architecture[/variant]``) of each image the index ``m`` lists by a well-formed digest
    (a registry's answer: what it lists is asked for again by that digest); none when ``m`` is no image index."""
    try:
        doc = m.json()
    except ValueError:
        return []
    entries = doc.get("manifests") if isinstance(doc, dict) and doc.get("mediaType") == OCI_INDEX else None
    out = []
    for entry in entries if isinstance(entries, list) else []:
        p = entry.get("platform") if isinstance(entry, dict) else None
        if isinstance(p, dict) and isinstance(entry.get("digest"), str) and DIGEST_RE.match(entry["digest"]):
            platform = f"{p.get('os')}/{p.get('architecture')}" + (f"/{p['variant']}" if p.get("variant") else "")
            out.append((entry["digest"], platform))
    return out
