"""Pure parts of stackforge.clients.engine: argv assembly, version parsing and reading the engine's answers about
an image (no engine needed)."""

from __future__ import annotations

import json
import subprocess

import pytest

from stackforge.clients.engine import (
    BuildCommand,
    Engine,
    NoSuchImage,
    check_build_args,
    effective_buildkit,
    parse_buildx_endpoint,
    parse_buildx_inspect,
    parse_buildx_version,
    parse_version,
)
from stackforge.errors import BuildFailed, UserError


def _pairs(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_build_command_assembles_every_option_in_place():
    cmd = BuildCommand(
        "/ctx",
        dockerfile="/ctx/build/Dockerfile",
        target="vllm-openai",
        tags=["a:1", "b:2"],
        build_args={"PYTHON": "3.10", "SOURCE_DATE_EPOCH": "1700000000"},
        secrets=[("cabundle", "/etc/ssl/certs/ca-certificates.crt"), ("netrc", "/tmp/netrc")],
        contexts={"stackforge-cabundle": "/tmp/secrets/ca"},
        labels={"org.opencontainers.image.revision": "abc"},
        metadata_file="/out/meta.json",
        builder="ci",
    ).argv()
    assert cmd[:5] == ["docker", "buildx", "--builder", "ci", "build"]
    assert "--progress=plain" in cmd
    assert _pairs(cmd, "--file") == ["/ctx/build/Dockerfile"]
    assert _pairs(cmd, "--target") == ["vllm-openai"]
    assert _pairs(cmd, "--tag") == ["a:1", "b:2"]
    assert _pairs(cmd, "--build-arg") == ["PYTHON=3.10", "SOURCE_DATE_EPOCH=1700000000"]
    assert _pairs(cmd, "--secret") == [
        "id=cabundle,src=/etc/ssl/certs/ca-certificates.crt",
        "id=netrc,src=/tmp/netrc",
    ]
    assert _pairs(cmd, "--build-context") == ["stackforge-cabundle=/tmp/secrets/ca"]
    assert _pairs(cmd, "--label") == ["org.opencontainers.image.revision=abc"]
    assert _pairs(cmd, "--metadata-file") == ["/out/meta.json"]
    assert "--load" in cmd
    assert cmd[-1] == "/ctx"


def test_secrets_never_become_build_args():
    cmd = BuildCommand("/ctx", secrets=[("pip_token", "/run/creds/token")], build_args={"A": "1"}).argv()
    build_args = _pairs(cmd, "--build-arg")
    assert build_args == ["A=1"]
    assert not any("pip_token" in a or "/run/creds/token" in a for a in build_args)
    assert _pairs(cmd, "--secret") == ["id=pip_token,src=/run/creds/token"]


def test_a_build_context_name_buildx_cannot_parse_is_refused():
    with pytest.raises(UserError, match="invalid build context name"):
        BuildCommand("/ctx", contexts={"ca=x": "/tmp/ca"}).argv()


def test_a_missing_build_context_directory_is_refused_before_the_engine_runs(tmp_path):
    with pytest.raises(UserError, match=r"build context stackforge-cabundle: directory .*/gone does not exist"):
        Engine(docker="/nonexistent/docker").build(tmp_path, contexts={"stackforge-cabundle": tmp_path / "gone"})


def test_minimal_command_has_no_optional_flags():
    cmd = BuildCommand("ctx", load=False).argv()
    assert cmd == ["docker", "buildx", "build", "--progress=plain", "ctx"]


@pytest.mark.parametrize("name", ["PIP_PASSWORD", "hf_token", "NPM_AUTH_TOKEN", "AWS_SECRET_ACCESS_KEY", "API_KEY"])
def test_credential_like_build_args_are_refused(name):
    with pytest.raises(UserError) as exc:
        BuildCommand("/ctx", build_args={name: "x"}).argv()
    assert "secret" in exc.value.fix


def test_url_with_password_in_build_arg_is_refused():
    with pytest.raises(UserError):
        check_build_args({"INDEX_URL": "https://user:hunter2@pypi.example.org/simple"})
    # a URL without credentials is fine
    check_build_args({"INDEX_URL": "https://pypi.example.org/simple", "PIP_USER": "alice"})


@pytest.mark.parametrize("sid", ["bad id", "a,b", "", "x=y"])
def test_invalid_secret_ids_are_refused(sid):
    with pytest.raises(UserError):
        BuildCommand("/ctx", secrets=[(sid, "/tmp/f")]).argv()


def test_duplicate_secret_id_and_comma_in_path_are_refused():
    with pytest.raises(UserError):
        BuildCommand("/ctx", secrets=[("a", "/x"), ("a", "/y")]).argv()
    with pytest.raises(UserError):
        BuildCommand("/ctx", secrets=[("a", "/tmp/a,b")]).argv()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("v0.8+unknown", (0, 8)),
        ("v0.13.1+ds1", (0, 13, 1)),
        ("0.11.0", (0, 11, 0)),
        ("v0.12.5-tp-docker", (0, 12, 5)),
    ],
)
def test_parse_version(text, expected):
    assert parse_version(text) == expected


