"""Requirement files as pip phases, the vendor pins as constraints, the preserve check and the inventory:
the reader, the plan and template, images/gate/preserve.py and inventory.py, and `diff --inventory`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stackforge.builder.plan.plan import make_plan
from stackforge.builder.plan.render import render_dockerfile
from stackforge.builder.plan.requirements import constraints_file, read_phase, requirements_file, write_phases
from stackforge.builder.plan.resolve import pin_conflicts
from stackforge.builder.records import inventory as inv
from stackforge.errors import UserError
from stackforge.stack.load import StackInvalid, load
from tests.fixtures.image_scripts import GATE_DIR
from tests.fixtures.image_scripts import load as load_image_script
from tests.fixtures.stack_support import RootSpec, make_root, run_cli
from tests.fixtures.wheels import build_wheel

PIN = "v0.28.0@" + "c" * 40

STACK = """\
name: req
platform: {os: debian12, python: "3.11"}
base: {image: "stackforge/base:bookworm"}
indexes:
  vend: {url: "https://vendor.example/simple", role: vendor, deps_from: pub}
  pub:  {url: "https://pypi.example/simple", role: public}
upstreams:
  vllm: {git: "https://example.com/vllm.git", tag: v0.28.0, commit: "%s"}
packages:
  torch:      {version: "2.11.0.post2+musa5.2.0", index: vend}
  flash_mla:  {version: "0.2.7", index: vend}
  torchada:   {version: "0.1.90", index: pub}
requirements:
  vllm-common:
    index: pub
    files:
      - {upstream: vllm, path: requirements/common.txt}
