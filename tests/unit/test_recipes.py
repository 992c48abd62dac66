"""Recipes: the schema and its file:line errors, the repository and image checks (image answers fed in), the
generated cookbook and its --check, and the verbs' exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackforge.cli.main import main
from stackforge.errors import UserError
from stackforge.recipes import docs as docsmod
from stackforge.recipes.lint import check_image, check_repository, help_flags, reads_env
from stackforge.recipes.load import list_recipes, load_recipe
from tests.fixtures.stack_support import RootSpec

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "fixtures" / "standin_vllm_serve.py"

GOOD = """\
description: a chat model on the release image
image: {stack: post2, target: vllm-openai}
model: {id: Qwen/Qwen3-8B, served_name: qwen3-8b}
serve:
  --max-model-len: "4096"
  --enforce-eager: true
ports: {api: 8000}
smoke:
  - name: capital
    chat: {prompt: "What is the capital of China?", contains: Beijing}
  - name: turns
    turns: {count: 3}
  - name: backend
    log: {regex: "Using FLASH_ATTN backend"}
"""


@pytest.fixture
def root_spec() -> RootSpec:
    """A repository with the real stacks, the docs templates and no recipes yet."""
    return RootSpec(
        parts=("stacks", "images/docs"),
        dirs=("recipes", "overlays/jev"),
        files={"README.md": f"# x\n\n{docsmod.BEGIN}\n{docsmod.END}\n\nafter\n"},
    )


def write(root: Path, name: str, text: str) -> Path:
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(root: Path, text: str, name: str = "bad") -> UserError:
    write(root, name, text)
    with pytest.raises(UserError) as info:
        load_recipe(root, name)
    return info.value


# --------------------------------------------------------------------------- schema


def test_checked_in_recipes_load_and_give_typed_rows():
    names = list_recipes(REPO)
    assert {"qwen3-8b", "diffusion-gemma"} <= set(names)
    qwen = load_recipe(REPO, "qwen3-8b").model
    assert qwen.container_args()[:3] == ["Qwen/Qwen3-8B", "--served-model-name", "qwen3-8b"]
    assert [r.kind for r in qwen.smoke] == ["chat", "turns", "log", "chat"]
    assert qwen.smoke[2].check.regex == "Using FLASH_ATTN backend"  # type: ignore[union-attr]
    gemma = load_recipe(REPO, "diffusion-gemma").model
    assert gemma.image.overlay == gemma.needs.overlay == "jev"
    assert set(gemma.env) == {
        "MODEL",
        "SERVED_NAME",
        "PORT",
        "API_PORT",
        "CANVAS",
        "DENOISE_STEPS",
        "GMEM",
        "MAX_LEN",
        "BACKEND",
    }
    assert gemma.ports == {"api": 8000, "interposer": 18011}
    assert gemma.container_args() == ["--max-logprobs", "32"]  # the model comes from the env overrides


def test_list_form_of_serve_is_the_mapping(root):
    write(
        root,
        "a",
        GOOD.replace(
            'serve:\n  --max-model-len: "4096"\n  --enforce-eager: true',
            'serve: ["--max-model-len 4096", "--enforce-eager", "--dtype=bfloat16"]',
        ),
    )
    flags = load_recipe(root, "a").model.flags()
    assert [(f.name, f.value) for f in flags] == [
        ("--max-model-len", "4096"),
        ("--enforce-eager", None),
        ("--dtype", "bfloat16"),
    ]


@pytest.mark.parametrize(
    ("change", "line", "needle"),  # line: where the error points
    [
        (("ports: {api: 8000}", "ports: {api: 8000}\nportz: 1"), 8, "unknown key 'portz'"),
        (('--max-model-len: "4096"', "--max_model_len: '4096'"), 5, "not a long option"),
        (('--max-model-len: "4096"', "--max-model-len: 4096"), 5, "read as a number"),
        (('--max-model-len: "4096"', '--max-model-len: "--port"'), 5, "would be read as an option"),
        (("Qwen/Qwen3-8B", "Qwen/../etc"), 3, "not a model id"),
        (("ports: {api: 8000}", "ports: {api: 8000, other: 8000}"), 7, "container port 8000 is also ports.api"),
        (("ports: {api: 8000}", "ports: {api: 8000}\nreadiness: {port: web}"), 8, "no port named 'web'"),
        (("ports: {api: 8000}", "ports: {api: 8000}\nreadiness: {path: '/v1/models?x=1'}"), 8, "not a URL path"),
        (("ports: {api: 8000}", "ports: {api: 8000}\nneeds: {overlay: jev}"), 8, "needs.overlay is 'jev'"),
        (
            ("ports: {api: 8000}", "ports: {api: 8000}\nenv: {1BAD: {default: x, description: y}}"),
            8,
            "environment variable name",
        ),
        (
            ("ports: {api: 8000}", "ports: {api: 8000}\nenv: {GMEM: {default: 0.75, description: y}}"),
            8,
            "read as a number",
        ),
        (("    turns: {count: 3}", "    turns: {count: 3}\n    get: {path: /x}"), 11, "exactly one of"),
        (("Using FLASH_ATTN backend", "Using (FLASH_ATTN backend"), 14, "not a regular expression"),
        (("  - name: turns", "  - name: capital"), 11, "'capital' is used twice"),
    ],
)
def test_bad_values_name_file_line_and_fix(root, change, line, needle):
    old, new = change
    assert old in GOOD
    err = error_of(root, GOOD.replace(old, new, 1))
    assert err.exit_code == 2
    problems = getattr(err, "problems", [err])
    rendered = "\n".join(p.render() for p in problems)
    assert str(problems[0].file) == "recipes/bad.yaml", rendered
    assert problems[0].line == line, rendered
    assert needle in rendered


def test_shell_text_in_a_value_is_one_quoted_word_in_the_docs(root):
    write(root, "a", GOOD.replace('--max-model-len: "4096"', '--max-model-len: "4096; rm -rf /"'))
    page = docsmod.render_page(root, load_recipe(root, "a"))
    assert "--max-model-len '4096; rm -rf /'" in page


# --------------------------------------------------------------------------- repository and image checks


def test_repository_checks_name_the_key(root):
    write(
        root,
        "a",
        GOOD.replace("target: vllm-openai", "target: final")
        .replace("ports: {api: 8000}", "ports: {api: 8000}\n")
        .replace("stack: post2,", "stack: post2, overlay: nope,"),
    )
    found = check_repository(load_recipe(root, "a"), root)
    text = "\n".join(f.render() for f in found)
    assert "image.target: post2 has no published target 'final'" in text and "vllm-openai" in text
    assert "no overlays/nope/ directory" in text
    assert all(f.file == "recipes/a.yaml" and f.line == 2 for f in found)
    write(root, "b", GOOD.replace("stack: post2", "stack: post9"))
    (unloaded,) = check_repository(load_recipe(root, "b"), root)
    assert "stack 'post9' does not load" in unloaded.message


def test_port_flag_must_be_a_declared_port(root):
    write(root, "a", GOOD.replace("serve:\n", 'serve:\n  --port: "9000"\n'))
    (found,) = check_repository(load_recipe(root, "a"), root)
    assert found.line == 5 and "--port is 9000" in found.message


class FakeImage:
    ref = "fake:1"

    def __init__(self, help_text: str, entry: tuple[str, str] = ("/entrypoint.sh", "")):
        self.help_text, self.entry, self.asked = help_text, entry, []

    def serve_help(self) -> str:
        self.asked.append("help")
        return self.help_text

    def entrypoint(self) -> tuple[str, str]:
        self.asked.append("entrypoint")
        return self.entry


def standin_help() -> str:
    """The stand-in server's real ``vllm serve --help=all`` (the same argparse the images carry)."""
    proc = subprocess.run([sys.executable, str(STANDIN), "--help=all"], capture_output=True, text=True, check=True)
    return proc.stdout


