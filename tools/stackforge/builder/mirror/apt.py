"""apt packages of a mirror: the .debs every system layer that installs needs, as a local flat repository.

Mirror side (:func:`mirror_apt`): the layers run for real, in order, in a throwaway container of the base image
with network — ``images/system/apt-layer.sh`` with the layer's spec, signed-by keys and environment, exactly as
the build runs it — with apt keeping every archive it fetched in the mirror. A target's layers run after the
stack's and its parent targets' layers, as the target's stage builds on them (one container per target with
layers; the stack's layers alone when no target has any). The archives become ``apt/pool/*.deb`` with
``apt/Packages`` (each .deb's control stanza, ``Filename``, ``Size``, ``SHA256``) and ``apt/Release``.

Offline side (:func:`apply`): each layer that installs mounts the repository (copied into the build context, every
file checked against ``mirror.json``) and ``apt-layer.sh --local`` resolves and installs from it alone
(``[trusted=yes]``: the mirror's manifest holds each file's sha256), with the stack's own sources written into the
image as online.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from stackforge import progress
from stackforge.builder.mirror import manifest
from stackforge.builder.plan.system import SystemStage
from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from stackforge.fslock import atomic_write, file_sha256

#: the repository inside the mirror and inside the build context (``mirror/apt``), and where a layer mounts it
DIR = "apt"
MOUNT = "/stackforge/mirror/apt"


def chains(plan) -> list[list[SystemStage]]:
    """The layer sequences whose packages the mirror needs: for each target with layers, the stack's layers, its
    parent targets' layers and its own; the stack's layers alone when no target has any. Empty when no layer
    installs anything."""
    by_name = {t.name: t for t in plan.target_stages}
    out: list[list[SystemStage]] = []
    for t in plan.target_stages:
        if not t.system:
            continue
        line: list[SystemStage] = []
        cur = t
        while cur is not None:
            line = cur.system + line
            cur = by_name.get(cur.parent)
        out.append(plan.system + line)
    if not out:
        out = [plan.system]
    return [c for c in out if any(s.install != "never" for s in c)]


def key(chain_list: list[list[SystemStage]], context_dir: Path, base_id: str) -> str:
    """What the repository was resolved from: the base image, and each layer's spec, keys and environment."""
    h = hashlib.sha256(base_id.encode())
    for chain in chain_list:
        for st in chain:
            h.update(json.dumps([st.name, st.spec, st.env, st.path_prefix], sort_keys=True).encode())
            for dest in sorted(st.keys):
                h.update(dest.encode() + b"\0" + (context_dir / dest).read_bytes())
        h.update(b"\1")
    return "sha256:" + h.hexdigest()


def _script(chain: list[SystemStage]) -> str:
    """The layers of one chain, each with its keys and environment, run as the Dockerfile runs them."""
    lines = [
        "set -eu",
        "mkdir -p /stackforge && cp -r /stackforge-context/system /stackforge/system",
        # every archive apt fetches stays in the mounted pool (no clean-up hook removes it)
        "printf '%s\\n' 'Dir::Cache::Archives \"/stackforge-debs/\";' 'APT::Keep-Downloaded-Packages \"true\";'"
        " 'Binary::apt::APT::Keep-Downloaded-Packages \"true\";' '#clear DPkg::Post-Invoke;'"
        " > /tmp/stackforge-mirror.conf",
        "export APT_CONFIG=/tmp/stackforge-mirror.conf",
    ]
    for st in chain:
        for k, v in st.env.items():
            lines.append(f"export {k}={shlex.quote(v)}")
        if st.path_prefix:
            lines.append(f"export PATH={shlex.quote(st.path_prefix)}:$PATH")
        if st.keys:
            lines.append(
                f"mkdir -p /etc/apt/keyrings/stackforge-{st.name} && "
                f"cp -r /stackforge/system/keys/{st.name}/. /etc/apt/keyrings/stackforge-{st.name}/"
            )
        lines.append(f"sh /stackforge/system/apt-layer.sh /stackforge/system/{st.name}.spec")
    # a resolved version the base already had installed was not fetched: the offline resolution needs it too
    lines.append(
        "sed -n 's/^resolved [^:]*: //p' /stackforge/system/layers.txt | sort -u > /tmp/stackforge-resolved\n"
        "(cd /stackforge-debs && xargs -r apt-get download -q < /tmp/stackforge-resolved) || "
        'while read -r p; do (cd /stackforge-debs && apt-get download -q "$p") || '
        'echo "note: $p is not downloadable (a virtual package?)"; done < /tmp/stackforge-resolved'
    )
    return "\n".join(lines) + "\n"


