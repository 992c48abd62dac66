"""A clean build's cache mounts are its own: every cache mount id of its Dockerfile ends with its scope, nothing
else of the Dockerfile changes, and the engine client removes exactly the mounts of that scope when it ends."""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest
from test_render_golden import STACKS, fixed_engine_facts, with_ca_bundle

from stackforge.builder.context.prepare import prepare_dockerfile
from stackforge.builder.plan.render import CLEAN_SCOPE, clean_scope
from stackforge.clients.engine import Engine, parse_cache_mounts
from stackforge.stack.load import load
from tests.fixtures.stack_support import REPO

CACHE_MOUNT = re.compile(r"--mount=type=cache,[^ ]*?id=([^, ]+)")


def render(tmp_path: Path, name: str, sub: str, scope: str = "") -> str:
    prepared = prepare_dockerfile(
        load(name, root=REPO),
        out=tmp_path / sub,
        sources=False,
        engine_facts=fixed_engine_facts,
        workspace=with_ca_bundle(tmp_path),
        cache_scope=scope,
    )
    return prepared.ctx.dockerfile.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", STACKS)
def test_a_clean_build_names_only_cache_mounts_of_its_own(tmp_path, name):
    scope = clean_scope()
    shared, own = render(tmp_path, name, "shared"), render(tmp_path, name, "own", scope)
    shared_ids = CACHE_MOUNT.findall(shared)
    assert {"stackforge-pip", "stackforge-ccache"} <= set(shared_ids), "every golden stack compiles and downloads"
    own_ids = CACHE_MOUNT.findall(own)
    assert own_ids == [i + scope for i in shared_ids]  # every cache mount, none left shared
    assert own.replace(scope, "") == shared  # and nothing else differs


def test_each_clean_build_gets_another_scope_and_the_renderer_takes_no_other():
    scopes = {clean_scope() for _ in range(20)}
    assert len(scopes) == 20 and all(CLEAN_SCOPE.fullmatch(s) for s in scopes)
    with pytest.raises(ValueError, match="cache scope"):
        prepare_dockerfile(load("example", root=REPO), sources=False, cache_scope=",sharing=shared")


DU = """ID:		hxx9alc94lc9hn0ozi50cetur
Created at:	2026-12-06 15:26:38.338252789 +0000 UTC
Mutable:	true
Reclaimable:	true
Shared:		false
Size:		181MB
Description:	cached mount /var/cache/apt from exec /bin/sh -c sh /stackforge/system/apt-layer.sh x: y with id "/stackforge-apt-cache"
Usage count:	2
Last used:	About a minute ago
Type:		exec.cachemount

ID:		zlgjvbb3mgwsp70g3hzy9w2j7
Description:	cached mount /root/.cache/ccache from exec /bin/sh -c make with id "/stackforge-ccache{scope}"
Type:		exec.cachemount

ID:		lpd01s4l1ao9rwsq9xq13q663
Description:	cached mount /root/.cache/pip with id "stackforge-pip{scope}"
Type:		exec.cachemount

ID:		qqd01s4l1ao9rwsq9xq13q663
Description:	cached mount /root/.cache/pip with id "/stackforge-pip"
Type:		exec.cachemount

ID:		-rf
Description:	cached mount /x with id "/stackforge-pip{scope}"

ID:		abcdefabcdefabcdef12345
Description:	mount / from exec /bin/sh -c echo "with id {scope}"
Type:		regular
"""


def test_the_cache_mounts_buildx_du_lists_are_read_with_their_ids():
    scope = "-clean-0123456789ab"
    assert parse_cache_mounts(DU.format(scope=scope)) == [
        ("hxx9alc94lc9hn0ozi50cetur", "stackforge-apt-cache"),
        ("zlgjvbb3mgwsp70g3hzy9w2j7", "stackforge-ccache" + scope),
        ("lpd01s4l1ao9rwsq9xq13q663", "stackforge-pip" + scope),
        ("qqd01s4l1ao9rwsq9xq13q663", "stackforge-pip"),
    ]


