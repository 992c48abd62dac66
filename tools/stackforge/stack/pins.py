"""Parts of a pinned version, as the rules and tag templates see them."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version


@dataclass(frozen=True)
class Pin:
    """``2.11.0.post2+musa5.2.0`` → release 2.11.0, post 2, public 2.11.0.post2, local musa5.2.0."""

    version: str

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def public(self) -> str:
        return self.version.split("+", 1)[0]

    @property
    def local(self) -> str | None:
        return self.version.split("+", 1)[1] if "+" in self.version else None

    @property
    def release(self) -> str:
        return ".".join(str(p) for p in self.parsed.release)

    @property
    def post(self) -> int | None:
        return self.parsed.post

    def as_context(self) -> dict:
        return {
            "version": self.version,
            "public": self.public,
            "local": self.local or "",
            "release": self.release,
            "post": self.post,
        }
