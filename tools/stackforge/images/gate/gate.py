"""The dependency gate, run inside the image as a build step.

Reads the gate spec written by stackforge (gate.json next to this file, or the
path given as the first argument) and checks, in the stack's order:

* the interpreter: its version must be the stack's ``platform.python`` (a minor line or a release), and pip the
  stack's ``base.pip`` when it names one;
* each pinned package: import it first (importing torchada patches torch, so
  order matters), then read the installed version from its distribution
  metadata and compare with the pin under the local-label rule (``localver.py``: a
  pin with a local label matches only that build, one without matches any build
  of its version) — ``exact`` (import first), ``metadata`` (no import, version
  only) or ``spec`` (found by ``importlib.util.find_spec`` without importing it,
  version as ``metadata``); a package under ``gate.exact`` must be the pin itself (``0.1.90+x`` is refused for
  ``0.1.90``);
* extra imports (vllm, the platform plugin): imported, version reported;
* probes: small named snippets (each with its own env, if any) whose printed result must equal the expectation;
* requirement rules (``rules.requires``): a distribution's version, or the first version-looking
  token a declared command prints, must be at least the rule's minimum (``PASS requires …``);
* post-install patches: the report the post-install step left in the image, line by line;
* ``pip check``: every installed distribution's requirements are met (``pip_check`` in the spec);
* writes: an audit hook watches every check; an import that writes, links or
  creates anything under site-packages fails and names the file (such files
  would be missing on a read-only root filesystem), and so does a dangling
  symlink under site-packages.

``--read-only`` re-runs the package and import checks in an image whose
site-packages is mounted read-only, prefixing each line with ``read-only:``.

Prints one line per check (``PASS import torch      version=…``), then a
summary, and exits 1 on any FAIL. Standard library only: it runs in any image.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import importlib.util
import io
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import localver

WIDTH = 10
SHOWN_WRITES = 5


def site_dirs() -> list[str]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


class WriteAudit:
    """Records attempts to change anything under site-packages (an audit hook cannot be removed,
    so it is installed once and switched by ``who``)."""

    EVENTS: ClassVar[dict[str, tuple[int, ...]]] = {
        "os.symlink": (1,),
        "os.link": (1,),
        "os.mkdir": (0,),
        "os.rename": (0, 1),
        "os.replace": (0, 1),
        "os.remove": (0,),
        "os.rmdir": (0,),
        "os.truncate": (0,),
        "os.chmod": (0,),
        "os.chown": (0,),
        "shutil.copyfile": (1,),
        "shutil.copytree": (1,),
        "shutil.rmtree": (0,),
    }
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def __init__(self, roots: list[str]):
        self.roots = [r.rstrip("/") + "/" for r in roots]
        self.who: str | None = None
        self.writes: dict[str, list[tuple[str, str]]] = {}
        sys.addaudithook(self.hook)

    def _inside(self, path) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        full = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(text))), os.path.basename(text))
        if "__pycache__" in full.split("/"):
            return None
        for root in self.roots:
            if full.startswith(root):
                return full
        return None

    def hook(self, event: str, args: tuple) -> None:
        if self.who is None:
            return
        if event == "open":
            path, mode, flags = (list(args) + [None, None, 0])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                (flags or 0) & self.WRITE_FLAGS
            )
            hits = [path] if writing else []
        elif event in self.EVENTS:
            hits = [args[i] for i in self.EVENTS[event] if i < len(args)]
        else:
            return
        for hit in hits:
            inside = self._inside(hit)
            if inside:
                self.writes.setdefault(self.who, []).append((inside, event))

    @contextlib.contextmanager
    def watching(self, who: str):
        self.who = who
        try:
            yield
        finally:
            self.who = None


AUDIT: WriteAudit | None = None


def _audited(who: str, fn, *args):
    if AUDIT is None:
        return fn(*args)
    with AUDIT.watching(who):
        return fn(*args)


def write_failures() -> list[str]:
    lines = []
    for who, writes in AUDIT.writes.items() if AUDIT else []:
        seen = list(dict.fromkeys(writes))
        shown = ", ".join(f"{path} ({event})" for path, event in seen[:SHOWN_WRITES])
        more = f" and {len(seen) - SHOWN_WRITES} more" if len(seen) > SHOWN_WRITES else ""
        lines.append(
            f"FAIL write  {who:<{WIDTH}} wrote into site-packages at import: {shown}{more}"
            " — on a read-only root these are lost; create them at build time (gate.prepare)"
        )
    return lines


def dangling_symlinks() -> list[str]:
    lines = []
    for root in site_dirs():
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                if os.path.islink(path) and not os.path.exists(path):
                    lines.append(f"FAIL link   {path} -> {os.readlink(path)} (dangling symlink)")
    return lines


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:300]


def check_package(pkg: dict) -> tuple[bool, str]:
    name, dist, module, mode, want = pkg["name"], pkg["dist"], pkg["import"], pkg["mode"], pkg["version"]
    verb = {"metadata": "meta  ", "spec": "spec  "}.get(mode, "import")
    label = f"{verb} {name:<{WIDTH}}"
    if mode == "spec":
        try:
            found_spec = importlib.util.find_spec(module)
        except BaseException as exc:
            return False, f"FAIL {label} expected={want} error=find_spec {module}: {_err(exc)}"
        if found_spec is None:
            return False, f"FAIL {label} expected={want} error=no module spec for {module}"
    elif mode != "metadata":
        try:
            importlib.import_module(module)
        except BaseException as exc:
            return False, f"FAIL {label} expected={want} error=import {module}: {_err(exc)}"
    found = _version(dist)
    if found is None:
        return False, f"FAIL {label} expected={want} found=not-installed"
    if pkg.get("exact") and not localver.same_build(want, found):
        return False, f"FAIL {label} expected={want} found={found} (gate.exact: the pin itself, not a build of it)"
    if localver.matches(want, found):
        pinned = "" if localver.same_build(want, found) else f" pin={want}"
        return True, f"PASS {label} version={found}{pinned}"
    why = f" ({localver.explain(want, found)})" if localver.same_public(want, found) else ""
    return False, f"FAIL {label} expected={want} found={found}{why}"


def check_import(item: dict) -> tuple[bool, str]:
    module, dist = item["module"], item.get("dist") or item["module"]
    label = f"import {module:<{WIDTH}}"
    try:
        importlib.import_module(module)
    except BaseException as exc:
        return False, f"FAIL {label} error={_err(exc)}"
    return True, f"PASS {label} version={_version(dist) or 'unknown'}"


def check_python(want: str) -> tuple[bool, str]:
    """The image's interpreter against ``platform.python``: "3.10" names a minor line, "3.10.12" one release."""
    have = ".".join(map(str, sys.version_info[:3]))
    parts = want.split(".")
    ok = have.split(".")[: len(parts)] == parts
    label = f"python {'':<{WIDTH}} version={have}"
    if ok:
        return True, f"PASS {label} platform={want}"
    return False, f"FAIL {label} platform={want} (the image's interpreter is not the stack's platform.python)"


