"""Series files and layers.

A series directory holds ``series`` (the order: one patch file name per line,
``#`` comments and blank lines allowed), the ``NNNN-<Area>-<summary>.patch``
files it names, and a generated ``README.md`` index.

A *layer* is one series directory applied in turn: the base series of an
upstream (``patches/<upstream>``) first, then any layered ranges an overlay adds
(``overlays/<overlay>/patches/<upstream>``). Numbering runs on across layers:
a layered range on top of a 171-patch base starts at 0172.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stackforge.errors import UserError
from stackforge.stack.load import LoadedStack

if TYPE_CHECKING:
    from stackforge.stack.resolved import ResolvedStack

SERIES_FILE = "series"
INDEX_FILE = "README.md"
BASE_LAYER = "base"

PATCH_NAME_RE = re.compile(r"^(?P<num>\d{4})-(?P<area>[^-\s]+)-(?P<summary>\S+)\.patch$")
_NUM_RE = re.compile(r"^\d{4}-")

# git's format-patch limit for the subject part of a file name.
NAME_MAX = 64


@dataclass
class Entry:
    name: str
    line: int  # 1-based line number in the series file (0 for entries not read from a file)
    lead: list[str] = field(default_factory=list)  # comment/blank lines directly above it

    @property
    def number(self) -> int | None:
        m = re.match(r"^(\d{4})-", self.name)
        return int(m.group(1)) if m else None


@dataclass
class Series:
    """One layer: a series directory and the entries its ``series`` file lists."""

    dir: Path
    layer: str = BASE_LAYER
    entries: list[Entry] = field(default_factory=list)
    header: list[str] = field(default_factory=list)  # lines above the first entry
    footer: list[str] = field(default_factory=list)  # lines below the last entry (history notes)

    @property
    def series_file(self) -> Path:
        return self.dir / SERIES_FILE

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @property
    def paths(self) -> list[Path]:
        return [self.dir / e.name for e in self.entries]

    def __len__(self) -> int:
        return len(self.entries)


def parse_series_text(text: str, dir: Path, layer: str = BASE_LAYER) -> Series:
    series = Series(dir=Path(dir), layer=layer)
    pending: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            pending.append(raw.rstrip())
            continue
        name = stripped.split("#", 1)[0].strip()
        if len(name.split()) != 1:
            raise UserError(
                f"series entry {stripped!r} is not a single patch file name",
                file=dir / SERIES_FILE,
                line=lineno,
                fix="one patch file name per line; options after the name are not supported",
            )
        if not series.entries:
            series.header, pending = pending, []
        series.entries.append(Entry(name=name, line=lineno, lead=pending))
        pending = []
    if series.entries:
        series.footer = pending
    else:
        series.header = pending
    return series


def read_series(dir: Path | str, layer: str = BASE_LAYER) -> Series:
    """Read ``dir/series``. A directory without one is a UserError naming it."""
    path = Path(dir)
    if path.name == SERIES_FILE and path.is_file():
        path = path.parent
    sf = path / SERIES_FILE
    if not sf.is_file():
        raise UserError(
            f"no series file in {path}",
            file=sf,
            fix=f"create {sf} listing the patch files in order (an empty file with comments is fine)",
        )
    return parse_series_text(sf.read_text(encoding="utf-8"), path, layer)


def render_series(series: Series) -> str:
    lines: list[str] = list(series.header)
    for e in series.entries:
        lines.extend(e.lead)
        lines.append(e.name)
    lines.extend(series.footer)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def write_series(series: Series) -> None:
    series.dir.mkdir(parents=True, exist_ok=True)
    series.series_file.write_text(render_series(series), encoding="utf-8")


# --- names -----------------------------------------------------------------


def sanitize_subject(subject: str, max_len: int | None = None) -> str:
    """The file-name part ``git format-patch`` derives from a subject.

    Runs of characters other than ASCII letters, digits, ``.`` and ``_`` become
    one ``-``; runs of dots become one dot; trailing dots and dashes go.
    """
    out: list[str] = []
    space = 2
    i = 0
    while i < len(subject):
        ch = subject[i]
        if ch.isascii() and (ch.isalnum() or ch in "._"):
            if space == 1:
                out.append("-")
            space = 0
            out.append(ch)
            if ch == ".":
                while i + 1 < len(subject) and subject[i + 1] == ".":
                    i += 1
        else:
            space |= 1
        i += 1
    name = "".join(out).rstrip(".-")
    if max_len is not None:
        name = name[:max_len]
    return name or "patch"


def patch_name(number: int, subject: str) -> str:
    """``NNNN-<subject>.patch`` exactly as git format-patch names it (64 characters at most)."""
    stem = f"{number:04d}-{sanitize_subject(subject)}"
    return stem[: NAME_MAX - len(".patch") - 1] + ".patch"


def renumbered(name: str, number: int) -> str:
    """``name`` with its leading number replaced (or added)."""
    rest = _NUM_RE.sub("", name, count=1)
    return f"{number:04d}-{rest}"


def next_number(layers: Sequence[Series], index: int) -> int:
    """Number of the first patch of ``layers[index]`` when numbering runs on across layers."""
    return 1 + sum(len(layers[i]) for i in range(index))


# --- hashing -----------------------------------------------------------------


def _as_series(item: Series | Path | str, layer: str) -> Series:
    return item if isinstance(item, Series) else read_series(item, layer=layer)


def series_hash(patch_dir_or_series: Series | Path | str, *layers: Series | Path | str) -> str:
    """sha256 over the series order and the bytes of every patch, layer by layer.

    ``series_hash(dir)`` hashes one series directory (or ``series`` file);
    more arguments add layered ranges on top, in order. Comment lines (including
    history notes) do not count; a renamed, reordered, added, removed or edited
    patch does.
    """
    all_layers = [_as_series(patch_dir_or_series, BASE_LAYER)]
    for i, item in enumerate(layers, start=1):
        all_layers.append(_as_series(item, f"layer{i}"))
    h = hashlib.sha256(b"stackforge-series-v1\n")
    for s in all_layers:
        h.update(f"layer {s.layer}\n".encode())
        for e in s.entries:
            p = s.dir / e.name
            if not p.is_file():
                raise UserError(
                    f"series lists {e.name} but the file is missing",
                    file=s.series_file,
                    line=e.line,
                    fix="add the patch file or remove the entry from the series",
                )
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            h.update(f"{e.name} {digest}\n".encode())
    return h.hexdigest()


# --- layers ------------------------------------------------------------------

OVERLAYS_DIR = "overlays"


def overlay_dir(root: Path, overlay: str) -> Path:
    p = Path(overlay)
    if p.is_absolute() or "/" in overlay:
        return p if p.is_absolute() else root / p
    return root / OVERLAYS_DIR / overlay


def layer_dirs(
    root: Path, upstream: str, patches: str | Path | None, overlays: Iterable[str] = ()
) -> list[tuple[str, Path]]:
    """(layer name, directory) for an upstream: the base series, then one per overlay."""
    out: list[tuple[str, Path]] = []
    if patches:
        base = Path(patches)
        out.append((BASE_LAYER, base if base.is_absolute() else root / base))
    for ov in overlays:
        od = overlay_dir(root, ov)
        d = od / "patches" / upstream
        if not d.is_dir():
            raise UserError(
                f"overlay {ov!r} has no layered range for upstream {upstream!r}",
                file=d,
                fix=f"create {d}/series, or leave out --overlay {ov}",
            )
        out.append((od.name, d))
    return out


def load_layers(dirs: Sequence[tuple[str, Path]]) -> list[Series]:
    return [read_series(d, layer=name) for name, d in dirs]


@dataclass(frozen=True)
class PatchRef:
    """One patch in the applied order: which layer, its position overall and in the layer."""

    layer: str
    name: str
    path: Path
    position: int  # 1-based over all layers
    total: int

    def describe(self) -> str:
        where = "" if self.layer == BASE_LAYER else f" (layer {self.layer})"
        return f"{self.name} [{self.position}/{self.total}]{where}"


def flatten(layers: Sequence[Series]) -> list[PatchRef]:
    total = sum(len(s) for s in layers)
    out: list[PatchRef] = []
    for s in layers:
        for e in s.entries:
            out.append(PatchRef(s.layer, e.name, s.dir / e.name, len(out) + 1, total))
    return out


# --- editing -------------------------------------------------------------------


def renumber(layers: Sequence[Series], *, write: bool = True) -> list[tuple[Path, Path]]:
    """Give every patch its contiguous number (running on across layers).

    Only the leading number of each file name changes; contents do not, so
    ``series_hash`` changes but no patch byte does. Returns the renames.
    """
    renames: list[tuple[Path, Path]] = []
    number = 1
    for s in layers:
        for e in s.entries:
            new = renumbered(e.name, number)
            if new != e.name:
                renames.append((s.dir / e.name, s.dir / new))
                e.name = new
            number += 1
    if write:
        # Two passes so that swapping numbers never overwrites a file.
        tmp = [(src, src.with_name(src.name + ".renumber"), dst) for src, dst in renames]
        for src, mid, _ in tmp:
            if src.exists():
                src.rename(mid)
        for _, mid, dst in tmp:
            if mid.exists():
                mid.rename(dst)
        for s in layers:
            write_series(s)
    return renames


def drop_entries(series: Series, names: Iterable[str], notes: Sequence[str] = (), *, delete: bool = True) -> list[str]:
    """Remove ``names`` from a series (and their files), appending ``notes`` as history comments."""
    wanted = set(names)
    dropped = [e.name for e in series.entries if e.name in wanted]
    missing = wanted - set(dropped)
    if missing:
        raise UserError(f"not in {series.series_file}: {', '.join(sorted(missing))}", file=series.series_file)
    series.entries = [e for e in series.entries if e.name not in wanted]
    if notes:
        if not any(ln.strip() == HISTORY_HEADING for ln in series.footer + series.header):
            series.footer += ["", HISTORY_HEADING]
        series.footer += [f"# {n}" for n in notes]
    if delete:
        for n in dropped:
            p = series.dir / n
            if p.exists():
                p.unlink()
    return dropped


HISTORY_HEADING = "# History (patches that left the series):"


def in_tree_series(loaded: LoadedStack | ResolvedStack, name: str, src_root: Path) -> Path:
    """The series directory ``upstreams.<name>.patches_from`` names, inside the other upstream's exported tree
    (already exported under ``src_root``); a UserError naming the key when it is missing or leaves the tree."""
    stack = loaded.model
    src = stack.upstreams[name].patches_from
    assert src is not None
    key = ("upstreams", name, "patches_from", "path")
    tree = (src_root / src.upstream).resolve()
    found = tree / src.path
    pin = stack.upstreams[src.upstream]
    at = pin.pin if pin.commit else src.upstream
    if not found.resolve().is_relative_to(tree) or found.is_symlink():
        raise UserError(
            f"upstreams.{name}.patches_from.path: {src.path} leaves {src.upstream}'s tree",
            **loaded.position(key).as_error_kwargs(),
            fix="name a directory inside the tree",
        )
    if src.order == "name" and found.is_dir():
        return _series_by_name(loaded, name, found, src_root.parent / ".series" / name)
    if not (found / "series").is_file():
        what = "has no series file" if found.is_dir() else "does not exist"
        raise UserError(
            f"upstreams.{name}.patches_from.path: {src.path} {what} in {src.upstream} at {at}",
            **loaded.position(key).as_error_kwargs(),
            fix=f"name the directory of {src.upstream} that holds the series for this {name} pin",
        )
    for entry in found.iterdir():
        if entry.is_symlink() and not entry.resolve().is_relative_to(tree):
            raise UserError(
                f"upstreams.{name}.patches_from.path: {src.path}/{entry.name} points outside {src.upstream}'s tree",
                **loaded.position(key).as_error_kwargs(),
                fix="the series must be files of the upstream",
            )
    return found


def _series_by_name(loaded: LoadedStack | ResolvedStack, name: str, found: Path, out: Path) -> Path:
    """A series directory beside the exported trees listing every regular ``*.patch`` of ``found`` in file-name
    order (the carrier's tree is left as exported); a directory without patches is an error naming the key."""
    tree = found.parent.resolve()
    patches = sorted(p for p in found.iterdir() if p.name.endswith(".patch") and not p.is_symlink() and p.is_file())
    for p in found.iterdir():
        if p.is_symlink() and not p.resolve().is_relative_to(tree):
            raise UserError(
                f"upstreams.{name}.patches_from.path: {p.name} points outside the tree",
                **loaded.position(("upstreams", name, "patches_from", "path")).as_error_kwargs(),
                fix="the series must be files of the upstream",
            )
    if not patches:
        raise UserError(
            f"upstreams.{name}.patches_from.path: no *.patch files in {found.name}",
            **loaded.position(("upstreams", name, "patches_from", "path")).as_error_kwargs(),
            fix="name the directory that holds the patches, or use order: series with a series file",
        )
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for p in patches:
        shutil.copyfile(p, out / p.name)
    header = f"# generated: every *.patch of {found.name}, in file-name order (patches_from.order: name)\n"
    (out / "series").write_text(header + "".join(f"{p.name}\n" for p in patches))
    return out
