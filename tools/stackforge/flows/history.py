"""``stackforge history --out DIR``: a static site of the nightly's history, from the nights' own summaries.

Each night the nightly writes ``summary.json`` into its directory (``build/nightly/<date>`` by default; in CI keep
them outside the work tree, e.g. under ``$STACKFORGE_CACHE/nightly``) and copies each image's evidence beside it.
This reads every ``NIGHTS/*/summary.json`` and writes:

- ``DIR/index.html``: the nights, newest first, each a table of its images — status (a failed row is red, with
  its stage and reason), tag, digest ("same image as" the earlier night that published the same digest), size,
  duration, gate and smoke;
- ``DIR/images/<night>-<stack>-<target>.html``: one page per image — its installed Python distributions and
  Debian packages (from the evidence's ``inventory.json`` and ``system.txt``) and what changed since the same
  image's previous night, with links to the previous and next nights and back to the index.

Plain HTML with its style inline: no script, no network asset. Every value is escaped (a summary is read as
hostile input). The site is written beside DIR and renamed into place, so DIR is the old site or the new one.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from stackforge.builder import inventory
from stackforge.builder.render import images_dir
from stackforge.errors import UserError

SUMMARY = "summary.json"
MAX_SUMMARY = 16 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Image:
    """One stack and target of one night, as the site shows it."""

    night: str
    night_key: str
    stack: str
    target: str
    status: str
    stage: str | None = None
    tag: str | None = None
    digest: str | None = None
    size: int | None = None
    duration_s: float = 0.0
    gate: str | None = None
    smoke: str | None = None
    reason: str | None = None
    smoke_recipes: dict[str, str] = field(default_factory=dict)  # recipe -> passed | failed | not-run
    dists: list[dict[str, Any]] = field(default_factory=list)
    debs: dict[str, str] = field(default_factory=dict)
    kept: bool = False  # the night kept this image's inventory
    same_as: str | None = None
    page: str | None = None  # relative to the index

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "interrupted")

    @property
    def not_run(self) -> bool:
        """Published, but its smoke did not run (e.g. no device on the host): neither passed nor failed."""
        return self.status == "not-run"

    @property
    def outcome(self) -> str:
        return "failed" if self.failed else "not-run" if self.not_run else "passed"

    @property
    def smoke_text(self) -> str:
        """The smoke verdict, and each recipe's when they differ from it or there are several."""
        if not self.smoke:
            return "-"
        text = "no nightly recipe" if self.smoke == "none" else self.smoke
        recipes = self.smoke_recipes
        if len(recipes) > 1 or any(v != self.smoke for v in recipes.values()):
            text += " (" + ", ".join(f"{name} {v}" for name, v in recipes.items()) + ")"
        return text

    @property
    def page_name(self) -> str:
        return _UNSAFE.sub("_", f"{self.night_key}-{self.stack}-{self.target}") + ".html"

    @property
    def short_digest(self) -> str | None:
        return self.digest[:19] + "…" if self.digest and len(self.digest) > 20 else self.digest

    @property
    def size_text(self) -> str:
        if self.size is None:
            return "-"
        return f"{self.size / 1e9:.2f} GB" if self.size >= 1e9 else f"{self.size / 1e6:.1f} MB"

    @property
    def duration_text(self) -> str:
        return f"{self.duration_s:.0f} s"


@dataclass
class Night:
    date: str
    key: str
    registry: str
    started_at: str
    duration_s: float
    images: list[Image]

    @property
    def passed(self) -> int:
        return sum(i.outcome == "passed" for i in self.images)

    @property
    def failed(self) -> int:
        return sum(i.outcome == "failed" for i in self.images)

    @property
    def not_run(self) -> int:
        return sum(i.outcome == "not-run" for i in self.images)

    @property
    def smoke_counts(self) -> dict[str, int]:
        """The night's smoke recipes: passed, failed, not run."""
        found = [v for i in self.images for v in i.smoke_recipes.values()]
        return {"passed": found.count("passed"), "failed": found.count("failed"), "not_run": found.count("not-run")}

    @property
    def duration(self) -> str:
        return f"{self.duration_s:.0f} s"


def _read_json(path: Path, limit: int = MAX_SUMMARY) -> Any:
    if path.stat().st_size > limit:
        raise UserError(f"{path} is larger than {limit >> 20} MiB", fix="point --nights at the nightly's directories")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not JSON: {exc}", file=path, fix="remove the broken night, or rerun it") from None


def _evidence_dir(night_dir: Path, value: Any) -> Path | None:
    """The evidence a row names: relative to its night's directory (or absolute, as older nights wrote it); None
    when it is not there (an artifact downloaded without it) or leaves the night's directory by a link."""
    if not isinstance(value, str) or not value:
        return None
    path = Path(value) if Path(value).is_absolute() else night_dir / value
    if not Path(value).is_absolute() and not path.resolve().is_relative_to(night_dir.resolve()):
        return None
    return path if path.is_dir() else None


def _debs(system_txt: Path) -> dict[str, str]:
    """``name version`` lines after ``installed:`` in the evidence's system.txt (``dpkg-query -W``)."""
    if not system_txt.is_file():
        return {}
    lines = system_txt.read_text(encoding="utf-8", errors="replace").splitlines()
    after = lines[lines.index("installed:") + 1 :] if "installed:" in lines else []
    return dict(line.split(" ", 1) for line in after if line.count(" ") == 1)


