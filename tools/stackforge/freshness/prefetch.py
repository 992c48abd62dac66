"""Index queries started while the stack model is still being built.

A query command spends most of its start importing and building the stack model (pydantic), and most of
the rest waiting for the indexes. ``start`` reads the stack document instead (YAML, inheritance and
``--set``; ``stack.document``, no model), takes each package whose name and index pass the model's own
grammar, and asks that index for the package's project page on background threads while the caller goes
on to load the stack. The pages land in the clients' memo, and the document goes to the loader
(``stack.load``'s ``read=``), so the stack's files are read once.

Nothing the prefetch learns is used on its own word: ``lines.clients_for(..., reuse=...)`` takes a
prefetched client only when the validated stack resolves the same URL, credential and cache for that
index, and every page is still read through the client (a page the prefetch did not get, or got as an
error, is asked for again). A stack that then fails validation has been queried at the index URLs its
own file names, and at no other. The threads are daemons: a run that fails never waits for them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import grammar
from stackforge.clients import credentials
from stackforge.clients.index import IndexClient
from stackforge.stack import document
from stackforge.urls import Credential, redact
from stackforge.urls import split as split_credentials

#: background threads at most (the clients bound their own connections per index)
MAX_THREADS = 32


def _name_ok(value: Any, pattern) -> bool:
    return isinstance(value, str) and grammar.check_text(value) is None and pattern.fullmatch(value) is not None


def _index_urls(data: dict) -> dict[str, tuple[str, Credential | None]]:
    """Index name -> (credential-free URL, the credential split off it, as the loader splits it), for each index
    whose URL the model would accept. ``data`` is left as it is: the loader takes it next."""
    indexes = data.get("indexes")
    if not isinstance(indexes, dict):
        return {}
    out = {}
    for name, entry in indexes.items():
        url = entry.get("url") if isinstance(entry, dict) else None
        if not (_name_ok(name, grammar.NAME_RE) and isinstance(url, str)):
            continue
        clean, found = split_credentials(url)
        if grammar.check_url(clean, redact(clean)) is None:
            out[name] = (clean.rstrip("/"), found)
    return out


def _packages(data: dict, wanted: Iterable[str] | None) -> dict[str, str]:
    """Package -> index name for the packages to ask about: ``wanted`` (default every package) and the packages
    their built-for rules compare with."""
    packages = data.get("packages")
    if not isinstance(packages, dict):
        return {}
    names = [n for n in (wanted or packages) if n in packages]
    rules = data.get("rules")
    built_for = rules.get("built_for") if isinstance(rules, dict) else None
    for rule in built_for if isinstance(built_for, list) else []:
        target = rule.get("for") if isinstance(rule, dict) else None
        if isinstance(target, str) and target in packages and rule.get("package") in names:
            names.append(target)
    out = {}
    for name in dict.fromkeys(names):
        pkg = packages[name]
        index = pkg.get("index") if isinstance(pkg, dict) else None
        if _name_ok(name, grammar.PROJECT_RE) and isinstance(index, str):
            out[name] = index
    return out


@dataclass
class Prefetch:
    """What ``start`` read and started: the stack's document (for ``stack.load``'s ``read=``; None when the
    reader refused it) and the clients asking for its pages, by index name (``lines.clients_for``'s ``reuse=``)."""

    document: document.Document | None = None
    clients: dict[str, IndexClient] = field(default_factory=dict)


def start(
    root: Path,
    stack: str,
    overrides: list[str],
    *,
    packages: Iterable[str] | None = None,
    cache_dir: Path | None = None,
    max_workers: int = 8,
) -> Prefetch:
    """Read stack ``stack`` of ``root`` and start asking each of its indexes for its packages' pages (``packages``,
    default all). A stack the document reader refuses starts nothing (the load that follows reports why)."""
    try:
        doc = document.read(root.resolve(), stack, list(overrides))
    except Exception:  # the validating load that follows reports every problem
        return Prefetch()
    clients: dict[str, IndexClient] = {}
    work: queue.SimpleQueue = queue.SimpleQueue()
    try:
        urls = _index_urls(doc.data)
        for name, index in _packages(doc.data, packages).items():
            if index not in urls:
                continue
            if index not in clients:
                url, found = urls[index]
                cred = credentials.resolve(url, index, found)
                clients[index] = IndexClient(url, credential=cred, cache_dir=cache_dir, max_workers=max_workers)
            work.put((clients[index], name))
    except Exception:  # whatever the unvalidated document trips here, the validated run meets and reports
        return Prefetch(doc)
    for _ in range(min(MAX_THREADS, work.qsize())):
        threading.Thread(target=_drain, args=(work,), name="stackforge-prefetch", daemon=True).start()
    return Prefetch(doc, clients)


def _drain(work: queue.SimpleQueue) -> None:
    while True:
        try:
            client, name = work.get_nowait()
        except queue.Empty:
            return
        try:
            client.project(name)
        except Exception:  # an error is asked again, and reported, by the validated run
            continue
