"""The publish tag scheme: immutable tags ``<head><YYYYMMDD><mid><N><tail>``, e.g. ``…-20260929-r2``.

Pure functions only: render a tag for (date, revision), parse one back, group a repository's tags
by revision for a date, pick the newest tag and the first free revision, and check a publish date.
The publisher (``publisher.py``) decides with these which tag to write.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stackforge.errors import UserError
from stackforge.grammar import DATE_RE, TAG_RE

_TAG_FIX = "tags are [A-Za-z0-9_][A-Za-z0-9._-]{0,127}"


@dataclass(frozen=True)
class TagScheme:
    """Immutable publish tags ``<head><date><mid><revision><tail>``.

    ``TagScheme.from_prefix("v0.28.0-ph1-5.2.0-torch2.11.0.post2")`` gives
    ``v0.28.0-ph1-5.2.0-torch2.11.0.post2-20260929-r2`` for (20260929, 2).
    """

    head: str
    mid: str = "-r"
    tail: str = ""

    @classmethod
    def from_prefix(cls, prefix: str) -> TagScheme:
        return cls(head=f"{prefix}-", mid="-r", tail="")

    @classmethod
    def from_render(cls, render: Callable[[str, int], str]) -> TagScheme:
        """Derive the scheme from a function rendering the tag for (date, revision)."""
        date, rev = "99991231", 987654321
        text = render(date, rev)
        if text.count(date) != 1 or text.count(str(rev)) != 1 or text.index(date) > text.index(str(rev)):
            raise UserError(
                f"publish tag template renders {text!r}: it must contain the date once, followed by the revision once",
                fix="write the publish tag as …{{ date }}…{{ revision }}…",
            )
        head, rest = text.split(date)
        mid, tail = rest.split(str(rev))
        return cls(head=head, mid=mid, tail=tail)

    def tag(self, date: str, revision: int) -> str:
        tag = f"{self.head}{date}{self.mid}{revision}{self.tail}"
        if not TAG_RE.match(tag):
            raise UserError(
                f"publish tag {tag!r} is not a valid OCI tag", fix=f"{_TAG_FIX}; shorten or change the tag template"
            )
        return tag

    def parse(self, tag: str) -> tuple[str, int] | None:
        m = re.fullmatch(
            re.escape(self.head) + r"(\d{8})" + re.escape(self.mid) + r"([1-9][0-9]{0,8})" + re.escape(self.tail), tag
        )
        return (m.group(1), int(m.group(2))) if m else None

    def revisions(self, tags: list[str], date: str) -> dict[int, str]:
        out: dict[int, str] = {}
        for t in tags:
            parsed = self.parse(t)
            if parsed and parsed[0] == date:
                out[parsed[1]] = t
        return out

    def newest(self, tags: list[str]) -> str | None:
        parsed = [(p, t) for t in tags if (p := self.parse(t))]
        return max(parsed)[1] if parsed else None

    def check_alias(self, alias: str) -> None:
        """A moving alias is a valid tag that cannot be mistaken for an immutable tag of this scheme."""
        if not TAG_RE.match(alias):
            raise UserError(f"alias {alias!r} is not a valid OCI tag", fix=_TAG_FIX)
        if self.parse(alias):
            raise UserError(
                f"alias {alias!r} has the form of an immutable publish tag",
                fix="a moving alias must not look like <…><YYYYMMDD><…><N>; use e.g. …-latest",
            )


def validate_date(date: str | None) -> str:
    """The publish date: today (UTC) when ``date`` is None, else ``date`` if it is a real YYYYMMDD date."""
    if date is None:
        return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    try:
        if not DATE_RE.fullmatch(date):
            raise ValueError
        _dt.datetime.strptime(date, "%Y%m%d")
    except ValueError:
        raise UserError(f"invalid publish date {date!r}", fix="give the date as YYYYMMDD, e.g. 20260929") from None
    return date


def first_free_revision(taken: Iterable[int]) -> int:
    """The lowest revision (1, 2, …) not in ``taken``: a gap left by a deleted tag is reused."""
    used = set(taken)
    return next(n for n in range(1, len(used) + 2) if n not in used)


#: a published immutable tag read without its templates: <head><YYYYMMDD><mid><N><tail>, where the head is empty or
#: ends in a separator, the mid is an optional separator and letters (``-r``), and the tail is empty or starts with
#: a separator (a target's ``-<target>``)
_PUBLISHED = re.compile(
    r"(?P<head>(?:.*[-._])?)(?P<date>\d{8})(?P<mid>[-._]?[A-Za-z]{1,8})(?P<rev>[1-9][0-9]{0,8})(?P<tail>(?:[-._].*)?)"
)
_FALLBACK = re.compile(r"sha256-[0-9a-f]{64}")


def streams(tags: Iterable[str]) -> dict[TagScheme, list[str]]:
    """The repository's tags grouped by the scheme that renders them (a repository may hold several: another
    stack's, a target's ``-<target>`` tags, an overlay's); moving aliases, record fallback tags (``sha256-<hex>``)
    and tags whose date is not a real date are left out."""
    out: dict[TagScheme, list[str]] = {}
    for tag in tags:
        m = _PUBLISHED.fullmatch(tag)
        if m is None or _FALLBACK.fullmatch(tag):
            continue
        try:
            _dt.datetime.strptime(m["date"], "%Y%m%d")
        except ValueError:
            continue
        out.setdefault(TagScheme(m["head"], m["mid"], m["tail"]), []).append(tag)
    return out


def pattern(scheme: TagScheme) -> str:
    """How a scheme is shown to an operator: ``<head>YYYYMMDD<mid>N<tail>``."""
    return f"{scheme.head}YYYYMMDD{scheme.mid}N{scheme.tail}"
