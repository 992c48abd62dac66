"""``stackforge history --out DIR``: a static site of the nightly's history, from the nights' own summaries.

Each night the nightly writes ``summary.json`` into its directory (``build/nightly/<date>`` by default; in CI keep
them outside the work tree, e.g. ``$NIGHTS/<date>``) and copies each image's evidence beside it. This reads every
``NIGHTS/*/summary.json`` and writes:

- ``DIR/index.html``: the nights, newest first and grouped by month, each a table of its images — stack, target,
  platform (linux/amd64, linux/arm64: a row per platform line of a stack that declares them), status (a failed
  row is red, with its stage and reason; a row whose digest the night's own publish record does not confirm is
  "unverified"), tag, digest ("same image as" the earlier night that published the same digest), size, duration,
  gate, smoke, signed or unsigned, the scan's verdict, where the aliases went (and why one was held back), the
  source commit and the night's CI run (its log and artifacts);
- ``DIR/images/<night>.<stack>.<target>.html`` (``….<platform>.html`` when the night has a row per platform of the
  stack and target): one page per image — the same facts, its SBOM
  (``DIR/sbom/<sha256>.cdx.json``), its installed Python distributions and Debian packages and what changed since
  the same image's previous night, with links to the previous and next nights and back to the index.

Everything a night holds is hostile input: read through :mod:`stackforge.safeio` within a size and nesting bound
(regular files only, no link out of the night's directory), validated by the typed models of
:mod:`stackforge.flows.night_records`, evidence named by a summary only as a relative name under its night. A night
or a file that cannot be read does not hide the others: it is shown as unreadable with the reason, and the command
names it in an ``error:`` line and exits 1 after writing the site. Every value reaches the HTML escaped (Jinja
autoescape), and the terminal stripped of control characters. ``DIR`` is replaced whole, only when it is absent,
empty or a site this command wrote, and never when it is, or holds, a night it reads.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from stackforge import safeio
from stackforge.builder.plan.render import images_dir
from stackforge.builder.records import inventory
from stackforge.errors import UserError, printable
from stackforge.flows.night_records import (
    Envelope,
    Inputs,
    Inventory,
    NightSummary,
    PublishRecord,
    Sbom,
    Scan,
    Statement,
    SummaryRow,
)

SUMMARY = "summary.json"
VERB = "history"
MAX_SUMMARY = 16 * safeio.MiB
#: inventory.json, publish.json, inputs.json of a row's evidence
MAX_RECORD = 16 * safeio.MiB
MAX_SYSTEM = 4 * safeio.MiB
#: the caps a registry read of a provenance envelope and an SBOM has (publish/attest.py)
MAX_PROVENANCE = 4 * safeio.MiB
MAX_SBOM = 64 * safeio.MiB
#: a row whose status says its image was pushed: its digest must be the night's publish record's
PUSHED = frozenset({"published", "already-published", "not-run"})

SOURCE = "org.opencontainers.image.source"
REVISION = "org.opencontainers.image.revision"
VERSION = "org.opencontainers.image.version"

_KEEP = frozenset(string.ascii_lowercase + string.digits + "-")
_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")
_WEB = re.compile(r"^https?://[^\s\"'<>\\`]+$")
_FORGE = re.compile(r"^https://(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?)/(?P<path>[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]+)+)$")

M = TypeVar("M")


# ---------------------------------------------------------------------------------------------------------------
# Names


def escape_part(text: str) -> str:
    """``text`` as a part of a file name or an HTML id: lower-case letters, digits and ``-`` kept, every other
    character ``_`` and its UTF-8 bytes in hex. Injective, and never holds a ``.``: parts joined by ``.`` stay
    apart (``hp-a``/``b-c`` and ``hp-a-b``/``c`` differ), and names that differ only in case stay apart too."""
    out = []
    for char in text:
        if char in _KEEP:
            out.append(char)
        else:
            out.append("".join(f"_{byte:02x}" for byte in char.encode("utf-8", "surrogatepass")))
    return "".join(out)


def page_name(*parts: str) -> str:
    """The file name of a page for ``parts`` (night, stack, target[, platform]): :func:`escape_part` of each, joined
    by ``.``;
    one longer than a file name may be is cut and ends in ``~`` and the sha256 of the parts (a ``~`` no other name
    has)."""
    name = ".".join(escape_part(p) for p in parts)
    if len(name) > 180:
        digest = hashlib.sha256(json.dumps(list(parts)).encode("utf-8", "surrogatepass")).hexdigest()
        name = f"{name[:100]}~{digest}"
    return name + ".html"


def web_url(value: object) -> str | None:
    """``value`` when it is an http(s) URL a page may link to (no quote, space or angle bracket), else None."""
    return value if isinstance(value, str) and len(value) <= 2048 and _WEB.match(value) else None


def commit_url(source: str | None, revision: str | None) -> str | None:
    """The page of ``revision`` at the forge ``source`` names: ``<source>/commit/<sha>`` for an https URL of a
    GitHub or GitLab host (``github.com``, ``gitlab.com`` or a host named ``github.*``/``gitlab.*``); None for
    anything else (shown as text)."""
    if not source or not revision or not _COMMIT.match(revision):
        return None
    found = _FORGE.match(source.rstrip("/").removesuffix(".git"))
    if found is None:
        return None
    host = found["host"].lower().split(":")[0]
    if host not in ("github.com", "gitlab.com") and host.split(".")[0] not in ("github", "gitlab"):
        return None
    return f"https://{found['host']}/{found['path']}/commit/{revision}"


# ---------------------------------------------------------------------------------------------------------------
# What the site shows


@dataclass(frozen=True)
class Problem:
    """A file of a night that could not be read, or that contradicts its night: named in an ``error:`` line."""

    path: str  # on this host
    shown: str  # relative to the nights' directory: what the site shows
    message: str

    def line(self) -> str:
        return safeio.for_terminal(f"error: {printable(self.path)}: {self.message}", lines=False)


@dataclass(frozen=True)
class ScanView:
    """The scan's verdict as the site shows it: clear, waived (with the reasons), blocked (with the IDs), not
    scanned, or unreadable."""

    verdict: str
    ids: tuple[str, ...] = ()
    waived: tuple[tuple[str, str], ...] = ()  # (id, reason)
    findings: tuple[str, ...] = ()
    fail_on: str | None = None
    database: str | None = None
    note: str | None = None
    count: int = 0  # findings in all, blocking, waived and below the level

    @property
    def text(self) -> str:
        if self.verdict == "blocked":
            return "blocked: " + (", ".join(self.ids) or "no ID given")
        if self.verdict == "waived":
            return "waived: " + ("; ".join(f"{i} ({reason})" for i, reason in self.waived) or "no waiver given")
        if self.verdict == "clear" and self.count:
            return f"clear ({self.count} below {self.fail_on or 'the level'})"
        return self.verdict


@dataclass(frozen=True)
class Source:
    """The upstream the image was built from: its URL, commit and tag (the image's OCI labels)."""

    url: str | None
    revision: str | None
    version: str | None
    link: str | None

    @property
    def short(self) -> str:
        if self.revision:
            return self.revision[:12]
        return self.version or "-"


@dataclass
class Image:
    """One stack, target and platform of one night, as the site shows it."""

    night: str
    night_key: str
    stack: str
    target: str
    status: str
    #: the OCI platform of the image (linux/amd64); None for a row that names none (a night written before rows did)
    platform: str | None = None
    #: the platform when the night has a row per platform of the stack and target (a stack of platform lines): it
    #: parts the image's page and its series of nights from the other platforms'; None for a stack's one row
    line: str | None = None
    stage: str | None = None
    tag: str | None = None
    digest: str | None = None
    size: int | None = None
    duration_s: float = 0.0
    gate: str | None = None
    smoke: str | None = None
    reason: str | None = None
    smoke_recipes: dict[str, str] = field(default_factory=dict)  # recipe -> passed | failed | not-run
    dists: list[dict[str, Any]] = field(default_factory=list)
    debs: dict[str, str] = field(default_factory=dict)
    kept: bool = False  # the night kept this image's inventory
    same_as: str | None = None
    page: str | None = None  # relative to the index
    night_dir: str = ""
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> moved | unchanged | not moved: why
    signed: str | None = None  # signed | unsigned; None: nothing was pushed
    signed_note: str | None = None
    scan: ScanView | None = None
    source: Source | None = None
    log_url: str | None = None
    sbom: str | None = None  # the SBOM's sha256 (its file in the site's sbom/)
    sbom_path: Path | None = None
    sbom_root: Path | None = None  # the night's directory: the SBOM is read again under it
    verified: str | None = None  # what confirmed the digest
    unverified: str | None = None  # why the digest is not confirmed
    registry_note: str | None = None
    problems: list[str] = field(default_factory=list)  # files of its evidence that could not be read: why

    @property
    def pushed(self) -> bool:
        return self.status in PUSHED or self.digest is not None

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "interrupted")

    @property
    def not_run(self) -> bool:
        """Published, but its smoke did not run (e.g. no device on the host): neither passed nor failed."""
        return self.status == "not-run"

    @property
    def outcome(self) -> str:
        if self.failed:
            return "failed"
        if self.unverified:
            return "unverified"
        return "not-run" if self.not_run else "passed"

    @property
    def row_class(self) -> str:
        return {"failed": "failed", "unverified": "unverified", "not-run": "not-run"}.get(self.outcome, "published")

    @property
    def status_text(self) -> str:
        text = self.status + (f" ({self.stage})" if self.stage else "")
        return f"unverified: {text}" if self.unverified and not self.failed else text

    @property
    def smoke_text(self) -> str:
        """The smoke verdict, and each recipe's when they differ from it or there are several."""
        if not self.smoke:
            return "-"
        text = "no nightly recipe" if self.smoke == "none" else self.smoke
        recipes = self.smoke_recipes
        if len(recipes) > 1 or any(v != self.smoke for v in recipes.values()):
            text += " (" + ", ".join(f"{name} {v}" for name, v in recipes.items()) + ")"
        return text

    @property
    def alias_rows(self) -> list[tuple[str, str, bool]]:
        """(alias, where it went, held back) for each alias: ``-latest``, ``not moved: smoke failed``, True."""
        return [(a.rsplit(":", 1)[-1], v, v.startswith("not moved")) for a, v in self.aliases.items()]

    @property
    def aliases_text(self) -> str:
        if not self.aliases:
            return "-"
        return "; ".join(f"{name} {state}" for name, state, _ in self.alias_rows)

    @property
    def held(self) -> bool:
        return any(held for _, _, held in self.alias_rows)

    @property
    def page_name(self) -> str:
        lined = (self.line,) if self.line else ()
        return page_name(self.night_dir or self.night_key, self.stack, self.target, *lined)

    @property
    def series(self) -> tuple[str, str, str | None]:
        """The images of other nights this one follows: the same stack and target (and platform line)."""
        return self.stack, self.target, self.line

    @property
    def title(self) -> str:
        return f"{self.stack}/{self.target}" + (f" ({self.line})" if self.line else "")

    @property
    def short_digest(self) -> str | None:
        return self.digest[:19] + "…" if self.digest and len(self.digest) > 20 else self.digest

    @property
    def size_text(self) -> str:
        if self.size is None:
            return "-"
        return f"{self.size / 1e9:.2f} GB" if self.size >= 1e9 else f"{self.size / 1e6:.1f} MB"

    @property
    def duration_text(self) -> str:
        return f"{self.duration_s:.0f} s"


