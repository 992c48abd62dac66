"""Golden Dockerfiles of the checked-in stacks, and one Dockerfile for `render`, `build` and `bake`.

Each stack in stacks/ is rendered through the prepare path the three verbs share, without
fetching upstreams and with a fixed base image, so nothing host-dependent reaches the text.
After an intended change to a template, a stack or the labels, regenerate and review the diff:

    STACKFORGE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render_golden.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_stack_golden import compare_golden

from stackforge.builder.context import context
from stackforge.builder.context.prepare import INPUTS_OMITTED, BaseImage, EngineFacts, prepare_dockerfile
from stackforge.builder.run import bake, run
from stackforge.builder.sources.sources import SourceInfo
from stackforge.clients.workspace import Workspace
from stackforge.stack.load import fingerprint, load
from stackforge.stack.names import list_stacks
from tests.fixtures.stack_support import REPO, RootSpec, run_cli

BASE_DIGEST = "sha256:" + "d" * 64
BASE_ID = "sha256:" + "e" * 64
COMMIT_TIME = 1_700_000_000  # 2023-11-14T22:13:20Z
BASE_CREATED = "2024-02-03T04:05:06.123456789Z"  # as the engine writes it
BASE_EPOCH = 1_706_933_106
INPUTS = "org.stackforge.inputs"
STACKS = ["example", "example-multi", "post1", "post2"]
#: the platform lines that are not their stack's own: each renders its own Dockerfile (docs/build.md)
LINES = [("example-multi", "arm64")]


def check_golden(name: str, text: str, *host_paths: Path) -> None:
    """Compare with tests/unit/golden/NAME, or rewrite it under STACKFORGE_UPDATE_GOLDEN=1.

    A Dockerfile names paths inside the image (/opt/venv, /root/.cache), so only the host's
    own paths are refused here."""
    for path in (REPO, *host_paths):
        assert str(path) not in text, f"the Dockerfile embeds the host path {path}"
    compare_golden(name, text)


def fixed_engine_facts() -> EngineFacts:
    return EngineFacts(BaseImage(BASE_DIGEST, BASE_ID, BASE_CREATED, 2), source_date_epoch=True, run_network=True)


def test_every_checked_in_stack_has_a_golden_case():
    assert sorted(list_stacks(REPO)) == sorted(STACKS)


def with_ca_bundle(tmp_path: Path) -> Workspace:
    """A workspace whose builds pass a CA bundle (the goldens do not depend on the host having one)."""
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return Workspace.at(REPO, ca_bundle=str(pem))


@pytest.mark.parametrize("name", STACKS)
def test_rendered_dockerfile_matches_its_golden_file(tmp_path, name):
    stack = load(name, root=REPO)
    prepared = prepare_dockerfile(
        stack, out=tmp_path / "out", sources=False, engine_facts=fixed_engine_facts, workspace=with_ca_bundle(tmp_path)
    )
    text = prepared.ctx.dockerfile.read_text(encoding="utf-8")
    assert f'"org.opencontainers.image.base.digest"="{BASE_DIGEST}"' in text
    assert f'"org.stackforge.base.id"="{BASE_ID}"' in text
    assert INPUTS not in text and prepared.inputs_omitted == INPUTS_OMITTED
    check_golden(f"dockerfile_{name}.txt", text, tmp_path)


@pytest.mark.parametrize(("name", "line"), LINES)
def test_a_platform_line_renders_its_own_dockerfile(tmp_path, name, line):
    """A line's Dockerfile is its stack's, built from the line's values: the stack's own Dockerfile with only
    what the line changes (its base, its lock's hashes header, its fingerprint and stack-file labels)."""
    loaded = load(name, root=REPO)
    own, other = loaded.platform_lines()[loaded.line.name], loaded.for_platform(line)
    texts = []
    for i, stack in enumerate((own, other)):
        prepared = prepare_dockerfile(
            stack,
            out=tmp_path / str(i),
            sources=False,
            engine_facts=fixed_engine_facts,
            workspace=with_ca_bundle(tmp_path),
        )
        texts.append(prepared.ctx.dockerfile.read_text(encoding="utf-8"))
    check_golden(f"dockerfile_{name}@{line}.txt", texts[1], tmp_path)
    changed = [(a, b) for a, b in zip(texts[0].splitlines(), texts[1].splitlines()) if a != b]
    assert len(texts[0].splitlines()) == len(texts[1].splitlines())
    mark = fingerprint(other.model)
    assert mark != fingerprint(own.model)
    assert changed and all(
        other.model.base.image in b or mark in b or f"stacks/locks/{name}@{line}/" in b for _, b in changed
    ), changed


def ca_lines(flag: str, path: str) -> tuple[str, ...]:
    """The lines a CA bundle mount adds to a downloading step."""
    return (
        f"    {flag} \\\n",
        f"    if [ -s {path} ]; then export PIP_CERT={path}; fi; \\\n",
        f"    if [ -s {path} ]; then export PIP_CERT={path} CURL_CA_BUNDLE={path} SSL_CERT_FILE={path}; fi; \\\n",
    )


BIND_FLAG = "--mount=type=bind,from=stackforge-cabundle,source=ca.pem,target=/run/stackforge/ca.pem"
BIND_LINES = ca_lines(BIND_FLAG, "/run/stackforge/ca.pem")
SECRET_LINES = ca_lines("--mount=type=secret,id=cabundle", "/run/secrets/cabundle")


def render_with(tmp_path: Path, stack, sub: str, workspace: Workspace, named_contexts: bool = True) -> str:
    facts = replace(fixed_engine_facts(), named_contexts=named_contexts)
    return prepare_dockerfile(
        stack, out=tmp_path / sub, sources=False, engine_facts=lambda: facts, workspace=workspace
    ).ctx.dockerfile.read_text()


def without_lines(text: str, lines: tuple[str, ...]) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if line not in lines)


