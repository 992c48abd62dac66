"""Operators without the build host: ``stackforge pull`` and ``stackforge verify REF`` with no checkout.

:func:`verify_ref` checks a published image from the registry and the image alone: the reference's
manifest digest, the publish record attached to it (:mod:`stackforge.publish.record`), the record against
that digest and against the image's labels, the stack files embedded in the image against their label
(:mod:`stackforge.builder.context.embed`) and the record, then loads the stack from those files and re-runs the
checks of ``stackforge verify`` (labels against the stack's pins and fingerprint, gate and ABI in the image
with a read-only root). An overlay image's record and labels are checked by
:func:`stackforge.overlay.record.check_ref` first (its base's stack, when the image carries one, as above).
Every check is one ``PASS``/``FAIL`` line; a record that does not describe the pulled image (another digest, a
changed pin, overlay labels the record does not name) fails. The record and the signature bind the digest, not the
repository: read from another repository than the record's (a ``stackforge copy``), the record's tag is checked
only where that repository has it. An image with no record attached (a copy by tag alone) fails naming what is
missing there and the command that copies an image with it.

:func:`newest` resolves the newest ``-rN`` of a date (default: the newest date) from the registry's tags, with
the stack's tag scheme; :func:`newest_published` does it with no checkout, reading the scheme off the tags.
"""

from __future__ import annotations

import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge import signals
from stackforge.builder.context import embed
from stackforge.builder.context.embed import load_embedded
from stackforge.builder.plan.plan import LABEL_NS
from stackforge.builder.records import sbom
from stackforge.builder.run.verify import Verification, line_of, verify
from stackforge.clients.engine import config_of, image_files, labels_of
from stackforge.clients.registry import (
    DOCKER_MANIFEST_LIST,
    OCI_INDEX,
    RegistryClient,
    RegistryError,
    RetryPolicy,
    split_ref,
)
from stackforge.errors import UserError, printable
from stackforge.grammar import DIGEST_RE
from stackforge.overlay.record import check_ref
from stackforge.publish import attest
from stackforge.publish import record as records
from stackforge.stack.scheme import TagScheme, pattern, streams

if TYPE_CHECKING:
    from stackforge.clients.engine import Engine

PIN = f"{LABEL_NS}.pin."
OVERLAY = f"{LABEL_NS}.overlay"
#: each phase of a ``verify REF``'s registry reads ends within this, however slow the registry: the reference and
#: its index; each image's manifest, record and tag; the reads after its pull (SBOM, overlay, a config the engine
#: does not describe); a rebuild's config read. A pull or a rebuild between them, minutes for a big image, is not
#: the registry's time.
VERIFY_SECONDS = 60.0
#: an index entry's platform as it is shown and matched (os/architecture[/variant])
PLATFORM = re.compile(r"[a-z0-9]{1,16}/[a-z0-9_]{1,16}(?:/[a-z0-9]{1,8})?")
#: ``uname -m`` names of OCI architectures: --platform aarch64 picks linux/arm64
ARCH_ALIASES = {"aarch64": "arm64", "x86_64": "amd64"}
#: the platforms of one index checked at once, at most. What runs at once is the engine's: each platform pulls its
#: image, runs its checks in containers and with --rebuild a clean build with cache mounts of its own (as much disk
#: as its downloads and compiles). The case it is for is two (the host's own line beside one under emulation, the
#: host's compiles and downloads beside the emulated ones); an index of more shares one engine's cores and disk
#: among four at most, the rest waiting their turn, and four threads are few enough for any host.
PLATFORMS_AT_ONCE = 4
_ECHO = threading.Lock()


def _tags(client: RegistryClient) -> list[str]:
    """The repository's tags; an unreachable registry is the user's to fix, not a traceback."""
    try:
        return client.list_tags()
    except RegistryError as exc:
        raise UserError(f"{client.repository}: cannot list its tags: {exc}",
                        fix="check the registry address and that it answers") from None  # fmt: skip


def newest(client: RegistryClient, scheme: TagScheme, date: str | None) -> tuple[str, str]:
    """(tag, date) of the newest ``-rN`` of ``date`` (or of the newest date) among the repository's tags."""
    parsed = [(p, t) for t in _tags(client) if (p := scheme.parse(t))]
    if date is not None:
        parsed = [(p, t) for p, t in parsed if p[0] == date]
    if not parsed:
        raise UserError(f"{client.repository}: no published tag" + (f" of {date}" if date else ""),
                        fix="check --registry and --date (`stackforge tags STACK --registry R` shows the scheme)")  # fmt: skip
    (day, _), tag = max(parsed)
    return tag, day