@dataclass
class Night:
    date: str
    key: str
    registry: str
    started_at: str
    duration_s: float
    images: list[Image]
    name: str = ""  # its directory's name
    directory: Path | None = None
    error: str | None = None  # its summary could not be read: why
    problems: list[Problem] = field(default_factory=list)
    log_url: str | None = None
    commit: str | None = None
    commit_url: str | None = None

    @property
    def passed(self) -> int:
        return sum(i.outcome == "passed" for i in self.images)

    @property
    def failed(self) -> int:
        return sum(i.outcome == "failed" for i in self.images)

    @property
    def not_run(self) -> int:
        return sum(i.outcome == "not-run" for i in self.images)

    @property
    def unverified(self) -> int:
        return sum(i.outcome == "unverified" for i in self.images)

    @property
    def smoke_counts(self) -> dict[str, int]:
        """The night's smoke recipes: passed, failed, not run."""
        found = [v for i in self.images for v in i.smoke_recipes.values()]
        return {"passed": found.count("passed"), "failed": found.count("failed"), "not_run": found.count("not-run")}

    @property
    def duration(self) -> str:
        return f"{self.duration_s:.0f} s"

    @property
    def month(self) -> str:
        """``YYYY-MM`` of its date; "" when the date is not ``YYYYMMDD`` (an unreadable night's directory)."""
        return f"{self.date[:4]}-{self.date[4:6]}" if re.fullmatch(r"[0-9]{8}", self.date) else ""


