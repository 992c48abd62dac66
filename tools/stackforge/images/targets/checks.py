"""Run a target's checks (probes, as the gate runs them) in the target's stage (standard library only).

    python checks.py TARGET CHECKS.json

One line per check (``PASS probe  mooncake result=… target=mooncake``); any FAIL fails the step with a line
naming the target. The lines are kept in the image beside CHECKS.json (checks.txt).
"""

from __future__ import annotations

import json
import sys

sys.path.insert(0, "/stackforge/gate")
from gate import check_probe


def main(argv: list[str]) -> int:
    target = argv[1]
    with open(argv[2]) as fh:
        checks = json.load(fh)
    failed, lines = [], []
    for probe in checks:
        ok, line = check_probe(probe)
        lines.append(f"{line} target={target}")
        print(lines[-1], flush=True)
        if not ok:
            failed.append(probe["name"])
    if failed:
        print(f"ERROR: target {target}: check(s) failed: {', '.join(failed)}", flush=True)
        return 1
    print(f"target {target}: {len(checks)} check(s) PASS", flush=True)
    with open(argv[2][: -len(".json")] + ".txt", "w") as fh:  # the record, beside the checks
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
