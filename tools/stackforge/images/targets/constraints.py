"""Write a target phase's constraints and preserve pins from the image itself (standard library only).

    python constraints.py --out-constraints C.txt --out-pins P.json [--repin NAME==VERSION …]

Every installed vendor dist of the stack (the names in /stackforge/deps/vendor-pins.json) and every dist the
build installed from its own wheels (/stackforge/wheels: vllm, the platform plugin, …) is written as
``name==installed version``: what the parent image holds, re-pins of earlier phases included. A ``--repin``
of this phase replaces its dist's expected version in the pins and leaves it out of the constraints.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import sys

VENDOR = "/stackforge/deps/vendor-pins.json"
OWN_WHEELS = "file:///stackforge/wheels/"


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, tuple[str, str, str]]:
    """canonical name -> (name, version, direct URL or "")."""
    out: dict[str, tuple[str, str, str]] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name or canon(name) in out:
            continue
        url = ""
        text = dist.read_text("direct_url.json")
        if text:
            try:
                url = json.loads(text).get("url", "")
            except ValueError:
                url = ""
        out[canon(name)] = (name, dist.version, url)
    return out


def main(argv: list[str]) -> int:
    opts: dict[str, list[str]] = {}
    for key, value in zip(argv[1::2], argv[2::2]):
        opts.setdefault(key, []).append(value)
    with open(VENDOR) as fh:
        shown = {canon(n): n for n in json.load(fh)}  # the stack's own spelling of each vendor dist
    vendor = list(shown)
    now = installed()
    names = [n for n in vendor if n in now] + sorted(k for k, v in now.items() if v[2].startswith(OWN_WHEELS))
    missing = [n for n in vendor if n not in now]
    if missing:
        print(f"ERROR: vendor dists missing before the phase: {', '.join(missing)}", flush=True)
        return 1
    repin = {canon(r.split("==", 1)[0]): r.split("==", 1)[1] for r in opts.get("--repin", [])}
    pins = {shown.get(n, now[n][0]): repin.get(n, now[n][1]) for n in dict.fromkeys(names)}
    constraints = [f"{shown.get(n, now[n][0])}=={now[n][1]}" for n in dict.fromkeys(names) if n not in repin]
    with open(opts["--out-constraints"][0], "w") as fh:
        fh.write("# every installed vendor dist and the build's own wheels: no phase may replace them\n")
        fh.write("\n".join(constraints) + "\n")
    with open(opts["--out-pins"][0], "w") as fh:
        json.dump(pins, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
