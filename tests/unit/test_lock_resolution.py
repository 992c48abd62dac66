"""``stackforge lock post2`` against stand-in indexes (no engine: lock only talks HTTP to the indexes).

The vendor stand-in serves the stack's vendor wheels (``tests/fixtures/musa_standins.py``); the public one
serves torchada and the vendor wheels' public dependencies, and also what PyPI really offers that must
never reach a lock: a ``torch`` 2.15.0 (with ``triton`` and an ``nvidia-*`` wheel it requires), numpy
2.x beside the pinned numpy, and packages whose resolution differs between CPython 3.10 and 3.11 (scipy
1.16.2 has cp311 wheels only and ``Requires-Python >=3.11``; anyio needs exceptiongroup and typing_extensions
only below 3.11). The upstreams
are the stand-in git repositories, whose requirement files the post2 lock covers (``builder/locks/reqlocks.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.builder.locks.locks import parse_lock
from stackforge.builder.plan.render import SOURCE_IMAGES
from stackforge.cli import main as cli
from stackforge.errors import UserError
from tests.fixtures import musa_standins as ms
from tests.fixtures.index_server import IndexServer
from tests.fixtures.stack_support import make_root
from tests.fixtures.wheels import build_tiny_sdist, build_wheel

REPO = Path(__file__).resolve().parents[2]
MANYLINUX = "manylinux_2_17_x86_64.manylinux2014_x86_64"
VENDOR_NAMES = {"torch", "torch-musa", "torchvision", "torchaudio", "triton", "deep-ep", "mate"}
#: public pins added with --set: anyio's markers and opencv's numpy requirement differ between 3.10 and 3.11,
#: and scikit-learn's unpinned scipy resolves to another release on each
EXTRA_PINS = [
    "packages.anyio={version: 4.6.2, index: pypi}",
    "packages.opencv-python-headless={version: 4.11.0.86, index: pypi}",
    "packages.scikit-learn={version: 1.7.2, index: pypi}",
]


def _public_extras(d: Path) -> None:
    """What PyPI serves besides the stand-ins, with the real packages' names, versions and requirements."""
    build_wheel(
        d,
        "torch",
        "2.15.0",
        python_tag="cp310",
        abi_tag="cp310",
        platform_tag=MANYLINUX,
        requires_dist=[
            'triton==3.5.0; platform_system == "Linux"',
            'nvidia-cublas-cu12==12.8.4.1; platform_system == "Linux" and platform_machine == "x86_64"',
            "filelock",
        ],
    )
    build_wheel(
        d,
        "torch",
        "2.15.0",
        python_tag="cp311",
        abi_tag="cp311",
        platform_tag=MANYLINUX,
        requires_dist=['triton==3.5.0; platform_system == "Linux"', "filelock"],
    )
    build_wheel(d, "triton", "3.5.0", python_tag="cp310", abi_tag="cp310", platform_tag=MANYLINUX)
    build_wheel(d, "nvidia-cublas-cu12", "12.8.4.1", platform_tag="manylinux_2_27_x86_64")
    build_wheel(
        d,
        "anyio",
        "4.6.2",
        requires_python=">=3.9",
        requires_dist=[
            'exceptiongroup>=1.0.2; python_version < "3.11"',
            "idna>=2.8",
            "sniffio>=1.1",
            'typing_extensions>=4.1; python_version < "3.11"',
        ],
    )
    for name, version in [
        ("exceptiongroup", "1.2.2"),
        ("idna", "3.10"),
        ("sniffio", "1.3.1"),
        ("typing-extensions", "4.12.2"),
    ]:
        build_wheel(d, name, version, requires_python=">=3.8")
    build_wheel(
        d,
        "opencv-python-headless",
        "4.11.0.86",
        python_tag="cp37",
        abi_tag="abi3",
        platform_tag=MANYLINUX,
        requires_python=">=3.7",
        requires_dist=['numpy>=1.21.2; python_version >= "3.10"', 'numpy>=1.23.5; python_version >= "3.11"'],
    )
    for py in ("cp310", "cp311"):
        build_wheel(d, "numpy", "2.2.6", python_tag=py, abi_tag=py, platform_tag=MANYLINUX, requires_python=">=3.10")
    build_wheel(
        d, "numpy", "2.3.0", python_tag="cp311", abi_tag="cp311", platform_tag=MANYLINUX, requires_python=">=3.11"
    )
    for py in ("cp310", "cp311"):
        build_wheel(
            d,
            "scikit-learn",
            "1.7.2",
            python_tag=py,
            abi_tag=py,
            platform_tag=MANYLINUX,
            requires_python=">=3.10",
            requires_dist=["numpy>=1.22.0", "scipy>=1.8.0", "joblib>=1.2.0", "threadpoolctl>=3.1.0"],
        )
        build_wheel(
            d,
            "scipy",
            "1.15.3",
            python_tag=py,
            abi_tag=py,
            platform_tag=MANYLINUX,
            requires_python=">=3.10",
            requires_dist=["numpy<2.5,>=1.23.5"],
        )
    build_wheel(
        d,
        "scipy",
        "1.16.2",
        python_tag="cp311",
        abi_tag="cp311",
        platform_tag=MANYLINUX,
        requires_python=">=3.11",
        requires_dist=["numpy<2.6,>=1.25.2"],
    )
    build_wheel(d, "joblib", "1.5.2", requires_python=">=3.9")
    build_wheel(d, "threadpoolctl", "3.6.0", requires_python=">=3.9")
    build_tiny_sdist(d, "docopt", "0.6.2")  # docopt publishes an sdist only


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    from stackforge.stack.load import load_stack

    base = tmp_path_factory.mktemp("lock-standins")
    stack = load_stack("post2", root=REPO)
    cache = ms.WheelCache(base / "wheels")
    dirs = {}
    for name, specs in ms.stack_specs(stack).items():
        built, _ = cache.index_dir(specs, name)
        dirs[name] = base / "serve" / name
        shutil.copytree(built, dirs[name])
    _public_extras(dirs["pypi"])
    with IndexServer(dirs["mthreads"]) as vendor, IndexServer(dirs["pypi"]) as public:
        yield {"mthreads": vendor, "pypi": public}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """The vllm and vllm_musa stand-in git repositories, at the tags post2 pins, with their requirement files."""
    from stackforge.stack.load import load_stack

    return ms.make_upstreams(tmp_path_factory.mktemp("lock-upstreams"), load_stack("post2", root=REPO))


