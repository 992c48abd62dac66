"""``stackforge copy SRC DST``: a published image copied with everything attached to it, by digest.

:func:`plan` reads the source and writes nothing: the manifest ``SRC`` names (an image manifest, or an image index
and every manifest it lists, recursively), every manifest attached to each of them as an OCI 1.1 referrer (found
through the referrers API, else the tag-schema fallback ``sha256-<hex>``; referrers of referrers too), and
cosign's tags (``sha256-<hex>.att``, ``.sig``, ``.sbom``). Every manifest is read within the 4 MiB cap and checked
against the digest that names it; a referrer whose ``subject`` is not the manifest it is listed for, a descriptor
that is not one, a media type that is neither an image manifest nor an index, or more than
:data:`MAX_MANIFESTS` manifests refuse the copy before anything is written.

:func:`copy` then writes the destination in an order that leaves no tag naming an image whose proof is not there
yet: the blobs (one the destination holds is skipped; one in another repository of the same registry is mounted;
the rest streamed through a temporary file, checked against its digest, and uploaded, four at a time); every
manifest by digest, byte for byte (so every digest, and each referrer's ``subject``, is unchanged), children before
their index and a subject before its referrers; where the destination has no referrers API, the fallback tag of
each subject (the referrers it lacks added to the index it holds, as the publisher does); cosign's tags; and last
the destination's tag, read back. A second run finds everything and writes nothing; a run cut off part-way
completes on the next.
"""

from __future__ import annotations

import functools
import json
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import progress, signals
from stackforge.clients.registry import (
    BLOB_LIMIT,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    OCI_INDEX,
    OCI_MANIFEST,
    RegistryClient,
    RegistryError,
    Repository,
    RetryPolicy,
    sha256_digest,
    split_ref,
)
from stackforge.errors import BuildFailed, UserError
from stackforge.grammar import DIGEST_RE, TAG_RE
from stackforge.publish import attest, referrers
from stackforge.publish import record as records
from stackforge.publish.transfer import UPLOADS
from stackforge.urls import redact_text

IMAGE_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_MANIFEST_LIST)
#: the most manifests one copy reads (images, platform manifests, referrers, cosign's), and how deep indexes nest
#: and referrers refer to referrers
MAX_MANIFESTS = 1000
MAX_DEPTH = 4
COSIGN_SUFFIXES = (".att", ".sig", ".sbom")
#: a blob at least this large says on stderr when it has been copied
NOTED = 1 << 20
#: what an artifact type is called in messages
KINDS = {
    records.ARTIFACT_TYPE: "publish record",
    attest.PROVENANCE.artifact_type: "signed provenance",
    attest.SBOM.artifact_type: "SBOM",
}


#: a manifest's role as the report names it, one and several
ROLES = {
    "image": ("image", "images"),
    "index": ("index", "indexes"),
    "child": ("platform manifest", "platform manifests"),
    "referrer": ("referrer", "referrers"),
    "cosign": ("cosign tag", "cosign tags"),
}


class Refused(BuildFailed):
    """The source serves something a copy must not carry: nothing was written to the destination."""


# -- the plan: what the source holds ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    media_type: str


@dataclass
class Node:
    """One manifest to copy, byte for byte: its role (``image``, ``index``, ``child`` of an index, ``referrer``,
    ``cosign``), the blobs it names, the subject a referrer names, and the cosign tags that name it."""

    digest: str
    media_type: str
    body: bytes
    role: str
    blobs: list[Blob] = field(default_factory=list)
    subject: str | None = None
    artifact_type: str | None = None
    annotations: dict[str, str] | None = None
    tags: list[str] = field(default_factory=list)

    def entry(self) -> dict[str, Any]:
        """Its descriptor in a referrers index (what the referrers API lists for it)."""
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": len(self.body)}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    @property
    def kind(self) -> str:
        return KINDS.get(self.artifact_type or "", self.artifact_type or self.media_type)


