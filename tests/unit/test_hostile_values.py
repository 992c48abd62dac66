"""Hostile values: every stack value that reaches a Dockerfile line, a shell line or a file path is
checked against its grammar when the stack loads. Each case exits 2, names the key, says the fix,
and `render --no-sources --out DIR` writes nothing at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stackforge import grammar
from stackforge.builder.plan.render import dockerword, execform, shellword

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0" * 40


@dataclass
class Case:
    id: str
    sets: list[str]
    key: str  # the message names this key
    problem: str = ""  # and says this


CASES = [
    Case(
        "url-space-merges-index",
        ["indexes.pypi.url=https://pypi.org/simple --extra-index-url http://other/simple"],
        "indexes.pypi.url",
        "whitespace",
    ),
    Case("url-semicolon", ["indexes.pypi.url=https://pypi.org/simple;touch${IFS}pwned"], "indexes.pypi.url", "';'"),
    Case(
        "url-newline",
        ['indexes.pypi.url="https://pypi.org/simple\\nRUN touch /pwned"'],
        "indexes.pypi.url",
        "a newline",
    ),
    Case(
        "url-quote-subshell",
        ["indexes.pypi.url=https://pypi.org/simple'$(touch${IFS}pwned)'"],
        "indexes.pypi.url",
        '"\'"',
    ),
    Case("url-backslash", ["indexes.pypi.url=https://pypi.org/simple\\"], "indexes.pypi.url", "'\\\\'"),
    Case("url-no-host", ["indexes.pypi.url=https:///simple"], "indexes.pypi.url", "no valid host"),
    Case("url-ftp-scheme", ["indexes.pypi.url=ftp://pypi.org/simple"], "indexes.pypi.url", "http(s)://"),
    # A --set key with a newline or '/' is refused as a key path before any value is looked at.
    Case(
        "target-env-key-newline",
        ["targets.escape.env.A\nRUN echo pwned\nENV B=2"],
        "the key is not a key path",
        "fix: write dotted keys",
    ),
    Case(
        "kernel-env-key-newline",
        ["kernels.markupsafe.env.A\nRUN echo pwned\nENV B=2"],
        "the key is not a key path",
        "fix: write dotted keys",
    ),
    Case(
        "target-env-key-newline-mapping",
        ['targets.escape.env={"A\\nRUN echo pwned\\nENV B": "2"}'],
        "targets.escape.env",
        "contains a newline",
    ),
    Case("target-env-key-dash", ["targets.escape.env.A-B=1"], "targets.escape.env.A-B", "environment variable name"),
    Case(
        "target-env-value-newline", ['targets.escape.env.A="x\\nRUN touch /pwned"'], "targets.escape.env", "a newline"
    ),
    Case(
        "kernel-env-value-renders-newline",
        ['kernels.markupsafe.env.A={{ "x\\nRUN touch /pwned" }}'],
        "kernels.markupsafe.env.A",
        "a newline",
    ),
    Case(
        "index-name-slash",
        ["indexes.a/b={url: https://x.org/simple, role: public}"],
        "'indexes.a/b' is not a key path",
        "fix: write dotted keys",
    ),
    Case(
        "index-name-slash-mapping",
        ['indexes={"a/b": {url: "https://x.org/simple", role: public}}'],
        "indexes.a/b",
        "not a valid name",
    ),
    Case(
        "upstream-name-dotdot",
        [f'upstreams={{"..": {{git: https://x.org/r.git, tag: v1, commit: "{COMMIT}"}}}}'],
        "upstreams",
        "not a valid name",
    ),
    Case("kernel-name-newline", ['kernels={"k\\nRUN x": {upstream: markupsafe, run: "true"}}'], "kernels", "a newline"),
    Case("target-name-space", ['targets={"a b": {cmd: [x]}}'], "targets", "not a valid name"),
    Case(
        "package-name-semicolon",
        ['packages={"idna;touch": {version: "3.10", index: pypi}}'],
        "packages",
        "project name",
    ),
    Case("base-image-space", ["base.image=stackforge/base:bookworm AS x"], "base.image", "a space"),
    Case("base-image-newline", ['base.image="stackforge/base:bookworm\\nRUN touch /pwned"'], "base.image", "a newline"),
    Case("base-image-uppercase", ["base.image=Stackforge/Base"], "base.image", "image reference"),
    Case("base-python-rm", ["base.python=python3; rm -rf /"], "base.python", "interpreter"),
    Case("base-digest", ["base.digest=sha256:abc; touch x"], "base.digest", "sha256:<64"),
    Case("label-key-newline", ['labels={"a\\nRUN x": v}'], "labels", "a newline"),
    Case("label-key-uppercase", ["labels.Org=v"], "labels.Org", "reverse-DNS"),
    Case("label-value-renders-newline", ['labels.x={{ "v\\nRUN touch /pwned" }}'], "labels.x", "a newline"),
    Case("tag-local-port-too-large", ["tags.local=localhost:99999/team/x:t"], "tags.local", "port 99999, out of range"),
    Case("tag-local-port-zero", ["tags.local=localhost:0/team/x:t"], "tags.local", "port 0, out of range"),
    Case("base-image-port-too-large", ["base.image=localhost:65536/base:x"], "base.image", "port 65536, out of range"),
    Case("tag-renders-newline", ['tags.local=x:a{{ "\\n" }}b'], "tags.local", "a newline"),
    Case("gate-import-semicolon", ['gate.imports=[{module: "os;import os"}]'], "gate.imports.0.module", "module name"),
    Case("package-import-semicolon", ["packages.idna.import=idna; import os"], "packages.idna.import", "module name"),
    Case(
        "probe-name-path",
        ['gate.probes=[{name: "../x", code: "print(1)", expect: "1"}]'],
        "gate.probes.0.name",
        "not a valid name",
    ),
    Case(
        "probe-expect-newline",
        ['gate.probes=[{name: p, code: "print(1)", expect: "1\\nRUN x"}]'],
        "gate.probes.0.expect",
        "a newline",
    ),
    Case("gate-prepare-cr", ['gate.prepare=["true\\rRUN touch /pwned"]'], "gate.prepare", "carriage return"),
    Case(
        "upstream-tag-option",
        ["upstreams.markupsafe.tag=--upload-pack=touch"],
        "upstreams.markupsafe.tag",
        "git tag name",
    ),
    Case(
        "upstream-git-option",
        ["upstreams.markupsafe.git=--upload-pack=touch${IFS}pwned"],
        "upstreams.markupsafe.git",
        "starts with '-'",
    ),
    Case(
        "upstream-git-ext-helper", ["upstreams.markupsafe.git=ext::sh"], "upstreams.markupsafe.git", "transport helpers"
    ),
    Case("patches-dotdot", ["upstreams.markupsafe.patches=../../etc"], "upstreams.markupsafe.patches", "relative path"),
    Case("patches-absolute", ["upstreams.markupsafe.patches=/etc"], "upstreams.markupsafe.patches", "relative path"),
    Case(
        "sdist-name-path",
        ["upstreams.markupsafe.sdist.name=markupsafe/../../x"],
        "upstreams.markupsafe.sdist.name",
        "project name",
    ),
    Case("platform-os-space", ["platform.os=debian12 x"], "platform.os", "not a valid name"),
    Case("platform-python", ["platform.python=3.11; x"], "platform.python", "Python version"),
    Case("description-newline", ['description="one\\nLABEL x=y"'], "description", "a newline"),
    Case("deps-from-tab", ['indexes.pypi.deps_from="a\\tb"'], "indexes.pypi.deps_from", "a tab"),
    Case("line-separator", ['targets.escape.env.A="x\\u2028RUN touch /pwned"'], "targets.escape.env", "U+2028"),
]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stackforge", "--root", str(REPO), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_value_is_refused_and_nothing_is_written(tmp_path, case):
    out = tmp_path / "out"
    sets = [arg for value in case.sets for arg in ("--set", value)]
    proc = run(tmp_path, "render", "example", "--no-sources", "--out", str(out), *sets)
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    assert f": {case.key}" in proc.stderr, proc.stderr
    assert case.problem in proc.stderr, proc.stderr
    assert "\n  fix: " in proc.stderr, proc.stderr
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.rglob("*"))
    assert not (tmp_path / "pwned").exists() and proc.stdout == ""


VALID = [
    ("url-with-port", grammar.check_url, "http://127.0.0.1:8080/simple"),
    ("url-file", grammar.check_url, "file:///srv/index/simple"),
    ("url-ipv6", grammar.check_url, "http://[::1]:8080/simple"),
    ("image-registry-port-digest", grammar.check_image_ref, "localhost:5000/team/base:bookworm@sha256:" + "a" * 64),
    ("image-plain", grammar.check_image_ref, "debian"),
    ("image-registry-port-max", grammar.check_image_ref, "localhost:65535/team/base:bookworm"),
    ("image-ipv6-port", grammar.check_image_ref, "[::1]:5000/team/base:bookworm"),
    ("git-scp", grammar.check_git_source, "git@github.com:org/repo.git"),
    ("git-local-path", grammar.check_git_source, "/tmp/upstreams/vllm"),
    ("tag-slash", grammar.check_git_ref, "release/v1.2.0+musa"),
    ("python-abs", grammar.check_python, "/usr/bin/python3.11"),
]


@pytest.mark.parametrize("check,value", [(c, v) for _, c, v in VALID], ids=[i for i, _, _ in VALID])
def test_ordinary_values_pass_their_grammar(check, value):
    assert (check(value, value) if check in (grammar.check_url, grammar.check_git_source) else check(value)) is None


WORDS = [
    ("utf8-and-html", "Example — a & b <c> 'x'", "\"Example — a & b <c> 'x'\""),
    ("dollar", "$HOME ${X}", '"\\$HOME \\${X}"'),
    ("quote-backslash", 'a "q" \\', '"a \\"q\\" \\\\"'),
]


@pytest.mark.parametrize("value,word", [(v, w) for _, v, w in WORDS], ids=[i for i, _, _ in WORDS])
def test_dockerword_quotes_for_the_dockerfile_parser(value, word):
    assert dockerword(value) == word


@pytest.mark.parametrize(
    "value", ["a\nRUN x", "a\rb", "a\u2028b", "a\x85b", "a\x00b"], ids=["newline", "cr", "u2028", "nel", "nul"]
)
def test_line_breaks_never_reach_a_dockerfile_line(value):
    with pytest.raises(ValueError):
        dockerword(value)
    with pytest.raises(ValueError):
        shellword(value)
    assert "\n" not in execform([value]) and len(execform([value]).splitlines()) == 1


@pytest.mark.parametrize(
    "value",
    [
        "description=a\nerror: forged line",
        "base.image=a\rerror: forged line",
        "description=a\u2028error: forged line",
        "tags.local=x\x85error: forged",
    ],
)
def test_an_error_about_a_value_cannot_forge_an_output_line(tmp_path, value):
    """The `--set` value is echoed in the error's location with its line breaks escaped: the error stays
    one line plus its fix, and no line of stderr starts with the forged text."""
    proc = run(tmp_path, "show", "example", "--set", value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: --set ") and lines[1].startswith("  fix: ")
    assert "forged" in lines[0] and not any(line.startswith("error: forged") for line in lines)
