"""The one way stackforge runs git: an environment that makes its work reproducible.

User and system git configuration are ignored (a global ``format.signature``
or ``diff.noprefix`` would change exported bytes), the locale is C so messages
can be parsed, prompts are off, and commits made by stackforge carry a fixed
committer. A credential reaches git only through ``env`` (``GIT_CONFIG_*``),
and error messages have URL credentials and the credential's secrets scrubbed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar, overload

from stackforge.clients import proc as bounded
from stackforge.errors import UserError
from stackforge.urls import Credential, scrub

COMMITTER_NAME = "stackforge"
COMMITTER_EMAIL = "stackforge@localhost"

# Notes ref that records, per applied commit, the layer and the patch it came from.
NOTES_REF = "refs/notes/stackforge"
# Ref that records the upstream commit a series was applied onto.
BASE_REF = "refs/stackforge/base"


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        {
            "LC_ALL": "C",
            "LANG": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_COMMITTER_NAME": COMMITTER_NAME,
            "GIT_COMMITTER_EMAIL": COMMITTER_EMAIL,
            "GIT_AUTHOR_NAME": COMMITTER_NAME,
            "GIT_AUTHOR_EMAIL": COMMITTER_EMAIL,
            "GIT_PAGER": "cat",
            "PAGER": "cat",
            "GIT_EDITOR": "true",
        }
    )
    if extra:
        env.update(extra)
    return env


Out = TypeVar("Out", str, bytes)


@dataclass
class GitResult(Generic[Out]):
    """A finished git command: ``stdout`` is bytes for a ``binary`` run, text otherwise."""

    args: list[str]
    returncode: int
    stdout: Out
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        out = self.stdout.decode("utf-8", "replace") if isinstance(self.stdout, bytes) else self.stdout
        return out + self.stderr


#: how long one git command may run when its caller gives no deadline (a clone of a large upstream included)
GIT_SECONDS = 3600.0
#: what one git command may print (a patch series' log of a long range is tens of MiB)
GIT_OUTPUT_LIMIT = 1 << 30


@overload
def git(
    repo: Path | str | None,
    *args: str,
    check: bool = ...,
    input: str | bytes | None = ...,
    env: dict[str, str] | None = ...,
    binary: Literal[False] = ...,
    credential: Credential | None = ...,
    timeout: float | None = ...,
) -> GitResult[str]: ...


@overload
def git(
    repo: Path | str | None,
    *args: str,
    check: bool = ...,
    input: str | bytes | None = ...,
    env: dict[str, str] | None = ...,
    binary: Literal[True],
    credential: Credential | None = ...,
    timeout: float | None = ...,
) -> GitResult[bytes]: ...


def git(
    repo: Path | str | None,
    *args: str,
    check: bool = True,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    binary: bool = False,
    credential: Credential | None = None,
    timeout: float | None = None,
) -> GitResult[str] | GitResult[bytes]:
    """Run ``git -C repo args`` (plain ``git args`` when ``repo`` is None) with ``env`` added to the
    reproducible environment; raise UserError on failure when ``check``, its text scrubbed of URL
    credentials and of ``credential``'s secrets."""
    cmd = ["git"]
    if repo is not None:
        cmd += ["-C", str(repo)]
    cmd += list(args)
    if isinstance(input, str):
        input = input.encode()
    limit = timeout if timeout is not None else GIT_SECONDS
    try:
        done = bounded.run(cmd, input=input, timeout=limit, limit=GIT_OUTPUT_LIMIT, env=git_env(env))
    except FileNotFoundError as exc:  # pragma: no cover - git is a hard requirement
        raise UserError("git is not installed", fix="install git (apt-get install git)") from exc
    if done.stopped == "timeout":  # a host that drops packets never answers
        proc = subprocess.CompletedProcess(cmd, 124, b"", f"no answer within {limit:g} s (stopped)".encode())
    elif done.stopped == "output":
        proc = subprocess.CompletedProcess(
            cmd, 125, b"", f"printed more than {GIT_OUTPUT_LIMIT} bytes (stopped)".encode()
        )
    else:
        proc = subprocess.CompletedProcess(cmd, done.returncode or 0, done.stdout, done.stderr)
    err = proc.stderr.decode("utf-8", "replace")
    res: GitResult[str] | GitResult[bytes]
    if binary:
        res = GitResult(cmd, proc.returncode, proc.stdout, err)
    else:
        res = GitResult(cmd, proc.returncode, proc.stdout.decode("utf-8", "replace"), err)
    if check and not res.ok:
        where = f" in {repo}" if repo is not None else ""
        raise UserError(
            scrub(f"git {' '.join(args)} failed (exit {proc.returncode}){where}:\n{res.output.strip()}", credential)
        )
    return res


def checkout_commit(root: Path, paths: tuple[str, ...]) -> str | None:
    """The commit of the git checkout whose top is ``root``, with ``-dirty`` when a file under ``paths`` differs
    from it or is not tracked; None when ``root`` is not the top of a checkout with a commit. Writes nothing: no
    index refresh, so a read-only or shared checkout is left as it is."""
    quiet = {"GIT_OPTIONAL_LOCKS": "0"}
    top = git(root, "rev-parse", "--show-toplevel", check=False, env=quiet, timeout=30)
    if not top.ok or Path(top.stdout.strip()).resolve() != root.resolve():
        return None
    head = git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False, env=quiet, timeout=30)
    changed = git(root, "status", "--porcelain", "--", *paths, check=False, env=quiet, timeout=30)
    commit = head.stdout.strip()
    if not head.ok or not changed.ok or len(commit) != 40:
        return None
    return commit + ("-dirty" if changed.stdout.strip() else "")


def git_bytes(repo: Path | str, *args: str, env: dict[str, str] | None = None) -> bytes:
    return git(repo, *args, binary=True, env=env).stdout


def rev_parse(repo: Path | str, rev: str) -> str | None:
    res = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return res.stdout.strip() if res.ok else None


def is_git_repo(path: Path) -> bool:
    return (path / ".git").exists()


def git_dir(repo: Path) -> Path:
    out = git(repo, "rev-parse", "--absolute-git-dir").stdout.strip()
    return Path(out)


def am_in_progress(repo: Path) -> bool:
    return (git_dir(repo) / "rebase-apply").is_dir()