@pytest.mark.parametrize("name", STACKS)
def test_a_build_without_a_ca_bundle_declares_no_mount_of_it(tmp_path, name):
    """The steps that download bind-mount the CA bundle from the named context stackforge-cabundle; without a
    bundle they declare no mount of it; nothing else in the Dockerfile changes."""
    stack = load(name, root=REPO)
    with_bundle = render_with(tmp_path, stack, "a", with_ca_bundle(tmp_path))
    without = render_with(tmp_path, stack, "b", Workspace.at(REPO, ca_bundle="none"))
    assert with_bundle.count(BIND_FLAG) >= 1, "every golden stack downloads in a pip phase"
    assert "cabundle" not in with_bundle.replace("from=stackforge-cabundle,", "")  # no secret mount
    assert "cabundle" not in without and "ca.pem" not in without
    assert without_lines(with_bundle, BIND_LINES) == without


@pytest.mark.parametrize("name", STACKS)
def test_an_engine_without_named_contexts_gets_the_bundle_as_a_secret(tmp_path, name):
    """BuildKit older than 0.10 takes no named contexts: the same steps mount the bundle as the secret
    `cabundle` instead, and nothing else changes."""
    stack = load(name, root=REPO)
    bind = render_with(tmp_path, stack, "a", with_ca_bundle(tmp_path))
    secret = render_with(tmp_path, stack, "b", with_ca_bundle(tmp_path), named_contexts=False)
    assert secret.count("--mount=type=secret,id=cabundle") == bind.count(BIND_FLAG) >= 1
    assert "stackforge-cabundle" not in secret
    assert without_lines(secret, SECRET_LINES) == without_lines(bind, BIND_LINES)


# --------------------------------------------------------------------------- one path for three verbs


class StandInEngine:
    """Answers what the prepare path asks the engine: the base image's identity, SOURCE_DATE_EPOCH support."""

    def __init__(self):
        self.asked: list[str] = []

    def image_exists(self, ref: str) -> bool:
        self.asked.append(ref)
        return True

    def inspect_image(self, ref: str, template: str, *, timeout: float = 30) -> SimpleNamespace:
        assert template == run.INSPECT, template
        self.asked.append(ref)
        info = {"Id": BASE_ID, "RepoDigests": [f"stackforge/base@{BASE_DIGEST}"], "Created": BASE_CREATED, "Layers": 2}
        return SimpleNamespace(returncode=0, stdout=json.dumps(info) + "\n", stderr="")

    def config_digest(self, image_id: str, platform=None) -> str:
        return image_id  # the classic store: the id is the config's digest

    def supports_source_date_epoch(self) -> bool:
        return True

    def supports_run_network(self) -> bool:
        return True

    def supports_named_contexts(self) -> bool:
        return True


def fake_export(stack, name, dest: Path, cache) -> SourceInfo:
    """An upstream export without the network: one file and a fixed pin, commit time and series."""
    dest.mkdir(parents=True)
    (dest / "setup.py").write_text("# exported\n")
    return SourceInfo(
        name,
        "sdist",
        "markupsafe==3.0.3@sha256:" + "a" * 64,
        commit_time=COMMIT_TIME,
        series_hash="sha256:" + "b" * 64,
        patches=["0001-x.patch"],
    )


