"""Build cache shared through a registry: what ``--cache-from``, ``--cache-to`` and ``--registry-cache`` ask
for, checked before anything reaches a command line, and the buildx arguments and bake fields that carry it.

Two exports, with BuildKit's own backends:

``inline``
    the cache metadata goes into the built image's config (``--cache-to type=inline``, BuildKit's mode=min:
    the records of the image's own layers). It travels with the image: pushing or publishing the image
    publishes the cache, and a later build anywhere imports it with ``--cache-from REF`` naming that image.
    Every engine has it, the classic image store included (so the publisher's layer-store path still works).
``REF`` (a registry reference)
    a separate cache manifest pushed to REF by the build itself (``type=registry,ref=REF,mode=max``: every
    stage's layers, side stages too, such as a kernel's toolchain). Needs an engine that exports cache: the
    containerd image store, or a buildx builder with the docker-container, remote or kubernetes driver.

An import (``--cache-from REF``, repeatable) reads either kind: an image with inline metadata, or a cache
manifest. ``--registry-cache REF`` is the pair that works on every engine: import from REF, export inline,
so that publishing this build's image to REF hands its cache to the next host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stackforge.errors import UserError
from stackforge.grammar import check_image_ref, split_tag
from stackforge.urls import redact_text

INLINE = "inline"
#: what buildx prints when the builder cannot export cache (the classic image store with the docker driver)
NO_EXPORT = "Cache export is not supported"
#: the fix for it
EXPORT_FIX = (
    "export inline instead (--cache-to inline, or --registry-cache REF, then publish the image to REF), or use an "
    "engine that exports cache: the containerd image store (daemon.json features.containerd-snapshotter) or a "
    "buildx builder with the docker-container, remote or kubernetes driver (--builder)"
)


@dataclass(frozen=True)
class RegistryCache:
    """The imports (registry references, in order) and the export (``inline``, a registry reference, or None)."""

    imports: tuple[str, ...] = ()
    export: str | None = None
    #: the option each value came from, for error messages
    origin: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(
        cls, cache_from: Iterable[str] = (), cache_to: str | None = None, registry_cache: str | None = None
    ) -> RegistryCache | None:
        """The cache the options ask for (None: none), each value checked; a bad one is a :class:`UserError`."""
        if INLINE in cache_from:
            raise UserError(
                "--cache-from inline: an import names where the cache is, a registry reference",
                file="--cache-from",
                fix="give the image the inline cache was published with, e.g. --cache-from HOST/NAME:TAG",
            )
        imports = [_checked(ref, "--cache-from") for ref in cache_from]
        export = None if cache_to is None else (INLINE if cache_to == INLINE else _checked(cache_to, "--cache-to"))
        if registry_cache is not None:
            ref = _checked(registry_cache, "--registry-cache")
            if export is not None:
                raise UserError(
                    "--registry-cache sets the export (inline) and --cache-to sets it too",
                    file="--cache-to",
                    fix="give --registry-cache REF alone, or --cache-from REF with --cache-to",
                )
            imports.append(ref)
            export = INLINE
        if export is not None and export != INLINE and "@" in export:
            raise UserError(
                f"--cache-to {export}: a cache is pushed to a tag, not to a digest",
                file="--cache-to",
                fix="name a tag, e.g. --cache-to registry.example/stackforge-cache/post2:buildcache",
            )
        if not imports and export is None:
            return None
        return cls(tuple(dict.fromkeys(imports)), export)

    def from_specs(self) -> list[str]:
        """The ``--cache-from`` values: one registry import per reference."""
        return [f"type=registry,ref={ref}" for ref in self.imports]

    def to_specs(self) -> list[str]:
        """The ``--cache-to`` value, if any: inline (mode=min) or a registry cache manifest with every stage."""
        if self.export is None:
            return []
        return ["type=inline"] if self.export == INLINE else [f"type=registry,ref={self.export},mode=max"]

    def buildx_args(self) -> list[str]:
        """The arguments of ``docker buildx build``."""
        return [a for s in self.from_specs() for a in ("--cache-from", s)] + [
            a for s in self.to_specs() for a in ("--cache-to", s)
        ]

    def bake_fields(self) -> dict[str, list[str]]:
        """The fields of a bake target (``cache-from``, ``cache-to``) that carry the same."""
        out: dict[str, list[str]] = {}
        if self.imports:
            out["cache-from"] = self.from_specs()
        if self.export is not None:
            out["cache-to"] = self.to_specs()
        return out

    def for_target(self, name: str) -> RegistryCache:
        """The cache of one bake target: a registry export goes to its own tag (REF's tag, ``-``, the target's
        name; ``name`` alone when REF has none), imported first, so targets of one bake do not overwrite each
        other's cache. Inline exports and the given imports stay as they are."""
        if self.export is None or self.export == INLINE:
            return self
        repo, tag = split_tag(self.export)
        own = f"{repo}:{(f'{tag}-{name}' if tag else name)[:128]}"
        reason = check_image_ref(own)
        if reason is not None:  # a name no tag can hold (bake target names are [A-Za-z0-9_-])
            raise UserError(f"--cache-to {self.export} for bake target {name}: {reason}", file="--cache-to")
        return RegistryCache(tuple(dict.fromkeys((own, *self.imports))), own)

    def record(self) -> dict[str, Any]:
        """What the evidence says about it (references redacted)."""
        return {"from": [redact_text(r) for r in self.imports], "to": redact_text(self.export) if self.export else None}


def _checked(ref: str, option: str) -> str:
    reason = check_image_ref(ref)
    if reason is None:
        return ref
    raise UserError(
        redact_text(reason if len(reason) <= 400 else reason[:400] + "…"),
        file=option,
        fix=f"give a registry reference, e.g. {option} registry.example/stackforge/post2:py3.11-latest"
        + (" (or inline)" if option == "--cache-to" else ""),
    )


def export_refused(log: str) -> bool:
    """Whether the build failed because its builder cannot export cache (see :data:`EXPORT_FIX`)."""
    return NO_EXPORT in log