@dataclass
class Month:
    key: str  # YYYY-MM, or "undated"
    title: str
    nights: list[Night]


@dataclass(frozen=True)
class HistoryOptions:
    """``log_url``: a template of the build log's URL for nights whose summary names no CI run (``{date}`` and
    ``{night}`` are replaced); ``registry_check``: also ask the registry what each row's tag holds (a registry
    that cannot be reached is noted, not counted against the row); ``key``: a PEM public key every signed
    provenance must be signed by."""

    log_url: str | None = None
    registry_check: bool = False
    key: Path | None = None


def check_log_url(template: str | None) -> str | None:
    """``--log-url``: an http(s) URL whose only fields are ``{date}`` and ``{night}``."""
    if template is None:
        return None
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise UserError(f"--log-url {printable(template)}: {exc}", file="--log-url", fix="use {date} and {night} only") from None  # fmt: skip
    if not fields <= {"date", "night"} or web_url(template.replace("{date}", "d").replace("{night}", "n")) is None:
        raise UserError(
            f"--log-url {printable(template)} is not an http(s) URL with {{date}} and {{night}} as its only fields",
            file="--log-url",
            fix="e.g. --log-url 'https://ci.example.com/nightly/{date}/'",
        )
    return template


# ---------------------------------------------------------------------------------------------------------------
# Reading


