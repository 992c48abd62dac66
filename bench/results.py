"""One benchmark figure, the table `make bench` prints and `build/bench/results.json`.

Every figure is measured side by side with its peer in the same run, so the ratio (ours / peer) is what
compares across runs and machines; the seconds only describe this one. ``goal`` is the ratio the figure
must not exceed (None: reported, no goal); ``faster`` says ours must also be the smaller of the two (the goal
is below 1).
A figure with an absolute budget (e.g. start-up time) names the budget as its peer.

``id`` names a figure across runs and tools (a dashboard, a CI check reading results.json); the figures the
project tracks have the ids of GOALS and must carry at least that goal (:func:`id_problems`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "build" / "bench" / "results.json"

#: the tracked figures: id -> the goal (ours / peer) its row must carry; docs/benchmarks.md lists them
GOALS: dict[str, float] = {
    "publish": 0.3,  # first publish / docker push of the same image
    "republish": 0.1,  # re-publish after a one-patch rebuild / the first publish
    "cold-default": 1.15,  # cold build as shipped (default options) / the naive build
    "noop": 1.0,  # no-op rebuild / the naive build's
    "one-patch": 0.5,  # one-patch rebuild right after a neighbour's clean build / the naive build's
    "list-first": 1.25,  # first `stackforge list` after a change / importing the libraries it loads, alone
    "pull": 1.05,  # docker pull of our zstd image / of the same layer published uncompressed
    "second-host": 0.25,  # rebuild on a second host from the registry cache / a cold build
    "publish-platforms": 0.5,  # publish a two-platform index / docker push of both + imagetools create
    "build-emulated": 1.15,  # emulated arm64 build of the benchmark stack / buildx --platform linux/arm64 of the naive
}


@dataclass(frozen=True)
class Result:
    measure: str
    ours_s: float
    peer_s: float
    goal: float | None
    peer: str
    note: str = ""
    #: the figure's stable name (GOALS), or None for a figure only reported
    id: str | None = None

    @property
    def ratio(self) -> float:
        return self.ours_s / self.peer_s if self.peer_s else float("inf")

    @property
    def faster(self) -> bool:
        return self.goal is not None and self.goal < 1

    @property
    def met(self) -> bool:
        return self.goal is None or self.ratio <= self.goal

    def as_json(self) -> dict[str, object]:
        doc = asdict(self)
        doc.update(
            ours_s=round(self.ours_s, 3),
            peer_s=round(self.peer_s, 3),
            ratio=round(self.ratio, 3),
            faster=self.faster,
            met=self.met,
        )
        return doc


def gzip_inflater() -> str:
    """Who inflates the engine's gzip layers on this host: ``unpigz`` when it is on the PATH (dockerd and
    BuildKit then run it beside the unpacking), else dockerd itself; a pull figure's note says which."""
    return "unpigz" if shutil.which("unpigz") else "dockerd (no unpigz on the PATH)"


def table(results: list[Result]) -> str:
    lines = [
        "| id | measure | ours (s) | peer | peer (s) | ours / peer | goal | met |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | :---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.id or ''} | {r.measure} | {r.ours_s:.2f} | {r.peer} | {r.peer_s:.2f} | {r.ratio:.2f} | "
            + (f"≤ {r.goal:g} | {'yes' if r.met else 'NO'} |" if r.goal is not None else "report | — |")
        )
    return "\n".join(lines)


def id_problems(results: list[Result]) -> list[str]:
    """What is wrong with the rows' ids, one sentence each: a tracked id (GOALS) without its goal or with a
    looser one, an id on two rows. Empty when all is well."""
    problems: list[str] = []
    seen: set[str] = set()
    for r in results:
        if r.id is None:
            continue
        if r.id in seen:
            problems.append(f"id {r.id!r} is on more than one row (the second: {r.measure!r})")
        seen.add(r.id)
        want = GOALS.get(r.id)
        if want is None:
            continue
        if r.goal is None:
            problems.append(f"row {r.id!r} ({r.measure}) carries no goal; set goal=GOALS[{r.id!r}] (≤ {want:g})")
        elif r.goal > want:
            problems.append(f"row {r.id!r} ({r.measure}) has goal ≤ {r.goal:g}, looser than its ≤ {want:g} (GOALS)")
    return problems


def missing_ids(results: list[Result]) -> list[str]:
    """The tracked ids (GOALS) no row carries, in GOALS order."""
    have = {r.id for r in results}
    return [i for i in GOALS if i not in have]


def write(results: list[Result], path: Path = RESULTS) -> Path:
    """Write the figures as a JSON list (atomically: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps([r.as_json() for r in results], indent=2) + "\n")
    os.replace(tmp, path)
    return path