def test_parse_version_rejects_garbage():
    with pytest.raises(ValueError):
        parse_version("unknown")


@pytest.mark.parametrize(
    "output, expected",
    [
        ("github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3\n", "0.13.1+ds1"),
        ("github.com/docker/buildx v0.17.1 257815a\n", "0.17.1"),
    ],
)
def test_parse_buildx_version(output, expected):
    assert parse_buildx_version(output) == expected


NEW_INSPECT = """\
Name:   default
Driver: docker

Nodes:
Name:             default
Endpoint:         default
Status:           running
BuildKit version: v0.8+unknown
Platforms:        linux/amd64, linux/386
"""

OLD_INSPECT = """\
Name:   ci
Driver: docker-container

Nodes:
Name:      ci0
Endpoint:  unix:///var/run/docker.sock
Status:    running
Buildkit:  v0.12.5
Platforms: linux/amd64
"""


def test_parse_buildx_inspect_new_and_old_layouts():
    new = parse_buildx_inspect(NEW_INSPECT)
    assert new == {"name": "default", "driver": "docker", "status": "running", "buildkit": "v0.8+unknown"}
    old = parse_buildx_inspect(OLD_INSPECT)
    assert old["name"] == "ci" and old["driver"] == "docker-container" and old["buildkit"] == "v0.12.5"


DEBIAN_INSPECT = NEW_INSPECT.replace("v0.8+unknown", "v0.0.0+unknown")


@pytest.mark.parametrize(
    "inspect, server, expected",
    [
        (NEW_INSPECT, "20.10.24+dfsg1", False),
        (OLD_INSPECT, "20.10.24", True),  # a docker-container builder says its own version
        (DEBIAN_INSPECT, "26.1.5+dfsg1", True),  # Debian's build says v0.0.0: Docker 26 embeds 0.13
        (DEBIAN_INSPECT, "20.10.24+dfsg1", False),
        (DEBIAN_INSPECT, "31.0.0", True),  # newer than the table: its newest entry
    ],
)
def test_engine_features_follow_the_buildkit_it_runs(inspect, server, expected):
    engine = Engine()
    engine._inspect = parse_buildx_inspect(inspect)  # what _inspect_builder would have cached
    engine._server = server
    assert engine.supports_source_date_epoch() is expected
    assert engine.supports_run_network() is expected
    assert engine.supports_named_contexts() is expected  # 0.10: between 0.8 and 0.11 in these cases


def test_named_contexts_start_at_buildkit_0_10():
    engine = Engine()
    engine._inspect = parse_buildx_inspect(OLD_INSPECT.replace("v0.12.5", "v0.10.6"))
    engine._server = "20.10.24"
    assert engine.supports_named_contexts() and not engine.supports_run_network()
    engine._inspect = parse_buildx_inspect(OLD_INSPECT.replace("v0.12.5", "v0.9.3"))
    assert not engine.supports_named_contexts()


def test_effective_buildkit_reads_the_report_first_then_the_docker_release():
    assert effective_buildkit("v0.12.5", "docker", "20.10.24") == (0, 12)
    assert effective_buildkit("v0.0.0+unknown", "docker", "26.1.5+dfsg1") == (0, 13)
    assert effective_buildkit("v0.0.0+unknown", "docker-container", "26.1.5") == (0, 0)
    assert effective_buildkit("v0.0.0+unknown", "docker", "19.03.1") == (0, 0)
    assert effective_buildkit(None, "docker", None) == (0, 0)


def test_buildkit_version_names_the_release_it_is_taken_for():
    engine = Engine()
    engine._inspect = parse_buildx_inspect(DEBIAN_INSPECT)
    engine._server = "26.1.5+dfsg1"
    assert engine.buildkit_version() == "v0.0.0+unknown (Docker 26.1.5+dfsg1: 0.13)"


def test_missing_cli_is_a_user_error_with_the_fix():
    with pytest.raises(UserError) as exc:
        Engine(docker="stackforge-no-such-docker").check()
    assert "engine-setup.sh" in exc.value.fix