def fake_docker(tmp_path: Path, du: str, du_rc: int = 0, regex_ids: bool = False) -> tuple[Path, Path]:
    """A docker CLI that lists ``du`` for ``buildx du`` and records each ``buildx prune`` it is asked;
    ``regex_ids``: its prune reads ``id=`` as a regular expression and lists the records of ``du`` it matched,
    as the engine's own builder does (else it matches nothing and lists nothing)."""
    (tmp_path / "du.txt").write_text(du)
    calls = tmp_path / "calls.txt"
    script = tmp_path / "docker"
    script.write_text(
        f"#!{sys.executable}\n"
        "import re, sys\n"
        f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"du = open({str(tmp_path / 'du.txt')!r}).read()\n"
        "if 'du' in sys.argv[1:]:\n"
        "    sys.stdout.write(du)\n"
        f"    sys.exit({du_rc})\n"
        f"if 'prune' in sys.argv[1:] and {regex_ids}:\n"
        "    pattern = sys.argv[-1].removeprefix('id=')\n"
        "    print('ID\\tRECLAIMABLE\\tSIZE\\tLAST ACCESSED')\n"
        "    for rid in re.findall(r'^ID:\\s+(\\S+)', du, re.M):\n"
        "        if re.search(pattern, rid):\n"
        "            print(rid + '*\\ttrue\\t0B\\tnow')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, calls


def test_the_engine_removes_the_mounts_of_one_scope_and_no_other(tmp_path):
    scope = clean_scope()
    docker, calls = fake_docker(tmp_path, DU.format(scope=scope))
    dropped = Engine(docker=str(docker), builder="mybuilder").drop_cache_mounts(scope)
    assert dropped == ["zlgjvbb3mgwsp70g3hzy9w2j7", "lpd01s4l1ao9rwsq9xq13q663"]
    # the engine first asks where the named builder runs (``buildx inspect``), then lists and removes: one prune
    # for both, which this builder (ids matched exactly) answers with nothing, then one each
    asked = [line for line in calls.read_text().splitlines() if not line.startswith("buildx inspect ")]
    assert asked == [
        "buildx --builder mybuilder du --verbose --filter type=exec.cachemount",
        "buildx --builder mybuilder prune --force --filter id=^(zlgjvbb3mgwsp70g3hzy9w2j7|lpd01s4l1ao9rwsq9xq13q663)$",
        "buildx --builder mybuilder prune --force --filter id=zlgjvbb3mgwsp70g3hzy9w2j7",
        "buildx --builder mybuilder prune --force --filter id=lpd01s4l1ao9rwsq9xq13q663",
    ]


def test_the_engines_own_builder_removes_a_scopes_mounts_in_one_prune(tmp_path):
    scope = clean_scope()
    docker, calls = fake_docker(tmp_path, DU.format(scope=scope), regex_ids=True)
    dropped = Engine(docker=str(docker)).drop_cache_mounts(scope)
    assert dropped == ["zlgjvbb3mgwsp70g3hzy9w2j7", "lpd01s4l1ao9rwsq9xq13q663"]
    asked = [line for line in calls.read_text().splitlines() if not line.startswith("buildx inspect ")]
    assert asked == [
        "buildx du --verbose --filter type=exec.cachemount",
        "buildx prune --force --filter id=^(zlgjvbb3mgwsp70g3hzy9w2j7|lpd01s4l1ao9rwsq9xq13q663)$",
    ]


def test_nothing_is_removed_without_a_scope_or_a_listing(tmp_path):
    scope = clean_scope()
    docker, calls = fake_docker(tmp_path, DU.format(scope=scope), du_rc=1)
    assert Engine(docker=str(docker)).drop_cache_mounts("") == []
    assert not calls.exists()
    assert Engine(docker=str(docker)).drop_cache_mounts(scope) == []  # the listing failed
    assert calls.read_text().splitlines() == ["buildx du --verbose --filter type=exec.cachemount"]
    assert Engine(docker=str(docker)).drop_cache_mounts(clean_scope()) == []  # another build's scope
