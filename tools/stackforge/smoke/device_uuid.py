"""The device uuid check of the smoke's preflight: the devices the container sees must be exactly those the
lease granted (``stackforge smoke --device-uuid UUID``, or ``$STACKFORGE_DEVICE_UUID``), so the card scoping
is verified rather than assumed. The preflight reads the visible uuids inside the container
(``torch.musa.get_device_properties(i).uuid``, else the ``UUID`` lines of ``mthreads-gmi -q``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from stackforge.errors import UserError
from stackforge.smoke.report import RowResult

ENV = "STACKFORGE_DEVICE_UUID"
#: a device uuid as tools print it: hex groups with dashes, optionally prefixed (GPU-…)
UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,79}$")


def normalize(uuid: str) -> str:
    """Compared without case and without a ``GPU-``/``MUSA-`` prefix (tools differ in both)."""
    text = uuid.strip().lower()
    for prefix in ("gpu-", "musa-"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def expected(given: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The lease's uuids: ``--device-uuid`` values (repeatable, each a comma list), else ``$STACKFORGE_DEVICE_UUID``."""
    env = os.environ if env is None else env
    values, where = (list(given), "--device-uuid") if given else ([env.get(ENV, "")], ENV)
    out: list[str] = []
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(","))):
            if not UUID.match(part):
                raise UserError(
                    f"{part!r} is not a device uuid",
                    file=where,
                    fix="give the uuid the lease granted, e.g. d6a04b9f-fec2-2c87-aa03-a8360298e63b (a comma list "
                    "for several devices)",
                )
            out.append(part)
    return tuple(dict.fromkeys(out))


def compare(row: RowResult, facts: dict[str, Any], wanted: Sequence[str]) -> RowResult:
    """The preflight row with ``facts`` (the container's), decided by the uuids: equal sets pass; others fail
    naming both; no visible uuid (no device, or none readable) is not a pass: the row is not run."""
    visible = [str(u) for u in facts.get("uuids") or []]
    facts["uuid_check"] = {"expected": list(wanted), "visible": visible, "source": facts.get("uuid_source")}
    if not visible:
        row.details = {**row.details, **facts}
        return row.skipped(
            "not run: the device uuid could not be compared: the container shows no device uuid "
            f"(expected {', '.join(wanted)})"
        )
    want, have = {normalize(u) for u in wanted}, {normalize(u) for u in visible}
    if want != have:
        return row.failed(
            f"the container's visible device uuid(s) {', '.join(visible)} differ from the lease's "
            f"{', '.join(wanted)} (read by {facts.get('uuid_source')})",
            **facts,
        )
    facts["uuid_check"]["matched"] = True
    return row.passed(**facts)