def _root(tmp: Path) -> Path:
    """A repository root with the real stacks and patch series."""
    root = make_root(tmp)
    shutil.copytree(REPO / "patches", root / "patches")
    return root


def _lock(capsys, tmp_path, monkeypatch, indexes, *sets: str, repos=None) -> tuple[int, str, Path]:
    monkeypatch.setenv("STACKFORGE_CACHE", str(tmp_path / "cache"))
    root = _root(tmp_path)
    args = [f"indexes.{n}.url={s.url}" for n, s in indexes.items()] + ms.upstream_overrides(repos or {}) + list(sets)
    code = cli.main(["--root", str(root), "lock", "post2", *[a for s in args for a in ("--set", s)]])
    out, err = capsys.readouterr()
    return code, out + err, root / "stacks" / "locks" / "post2"


def test_post2_lock_never_names_a_vendor_package_and_locks_the_vendor_deps(
    indexes, repos, tmp_path, monkeypatch, capsys
):
    code, text, locks = _lock(capsys, tmp_path, monkeypatch, indexes, repos=repos)
    assert code == 0, text
    assert sorted(p.name for p in locks.iterdir()) == ["mthreads.deps.txt", "mthreads.txt", "pypi.txt"]
    public = parse_lock(locks / "pypi.txt", (locks / "pypi.txt").read_text())
    deps = parse_lock(locks / "mthreads.deps.txt", (locks / "mthreads.deps.txt").read_text())
    # torchada's unpinned `Requires-Dist: torch` resolved to the vendor torch: the public torch 2.15.0,
    # its triton and nvidia wheels are nowhere; torch's own dependency (filelock) is locked where it is needed.
    assert (
        public.pins["torchada"][0] == "0.1.90"
        and {"torch", "-r vllm/requirements/common.txt"} <= public.via["filelock"]
    )
    assert public.via["torchada"] == {"-r requirements.in"}
    # the requirement-file closure of the vllm-common phase: what each file names, and what that requires
    assert public.via["lark"] == {"-r vllm/requirements/common.txt"} and public.pins["lark"][0] == "1.2.2"
    assert "-r vllm_musa/requirements/musa.txt" in public.via["mthreads-ml-py"]  # through its -r common.txt
    # the plugin's test.txt and its list of vLLM's runtime dependencies, and what they require
    assert "-r vllm_musa/requirements/test.txt" in public.via["pytest"]
    assert "-r vllm_musa/requirements/vllm_runtime_transitive.txt" in public.via["pycountry"]
    assert "uvicorn" in public.via["uvloop"] and public.pins["uvloop"][0] == "0.22.1"  # uvicorn[standard]
    assert public.pins["numpy"][0] == "1.26.0"  # vLLM's unpinned numpy stays on the pin (2.2.6 is served)
    # the plugin's transformers==5.5.3, and vLLM's uncapped huggingface_hub >= 1.27.0 under the plugin's cap (its
    # common.txt a constraint of vLLM's): 2.0.0 is served, the cap keeps it out
    assert "-r vllm_musa/requirements/musa.txt" in public.via["transformers"]
    assert public.pins["transformers"][0] == "5.5.3" and public.pins["huggingface-hub"][0] == "1.33.0"
    assert "-r vllm/requirements/common.txt" in public.via["huggingface-hub"]
    assert "six" not in public.pins  # `six…; python_version > '3.11'` is not for CPython 3.10
    head = (locks / "pypi.txt").read_text().split("annotated-types==", 1)[0]
    assert "# input vllm/requirements/common.txt flattened sha256:" in head
    assert "# input vllm_musa/requirements/musa.txt flattened sha256:" in head
    assert "# input vllm_musa/requirements/common.txt flattened sha256:" in head  # the constraint file
    assert "# input vllm_musa/requirements/vllm_runtime_transitive.txt flattened sha256:" in head
    for lock in (public, deps):
        assert not set(lock.pins) & VENDOR_NAMES
        assert not any(n.startswith("nvidia-") for n in lock.pins)
    # what only a vendor wheel needs (flashinfer-python -> tabulate) is the vendor-deps lock, hashed; its ninja is
    # one of vLLM's build requirements too, so the public lock holds it
    assert set(deps.pins) == {"tabulate"} and deps.via["tabulate"] == {"flashinfer-python"}
    assert "ninja" in public.pins
    served = {p.name: p for p in (indexes["pypi"].directory).glob("tabulate-*.whl")}
    import hashlib

    assert deps.pins["tabulate"][1] == [hashlib.sha256(next(iter(served.values())).read_bytes()).hexdigest()]
    assert "for CPython 3.10 on manylinux_2_35_x86_64" in (locks / "pypi.txt").read_text()


