"""Resolve a public index's lock for the stack's Python and platform, with the vendor pins held fixed.

uv's resolver does it: ``uv pip compile --python-version <platform.python> --python-platform
<arch>-manylinux_2_<X> --no-build``. pip cannot: its ``--python-version``/``--platform`` select wheels and
``Requires-Python`` only, while environment markers (``python_version < "3.11"``, ``platform_machine ==
"aarch64"``) are evaluated for the interpreter that runs pip; nor can pip-compile, which resolves for the host
interpreter. uv evaluates the markers, ``Requires-Python`` and the wheel tags for the target, needs no
interpreter of the target and takes no private hook. Two runs:

1. the resolution: a ``requirements.txt`` with ``# via`` annotations (what requires each package: names, or
   ``-r <input label>``, since each input is written under its own label);
2. the files: the resolved ``name==version`` list again, ``--no-deps``, as ``pylock.toml``, which lists each
   package's wheels that fit the target with their URL and sha256; the lock keeps the one pip installs for
   the target (the first by the target's tag priority), so a lock holds one hash per entry.

- **Target.** ``platform.python`` selects the interpreter tags, ``Requires-Python`` and the markers;
  ``platform.arch`` and the glibc of ``platform.os`` (:func:`~stackforge.stack.platforms.glibc_of`, the table
  ``newest`` reads wheel tags by too; an unknown OS falls back to manylinux2014, glibc 2.17) select uv's ``--python-platform <arch>-manylinux_2_X`` (the newest uv knows
  that is not newer than the OS's glibc) and the ``manylinux_2_X_<arch>`` wheels.
- **Vendor pins held fixed.** Every vendor pin is offered to uv only as a local stand-in wheel carrying
  the vendor wheel's own METADATA (read from the vendor index, cached by sha256) at the exact pinned
  version, and constrained to that version (``-c``). A public package's ``Requires-Dist: torch``
  therefore resolves to the vendor torch, never to a public one, and the vendor wheels' own
  dependencies are resolved in the same run. The vendor names are then left out of every lock;
  a vendor name whose chosen file is not the stand-in wheel is an error.
- **Only wheels.** A needed package with no wheel for the target is an error naming it and the fix.
- **Credentials** reach uv as they reached pip: a netrc file (``NETRC``) in a private temporary directory for
  user/password, the index URL in uv's environment (``UV_DEFAULT_INDEX``) when the credential is a query;
  never on a command line, and uv's messages are redacted.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from stackforge.clients import pip
from stackforge.clients.index import IndexClient, IndexQueryError
from stackforge.errors import UserError
from stackforge.stack.model import Stack
from stackforge.stack.platforms import glibc_of
from stackforge.urls import Credential, redact

#: the glibc minors uv's --python-platform names, per architecture
UV_GLIBC = {"x86_64": (17, 28, *range(31, 41)), "aarch64": (17, 28, *range(31, 41))}


@dataclass(frozen=True)
class Target:
    python: str  # "3.10"
    arch: str  # "x86_64"
    glibc: tuple[int, int]

    @classmethod
    def of(cls, stack: Stack) -> Target:
        return cls(stack.platform.python, stack.platform.arch, glibc_of(stack.platform.os))

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
            compatible_tags(version, "cp", self.platforms)
        )

    def describe(self) -> str:
        return f"CPython {self.python} on manylinux_2_{self.glibc[1]}_{self.arch}"

    def markers(self) -> dict[str, str]:
        full = f"{self.python}.0"
        return {
            "implementation_name": "cpython",
            "implementation_version": full,
            "os_name": "posix",
            "platform_machine": self.arch,
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": full,
            "platform_python_implementation": "CPython",
            "python_version": self.python,
            "sys_platform": "linux",
        }

    @property
    def tag_order(self) -> list[Tag]:
        """The target's wheel tags, most preferred first (the order pip ranks a package's files in)."""
        version = tuple(int(p) for p in self.python.split("."))
        return [*cpython_tags(version, platforms=self.platforms), *compatible_tags(version, "cp", self.platforms)]

    def uv_platform(self) -> str:
        """uv's ``--python-platform``: the newest ``<arch>-manylinux_2_X`` it names that the OS's glibc runs."""
        known = [m for m in UV_GLIBC.get(self.arch, (17,)) if m <= self.glibc[1]] or [17]
        return f"{self.arch}-manylinux_2_{max(known)}"

    def pip_args(self) -> list[str]:
        return [
            "--python-version",
            self.python,
            "--implementation",
            "cp",
            "--only-binary=:all:",
            *[a for p in self.platforms for a in ("--platform", p)],
        ]


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


def stub_wheel(out: Path, name: str, version: str, metadata: str) -> Path:
    """A wheel holding only ``metadata`` (Name and Version set to the pin): how pip sees a vendor pin."""
    msg = Parser().parsestr(metadata)
    del msg["Name"], msg["Version"]
    head = f"Metadata-Version: {msg.get('Metadata-Version', '2.1')}\nName: {name}\nVersion: {version}\n"
    del msg["Metadata-Version"]
    body = head + "".join(f"{k}: {v}\n" for k, v in msg.items())
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version.replace('-', '_')}"
    info = f"{stem}.dist-info"
    files = {
        f"{info}/METADATA": body,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stackforge-lock\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{m},,\n" for m in files) + f"{info}/RECORD,,\n")
    return path


def vendor_metadata(
    stack: Stack,
    index: str,
    name: str,
    version: str,
    target: Target,
    cache: Path,
    credential: Credential | None,
    ca_bundle: Path | None = None,
) -> str:
    """The METADATA of the vendor's wheel for ``name==version`` (a wheel for the target if there is one),
    read from the index's file (with the index's ``credential``, trusting ``ca_bundle``) and kept under
    ``cache`` by the file's sha256."""

    url = stack.indexes[index].url
    client = IndexClient(url, credential=credential)
    wheels = [f for f in client.project(name).files_for(version) if f.kind == "wheel"]
    if not wheels:
        raise UserError(
            f"index '{index}' has no wheel for {name}=={version}; `stackforge lock` reads the vendor "
            "wheels' metadata to keep their dependencies consistent",
            fix=f"check the pin of {name} (stackforge newest {stack.name})",
        )
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
                raise UserError(
                    f"{chosen.filename} from index '{index}' has no single .dist-info/METADATA",
                    fix="check the vendor wheel",
                )
            text = zf.read(members[0]).decode("utf-8", errors="replace")
    hit.write_text(text)
    return text


