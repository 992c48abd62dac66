"""The stack agrees with its upstreams' own pins (``upstreams.<name>.agree``): the files read on the host.

What is compared: the requirement files' lines, the Dockerfiles' ``ARG NAME=VALUE`` lines (``agree.args``, per
stage) and the KEY=VALUE files, each against the stack's pin of that project (a package, or a target's own exact
requirement such as Mooncake's) or the stack value the key names.

:mod:`stackforge.stack.agreement` compares; this module reads the upstream's files, from an exported tree
(render and build, after the patch series: what the build reads) or from the host's git mirror cache at the
pinned commit (``stackforge lint``, which fetches nothing unless asked), and turns findings into the one error
render and build fail with.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stackforge.clients import upstream as sources
from stackforge.clients.git import git
from stackforge.clients.workspace import Workspace, workspace_for
from stackforge.errors import BuildFailed, UserError
from stackforge.stack import agreement
from stackforge.stack.agreement import Finding
from stackforge.stack.load import LoadedStack, stack_value
from stackforge.stack.targets import agreed_pins, target_pins
from stackforge.urls import split

MAX_BYTES = 256 * 1024  # one file of an upstream read for a comparison

Reader = Callable[[str], "str | None"]


def _text(data: bytes, what: str) -> str:
    if len(data) > MAX_BYTES:
        raise UserError(f"{what} is larger than {MAX_BYTES // 1024} KiB", fix="a pin file is small")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} is not UTF-8 text", fix="fix the file's encoding in the upstream") from None


def tree_reader(tree: Path, upstream: str) -> Reader:
    """Files of an exported tree; a path that leads outside it (a link) or is no file reads as missing."""
    top = tree.resolve()

    def read(rel: str) -> str | None:
        real = Path(os.path.realpath(top / rel))
        if top not in real.parents or not real.is_file():
            return None
        with real.open("rb") as f:
            return _text(f.read(MAX_BYTES + 1), f"{upstream}:{rel}")

    return read


def git_reader(mirror: Path, commit: str, upstream: str) -> Reader:
    """Files of ``commit`` in a bare mirror; a path that is no regular file there (a link, a directory, absent)
    reads as missing."""

    def read(rel: str) -> str | None:
        entry = git(mirror, "ls-tree", commit, "--", rel, check=False).stdout.split("\t", 1)[0].split()
        if len(entry) != 3 or entry[0] not in ("100644", "100755") or entry[1] != "blob":
            return None
        res = git(mirror, "cat-file", "blob", entry[2], binary=True, check=False)
        return _text(res.stdout, f"{upstream}:{rel} at {commit[:12]}") if res.ok else None

    return read


def environment(loaded: LoadedStack) -> dict[str, str]:
    p = loaded.model.platform
    return agreement.marker_environment(p.python, p.arch)


def pins(loaded: LoadedStack) -> dict[str, str]:
    """Every pin an ``agree`` compares: the packages, and the exact requirements of the targets' own phases."""
    return {n: version for n, (version, _) in agreed_pins(loaded.model).items()}


def pin_keys(loaded: LoadedStack) -> dict[str, str]:
    """The stack key of each pin :func:`pins` gives that is not a package's version (a target's requirement)."""
    return {n: key for n, (_, key) in target_pins(loaded.model).items()}


def read_lines(loaded: LoadedStack, upstream: str, read: Reader) -> tuple[list[agreement.Line], list[Finding]]:
    """The lines ``upstreams.<upstream>.agree`` compares, read through ``read``: its requirement files' lines, then
    its Dockerfiles' ARG lines as requirement lines; and a finding for each file or build argument it names that
    ``read`` does not have."""
    agree = loaded.model.upstreams[upstream].agree
    assert agree is not None
    found = agreement.read_requirements(read, list(agree.requirements))
    missing = [
        Finding(
            "missing",
            upstream,
            path.split(" (via ")[0],
            None,
            "",
            None,
            None,
            f"{path} does not exist in the upstream at its pinned commit",
            f"name a file the upstream has in upstreams.{upstream}.agree.requirements",
        )
        for path in found.missing
    ]
    lines = list(found.lines)
    for path, names in agree.args.items():
        text = read(path)
        if text is None:
            missing.append(
                Finding(
                    "missing",
                    upstream,
                    path,
                    None,
                    "",
                    None,
                    None,
                    f"{path} does not exist in the upstream at its pinned commit",
                    f"name a Dockerfile the upstream has in upstreams.{upstream}.agree.args",
                )
            )
            continue
        args = agreement.dockerfile_args(text, path, names)
        lines += args.lines
        for arg, project in names.items():
            if not any(line.arg == arg for line in args.lines):
                missing.append(
                    Finding(
                        "missing",
                        upstream,
                        path,
                        None,
                        project,
                        None,
                        None,
                        f"{path} declares no ARG {arg}=<version> (in any stage) to compare with the stack's {project}",
                        f"remove {arg} from upstreams.{upstream}.agree.args.{path}, or name the build argument the "
                        "Dockerfile declares",
                    )
                )
    return lines, missing


def key_values(loaded: LoadedStack, upstream: str) -> dict[str, dict[str, tuple[str, str | None]]]:
    """``{path: {KEY: (stack key, stack value)}}`` of the upstream's ``agree.keys`` (None: the stack leaves the
    value unset)."""
    agree = loaded.model.upstreams[upstream].agree
    out: dict[str, dict[str, tuple[str, str | None]]] = {}
    for path, keys in (agree.keys if agree else {}).items():
        out[path] = {k: (ref, stack_value(loaded.model, ref)) for k, ref in keys.items()}
    return out