def newest_published(client: RegistryClient, date: str | None, select: str | None) -> tuple[str, str]:
    """(tag, date) of the newest ``-rN`` in a repository read with no checkout: its tags are grouped by the scheme
    that renders them (:func:`stackforge.stack.scheme.streams`); ``select`` (a scheme as :func:`pattern` shows
    it, or what its tags start with before the date) keeps some; exactly one scheme must remain."""
    found = streams(_tags(client))
    if select is not None:
        found = {s: t for s, t in found.items() if pattern(s) == select or (select and s.head.startswith(select))}
    if not found:
        raise UserError(f"{client.repository}: no published tag <…>YYYYMMDD-rN<…>" + (f" matching {select!r}" if select else ""),
                        file="--tags" if select else None,
                        fix="check the repository and --tags (the tags `stackforge publish` printed)")  # fmt: skip
    if len(found) > 1:
        listed = "; ".join(
            f"{pattern(s)} (newest {s.newest(t)})" for s, t in sorted(found.items(), key=lambda i: pattern(i[0]))
        )
        raise UserError(f"{client.repository} holds {len(found)} tag schemes: {listed}",
                        fix="pick one with --tags PATTERN (as listed, or what its tags start with before the date)")  # fmt: skip
    ((scheme, _),) = found.items()
    return newest(client, scheme, date)


def _pull(engine: Engine, pinned: str) -> None:
    proc = engine.pull(pinned, timeout=3600)
    if proc.returncode != 0:
        raise UserError(f"docker pull {pinned} failed: {(proc.stderr or proc.stdout).strip()[-300:]}",
                        fix="check the registry is reachable from the engine (a loopback registry is insecure-allowed)")  # fmt: skip


def _described(engine: Engine, pinned: str, manifest: Any, client: RegistryClient, v: Verification) -> dict[str, Any]:
    """What the engine says of the pulled image ``pinned`` (``docker image inspect``). The containerd image store of
    Docker 28 names a pulled image by its manifest, and reports no platform and no config for a manifest whose
    layers it did not fetch; it fetches none when it holds their snapshots already under another manifest (the
    image built here, published with layers of its own compression). Then the config blob the manifest names, read
    from the registry with its digest and size checked (the bytes the engine holds under that digest), stands for
    the engine's description, and a note says so."""
    attrs = engine.image_attrs(pinned)
    if attrs.get("Id") != manifest.digest or attrs.get("Os") or attrs.get("Architecture"):
        return attrs
    try:
        doc = client.config_of(manifest.json())
    except (RegistryError, ValueError) as exc:
        v.add(False, f"image   the engine reports no config for {manifest.digest}, and the registry's cannot be read: "
              f"{printable(exc)}")  # fmt: skip
        return attrs
    v.lines.append(f"note    the engine reports no config for {manifest.digest} (the containerd image store fetched none "
                   f"of its layers, holding their snapshots already): labels and config read from its config blob "
                   f"{_config_digest(manifest)}")  # fmt: skip
    rootfs = doc.get("rootfs")
    return {
        **attrs,
        "Config": doc.get("config") if isinstance(doc.get("config"), dict) else {},
        "Os": doc.get("os"),
        "Architecture": doc.get("architecture"),
        "Variant": doc.get("variant"),
        "Created": doc.get("created"),
        "RootFS": {"Type": "layers", "Layers": rootfs.get("diff_ids") if isinstance(rootfs, dict) else []},
    }


def host_platform(engine: Engine) -> str:
    """The engine's own OCI platform (``linux/amd64``): the image of an index ``pull`` and ``verify`` pick."""
    text = engine.server_platform()
    if not re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+", text):
        raise UserError("the engine does not say its platform (docker version)", fix="name one with --platform")
    return text


def index_entries(doc: Any) -> list[tuple[str, str]] | None:
    """An image index's (platform, manifest digest) pairs, in its order; None when ``doc`` is no image index."""
    if not isinstance(doc, dict) or doc.get("mediaType") not in (OCI_INDEX, DOCKER_MANIFEST_LIST):
        return None
    out = []
    for entry in doc.get("manifests") or []:
        p = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(p, dict) or not isinstance(entry.get("digest"), str):
            continue  # an attestation or another entry that names no platform
        name = f"{p.get('os')}/{p.get('architecture')}" + (f"/{p['variant']}" if p.get("variant") else "")
        if PLATFORM.fullmatch(name) and DIGEST_RE.fullmatch(entry["digest"]):
            out.append((name, entry["digest"]))
    return out


