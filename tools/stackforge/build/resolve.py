"""Resolve a public index's lock for the stack's Python and platform, with the vendor pins held fixed.

pip's own resolver does it (no pip-tools): ``pip install --dry-run --ignore-installed --report`` with
``--python-version``/``--implementation cp``/``--platform …`` and ``--only-binary=:all:``, into a throw-away
``--target``. pip-compile cannot do this: it resolves for the interpreter that runs it, so a host on 3.11
would lock 3.11's wheels and markers for a 3.10 image. The report gives each package's version, the
archive pip chose and that archive's sha256, and its metadata (for the ``# via`` graph).

- **Target.** ``platform.python`` selects the interpreter tags and ``Requires-Python``; ``platform.arch``
  and the glibc of ``platform.os`` (:data:`GLIBC`; an unknown OS falls back to manylinux2014, glibc 2.17)
  select ``manylinux_2_X_<arch>`` and ``linux_<arch>`` wheels. Environment markers (``python_version <
  "3.11"``) are evaluated for the target as well: pip runs with its marker environment set to the
  target's (pip alone would evaluate them for the host). ``python_full_version`` is ``<python>.0``.
- **Vendor pins held fixed.** Every vendor pin is offered to pip only as a local stand-in wheel carrying
  the vendor wheel's own METADATA (read from the vendor index, cached by sha256) at the exact pinned
  version, and constrained to that version (``-c``). A public package's ``Requires-Dist: torch``
  therefore resolves to the vendor torch, never to a public one, and the vendor wheels' own
  dependencies are resolved in the same run. The vendor names are then left out of every lock;
  a vendor name that did not come from a stand-in wheel is an error.
- **Only wheels.** A needed package with no wheel for the target is an error naming it and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name

from stackforge.errors import UserError
from stackforge.stack.model import Stack
from stackforge.urls import Credential, redact

#: glibc of the base OS named by ``platform.os``: the newest manylinux_2_X a wheel may need
GLIBC = {
    "ubuntu20.04": (2, 31), "ubuntu22.04": (2, 35), "ubuntu24.04": (2, 39),
    "debian11": (2, 31), "debian12": (2, 36), "debian13": (2, 41),
}
FALLBACK_GLIBC = (2, 17)
PIP_MIN = (23, 0)  # --report format 1 and --dry-run

# pip with its marker environment replaced by the target's (argv[1] is the environment as JSON).
PIP_SHIM = """import json, runpy, sys
env = json.loads(sys.argv.pop(1))
from pip._vendor.packaging import markers
host = markers.default_environment
markers.default_environment = lambda: {**host(), **env}
sys.argv[0] = "pip"
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Target:
    python: str  # "3.10"
    arch: str  # "x86_64"
    glibc: tuple[int, int]

    @classmethod
    def of(cls, stack: Stack) -> Target:
        return cls(stack.platform.python, stack.platform.arch, GLIBC.get(stack.platform.os, FALLBACK_GLIBC))

    @property
    def platforms(self) -> list[str]:
        lowest = 5 if self.arch == "x86_64" else 17
        out = [f"manylinux_2_{m}_{self.arch}" for m in range(self.glibc[1], lowest - 1, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        out += [f"{name}_{self.arch}" for m, name in legacy.items() if lowest <= m <= self.glibc[1]]
        return [*out, f"linux_{self.arch}"]

    @property
    def tags(self) -> set[Tag]:
        version = tuple(int(p) for p in self.python.split("."))
        return set(cpython_tags(version, platforms=self.platforms)) | set(
            compatible_tags(version, "cp", self.platforms))

    def describe(self) -> str:
        return f"CPython {self.python} on manylinux_2_{self.glibc[1]}_{self.arch}"

    def markers(self) -> dict[str, str]:
        full = f"{self.python}.0"
        return {"implementation_name": "cpython", "implementation_version": full, "os_name": "posix",
                "platform_machine": self.arch, "platform_release": "", "platform_system": "Linux",
                "platform_version": "", "python_full_version": full, "platform_python_implementation": "CPython",
                "python_version": self.python, "sys_platform": "linux"}

    def pip_args(self) -> list[str]:
        return ["--python-version", self.python, "--implementation", "cp", "--only-binary=:all:",
                *[a for p in self.platforms for a in ("--platform", p)]]


@dataclass
class Input:
    """One source of requirements of the public resolution, shown in the lock as ``# via -r <label>``."""

    label: str
    lines: list[str] = field(default_factory=list)
    file: Path | None = None  # a requirements file (read by pip itself)
    constraints: list[str] = field(default_factory=list)  # constraint lines (``-c``) of a requirement file


@dataclass
class Resolved:
    name: str  # canonical
    version: str
    sha256: str | None
    url: str
    requires: list[str]
    extras: set[str]
    requested: bool
    via: set[str] = field(default_factory=set)


def check_pip() -> None:
    """The host's pip can resolve for another target (``lock`` needs nothing beyond pip itself)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("pip")
    except PackageNotFoundError:
        have = None
    parts = tuple(int(p) for p in re.findall(r"\d+", have or "")[:2])
    if have is None or parts < PIP_MIN:
        found = f"pip {have}" if have else "no pip"
        raise UserError(f"`stackforge lock` resolves with pip's own resolver and found {found} for {sys.executable}",
                        fix=f"run: {sys.executable} -m pip install 'pip>={PIP_MIN[0]}.{PIP_MIN[1]}' "
                            "(or: python -m ensurepip --upgrade)")


def stub_wheel(out: Path, name: str, version: str, metadata: str) -> Path:
    """A wheel holding only ``metadata`` (Name and Version set to the pin): how pip sees a vendor pin."""
    msg = Parser().parsestr(metadata)
    del msg["Name"], msg["Version"]
    head = f"Metadata-Version: {msg.get('Metadata-Version', '2.1')}\nName: {name}\nVersion: {version}\n"
    del msg["Metadata-Version"]
    body = head + "".join(f"{k}: {v}\n" for k, v in msg.items())
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version.replace('-', '_')}"
    info = f"{stem}.dist-info"
    files = {f"{info}/METADATA": body, f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stackforge-lock\n"
             "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    path = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{m},,\n" for m in files) + f"{info}/RECORD,,\n")
    return path


def vendor_metadata(stack: Stack, index: str, name: str, version: str, target: Target, cache: Path,
                    credential: Credential | None, ca_bundle: Path | None = None) -> str:
    """The METADATA of the vendor's wheel for ``name==version`` (a wheel for the target if there is one),
    read from the index's file (with the index's ``credential``, trusting ``ca_bundle``) and kept under
    ``cache`` by the file's sha256."""
    from stackforge.freshness.index import IndexClient

    url = stack.indexes[index].url
    client = IndexClient(url, credential=credential)
    wheels = [f for f in client.project(name).files_for(version) if f.kind == "wheel"]
    if not wheels:
        raise UserError(f"index '{index}' has no wheel for {name}=={version}; `stackforge lock` reads the vendor "
                        "wheels' metadata to keep their dependencies consistent",
                        fix=f"check the pin of {name} (stackforge newest {stack.name})")
    wheels.sort(key=lambda f: (not (f.tags & target.tags), f.filename))
    chosen = wheels[0]
    key = chosen.sha256 or hashlib.sha256(chosen.url.encode()).hexdigest()
    hit = cache / f"{key}.METADATA"
    if hit.is_file():
        return hit.read_text()
    cache.mkdir(parents=True, exist_ok=True)
    if ca_bundle:
        client._session().verify = str(ca_bundle)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        whl = client.download(chosen, tmp)  # checks the sha256 the index lists
        with zipfile.ZipFile(whl) as zf:
            members = [m for m in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", m)]
            if len(members) != 1:
                raise UserError(f"{chosen.filename} from index '{index}' has no single .dist-info/METADATA",
                                fix="check the vendor wheel")
            text = zf.read(members[0]).decode("utf-8", errors="replace")
    hit.write_text(text)
    return text


_ASKED = re.compile(r"^\s*(?:The user requested (?!\(constraint\))(?P<req>\S.*)|(?P<who>\S+ \S+) depends on (?P<dep>.+))$")
_CANNOT = re.compile(r"Cannot install (.+?) because these package versions have conflicting dependencies")


def pin_conflicts(stderr: str, stack: Stack) -> list[str]:
    """From pip's conflict message: each pin of the stack that a requirement asks another version of, with its
    stack key and what asked (``numpy==1.26.4 (packages.numpy): gguf 0.17.1 depends on numpy>=2``)."""
    pins: dict[str, tuple[str, str]] = {canonicalize_name(n): (n, p.version) for n, p in stack.packages.items()}
    asked: dict[str, list[str]] = {}
    others: list[str] = []
    held: set[str] = set()

    def ask(text: str, who: str | None) -> None:
        try:
            req = Requirement(text.strip())
        except InvalidRequirement:
            others.append(text.strip())
            return
        name = canonicalize_name(req.name)
        if name not in pins:
            return
        if str(req.specifier) == f"=={pins[name][1]}":
            held.add(name)
        elif not req.specifier.contains(pins[name][1], prereleases=True):
            why = f"{who} depends on {req}" if who else f"a requirement asks for {req}"
            asked.setdefault(name, [])
            if why not in asked[name]:
                asked[name].append(why)

    for cannot in _CANNOT.finditer(stderr):  # what pip --quiet still says
        for item in re.split(r", | and ", cannot.group(1)):
            ask(item, None)
    for line in stderr.splitlines():  # "The conflict is caused by:" lines, when pip prints them
        m = _ASKED.match(line)
        if m:
            ask(m.group("req") or m.group("dep"), m.group("who"))
    if not asked and others:
        asked = {n: [f"it conflicts with {', '.join(others)}"] for n in held}
    return [f"{pins[n][0]}=={pins[n][1]} (packages.{pins[n][0]}): {'; '.join(why)}" for n, why in asked.items()]


def _pip_failure(stderr: str, target: Target, stack: Stack, index: str, credential: Credential | None) -> UserError:
    """pip's failure as a UserError: a package whose files on the index include no wheel for the target
    is named with the fix; anything else (a conflict, an unreachable index, a refused credential) is
    pip's own message."""
    from stackforge.freshness.index import IndexClient, IndexQueryError

    url = stack.indexes[index].url
    m = re.search(r"Could not find a version that satisfies the requirement (\S+)", stderr)
    if m:
        name = re.split(r"[<>=!~;\[ ]", m.group(1), maxsplit=1)[0]
        try:
            files = IndexClient(url, credential=credential).project(name).files
        except IndexQueryError:
            files = []
        if files and not any(f.kind == "wheel" and f.tags & target.tags for f in files):
            names = sorted(f.filename for f in files)
            return UserError(
                f"no wheel of {name} on index '{index}' ({redact(url)}) fits {target.describe()} (it has: "
                f"{', '.join(names[:4])}{', …' if len(names) > 4 else ''}): a package with only an sdist, or only wheels for another Python or "
                "platform, cannot be locked",
                fix=f"pin a version of {name} that ships a wheel for CPython {target.python}, or build its wheel in "
                    "a kernel step; check platform.python and platform.os of the stack")
    tail = "\n".join(line for line in stderr.splitlines() if line.strip())[-1200:]
    moved = pin_conflicts(stderr, stack)
    if moved:
        return UserError(f"the requirements of index '{index}' would move a pin of the stack, which every phase after "
                         f"the one that installs it holds as a constraint: {'; '.join(moved)}\n{tail}",
                         fix="change the pin (packages.<name>.version) or patch the requirement file in the "
                             "upstream's series")
    return UserError(f"pip could not resolve index '{index}' for {target.describe()}: {tail}",
                     fix="check the pins and that the index is reachable (and its credentials: user:password@ in its "
                         "URL, STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD or ~/.netrc)")


def run_pip(tmp: Path, target: Target, index_args: list[str], env: dict[str, str], inputs: list[Input],
            vendor_pins: dict[str, str], stubs: Path, scrub, stack: Stack, index: str,
            credential: Credential | None) -> dict:
    """One pip resolution; returns the ``--report`` JSON (a failure asks the index, with ``credential``,
    which packages lack a wheel for the target)."""
    args: list[str] = []
    for n, inp in enumerate(inputs):
        if inp.file is not None:
            args += ["-r", str(inp.file)]
        if inp.lines:
            path = tmp / f"input-{n}.in"
            path.write_text("\n".join(inp.lines) + "\n")
            args += ["-r", str(path)]
        if inp.constraints:
            path = tmp / f"input-{n}.constraints.txt"
            path.write_text("\n".join(inp.constraints) + "\n")
            args += ["-c", str(path)]
    if vendor_pins:
        pins = "".join(f"{n}=={v}\n" for n, v in vendor_pins.items())
        (tmp / "vendor.txt").write_text(pins)
        args += ["-c", str(tmp / "vendor.txt"), "-r", str(tmp / "vendor.txt"), "--find-links", str(stubs)]
    report = tmp / "report.json"
    cmd = [sys.executable, "-c", PIP_SHIM, json.dumps(target.markers()), "install", "--dry-run", "--ignore-installed",
           "--quiet", "--disable-pip-version-check", "--no-input", "--report", str(report),
           "--target", str(tmp / "target"), *target.pip_args(), *index_args, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    if proc.returncode != 0 or not report.is_file():
        text = scrub(proc.stderr)
        for n, inp in enumerate(inputs):  # the inputs by their labels, not their temporary files
            text = text.replace(str(tmp / f"input-{n}.in"), inp.label)
        raise _pip_failure(text, target, stack, index, credential)
    return json.loads(report.read_text())


def graph(report: dict, target: Target) -> dict[str, Resolved]:
    """The resolved packages, each with what requires it (names, or ``-r vendor`` for a vendor pin)."""
    nodes: dict[str, Resolved] = {}
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        info = item.get("download_info", {})
        hashes = info.get("archive_info", {}).get("hashes", {})
        name = canonicalize_name(meta.get("name", ""))
        nodes[name] = Resolved(name, meta.get("version", ""), hashes.get("sha256"), info.get("url", ""),
                               list(meta.get("requires_dist", [])), set(item.get("requested_extras") or []),
                               bool(item.get("requested")))
    env = target.markers()
    changed = True
    while changed:  # extras requested through a dependency (``a`` requires ``b[x]``) widen ``b``'s requirements
        changed = False
        for node in nodes.values():
            for line in node.requires:
                try:
                    req = Requirement(line)
                except InvalidRequirement:
                    continue
                if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in node.extras or {""}):
                    continue
                dep = nodes.get(canonicalize_name(req.name))
                if dep is None:
                    continue
                if node.name not in dep.via:
                    dep.via.add(node.name)
                    changed = True
                if not req.extras <= dep.extras:
                    dep.extras |= req.extras
                    changed = True
    return nodes


def reach(nodes: dict[str, Resolved], roots: set[str]) -> set[str]:
    out = set(roots) & set(nodes)
    todo = list(out)
    while todo:
        name = todo.pop()
        for other in nodes.values():
            if name in other.via and other.name not in out:
                out.add(other.name)
                todo.append(other.name)
    return out


def pip_env(tmp: Path, url: str, credential, ca_bundle: Path | None) -> tuple[dict[str, str], list[str]]:
    """pip's environment (no PIP_* or NETRC of this host; the credential through files in ``tmp``) and
    its index arguments."""
    from stackforge.build.locks import pip_credentials

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "NETRC"}
    env.update(pip_credentials(tmp, url, credential))
    if ca_bundle:
        env["PIP_CERT"] = str(ca_bundle)
    index_args = [] if credential is not None and credential.query else ["--index-url", url]
    return env, index_args