# uv's conflict explanation: "you require numpy==1.26.4", "gguf==0.17.1 depends on numpy>=2"
_YOU = re.compile(r"you require (?P<reqs>.+?)(?=, we can conclude|,? and (?:you require|because)|\.?$)", re.M)
_DEPENDS = re.compile(
    r"(?:all versions of |only )?(?P<who>[A-Za-z0-9][\w.-]*)(?:==(?P<ver>[\w.+!*-]+))? depends? on "
    r"(?P<dep>[^,;]+?)(?=,|\.?$)",
    re.M,
)
_NO_WHEEL = re.compile(
    r"(?P<name>[A-Za-z0-9][\w.-]*?)(?:[=<>!~]=?[\w.+!*-]+)? has no (?:usable )?wheels|"
    r"(?P<name2>[A-Za-z0-9][\w.-]*?)(?:[=<>!~]=?[\w.+!*-]+)? has no wheels with a matching|"
    r"(?P<name3>[A-Za-z0-9][\w.-]*?) was not found in the package registry|"
    r"there is no version of (?P<name4>[A-Za-z0-9][\w.-]*?)[=<>!~ ]"
)


def pin_conflicts(stderr: str, stack: Stack) -> list[str]:
    """From uv's conflict message: each pin of the stack that a requirement asks another version of, with its
    stack key and what asked (``numpy==1.26.4 (packages.numpy): gguf==0.17.1 depends on numpy>=2``). uv says
    ``you require numpy==1.26.4 and numpy==1.26`` (the inputs) and ``[all versions of] gguf[==0.17.1] depend[s]
    on numpy>=2 [and <a constraint>]``."""
    pins: dict[str, tuple[str, str]] = {canonicalize_name(n): (n, p.version) for n, p in stack.packages.items()}
    asked: dict[str, list[str]] = {}
    text = " ".join(line.strip(" │╰─▶×") for line in stderr.splitlines())

    def ask(req_text: str, who: str | None) -> None:
        try:
            req = Requirement(req_text.strip().rstrip("."))
        except InvalidRequirement:
            return
        name = canonicalize_name(req.name)
        if name not in pins or req.specifier.contains(pins[name][1], prereleases=True):
            return
        why = f"{who} depends on {req}" if who else f"a requirement asks for {req}"
        asked.setdefault(name, [])
        if why not in asked[name]:
            asked[name].append(why)

    for m in _YOU.finditer(text):
        for item in re.split(r",? and |, ", m.group("reqs")):
            ask(item, None)
    for m in _DEPENDS.finditer(text):
        who = m.group("who") + (f"=={m.group('ver')}" if m.group("ver") else "")
        for item in re.split(r",? and |, ", m.group("dep")):
            ask(item, who)
    return [f"{pins[n][0]}=={pins[n][1]} (packages.{pins[n][0]}): {'; '.join(why)}" for n, why in asked.items()]


