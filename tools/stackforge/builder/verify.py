"""`stackforge verify`: what an operator checks before trusting a pulled image.

The image's labels must name the stack and carry exactly its pins (and, when the
declaration is unchanged, its fingerprint); then the dependency gate and the ABI
check run again inside the image, with a read-only root filesystem.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stackforge.builder.gate import run_gate
from stackforge.builder.plan import LABEL_NS, gate_spec
from stackforge.clients.engine import Engine
from stackforge.errors import UserError
from stackforge.stack.load import LoadedStack, fingerprint

PIN = f"{LABEL_NS}.pin."
OPTION = f"{LABEL_NS}.option."


@dataclass
class Verification:
    image: str
    stack: str
    lines: list[str] = field(default_factory=list)
    failed: int = 0

    def add(self, ok: bool, text: str) -> None:
        self.lines.append(("PASS " if ok else "FAIL ") + text)
        self.failed += not ok


def image_labels(engine: Engine, image: str) -> dict[str, str]:
    if not engine.image_exists(image):
        raise UserError(
            f"image '{image}' is not in the local engine",
            file="IMAGE",
            fix=f"docker pull {image} first, or build it with stackforge build",
        )
    return dict(engine.sdk().images.get(image).attrs.get("Config", {}).get("Labels") or {})


def stack_of(labels: dict[str, str], image: str) -> str:
    name = labels.get(f"{LABEL_NS}.stack")
    if not name:
        raise UserError(
            f"image '{image}' carries no {LABEL_NS}.stack label: it was not built by stackforge",
            file="IMAGE",
            fix="pass --stack S to check it against a stack anyway",
        )
    return name


def verify(loaded: LoadedStack, image: str, labels: dict[str, str], engine: Engine | None = None) -> Verification:
    stack = loaded.model
    engine = engine or Engine()
    v = Verification(image, stack.name)
    v.add(
        labels.get(f"{LABEL_NS}.stack") == stack.name,
        f"labels  stack={labels.get(f'{LABEL_NS}.stack', 'missing')} (checking against {stack.name})",
    )
    pins = {k[len(PIN) :]: val for k, val in labels.items() if k.startswith(PIN)}
    for name, pkg in stack.packages.items():
        have = pins.get(name)
        v.add(have == pkg.version, f"pin     {name:<10} label={have or 'missing'} stack={pkg.version}")
    for extra in sorted(set(pins) - set(stack.packages)):
        v.add(False, f"pin     {extra:<10} label={pins[extra]} is not a pin of the stack")
    option_labels = {k[len(OPTION) :]: val for k, val in labels.items() if k.startswith(OPTION)}
    for name, option in stack.options.items():
        have = option_labels.get(name)
        v.add(
            have == option.value,
            f"option  {name} label={have or 'missing'} stack={option.value}"
            + ("" if have is None or have == option.value else f" (check with --set options.{name}.value={have})"),
        )
    want = fingerprint(stack)
    have = labels.get(f"{LABEL_NS}.fingerprint")
    v.add(
        have == want,
        f"fingerprint label={have or 'missing'} stack={want}"
        + ("" if have == want else " (the stack declaration differs from the one this image was built from)"),
    )
    for script, what in (("gate.py", "gate"), ("abi.py", "abi")):
        if script == "abi.py" and not gate_spec(stack)["abi"]["packages"]:
            continue  # no vendor packages: nothing for the ABI check to resolve
        ok, out = run_gate(loaded, image, engine, script=script)
        v.lines.extend(f"  {line}" for line in out)
        v.add(ok, f"{what:<7} re-run inside the image with a read-only root filesystem")
    return v