def test_help_flags_read_argparse_help():
    flags = help_flags(standin_help())
    assert {"--port", "--max-model-len", "--enforce-eager", "--no-enforce-eager", "--attention-backend"} <= flags
    short = subprocess.run([sys.executable, str(STANDIN), "--help"], capture_output=True, text=True).stdout
    assert "--max-model-len" not in help_flags(short)  # vLLM's --help shows groups; --help=all the options


def test_image_check_flags_unknown_option_with_line_and_near_match(root):
    write(root, "a", GOOD.replace('--max-model-len: "4096"', '--max-model-length: "4096"'))
    recipe = load_recipe(root, "a")
    image = FakeImage(standin_help())
    (found,) = check_image(recipe, image)
    assert (found.file, found.line) == ("recipes/a.yaml", 5)
    assert "has no option --max-model-length" in found.message and found.fix == "did you mean --max-model-len?"
    assert image.asked == ["help"]  # no env overrides: the entrypoint is not read


def test_image_check_env_overrides_read_by_the_entrypoint(root):
    recipe_text = GOOD.replace(
        "ports: {api: 8000}",
        "ports: {api: 8000}\nenv:\n"
        "  GMEM: {default: '0.75', description: memory}\n"
        "  CANVAS: {default: '256', description: canvas}\n"
        "  MAX_LEN: {default: '4096', description: length}\n",
    )
    write(root, "a", recipe_text)
    script = 'exec vllm serve --gpu-memory-utilization "${GMEM:-0.75}" --max-model-len $MAX_LEN_X "$@"\n'
    found = check_image(load_recipe(root, "a"), FakeImage(standin_help(), ("/opt/jev/entrypoint.sh", script)))
    assert [f.message.split(":")[0] for f in found] == ["env.CANVAS", "env.MAX_LEN"]
    assert found[0].line == 10 and "/opt/jev/entrypoint.sh" in found[0].message


