"""Write the image's installed inventory (run inside the image, standard library only).

    python inventory.py REPORTS_DIR OUT.json

Every installed distribution (importlib.metadata) with its version; where a pip phase installed that very
version, also the phase, the index it came from and the archive's URL and sha256 when pip knew them (from
the per-phase records preserve.py wrote, later phases winning). Distributions no phase installed (the
venv's own pip, wheels built in the image) have ``index: null``. The phases' preserve lines are kept too.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import sys


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_records(directory: str) -> list[dict]:
    if not os.path.isdir(directory):
        return []
    records = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as fh:
                records.append(json.load(fh))
    return records


def inventory(records: list[dict], dists: list[tuple[str, str]]) -> dict:
    """``dists``: (name, version) of everything installed."""
    origin: dict[str, dict] = {}
    for record in records:
        for item in record.get("installed", []):
            origin[canon(item.get("name") or "")] = {**item, "phase": record["phase"], "index": record["index"]}
    rows = []
    for name, version in sorted(dists, key=lambda d: canon(d[0])):
        came = origin.get(canon(name))
        if came is not None and came.get("version") != version:
            came = None  # installed by a phase, then replaced by something no record saw
        rows.append(
            {
                "name": name,
                "version": version,
                "index": came["index"] if came else None,
                "phase": came["phase"] if came else None,
                "url": came.get("url") if came else None,
                "sha256": came.get("sha256") if came else None,
            }
        )
    return {
        "dists": rows,
        "phases": [
            {
                "phase": r["phase"],
                "key": r.get("key"),
                "index": r["index"],
                "installed": sorted(i.get("name") or "" for i in r.get("installed", [])),
                "preserve": r.get("preserve", []),
            }
            for r in records
        ],
    }


def main(argv: list[str]) -> int:
    seen: dict[str, tuple[str, str]] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and canon(name) not in seen:
            seen[canon(name)] = (name, dist.version)
    data = {"machine": platform.machine(), **inventory(read_records(argv[1]), list(seen.values()))}
    with open(argv[2], "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    print(
        f"inventory: {len(data['dists'])} distributions, {sum(1 for d in data['dists'] if d['index'])} from an index, "
        f"on {data['machine']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