class _NightReader:
    """One night's directory: its files read within bounds and under it, each refusal noted."""

    def __init__(self, directory: Path, night: Night, public_key: Any, key_path: Path | None) -> None:
        self.directory, self.night = directory, night
        self.public_key, self.key_path = public_key, key_path

    def shown(self, rel: PurePosixPath | str) -> str:
        return f"{self.directory.name}/{rel}"

    def problem(self, rel: PurePosixPath | str, message: str, image: Image | None = None) -> None:
        """A file of the night that cannot be read or contradicts its night: an ``error:`` line, and on the image's
        row and page when ``image`` is given."""
        shown = self.shown(rel)
        self.night.problems.append(Problem(str(self.directory / rel), shown, message))
        if image is not None:
            image.problems.append(f"{shown}: {message}")

    def bytes(self, rel: PurePosixPath, limit: int, what: str, image: Image) -> bytes | None:
        """The file ``rel`` of the night (None when there is none; a refusal is noted)."""
        path = self.directory / rel
        if not os.path.lexists(path):
            return None
        try:
            return safeio.read_bytes(path, limit=limit, what=what, root=self.directory)
        except safeio.Malformed as err:
            self.problem(rel, err.message, image)
            return None

    def model(self, model: type[M], rel: PurePosixPath, what: str, image: Image, limit: int = MAX_RECORD) -> M | None:
        data = self.bytes(rel, limit, what, image)
        if data is None:
            return None
        try:
            return safeio.parse_model(model, data, source=self.directory / rel, what=what, limit=limit)
        except safeio.Malformed as err:
            self.problem(rel, err.message, image)
            return None

    def evidence(self, index: int, value: str | None, image: Image) -> PurePosixPath | None:
        """The row's evidence directory: a relative name under the night with no link on its way (None when the row
        names none, or the night does not hold it: an artifact downloaded without it)."""
        if value is None:
            return None
        try:
            rel = safeio.relative_name(value, what="evidence")
            path = safeio.confined(self.directory, rel, what="evidence")
        except safeio.Malformed as err:
            self.problem(SUMMARY, f"rows[{index}].evidence: {err.message}; not read", image)
            return None
        if not path.is_dir():
            if os.path.lexists(path):
                self.problem(rel, "the row's evidence is not a directory; not read", image)
            return None
        return rel

    def image(self, index: int, row: SummaryRow) -> Image:
        night = self.night
        image = Image(
            night=night.date,
            night_key=night.key,
            night_dir=night.name,
            stack=row.stack,
            target=row.target,
            status=row.status,
            platform=row.platform,
            stage=row.stage,
            tag=row.tag,
            digest=row.digest,
            duration_s=row.duration_s,
            gate=row.gate,
            smoke=row.smoke,
            reason=row.reason,
            smoke_recipes=dict(row.smoke_recipes),
            aliases=dict(row.aliases),
            log_url=night.log_url,
        )
        record = None
        evidence = self.evidence(index, row.evidence, image)
        if evidence is not None:
            found = self.model(Inventory, evidence / "inventory.json", "inventory", image)
            if found is not None:
                image.dists = [d.model_dump(include={"name", "version", "index", "sha256"}) for d in found.dists]
                image.kept = True
            image.debs = self.debs(evidence / "system.txt", image)
            record = self.model(PublishRecord, evidence / "publish.json", "publish record", image)
            if record is not None:
                image.size = record.size
                image.aliases = image.aliases or dict(record.aliases)
            inputs = self.model(Inputs, evidence / "inputs.json", "build inputs", image)
            if inputs is not None:
                labels = inputs.labels
                url, revision = labels.get(SOURCE) or None, labels.get(REVISION) or None
                if url or revision:
                    image.source = Source(url, revision, labels.get(VERSION) or None, commit_url(url, revision))
            self.sbom(evidence / "sbom.cdx.json", image)
        self.verify(index, row, record, image)
        if image.pushed:
            self.signed(evidence, image)
        self.scan(index, row, record, evidence, image)
        return image

    def debs(self, rel: PurePosixPath, image: Image) -> dict[str, str]:
        """``name version`` lines after ``installed:`` in the evidence's system.txt (``dpkg-query -W``)."""
        data = self.bytes(rel, MAX_SYSTEM, "system packages", image)
        if data is None:
            return {}
        try:
            lines = safeio.decode(data, source=self.directory / rel, what="system packages").splitlines()
        except safeio.Malformed as err:
            self.problem(rel, err.message, image)
            return {}
        after = lines[lines.index("installed:") + 1 :] if "installed:" in lines else []
        return dict(line.split(" ", 1) for line in after if line.count(" ") == 1)

    def sbom(self, rel: PurePosixPath, image: Image) -> None:
        """The SBOM the evidence holds (a CycloneDX document), by its sha256; copied into the site when written."""
        data = self.bytes(rel, MAX_SBOM, "SBOM", image)
        if data is None:
            return
        try:
            safeio.parse_model(Sbom, data, source=self.directory / rel, what="SBOM", limit=MAX_SBOM)
        except safeio.Malformed as err:
            self.problem(rel, err.message, image)
            return
        image.sbom, image.sbom_path, image.sbom_root = (
            hashlib.sha256(data).hexdigest(),
            self.directory / rel,
            self.directory,
        )

    def verify(self, index: int, row: SummaryRow, record: PublishRecord | None, image: Image) -> None:
        """The row's digest against the night's own publish record: a summary edited by hand is not shown as
        published."""
        if image.digest is None:  # nothing is claimed, nothing shown as published
            return
        if record is None:
            image.unverified = "the night's evidence holds no readable publish record (publish.json) of this image"
            return
        wrong = []
        if record.digest != image.digest:
            wrong.append(f"its digest is {record.digest or 'missing'}")
        if row.tag and record.reference and record.reference != row.tag:
            wrong.append(f"its reference is {record.reference}")
        if (record.stack or row.stack, record.target or row.target) != (row.stack, row.target):
            wrong.append(f"it is the record of {record.stack}/{record.target}")
        if record.platform and row.platform and record.platform != row.platform:
            wrong.append(f"it is the record of the {record.platform} image")
        if wrong:
            image.unverified = f"the night's publish record does not confirm {image.digest}: " + "; ".join(wrong)
            self.problem(SUMMARY, f"rows[{index}].digest: {image.unverified}")  # the row shows it as unverified
        else:
            image.verified = "the night's publish record"

    def signed(self, evidence: PurePosixPath | None, image: Image) -> None:
        """Signed when the evidence holds the provenance envelope whose statement names this digest (and, with a
        key, that key signed it); unsigned otherwise."""
        image.signed = "unsigned"
        if evidence is None or image.digest is None:
            return
        rel = evidence / "provenance.json"
        body = self.bytes(rel, MAX_PROVENANCE, "provenance", image)
        if body is None:
            return
        try:
            envelope = safeio.parse_model(Envelope, body, source=self.directory / rel, what="provenance")
            payload = base64.b64decode(envelope.payload, validate=True)
            stmt = safeio.parse_model(Statement, payload, source=self.directory / rel, what="provenance statement")
        except safeio.Malformed as err:
            self.problem(rel, err.message, image)
            image.signed_note = "the provenance in the evidence cannot be read"
            return
        except (binascii.Error, ValueError):
            self.problem(rel, "provenance: payload: not base64", image)
            image.signed_note = "the provenance in the evidence cannot be read"
            return
        if image.digest.split(":", 1)[1] not in {s.digest.get("sha256") for s in stmt.subject}:
            self.problem(rel, f"provenance: subject: names another image than {image.digest}", image)
            image.signed_note = "the provenance in the evidence names another image"
            return
        if self.public_key is None:
            image.signed, image.signed_note = "signed", "signature not checked (history --key checks it)"
            return
        from stackforge.publish import provenance

        try:
            provenance.open_envelope(body, self.public_key)
        except UserError as err:
            self.problem(rel, f"provenance: {err.message}", image)
            image.signed_note = f"not signed by {self.key_path.name if self.key_path else 'the key'}"
            return
        image.signed = "signed"
        image.signed_note = f"signature checked with {self.key_path.name if self.key_path else 'the key'}"

    def scan(
        self, index: int, row: SummaryRow, record: PublishRecord | None, evidence: PurePosixPath | None, image: Image
    ) -> None:
        """The scan's verdict: the row's own ``scan`` when the summary carries one, else the publish record's."""
        value, where = row.scan, PurePosixPath(SUMMARY)
        if value is None and record is not None:
            value, where = record.scan, (evidence or PurePosixPath()) / "publish.json"
        if value is None:
            if image.pushed:
                image.scan = ScanView("not scanned")
            return
        try:
            scan = safeio.validate(Scan, value, source=self.directory / where, what="scan")
        except safeio.Malformed as err:
            self.problem(where, err.message, image)
            image.scan = ScanView("unreadable", note=err.message)
            return
        ids = tuple(dict.fromkeys([*scan.blocked, *scan.blocking]))
        waived = tuple((w.id, w.reason or "no reason given") for w in scan.waived)
        verdict = "blocked" if ids else "waived" if waived else "clear"
        if scan.verdict and scan.verdict != "clear" and verdict != "blocked":  # never shown better than it says
            verdict = scan.verdict
        findings: tuple[str, ...] = ()
        if isinstance(scan.findings, int):
            count = scan.findings
        else:
            findings = tuple(str(f.get("id", f)) if isinstance(f, dict) else f for f in scan.findings)
            count = len(findings)
        database = scan.database if isinstance(scan.database, str) else None
        image.scan = ScanView(verdict, ids, waived, findings, scan.fail_on, database, scan.reason, count)