def mirror_apt(
    loaded, plan, context_dir: Path, to: Path, data: dict, engine: Engine, base_id: str, network: str | None
) -> None:
    """Fetch (or keep) the .debs of every layer that installs, and write the repository's index."""
    todo = chains(plan)
    if not todo:
        data.pop("apt", None)
        return
    want = key(todo, context_dir, base_id)
    have = data.get("apt")
    pool = to / DIR / "pool"
    if have and have.get("key") == want and all((pool / f).is_file() for f in have["files"]):
        return
    image = loaded.model.base.image
    with tempfile.TemporaryDirectory(prefix="stackforge-apt-") as tmp:
        debs = Path(tmp) / "debs"
        debs.mkdir()
        for chain in todo:
            names = ", ".join(s.name for s in chain)
            with progress.step(f"mirror apt packages of system layers {names} (in {image})"):
                proc = engine.cli(
                    "run",
                    "--rm",
                    *([f"--network={network}"] if network else []),
                    "-v",
                    f"{context_dir}:/stackforge-context:ro",
                    "-v",
                    f"{debs}:/stackforge-debs",
                    "--entrypoint",
                    "sh",
                    image,
                    "-c",
                    _script(chain) + f"chown -R {os.getuid()}:{os.getgid()} /stackforge-debs",
                    timeout=3600,
                )
            if proc.returncode != 0:
                first = next(s for s in chain if s.install != "never")
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise UserError(
                    f"{first.name}: the mirror could not fetch the apt packages of system layers {names}:\n{tail}",
                    fix="check the layers' apt sources (stackforge doctor) and the mirror's --network",
                )
        got = sorted(p for p in debs.glob("*.deb") if p.is_file())
        shutil.rmtree(to / DIR, ignore_errors=True)
        pool.mkdir(parents=True)
        for p in got:
            shutil.move(str(p), pool / p.name)
    data["parts"] = [p for p in data["parts"] if p["kind"] not in ("deb", "apt-index")]
    stanzas = []
    for p in sorted(pool.iterdir()):
        control = deb_control(p)
        fields = _fields(control)
        sha, size = file_sha256(p), p.stat().st_size
        stanzas.append(f"{control.rstrip()}\nFilename: pool/{p.name}\nSize: {size}\nSHA256: {sha}\n")
        manifest.add_part(
            data,
            {
                "kind": "deb",
                "path": f"{DIR}/pool/{p.name}",
                "sha256": sha,
                "size": size,
                "package": fields.get("Package"),
                "version": fields.get("Version"),
                "source": f"apt sources of system layers (in {image})",
            },
        )
    write_index(to / DIR, "\n".join(stanzas))
    for name in ("Packages", "Release"):
        rel = f"{DIR}/{name}"
        manifest.add_part(
            data,
            {
                "kind": "apt-index",
                "path": rel,
                "sha256": file_sha256(to / rel),
                "size": (to / rel).stat().st_size,
                "source": "generated",
            },
        )
    data["apt"] = {
        "key": want,
        "layers": sorted({s.name for c in todo for s in c if s.install != "never"}),
        "files": sorted(p.name for p in pool.iterdir()),
    }


def write_index(repo: Path, packages: str) -> None:
    """``Packages`` and an unsigned ``Release`` holding its sha256 (a flat repository)."""
    body = packages.encode()
    atomic_write(repo / "Packages", packages)
    atomic_write(
        repo / "Release",
        "Origin: stackforge mirror\nLabel: stackforge mirror\nDate: Thu, 01 Jan 1970 00:00:00 UTC\nSHA256:\n"
        f" {hashlib.sha256(body).hexdigest()} {len(body)} Packages\n",
    )


def _fields(control: str) -> dict[str, str]:
    out = {}
    for line in control.splitlines():
        if line and not line[0].isspace() and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def deb_control(path: Path) -> str:
    """The ``control`` file of a .deb (an ar archive holding control.tar.{gz,xz,zst} or control.tar)."""
    with open(path, "rb") as fh:
        if fh.read(8) != b"!<arch>\n":
            raise UserError(f"{path.name} is not a Debian package", fix="make the mirror again")
        while header := fh.read(60):
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
            body = fh.read(size)
            fh.read(size % 2)
            if not name.startswith("control.tar"):
                continue
            if name.endswith(".zst"):
                proc = subprocess.run(
                    ["dpkg-deb", "-f", str(path)], capture_output=True, text=True, check=True, timeout=120
                )
                return proc.stdout[: 1 << 20]
            raw = (
                gzip.decompress(body)
                if name.endswith(".gz")
                else lzma.decompress(body)
                if name.endswith(".xz")
                else body
            )
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                member = next(m for m in tar.getmembers() if m.name.lstrip("./") == "control")
                extracted = tar.extractfile(member)
                assert extracted is not None
                return extracted.read().decode()
    raise UserError(f"{path.name} holds no control archive", fix="make the mirror again")


def apply(loaded, plan, root: Path, data: dict, staging: Path, fix: str) -> bool:
    """Point every layer that installs at the repository, copied into ``staging``; False when none installs."""
    todo = chains(plan)
    if not todo:
        return False
    rec = data.get("apt")
    base = manifest.part(data, "base/image.tar")
    if rec is None or base is None or rec["key"] != key(todo, staging, base["id"]):
        first = next(s for c in todo for s in c if s.install != "never")
        keys = {id(s): f"system.{s.name}" for s in plan.system}
        keys.update(
            {
                id(s): f"targets.{t.name}.system.{s.name[len(t.name) + 1 :]}"
                for t in plan.target_stages
                for s in t.system
            }
        )
        raise UserError(
            f"{keys[id(first)]}: the mirror holds no apt packages for the system layers as the stack declares "
            "them now (other packages, sources or base image)",
            file="--mirror",
            fix=fix,
        )
    for part in data["parts"]:
        if part["kind"] in ("deb", "apt-index"):
            src = manifest.checked(root, part, part["path"])
            dest = staging / "mirror" / part["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dest)
            except OSError:
                shutil.copyfile(src, dest)
    for st in [*plan.system, *(s for t in plan.target_stages for s in t.system)]:
        if st.install != "never":
            st.mirror = f"mirror/{DIR}"
    return True