def _matches(platform: str, asked: str) -> bool:
    """Whether the index's ``platform`` is the one asked (linux/arm64, arm64 or aarch64)."""
    arch = platform.split("/")[1]
    return asked in (platform, arch) or ARCH_ALIASES.get(asked) == arch


def verify_ref(
    ref: str,
    engine: Engine,
    policy: RetryPolicy | None = None,
    key: Path | None = None,
    rebuild_from: Path | None = None,
    *,
    platform: str | None = None,
    all_platforms: bool = False,
) -> Verification:
    """Check the published image ``ref`` from the registry and the image alone (see the module); with ``key``
    (a PEM public key), also its signed provenance; with ``rebuild_from`` (a checkout), rebuild it from its record
    there and compare (``flows/rebuild.py``). An image index (``publish --platform all``) is checked for the
    engine's own platform, the ``platform`` asked, or every platform it lists (``all_platforms``): each image from
    its own record, its record's tag resolving to the index that lists it."""
    repo, reference = split_ref(ref)
    client = RegistryClient(repo, policy=policy or RetryPolicy()).budget(VERIFY_SECONDS)
    try:
        manifest = client.get_manifest(reference)
    except RegistryError as exc:
        raise UserError(f"{ref}: {exc}", fix="check the reference and that the registry answers") from None
    if manifest is None:
        raise UserError(f"{ref}: the registry has no such image", file="REF")
    try:
        entries = index_entries(manifest.json())
    except ValueError:
        entries = None
    if entries is None:
        if platform is not None or all_platforms:
            flag = "--all-platforms" if all_platforms else "--platform"
            raise UserError(f"{ref} is one image, not an index of platforms", file=flag, fix=f"leave out {flag}")
        return _verify_image(ref, engine, policy, key, rebuild_from, client, reference, manifest)
    v = Verification(ref, "?")
    v.image = f"{repo}@{manifest.digest}"
    listed = ", ".join(p for p, _ in entries) or "no platform"
    v.add(bool(entries), f"index   {ref} resolves to {manifest.digest}, an index of {listed}")
    asked = None if all_platforms else (platform or host_platform(engine))
    chosen = [(p, d) for p, d in entries if asked is None or _matches(p, asked)]
    if asked is not None and not chosen:
        v.add(False, f"platform {asked}: the index holds no image for it ({listed}); pick one with --platform")
        return v
    at_once = len(chosen) > 1

    def check(name: str, digest: str) -> Verification:
        # at once, each build's BuildKit log on stderr says whose it is (two builds' step numbers meet there)
        echo = _prefixed(name) if at_once and rebuild_from is not None else None
        own = client.within(VERIFY_SECONDS)  # a platform checked after another's pull has its own budget
        return _verify_image(f"{repo}@{digest}", engine, policy, key, rebuild_from, own, digest,
                             own.get_manifest(digest), index=(manifest.digest, name), echo=echo)  # fmt: skip

    for (name, digest), one in zip(chosen, each_platform(chosen, check)):
        v.add(True, f"platform {name} {repo}@{digest}")
        v.lines.extend(one.lines)
        v.failed += one.failed
        v.stack = one.stack  # the index's last platform's, as its lines are the last
        v.record_tests, v.record_smoke = one.record_tests, one.record_smoke
        if len(chosen) == 1:
            v.image = one.image  # what `pull` tags: the platform's image
    return v