CONTEXT_INSPECT = """Name:   stackforge-sf2
Driver: docker

Nodes:
Name:             stackforge-sf2
Endpoint:         stackforge-sf2
Status:           running
BuildKit version: v0.0.0+unknown
"""


def _fake_docker(tmp_path, inspect: str, current: str = "default"):
    """A docker CLI that answers ``buildx inspect`` and ``context show`` and records each call with its context."""
    script = tmp_path / "docker"
    (tmp_path / "inspect.txt").write_text(inspect)
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "${{DOCKER_CONTEXT:-}}|${{DOCKER_HOST:-}}|$*" >> {tmp_path}/calls\n'
        f'if [ "$1 $2" = "buildx inspect" ]; then cat {tmp_path}/inspect.txt; exit 0; fi\n'
        f'if [ "$1 $2" = "context show" ]; then echo {current}; exit 0; fi\n'
        "echo sha256:abc\n"
    )
    script.chmod(0o755)
    return script


def test_parse_buildx_endpoint_reads_the_first_node():
    assert parse_buildx_endpoint(CONTEXT_INSPECT) == "stackforge-sf2"
    assert parse_buildx_endpoint(OLD_INSPECT) == "unix:///var/run/docker.sock"
    assert parse_buildx_endpoint("Name: x\nDriver: docker\n") is None


def test_a_docker_builder_of_another_context_runs_every_command_there(tmp_path):
    docker = _fake_docker(tmp_path, CONTEXT_INSPECT)
    engine = Engine(
        docker=str(docker), builder="stackforge-sf2", env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///x"}
    )
    assert engine.image_id("img") == "sha256:abc"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[-1] == "stackforge-sf2||image inspect --format {{.Id}} img"  # the second engine, not DOCKER_HOST
    assert engine.context == "stackforge-sf2"


@pytest.mark.parametrize(
    ("inspect", "current"),
    [(OLD_INSPECT, "default"), (CONTEXT_INSPECT.replace("Driver: docker", "Driver: docker-container"), "default"),
     (CONTEXT_INSPECT, "stackforge-sf2")],
    ids=["address-endpoint", "docker-container-driver", "already-there"],
)  # fmt: skip
def test_other_builders_leave_the_engine_where_it_is(tmp_path, inspect, current):
    docker = _fake_docker(tmp_path, inspect, current)
    engine = Engine(docker=str(docker), builder="ci", env={"PATH": "/usr/bin:/bin"})
    engine.image_id("img")
    assert (tmp_path / "calls").read_text().splitlines()[-1].startswith("||image inspect")
    assert engine.context is None


# --------------------------------------------------------------------------- what the engine says of an image

#: ``docker image inspect`` of an image as Docker 26 answers it (the fields the verbs read, and a few more)
IMAGE = {
    "Id": "sha256:" + "f" * 64,
    "RepoTags": ["stackforge/base:bookworm"],
    "RepoDigests": [],
    "Created": "2026-12-06T14:08:28.918152582Z",
    "Config": {"Env": ["PATH=/usr/bin"], "Labels": {"org.stackforge.stack": "example", "empty": ""}},
    "Architecture": "arm64",
    "Variant": "v8",
    "Os": "linux",
    "Size": 74_000_000,
    "RootFS": {"Type": "layers", "Layers": ["sha256:" + "1" * 64, "sha256:" + "2" * 64]},
}


def _inspecting_docker(tmp_path, answer: str, stderr: str = "", rc: int = 0) -> Engine:
    """An engine whose CLI answers every ``image inspect`` with ``answer`` (and ``stderr``, exit ``rc``), as the
    docker CLI prints them, and records each call."""
    (tmp_path / "answer").write_text(answer)
    (tmp_path / "stderr").write_text(stderr)
    script = tmp_path / "docker"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        f"cat {tmp_path}/answer; cat {tmp_path}/stderr >&2; exit {rc}\n"
    )
    script.chmod(0o755)
    return Engine(docker=str(script), env={"PATH": "/usr/bin:/bin"})


def test_the_image_verbs_read_one_inspect_of_the_reference(tmp_path):
    engine = _inspecting_docker(tmp_path, json.dumps([IMAGE], indent=4) + "\n")
    assert engine.image_attrs("-weird") == IMAGE
    assert engine.image_labels("img") == {"org.stackforge.stack": "example", "empty": ""}
    assert engine.image_config("img")["Env"] == ["PATH=/usr/bin"]
    assert engine.image_created("img") == "2026-12-06T14:08:28.918152582Z"
    assert engine.image_layers("img") == ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "image inspect -- -weird"  # a reference is never read as an option
    assert len(calls) == 5