@contextlib.contextmanager
def _environ(env: dict):
    """``env`` set in os.environ for the duration of a probe, the previous values restored after it."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_installer(want: str) -> tuple[bool, str]:
    """The pip the phases ran with is the stack's ``base.pip``."""
    found = _version("pip")
    label = f"pip    {'version':<{WIDTH}}"
    if found is not None and localver.matches(want, found):
        return True, f"PASS {label} version={found}"
    return False, f"FAIL {label} expected={want} found={found or 'not-installed'}"


def check_probe(probe: dict) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), _environ(probe.get("env") or {}):
            exec(compile(probe["code"], f"<probe {probe['name']}>", "exec"), {"__name__": "__probe__"})
    except BaseException as exc:
        return False, f"FAIL probe  {probe['name']} error={_err(exc)}"
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    found = lines[-1].strip() if lines else ""
    if found == probe["expect"]:
        return True, f"PASS probe  {probe['name']} result={found}"
    return False, f"FAIL probe  {probe['name']} expected={probe['expect']} found={found}"


VERSION_TOKEN = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+(?:[.+-]?[A-Za-z0-9]+)*)")


def _at_least(found: str, minimum: str) -> bool:
    try:
        try:
            from packaging.version import Version
        except ImportError:
            from pip._vendor.packaging.version import Version  # type: ignore[assignment]
        return Version(found) >= Version(minimum)
    except Exception:

        def release(text: str) -> tuple[int, ...]:
            m = re.match(r"\d+(?:\.\d+)*", text)
            return tuple(int(x) for x in m.group().split(".")) if m else ()

        return release(found) >= release(minimum)


