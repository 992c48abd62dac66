"""Every relative link in README.md and docs/**/*.md resolves: the file exists and, for ``#anchor``, the target
page has a heading with that slug (GitHub's rule). Links inside code spans and fenced blocks are not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked out."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code, links and emphasis reduced to their text), lower-cased,
    every character but letters, digits, spaces, '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link is its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_ markers, not snake_case
    text = "".join(c for c in text.lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file; a repeated slug gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines_raw(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def _prose_lines_raw(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, code spans kept (a heading's code is part of its text)."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link of a file (inline and reference definitions)."""
    out = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        out += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        m = REFERENCE_LINK.match(line)
        if m:
            out.append((number, m.group(1)))
    return out


def broken(path: Path, root: Path) -> list[str]:
    """``file:line: target: why`` for each relative link of ``path`` that does not resolve."""
    problems = []
    for number, target in links(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # an absolute URL: not checked here
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest.relative_to(root) if dest.is_relative_to(root) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {dest.relative_to(root)} has no heading with the anchor #{anchor}")
    return problems


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def test_every_relative_link_in_the_readme_and_docs_resolves():
    problems = [p for page in pages(REPO) for p in broken(page, REPO)]
    assert problems == [], "\n".join(problems)


def test_the_docs_are_linked_from_the_readme():
    """A page no one links to cannot be found: every page of docs/ is reachable from the README."""
    reachable, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in reachable:
            continue
        reachable.add(page)
        for _, target in links(page):
            file_part = target.partition("#")[0]
            if file_part.endswith(".md") and not SCHEME.match(file_part):
                dest = (page.parent / file_part).resolve()
                if dest.is_file():
                    todo.append(dest)
    assert [str(p.relative_to(REPO)) for p in pages(REPO) if p not in reachable] == []


SLUGS = [
    ("## Two commands", "two-commands"),
    ("## Overrides: `--set`", "overrides---set"),
    ("## From `build_image.sh` to `make image STACK=post2`", "from-build_imagesh-to-make-image-stackpost2"),
    ("## The stack's pins win", "the-stacks-pins-win"),
    ("## publish.json", "publishjson"),
    ("## post_install", "post_install"),
    ("## Does the stack agree with its plugin?", "does-the-stack-agree-with-its-plugin"),
    ("### [Linked](x.md) *heading*", "linked-heading"),
]


@pytest.mark.parametrize("case", SLUGS, ids=[c[1] for c in SLUGS])
def test_slugs_follow_githubs_rule(case):
    heading, expected = case
    assert slug(HEADING.match(heading).group(2)) == expected


def test_a_missing_file_a_missing_anchor_and_a_repeated_heading(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Same\n\n## Same\n\n```sh\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "# R\n\n[ok](docs/a.md#same-1) [self](#r) [web](https://example.com/x.md)\n"
        "[gone](docs/missing.md) [no anchor](docs/a.md#same-2) [code block heading](docs/a.md#not-a-heading)\n"
        "`[in code](docs/missing.md)`\n\n```\n[in a fence](docs/missing.md)\n```\n\n[ref]: docs/nothing.md\n"
    )
    problems = broken(tmp_path / "README.md", tmp_path)
    assert [p.split(": ")[1] for p in problems] == [
        "docs/missing.md",
        "docs/a.md#same-2",
        "docs/a.md#not-a-heading",
        "docs/nothing.md",
    ]
    assert problems[0].startswith("README.md:4: docs/missing.md: no such file")
    assert "has no heading with the anchor #same-2" in problems[1]


CODE_SPAN = re.compile(r"(?<!`)`([^`\s]+/[^`\s/]+\.py)`(?!`)")  # a path with a directory: not an upstream's setup.py


def _spans(text: str) -> list[tuple[int, str]]:
    out = []
    for number, line in _prose_lines_raw(text):
        out += [(number, m.group(1)) for m in CODE_SPAN.finditer(line)]
    return out


def module_paths(path: Path) -> list[tuple[int, str]]:
    """(line, path) of every ``dir/….py`` path the page names in a code span, e.g. `stack/model.py`."""
    return _spans(path.read_text(encoding="utf-8"))


def test_every_python_file_the_docs_name_exists():
    """A page names modules by their path in the package (`stack/agreement.py`) or in the repository
    (`images/gate/gate.py`, `bench/run_all.py`): each must exist, so a moved module cannot leave a stale name."""
    bases = [REPO, REPO / "tools", REPO / "tools" / "stackforge"]
    missing = [
        f"{page.relative_to(REPO)}:{number}: {name}"
        for page in pages(REPO)
        for number, name in module_paths(page)
        if not any((base / name).is_file() for base in bases)
    ]
    assert missing == [], "\n".join(missing)


def test_module_paths_are_found_in_code_spans_only():
    page = (
        "Run `stack/model.py`, `images/gate/gate.py`, `setup.py`; plain stack/x.py is prose.\n```\n`no/such.py`\n```\n"
    )
    assert [name for _, name in _spans(page)] == ["stack/model.py", "images/gate/gate.py"]


def test_the_architecture_page_names_every_module_of_the_package():
    """docs/architecture.md's package layout names each module under its unit (``builder/`` … ``run``), so a
    module added or moved without the page fails here."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    layout = text.split("## Package layout", 1)[1].split("\n## ", 1)[0]
    sections = dict(re.findall(r"^([a-z_]+)/ +(.*?)(?=^\S|\Z)", layout, re.S | re.M))
    package = REPO / "tools" / "stackforge"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if path.name in ("__init__.py", "__main__.py") or "__pycache__" in rel.parts:
            continue
        where = sections.get(rel.parts[0], "") if len(rel.parts) > 1 else layout
        if not re.search(rf"(?<![\w/]){re.escape(path.stem)}\b", where):
            missing.append(str(rel))
    assert missing == [], f"docs/architecture.md does not name: {missing}"