def each_platform(chosen: list[tuple[str, str]], check: Callable[[str, str], Verification]) -> list[Verification]:
    """``check(platform, digest)`` of every chosen platform of an index, at once (at most
    :data:`PLATFORMS_AT_ONCE`, one thread each), the results in the index's order, however they finish.

    Each platform's check is whole in its own thread: its pull, checks and rebuild (its own scratch repository,
    build directory, clean cache mounts and local tag; ``flows/rebuild.py``), its lines in its own
    :class:`Verification`. A failing check is lines like any other. An exception in one (a UserError, a failed
    rebuild, a bug) stops the others as an interrupt would (their builds and commands ended, their tags put back),
    then the first of the index's order is raised, as it was when the platforms ran one after the other. An
    interrupt of this thread (SIGINT, SIGTERM) stops them the same way (:class:`stackforge.signals.Stop`: signal
    handlers run in the main thread only) and is raised with what each one's unwinding noted. No thread is left
    running either way."""
    if len(chosen) == 1:
        return [check(*chosen[0])]
    stop = signals.Stop()

    def run(name: str, digest: str) -> Verification:
        with signals.stoppable(stop):
            return check(name, digest)

    pool = ThreadPoolExecutor(max_workers=min(len(chosen), PLATFORMS_AT_ONCE), thread_name_prefix="verify-platform")
    futures: list[Future[Verification]] = []
    try:
        futures += [pool.submit(run, name, digest) for name, digest in chosen]
        pending: set[Future[Verification]] = set(futures)
        while pending:
            # SIGINT/SIGTERM may be taken by any thread of the process, and Python runs the handler in this one
            # only when it next runs Python code, which a wait with no end may never do: this wait ends every
            # signals.POLL seconds
            done, pending = wait(pending, timeout=signals.POLL, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):
                stop.stop(signal.SIGTERM)  # the others end as a SIGTERM would end them
                break
    except BaseException as exc:  # interrupted while waiting (Interrupted; KeyboardInterrupt without handlers)
        stop.stop(exc.signum if isinstance(exc, signals.Interrupted) else signal.SIGINT)
        pool.shutdown(wait=True, cancel_futures=True)
        if isinstance(exc, signals.Interrupted):
            for (name, _), future in zip(chosen, futures):
                err = None if future.cancelled() else future.exception()
                if isinstance(err, signals.Interrupted):
                    exc.notes.extend(f"{name}: {note}" for note in err.notes)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    errors = [f.exception() for f in futures if not f.cancelled()]
    first = next((e for e in errors if e is not None and not isinstance(e, signals.Interrupted)), None)
    if first is None:
        first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]


def _prefixed(platform: str) -> Callable[[str], None]:
    """A build's BuildKit lines on stderr, each after ``platform``, written whole."""

    def echo(line: str) -> None:
        with _ECHO:
            sys.stderr.write(f"{platform} {line}\n")
            sys.stderr.flush()

    return echo


def _config_digest(manifest: Any) -> str | None:
    """The config digest an image manifest names (None when it names none)."""
    try:
        config = manifest.json().get("config")
    except (RegistryError, ValueError, AttributeError):
        return None
    digest = config.get("digest") if isinstance(config, dict) else None
    return digest if isinstance(digest, str) else None