def check_requires(rule: dict) -> tuple[bool, str]:
    name, minimum = rule["name"], rule["min"]
    if rule.get("dist"):
        found = _version(rule["dist"])
        if found is None:
            return False, f"FAIL requires {name} min={minimum} found=not-installed (dist {rule['dist']})"
    else:
        try:
            proc = subprocess.run(rule["command"], shell=True, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"FAIL requires {name} min={minimum} found=none error={_err(exc)}"
        match = VERSION_TOKEN.search(proc.stdout + "\n" + proc.stderr)
        if proc.returncode != 0 or not match:
            why = f"exit {proc.returncode}" if proc.returncode != 0 else "no version in its output"
            return False, f"FAIL requires {name} min={minimum} found=none ({rule['command']}: {why})"
        found = match.group(1)
    if _at_least(found, minimum):
        return True, f"PASS requires {name} version={found} min={minimum}"
    return False, f"FAIL requires {name} min={minimum} found={found}"


def post_install_lines(report: str) -> list[str]:
    try:
        text = Path(report).read_text()
    except OSError as exc:
        return [f"FAIL patch  post-install report {report} is missing: {_err(exc)}"]
    return [line for line in text.splitlines() if line.strip()]


UNMET = re.compile(r"^(\S+) \S+ (?:has requirement|requires) ([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _allowed(line: str, allow: list) -> str | None:
    """The declared reason when the stack allows this unmet requirement (``gate.pip_check_allow``)."""
    m = UNMET.match(line)
    if m is None:
        return None
    for a in allow:
        if (_canon(a["dist"]), _canon(a["requires"])) == (_canon(m.group(1)), _canon(m.group(2))):
            return a["reason"]
    return None


def check_pip(allow: list | None = None) -> list[tuple[bool, str]]:
    """``pip check``: one PASS line, or a FAIL line per broken requirement pip reports; one the stack allows
    (``gate.pip_check_allow``) is a PASS line that says so and gives the stack's reason."""
    lines = _pip_check_lines()
    if lines is None:
        return [(True, f"PASS pip    {'check':<{WIDTH}} no broken requirements")]
    if lines and lines[0].startswith("OK:"):
        return [(True, f"PASS pip    {'check':<{WIDTH}} {lines[0][3:].strip()}")]
    out = []
    for line in lines:
        reason = _allowed(line, allow or [])
        if reason is not None:
            out.append((True, f"PASS pip    {'check':<{WIDTH}} allowed: {line[:300]} ({reason[:200]})"))
        else:
            out.append((False, f"FAIL pip    {'check':<{WIDTH}} {line[:300]}"))
    return out


def _pip_check_lines() -> list[str] | None:
    """pip check's report lines; ``["OK:" + last line]`` when it passed."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "pip", "check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"},
    )
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode == 0:
        return ["OK:" + lines[-1]] if lines else None
    return lines or [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()][-3:] or [f"exit {proc.returncode}"]


def run(spec: dict, out=sys.stdout, read_only: bool = False) -> int:
    global AUDIT
    AUDIT = AUDIT or WriteAudit(site_dirs())
    failed = passed = 0
    prefix = "read-only: " if read_only else ""
    checks: list[tuple[Callable[[Any], tuple[bool, str]], Any, str]] = []
    checks += [(check_python, spec["python"], "python")] if "python" in spec and not read_only else []
    checks += [(check_installer, spec["pip"], "pip")] if spec.get("pip") and not read_only else []
    checks += [(check_package, p, p["name"]) for p in spec.get("packages", [])] + [
        (check_import, i, i["module"]) for i in spec.get("imports", [])
    ]
    if not read_only:
        checks += [(check_probe, p, f"probe {p['name']}") for p in spec.get("probes", [])]
        checks += [(check_requires, r, f"requires {r['name']}") for r in spec.get("requires", [])]
    for fn, item, who in checks:
        ok, line = _audited(who, fn, item)
        print(prefix + line, file=out, flush=True)
        passed += ok
        failed += not ok
    patched = [] if read_only or "post_install_report" not in spec else post_install_lines(spec["post_install_report"])
    for line in patched:
        print(line, file=out, flush=True)
        passed += line.startswith("PASS")
        failed += not line.startswith("PASS")
    for ok, line in check_pip(spec.get("pip_check_allow")) if spec.get("pip_check") and not read_only else []:
        print(prefix + line, file=out, flush=True)
        passed += ok
        failed += not ok
    extra = write_failures() + ([] if read_only else dangling_symlinks())
    for line in extra:
        print(prefix + line, file=out, flush=True)
    failed += len(extra)
    print(f"{prefix}gate result: {passed} PASS, {failed} FAIL", file=out, flush=True)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("--")]
    path = Path(args[0]) if args else Path(__file__).with_name("gate.json")
    spec = json.loads(path.read_text())
    return run(spec, read_only="--read-only" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