def _image(night: str, key: str, night_dir: Path, row: dict[str, Any]) -> Image:
    def text(key: str) -> str | None:
        return str(row[key]) if row.get(key) is not None else None

    image = Image(
        night=night,
        night_key=key,
        stack=str(row.get("stack") or "?"),
        target=str(row.get("target") or "?"),
        status=str(row.get("status") or "unknown"),
        stage=text("stage"),
        tag=text("tag"),
        digest=text("digest"),
        duration_s=float(row.get("duration_s") or 0.0),
        gate=text("gate"),
        smoke=text("smoke"),
        reason=text("reason"),
        smoke_recipes=_recipes(row.get("smoke_recipes")),
    )
    evidence = _evidence_dir(night_dir, row.get("evidence"))
    if evidence is not None:
        inv = evidence / "inventory.json"
        if inv.is_file():
            data = _read_json(inv)
            image.dists = [d for d in data.get("dists", []) if isinstance(d, dict) and d.get("name")]
            image.kept = True
        image.debs = _debs(evidence / "system.txt")
        published = evidence / "publish.json"
        if published.is_file():
            size = _read_json(published).get("size")
            image.size = size if isinstance(size, int) else None
    return image


def _recipes(value: Any) -> dict[str, str]:
    """A row's ``smoke_recipes`` (recipe -> verdict), as text; anything else is none."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def read_nights(root: Path) -> list[Night]:
    """Every night under ``root`` (a directory per night holding its summary.json), newest first."""
    if not root.is_dir():
        raise UserError(f"{root} is not a directory", file="--nights", fix="give the directory the nights write into")
    nights = []
    for path in sorted(root.glob(f"*/{SUMMARY}")):
        data = _read_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise UserError(f"{path} is no nightly summary (no rows)", file=path, fix="remove it from --nights")
        date, key = str(data.get("date") or path.parent.name), _UNSAFE.sub("_", path.parent.name)
        images = [_image(date, key, path.parent, row) for row in data["rows"] if isinstance(row, dict)]
        registry, started = str(data.get("registry") or ""), str(data.get("started_at") or "")
        nights.append(Night(date, key, registry, started, float(data.get("duration_s") or 0.0), images))
    if not nights:
        raise UserError(
            f"no night under {root} (no */{SUMMARY})",
            file="--nights",
            fix="give the directory `stackforge nightly --out` writes under (default build/nightly)",
        )
    nights.sort(key=lambda n: (n.date, n.started_at, n.key), reverse=True)
    _link(nights)
    return nights


def _link(nights: list[Night]) -> None:
    """Pages for images with something to show; "same image as" the earliest night with the same digest."""
    first: dict[tuple[str, str, str], str] = {}
    for night in reversed(nights):  # oldest first
        for image in night.images:
            if image.digest:
                seen = first.setdefault((image.stack, image.target, image.digest), night.date)
                image.same_as = seen if seen != night.date else None
            if image.digest or image.kept:
                image.page = f"images/{image.page_name}"


def _changes(before: Image, after: Image) -> list[dict[str, str | None]]:
    found = inventory.diff({"dists": before.dists}, {"dists": after.dists})
    out: list[dict[str, str | None]] = []
    out += [{"kind": "added", "name": r["name"], "before": None, "after": r["version"]} for r in found.added]
    out += [{"kind": "removed", "name": r["name"], "before": r["version"], "after": None} for r in found.removed]
    out += [
        {"kind": "changed", "name": r["name"], "before": r["before"]["version"], "after": r["after"]["version"]}
        for r in found.changed
    ]
    for name in sorted(before.debs.keys() | after.debs.keys()):
        a, b = before.debs.get(name), after.debs.get(name)
        if a != b:
            kind = "added" if a is None else "removed" if b is None else "changed"
            out.append({"kind": kind, "name": f"{name} (deb)", "before": a, "after": b})
    return out


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images_dir() / "docs")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def _series(nights: list[Night]) -> dict[tuple[str, str], list[Image]]:
    """Each stack and target's images with a page, oldest first."""
    out: dict[tuple[str, str], list[Image]] = {}
    for night in reversed(nights):
        for image in night.images:
            if image.page:
                out.setdefault((image.stack, image.target), []).append(image)
    return out


def write_site(nights: list[Night], out: Path) -> Path:
    """Write the site into ``out`` (replaced whole); returns ``out/index.html``."""
    env = _environment()
    css = env.get_template("history.css.j2").render()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (staging / "images").mkdir()
        page = env.get_template("history-image.html.j2")
        for line in _series(nights).values():
            for i, image in enumerate(line):
                previous = line[i - 1] if i else None
                following = line[i + 1] if i + 1 < len(line) else None
                changes = _changes(previous, image) if previous is not None else []
                text = page.render(
                    image=image,
                    previous=previous,
                    following=following,
                    changes=changes,
                    debs_changes=image.debs or None,
                    css=css,
                )
                (staging / "images" / image.page_name).write_text(text, encoding="utf-8")
        generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        index = env.get_template("history-index.html.j2").render(nights=nights, generated=generated, css=css)
        (staging / "index.html").write_text(index, encoding="utf-8")
        _swap(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out / "index.html"


def _swap(staging: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def history(nights_dir: Path, out: Path) -> tuple[Path, list[Night]]:
    """Read the nights under ``nights_dir`` and write their site into ``out``."""
    nights = read_nights(Path(nights_dir))
    return write_site(nights, Path(out)), nights