def _uv_failure(stderr: str, target: Target, stack: Stack, index: str, credential: Credential | None) -> UserError:
    """uv's failure as a UserError: a package whose files on the index include no wheel for the target
    is named with the fix; a requirement that would move a pin names the pin; anything else (a conflict, an
    unreachable index, a refused credential) is uv's own message."""

    url = stack.indexes[index].url
    flat = " ".join(line.strip(" │╰─▶×") for line in stderr.splitlines())
    for m in _NO_WHEEL.finditer(flat):
        name = next(g for g in m.groups() if g)
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
                "a kernel step; check platform.python and platform.os of the stack",
            )
    tail = "\n".join(line for line in stderr.splitlines() if line.strip())[-1200:]
    moved = pin_conflicts(stderr, stack)
    if moved:
        return UserError(
            f"the requirements of index '{index}' would move a pin of the stack, which every phase after "
            f"the one that installs it holds as a constraint: {'; '.join(moved)}\n{tail}",
            fix="change the pin (packages.<name>.version) or patch the requirement file in the upstream's series",
        )
    return UserError(
        f"uv could not resolve index '{index}' for {target.describe()}: {tail}",
        fix="check the pins and that the index is reachable (and its credentials: user:password@ in its "
        "URL, STACKFORGE_INDEX_<NAME>_USERNAME/_PASSWORD or ~/.netrc)",
    )


_REQ_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][\w.-]*)==(?P<version>\S+?)\s*(?:\\)?$")


def parse_compiled(text: str, labels: set[str], vendor_file: str) -> dict[str, Resolved]:
    """uv's ``requirements.txt`` (``--annotation-style split``): each package with what requires it (canonical
    names) and whether an input of ``labels`` or the vendor pins (``-r vendor_file``) asks for it."""
    nodes: dict[str, Resolved] = {}
    last: Resolved | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _REQ_ENTRY.match(line)
        if m and not raw.startswith(" "):
            last = Resolved(canonicalize_name(m.group("name")), m.group("version"), None, "", [], set(), False)
            nodes[last.name] = last
            continue
        if last is None or not line.startswith("#"):
            continue
        words = line.lstrip("#").strip()
        if words.startswith("via"):
            words = words[3:].strip()
        if not words:
            continue
        if words.startswith("-r "):
            src = words[3:].strip()
            if src in labels or src == vendor_file or Path(src).name == Path(vendor_file).name:
                last.requested = True
        elif words.startswith("-c ") or words.startswith("--"):
            continue
        else:
            last.via.add(canonicalize_name(words.split()[0]))
    return nodes