@pytest.fixture
def root_spec() -> RootSpec:
    """A repository root with a copy of stacks/ (the templates come from the source tree)."""
    return RootSpec(parts=("stacks",))


def three_dockerfiles(root: Path, tmp_path: Path, capsys, monkeypatch, *, sources: bool):
    """The Dockerfiles `render`, `build` and `bake` write for the example stack (and what they returned)."""
    engine = StandInEngine()
    monkeypatch.setattr("stackforge.clients.engine.Engine", lambda **_: engine)  # the workspace's engine
    rc, out, err = run_cli(
        capsys, root, "render", "example", "--out", str(tmp_path / "render"), *([] if sources else ["--no-sources"])
    )
    assert (rc, err) == (0, ""), err
    loaded = load("example", root=root)
    built = run.prepare(loaded, engine, out=tmp_path / "build", sources=sources)
    [item] = bake.prepare([loaded], engine=engine, sources=sources, workspace=Workspace.at(root))
    assert item.dockerfile == root / "build" / "example" / "Dockerfile"
    return (
        [
            (tmp_path / "render" / "Dockerfile").read_bytes(),
            built.ctx.dockerfile.read_bytes(),
            item.dockerfile.read_bytes(),
        ],
        out,
        engine,
        built,
    )


def test_render_build_and_bake_write_the_same_dockerfile(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STACKFORGE_PROGRESS", "0")  # the test compares stderr
    monkeypatch.setattr(context, "export_source", fake_export)
    files, out, engine, built = three_dockerfiles(root, tmp_path, capsys, monkeypatch, sources=True)
    assert files[0] == files[1] == files[2]
    text = files[0].decode()
    inputs = built.ctx.inputs_fingerprint()
    assert f'"{INPUTS}"="{inputs}"' in text and f"inputs:     {inputs}\n" in out
    # the base by its config's digest; the repository digest the engine reports is no pin of the stack's: not recorded
    assert f'"org.stackforge.base.id"="{BASE_ID}"' in text and "org.opencontainers.image.base.digest" not in text
    assert '"org.opencontainers.image.created"="2023-11-14T22:13:20Z"' in text
    assert built.build_args == {"SOURCE_DATE_EPOCH": str(BASE_EPOCH)} and built.inputs_omitted is None
    # The layer epoch is the base image's creation time: every stage that runs a step declares it.
    assert f'"org.stackforge.epoch"="{BASE_EPOCH}"' in text
    assert '"org.stackforge.base.layers"="2"' in text  # the publisher leaves the base's own layers as they are
    froms = [line for line in text.splitlines() if line.startswith("FROM ") and not line.startswith("FROM scratch")]
    assert text.count(f"ARG SOURCE_DATE_EPOCH={BASE_EPOCH}\n") == len(froms) > 3
    assert engine.asked == ["stackforge/base:bookworm"] * 3


def test_a_base_without_a_creation_time_takes_the_sources_epoch(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("STACKFORGE_PROGRESS", "0")
    monkeypatch.setattr(context, "export_source", fake_export)
    monkeypatch.setattr(sys.modules[__name__], "BASE_CREATED", "")
    files, _out, _engine, _built = three_dockerfiles(root, tmp_path, capsys, monkeypatch, sources=True)
    text = files[0].decode()
    assert f'"org.stackforge.epoch"="{COMMIT_TIME}"' in text and f"ARG SOURCE_DATE_EPOCH={COMMIT_TIME}\n" in text


def test_without_sources_the_three_agree_and_the_inputs_label_is_omitted(root, tmp_path, capsys, monkeypatch):
    files, out, engine, built = three_dockerfiles(root, tmp_path, capsys, monkeypatch, sources=False)
    assert files[0] == files[1] == files[2]
    text = files[0].decode()
    assert INPUTS not in text and "base.digest" not in text and "created" not in text
    assert f"inputs:     omitted: {INPUTS_OMITTED}\n" in out
    assert engine.asked == [] and built.build_args == {}


def test_render_lints_before_it_writes(root, tmp_path, capsys):
    """A stack that fails lint is refused by render as by build, and nothing is written."""
    (root / "stacks" / "locks" / "example" / "pypi.txt").unlink()
    rc, _, err = run_cli(capsys, root, "render", "example", "--no-sources", "--out", str(tmp_path / "o"))
    assert rc == 1 and err.startswith("error: stack 'example' fails lint; nothing was built:")
    assert not (tmp_path / "o").exists()
