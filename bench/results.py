"""One benchmark figure, the table `make bench` prints and `build/bench/results.json`.

Every figure is measured side by side with its peer in the same run, so the ratio (ours / peer) is what
compares across runs and machines; the seconds only describe this one. ``goal`` is the ratio the figure
must not exceed (None: reported, no goal); ``faster`` says ours must also be the smaller of the two (the goal
is below 1).
A figure with an absolute budget (e.g. start-up time) names the budget as its peer.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "build" / "bench" / "results.json"


@dataclass(frozen=True)
class Result:
    measure: str
    ours_s: float
    peer_s: float
    goal: float | None
    peer: str
    note: str = ""
    #: a stable name for the figure (e.g. ``second-host``), for tools that follow one figure across runs
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


def table(results: list[Result]) -> str:
    lines = [
        "| measure | ours (s) | peer | peer (s) | ours / peer | goal | met |",
        "| --- | ---: | --- | ---: | ---: | ---: | :---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.measure} | {r.ours_s:.2f} | {r.peer} | {r.peer_s:.2f} | {r.ratio:.2f} | "
            + (f"≤ {r.goal:g} | {'yes' if r.met else 'NO'} |" if r.goal is not None else "report | — |")
        )
    return "\n".join(lines)


def write(results: list[Result], path: Path = RESULTS) -> Path:
    """Write the figures as a JSON list (atomically: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps([r.as_json() for r in results], indent=2) + "\n")
    os.replace(tmp, path)
    return path