@dataclass
class Plan:
    """Everything a copy of ``reference`` in ``source`` writes: ``nodes`` in write order (an index's children before
    it, a subject before its referrers), ``attached`` each subject's referrers (digests, in the source's order)."""

    source: Repository
    reference: str
    digest: str
    nodes: list[Node]
    attached: dict[str, list[str]]

    @property
    def root(self) -> Node:
        return next(n for n in self.nodes if n.digest == self.digest)

    def node(self, digest: str) -> Node:
        return next(n for n in self.nodes if n.digest == digest)

    def blobs(self) -> list[Blob]:
        """Every blob, once, in the order the manifests name them."""
        seen: dict[str, Blob] = {}
        for node in self.nodes:
            for blob in node.blobs:
                seen.setdefault(blob.digest, blob)
        return list(seen.values())

    def kinds(self) -> list[str]:
        """What is attached, by kind (``publish record``, ``signed provenance``, ``SBOM``, other artifact types)."""
        return list(dict.fromkeys(n.kind for n in self.nodes if n.role == "referrer"))


def plan(client: RegistryClient, reference: str) -> Plan:
    """Read what a copy of ``reference`` (a tag or a digest) in ``client``'s repository writes; nothing is written.
    A :class:`Refused` names what in the source is refused."""
    planner = _Planner(client)
    root = planner.visit(reference, role="root", depth=0, expect=reference if DIGEST_RE.fullmatch(reference) else None)
    assert root is not None
    return Plan(client.repository, reference, root.digest, planner.order, planner.attached)


