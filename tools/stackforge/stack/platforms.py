"""A stack's platform lines: the CPU platforms one tag publishes, each the stack with what differs merged over it.

A stack without ``platforms:`` is one line, named by its architecture (``amd64`` for x86_64, ``arm64`` for
aarch64). With ``platforms:``, every line is derived from the resolved stack (inheritance and ``--set`` applied):
its ``with:`` merged over the stack as a child stack's keys are (a list replaces, a mapping merges) and a ``null``
removing the key, then ``platform.arch`` set to the line's; positions follow the values, so a finding about a pin
a line changes names the line's own file:line. The stack as written is the line of its ``platform.arch``.

This module holds the data steps (merge, positions, labels); ``stack.load`` validates each line as a stack.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from stackforge.stack.model import LINE_KEYS, OCI_PLATFORMS, TRIPLETS

#: A MUSA build label at the front of a local label: the toolkit line (musa5.2.0) and an optional GPU-series
#: suffix (mp22), as the vendor's wheels carry them (+musa5.2.0, +musa5.2.1mp22, +musa5.2.0torch2.11.0.post2).
#: A label without a toolkit version (+musa, +musa.2) names no line.
MUSA_LINE = re.compile(r"^(musa\d+(?:\.\d+)+(?:mp\d+)?)(?![\d.])")

#: The short name of each architecture's line when a stack declares none (OCI's architecture names).
ARCH_NAMES = {arch: oci.split("/", 1)[1] for arch, oci in OCI_PLATFORMS.items()}

#: The glibc of each base OS a stack's ``platform.os`` may name: the newest ``manylinux_2_X`` wheel it runs.
#: ``lock`` resolves for it and ``newest`` reads wheel tags by it, so the two agree on what installs.
GLIBC: dict[str, tuple[int, int]] = {
    "ubuntu20.04": (2, 31),
    "ubuntu22.04": (2, 35),
    "ubuntu24.04": (2, 39),
    "debian11": (2, 31),
    "debian12": (2, 36),
    "bookworm": (2, 36),
    "debian13": (2, 41),
    "trixie": (2, 41),
    "rockylinux8": (2, 28),
    "rockylinux9": (2, 34),
}
#: An OS the table does not name is taken to run manylinux2014 (glibc 2.17) wheels and nothing newer: a wheel
#: that needs more may not run on it.
FALLBACK_GLIBC = (2, 17)


def glibc_of(os_label: str) -> tuple[int, int]:
    """The glibc of base OS ``os_label`` (``platform.os``), or FALLBACK_GLIBC for one the table does not name."""
    return GLIBC.get(os_label, FALLBACK_GLIBC)


@dataclass(frozen=True)
class Line:
    """One platform line of a stack: its name, architecture, label, unknown values and builder."""

    name: str
    arch: str
    local: str | None = None
    unknown: dict[str, str] = field(default_factory=dict)
    builder: str | None = None
    declared: bool = False  # written under platforms: (else the stack's one implicit line)
    own: bool = True  # the stack's own line (its platform.arch): the stack as written

    @property
    def suffix(self) -> str:
        """What a line's own files add to the stack's name: nothing for the stack's own line, ``@<line>`` for
        another (build/post2@arm64/, stacks/locks/post2@arm64/); a stack name holds no ``@``."""
        return "" if self.own else f"@{self.name}"

    @property
    def oci(self) -> str:
        return OCI_PLATFORMS[self.arch]

    @property
    def os_arch(self) -> tuple[str, str, str | None]:
        """(os, architecture, variant) of :attr:`oci`: the platform an engine picks an image's manifest by."""
        os_, _, arch = self.oci.partition("/")
        return (os_, arch, None)

    @property
    def triplet(self) -> str:
        return TRIPLETS[self.arch]

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "platform": self.oci,
            "arch": self.arch,
            "triplet": self.triplet,
            **({"local": self.local} if self.local else {}),
            **({"unknown": dict(self.unknown)} if self.unknown else {}),
            **({"builder": self.builder} if self.builder else {}),
        }


def musa_line(version: str) -> str | None:
    """The MUSA build line a version's local label names (``2.11.0.post1+musa5.2.1mp22`` -> ``musa5.2.1mp22``)."""
    _, plus, local = version.partition("+")
    m = MUSA_LINE.match(local.lower()) if plus else None
    return m.group(1) if m else None


def merge(base: Any, over: Any) -> Any:
    """``over`` merged over ``base``: mappings merge (the base's order, new keys after), ``None`` removes a key,
    anything else replaces. Neither argument is changed."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if value is None:
                out.pop(key, None)
            elif key in base:
                out[key] = merge(base[key], value)
            else:
                out[key] = copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def _removed(over: Any, path: tuple) -> list[tuple]:
    """The paths ``over`` removes (its ``None`` values) or replaces (its non-mapping values)."""
    if isinstance(over, dict):
        return [p for k, v in over.items() for p in _removed(v, (*path, k))]
    return [path]


def line_data(data: dict, name: str) -> dict:
    """The stack data of line ``name``: ``data`` without ``platforms``, the line's ``with`` merged over it, and
    ``platform.arch`` the line's."""
    line = data["platforms"][name]
    base = {k: v for k, v in data.items() if k != "platforms"}
    out = merge(base, line.get("with") or {})
    platform = out.get("platform")
    if isinstance(platform, dict):
        out["platform"] = {**platform, "arch": line.get("arch")}
    return out


def line_positions(positions: dict, name: str, with_data: dict) -> dict:
    """Where each value of line ``name`` was written: the stack's positions, with the line's ``with`` values at
    their own lines (a value the line replaces or removes loses the stack's positions below it)."""
    prefix = ("platforms", name, "with")
    # the line's own keys (local, unknown, …) stay where they were written; other lines are not this one's
    out = {p: pos for p, pos in positions.items() if p[:1] != ("platforms",) or p[:2] == ("platforms", name)}
    removed = set(_removed(with_data, ()))
    if removed:  # a position at or below a removed path goes
        heads = None if () in removed else {path[0] for path in removed}
        out = {
            p: pos
            for p, pos in out.items()
            if heads is not None
            and (not p or p[0] not in heads or not any(p[:k] in removed for k in range(len(p) + 1)))
        }
    for p, pos in positions.items():
        if p[: len(prefix)] == prefix and len(p) > len(prefix):
            out[p[len(prefix) :]] = pos
    at = positions.get(("platforms", name, "arch"))
    if at is not None:
        out[("platform", "arch")] = at
    return out


def misplaced_keys(with_data: Any) -> list[str]:
    """The top-level keys of a line's ``with`` that a line may not change."""
    return [str(k) for k in with_data if k not in LINE_KEYS] if isinstance(with_data, dict) else []


def key_exists(data: Any, dotted: str) -> bool:
    """Whether the dotted key names a value of the (dumped) stack ``data``."""
    node = data
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def covers(unknown: dict[str, str], path: tuple) -> str | None:
    """The unknown key ``path`` (a stack key path) falls under, or None."""
    dotted = ".".join(str(p) for p in path)
    for key in unknown:
        if dotted == key or dotted.startswith(key + "."):
            return key
    return None


def unknown_note(line: Line) -> str | None:
    """What ``lint`` says of a line with values no record states, or None."""
    if not line.unknown:
        return None
    keys = list(line.unknown)
    shown = ", ".join(keys[:4]) + (f", … ({len(keys)} in all)" if len(keys) > 4 else "")
    return (
        f"platform {line.name} ({line.oci}) is declared, not buildable: no record states {shown} "
        f"(platforms.{line.name}.unknown); render and build refuse it"
    )