def test_reads_env():
    assert reads_env('x="$A"', "A") and reads_env("${A:-1}", "A") and reads_env("${A}", "A")
    assert not reads_env("$AB ${AB} A", "A")


# --------------------------------------------------------------------------- docs


def test_docs_written_checked_and_stale_pages_removed(root):
    write(root, "a", GOOD)
    recipes = [load_recipe(root, "a")]
    assert docsmod.generate(root, recipes, check=True).written == ["docs/cookbook/a.md", "README.md"]
    docsmod.generate(root, recipes)
    assert docsmod.generate(root, recipes, check=True).written == []
    readme = (root / "README.md").read_text()
    assert "[a](docs/cookbook/a.md) | `Qwen/Qwen3-8B` | post2 · vllm-openai | api 8000 | no |" in readme
    assert readme.endswith("\nafter\n")
    page = (root / "docs/cookbook/a.md").read_text()
    assert "docker run --rm -p 8000:8000 IMAGE Qwen/Qwen3-8B --served-model-name qwen3-8b" in page
    write(root, "a", GOOD.replace("Beijing", "Peking"))
    assert docsmod.generate(root, [load_recipe(root, "a")], check=True).written == ["docs/cookbook/a.md"]
    (root / "recipes" / "a.yaml").unlink()
    result = docsmod.generate(root, [], check=False)
    assert result.removed == ["docs/cookbook/a.md"] and not (root / "docs/cookbook/a.md").exists()


def test_table_cells_cannot_break_the_table(root):
    write(
        root,
        "a",
        GOOD.replace(
            "ports: {api: 8000}", "ports: {api: 8000}\nenv:\n  GMEM: {default: 'a|b`c', description: 'x | y'}\n"
        ),
    )
    page = docsmod.render_page(root, load_recipe(root, "a"))
    assert "| `GMEM` | `` a\\|b`c `` | x \\| y |" in page


def test_readme_without_markers_is_an_error(root):
    (root / "README.md").write_text("# x\n")
    write(root, "a", GOOD)
    with pytest.raises(UserError, match="no recipe table markers"):
        docsmod.generate(root, [load_recipe(root, "a")], check=True)


def test_checked_in_docs_are_current():
    recipes = [load_recipe(REPO, n) for n in list_recipes(REPO)]
    result = docsmod.generate(REPO, recipes, check=True)
    assert result.written == [] and result.removed == [], "run: stackforge recipe docs"


# --------------------------------------------------------------------------- verbs