def _unreadable(directory: Path, err: safeio.Malformed) -> Night:
    name = directory.name
    date = name if re.fullmatch(r"[0-9]{8}", name) else ""
    problem = Problem(str(directory / SUMMARY), f"{name}/{SUMMARY}", err.message)
    return Night(date, escape_part(name), "", "", 0.0, [], name, directory, error=err.message, problems=[problem])


def read_night(directory: Path, options: HistoryOptions | None = None, public_key: Any = None) -> Night:
    """The night in ``directory``: its summary and each row's evidence, read under it."""
    options = options or HistoryOptions()
    path = directory / SUMMARY
    try:
        doc = safeio.load_model(NightSummary, path, what="nightly summary", limit=MAX_SUMMARY, root=directory)
    except safeio.Malformed as err:
        return _unreadable(directory, err)
    name = directory.name
    night = Night(doc.date, escape_part(name), doc.registry, doc.started_at, doc.duration_s, [], name, directory)
    ci = doc.ci
    night.log_url = web_url(ci.run_url) if ci else None
    if night.log_url is None and options.log_url:
        night.log_url = web_url(options.log_url.format(date=quote(doc.date, safe=""), night=quote(name, safe="")))
    if ci is not None and ci.commit and _COMMIT.match(ci.commit):
        night.commit, night.commit_url = ci.commit, web_url(ci.commit_url)
    reader = _NightReader(directory, night, public_key, options.key)
    night.images = [reader.image(i, row) for i, row in enumerate(doc.rows)]
    _lines(night.images)
    return night