class _Planner:
    def __init__(self, client: RegistryClient):
        self.client = client
        self.seen: dict[str, Node] = {}
        self.order: list[Node] = []
        self.attached: dict[str, list[str]] = {}

    def refuse(self, problem: str) -> Refused:
        return Refused(f"{self.client.repository}: {problem}; refused, nothing was copied",
                       fix="copy from a source that serves what it lists (check the source registry)")  # fmt: skip

    def read(self, reference: str, expect: str | None, role: str, optional: bool) -> tuple[bytes, str, dict] | None:
        got = self.client.get_manifest(reference)
        if got is None and role == "root":
            raise UserError(f"{self.client.repository.ref(reference)}: the registry has no such image", file="SRC",
                            fix="check the reference (`stackforge publish` prints it)")  # fmt: skip
        if got is None:
            if optional:
                return None
            raise self.refuse(f"{reference} is listed, but the registry has no such manifest")
        if expect is not None and got.digest != expect:
            raise self.refuse(f"asked for {expect}, the registry served bytes with digest {got.digest}")
        if got.header_digest and got.header_digest != got.digest:
            raise self.refuse(f"{reference}: the registry says {got.header_digest[:80]}, its bytes are {got.digest}")
        doc = got.json()
        media = doc.get("mediaType")
        if not isinstance(media, str):
            media = (got.media_type or "").split(";")[0].strip()
        if media not in IMAGE_TYPES + INDEX_TYPES:
            raise self.refuse(
                f"manifest {got.digest} has the media type {media[:80]!r}: not an image manifest or index"
            )
        return got.body, media, doc

    def visit(
        self,
        reference: str,
        *,
        role: str,
        depth: int,
        expect: str | None = None,
        subject: str | None = None,
        optional: bool = False,
    ) -> Node | None:
        if expect in self.seen:
            return self.seen[expect]
        if len(self.seen) >= MAX_MANIFESTS:
            raise self.refuse(f"more than {MAX_MANIFESTS} manifests to copy (the limit)")
        got = self.read(reference, expect, role, optional)
        if got is None:
            return None
        body, media, doc = got
        digest = sha256_digest(body)
        if digest in self.seen:
            if role == "cosign":
                self.seen[digest].tags.append(reference)
            return self.seen[digest]
        root = role == "root"
        node = Node(digest, media, body, ("index" if media in INDEX_TYPES else "image") if root else role)
        node.tags = [reference] if role == "cosign" else []
        self.seen[digest] = node
        if subject is not None:
            self._check_subject(doc, digest, subject)
        if media in INDEX_TYPES:
            self._children(doc, digest, depth)
        else:
            node.blobs = self._blobs(doc, digest)
        if role == "referrer":
            config = doc.get("config")
            kind = doc.get("artifactType") or (config.get("mediaType") if isinstance(config, dict) else None)
            node.artifact_type = kind if isinstance(kind, str) else None
            notes = doc.get("annotations")
            if isinstance(notes, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in notes.items()):
                node.annotations = notes
        self.order.append(node)
        if role != "cosign" and depth < MAX_DEPTH:
            self._referrers(node, depth)
        if role in ("root", "child"):
            for suffix in COSIGN_SUFFIXES:
                self.visit(referrers.fallback_tag(digest) + suffix, role="cosign", depth=depth + 1, optional=True)
        return node

    def _check_subject(self, doc: dict[str, Any], digest: str, subject: str) -> None:
        named = doc.get("subject")
        shown = named.get("digest") if isinstance(named, dict) else None
        if shown != subject:
            raise self.refuse(f"referrer {digest} is listed for {subject} but names the subject {str(shown)[:80]}")

    def _children(self, doc: dict[str, Any], digest: str, depth: int) -> None:
        listed = doc.get("manifests")
        if not isinstance(listed, list):
            raise self.refuse(f"index {digest} has no list of manifests")
        if depth >= MAX_DEPTH:
            raise self.refuse(f"index {digest} nests deeper than {MAX_DEPTH} indexes")
        for desc in listed:
            problem = referrers.descriptor_problem(desc, referrers.MANIFEST_LIMIT)
            if problem:
                raise self.refuse(f"a manifest listed by index {digest} {problem}")
            self.visit(desc["digest"], role="child", depth=depth + 1, expect=desc["digest"])

    def _blobs(self, doc: dict[str, Any], digest: str) -> list[Blob]:
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise self.refuse(f"image manifest {digest} has no list of layers")
        out = []
        for desc in [doc.get("config"), *layers]:
            problem = referrers.descriptor_problem(desc, BLOB_LIMIT)
            if problem:
                raise self.refuse(f"a blob of manifest {digest} {problem}")
            out.append(Blob(desc["digest"], desc["size"], desc["mediaType"]))
        return out

    def _referrers(self, node: Node, depth: int) -> None:
        index = self.client.get_referrers(node.digest)
        if index is None:
            tag = referrers.fallback_tag(node.digest)
            got = self.client.get_manifest(tag)
            index = got.json() if got is not None else {"manifests": []}
            if not isinstance(index.get("manifests"), list):
                raise self.refuse(f"the tag {tag} is not an index of the referrers of {node.digest}")
        listed = index.get("manifests")
        for desc in listed if isinstance(listed, list) else []:
            problem = referrers.descriptor_problem(desc, referrers.MANIFEST_LIMIT)
            if problem:
                raise self.refuse(f"a referrer listed for {node.digest} {problem}")
            found = self.visit(desc["digest"], role="referrer", depth=depth + 1, expect=desc["digest"],
                               subject=node.digest)  # fmt: skip
            assert found is not None
            if found.role != "referrer":
                raise self.refuse(f"{found.digest} is listed as a referrer of {node.digest}, and is the {found.role}")
            if found.subject not in (None, node.digest):
                raise self.refuse(f"referrer {found.digest} is listed for {node.digest} but names the subject "
                                  f"{found.subject}")  # fmt: skip
            found.subject = node.digest
            listed_here = self.attached.setdefault(node.digest, [])
            if found.digest not in listed_here:
                listed_here.append(found.digest)


# -- the copy: what the destination gets ------------------------------------------------------------------------


