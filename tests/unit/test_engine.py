"""Pure parts of stackforge.clients.engine: argv assembly and version parsing (no engine needed)."""

from __future__ import annotations

import pytest

from stackforge.clients.engine import (
    BuildCommand,
    Engine,
    check_build_args,
    effective_buildkit,
    parse_buildx_endpoint,
    parse_buildx_inspect,
    parse_buildx_version,
    parse_version,
)
from stackforge.errors import UserError


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