def parse_pylock(text: str) -> dict[str, list[tuple[str, str]]]:
    """uv's ``pylock.toml``: canonical name -> [(wheel URL, sha256)] of the wheels it lists for the target."""
    out: dict[str, list[tuple[str, str]]] = {}
    for block in text.split("[[packages]]")[1:]:
        name = re.search(r'^name = "([^"]+)"', block, re.M)
        if name is None:
            continue
        wheels = re.findall(r'url = "([^"]+)"[^{}]*?hashes = \{[^}]*?\bsha256 = "([0-9a-f]{64})"', block)
        if not wheels:  # a path (local file) instead of a URL
            wheels = re.findall(r'path = "([^"]+)"[^{}]*?hashes = \{[^}]*?\bsha256 = "([0-9a-f]{64})"', block)
        out[canonicalize_name(name.group(1))] = wheels
    return out


def best_wheel(wheels: list[tuple[str, str]], target: Target) -> tuple[str, str] | None:
    """The wheel pip installs for the target among ``wheels`` (its first tag by the target's priority)."""
    order = {tag: n for n, tag in enumerate(target.tag_order)}
    ranked = []
    for url, sha in wheels:
        try:
            _, _, _, tags = parse_wheel_filename(url.rsplit("/", 1)[-1].split("#", 1)[0])
        except InvalidWheelFilename:
            continue
        rank = min((order[t] for t in tags if t in order), default=None)
        if rank is not None:
            ranked.append((rank, url, sha))
    if not ranked:
        return None
    _, url, sha = min(ranked)
    return url, sha


def run_uv(
    uv: str,
    tmp: Path,
    target: Target,
    env: dict[str, str],
    inputs: list[Input],
    vendor_pins: dict[str, str],
    stubs: Path,
    scrub,
    stack: Stack,
    index: str,
    credential: Credential | None,
) -> dict[str, Resolved]:
    """One resolution with uv (then the files it chose, ``--no-deps``); a failure asks the index, with
    ``credential``, which packages lack a wheel for the target. Each input is written under its label in
    ``tmp/in`` (uv's working directory), so uv's ``# via -r <label>`` names it."""
    work = tmp / "in"
    work.mkdir()
    args: list[str] = []
    for n, inp in enumerate(inputs):
        lines = list(inp.lines) + (inp.file.read_text().splitlines() if inp.file is not None else [])
        path = work / inp.label
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in lines))
        args.append(inp.label)
        if inp.constraints:
            cpath = tmp / f"input-{n}.constraints.txt"
            cpath.write_text("\n".join(inp.constraints) + "\n")
            args += ["-c", str(cpath)]
    vendor_file = str(tmp / "vendor-pins.txt")
    if vendor_pins:
        Path(vendor_file).write_text("".join(f"{n}=={v}\n" for n, v in vendor_pins.items()))
        args += [vendor_file, "-c", vendor_file]
    common = [
        "pip",
        "compile",
        "--quiet",
        "--python-version",
        target.python,
        "--python-platform",
        target.uv_platform(),
        "--no-build",
        "--find-links",
        str(stubs),
    ]

    def run(cmd: list[str]) -> None:
        proc = pip.run_uv(uv, [*common, *cmd], env, work)
        if proc.returncode != 0:
            text = scrub(proc.stderr).replace(str(work) + os.sep, "")
            raise _uv_failure(text, target, stack, index, credential)

    compiled = tmp / "compiled.txt"
    run(["--no-header", "--annotation-style", "split", "-o", str(compiled), *args])
    nodes = parse_compiled(compiled.read_text(), {i.label for i in inputs}, vendor_file)
    exact = tmp / "exact.txt"
    exact.write_text("".join(f"{n.name}=={n.version}\n" for n in nodes.values()))
    pylock = tmp / "pylock.toml"
    run(["--no-deps", "--no-header", "--format", "pylock.toml", "-o", str(pylock), str(exact)])
    files = parse_pylock(pylock.read_text())
    for node in nodes.values():
        chosen = best_wheel(files.get(node.name, []), target)
        if chosen is None:
            raise UserError(
                f"uv resolved {node.name}=={node.version} for index '{index}' but listed no wheel of it "
                f"that fits {target.describe()}",
                fix="check the index's files for that version",
            )
        node.url, node.sha256 = chosen
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