@dataclass
class Copied:
    """What one copy did: each manifest, blob and tag with how (``copied``/``uploaded``/``mounted``/``written``/
    ``moved``, or ``present``/``kept`` when the destination had it)."""

    source: str
    destination: str
    digest: str
    pinned: str
    referrers: str  # "referrers API" | "tag-schema"
    attached: list[str]
    manifests: list[dict[str, Any]] = field(default_factory=list)
    blobs: list[dict[str, Any]] = field(default_factory=list)
    tags: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for what in ("manifests", "blobs", "tags"):
            seen: dict[str, int] = {}
            for item in getattr(self, what):
                seen[item["status"]] = seen.get(item["status"], 0) + 1
            out[what] = seen
        return out

    @property
    def uploaded_bytes(self) -> int:
        return sum(b["size"] for b in self.blobs if b["status"] == "uploaded")

    @property
    def wrote(self) -> bool:
        """Whether anything was written to the destination."""
        done = ("copied", "uploaded", "mounted", "written", "moved")
        return any(i["status"] in done for i in [*self.manifests, *self.blobs, *self.tags])

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "digest": self.digest,
            "pinned": self.pinned,
            "referrers": self.referrers,
            "attached": self.attached,
            "counts": self.counts(),
            "uploaded_bytes": self.uploaded_bytes,
            "manifests": self.manifests,
            "blobs": self.blobs,
            "tags": self.tags,
        }

    def lines(self) -> list[str]:
        def said(what: str) -> str:
            return ", ".join(f"{n} {status}" for status, n in self.counts()[what].items()) or "none"

        roles: dict[str, int] = {}
        for m in self.manifests:
            roles[m["role"]] = roles.get(m["role"], 0) + 1
        named = ", ".join(f"{n} {ROLES[r][n != 1]}" for r, n in roles.items())
        blobs = said("blobs") + (
            f" ({progress.human_bytes(self.uploaded_bytes)} uploaded)" if self.uploaded_bytes else ""
        )
        return [
            f"{'copied' if self.wrote else 'already copied'}: {self.source} -> {self.destination}",
            f"  digest     {self.digest}",
            f"  manifests  {len(self.manifests)} ({named}): {said('manifests')}",
            f"  blobs      {len(self.blobs)}: {blobs}",
            f"  attached   {', '.join(self.attached) or 'nothing'} (at the destination through the {self.referrers})",
            *(f"  tag        {t['tag']} {t['status']}" + (f" (was {t['previous']})" if t.get("previous") else "")
              for t in self.tags),
            f"pinned: {self.pinned}",
        ]  # fmt: skip


def references(src: str, dst: str) -> tuple[Repository, str, Repository, str]:
    """(source repository, its tag or digest, destination repository, its tag or digest) of ``SRC`` and ``DST``. A
    ``DST`` that names no tag or digest takes the source's."""
    source, reference = split_ref(src)
    _check(reference, src, "SRC")
    target, given = split_ref(dst)
    explicit = "@" in dst or ":" in dst.rsplit("/", 1)[-1]
    if explicit:
        _check(given, dst, "DST")
    return source, reference, target, given if explicit else reference


def _check(reference: str, text: str, what: str) -> None:
    if reference.startswith("sha256:"):
        if not DIGEST_RE.fullmatch(reference):
            raise UserError(f"{redact_text(text)}: {reference[:80]!r} is not a digest sha256:<64 hex digits>", file=what,
                            fix="give HOST/NAME:TAG or HOST/NAME@sha256:…")  # fmt: skip
    elif not TAG_RE.fullmatch(reference):
        raise UserError(f"{redact_text(text)}: {reference[:140]!r} is not a tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})",
                        file=what, fix="give HOST/NAME:TAG or HOST/NAME@sha256:…")  # fmt: skip