def _lines(images: list[Image]) -> None:
    """Each image of a stack and target the night has a row per platform of: its platform is its line."""
    rows: dict[tuple[str, str], int] = {}
    for image in images:
        rows[(image.stack, image.target)] = rows.get((image.stack, image.target), 0) + 1
    for image in images:
        if image.platform and rows[(image.stack, image.target)] > 1:
            image.line = image.platform


def _a_site(path: Path) -> bool:
    """A site this command wrote (its mark): ``--out`` under the nights, never read as a night (a night's directory
    carries the nightly's mark)."""
    return safeio.output_verb(path) == VERB


def night_dirs(root: Path, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """The directories under ``root`` holding a summary.json: not hidden (a site being written), not a site this
    command wrote, not ``exclude``."""
    if not root.is_dir():
        raise UserError(f"{root} is not a directory", file="--nights", fix="give the directory the nights write into")
    skip = {os.path.realpath(p) for p in exclude}
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith(".") or os.path.realpath(path) in skip or not entry.is_dir():
                continue
            if not _a_site(path) and os.path.lexists(path / SUMMARY):
                found.append(path)
    return sorted(found, key=lambda p: p.name)


def read_nights(root: Path, options: HistoryOptions | None = None, *, exclude: tuple[Path, ...] = ()) -> list[Night]:
    """Every night under ``root`` (a directory per night holding its summary.json), newest first; with
    ``options.registry_check``, each pushed row's tag asked of its registry."""
    options = options or HistoryOptions()
    root = Path(root)
    public_key = _public_key(options.key) if options.key is not None else None
    nights = []
    for directory in night_dirs(root, exclude):
        if not safeio.inside(directory, root):
            refused = safeio.Malformed(f"the night's directory is a link out of {printable(root)}; not read")
            nights.append(_unreadable(directory, refused))
        else:
            nights.append(read_night(directory, options, public_key))
    if not nights:
        raise UserError(
            f"no night under {root} (no */{SUMMARY})",
            file="--nights",
            fix="give the directory `stackforge nightly --out` writes under (default build/nightly)",
        )
    nights.sort(key=lambda n: (n.date, n.started_at, n.name), reverse=True)
    if options.registry_check:
        check_registry(nights)
    _link(nights)
    return nights


def _public_key(path: Path) -> Any:
    from stackforge.publish import provenance

    safeio.read_bytes(path, limit=safeio.SMALL_LIMIT, what="public key")  # a regular file, within its bound
    return provenance.public_key(path)


def problems(nights: list[Night]) -> list[Problem]:
    return [p for n in nights for p in n.problems]


def check_registry(nights: list[Night], seconds: float = 20.0) -> None:
    """Each pushed row's tag as its registry holds it now: a digest other than the row's makes it unverified — unless
    the tag holds an image index that lists the row's digest for the row's platform (a stack of platform lines); a
    registry that cannot be reached (or refuses) is noted once per host and the row keeps its record's word."""
    from stackforge.clients.registry import RegistryClient, RegistryError, RetryPolicy, split_ref

    policy = RetryPolicy(attempts=2, total_seconds=seconds)
    clients: dict[str, Any] = {}
    down: dict[str, str] = {}
    answers: dict[str, tuple[str, dict[str, str | None]] | None] = {}  # tag -> (digest, an index's {digest: platform})
    for night in nights:
        for image in night.images:
            if image.digest is None or image.tag is None or image.unverified:
                continue
            try:
                repo, tag = split_ref(image.tag)
            except UserError as err:
                image.registry_note = f"not asked: {err.message}"
                continue
            if repo.host in down:
                image.registry_note = down[repo.host]
                continue
            if image.tag not in answers:
                client = clients.setdefault(str(repo), RegistryClient(repo, policy=policy))
                try:
                    manifest = client.get_manifest(tag)
                except (RegistryError, OSError) as exc:
                    status = getattr(exc, "status", None)
                    note = f"registry {repo.host} not reached: {safeio.for_terminal(exc, lines=False)[:200]}"
                    if status is None:
                        down[repo.host] = note
                    image.registry_note = note
                    continue
                answers[image.tag] = (manifest.digest, _children(manifest)) if manifest is not None else None
            answer = answers[image.tag]
            if answer is None:
                image.registry_note = f"the registry no longer holds {tag}"
                continue
            held, children = answer
            if held != image.digest and image.digest in children:
                listed = children[image.digest]
                if image.platform is None or listed == image.platform:
                    image.verified = f"{image.verified or 'the summary'} and the registry (its index {held[:19]}…)"
                    continue
                image.unverified = f"the registry's {tag} lists {image.digest} for {listed}, not {image.platform}"
            elif held != image.digest:
                image.unverified = f"the registry's {tag} is {held}, not {image.digest}"
            if image.unverified:
                message = f"{image.title}: {image.unverified}"
                where = (night.directory or Path(night.name)) / SUMMARY
                night.problems.append(Problem(str(where), f"{night.name}/{SUMMARY}", message))
            else:
                image.verified = f"{image.verified or 'the summary'} and the registry"


def _children(manifest: Any) -> dict[str, str | None]:
    """The images an index lists (``{digest: os/architecture}``); {} for an image manifest (or one not JSON)."""
    from stackforge.clients.registry import DOCKER_MANIFEST_LIST, OCI_INDEX, MalformedAnswer

    try:
        doc = manifest.json()
    except MalformedAnswer:
        return {}
    if doc.get("mediaType", manifest.media_type) not in (OCI_INDEX, DOCKER_MANIFEST_LIST):
        return {}
    out: dict[str, str | None] = {}
    for entry in doc.get("manifests") or []:
        if isinstance(entry, dict) and isinstance(entry.get("digest"), str):
            platform = entry.get("platform")
            os_name, arch = (platform.get("os"), platform.get("architecture")) if isinstance(platform, dict) else (None, None)  # fmt: skip
            out[entry["digest"]] = f"{os_name}/{arch}" if isinstance(os_name, str) and isinstance(arch, str) else None
    return out


def _link(nights: list[Night]) -> None:
    """Pages for images with something to show; "same image as" the earliest night with the same (confirmed)
    digest."""
    first: dict[tuple[str, str, str | None, str], str] = {}
    for night in reversed(nights):  # oldest first
        for image in night.images:
            if image.digest and not image.unverified:
                seen = first.setdefault((*image.series, image.digest), night.date)
                image.same_as = seen if seen != night.date else None
            if image.digest or image.kept or image.problems:
                image.page = f"images/{image.page_name}"


def months(nights: list[Night]) -> list[Month]:
    """The nights grouped by month, newest first; nights with no date last."""
    out: dict[str, Month] = {}
    for night in sorted(nights, key=lambda n: (n.month != "", n.date, n.started_at, n.name), reverse=True):
        key = night.month or "undated"
        if key not in out:
            title = dt.date(int(key[:4]), int(key[5:7]), 1).strftime("%B %Y") if night.month else "Undated"
            out[key] = Month(key, title, [])
        out[key].nights.append(night)
    return list(out.values())


# ---------------------------------------------------------------------------------------------------------------
# Writing


def _changes(before: Image, after: Image) -> list[dict[str, str | None]]:
    found = inventory.diff({"dists": before.dists}, {"dists": after.dists})
    out: list[dict[str, str | None]] = []
    out += [{"kind": "added", "name": r["name"], "before": None, "after": r["version"]} for r in found.added]
    out += [{"kind": "removed", "name": r["name"], "before": r["version"], "after": None} for r in found.removed]
    out += [
        {"kind": "changed", "name": r["name"], "before": r["before"]["version"], "after": r["after"]["version"]}
        for r in found.changed
    ]
    for name in sorted(before.debs.keys() | after.debs.keys()):
        a, b = before.debs.get(name), after.debs.get(name)
        if a != b:
            kind = "added" if a is None else "removed" if b is None else "changed"
            out.append({"kind": kind, "name": f"{name} (deb)", "before": a, "after": b})
    return out


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images_dir() / "docs")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def _series(nights: list[Night]) -> dict[tuple[str, str, str | None], list[Image]]:
    """Each stack and target's (and platform line's) images with a page, oldest first."""
    out: dict[tuple[str, str, str | None], list[Image]] = {}
    for night in reversed(nights):
        for image in night.images:
            if image.page:
                out.setdefault(image.series, []).append(image)
    return out