def test_verbs_exit_codes(root, capsys):
    write(root, "a", GOOD)
    assert main(["--root", str(root), "recipe", "lint", "a"]) == 0
    assert capsys.readouterr().out == "a: ok\n"
    write(root, "b", GOOD.replace("target: vllm-openai", "target: nope"))
    assert main(["--root", str(root), "recipe", "lint", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["recipes"][1]["findings"][0]["line"] == 2
    write(root, "c", GOOD + "bogus: 1\n")
    assert main(["--root", str(root), "recipe", "lint", "c"]) == 2
    assert "recipes/c.yaml:15:1: unknown key 'bogus'" in capsys.readouterr().err
    (root / "recipes" / "b.yaml").unlink()
    (root / "recipes" / "c.yaml").unlink()
    assert main(["--root", str(root), "recipe", "docs", "--check"]) == 1
    assert main(["--root", str(root), "recipe", "docs"]) == 0
    assert main(["--root", str(root), "recipe", "docs", "--check"]) == 0
    capsys.readouterr()
    assert main(["recipe", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "smoke" in schema["properties"] and schema["properties"]["serve"]["description"]


# --------------------------------------------------------------------------- log counts and configurations

CONFIGURED = (
    GOOD
    + """configurations:
  - name: small
    description: the base budget
  - name: large
    description: a larger budget and another length
    serve: {--max-model-len: "8192", --dtype: bfloat16}
    max_tokens: 64
"""
)


@pytest.mark.parametrize(
    ("change", "line", "needle"),
    [
        (('Using FLASH_ATTN backend"}', 'Using FLASH_ATTN backend", count: 0, min: 1}'), 14, "not both"),
        (('Using FLASH_ATTN backend"}', 'Using FLASH_ATTN backend", min: 3, max: 1}'), 14, "min 3 is above max 1"),
        (('Using FLASH_ATTN backend"}', 'Using FLASH_ATTN backend", count: -1}'), 14, "greater than or equal to 0"),
        (("  - name: large", "  - name: small"), 18, "'small' is used twice"),
        (("    max_tokens: 64", "    max_tokens: 64\n    env: {GMEM: '0.8'}"), 22, "declares no env override GMEM"),
        (("    max_tokens: 64", "    max_tokens: 64\n    servee: {}"), 22, "unknown key 'servee'"),
        (("--dtype: bfloat16}", "--dtype: 16}"), 20, "read as a number"),
    ],
)
def test_count_and_configuration_errors_name_file_line_and_fix(root, change, line, needle):
    old, new = change
    assert old in CONFIGURED
    err = error_of(root, CONFIGURED.replace(old, new, 1))
    problems = getattr(err, "problems", [err])
    rendered = "\n".join(p.render() for p in problems)
    assert (str(problems[0].file), problems[0].line) == ("recipes/bad.yaml", line), rendered
    assert needle in rendered, rendered


def test_a_budget_without_a_chat_row_is_a_problem(root):
    text = GOOD.split("smoke:")[0] + "configurations:\n  - {name: a, description: more, max_tokens: 9}\n"
    err = error_of(root, text)
    assert err.line == 9 and "no chat or turns row to give it to" in err.message and err.fix


def test_configured_merges_flags_and_sets_budgets(root):
    write(root, "a", CONFIGURED)
    model = load_recipe(root, "a").model
    assert model.configured() == model.configured("small")
    assert model.configured("small").container_args() == model.container_args()
    large = model.configured("large")
    assert large.serve == {"--max-model-len": "8192", "--enforce-eager": True, "--dtype": "bfloat16"}
    assert large.smoke[0].chat.max_tokens == 64 and large.smoke[1].turns.max_tokens == 64  # type: ignore[union-attr]
    assert model.smoke[0].chat.max_tokens == 64 and model.smoke[1].turns.max_tokens == 32  # type: ignore[union-attr]
    assert large.configurations == [] and large.smoke[2] == model.smoke[2]
    with pytest.raises(KeyError, match="no configuration 'huge' \\(the recipe declares small, large\\)"):
        model.configured("huge")
    assert [f.at for f in model.configuration_flags()] == [
        ("configurations", 1, "serve", "--max-model-len"),
        ("configurations", 1, "serve", "--dtype"),
    ]


def test_image_check_reads_every_configurations_flags(root):
    write(root, "a", CONFIGURED.replace("--dtype: bfloat16", "--dtyp: bfloat16"))
    (found,) = check_image(load_recipe(root, "a"), FakeImage(standin_help()))
    assert (found.file, found.line) == ("recipes/a.yaml", 20)
    assert found.message.startswith("configurations.1.serve.--dtyp: the image's vllm serve has no option --dtyp")
    assert found.fix == "did you mean --dtype?"


def test_every_checked_in_recipe_lints_clean_against_the_stand_ins_help():
    """The stand-in's `vllm serve --help=all` carries vLLM's own options (tests/fixtures/facts/vllm.yaml)."""
    help_text = standin_help()
    for name in list_recipes(REPO):
        recipe = load_recipe(REPO, name)
        found = [f.render() for f in check_image(recipe, FakeImage(help_text)) if not f.message.startswith("env.")]
        assert found == [], name
        assert check_repository(recipe, REPO) == [], name
    assert {"qwen3-30b-a3b-fp8", "deepseek-v2-lite", "nemotron-3.5-mtp6"} <= set(list_recipes(REPO))


def test_matrix_recipes_say_what_the_record_ran():
    qwen = load_recipe(REPO, "qwen3-30b-a3b-fp8").model
    assert qwen.serve["--quantization"] == "fp8" and qwen.serve["--enforce-eager"] is True
    deepseek = load_recipe(REPO, "deepseek-v2-lite").model
    assert deepseek.serve["--attention-backend"] == "FLASHMLA" and deepseek.serve["--enforce-eager"] is True
    assert [r.check.expectation() for r in deepseek.smoke if r.log] == [  # type: ignore[union-attr]
        "at least 1 line",
        "exactly 6 lines",
        "no line",
        "no line",
    ]
    nemotron = load_recipe(REPO, "nemotron-3.5-mtp6").model
    assert "--enforce-eager" not in nemotron.serve  # the compiled protocol
    assert json.loads(str(nemotron.serve["--speculative-config"])) == {"method": "mtp", "num_speculative_tokens": 6}
    assert [(c.name, c.max_tokens) for c in nemotron.configurations] == [("budget-64", 64), ("budget-24", 24)]


def test_cookbook_shows_each_configuration(root):
    write(root, "a", CONFIGURED)
    page = docsmod.render_page(root, load_recipe(root, "a"))
    assert "| `small` (default) | the base budget | (none) | (each row's) |" in page
    assert "| `large` | a larger budget and another length | `--max-model-len 8192`, `--dtype bfloat16` | 64 |" in page
    assert "stackforge smoke a --configuration large --image IMAGE" in page
    assert "--max-model-len 8192 --enforce-eager --dtype bfloat16" in page
    write(root, "b", GOOD.replace('"Using FLASH_ATTN backend"}', '"seq_tot", count: 0}'))
    assert "| backend | api | the server log has no line matching /seq_tot/ |" in docsmod.render_page(
        root, load_recipe(root, "b")
    )


def test_smoke_refuses_an_undeclared_configuration(root, capsys):
    write(root, "a", CONFIGURED)
    assert main(["--root", str(root), "smoke", "a", "--configuration", "huge", "--image", "x:1"]) == 2
    err = capsys.readouterr().err
    assert "recipes/a.yaml:15:1: --configuration huge: no configuration 'huge'" in err, err
    assert "fix: use one of: small, large" in err


def test_evidence_of_a_configuration_other_than_the_default_is_kept_apart(root):
    from stackforge.cli.smoke import evidence_name

    write(root, "a", CONFIGURED)
    loaded = load_recipe(root, "a")
    assert [evidence_name(loaded, c) for c in (None, "small", "large")] == ["a", "a", "a@large"]
    write(root, "b", GOOD)
    assert evidence_name(load_recipe(root, "b"), None) == "b"
    with pytest.raises(UserError, match="no configuration 'x' \\(the recipe declares none\\)") as err:
        evidence_name(load_recipe(root, "b"), "x")
    assert err.value.fix == "drop --configuration" and err.value.exit_code == 2