def copy(
    src: str,
    dst: str,
    policy: RetryPolicy | None = None,
    echo: Callable[[str], None] | None = None,
    clients: tuple[RegistryClient, RegistryClient] | None = None,
) -> Copied:
    """Copy the image ``src`` names, with everything attached to it, to ``dst`` (see the module). Each side's
    credentials are its own registry's (``clients/credentials.py``). ``clients``: the (source, destination) clients
    to use (tests)."""
    source, reference, target, wanted = references(src, dst)
    policy = policy or RetryPolicy()
    src_client, dst_client = clients or (RegistryClient(source, policy=policy), RegistryClient(target, policy=policy))
    try:
        with progress.step(f"copy: read {source.ref(reference)} and what is attached to it", echo):
            p = plan(src_client, reference)
    except RegistryError as exc:
        raise BuildFailed(f"cannot read {redact_text(src)}: {exc}; nothing was copied",
                          fix="check the reference and that the registry answers") from None  # fmt: skip
    if wanted.startswith("sha256:") and wanted != p.digest:
        raise UserError(f"DST names {wanted}, but {redact_text(src)} is {p.digest}", file="DST",
                        fix="name the destination by a tag, or by the source's digest")  # fmt: skip
    tag = None if wanted.startswith("sha256:") else wanted
    blobs = p.blobs()
    progress.note(f"copy: {len(p.nodes)} manifests ({', '.join(p.kinds()) or 'nothing'} attached), {len(blobs)} "
                  f"blobs ({progress.human_bytes(sum(b.size for b in blobs))})", echo)  # fmt: skip
    writer = _Writer(p, src_client, dst_client, echo)
    try:
        return writer.run(blobs, tag, src, f"{target.ref(wanted)}")
    except RegistryError as exc:
        raise BuildFailed(f"copy to {target.ref(wanted)} stopped: {exc}",
                          fix="run the same copy again: what the destination already holds is skipped, and its tag "
                              "is written last") from None  # fmt: skip