@pytest.mark.parametrize(("python", "scipy", "below_311"), [("3.10", "1.15.3", True), ("3.11", "1.16.2", False)])
def test_the_lock_resolves_for_platform_python_not_the_host(
    indexes, repos, tmp_path, monkeypatch, capsys, python, scipy, below_311
):
    code, text, locks = _lock(
        capsys, tmp_path, monkeypatch, indexes, *EXTRA_PINS, f"platform.python={python}", repos=repos
    )
    assert code == 0, text
    public = parse_lock(locks / "pypi.txt", (locks / "pypi.txt").read_text())
    assert public.pins["scipy"][0] == scipy
    # numpy 2.2.6 (and 2.3.0 on 3.11) would satisfy every requirement that names numpy: the pin holds
    assert public.pins["numpy"][0] == "1.26.0" and public.via["numpy"] >= {"-r requirements.in"}
    assert ({"exceptiongroup", "typing-extensions"} <= set(public.pins)) is below_311
    assert {"anyio", "idna", "sniffio", "opencv-python-headless"} <= set(public.pins)
    assert not set(public.pins) & VENDOR_NAMES


def test_a_package_with_only_an_sdist_is_named_with_the_fix(indexes, repos, tmp_path, monkeypatch, capsys):
    code, text, locks = _lock(
        capsys, tmp_path, monkeypatch, indexes, "packages.docopt={version: 0.6.2, index: pypi}", repos=repos
    )
    assert code == 2, text
    assert "no wheel of docopt on index 'pypi'" in text and "CPython 3.10 on manylinux_2_35_x86_64" in text
    assert "fix: pin a version of docopt that ships a wheel for CPython 3.10" in text
    assert "Traceback" not in text and not locks.exists()