def _verify_image(
    ref: str,
    engine: Engine,
    policy: RetryPolicy | None,
    key: Path | None,
    rebuild_from: Path | None,
    client: RegistryClient,
    reference: str,
    manifest: Any,
    index: tuple[str, str] | None = None,
    echo: Callable[[str], None] | None = None,
) -> Verification:
    """:func:`verify_ref` of one image manifest; ``index``: (digest, platform) of the index it was reached through,
    whose tag the record names; ``echo``: where a rebuild's BuildKit lines go (default: stderr)."""
    repo, _ = split_ref(ref)
    v = Verification(ref, "?")
    if manifest is None:
        v.add(False, f"digest  {ref}: the registry has no such manifest")
        return v
    digest = manifest.digest
    v.image = f"{repo}@{digest}"  # what was checked: the pinned reference
    if reference.startswith("sha256:"):
        v.add(digest == reference, f"digest  {ref} served bytes with digest {digest}")
        if digest != reference:
            return v
    else:
        v.add(True, f"digest  {repo}:{reference} resolves to {digest}")
    rec = registry_checks(v, client, digest, ref, key, index)
    if rec is None:
        return v
    pinned = f"{repo}@{digest}"
    _pull(engine, pinned)
    client = client.within(VERIFY_SECONDS)  # the reads after the pull
    attrs = _described(engine, pinned, manifest, client, v)
    labels, image_id = labels_of(attrs), str(attrs.get("Id"))
    if image_id == digest and image_id != rec.image_id:
        # the containerd image store names a pulled image by its manifest's digest: its config is the image id
        config = _config_digest(manifest)
        v.add(config == rec.image_id, f"image   id={config} record={rec.image_id} (the config of {digest}, the "
              "engine's name of the image)")  # fmt: skip
    else:
        v.add(image_id == rec.image_id, f"image   id={image_id} record={rec.image_id}")
    differ = sorted(k for k in set(labels) | set(rec.labels) if labels.get(k) != rec.labels.get(k))
    v.add(not differ, "labels  the image's labels equal the record's" if not differ else
          "labels  differ from the record: " + ", ".join(f"{k} image={labels.get(k)!r} record={rec.labels.get(k)!r}" for k in differ[:8]))  # fmt: skip
    _check_sbom(v, client, digest, engine, pinned)
    if OVERLAY in labels or rec.overlay is not None:
        try:
            doc = manifest.json()
        except RegistryError as exc:
            v.add(False, f"overlay {exc}")
            return v
        check_ref(v, rec, labels, engine, pinned, client, doc)
        if v.failed or (not rec.stack_files and embed.LABEL not in labels):
            if not v.failed:
                v.lines.append("note    the overlay's base carries no stack of its own: no stack checks")
            return v
    pins = {k[len(PIN) :]: val for k, val in labels.items() if k.startswith(PIN)}
    for name in sorted(set(pins) | set(rec.pins)):
        have, want = pins.get(name), rec.pins.get(name)
        v.add(have == want, f"pin     {name} label={have or 'missing'} record={want or 'missing'}")
    fp = labels.get(f"{LABEL_NS}.fingerprint", "")
    v.add(fp == rec.fingerprint, f"fingerprint label={fp} record={rec.fingerprint}")
    try:
        declared = embed.parse_label(labels.get(embed.LABEL))
    except UserError as err:
        v.add(False, f"stack   {err.message}")
        return v
    files = image_files(engine, pinned, embed.IMAGE_DIR)
    v.add(set(files) == set(declared), f"stack   {embed.IMAGE_DIR}/ holds {', '.join(sorted(files)) or 'nothing'}; "
          f"the label names {', '.join(sorted(declared))}")  # fmt: skip
    for name, want in declared.items():
        have = embed.digest(files[name]) if name in files else None
        v.add(have == want, f"stack   {name} sha256 image={have or 'missing'} label={want}")
        if name != embed.OVERRIDES:
            entry = rec.stack_files.get(name)
            in_record = entry.sha256 if entry else None
            v.add(in_record == want, f"stack   {name} sha256 record={in_record or 'missing'} label={want}")
    if v.failed:
        return v
    with tempfile.TemporaryDirectory(prefix="stackforge-verify-") as tmp:
        loaded = line_of(load_embedded(files, rec.stack, Path(tmp)), engine, pinned, attrs)
        checked = verify(loaded, pinned, labels, engine, config_of(attrs))
    v.lines.extend(checked.lines)
    v.failed += checked.failed
    if rebuild_from is not None:
        from stackforge.flows.rebuild import rebuild

        for ok, line in rebuild(rec, rebuild_from, client.within(VERIFY_SECONDS), digest, manifest.json(), engine,
                                echo=echo):  # fmt: skip
            v.add(ok, line)
    return v


