"""Evidence per build: ``build/<stack>/evidence/<build-id>/``, ``latest``, lookup by image id, retention.

Each build (and each overlay build) writes its own directory under the evidence root. A build id is
the UTC time the build started and a sequence number within that second, ``20260929T101530Z-001``:
sortable as text, known before the engine runs (the build log streams into the directory while the
image id does not exist yet, and a failed build has none), and unique under the build directory's
lock (creation is an exclusive ``mkdir``; a collision takes the next number).

``latest`` is a relative symlink to the newest build that passed its gate, replaced atomically (a
temporary link renamed over it); a failed or interrupted build keeps its own directory (``result.json``
with ``ok: false``) but never moves it, so ``latest`` always names an image that may be published.
``publish`` finds its build by image id (:func:`find_gated`), not through ``latest``, so a later build
never breaks publishing an earlier gated image. Retention (:func:`prune`) keeps the newest N builds
(``--keep-builds``, ``$STACKFORGE_KEEP_BUILDS``, default 10) and never deletes one holding
``publish.json``, the one ``latest`` names, or the build that just ran.

Readers that were given ``build/<stack>/evidence/`` (the flat layout of earlier releases) resolve it
with :func:`resolve`: ``latest`` when there is one, else the directory itself.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
from pathlib import Path
from typing import Any

from stackforge import safeio
from stackforge.errors import UserError

LATEST = "latest"
RESULT = "result.json"
PUBLISHED = "publish.json"
KEEP_ENV = "STACKFORGE_KEEP_BUILDS"
KEEP_DEFAULT = 10
BUILD_ID = re.compile(r"^\d{8}T\d{6}Z-\d{3,}$")


def build_id(now: _dt.datetime, seq: int = 1) -> str:
    """``YYYYMMDDTHHMMSSZ-NNN`` for ``now`` (UTC) and the sequence number within that second."""
    return f"{now.astimezone(_dt.timezone.utc):%Y%m%dT%H%M%SZ}-{seq:03d}"


def is_build(path: Path) -> bool:
    return BUILD_ID.match(path.name) is not None and path.is_dir() and not path.is_symlink()


def builds(root: Path) -> list[Path]:
    """The build directories under ``root``, oldest first."""
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((p for p in entries if is_build(p)), key=lambda p: p.name)


def new_build(root: Path, now: _dt.datetime | None = None) -> Path:
    """Create and return a new, empty build directory under ``root`` (migrating a flat legacy layout first)."""
    root.mkdir(parents=True, exist_ok=True)
    migrate_legacy(root)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    seq = 1
    while True:
        path = root / build_id(now, seq)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            seq += 1


#: a build's result.json: a few KiB
RESULT_LIMIT = 4 << 20


def read_result(build: Path) -> dict[str, Any] | None:
    """A build's ``result.json``; None when it has none or one that is not a JSON object within its bounds (a
    FIFO, a device or a link out of the build is never opened)."""
    if not (build / RESULT).is_file():
        return None
    try:
        data = safeio.read_json(build / RESULT, what="build result", limit=RESULT_LIMIT, root=build)
    except safeio.Malformed:
        return None
    return data if isinstance(data, dict) else None


def latest(root: Path) -> Path | None:
    """The build ``latest`` names, or None."""
    link = root / LATEST
    if not link.is_symlink():
        return None
    target = (root / os.readlink(link)).resolve()
    return target if target.is_dir() else None


def newest(root: Path) -> Path | None:
    """The newest build under ``root``, whatever its result (a failed one too)."""
    found = builds(root)
    return found[-1] if found else None


def point_latest(root: Path, build: Path) -> None:
    """Point ``root/latest`` at ``build`` (a relative link, replaced atomically)."""
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(build.name, tmp)
    os.replace(tmp, root / LATEST)


def resolve(path: Path) -> Path:
    """An evidence directory as a reader means it: ``path/latest`` when ``path`` is an evidence root with
    one, else ``path`` (a build directory, or the flat layout of earlier releases)."""
    found = latest(path)
    return found if found is not None else path


def find_gated(root: Path, image_id: str, target: str | None = None) -> tuple[Path | None, list[Path]]:
    """(the newest build under ``root`` that passed its gate and made ``image_id``, for ``target`` when given;
    every build, oldest first)."""
    found = builds(root)
    for build in reversed(found):
        result = read_result(build)
        if not result or not result.get("ok") or result.get("image_id") != image_id:
            continue
        if target is None or result.get("target") == target:
            return build, found
    return None, found


def keep_builds(value: int | str | None = None) -> int:
    """How many builds a stack keeps: ``value``, else ``$STACKFORGE_KEEP_BUILDS``, else 10 (at least 1)."""
    where = "--keep-builds"
    if value is None:
        value, where = os.environ.get(KEEP_ENV) or KEEP_DEFAULT, KEEP_ENV
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(
            f"{where}={value!r}: give a whole number of builds, at least 1",
            file=where,
            fix=f"e.g. {where}={KEEP_DEFAULT}",
        )
    return n


def prune(root: Path, keep: int, current: Path | None = None) -> list[Path]:
    """Delete the builds beyond the newest ``keep``, except one holding ``publish.json``, the one ``latest``
    names and ``current``. Returns what was deleted."""
    protected = {p.resolve() for p in (latest(root), current) if p is not None}
    removed = []
    for build in builds(root)[:-keep] if keep > 0 else builds(root):
        if build.resolve() in protected or (build / PUBLISHED).exists():
            continue
        shutil.rmtree(build, ignore_errors=True)
        removed.append(build)
    return removed


def migrate_legacy(root: Path) -> Path | None:
    """Move a flat evidence directory of an earlier release (files directly in ``root``) into a build
    directory of its own, named by its time, so its ``publish.json`` is kept; ``latest`` names it when it
    passed its gate. Returns the new directory, or None when there was nothing to move."""
    marker = next((root / n for n in (RESULT, "inputs.json", "Dockerfile") if (root / n).is_file()), None)
    if marker is None:
        return None
    when = _dt.datetime.fromtimestamp(marker.stat().st_mtime, _dt.timezone.utc)
    seq = 1
    while (root / build_id(when, seq)).exists():
        seq += 1
    dest = root / build_id(when, seq)
    dest.mkdir()
    for entry in list(root.iterdir()):
        if entry == dest or is_build(entry) or entry.name == LATEST or entry.name.startswith("."):
            continue
        os.replace(entry, dest / entry.name)
    result = read_result(dest)
    if result and result.get("ok") and latest(root) is None:
        point_latest(root, dest)
    return dest


def finish(build: Path, *, ok: bool, keep: int | str | None = None) -> None:
    """After a build wrote its ``result.json``: move ``latest`` to it when it passed, then prune old builds."""
    root = build.parent
    if ok:
        point_latest(root, build)
    prune(root, keep_builds(keep), current=build)


def made_by(stack_dir: Path, image_id: str) -> Path | None:
    """The gated build under ``stack_dir`` that made ``image_id`` (the stack's builds, then its overlays'), or None."""
    roots = [stack_dir / "evidence", *sorted((stack_dir / "overlays").glob("*/evidence"))]
    for root in roots:
        found, _ = find_gated(root, image_id)
        if found is not None:
            return found
    return None


def smoke_dir(stack_dir: Path, image_id: str, recipe: str) -> Path:
    """Where a smoke of ``image_id`` with ``recipe`` keeps its evidence: ``smoke/<recipe>/`` of the gated build
    that made the image (the stack's builds, then its overlays'), else ``<stack_dir>/smoke/<image id>/<recipe>/``
    for an image no build here made."""
    found = made_by(stack_dir, image_id)
    if found is not None:
        return found / "smoke" / recipe
    return stack_dir / "smoke" / image_id.removeprefix("sha256:")[:12] / recipe


def tests_dir(stack_dir: Path, image_id: str, slice_name: str) -> Path:
    """Where a test slice run in ``image_id`` keeps its evidence: ``tests/<slice>/`` of the gated build that made
    the image, else ``<stack_dir>/tests/<image id>/<slice>/`` for an image no build here made."""
    found = made_by(stack_dir, image_id)
    if found is not None:
        return found / "tests" / slice_name
    return stack_dir / "tests" / image_id.removeprefix("sha256:")[:12] / slice_name
