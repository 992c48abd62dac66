"""Hostile credentials: a secret in an index or upstream URL never comes back out of any command.

Every form (userinfo plain, percent-encoded, with a space, with an unencoded ``@``, with ``:`` in the
password, query tokens under several names and cases, a fragment token, scheme-less, a git token, an
IPv6 host, 120 KB of text around it) goes through ``show``, ``show --json``, ``render --no-sources --out
DIR``, ``lint`` and an error path (the same URL with a bad scheme or a bad port). The secret must appear
in no stdout, stderr or written file; where the URL is shown, it keeps its host and path.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stackforge.cli import main as cli
from stackforge.clients.credentials import env_credentials, for_index, netrc_entries, resolve
from stackforge.stack.load import load
from stackforge.urls import Credential, redact, redact_text, split

REPO = Path(__file__).resolve().parents[2]
S = "Cnry7781xQ"  # the secret; every case hides it (or an encoding of it) somewhere in a URL
IDX = "indexes.mthreads.url"
GIT = "upstreams.vllm.git"
PAD = "a" * 60_000  # under the 64 KiB limit on one --set value (larger ones are refused before any echo)

# id, --set key, value, what must never be printed, what must be shown (host and path), loads?
CASES = [
    ("userinfo-plain", IDX, f"https://user:{S}@vendor.example/simple", [S], "vendor.example/simple", True),
    ("userinfo-percent", IDX, f"https://us%40er:{S}%21x@vendor.example/simple", [S], "vendor.example/simple", True),
    (
        "userinfo-space",
        IDX,
        f"https://user:p@ss word{S}@vendor.example/simple",
        [S, "ss word"],
        "vendor.example/simple",
        True,
    ),
    (
        "userinfo-unencoded-at",
        IDX,
        f"https://user:{S}@x@vendor.example/simple",
        [S, "@x@"],
        "vendor.example/simple",
        True,
    ),
    (
        "userinfo-colon",
        IDX,
        f"https://user:{S}:t4ilpart@vendor.example/simple",
        [S, "t4ilpart"],
        "vendor.example/simple",
        True,
    ),
    ("userinfo-token-only", IDX, f"https://{S}@vendor.example/simple", [S], "vendor.example/simple", True),
    ("query-token", IDX, f"https://vendor.example/simple?token={S}", [S], "vendor.example/simple", True),
    # A query that is not a credential stays in the URL, and an index URL has no query: refused, secret unsaid.
    (
        "query-access-token",
        IDX,
        f"https://vendor.example/simple?x=1&access_token={S}",
        [S],
        "vendor.example/simple",
        False,
    ),
    (
        "query-amz-signature",
        IDX,
        f"https://vendor.example/simple?X-Amz-Signature={S}&X-Amz-Credential=k{S}",
        [S],
        "vendor.example/simple",
        True,
    ),
    ("query-sig", IDX, f"https://vendor.example/simple?sig={S}", [S], "vendor.example/simple", True),
    ("query-password", IDX, f"https://vendor.example/simple?password={S}", [S], "vendor.example/simple", True),
    ("query-uppercase-key", IDX, f"https://vendor.example/simple?API_KEY={S}", [S], "vendor.example/simple", True),
    (
        "query-private-token",
        IDX,
        f"https://vendor.example/simple?private_token={S}",
        [S],
        "vendor.example/simple",
        True,
    ),
    ("fragment-token", IDX, f"https://vendor.example/simple#access_token={S}", [S], "vendor.example/simple", True),
    ("ipv6-host", IDX, f"http://user:{S}@[::1]:8080/simple", [S], "[::1]:8080/simple", True),
    (
        "userinfo-and-query",
        IDX,
        f"https://user:{S}@vendor.example/simple?apikey=2{S}",
        [S],
        "vendor.example/simple",
        True,
    ),
    ("scheme-less", IDX, f"user:{S}@vendor.example/simple", [S], "vendor.example/simple", False),
    (
        "git-https-token",
        GIT,
        f"https://{S}@github.com/vllm-project/vllm.git",
        [S],
        "github.com/vllm-project/vllm.git",
        True,
    ),
    (
        "git-https-user-password",
        GIT,
        f"https://ci:{S}@git.example/org/vllm.git?token=t{S}",
        [S],
        "git.example/org/vllm.git",
        True,
    ),
    (
        "60kb-text",
        IDX,
        f"https://user:{S}@vendor.example/simple?q={PAD}&token={S}",
        [S],
        "vendor.example/simple",
        False,
    ),
]

COMMANDS = [
    ("show", ["show", "post2"]),
    ("show-json", ["show", "post2", "--json"]),
    ("render", ["render", "post2", "--no-sources", "--json", "--out", "{out}"]),
    ("lint", ["lint", "post2"]),
]


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = cli.main(["--root", str(REPO), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _leaks(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


def _written(out: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(out.rglob("*")) if p.is_file())


@pytest.mark.parametrize("command,argv", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("key,value,secrets,shown,loads", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_no_command_prints_the_secret(capsys, tmp_path, command, argv, key, value, secrets, shown, loads):
    out_dir = tmp_path / "out"
    argv = [a.replace("{out}", str(out_dir)) for a in argv]
    started = time.monotonic()
    code, out, err = _run(capsys, [*argv, "--set", f"{key}={value}"])
    assert time.monotonic() - started < 20
    assert _leaks(out + err, secrets) == []
    if out_dir.exists():
        assert _leaks(_written(out_dir), secrets) == []
    assert "Traceback" not in err
    if not loads:
        assert code == 2
        assert err.startswith(f"error: --set {key}=") and shown in err
        assert "http(s)://" in err  # the message says what a valid URL looks like
        return
    assert code in (0, 1), err  # lint findings (exit 1) are the stack's own, not the URL's
    if command.startswith("show"):
        assert shown in out, out[:2000]
    if command == "render":
        dockerfile = (out_dir / "Dockerfile").read_text()
        if key == IDX:
            assert shown in dockerfile
        assert "***" not in dockerfile  # the Dockerfile gets the clean URL, never a redacted one


ERROR_CASES = [(c[0], c[1], c[2], c[3], c[4]) for c in CASES if c[5] and c[1] == IDX]


@pytest.mark.parametrize("variant", ["bad-scheme", "bad-port"])
@pytest.mark.parametrize("key,value,secrets,shown", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_an_invalid_url_error_does_not_repeat_the_secret(capsys, key, value, secrets, shown, variant):
    if variant == "bad-scheme":
        bad = "ftp" + value[value.index("://") :]
    else:
        host_end = value.index(shown) + len(shown) - len("/simple")
        bad = value[:host_end].replace(":8080", "") + ":99999" + value[host_end:]
    code, out, err = _run(capsys, ["show", "post2", "--set", f"{key}={bad}"])
    assert code == 2, err
    assert _leaks(out + err, secrets) == []
    assert err.startswith(f"error: --set {key}=")
    assert "Traceback" not in err
    assert "fix: write an http(s):// URL with a host" in err
    assert shown.split("/")[0].split(":")[0].strip("[") in err  # the host is still named


# --------------------------------------------------------------------------- the parser itself

SPLIT_CASES = [
    ("plain", "https://u:pw@h/simple", "https://h/simple", ("u", "pw"), ()),
    ("percent", "https://al%40ice:p%3Aw@h/simple", "https://h/simple", ("al@ice", "p:w"), ()),
    ("space", "https://u:p@ss word@h/simple", "https://h/simple", ("u", "p@ss word"), ()),
    ("colon", "https://u:a:b@h:81/simple", "https://h:81/simple", ("u", "a:b"), ()),
    ("token-user", "https://tok@github.com/x", "https://github.com/x", ("tok", ""), ()),
    ("query", "https://h/s?a=1&Token=t&b=2", "https://h/s?a=1&b=2", None, (("Token", "t"),)),
    ("fragment", "https://h/s#access_token=t", "https://h/s", None, None),
    ("ipv6", "http://u:p@[::1]:8/s", "http://[::1]:8/s", ("u", "p"), ()),
    ("scheme-less", "u:p@h/simple", "h/simple", ("u", "p"), ()),
    ("scp-git", "git@github.com:org/repo.git", "git@github.com:org/repo.git", None, None),
    ("clean", "https://h/simple", "https://h/simple", None, None),
]


@pytest.mark.parametrize("url,clean,auth,query", [c[1:] for c in SPLIT_CASES], ids=[c[0] for c in SPLIT_CASES])
def test_split(url, clean, auth, query):
    got_clean, cred = split(url)
    assert got_clean == clean
    if query is None:
        assert cred is None
        return
    assert cred.auth == auth and cred.query == query
    assert repr(cred) == "Credential(source='url')"  # no secret in a repr, a log line or a traceback


REDACT_CASES = [
    ("userinfo", "x https://u:pw@h/s y", "x https://***@h/s y"),
    ("space-at", "--set a=https://u:p@ss word@h/s", "--set a=https://***@h/s"),
    ("query", "GET https://h/s?x=1&sig=abc&signature=d ok", "GET https://h/s?x=1&sig=***&signature=*** ok"),
    ("quoted", "'https://h/s?PASSWD=abc' is bad", "'https://h/s?PASSWD=***' is bad"),
    ("scheme-less", "at u:pw@host/s", "at ***@host/s"),
    ("scp-git", "git@github.com:org/repo.git", "git@github.com:org/repo.git"),
    ("two-urls", "a://u:p@h/x b+c://t@h2", "a://***@h/x b+c://***@h2"),
    ("bad-port", "https://u:p@h:99999999/x", "https://***@h:99999999/x"),
    ("no-credential", "https://h/s?key_id=1 and 10:30", "https://h/s?key_id=1 and 10:30"),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in REDACT_CASES], ids=[c[0] for c in REDACT_CASES])
def test_redact_text(text, expected):
    assert redact_text(text) == expected
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "a" * 120_000,
        "https://" + "@" * 120_000,
        "a:" * 60_000,
        "x://" * 30_000,
        "u:" + "@" * 120_000,
        "?token=" * 17_000,
        " a:b@" * 24_000,
        "https://u:p@h/?" + "&key=v" * 20_000,
    ],
    ids=["letters", "ats", "colons", "schemes", "user-ats", "tokens", "bare-userinfo", "many-keys"],
)
def test_redaction_is_linear(text):
    started = time.monotonic()
    redact_text(text)
    split(text)
    assert time.monotonic() - started < 0.5


# --------------------------------------------------------------------------- the one resolver


def test_resolver_order_url_then_env_then_netrc(tmp_path, monkeypatch):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine vendor.example login n password from-netrc\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for var in ("USERNAME", "PASSWORD"):
        monkeypatch.delenv(f"STACKFORGE_INDEX_MTHREADS_{var}", raising=False)
    plain = load("post2", REPO, [f"{IDX}=https://vendor.example/simple"])
    assert for_index(plain, "mthreads").auth == ("n", "from-netrc")
    assert for_index(plain, "mthreads").source == "netrc"
    monkeypatch.setenv("STACKFORGE_INDEX_MTHREADS_PASSWORD", "from-env")
    assert for_index(plain, "mthreads").auth == ("", "from-env")
    assert env_credentials("mthreads") == ("", "from-env")
    in_url = load("post2", REPO, [f"{IDX}=https://u:from-url@vendor.example/simple"])
    assert in_url.model.indexes["mthreads"].url == "https://vendor.example/simple"
    assert for_index(in_url, "mthreads").auth == ("u", "from-url")
    # what the loader split off travels with the stack, and only with it: no module keeps it between loads
    assert in_url.credentials.for_url("https://vendor.example/simple").auth == ("u", "from-url")
    assert resolve("https://vendor.example/simple").auth == ("n", "from-netrc")


def test_netrc_entries_quote_what_netrc_cannot_read_bare(tmp_path):
    from netrc import netrc

    text = netrc_entries(
        [
            ("https://h/simple", Credential("u s", 'p "w\\ x')),
            ("https://g/simple", Credential("", "tok")),
            ("https://k/simple", None),
        ]
    )
    path = tmp_path / "netrc"
    path.write_text(text)
    parsed = netrc(str(path))
    assert parsed.authenticators("h") == ("u s", "", 'p "w\\ x')
    assert parsed.authenticators("g")[2] == "tok"
    assert parsed.authenticators("k") is None