@pytest.mark.parametrize(
    ("changes", "labels", "config", "created", "layers"),
    [
        ({"Config": None}, {}, {}, IMAGE["Created"], 2),
        ({"Config": {"Labels": None}}, {}, {"Labels": None}, IMAGE["Created"], 2),
        ({"Config": {"Labels": {"a": "1", "n": 1, "z": None}}}, {"a": "1"}, None, IMAGE["Created"], 2),
        ({"Config": "x", "Created": "", "RootFS": None}, {}, {}, None, 0),
        ({"Created": None, "RootFS": {"Layers": None}}, None, None, None, 0),
    ],
    ids=["config-null", "labels-null", "labels-not-strings", "config-not-an-object", "no-time-no-layers"],
)
def test_an_image_that_says_less_gives_empty_answers(tmp_path, changes, labels, config, created, layers):
    image = {**IMAGE, **changes}
    engine = _inspecting_docker(tmp_path, json.dumps([image]))
    assert engine.image_labels("img") == (IMAGE["Config"]["Labels"] if labels is None else labels)
    assert engine.image_config("img") == (image["Config"] if config is None else config)
    assert engine.image_created("img") == created
    assert len(engine.image_layers("img")) == layers


def test_an_image_the_engine_does_not_hold_is_an_error_naming_it(tmp_path):
    engine = _inspecting_docker(
        tmp_path, "[]\n", "Error response from daemon: No such image: reg.example/a/b:1\n", rc=1
    )
    for verb in (engine.image_attrs, engine.image_labels, engine.image_config, engine.image_created):
        with pytest.raises(NoSuchImage) as exc:
            verb("reg.example/a/b:1")
        assert isinstance(exc.value, UserError) and exc.value.ref == "reg.example/a/b:1"
        assert exc.value.render() == (
            "error: image reg.example/a/b:1 is not in the local engine\n"
            "  fix: pull it (docker pull reg.example/a/b:1) or build it (stackforge build STACK)"
        )
    assert engine.image_id("reg.example/a/b:1") is None  # the same words, read the same way


def test_a_reference_with_control_characters_is_named_escaped(tmp_path):
    engine = _inspecting_docker(tmp_path, "[]\n", "Error response from daemon: No such image: x\n", rc=1)
    with pytest.raises(NoSuchImage) as exc:
        engine.image_labels("img\nerror: forged")
    assert "\n" not in exc.value.message and "img\\nerror: forged" in exc.value.message


@pytest.mark.parametrize(
    ("answer", "stderr", "rc", "words"),
    [
        ("", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n", 1, "Cannot connect"),
        ("not json\n", "", 0, "answered no single image description"),
        (json.dumps([IMAGE, IMAGE]), "", 0, "answered no single image description"),
        (json.dumps(["sha256:abc"]), "", 0, "answered no single image description"),
        (json.dumps(IMAGE), "", 0, "answered no single image description"),
    ],
    ids=["no-daemon", "not-json", "two-images", "not-an-object", "not-a-list"],
)
def test_an_engine_that_cannot_answer_is_an_error_not_an_empty_image(tmp_path, answer, stderr, rc, words):
    engine = _inspecting_docker(tmp_path, answer, stderr, rc)
    with pytest.raises(UserError) as exc:
        engine.image_labels("img")
    assert not isinstance(exc.value, NoSuchImage)
    assert words in exc.value.message and "img" in exc.value.message
    assert "engine-setup.sh" in (exc.value.fix or "")


def test_an_export_asks_nothing_until_read_and_a_refusing_engine_is_a_build_failure(tmp_path):
    engine = Engine(env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    chunks = engine.export_image("sha256:" + "f" * 64)  # a generator: no engine asked yet
    with pytest.raises(BuildFailed) as exc:
        next(chunks)
    assert exc.value.message.startswith(f"exporting sha256:{'f' * 64} from the engine failed: ")
    assert exc.value.exit_code == 1 and "docker info" in (exc.value.fix or "")


def test_buildx_is_asked_its_version_once_per_engine(monkeypatch):
    """``check`` and every bake read the plugin's version: one ``docker buildx version`` for all of them."""
    asked: list[tuple[str, ...]] = []

    def cli(self, *args, timeout=60, check=False):
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, "github.com/docker/buildx v0.29.1 abc\n", "")

    monkeypatch.setattr(Engine, "cli", cli)
    engine = Engine()
    assert [engine.buildx_version() for _ in range(3)] == ["0.29.1"] * 3
    assert asked == [("buildx", "version")]
    assert Engine().buildx_version() == "0.29.1" and len(asked) == 2  # another engine object asks again