@dataclass
class _Writer:
    plan: Plan
    src: RegistryClient
    dst: RegistryClient
    echo: Callable[[str], None] | None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, blobs: list[Blob], tag: str | None, src: str, dst: str) -> Copied:
        p = self.plan
        api = self.dst.get_referrers(p.digest) is not None
        out = Copied(redact_text(src), dst, p.digest, self.dst.repository.ref(p.digest),
                     "referrers API" if api else "tag-schema", p.kinds())  # fmt: skip
        out.blobs = self._blobs(blobs)
        for node in p.nodes:
            out.manifests.append({**self._manifest(node), "role": node.role, "media_type": node.media_type,
                                  **({"artifact_type": node.artifact_type} if node.artifact_type else {}),
                                  **({"subject": node.subject} if node.subject else {})})  # fmt: skip
        if not api:
            for subject, listed in p.attached.items():
                out.tags.append(self._fallback(subject, [p.node(d).entry() for d in listed]))
        for node in p.nodes:
            for name in node.tags:
                out.tags.append(self._cosign(node, name))
        if tag is not None:
            out.tags.append(self._tag(tag))
        return out

    # -- blobs -------------------------------------------------------------------------------------------------

    def _blobs(self, blobs: list[Blob]) -> list[dict[str, Any]]:
        pool = ThreadPoolExecutor(UPLOADS, thread_name_prefix="copy")
        with tempfile.TemporaryDirectory(prefix="stackforge-copy-") as tmp:
            try:
                futures = [pool.submit(self._blob, blob, Path(tmp)) for blob in blobs]
                done, first = [], None
                for blob, fut in zip(blobs, futures, strict=True):
                    try:
                        done.append({"digest": blob.digest, "size": blob.size, "status": signals.result(fut)})
                    except Exception as exc:  # the others still finish: a re-run skips them
                        first = first or exc
            finally:  # interrupted: what has not started does not start
                pool.shutdown(wait=True, cancel_futures=True)
            if first is not None:
                raise first
            return done

    def _blob(self, blob: Blob, tmp: Path) -> str:
        if self.dst.blob_exists(blob.digest):
            return "present"
        src, dst = self.src.repository, self.dst.repository
        mountable = (src.host, src.scheme) == (dst.host, dst.scheme) and src.name != dst.name
        if mountable and self.dst.mount_blob(blob.digest, src.name):
            return "mounted"
        path = tmp / blob.digest.replace(":", "-")
        moving = progress.Transfer(f"copy: blob {blob.digest[:19]}", blob.size, self.echo)
        try:
            self.src.download_blob(blob.digest, blob.size, path, moving.advance)
            self.dst.upload_blob(blob.digest, blob.size, functools.partial(open, path, "rb"))
        finally:
            path.unlink(missing_ok=True)
        if blob.size >= NOTED:
            moving.finish()
        return "uploaded"

    # -- manifests and tags ------------------------------------------------------------------------------------

    def _manifest(self, node: Node) -> dict[str, Any]:
        if self.dst.head_manifest(node.digest) is not None:
            return {"digest": node.digest, "status": "present"}
        stored = self.dst.put_manifest(node.digest, node.body, node.media_type)
        if stored and stored != node.digest:
            raise RegistryError(f"the destination stored {node.digest} as {stored[:80]}")
        return {"digest": node.digest, "status": "copied"}

    def _fallback(self, subject: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """The fallback tag of ``subject``: the referrers it does not list yet added to the index it holds."""
        tag = referrers.fallback_tag(subject)
        current = self.dst.get_manifest(tag)
        try:
            existing = current.json() if current is not None else None
        except ValueError:
            existing = None
        listed = existing.get("manifests") if existing is not None else None
        kept = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
        have = {m.get("digest") for m in kept}
        new = [e for e in entries if e["digest"] not in have]
        if not new and existing is not None and existing.get("mediaType") == OCI_INDEX:
            return {"tag": tag, "digest": current.digest if current else None, "status": "present"}
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*kept, *new]}
        body = json.dumps(index, indent=2).encode()
        self.dst.put_manifest(tag, body, OCI_INDEX)
        return {"tag": tag, "digest": sha256_digest(body), "status": "written", "added": [e["digest"] for e in new]}

    def _cosign(self, node: Node, tag: str) -> dict[str, Any]:
        """cosign's tag: written when the destination lacks it or holds a part of it (its layers among ours); kept
        when the destination's holds a layer the source's lacks (signed there too)."""
        current = self.dst.get_manifest(tag)
        if current is not None and current.digest == node.digest:
            return {"tag": tag, "digest": node.digest, "status": "present"}
        if current is not None:
            ours = {b.digest for b in node.blobs}
            try:
                layers = current.json().get("layers")
                theirs = {x.get("digest") for x in layers if isinstance(x, dict)} if isinstance(layers, list) else set()
            except ValueError:
                theirs = set()
            if not theirs <= ours:
                return {"tag": tag, "digest": current.digest, "status": "kept"}
        self.dst.put_manifest(tag, node.body, node.media_type)
        return {"tag": tag, "digest": node.digest, "status": "written"}

    def _tag(self, tag: str) -> dict[str, Any]:
        root = self.plan.root
        info = self.dst.head_manifest(tag)
        if info is not None and info.digest == root.digest:
            return {"tag": tag, "digest": root.digest, "status": "present"}
        self.dst.put_manifest(tag, root.body, root.media_type)
        back = self.dst.get_manifest(tag)
        if back is None or back.digest != root.digest:
            raise RegistryError(f"the tag {tag} reads back as {back.digest if back else 'nothing'}, not {root.digest}")
        previous = info.digest if info is not None else None
        return {"tag": tag, "digest": root.digest, "status": "moved" if previous else "written",
                **({"previous": previous} if previous else {})}  # fmt: skip