def _copy_sbom(image: Image, staging: Path) -> None:
    """The image's SBOM into ``sbom/<sha256>.cdx.json`` of the site (one file per distinct SBOM), read again within
    its bound; one that changed since it was read is not linked."""
    if image.sbom is None or image.sbom_path is None or image.sbom_root is None:
        return
    target = staging / "sbom" / f"{image.sbom}.cdx.json"
    if target.exists():
        return
    try:
        data = safeio.read_bytes(image.sbom_path, limit=MAX_SBOM, what="SBOM", root=image.sbom_root)
    except safeio.Malformed:
        data = b""
    if hashlib.sha256(data).hexdigest() != image.sbom:
        image.sbom = None
        return
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(data)


def render_site(nights: list[Night], into: Path) -> None:
    """Write the site's files into the (new, empty) directory ``into``."""
    env = _environment()
    css = Markup(env.get_template("history.css.j2").render())  # the project's own template, not outside text
    (into / "images").mkdir()
    page = env.get_template("history-image.html.j2")
    for line in _series(nights).values():
        for i, image in enumerate(line):
            _copy_sbom(image, into)
            previous = line[i - 1] if i else None
            following = line[i + 1] if i + 1 < len(line) else None
            changes = _changes(previous, image) if previous is not None else []
            text = page.render(
                image=image,
                previous=previous,
                following=following,
                changes=changes,
                debs_changes=image.debs or None,
                css=css,
            )
            (into / "images" / image.page_name).write_text(text, encoding="utf-8")
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    index = env.get_template("history-index.html.j2").render(
        nights=nights, months=months(nights), generated=generated, css=css, problems=problems(nights)
    )
    (into / "index.html").write_text(index, encoding="utf-8")