def test_a_requirement_file_that_would_move_a_public_pin_fails_the_lock_naming_the_pin(
    indexes, repos, tmp_path, monkeypatch, capsys
):
    """As in the build, every public pin is a constraint of the resolution: the plugin's common.txt asks
    numpy==1.26 (1.26.0), so a numpy 1.26.4 pin (served) cannot be locked."""
    code, text, locks = _lock(capsys, tmp_path, monkeypatch, indexes, "packages.numpy.version=1.26.4", repos=repos)
    assert code == 2, text
    assert (
        "the requirements of index 'pypi' would move a pin of the stack, which every phase after the one that "
        "installs it holds as a constraint: numpy==1.26.4 (packages.numpy): a requirement asks for numpy==1.26"
    ) in text
    assert "your requirements are unsatisfiable" in text  # uv's own message follows
    assert "Traceback" not in text and not locks.exists()


@pytest.fixture(scope="module")
def locked(indexes, repos, tmp_path_factory):
    """A repository root holding post2's locks, and the --set values they were made with."""
    tmp = tmp_path_factory.mktemp("locked")
    sets = [f"indexes.{n}.url={s.url}" for n, s in indexes.items()] + ms.upstream_overrides(repos)
    sets.append("base.pip={version: '26.3', sha256: [" + "c" * 64 + "]}")  # a locked stack hashes its installer
    root = _root(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STACKFORGE_CACHE", str(tmp / "cache"))
        assert cli.main(["--root", str(root), "lock", "post2", *[a for s in sets for a in ("--set", s)]]) == 0
    return root, sets


def _lint(capsys, root: Path, sets: list[str], verb: str = "render") -> tuple[int, str]:
    """``render --no-sources`` reads the locks as the build does; ``lint`` checks that declared ones exist."""
    capsys.readouterr()
    extra = ["--no-sources", "--out", str(root / "build" / "render")] if verb == "render" else []
    code = cli.main(["--root", str(root), verb, "post2", *extra, *[a for s in sets for a in ("--set", s)]])
    out, err = capsys.readouterr()
    return code, out + err


DEPS_REL = "stacks/locks/post2/mthreads.deps.txt"
HASH = "ab" * 32


@pytest.mark.parametrize(
    ("case", "extra", "line_of", "message"),
    [
        (
            "vendor-name",
            f"torch==2.15.0 \\\n    --hash=sha256:{HASH}\n    # via flashinfer-python\n",
            "torch==",
            "torch comes from index 'mthreads' in this stack, a pin of the stack",
        ),
        (
            "no-via-chain",
            f"requests==2.32.3 \\\n    --hash=sha256:{HASH}\n",
            "requests==",
            "requests is not a pin of index 'mthreads' and no pin of 'mthreads' requires it",
        ),
        ("unhashed", "six==1.16.0\n", "six==", "six==1.16.0 has no --hash=sha256:"),
        ("option", "--extra-index-url https://evil.example/simple\n", "--extra", "option '--extra-index-url'"),
    ],
)
def test_a_bad_vendor_deps_lock_is_refused_at_its_line(locked, tmp_path, capsys, case, extra, line_of, message):
    root, sets = locked
    path = root / DEPS_REL
    good = path.read_text()
    path.write_text(good + extra)
    try:
        code, text = _lint(capsys, root, sets)
    finally:
        path.write_text(good)
    line = next(i for i, l in enumerate((good + extra).splitlines(), start=1) if l.startswith(line_of))
    assert code == 2, text
    assert f"{DEPS_REL}:{line}: {message}" in text and "fix: run: stackforge lock post2" in text


def test_a_lock_made_for_another_python_is_refused(locked, capsys):
    root, sets = locked
    assert _lint(capsys, root, sets)[0] == 0
    code, text = _lint(capsys, root, [*sets, "platform.python=3.11"])
    assert code == 2
    assert (
        "stacks/locks/post2/pypi.txt:1: the lock was resolved for CPython 3.10 on manylinux_2_35_x86_64, but the "
        "stack targets CPython 3.11 on manylinux_2_35_x86_64" in text
    )


def test_a_vendor_index_declared_locked_needs_its_deps_lock(locked, capsys):
    root, sets = locked
    good = (root / DEPS_REL).read_text()
    (root / DEPS_REL).unlink()
    try:
        assert _lint(capsys, root, sets)[0] == 0  # not declared `lock: true`: the phase runs unlocked
        code, text = _lint(capsys, root, [*sets, "indexes.mthreads.lock=true"])
        lint_code, lint_text = _lint(capsys, root, [*sets, "indexes.mthreads.lock=true"], verb="lint")
    finally:
        (root / DEPS_REL).write_text(good)
    assert code != 0 and f"index 'mthreads' is declared `lock: true` but {DEPS_REL} is missing" in text, text
    assert lint_code != 0 and f"index 'mthreads' is declared `lock: true` but {DEPS_REL} is missing" in lint_text


# --------------------------------------------------------------------------- the requirement-file closure

PUBLIC_REL = "stacks/locks/post2/pypi.txt"


def _assemble(root: Path, sets: list[str], monkeypatch, *more: str):
    """Assemble post2's context as the build does (upstreams exported and patched, locks checked): no engine."""
    from stackforge.builder.context.context import assemble
    from stackforge.stack.load import load

    monkeypatch.setenv("STACKFORGE_CACHE", str(root.parent / "cache"))
    return assemble(load("post2", root=root, overrides=[*sets, *more]), root / "build" / "assembled")


def _header_line(text: str, label: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if line.startswith(f"# input {label} "))


def test_the_requirement_phase_of_a_locked_index_runs_offline(locked, capsys, monkeypatch):
    root, sets = locked
    ctx = _assemble(root, sets, monkeypatch)
    phase = next(p for p in ctx.plan.phases if p.files)
    assert (phase.no_index, phase.lock, phase.require_hashes) == (True, PUBLIC_REL, False)
    pypi = next(p for p in ctx.plan.phases if p.name == "pypi")
    assert (ctx.context_dir / pypi.requirements).read_text() == (root / PUBLIC_REL).read_text()
    code, text = _lint(capsys, root, sets)
    assert code == 0, text
    dockerfile = (root / "build" / "render" / "Dockerfile").read_text().replace("\\\n", " ")
    run = next(line for line in dockerfile.splitlines() if "--phase requirements.vllm-common" in line)
    assert f"--lock {PUBLIC_REL} --stack post2 --" in run
    assert " --no-index -c /stackforge/deps/requirements/vllm-common.constraints.txt -r " in run


def test_a_requirement_file_changed_by_the_patch_series_makes_the_lock_stale(locked, repos, tmp_path, monkeypatch):
    root, sets = locked
    text = (root / PUBLIC_REL).read_text()
    with ms.requirement_patched(root, repos["vllm"], tmp_path, "ninja"), pytest.raises(UserError) as err:
        _assemble(root, sets, monkeypatch)
    line = _header_line(text, "vllm/requirements/common.txt")
    assert err.value.file == PUBLIC_REL and err.value.line == line
    assert "lock file is stale: vllm/requirements/common.txt (requirements.vllm-common.files[0]) changed" in str(
        err.value
    )
    assert "with its patch series" in str(err.value) and err.value.fix.startswith("run: stackforge lock post2")
    _assemble(root, sets, monkeypatch)  # the series restored: the lock is fresh again


def test_a_moved_upstream_commit_that_changes_a_requirement_file_makes_the_lock_stale(
    locked, repos, tmp_path, monkeypatch
):
    root, sets = locked
    moved = tmp_path / "vllm-moved"
    subprocess.run(["git", "clone", "-q", str(repos["vllm"].path), str(moved)], check=True, capture_output=True)
    ms._git(moved, "checkout", "-q", repos["vllm"].commit)
    tagged = {}
    for tag, rel, text in [
        ("v0.28.0.1", "README.md", "# vllm, a commit later\n"),  # moves the commit, not a requirement file
        ("v0.28.1", "requirements/common.txt", ms.VLLM_COMMON.replace("lark == 1.2.2", "lark == 1.3.0")),
    ]:
        (moved / rel).write_text(text)
        ms._git(moved, "commit", "-qam", f"Release {tag}")
        ms._git(moved, "tag", "-a", tag, "-m", f"vllm {tag}")
        tagged[tag] = ms._git(moved, "rev-parse", "HEAD")

    def at(tag: str) -> list[str]:
        # vLLM moves without the plugin, whose third_party/PINS names v0.28.0: its keys are not compared here
        return [
            f"upstreams.vllm.git={moved}",
            f"upstreams.vllm.tag={tag}",
            f"upstreams.vllm.commit={tagged[tag]}",
            "upstreams.vllm_musa.agree.keys={}",
        ]

    _assemble(root, sets, monkeypatch, *at("v0.28.0.1"))  # the files did not change: the lock is fresh
    with pytest.raises(UserError) as err:
        _assemble(root, sets, monkeypatch, *at("v0.28.1"))
    assert err.value.line == _header_line((root / PUBLIC_REL).read_text(), "vllm/requirements/common.txt")
    assert "vllm/requirements/common.txt (requirements.vllm-common.files[0]) changed since the lock" in str(err.value)
    assert f"upstream vllm at v0.28.1@{tagged['v0.28.1']}" in str(err.value)


def test_lock_check_reads_the_requirement_files_only_with_sources(locked, repos, tmp_path, monkeypatch, capsys):
    """Offline, ``lock --check`` checks post2's locks against the stack and names the requirement files it did not
    re-read; with ``--sources`` it exports and patches the upstreams and finds the file the series changed."""
    root, sets = locked
    monkeypatch.setenv("STACKFORGE_CACHE", str(root.parent / "cache"))
    argv = ["--root", str(root), "lock", "--check", "post2", *[a for s in sets for a in ("--set", s)]]
    before = {p.name: p.read_bytes() for p in (root / "stacks" / "locks" / "post2").iterdir()}
    capsys.readouterr()
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "current: stacks/locks/post2/pypi.txt" in out and "current: stacks/locks/post2/mthreads.txt" in out
    assert "were checked by name, not re-read: add --sources" in err
    assert cli.main([*argv, "--sources"]) == 0
    text = (root / PUBLIC_REL).read_text()
    with ms.requirement_patched(root, repos["vllm"], tmp_path, "ninja"):
        assert cli.main(argv) == 0  # the file's name is still the one the lock records
        capsys.readouterr()
        assert cli.main([*argv, "--sources"]) == 1
    out, err = capsys.readouterr()
    line = _header_line(text, "vllm/requirements/common.txt")
    assert (
        f"stale: {PUBLIC_REL}:{line}: vllm/requirements/common.txt (requirements.vllm-common.files[0]) changed" in err
    )
    assert "fix: run: stackforge lock post2" in err
    assert {p.name: p.read_bytes() for p in (root / "stacks" / "locks" / "post2").iterdir()} == before


@pytest.mark.parametrize(
    ("case", "edit", "message"),
    [
        (
            "made-before-the-phase",
            lambda t: "".join(l for l in t.splitlines(True) if not l.startswith("# input vllm/")),
            "lock file is stale: it does not cover vllm/requirements/build/empty.txt (requirements.vllm-build.files[0])",
        ),
        (
            "entry-removed",
            lambda t: re.sub(r"lark==1\.2\.2 \\\n.*\n    # via -r vllm/requirements/common.txt\n", "", t),
            "vllm/requirements/common.txt requires lark==1.2.2, which the lock does not list",
        ),
    ],
)
def test_a_lock_that_does_not_cover_a_requirement_file_is_refused(locked, monkeypatch, case, edit, message):
    root, sets = locked
    path = root / PUBLIC_REL
    good = path.read_text()
    path.write_text(edit(good))
    assert path.read_text() != good
    try:
        with pytest.raises(UserError) as err:
            _assemble(root, sets, monkeypatch)
    finally:
        path.write_text(good)
    assert err.value.file == PUBLIC_REL and message in str(err.value), str(err.value)
    assert err.value.fix.startswith("run: stackforge lock post2")


def test_the_offline_phase_names_the_lock_when_pip_finds_nothing(tmp_path):
    """preserve.py, as the requirement phase runs it: pip --no-index fails, the last line says why and the fix."""
    pins = tmp_path / "pins.json"
    pins.write_text("{}")
    pip_says = (
        "ERROR: Could not find a version that satisfies the requirement lark==1.2.2 (from versions: none)\n"
        "ERROR: No matching distribution found for lark==1.2.2"
    )
    args = ["--phase", "requirements.vllm-common", "--key", "requirements.vllm-common", "--index", "pypi"]
    args += ["--pins", str(pins), "--record", str(tmp_path / "r.json"), "--lock", PUBLIC_REL, "--stack", "post2"]
    proc = subprocess.run(
        [
            sys.executable,
            str(SOURCE_IMAGES / "gate" / "preserve.py"),
            *args,
            "--",
            sys.executable,
            "-c",
            f"import sys; print({pip_says!r}); sys.exit(1)",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == (
        f"ERROR: pip phase requirements.vllm-common runs --no-index: its requirement files must be satisfied by "
        f"what {PUBLIC_REL} installed with --require-hashes, and lark is not (the lock is incomplete or stale; "
        "nothing is fetched from the index instead): run: stackforge lock post2"
    )