def registry_checks(
    v: Verification,
    client: RegistryClient,
    digest: str,
    ref: str,
    key: Path | None,
    index: tuple[str, str] | None = None,
) -> Any:
    """The checks of ``verify REF`` that need the registry alone (no pull): the publish record attached to
    ``digest`` (found, of this schema, its subject and digest this image), the scan it carries, the tag it names
    resolving to ``digest`` (or to ``index``, the digest and platform of the image index that lists it), and with
    ``key`` the signed provenance. The record (a ``PublishRecord``), or None when
    a check stopped the others; each check is a line of ``v``."""
    repo = client.repository
    try:
        found = records.fetch(client, digest)
    except (RegistryError, ValueError) as exc:
        v.add(False, f"record  cannot be read: {exc}")
        return None
    if found is None:
        _not_attached(v, client, digest, ref)
        return None
    v.add(True, f"record  {found.manifest_digest} found via {found.via} (created {found.created or 'unknown'})")
    problems = records.check_schema(found.record)
    for problem in problems:
        v.add(False, f"record  {problem}")
    if problems:
        return None
    rec = found.parsed()
    v.stack = rec.stack
    # what the record says the image passed (the summary line reports them; "none recorded" when absent)
    v.record_tests, v.record_smoke = found.record.get("tests"), found.record.get("smoke")
    v.add(found.subject == digest, f"record  subject={found.subject} pulled={digest}")
    if found.subject != digest:
        return None
    if rec.digest != digest:
        v.add(False, f"record  digest={rec.digest} does not match the pulled digest {digest}: the record does not "
                     "describe this image; refused")  # fmt: skip
        return None
    v.add(True, f"record  digest={rec.digest} matches the pulled digest")
    scan_lines(v, rec)
    tag = rec.tags[0] if rec.tags else None
    if tag:
        try:
            info = client.head_manifest(tag)
        except RegistryError as exc:
            v.add(False, f"tag     {tag} (from the record) cannot be read: {exc}")
            return None
        if info is None and rec.repository != str(repo):
            # a copy (`stackforge copy`) under another name: the record binds the digest, not where it is pulled from
            v.lines.append(f"note    tag     {tag} (from the record) is not in {repo}: a copy of {rec.repository}; "
                           "the record and the signature bind the digest, not the repository or tag")  # fmt: skip
        elif index is not None and info is not None and info.digest == index[0]:
            v.add(True, f"tag     {tag} (from the record) resolves to the index {index[0]}, which lists this image "
                        f"for {index[1]}")  # fmt: skip
        else:
            v.add(info is not None and info.digest == digest,
                  f"tag     {tag} (from the record) resolves to {info.digest if info else 'nothing'}")  # fmt: skip
    if key is not None:
        for ok, line in attest.check_provenance(client, digest, key, found.record):
            v.add(ok, line)
    return rec


def _not_attached(v: Verification, client: RegistryClient, digest: str, ref: str) -> None:
    """The lines of an image with no publish record attached: which of the record, the signed provenance and the
    SBOM are missing here, and how an image is copied with them."""
    missing = ["publish record"]
    try:
        if not attest.envelopes(client, digest):
            missing.append("signed provenance")
        if attest.sbom_of(client, digest) is None:
            missing.append("SBOM")
    except (RegistryError, ValueError):
        pass
    v.add(False, f"record  none attached to {digest} in {client.repository} (neither the referrers API nor the tag "
                 f"{records.fallback_tag(digest)} lists one): missing here: {', '.join(missing)}")  # fmt: skip
    v.lines.append(f"note    a copy by tag alone (skopeo copy, docker pull/tag/push, a registry's tag replication) leaves "
                   f"them behind: copy the image with them, `stackforge copy SRC {ref}` (or `oras cp -r SRC {ref}`); "
                   "an image stackforge did not publish has none")  # fmt: skip


def scan_lines(v: Verification, rec: records.PublishRecord) -> None:
    """The vulnerability gate's verdict the record carries: clear, each waived finding with its reason (a pass:
    waived by a reviewer, until its date), each blocking finding (a failure: the publish moved no alias for it);
    a note when no scan ran."""
    scan = rec.scan
    if scan is None:
        v.lines.append("note    scan none recorded: the image was published without a vulnerability gate")
        return
    v.add(scan.verdict != "blocked", f"scan    {scan.verdict} at {scan.fail_on} ({scan.findings} findings)")
    for w in scan.waived:
        v.add(True, f"scan    waived {w.id} ({w.package} {w.version or ''}): {w.reason} (until {w.expires}; {w.waiver or 'waiver'})")  # fmt: skip
    if scan.blocked:
        v.add(False, f"scan    blocked by {', '.join(scan.blocked[:8])}: no alias was moved to this image")


def _check_sbom(v: Verification, client: RegistryClient, digest: str, engine: Engine, pinned: str) -> None:
    """The SBOM attached to the image against what the pulled image has installed (a note when none is attached:
    images published before stackforge attached one)."""
    try:
        attached = attest.sbom_of(client, digest)
        if attached is None:
            v.lines.append(f"note    no SBOM attached to {digest}")
            return
        v.add(*attest.check_sbom(attached, sbom.of_image(engine, pinned)))
    except (RegistryError, ValueError) as exc:
        v.add(False, f"sbom    cannot be read: {printable(exc)}")
    except UserError as exc:  # an attached SBOM that is not one (too deep, not UTF-8, a wrong shape)
        v.add(False, f"sbom    cannot be read: {exc.message}")


def tag_pulled(engine: Engine, pinned: str, ref: str) -> None:
    """Tag the verified image ``pinned`` as ``ref`` in the engine (the tag it was published under)."""
    engine.tag(pinned, ref)
