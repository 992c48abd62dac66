"""A no-op ``stackforge build``: answered from the record of the last gated build of exactly the same inputs.

After every successful, loaded ``build`` the CLI stores a record keyed by a digest of the build's inputs as the
command line sees them before any stack is parsed: the options (only those in :data:`OPTIONS`; any other option,
or one of :data:`MUST` at a value other than its default, means no record and no answer), the ``--set`` values,
the bytes of every file under the root's ``stacks/`` (lock files included: ``stacks/locks/``), ``patches/`` and
``images/`` (and of the template tree beside the source, which a root without one renders from), the
environment (``STACKFORGE_*``, ``DOCKER_*``, ``BUILDX_*``), the docker client's configuration and current
builder, ``~/.netrc``, the CA bundle's bytes, and :func:`~stackforge.digests.code_fingerprint` (stackforge,
pydantic, PyYAML, Jinja). The record holds what the build produced (tag, image id, base reference and the
engine's id of it, the evidence directory, and what it printed) and the digests of the other repository files the
stack names (a patch series, a key file outside those trees).

A later build whose key matches asks the engine once (``docker image inspect TAG BASE``): when the tag still
names the recorded image, the base the recorded id, the extra files their recorded digests and the evidence
directory still holds the passing build, it prints what the build printed and writes nothing. Anything else
— a missing or malformed store, an unreadable file, a failing engine — is a miss: the full build runs.
Package indexes are not asked again (``--refresh`` forces the full build).

This module imports no library (model, Jinja, engine client): it runs before the stack is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import stackforge
from stackforge.clients import credentials
from stackforge.digests import code_fingerprint, file_digest, tree_digest
from stackforge.errors import UserError

VERSION = 3
STORE = "uptodate.json"
KEEP = 16  # keys kept (e.g. each target, with and without --json)
#: options (argparse destinations) a recorded answer may stand for: each is part of the key
OPTIONS = frozenset(
    {
        "command",
        "root",
        "stack",
        "target",
        "load",
        "builder",
        "ca_bundle",
        "syntax",
        "network",
        "out",
        "json",
        "lock_timeout",
        "overrides",
        "no_cache",
        "refresh",
        "offline",
        "mirror",
        "doctor",
        "overlay",
        "reuse_base",
        "keep_builds",
        "cache_from",
        "cache_to",
        "registry_cache",
        "platform",
    }
)
#: options that must be at their default for an answer: each asks for work a record cannot stand for
MUST: dict[str, Any] = {
    "load": True,
    "no_cache": False,
    "refresh": False,
    "offline": False,
    "mirror": None,
    "doctor": False,
    "overlay": None,
    "reuse_base": False,
    "keep_builds": None,
    # a registry cache import or export: the build asks the registry (and an inline export changes the image)
    "cache_from": [],
    "cache_to": None,
    "registry_cache": None,
}
#: options that change how a build runs, not what it makes: such a build stores its answer under the key of
#: the same build without them (a later plain build of the same inputs may answer from it)
HOW: dict[str, Any] = {"no_cache": False, "refresh": False, "keep_builds": None}
#: set on args by the CLI and the option helpers; not options
INTERNAL = frozenset({"func", "workspace", "_selected_stacks"})
ENV_PREFIXES = ("STACKFORGE_", "DOCKER_", "BUILDX_")
#: variables of those prefixes that no build reads: the device uuids a lease granted (smoke's preflight)
ENV_IGNORED = frozenset({"STACKFORGE_DEVICE_UUID"})
TREES = ("stacks", "patches", "images")
SOURCE_IMAGES = Path(stackforge.__file__).resolve().parent / "images"  # builder.plan.render.SOURCE_IMAGES
#: libraries whose code shapes what a build renders, beyond the validating ones
LIBRARIES = ("pydantic", "pydantic_core", "yaml", "jinja2")
SKIP = ("__pycache__",)


def _hash_file(h, label: str, path: Path | None) -> None:
    if path is None or not path.is_file():
        h.update(f"{label}\0absent\n".encode())
        return
    h.update(f"{label}\0{path.resolve()}\0{file_digest(path)}\n".encode())


def key(args, root: Path, ca_bundle: Path | None, *, as_plain: bool = False) -> str | None:
    """The digest of the build's inputs, or None when its options allow no recorded answer. ``as_plain``: the
    key of the same build with the options of :data:`HOW` at their defaults (the key its record goes under)."""
    given = {k: v for k, v in vars(args).items() if k not in INTERNAL}
    if as_plain:
        given.update({k: v for k, v in HOW.items() if k in given})
    if set(given) - OPTIONS or any(given.get(k, v) != v for k, v in MUST.items()):
        return None
    options = {k: str(Path(v).resolve()) if k == "out" and v else v for k, v in sorted(given.items())}
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED}
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "version": VERSION,
                "root": str(root.resolve()),
                "options": options,
                "env": env,
                "code": code_fingerprint(LIBRARIES),
            },
            sort_keys=True,
            default=str,
        ).encode()
    )
    trees = {(root / t).resolve() for t in TREES if (root / t).is_dir()}
    if SOURCE_IMAGES.is_dir():
        trees.add(SOURCE_IMAGES)
    for tree in sorted(trees):
        h.update(f"tree {tree} {_digest(tree)}\n".encode())
    docker_config = credentials.docker_config_dir()
    _hash_file(h, "docker config", credentials.docker_config_file())
    _hash_file(h, "buildx builder", docker_config / "buildx" / "current")
    _hash_file(h, "netrc", credentials.netrc_file())
    _hash_file(h, "ca bundle", ca_bundle)
    return h.hexdigest()


def keys(args, root: Path, ca_bundle: Path | None) -> tuple[str | None, str | None]:
    """(the key a recorded answer may be looked up under, the key this build's record goes under), with the
    inputs hashed once: the first is None when an option of :data:`HOW` asks for the work itself."""
    plain = key(args, root, ca_bundle, as_plain=True)
    asks = any(getattr(args, k, v) != v for k, v in HOW.items())
    return (None if asks else plain), plain


def _digest(path: Path) -> str:
    """A file or a tree as the build reads it: through its symlinks, without ``__pycache__``."""
    return tree_digest(path, follow_links=True, skip=SKIP)


def named_files(root: Path, values: Any) -> dict[str, str]:
    """Digests of the repository paths (outside :data:`TREES`) among the strings of ``values`` (a stack as
    JSON): a patch series, a key file named by a stack value."""
    root = root.resolve()
    inside = [root / t for t in TREES]
    found: dict[str, str] = {}

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str) and v and len(v) < 4096 and "://" not in v and "\n" not in v and "\0" not in v:
            try:
                p = (root / v).resolve()
                if p != root and p.is_relative_to(root) and p.exists() and not any(p.is_relative_to(t) for t in inside):
                    found[v] = _digest(p)
            except (OSError, ValueError):
                pass

    walk(values)
    return found


def _load(store: Path) -> dict[str, Any]:
    try:
        doc = json.loads(store.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _engine_ids(refs: list[str], builder: str | None = None) -> list[str] | None:
    """The image id of each reference, from one ``docker image inspect`` in the engine ``builder`` builds into;
    None when any is missing."""
    from stackforge.clients.engine import Engine  # here: the answer's other paths never load the engine client

    try:
        return Engine(builder=builder).image_ids(refs)
    except UserError:
        return None


def answer(key_: str | None, cache: Path, builder: str | None = None) -> bool:
    """Print the recorded build's output and return True when the record of ``key_`` is proven current (its image
    still in the engine the buildx ``builder`` builds into)."""
    if key_ is None:
        return False
    record = _load(cache / STORE).get(key_)
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return False
    try:
        tag, image_id, base, base_id = (str(record[k]) for k in ("tag", "image_id", "base", "base_id"))
        evidence, build_id = Path(record["evidence"]), str(record["build_id"])
        out, err, extra = str(record["stdout"]), str(record["stderr"]), dict(record["extra"])
        result = json.loads((evidence / "result.json").read_text())
        root = Path(record["root"])
        if not (result.get("ok") is True and result.get("build_id") == build_id and result.get("image_id") == image_id):
            return False
        if any(_digest(root / rel) != digest for rel, digest in extra.items()):
            return False
    except (KeyError, TypeError, ValueError, OSError):
        return False
    if _engine_ids([tag, base], builder) != [image_id, base_id]:
        return False
    print(
        f"up to date: {tag} ({image_id}) is the image of build {build_id}; evidence of build {build_id}: {evidence}",
        file=sys.stderr,
    )
    sys.stderr.write(err)
    sys.stdout.write(out)
    sys.stdout.flush()
    return True


def store(
    key_: str | None, now: str | None, cache: Path, root: Path, stack: Any, outcome: Any, out: str, err: str
) -> None:
    """Record a gated, loaded build under ``key_`` (``now``: the key computed again after the build; an input
    that changed while it ran stores nothing). ``stack``: the stack as JSON; ``outcome``: the BuildOutcome."""
    if key_ is None or now != key_ or not outcome.image_id:
        return
    try:
        inputs = json.loads((Path(outcome.evidence) / "inputs.json").read_text())
        # the engine's own name for the base (its config digest, the label, is not the containerd store's id)
        base, base_id = inputs["base"]["image"], inputs["base"]["engine_id"]
        if not (isinstance(base, str) and isinstance(base_id, str) and base and base_id):
            return
        record = {
            "version": VERSION,
            "tag": outcome.tag,
            "image_id": outcome.image_id,
            "base": base,
            "base_id": base_id,
            "evidence": str(Path(outcome.evidence).resolve()),
            "build_id": Path(outcome.evidence).name,
            "root": str(root.resolve()),
            "stdout": out,
            "stderr": err,
            "extra": named_files(root, stack),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return
    entries = {k: v for k, v in _load(cache / STORE).items() if k != key_}
    entries = dict(list(entries.items())[-(KEEP - 1) :])
    entries[key_] = record
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{STORE}.{os.getpid()}"
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, cache / STORE)
    except OSError:
        pass
