"""The shipped CI files, read as a security reviewer reads them and run where they run shell: caches outside the
work tree, no credential written to disk but the signing key (private, only while a shard's step runs, removed
whatever ends it), every action pinned by commit, least-privilege tokens, secrets only in the steps that use them,
one night at a time with one date, a night planned into shards fanned out from the plan and merged once, shards that
sign and scan against the refreshed OSV database, and the history site built every night and kept. zizmor and
actionlint (`make lint-ci`) check the GitHub files too."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"
GITLAB = REPO / "docs" / "ci" / "gitlab-ci.yml"
GITLAB_SHARD = REPO / "docs" / "ci" / "gitlab-shard.yml"
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$")
PINNED = re.compile(r"(?P<action>[\w.-]+/[\w.-]+)@(?P<sha>[0-9a-f]{40})")
VERSION_COMMENT = re.compile(r"^\s+#\s+(v\d+\.\d+\.\d+)$")
PEM = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKEFAK\n-----END PRIVATE KEY-----"


def _scripts(doc: dict) -> str:
    text = []
    for job in doc.get("jobs", {}).values():
        text += [str(step.get("run", "")) for step in job.get("steps", [])]
    for job in (v for v in doc.values() if isinstance(v, dict) and "script" in v):
        text += [str(line) for key in ("before_script", "script", "after_script") for line in job.get(key, [])]
    return "\n".join(text)


def _gitlab() -> dict:
    """The GitLab nightly: its pipeline and the shard job its child pipeline extends (``.shard``)."""
    doc = yaml.safe_load(GITLAB.read_text())
    shard = yaml.safe_load(GITLAB_SHARD.read_text())
    return {**doc, ".shard": shard[".shard"], "variables": {**shard["variables"], **doc["variables"]}}


def _doc(path: Path) -> dict:
    return _gitlab() if path == GITLAB else yaml.safe_load(path.read_text())


#: the stackforge commands that hold the registry credential: the plan (records it), a shard, the merge (the aliases)
CREDENTIALED = ("stackforge nightly --plan", "make nightly", "stackforge nightly --merge")


def _env(doc: dict) -> dict:
    """The variables every command of the nightly sees (GitHub: the workflow's and the jobs'; GitLab: global)."""
    env = dict(doc.get("variables", {}))
    for job in doc.get("jobs", {}).values():
        env.update(job.get("env", {}))
    return env


@pytest.mark.parametrize("path", [WORKFLOW, GITLAB], ids=["github", "gitlab"])
def test_no_credential_is_written_to_disk(path):
    doc = _doc(path)
    scripts = _scripts(doc)
    assert not re.search(r"netrc|docker login|config\.json|> *~/", scripts), scripts
    for var in ("STACKFORGE_REGISTRY_PASSWORD", "STACKFORGE_INDEX_MTHREADS_PASSWORD"):
        assert var not in _env(doc), f"{var} reaches every command of the job"
    if path == WORKFLOW:
        using = [s for job in doc["jobs"].values() for s in job["steps"] if "STACKFORGE_REGISTRY_PASSWORD" in s.get("env", {})]  # fmt: skip
        assert [next(c for c in CREDENTIALED if c in s["run"]) for s in using] == list(CREDENTIALED)
        assert all(v.startswith("${{ secrets.") for s in using for v in s["env"].values())
        (shard,) = [s for s in using if "STACKFORGE_INDEX_MTHREADS_PASSWORD" in s["env"]]  # the index: the shard only
        assert "make nightly" in shard["run"]
    else:
        lines = [line for job in doc.values() if isinstance(job, dict) for part in ("script", "before_script", "after_script")
                 for line in job.get(part, []) if "STACKFORGE_REGISTRY_PASSWORD=" in line]  # fmt: skip
        assert sorted(next(c for c in CREDENTIALED if c in line) for line in lines) == sorted(CREDENTIALED)
        assert all('STACKFORGE_REGISTRY_PASSWORD="$REGISTRY_PASSWORD"' in line for line in lines)
        (shard,) = [line for line in lines if "STACKFORGE_INDEX_MTHREADS_PASSWORD=" in line]
        assert "make nightly" in shard


@pytest.mark.parametrize("path", [WORKFLOW, GITLAB], ids=["github", "gitlab"])
def test_caches_and_nights_live_outside_the_work_tree_and_the_history_is_built(path):
    doc = _doc(path)
    env = _env(doc)
    for var in ("STACKFORGE_CACHE", "NIGHTS", "OSV"):
        assert Path(env[var]).is_absolute(), var
    scripts = _scripts(doc)
    assert 'ARGS="--shard $SHARD --sign-key' in scripts
    assert '--nights "$NIGHTS"' in scripts.split("stackforge nightly --plan", 1)[1].split("\n\n")[0]  # the durations
    assert 'nightly --merge --registry "$REGISTRY" --date "$DATE" --out "$NIGHTS/$DATE"' in scripts
    assert 'stackforge history --nights "$NIGHTS"' in scripts


def test_the_github_checkout_keeps_the_virtual_environment():
    doc = yaml.safe_load(WORKFLOW.read_text())
    for name in ("plan", "shard", "merge"):
        checkout = next(s for s in doc["jobs"][name]["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
        assert checkout.get("with", {}).get("clean") is False, name


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads the key `on` as true
        data["on"] = data.pop(True)
    return data


def steps(workflow: dict) -> list[tuple[str, dict, dict]]:
    return [(name, job, step) for name, job in workflow["jobs"].items() for step in job.get("steps", [])]


def test_every_action_is_pinned_by_commit_with_its_release_beside_it():
    seen: dict[str, set[tuple[str, str]]] = {}
    for path in WORKFLOWS:
        for line in path.read_text().splitlines():
            m = USES.match(line)
            if not m:
                continue
            pin = PINNED.fullmatch(m.group(1))
            assert pin, f"{path.name}: {line.strip()}: not pinned by a full commit"
            version = VERSION_COMMENT.fullmatch(m.group(2))
            assert version, f"{path.name}: {line.strip()}: no `# vX.Y.Z` naming the commit's release"
            seen.setdefault(pin["action"], set()).add((pin["sha"], version.group(1)))
    assert {"actions/checkout", "actions/setup-python", "actions/upload-artifact"} <= set(seen)
    for action, pins in seen.items():
        assert len(pins) == 1, f"{action} pinned to several commits: {pins}"


def test_tokens_are_least_privilege():
    allowed = {("release.yml", "github-release"): {"contents": "write"}}
    for path in WORKFLOWS:
        wf = load(path)
        assert wf.get("permissions") == {}, f"{path.name}: the workflow's default token must hold nothing"
        for name, job in wf["jobs"].items():
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{path.name}: job {name} declares no permissions"
            for scope, level in perms.items():
                if (path.name, name) in allowed and allowed[(path.name, name)].get(scope) == level:
                    continue
                if scope == "id-token":
                    assert (path.name, name) in (("release.yml", "publish-index"), ("nightly.yml", "pages"))
                    assert level == "write"
                    continue
                if scope == "pages":  # deploying the history site, in the hosted job that does only that
                    assert (path.name, name, level) == ("nightly.yml", "pages", "write")
                    continue
                assert (scope, level) == ("contents", "read"), f"{path.name}: {name}: {scope}: {level}"
            for step in job.get("steps", []):
                if "actions/checkout@" in step.get("uses", ""):
                    assert step["with"]["persist-credentials"] is False, f"{path.name}: {name} keeps git credentials"


def test_secrets_reach_only_the_steps_that_use_them():
    for path in WORKFLOWS:
        wf = load(path)
        assert "secrets." not in yaml.safe_dump(wf.get("env", {})), f"{path.name}: secrets in the workflow's env"
        for name, job in wf["jobs"].items():
            assert "secrets." not in yaml.safe_dump(job.get("env", {})), (
                f"{path.name}: {name}: secrets in the job's env"
            )
        for name, _, step in steps(wf):
            outside = {k: v for k, v in step.items() if k != "env"}
            assert "secrets." not in yaml.safe_dump(outside), f"{path.name}: {name}: a secret outside a step's env"
            assert "${{" not in step.get("run", ""), f"{path.name}: {name}: an expression inside a shell script"
    nightly = load(REPO / ".github" / "workflows" / "nightly.yml")
    using = [(job, s) for job, _, s in steps(nightly) if "secrets." in yaml.safe_dump(s.get("env", {}))]
    assert [job for job, _ in using] == ["plan", "shard", "merge"]
    assert [next(c for c in CREDENTIALED if c in s["run"]) for _, s in using] == list(CREDENTIALED)


def test_the_nightly_runs_one_night_at_a_time_only_from_the_schedule():
    wf = load(REPO / ".github" / "workflows" / "nightly.yml")
    assert set(wf["on"]) == {"schedule", "workflow_dispatch"}  # never a pull request on the build host
    assert wf["concurrency"] == {"group": "stackforge-nightly", "cancel-in-progress": False}
    gitlab = load(GITLAB)
    assert gitlab["shards"]["resource_group"] == "stackforge-nightly"  # held until the child pipeline ends
    assert [name for name, job in gitlab.items() if isinstance(job, dict) and "resource_group" in job] == ["shards"]
    for path in WORKFLOWS:
        if path.name != "nightly.yml":
            runners = [str(job["runs-on"]) for job in load(path)["jobs"].values()]
            assert all("self-hosted" not in r for r in runners), f"{path.name} runs on the build host"


def test_both_nightlies_sign_scan_refresh_first_and_keep_the_history_site():
    gh = load(REPO / ".github" / "workflows" / "nightly.yml")
    runs = [s.get("run", "") for s in gh["jobs"]["shard"]["steps"]]
    refresh = next(i for i, r in enumerate(runs) if 'scripts/osv_refresh.py --out "$OSV"' in r)
    night = next(i for i, r in enumerate(runs) if "make nightly" in r)
    assert refresh < night
    assert "--sign-key $key_dir/signing-key.pem --osv $OSV" in runs[night]
    uploads = [s["with"]["path"] for s in gh["jobs"]["merge"]["steps"] if "upload-artifact@" in s.get("uses", "")]
    assert "${{ env.NIGHTS }}/site/" in uploads

    gitlab = _gitlab()
    script = gitlab[".shard"]["script"]
    refresh = next(i for i, r in enumerate(script) if 'scripts/osv_refresh.py --out "$OSV"' in r)
    night = next(i for i, r in enumerate(script) if "make nightly" in r)
    assert refresh < night
    assert "--sign-key $key_dir/signing-key.pem --osv $OSV" in script[night]
    merge = gitlab["merge"]
    assert "site/" in merge["artifacts"]["paths"] and merge["artifacts"]["when"] == "always"
    assert any('cp -r "$NIGHTS/site/." site/' in line for line in merge["after_script"])


def test_every_gitlab_command_is_one_string():
    """A plain YAML scalar holding ': ' turns into a mapping, which GitLab refuses."""
    for name, job in _gitlab().items():
        for part in ("before_script", "script", "after_script"):
            if isinstance(job, dict) and part in job:
                assert job[part] and all(isinstance(line, str) for line in job[part]), (name, part, job[part])


def test_the_release_builds_checks_and_publishes_only_where_configured():
    wf = load(REPO / ".github" / "workflows" / "release.yml")
    assert wf["on"] == {"push": {"tags": ["v*"]}}
    build = "\n".join(s.get("run", "") for s in wf["jobs"]["build"]["steps"])
    assert "python -m build" in build and "twine check --strict" in build and "--require-hashes" in build
    assert '"stackforge $version (commit $GITHUB_SHA)"' in build
    assert wf["jobs"]["publish-index"]["if"] == "vars.PACKAGE_INDEX_URL != ''"
    assert "gh release create" in wf["jobs"]["github-release"]["steps"][-1]["run"]
    for req in (REPO / ".github" / "requirements").glob("*.txt"):
        pins = [line for line in req.read_text().splitlines() if "==" in line]
        assert pins and all(line.rstrip().endswith("\\") for line in pins), f"{req.name}: a pin without its hashes"


# -- the shell the CI files run, run here with a `make` that records what it was given -------------------------------

STUB_MAKE = r"""#!/usr/bin/env bash
# records the nightly's arguments, its environment and the key file it was handed; $MAKE_EXIT or a long sleep
set -u
key=$(printf '%s\n' "$@" | sed -n 's/.*--sign-key \([^ ]*\).*/\1/p')
{
  printf 'args=%s\n' "$*"
  printf 'key=%s\n' "$key"
  printf 'key_mode=%s\n' "$(stat -c %a "$key")"
  printf 'dir_mode=%s\n' "$(stat -c %a "$(dirname "$key")")"
  printf 'key_sum=%s\n' "$(sha256sum < "$key" | cut -c1-64)"
  printf 'signing_env=%s\n' "${SIGNING_KEY:-}${STACKFORGE_SIGNING_KEY_B64:-}"
  printf 'registry_user=%s\n' "${STACKFORGE_REGISTRY_USER:-}"
  printf 'index_password=%s\n' "${STACKFORGE_INDEX_MTHREADS_PASSWORD:-}"
} > "$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT"
if [ -n "${MAKE_SLEEP:-}" ]; then sleep "$MAKE_SLEEP"; fi
exit "${MAKE_EXIT:-0}"
"""


def _runner_umask() -> None:
    os.umask(0o022)  # a runner's usual umask: the script itself must make the key private


def _report(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


@pytest.fixture
def stub(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(STUB_MAKE)
    (bin_dir / "make").chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "REPORT": str(tmp_path / "report"),
        "REGISTRY": "registry.example.com/team",
        "DATE": "20260929",
        "SHARD": "amd64-0123456789",
        "NIGHTS": str(tmp_path / "nights"),
        "OSV": str(tmp_path / "osv"),
    }


def _github_step(tmp_path: Path, stub: dict[str, str], **extra: str) -> tuple[list[str], dict[str, str]]:
    """The nightly step's script as the runner runs it (bash -eo pipefail), with the step's environment."""
    step = next(
        s
        for _, _, s in steps(load(REPO / ".github" / "workflows" / "nightly.yml"))
        if "make nightly" in s.get("run", "")
    )
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    (tmp_path / "runner-temp").mkdir()
    env = {
        **stub,
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "SIGNING_KEY": PEM,
        "STACKFORGE_REGISTRY_USER": "publisher",
        "STACKFORGE_REGISTRY_PASSWORD": "pw",
        "STACKFORGE_INDEX_MTHREADS_USERNAME": "u",
        "STACKFORGE_INDEX_MTHREADS_PASSWORD": "index-pw",
        **extra,
    }
    return ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], env


def _gitlab_block(tmp_path: Path, stub: dict[str, str], **extra: str) -> tuple[list[str], dict[str, str]]:
    """The nightly's signing block as GitLab's shell executor runs it, after the before_script made its directory."""
    job = _gitlab()[".shard"]
    block = next(s for s in job["script"] if "make nightly" in s)
    prepare = next(s for s in job["before_script"] if ".signing" in s)
    script = tmp_path / "job.sh"
    script.write_text(f"{prepare}\n{block}\n")
    env = {
        **stub,
        "CI_PROJECT_DIR": str(tmp_path / "project"),
        "STACKFORGE_SIGNING_KEY_B64": base64.b64encode(PEM.encode()).decode(),
        "REGISTRY_USER": "publisher",
        "REGISTRY_PASSWORD": "pw",
        "VENDOR_INDEX_USER": "u",
        "VENDOR_INDEX_PASSWORD": "index-pw",
        **extra,
    }
    return ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], env


RUNNERS = {"github": _github_step, "gitlab": _gitlab_block}


@pytest.mark.parametrize("ci", sorted(RUNNERS))
@pytest.mark.parametrize("make_exit", [0, 1])
def test_the_key_is_private_handed_to_the_nightly_alone_and_removed_after(tmp_path, stub, ci, make_exit):
    cmd, env = RUNNERS[ci](tmp_path, stub, MAKE_EXIT=str(make_exit))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, preexec_fn=_runner_umask)
    assert proc.returncode == make_exit, proc.stderr
    seen = _report(tmp_path / "report")
    assert seen["key_mode"] == "600" and seen["dir_mode"] == "700"
    assert seen["key_sum"] == hashlib.sha256((PEM + ("\n" if ci == "github" else "")).encode()).hexdigest()
    assert seen["signing_env"] == ""  # the secret itself is not in the nightly's environment
    assert seen["registry_user"] == "publisher" and seen["index_password"] == "index-pw"
    assert seen["args"] == (
        f"nightly REGISTRY=registry.example.com/team DATE=20260929 ARGS=--shard amd64-0123456789 "
        f"--sign-key {seen['key']} --osv {env['OSV']}"
    )
    assert not Path(seen["key"]).exists() and not Path(seen["key"]).parent.exists()
    assert PEM.splitlines()[1] not in proc.stdout + proc.stderr


@pytest.mark.parametrize("ci", sorted(RUNNERS))
def test_a_cancelled_nightly_removes_the_key(tmp_path, stub, ci):
    cmd, env = RUNNERS[ci](tmp_path, stub, MAKE_SLEEP="30")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_runner_umask)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "report").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        key = Path(_report(tmp_path / "report")["key"])
        assert key.exists()
        os.killpg(proc.pid, signal.SIGTERM)  # what a runner sends a cancelled step's processes
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    deadline = time.monotonic() + 10  # GitLab's block is a subshell: its traps may finish after the job's shell
    while key.parent.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not key.exists() and not key.parent.exists()


@pytest.mark.parametrize("ci", sorted(RUNNERS))
def test_no_key_no_nightly(tmp_path, stub, ci):
    unset = {"github": "SIGNING_KEY", "gitlab": "STACKFORGE_SIGNING_KEY_B64"}[ci]
    cmd, env = RUNNERS[ci](tmp_path, stub, **{unset: ""})
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and not (tmp_path / "report").exists()
    assert "publishes signed images only" in proc.stdout + proc.stderr


def test_gitlab_computes_the_date_once_for_the_plan_the_shards_and_the_merge(tmp_path):
    """The plan's shell asks a `date` that has moved on a day after the night began; it uses the first answer, and
    nothing after the plan asks `date` again: the shards get the plan's DATE (written into their child pipeline),
    the merge the plan's dotenv report."""
    gitlab = _gitlab()
    plan = gitlab["plan"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").write_text(
        '#!/usr/bin/env bash\nn=$(cat "$COUNTER" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNTER"\n'
        "echo 2026092$((8 + n))\n"
    )
    (bin_dir / "date").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COUNTER": str(tmp_path / "n")}
    first = next(s for s in plan["before_script"] if "night.env" in s)
    assert plan["script"][0] == "export \"$(grep '^DATE=' night.env)\""
    subprocess.run(["bash", "-eo", "pipefail", "-c", first], cwd=tmp_path, env=env, check=True)
    subprocess.run(["date"], env=env, capture_output=True, check=True)  # midnight passes
    out = subprocess.run(["bash", "-eo", "pipefail", "-c", f'{plan["script"][0]}; echo "$DATE"'], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.strip() == "20260928"
    assert stat.S_ISREG((tmp_path / "night.env").stat().st_mode)
    assert plan["artifacts"]["reports"]["dotenv"] == "night.env"  # the merge (and pages) read the same date
    assert any('--date "$DATE"' in line and "--gitlab-pipeline shards.json" in line for line in plan["script"])
    later = [line for name in ("merge", ".shard", "pages") for part in ("before_script", "script", "after_script")
             for line in gitlab[name].get(part, [])]  # fmt: skip
    assert later and not any(re.search(r"\$\(date\b|(^|[;&|(]\s*)date\s", line) for line in later), later
    assert {"job": "plan", "artifacts": True} in gitlab["merge"]["needs"]


def test_both_nightlies_publish_the_history_site_after_every_night():
    gh = load(REPO / ".github" / "workflows" / "nightly.yml")["jobs"]["pages"]
    assert gh["needs"] == "merge" and "cancelled()" in gh["if"] and "self-hosted" not in str(gh["runs-on"])
    assert gh["environment"]["name"] == "github-pages"
    uses = [step["uses"].split("@")[0] for step in gh["steps"]]
    assert uses == ["actions/download-artifact", "actions/upload-pages-artifact", "actions/deploy-pages"]
    assert gh["steps"][0]["with"]["name"] == "history-site"
    assert gh["steps"][1]["with"]["path"] == gh["steps"][0]["with"]["path"]
    gl = load(GITLAB)["pages"]
    assert gl["needs"] == [{"job": "merge", "artifacts": True}] and gl["artifacts"]["paths"] == ["public"]
    assert gl["script"] == ["rm -rf public && cp -r site public"]
    assert all(rule.get("when") == "always" for rule in gl["rules"])


# -- the fan-out: the shards come from the plan, the merge follows them ---------------------------------------------


def _plan():
    from stackforge.flows import night_plan as np

    units = [np.Unit(stack="a", target=t, platform="linux/amd64") for t in ("x", "y")]
    units.append(np.Unit(stack="b", target="x", platform="linux/arm64"))
    options = np.PlanOptions(date="20260929", shards=2, runner_labels=("self-hosted", "musa-build"))
    return np.make_plan(units, [], options)


def test_the_github_shards_fan_out_from_the_plan_and_one_merge_follows(tmp_path):
    jobs = load(WORKFLOW)["jobs"]
    plan, shard, merge = jobs["plan"], jobs["shard"], jobs["merge"]
    assert plan["outputs"] == {"date": "${{ steps.night.outputs.date }}", "matrix": "${{ steps.plan.outputs.matrix }}"}
    assert shard["strategy"] == {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.matrix) }}"}
    assert shard["runs-on"] == "${{ matrix.runs_on }}" and shard["env"]["SHARD"] == "${{ matrix.shard }}"
    assert shard["env"]["DATE"] == merge["env"]["DATE"] == "${{ needs.plan.outputs.date }}"
    assert merge["needs"] == ["plan", "shard"] and "!cancelled()" in merge["if"]
    assert "self-hosted" in plan["runs-on"] and "stackforge-nights" in plan["runs-on"] == merge["runs-on"]
    # the plan step as the runner runs it, with a stackforge that prints a real plan
    expected = _plan().to_json()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    stub = tmp_path / ".venv" / "bin" / "stackforge"
    stub.write_text(
        f"#!/usr/bin/env bash\nprintf '%s\\n' \"$*\" > \"$ARGS_FILE\"\ncat <<'PLAN'\n{json.dumps(expected, indent=2)}\nPLAN\n"
    )
    stub.chmod(0o755)
    (tmp_path / "temp").mkdir()
    step = next(s for s in plan["steps"] if s.get("id") == "plan")
    (tmp_path / "step.sh").write_text(step["run"])
    env = {"PATH": os.environ["PATH"], "RUNNER_TEMP": str(tmp_path / "temp"), "GITHUB_OUTPUT": str(tmp_path / "out"),
           "ARGS_FILE": str(tmp_path / "args"), "DATE": "20260929", "NIGHTS": "/nights", "REGISTRY": "r.example/t"}  # fmt: skip
    subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "step.sh"], cwd=tmp_path, env=env, check=True)
    (line,) = (tmp_path / "out").read_text().splitlines()
    assert line.startswith("matrix=") and json.loads(line.removeprefix("matrix=")) == expected["matrix"]
    assert (tmp_path / "args").read_text().split() == [
        "nightly", "--plan", "--json", "--registry", "r.example/t", "--date", "20260929", "--nights", "/nights",
        "--runner-label", "self-hosted", "--runner-label", "musa-build",
    ]  # fmt: skip
    assert {tuple(i["runs_on"]) for i in expected["matrix"]["include"]} == {
        ("self-hosted", "musa-build", "linux", "x64"),
        ("self-hosted", "musa-build", "linux", "arm64"),  # an aarch64 stack's shard goes to a native arm64 runner
    }


def test_the_gitlab_child_pipeline_comes_from_the_plan_and_extends_the_shard_job():
    from stackforge.flows.night_plan import gitlab_pipeline

    plan = _plan()
    child = gitlab_pipeline(plan)
    (include,) = child["include"]
    assert (REPO / include["local"]).resolve() == GITLAB_SHARD and child["variables"] == {"DATE": "20260929"}
    jobs = {name: job for name, job in child.items() if name.startswith("shard ")}
    assert [job["variables"]["SHARD"] for job in jobs.values()] == [s.id for s in plan.shards]
    assert [job["tags"] for job in jobs.values()] == [s.runs_on for s in plan.shards]
    assert all(job["extends"] == ".shard" for job in jobs.values())
    gitlab = _gitlab()
    assert gitlab[".shard"]["environment"] == {"name": "nightly"} and "tags" not in gitlab[".shard"]
    assert gitlab["shards"]["trigger"] == {
        "include": [{"artifact": "shards.json", "job": "plan"}],
        "strategy": "depend",
    }
    assert {"job": "shards"} in gitlab["merge"]["needs"]
    assert all(rule.get("when") == "always" for rule in gitlab["merge"]["rules"])  # whatever the shards' verdict
