"""Make the git repository a series is applied onto.

Either a shallow clone of the pinned commit from the upstream mirror (the
repository's root commit is then the real upstream commit), a clone with the
mirror's history (for ``git cherry`` and ``git log`` searches), or - for a
plain exported tree such as an unpacked sdist - a fresh repository whose
single commit is that tree.
"""

from __future__ import annotations

from pathlib import Path

from stackforge.clients import upstream as up
from stackforge.clients.git import BASE_REF, NOTES_REF, git, rev_parse
from stackforge.clients.workspace import Workspace
from stackforge.errors import UserError
from stackforge.urls import Credential

BRANCH = "patched"
# Fixed identity and date of the synthetic commit made from a plain tree, so
# the same tree always gives the same commit id.
BASE_DATE = "1980-01-01T00:00:00+0000"


def configure(repo: Path) -> None:
    """Settings every repository we apply in gets (notes follow rebase and amend)."""
    git(repo, "config", "notes.rewriteRef", NOTES_REF)
    git(repo, "config", "notes.rewrite.amend", "true")
    git(repo, "config", "notes.rewrite.rebase", "true")
    git(repo, "config", "core.autocrlf", "false")
    git(repo, "config", "user.name", "stackforge")
    git(repo, "config", "user.email", "stackforge@localhost")


def init_tree_repo(tree: Path, message: str) -> str:
    """Turn a plain tree into a repository with one commit holding all of it; return its id."""
    tree = Path(tree)
    if (tree / ".git").exists():
        raise UserError(f"{tree} is already a git repository", fix="pass a plain exported tree")
    git(tree, "init", "--quiet", f"--initial-branch={BRANCH}")
    configure(tree)
    git(tree, "add", "--force", "--all")
    env = {"GIT_AUTHOR_DATE": BASE_DATE, "GIT_COMMITTER_DATE": BASE_DATE}
    git(tree, "commit", "--quiet", "--allow-empty", "--no-verify", "-m", message, env=env)
    commit = rev_parse(tree, "HEAD")
    assert commit
    git(tree, "update-ref", BASE_REF, commit)
    return commit


def clone_commit(mirror: Path, commit: str, dest: Path, *, history: bool | str = True) -> str:
    """Check ``commit`` out of ``mirror`` into a new repository at ``dest``; return the commit id.

    History matters: ``git am -3`` falls back to a 3-way merge only when the
    blobs a patch was made against are in the repository, which after a pin
    bump means older commits. ``history="shared"`` borrows the mirror's
    objects (scratch trees), ``True`` clones them, ``False`` fetches only the
    pinned commit (no 3-way fallback for patches made on other commits).
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest} exists and is not empty", fix="choose a new directory, or pass --force to replace it")
    dest.mkdir(parents=True, exist_ok=True)
    if history == "shared":
        # Scratch trees: objects borrowed from the mirror (they live no longer than it).
        git(None, "clone", "--quiet", "--shared", "--no-checkout", str(mirror), str(dest))
    elif history:
        # Kept trees: a local clone (hard-linked objects where the file system allows).
        git(None, "clone", "--quiet", "--local", "--no-checkout", str(mirror), str(dest))
    else:
        git(dest, "init", "--quiet", f"--initial-branch={BRANCH}")
        git(dest, "fetch", "--quiet", "--no-tags", "--depth=1", f"file://{Path(mirror).resolve()}", commit)
    git(dest, "checkout", "--quiet", "-B", BRANCH, commit)
    configure(dest)
    full = rev_parse(dest, "HEAD")
    assert full
    git(dest, "update-ref", BASE_REF, full)
    return full


def prepare(
    spec: up.UpstreamPin,
    cache_dir: Path,
    dest: Path,
    *,
    root: Path | None = None,
    commit: str | None = None,
    history: bool | str = True,
    offline: bool = False,
    label: str = "upstream",
    workspace: Workspace | None = None,
    credential: Credential | None = None,
) -> str:
    """A repository at ``dest`` holding the pinned upstream (or ``commit`` of its mirror), fetched with the
    workspace's credentials."""
    sdist = up.sdist_of(spec) if commit is None else None
    if sdist:
        up.export_sdist(sdist, cache_dir, dest, offline=offline, workspace=workspace, credential=credential)
        msg = f"{label}: {sdist.name} {sdist.version} sdist\n\nsha256 {sdist.sha256}\n"
        return init_tree_repo(dest, msg)
    mirror = up.fetch_upstream(spec, cache_dir, root=root, offline=offline, workspace=workspace, credential=credential)
    if commit is None:
        commit = up.pinned_commit(spec)
    elif rev_parse(mirror, commit) is None:
        raise UserError(
            f"commit {commit} is not in the upstream mirror of {spec.git}",
            fix="fetch it upstream first or check the id",
        )
    return clone_commit(mirror, commit, dest, history=history)