tags: {local: "req:1"}
targets: {run: {entrypoint: [python3]}}
""" % ("c" * 40)


@pytest.fixture
def root_spec() -> RootSpec:
    return RootSpec(stack_files={"req.yaml": STACK})


@pytest.fixture
def stack(root):
    return load("req", root=root)


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    top = tmp_path / "src" / "vllm"
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(textwrap.dedent(text))
    return top


def read(stack, tmp_path, files, name="vllm-common"):
    return read_phase(stack, name, {"vllm": tree(tmp_path, files)}, {"vllm": PIN})


def test_requirement_lines_are_flattened_through_r_and_vendor_lines_that_agree_are_dropped(stack, tmp_path):
    phase = read(
        stack,
        tmp_path,
        {
            "requirements/common.txt": """\
            # vLLM's runtime dependencies
            regex # Replace re for higher-performance regex matching
            requests >= 2.26.0
            transformers >= 4.56.0, \\
                < 5
            six>=1.16.0; python_version > '3.11' # transitive
            -r musa/private.txt
            -c constraints.txt
            """,
            "requirements/musa/private.txt": "torch==2.11.0.post2+musa5.2.0\nFlash-MLA==0.2.7\n",
            "requirements/constraints.txt": "numpy<2\ntorch>=2\n",
        },
    )
    assert phase.requirements == [
        "regex",
        "requests>=2.26.0",
        "transformers<5,>=4.56.0",
        'six>=1.16.0; python_version > "3.11"',
    ]
    assert phase.constraints == ["numpy<2"]
    # Names are compared canonically: Flash-MLA is the vendor pin flash_mla; each line agrees with its pin.
    assert [(d.package, d.where, d.pin, d.excepted) for d in phase.dropped] == [
        ("torch", "vllm:requirements/musa/private.txt:1", "2.11.0.post2+musa5.2.0", None),
        ("Flash-MLA", "vllm:requirements/musa/private.txt:2", "0.2.7", None),
        ("torch", "vllm:requirements/constraints.txt:2", "2.11.0.post2+musa5.2.0", None),
    ]
    assert [f["path"] for f in phase.files] == [
        "requirements/common.txt",
        "requirements/musa/private.txt",
        "requirements/constraints.txt",
    ]
    text = requirements_file(phase)
    assert (
        "# dropped, the vendor phase installs torch==2.11.0.post2+musa5.2.0: torch==2.11.0.post2+musa5.2.0 "
        "(vllm:requirements/musa/private.txt:1)" in text
    )
    assert text.splitlines()[-1] == 'six>=1.16.0; python_version > "3.11"'
    # every pin of the stack, vendor then public, then the upstream's own -c lines
    assert constraints_file(stack.model, phase).splitlines()[1:] == [
        "torch==2.11.0.post2+musa5.2.0",
        "flash_mla==0.2.7",
        "torchada==0.1.90",
        "# the upstream's own constraints",
        "numpy<2",
    ]


@pytest.mark.parametrize(
    "line, stack_has, upstream_has, kind",
    [
        # the plugin's line: 0.2.7+musa is another version than the stack's 0.2.7 (PEP 440 matching would accept it)
        ("flash_mla==0.2.7+musa", "0.2.7", "0.2.7+musa", "pins flash_mla 0.2.7+musa"),
        ("torch==2.9.0", "2.11.0.post2+musa5.2.0", "2.9.0", "pins torch 2.9.0"),
        ("torch<2.10", "2.11.0.post2+musa5.2.0", "<2.10", "asks torch<2.10"),
    ],
)
def test_a_vendor_line_that_disagrees_fails_naming_its_line_both_versions_and_the_fix(
    stack, tmp_path, line, stack_has, upstream_has, kind
):
    files = {"requirements/common.txt": "regex\n-r private.txt\n", "requirements/private.txt": f"# pins\n{line}\n"}
    with pytest.raises(UserError) as info:
        read(stack, tmp_path, files)
    err = info.value
    assert (err.file, err.line, err.exit_code) == ("vllm:requirements/private.txt", 2, 1)
    assert kind in err.message and stack_has in err.message and upstream_has in err.message, err.message
    assert err.message.startswith("requirements.vllm-common.files[0]: ")
    name = line.split("=")[0].split("<")[0]
    assert f"upstreams.vllm.agree.except.{name}: <why they differ>" in err.fix


def test_a_vendor_line_the_stack_excepts_is_dropped_with_the_reason(tmp_path):
    text = STACK.replace(
        'commit: "%s"}' % ("c" * 40),
        'commit: "%s",\n         agree: {except: {flash-mla: "the +musa build is not on the index yet"}}}' % ("c" * 40),
    )
    loaded = load("req", root=make_root(tmp_path, {"req.yaml": text}))
    phase = read(loaded, tmp_path, {"requirements/common.txt": "regex\nflash_mla==0.2.7+musa\n"})
    assert [(d.package, d.pin, d.excepted) for d in phase.dropped] == [
        ("flash_mla", "0.2.7", "the +musa build is not on the index yet")
    ]
    assert phase.requirements == ["regex"]
    assert (
        "# dropped, the stack differs on purpose (the +musa build is not on the index yet): flash_mla==0.2.7+musa "
        "(vllm:requirements/common.txt:2); the vendor phase installs flash_mla==0.2.7"
    ) in requirements_file(phase)


def test_a_public_pins_line_is_dropped_only_when_the_stack_excepts_it_with_a_reason(stack, tmp_path):
    files = {"requirements/common.txt": "regex\ntorchada==0.1.83\n"}
    kept = read(stack, tmp_path / "a", files)  # no reason given: pip refuses the phase, naming the pin
    assert kept.requirements == ["regex", "torchada==0.1.83"] and kept.dropped == []
    text = STACK.replace(
        'commit: "%s"}' % ("c" * 40),
        'commit: "%s",\n         agree: {except: {torchada: "the older train"}}}' % ("c" * 40),
    )
    loaded = load("req", root=make_root(tmp_path / "b", {"req.yaml": text}))
    phase = read(loaded, tmp_path / "b", files)
    assert phase.requirements == ["regex"]
    assert [(d.package, d.pin, d.excepted, d.public) for d in phase.dropped] == [
        ("torchada", "0.1.90", "the older train", True)
    ]
    assert (
        "# dropped, the stack differs on purpose (the older train): torchada==0.1.83 "
        "(vllm:requirements/common.txt:2); the public pin installs torchada==0.1.90"
    ) in requirements_file(phase)
    agreeing = read(loaded, tmp_path / "c", {"requirements/common.txt": "torchada==0.1.90\n"})
    assert agreeing.requirements == ["torchada==0.1.90"] and agreeing.dropped == []  # met by the pin: kept


def test_a_file_declared_a_constraint_constrains_the_phase(tmp_path):
    text = STACK.replace(
        "      - {upstream: vllm, path: requirements/common.txt}\n",
        "      - {upstream: vllm, path: requirements/common.txt}\n"
        "      - {upstream: vllm, path: requirements/pins.txt, constraint: true}\n",
    )
    loaded = load("req", root=make_root(tmp_path, {"req.yaml": text}))
    files = {"requirements/common.txt": "huggingface_hub >= 1.27.0\n", "requirements/pins.txt": "huggingface_hub<2.0\n"}
    phase = read(loaded, tmp_path, files)
    assert (phase.requirements, phase.constraints) == (["huggingface_hub>=1.27.0"], ["huggingface_hub<2.0"])
    assert constraints_file(loaded.model, phase).splitlines()[-2:] == [
        "# the upstream's own constraints",
        "huggingface_hub<2.0",
    ]


@pytest.mark.parametrize(
    "line, what",
    [
        ("--extra-index-url https://flashinfer.ai/whl/", "option --extra-index-url is refused"),  # vLLM's cuda.txt
        ("--index-url=https://evil.example/simple", "option --index-url is refused"),
        ("-i https://evil.example/simple", "option -i is refused"),
        ("--find-links /wheels", "option --find-links is refused"),
        ("-f https://evil.example/", "option -f is refused"),
        ("-e .", "option -e is refused"),
        ("--trusted-host evil.example", "option --trusted-host is refused"),
        ("requests==2.32.5 --hash=sha256:" + "a" * 64, "per-requirement options are refused"),
        ("https://evil.example/requests-2.32.5-py3-none-any.whl", "URL, path"),
        ("requests @ https://evil.example/requests.whl", "URL, path"),
        ("./vendored/requests", "URL, path"),
        ("/abs/requests", "URL, path"),
        ("-r /etc/passwd", "only files of the same tree"),
        ("-r https://evil.example/r.txt", "only files of the same tree"),
        ("-r ../../../etc/passwd", "leads outside the upstream vllm's tree"),
        ("not a requirement !!", "is not a requirement"),
    ],
)
def test_options_urls_and_paths_are_refused_with_the_file_line_and_stack_key(stack, tmp_path, line, what):
    with pytest.raises(UserError) as info:
        read(stack, tmp_path, {"requirements/common.txt": f"regex\n\n{line}\n"})
    err = info.value
    assert what in err.message, err.message
    assert err.message.startswith("requirements.vllm-common.files[0]: ")
    assert f"(upstream vllm at {PIN})" in err.message
    assert (err.file, err.line) == ("vllm:requirements/common.txt", 3)


def test_an_include_is_refused_at_the_including_line(stack, tmp_path):
    with pytest.raises(UserError) as info:
        read(stack, tmp_path, {"requirements/common.txt": "-r other.txt\n", "requirements/other.txt": "x\n-e .\n"})
    assert (info.value.file, info.value.line) == ("vllm:requirements/other.txt", 2)
    with pytest.raises(UserError) as info:
        read(stack, tmp_path, {"requirements/common.txt": "regex\n-r nope.txt\n"})
    assert "includes requirements/nope.txt, which does not exist" in info.value.message
    assert (info.value.file, info.value.line) == ("vllm:requirements/common.txt", 2)


def test_a_symlink_out_of_the_tree_is_refused(stack, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("requests\n")
    top = tree(tmp_path, {"requirements/common.txt": "-r link.txt\n"})
    (top / "requirements" / "link.txt").symlink_to(outside)
    with pytest.raises(UserError, match="leads outside the upstream vllm's tree"):
        read_phase(stack, "vllm-common", {"vllm": top}, {"vllm": PIN})


def test_an_include_cycle_is_refused(stack, tmp_path):
    with pytest.raises(UserError, match="includes itself"):
        read(stack, tmp_path, {"requirements/common.txt": "-r a.txt\n", "requirements/a.txt": "-r common.txt\n"})


def test_a_file_missing_at_the_pinned_commit_names_the_stack_key_and_the_commit(stack, root, tmp_path):
    with pytest.raises(UserError) as info:
        read(stack, tmp_path, {"requirements/other.txt": "regex\n"})
    err = info.value
    assert err.message == (
        f"requirements.vllm-common.files[0]: requirements/common.txt does not exist in upstream vllm at {PIN}"
    )
    assert Path(err.file).name == "req.yaml" and err.line == 17  # the files entry in the stack


def test_write_phases_fills_the_context_and_the_manifest(stack, tmp_path):
    staging = tmp_path / "ctx"
    (staging / "deps").mkdir(parents=True)
    top = tree(tmp_path, {"requirements/common.txt": "regex\ntorch\n"})  # an unpinned vendor name agrees

    def write(path, text):
        Path(path).write_text(text)

    write_phases(stack, staging, {"vllm": top}, {"vllm": PIN}, write, constrained=True)
    assert json.loads((staging / "deps/vendor-pins.json").read_text()) == {
        "torch": "2.11.0.post2+musa5.2.0",
        "flash_mla": "0.2.7",
    }
    assert json.loads((staging / "deps/public-pins.json").read_text()) == {"torchada": "0.1.90"}
    assert (staging / "deps/constraints.txt").read_text().splitlines()[1:] == [
        "torch==2.11.0.post2+musa5.2.0",
        "flash_mla==0.2.7",
        "torchada==0.1.90",
    ]
    assert (staging / "deps/requirements/vllm-common.txt").read_text().splitlines()[-1] == "regex"
    manifest = json.loads((staging / "deps/requirements.json").read_text())
    assert manifest[0]["dropped"][0] == {
        "phase": "requirements.vllm-common",
        "requirement": "torch",
        "package": "torch",
        "where": "vllm:requirements/common.txt:2",
        "pin": "2.11.0.post2+musa5.2.0",
        "excepted": None,
        "public": False,
    }


def test_unknown_index_or_upstream_in_a_requirements_phase_is_refused_on_load(tmp_path):
    bad = STACK.replace("index: pub\n    files", "index: pyp\n    files").replace("upstream: vllm,", "upstream: vlm,")
    with pytest.raises(StackInvalid) as info:
        load("req", root=make_root(tmp_path, {"req.yaml": bad}))
    text = info.value.render()
    assert "requirements.vllm-common.index: unknown index 'pyp'" in text
    assert "requirements.vllm-common.files.0.upstream: unknown upstream 'vlm'" in text
    bad = STACK.replace("path: requirements/common.txt", "path: ../etc/passwd")
    with pytest.raises(StackInvalid, match="not a relative path"):
        load("req", root=make_root(tmp_path / "2", {"req.yaml": bad}))


def test_plan_and_dockerfile_guard_every_phase_after_the_vendor_no_deps_phase(stack):
    plan = make_plan(stack)
    by = {p.name: p for p in plan.phases}
    assert list(by) == ["vend-nodeps", "pub", "requirements.vllm-common", "vend-deps"]
    assert by["vend-nodeps"].constraints is None
    assert by["pub"].constraints == by["vend-deps"].constraints == "deps/constraints.txt"
    assert by["requirements.vllm-common"].constraints == "deps/requirements/vllm-common.constraints.txt"
    assert [p.key for p in plan.phases] == [
        "indexes.vend",
        "indexes.pub",
        "requirements.vllm-common",
        "indexes.vend.deps_from",
    ]
    assert by["requirements.vllm-common"].files == [{"upstream": "vllm", "path": "requirements/common.txt"}]
    assert plan.gate["pip_check"] is True
    text = render_dockerfile(plan).replace("\\\n    ", "")
    assert "COPY gate/preserve.py gate/localver.py /stackforge/\nCOPY deps/vendor-pins.json" in text
    assert "\nCOPY deps/public-pins.json /stackforge/deps/public-pins.json\n" in text
    assert (
        "python -B /stackforge/preserve.py --phase requirements.vllm-common --key requirements.vllm-common "
        "--index pub --record /stackforge/reports/03-requirements.vllm-common.json -- python -m pip install "
        "--index-url https://pypi.example/simple/ -c /stackforge/deps/requirements/vllm-common.constraints.txt "
        "-r /stackforge/deps/requirements/vllm-common.txt"
    ) in text
    assert text.count(" -c /stackforge/deps/constraints.txt ") == 2
    assert "RUN python /stackforge/gate/inventory.py /stackforge/reports /stackforge/inventory.json" in text


# --------------------------------------------------------------------------- images/gate/preserve.py


preserve = load_image_script("preserve")
image_inventory = load_image_script("inventory")
PINS = {"torch": "2.11.0.post2+musa5.2.0", "flash_mla": "0.2.7"}


def dist_info(site: Path, name: str, version: str, requires: list[str] = ()) -> None:
    d = site / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    (d / "METADATA").write_text(meta)


def run_preserve(tmp_path: Path, site: Path, command: str) -> subprocess.CompletedProcess:
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(PINS))
    # -S: no site-packages but the fake one (PYTHONPATH), so importlib.metadata sees only what the test made.
    return subprocess.run(
        [
            sys.executable,
            "-S",
            str(GATE_DIR / "preserve.py"),
            "--phase",
            "requirements.kv",
            "--key",
            "requirements.kv",
            "--index",
            "pypi",
            "--pins",
            str(pins),
            "--record",
            str(tmp_path / "r" / "03.json"),
            "--",
            sys.executable,
            "-S",
            "-c",
            command,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )


def test_preserve_passes_each_vendor_pin_and_records_the_phase(tmp_path):
    site = tmp_path / "site"
    dist_info(site, "torch", PINS["torch"])
    dist_info(site, "flash_mla", "0.2.7")
    proc = run_preserve(tmp_path, site, f"import os; os.makedirs({str(site / 'regex-2025.9.18.dist-info')!r})")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "PASS preserve torch version=2.11.0.post2+musa5.2.0",
        "PASS preserve flash_mla version=0.2.7",
        "preserve result: 2 PASS, 0 FAIL after phase requirements.kv",
    ]
    record = json.loads((tmp_path / "r" / "03.json").read_text())
    assert record["phase"] == "requirements.kv" and record["index"] == "pypi"
    assert record["preserve"][0].startswith("PASS preserve torch")


def test_preserve_fails_on_drift_naming_the_phase_and_who_pulled_it_in(tmp_path):
    site = tmp_path / "site"
    dist_info(site, "torch", PINS["torch"])
    dist_info(site, "flash_mla", "0.2.7")
    # The "pip" of this phase replaces torch and installs the package that asked for it.
    command = textwrap.dedent(f"""\
        import pathlib, shutil
        site = pathlib.Path({str(site)!r})
        shutil.rmtree(site / "torch-{PINS["torch"]}.dist-info")
        for name, version, req in (("torch", "2.12.0", ""), ("lmcache", "0.3.9", "Requires-Dist: torch>=2.12\\n")):
            d = site / f"{{name}}-{{version}}.dist-info"
            d.mkdir()
            (d / "METADATA").write_text(f"Metadata-Version: 2.1\\nName: {{name}}\\nVersion: {{version}}\\n{{req}}")
        """)
    proc = run_preserve(tmp_path, site, command)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "FAIL preserve torch expected=2.11.0.post2+musa5.2.0 found=2.12.0 phase=requirements.kv "
        "pulled-in-by=lmcache 0.3.9 (requires torch>=2.12)"
    )
    assert lines[1] == "PASS preserve flash_mla version=0.2.7"
    assert lines[-1] == (
        "ERROR: pip phase requirements.kv (stack key requirements.kv) replaced the vendor pin "
        "torch==2.11.0.post2+musa5.2.0: lmcache 0.3.9 (requires torch>=2.12)"
    )


def test_preserve_names_the_conflict_when_pip_refuses(tmp_path):
    site = tmp_path / "site"
    dist_info(site, "torch", PINS["torch"])
    pip_says = (
        "ERROR: Cannot install lmcache==0.3.9 because these package versions have conflicting dependencies.\n\n"
        "The conflict is caused by:\n"
        "    The user requested (constraint) torch==2.11.0.post2+musa5.2.0\n"
        "    lmcache 0.3.9 depends on torch>=2.12\n"
    )
    proc = run_preserve(tmp_path, site, f"import sys; print({pip_says!r}); sys.exit(1)")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == (
        "ERROR: pip phase requirements.kv (stack key requirements.kv) would replace a vendor pin (the constraints "
        "hold them): lmcache 0.3.9 depends on torch>=2.12"
    )
    assert not (tmp_path / "r" / "03.json").exists()


@pytest.mark.parametrize(
    "common, wheels, why",
    [
        # the plugin's real requirements/common.txt pins another torchada than the stack
        ("torchada==0.1.81\n", [], "the phase requests torchada==0.1.81"),
        # an unpinned requirement whose newest release needs a newer torchada than the pin
        (
            "vllm-musa-extras\n",
            [("vllm-musa-extras", "1.0", ["torchada>=0.1.95"])],
            "vllm-musa-extras 1.0 depends on torchada>=0.1.95",
        ),
    ],
)
def test_a_requirement_file_that_moves_a_public_pin_is_refused_naming_the_phase_and_the_pin(
    stack, tmp_path, common, wheels, why
):
    """Real pip against a local wheel directory serving the pinned torchada and others: the phase's
    constraints (written by write_phases) hold the public pin, pip refuses, preserve names the pin."""
    staging = tmp_path / "ctx"
    (staging / "deps").mkdir(parents=True)
    top = tree(tmp_path, {"requirements/common.txt": common})
    write_phases(stack, staging, {"vllm": top}, {"vllm": PIN}, lambda path, text: Path(path).write_text(text), True)
    served = tmp_path / "wheels"
    for version in ("0.1.81", "0.1.90", "0.1.95"):
        build_wheel(served, "torchada", version)
    for name, version, requires in wheels:
        build_wheel(served, name, version, requires_dist=requires)
    deps = staging / "deps"
    proc = subprocess.run(
        [
            sys.executable,
            str(GATE_DIR / "preserve.py"),
            "--phase",
            "requirements.vllm-common",
            "--key",
            "requirements.vllm-common",
            "--index",
            "pub",
            "--record",
            str(tmp_path / "r.json"),
            "--pins",
            str(deps / "vendor-pins.json"),
            "--public",
            str(deps / "public-pins.json"),
            "--",
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--disable-pip-version-check",
            "--find-links",
            str(served),
            "--target",
            str(tmp_path / "t"),
            "-c",
            str(deps / "requirements/vllm-common.constraints.txt"),
            "-r",
            str(deps / "requirements/vllm-common.txt"),
        ],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert "The user requested (constraint) torchada==0.1.90" in proc.stdout  # pip's own message is kept
    assert out[-1] == (
        "ERROR: pip phase requirements.vllm-common (stack key requirements.vllm-common) would move the public "
        f"pin torchada==0.1.90 (stack key packages.torchada; the constraints hold it): {why}"
    ), proc.stdout
    assert not any("would replace a vendor pin" in line for line in out)


def test_a_public_pin_is_named_only_when_the_phase_held_it(tmp_path):
    output = [
        "The conflict is caused by:",
        "    The user requested numpy>=2",
        "    The user requested numpy",  # satisfied by the pin: not named
        "    The user requested (constraint) numpy==1.26.4",
    ]
    public = {"numpy": "1.26.4", "torchada": "0.1.90"}
    assert preserve.held_public(output, public) == {"numpy": "1.26.4"}
    assert preserve.public_conflicts(output, "requirements.x", "requirements.x", public) == [
        "ERROR: pip phase requirements.x (stack key requirements.x) would move the public pin numpy==1.26.4 "
        "(stack key packages.numpy; the constraints hold it): the phase requests numpy>=2"
    ]
    # a target phase's constraints hold no public pin: a numpy conflict there is pip's message alone
    assert preserve.public_conflicts(output[:3], "t/omni", "targets.t.pip.omni", public) == []
    # an upstream's constraint file asks the pin's project another version: pip merges both constraints on one
    # line (as the post2 build printed it), and the one that is not the pin is named
    merged = [
        "The conflict is caused by:",
        "    The user requested numpy",
        "    The user requested (constraint) numpy==1.26,==1.26.4",
    ]
    assert preserve.held_public(merged, public) == {"numpy": "1.26.4"}
    assert preserve.public_conflicts(merged, "requirements.x", "requirements.x", public) == [
        "ERROR: pip phase requirements.x (stack key requirements.x) would move the public pin numpy==1.26.4 "
        "(stack key packages.numpy; the constraints hold it): the phase's constraints ask numpy==1.26"
    ]


def test_the_lock_names_the_pin_a_conflicting_resolution_would_move(stack):
    """uv's own messages (0.13), for a pin as an input, as a constraint, and against an input's range."""
    dependency = (
        "error: No solution found when resolving dependencies\n  cause: Because all versions of extras depend on "
        "torchada>=0.1.95 and you require torchada==0.1.90, we can conclude that your requirements and all versions "
        "of extras are incompatible.\n         And because you require extras, we can conclude that your "
        "requirements are unsatisfiable.\n"
    )
    assert pin_conflicts(dependency, stack.model) == [
        "torchada==0.1.90 (packages.torchada): extras depends on torchada>=0.1.95"
    ]
    constraint = dependency.replace("and you require torchada==0.1.90", "and torchada==0.1.90")
    assert pin_conflicts(constraint, stack.model) == [
        "torchada==0.1.90 (packages.torchada): extras depends on torchada>=0.1.95"
    ]
    versioned = dependency.replace("all versions of extras depend on", "extras==1.0 depends on")
    assert pin_conflicts(versioned, stack.model) == [
        "torchada==0.1.90 (packages.torchada): extras==1.0 depends on torchada>=0.1.95"
    ]
    inputs = (
        "error: No solution found when resolving dependencies\n  cause: Because you require torchada==0.1.90 and "
        "torchada>=0.1.95, we can conclude that your requirements are unsatisfiable.\n"
    )
    assert pin_conflicts(inputs, stack.model) == [
        "torchada==0.1.90 (packages.torchada): a requirement asks for torchada>=0.1.95"
    ]
    other = inputs.replace("torchada", "unpinned-thing")
    assert pin_conflicts(other, stack.model) == []


def test_pulled_in_by_reads_the_pip_report():
    report = {
        "install": [
            {
                "requested": True,
                "metadata": {
                    "name": "compressed-tensors",
                    "version": "0.13.0",
                    "requires_dist": ["torch>=1.7.0", "transformers"],
                },
                "download_info": {
                    "url": "https://pypi.example/c.whl",
                    "archive_info": {"hashes": {"sha256": "ab" * 32}},
                },
            },
            {
                "requested": False,
                "metadata": {"name": "torch", "version": "2.12.0"},
                "download_info": {"url": "https://pypi.example/t.whl", "archive_info": {"hash": "sha256=" + "cd" * 32}},
            },
        ]
    }
    items = preserve.report_items(report)
    assert items["torch"]["sha256"] == "cd" * 32 and items["compressed-tensors"]["sha256"] == "ab" * 32
    assert preserve.pulled_in_by("torch", items, {}) == "compressed-tensors 0.13.0 (requires torch>=1.7.0)"
    assert preserve.pulled_in_by("compressed_tensors", items, {}) == "the phase's own requirements"


def test_image_inventory_takes_index_and_hash_from_the_phase_that_installed_the_version():
    records = [
        {
            "phase": "mthreads-nodeps",
            "key": "indexes.mthreads",
            "index": "mthreads",
            "preserve": ["PASS preserve torch"],
            "installed": [{"name": "torch", "version": "2.11.0", "sha256": "aa" * 32, "url": "u1"}],
        },
        {
            "phase": "pypi",
            "key": "indexes.pypi",
            "index": "pypi",
            "preserve": [],
            "installed": [
                {"name": "Filelock", "version": "3.16.1", "sha256": None, "url": "u2"},
                {"name": "regex", "version": "1.0", "sha256": "bb" * 32, "url": "u3"},
            ],
        },
    ]
    data = image_inventory.inventory(
        records, [("torch", "2.11.0"), ("filelock", "3.16.1"), ("regex", "2.0"), ("vllm", "0.28.0")]
    )
    rows = {r["name"]: r for r in data["dists"]}
    assert rows["torch"] == {
        "name": "torch",
        "version": "2.11.0",
        "index": "mthreads",
        "phase": "mthreads-nodeps",
        "url": "u1",
        "sha256": "aa" * 32,
    }
    assert rows["filelock"]["index"] == "pypi" and rows["filelock"]["sha256"] is None
    assert rows["regex"]["index"] is None  # replaced after its phase by something no record saw
    assert rows["vllm"]["index"] is None
    assert [p["phase"] for p in data["phases"]] == ["mthreads-nodeps", "pypi"]


# --------------------------------------------------------------------------- diff --inventory


def write_inventory(path: Path, dists: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "inventory.json").write_text(json.dumps({"dists": dists, "phases": []}))
    return path


def row(name, version, index="pypi", sha="aa"):
    return {"name": name, "version": version, "index": index, "sha256": sha * 32 if sha else None}


def test_diff_of_inventories_lists_added_removed_and_changed(tmp_path, capsys, root):
    a = write_inventory(
        tmp_path / "a" / "evidence",
        [row("torch", "2.11.0.post1+musa5.2.0", "mthreads"), row("regex", "2025.9.18"), row("six", "1.17.0")],
    )
    b = write_inventory(
        tmp_path / "b" / "evidence",
        [row("torch", "2.11.0.post2+musa5.2.0", "mthreads", "bb"), row("Regex", "2025.9.18"), row("lark", "1.2.2")],
    )
    d = inv.diff(inv.load(str(a)), inv.load(str(b.parent)))
    assert [r["name"] for r in d.added] == ["lark"] and [r["name"] for r in d.removed] == ["six"]
    assert [c["name"] for c in d.changed] == ["torch"]
    assert d.changed[0]["before"]["version"] == "2.11.0.post1+musa5.2.0"
    rc, out, _ = run_cli(capsys, root, "diff", "--inventory", str(a), str(b))
    assert rc == 0
    assert out.splitlines() == [
        f"+ lark 1.2.2 (pypi sha256:{'a' * 12})",
        f"- six 1.17.0 (pypi sha256:{'a' * 12})",
        f"~ torch 2.11.0.post1+musa5.2.0 (mthreads sha256:{'a' * 12}) -> "
        f"2.11.0.post2+musa5.2.0 (mthreads sha256:{'b' * 12})",
        "1 added, 1 removed, 1 changed",
    ]
    rc, out, _ = run_cli(capsys, root, "diff", "--inventory", "--json", str(a / "inventory.json"), str(b))
    assert rc == 0 and json.loads(out)["added"][0]["name"] == "lark"


def test_diff_of_inventories_refuses_a_directory_without_one(tmp_path, capsys, root):
    (tmp_path / "empty").mkdir()
    rc, _, err = run_cli(capsys, root, "diff", "--inventory", str(tmp_path / "empty"), str(tmp_path / "empty"))
    assert rc == 2 and "no inventory.json here" in err


def test_preserve_with_pins_none_checks_no_vendor_pin_before_any_is_installed(tmp_path):
    """The installer phase runs before the vendor phase: no pin is installed yet, and none is checked."""
    site = tmp_path / "site"
    site.mkdir()
    record = tmp_path / "installer.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(GATE_DIR / "preserve.py"),
            "--phase",
            "installer",
            "--key",
            "base.pip",
            "--index",
            "pypi",
            "--record",
            str(record),
            "--pins",
            "none",
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "preserve result: 0 PASS, 0 FAIL after phase installer"
    assert json.loads(record.read_text())["preserve"] == ["preserve result: 0 PASS, 0 FAIL after phase installer"]