def _legacy_site(out: Path) -> bool:
    """A site an earlier ``stackforge history`` wrote before it marked its output: ``index.html`` saying so and
    ``images/`` of pages, nothing else. It is marked, so it is replaced as this command's own."""
    try:
        if sorted(os.listdir(out)) != ["images", "index.html"] or os.path.islink(out / "images"):
            return False
        pages = os.listdir(out / "images")
        index = safeio.read_text(out / "index.html", limit=MAX_SUMMARY, what="index", follow=False)
    except (OSError, safeio.Malformed):
        return False
    regular = all(name.endswith(".html") and (out / "images" / name).is_file() for name in pages)
    if not regular or any(os.path.islink(out / "images" / name) for name in pages):
        return False
    return "by <code>stackforge history</code>" in index


def write_site(nights: list[Night], out: Path, inputs: tuple[Path, ...] = ()) -> Path:
    """Write the site into ``out`` (replaced whole, only when it is this command's: :class:`safeio.OutputDir`;
    never when it is or holds one of ``inputs``); returns ``out/index.html``."""
    out = Path(out)
    output = safeio.OutputDir(out, VERB)
    with output.staging(inputs) as staging:
        render_site(nights, staging)
    return out / "index.html"


def history(nights_dir: Path, out: Path, options: HistoryOptions | None = None) -> tuple[Path, list[Night]]:
    """Read the nights under ``nights_dir`` and write their site into ``out``. A night or file that could not be
    read is in the site and in :func:`problems` of the nights returned (the caller exits 1 for it)."""
    nights_dir, out = Path(nights_dir), Path(out)
    output = safeio.OutputDir(out, VERB)
    if os.path.isdir(out) and not os.path.islink(out) and _legacy_site(out):
        (out / safeio.OUTPUT_MARK).write_text(f"stackforge {VERB}\n", encoding="utf-8")
    output.check([nights_dir])  # before anything is read: --out is not --nights, nor holds it
    nights = read_nights(nights_dir, options, exclude=(out,))
    inputs = (nights_dir, *(n.directory for n in nights if n.directory is not None))
    return write_site(nights, out, inputs), nights