def check(loaded: LoadedStack, upstream: str, read: Reader) -> list[Finding]:
    """Every finding of ``upstreams.<upstream>.agree`` against the files ``read`` gives."""
    agree = loaded.model.upstreams[upstream].agree
    if agree is None:
        return []
    lines, out = read_lines(loaded, upstream, read)
    excepts = {n: r for n, r in agree.except_.items() if r is not None}
    result = agreement.compare(upstream, lines, pins(loaded), excepts, env=environment(loaded), keys=pin_keys(loaded))
    out += result.findings
    for path, wanted in key_values(loaded, upstream).items():
        out += agreement.compare_keys(upstream, path, read(path), wanted)
    return out


def located(finding: Finding) -> dict:
    """A finding as ``stackforge lint`` reports one (the keys of a rule's finding, and the comparison)."""
    return {
        "rule": "agree",
        "message": finding.message,
        "fix": finding.fix,
        "file": f"{finding.upstream}:{finding.path}" if finding.path else f"upstreams.{finding.upstream}.agree",
        "line": finding.line,
        "col": None,
        "kind": finding.kind,
        "package": finding.package,
        "stack": finding.stack,
        "upstream": finding.spec,
    }


def render(finding: Finding) -> str:
    d = located(finding)
    return f"{d['file']}{':' + str(d['line']) if d['line'] else ''}: agree: {d['message']}\n  fix: {d['fix']}"


def failure(loaded: LoadedStack, upstream: str, findings: list[Finding]) -> BuildFailed:
    """The one error render and build stop with: the finding itself, or every finding of the upstream."""
    pin = loaded.model.upstreams[upstream].pin
    if len(findings) == 1:
        f = findings[0]
        return BuildFailed(
            f"stack '{loaded.name}' disagrees with upstream {upstream} at {pin}: {f.message}; nothing was built",
            file=f"{f.upstream}:{f.path}" if f.path else None,
            line=f.line,
            fix=f.fix,
        )
    text = "\n".join(render(f) for f in findings)
    return BuildFailed(
        f"stack '{loaded.name}' disagrees with upstream {upstream} at {pin} in {len(findings)} places; nothing was "
        f"built:\n{text}",
        fix=f"pin the upstream's versions, or add reasoned upstreams.{upstream}.agree.except entries "
        f"(stackforge lint {loaded.name} lists them)",
    )


def check_trees(loaded: LoadedStack, trees: dict[str, Path]) -> None:
    """Render and build: every upstream with ``agree`` against its exported, patched tree; fail on a finding."""
    for name, up in loaded.model.upstreams.items():
        if up.agree is not None and name in trees:
            findings = check(loaded, name, tree_reader(trees[name], name))
            if findings:
                raise failure(loaded, name, findings)


# --- lint: the host's mirror cache ----------------------------------------------------------------------------


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # upstreams compared


def cached_mirror(loaded: LoadedStack, name: str, workspace: Workspace) -> Path | None:
    """The host's bare mirror of git upstream ``name`` when it holds the pinned commit, else None (no network)."""

    up = loaded.model.upstreams[name]
    if up.git is None or up.commit is None:
        return None
    url = split(up.git)[0]
    try:
        url = sources.resolve_git_url(url, loaded.root)
    except UserError:
        return None
    mirror = sources.mirror_path(url, workspace.cache())
    if not mirror.is_dir() or not git(mirror, "cat-file", "-e", f"{up.commit}^{{commit}}", check=False).ok:
        return None
    return mirror


def fetch_mirror(loaded: LoadedStack, name: str, workspace: Workspace, *, refresh: bool = False) -> Path:
    """The mirror of git upstream ``name`` holding its pinned commit: fetched when it does not, or always with
    ``refresh`` (to see the upstream's newest branches and tags)."""

    up = loaded.model.upstreams[name]
    spec = sources.UpstreamSpec(git=up.git, tag=up.tag, commit=up.commit, name=name)
    return sources.fetch_upstream(spec, workspace.cache(), root=loaded.root, workspace=workspace, reuse=not refresh)


def lint_upstreams(loaded: LoadedStack, workspace: Workspace | None = None, *, fetch: bool = False) -> LintResult:
    """Every upstream with ``agree`` compared at its pinned commit from the host's mirror cache; an upstream whose
    commit is not cached is a note, or fetched first with ``fetch`` (``stackforge lint --upstreams``)."""
    ws = workspace_for(loaded, workspace)
    out = LintResult()
    for name, up in loaded.model.upstreams.items():
        if up.agree is None:
            continue
        if up.git is None:
            out.notes.append(
                f"not checked: upstream {name} is a release sdist (render and build check it: "
                f"stackforge render {loaded.name})"
            )
            continue
        mirror = fetch_mirror(loaded, name, ws) if fetch else cached_mirror(loaded, name, ws)
        if mirror is None:
            out.notes.append(
                f"not checked: upstream {name} at {up.commit} is not fetched (run stackforge render {loaded.name}, "
                f"or stackforge lint --upstreams {loaded.name})"
            )
            continue
        assert up.commit is not None
        out.findings += check(loaded, name, git_reader(mirror, up.commit, name))
        out.checked.append(name)
    return out
