"""Read ``overlays/<name>/overlay.yaml`` with positions (the stacks' YAML loader and its limits), validate it,
and check on the host what it declares: the range directories, and every file's sha256."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stackforge.errors import UserError
from stackforge.fslock import file_sha256
from stackforge.overlay.model import OVERLAY_NAME, Overlay, OverlayFile
from stackforge.stack.load import Located, StackInvalid, load_model

OVERLAYS_DIR = "overlays"
OVERLAY_FILE = "overlay.yaml"


@dataclass(frozen=True)
class LoadedOverlay(Located):
    """A validated overlay with its directory and where each of its values and keys was written."""

    name: str
    dir: Path
    display: str  # overlay.yaml as errors name it (relative to the root when inside it)
    model: Overlay = field(compare=False, repr=False)
    positions: dict = field(compare=False, repr=False)
    keypositions: dict = field(compare=False, repr=False)

    def error(self, message: str, path: tuple, fix: str | None = None, *, exit_code: int = 2) -> UserError:
        return UserError(message, **self.pos(path).as_error_kwargs(), fix=fix, exit_code=exit_code)

    def range_dir(self, upstream: str) -> Path:
        return self.dir / "patches" / upstream

    def packages(self, upstream: str) -> list[str]:
        """The installed packages a range of ``upstream`` may change (default: the upstream's name)."""
        return list(self.model.patches[upstream].packages) or [upstream.replace("-", "_")]

    def file_entries(self) -> list[tuple[tuple, OverlayFile]]:
        """(key path, entry) of every file the overlay copies, the entrypoint last."""
        out: list[tuple[tuple, OverlayFile]] = [(("files", i), f) for i, f in enumerate(self.model.files)]
        if self.model.entrypoint is not None:
            out.append((("entrypoint",), self.model.entrypoint))
        return out


def list_overlays(root: Path) -> list[str]:
    d = Path(root) / OVERLAYS_DIR
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / OVERLAY_FILE).is_file() and OVERLAY_NAME.match(p.name))


def _display(root: Path, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def load_overlay(root: Path, name: str, *, where: str = "--overlay") -> LoadedOverlay:
    """Load and validate ``overlays/<name>/overlay.yaml``; raises ``StackInvalid`` (every problem, exit 2)."""
    if not OVERLAY_NAME.match(name):
        raise UserError(
            f"{name!r} is not an overlay name",
            file=where,
            fix="name a directory of overlays/ (lower-case letters, digits, '.', '_', '-')",
        )
    odir = Path(root) / OVERLAYS_DIR / name
    path = odir / OVERLAY_FILE
    if odir.is_symlink() or path.is_symlink():
        raise UserError(f"overlays/{name} is a symbolic link", file=where, fix="keep the overlay inside overlays/")
    if not path.is_file():
        known = list_overlays(root)
        raise UserError(
            f"no overlay {name!r}: {OVERLAYS_DIR}/{name}/{OVERLAY_FILE} does not exist",
            file=where,
            fix=f"one of: {', '.join(known)}" if known else f"write {OVERLAYS_DIR}/{name}/{OVERLAY_FILE}",
        )
    display = _display(root, path)
    model, values, keys = load_model(Overlay, path, display, "an overlay", "overlays/README.md")
    loaded = LoadedOverlay(name, odir, display, model, values, keys)
    found = [loaded.error(msg, at, fix) for msg, at, fix in model.problems()]
    for upstream in model.patches:
        if not (loaded.range_dir(upstream) / "series").is_file():
            found.append(
                loaded.error(
                    f"patches.{upstream}: no layered range: {OVERLAYS_DIR}/{name}/patches/{upstream}/series does not exist",
                    ("patches", upstream),
                    fix=f"create it (stackforge patches export --overlay {name}), or drop the key",
                )
            )
    pdir = odir / "patches"
    for extra in sorted(p.name for p in pdir.iterdir() if p.is_dir()) if pdir.is_dir() else []:
        if extra not in model.patches:
            found.append(
                loaded.error(
                    f"overlays/{name}/patches/{extra}/ is not declared under patches:, so no build would apply it",
                    ("patches",),
                    fix=f"add patches: {{{extra}: {{}}}}, or remove the directory",
                )
            )
    if found:
        raise StackInvalid(found)
    return loaded


def check_files(ov: LoadedOverlay) -> dict[str, str]:
    """Every declared file exists inside the overlay directory and has its declared sha256 (on the host, before
    any build); returns {dest: sha256}. A problem names the file and its key (exit 2)."""
    found: list[UserError] = []
    hashes: dict[str, str] = {}
    top = ov.dir.resolve()
    for at, entry in ov.file_entries():
        key = ".".join(map(str, at))
        path = ov.dir / entry.src
        real = path.resolve()
        if not real.is_relative_to(top) or path.is_symlink():
            found.append(
                ov.error(
                    f"{key}.src: {entry.src} leaves the overlay directory (a link)",
                    (*at, "src"),
                    fix="keep the file itself in the overlay directory",
                )
            )
            continue
        if not path.is_file():
            found.append(
                ov.error(
                    f"{key}.src: {OVERLAYS_DIR}/{ov.name}/{entry.src} does not exist",
                    (*at, "src"),
                    fix="add the file, or fix the path (relative to the overlay directory)",
                )
            )
            continue
        have = file_sha256(path)
        if have != entry.sha256:
            found.append(
                ov.error(
                    f"{key}.sha256: {OVERLAYS_DIR}/{ov.name}/{entry.src} has sha256 {have}, but the overlay declares "
                    f"{entry.sha256}",
                    (*at, "sha256"),
                    fix=f"if the change to {entry.src} is intended, write sha256: {have}",
                )
            )
            continue
        hashes[entry.dest] = have
    if found:
        raise StackInvalid(found)
    return hashes
