"""The stand-in ``vllm serve``: a real HTTP server on loopback, run as a subprocess (no engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "standin_vllm_serve.py"
STARTED = re.compile(r"Starting vLLM API server on http://127\.0\.0\.1:(\d+)")


@dataclass
class Running:
    proc: subprocess.Popen
    port: int
    lines: list[str]

    def get(self, path: str) -> tuple[int, dict]:
        return _call(urllib.request.Request(f"http://127.0.0.1:{self.port}{path}"))

    def chat(self, model: str, prompt: str) -> tuple[int, dict]:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]}).encode()
        return _call(
            urllib.request.Request(
                f"http://127.0.0.1:{self.port}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
        )


def _call(req: urllib.request.Request) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _start(*argv: str, fail: str = "", env: dict | None = None) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if k != "VLLM_ATTENTION_BACKEND"}
    full_env.update({"STANDIN_SERVE_FAIL": fail, **(env or {})})
    return subprocess.Popen(
        [sys.executable, "-u", str(STANDIN), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
    )


@contextmanager
def serving(*argv: str, fail: str = "", env: dict | None = None) -> Iterator[Running]:
    proc = _start("Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "0", *argv, fail=fail, env=env)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            found = STARTED.search(line)
            if found:
                yield Running(proc, int(found.group(1)), lines)
                break
        else:
            pytest.fail("the server exited before listening:\n" + "".join(lines))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_models_chat_and_backend_from_the_flag():
    with serving("--served-model-name", "qwen3-8b", "--attention-backend", "TRITON_ATTN") as srv:
        assert any("Using TRITON_ATTN backend." in line for line in srv.lines)
        status, models = srv.get("/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == ["qwen3-8b"]
        status, answer = srv.chat("qwen3-8b", "What is the capital of China? One word.")
        assert status == 200 and answer["choices"][0]["message"]["content"] == "Beijing"
        assert srv.chat("qwen3-8b", "Repeat after me: Lantern")[1]["choices"][0]["message"]["content"] == "Lantern"
        status, err = srv.chat("Qwen/Qwen3-8B", "hi")  # not a served name
        assert status == 404 and "does not exist" in err["error"]["message"]
        assert srv.get("/v1/nope")[0] == 404


def test_backend_from_the_env_var_when_no_flag():
    with serving(env={"VLLM_ATTENTION_BACKEND": "FLASHMLA"}) as srv:
        assert any("Using FLASHMLA backend." in line for line in srv.lines)


def test_sigterm_stops_it():
    with serving() as srv:
        srv.proc.terminate()
        assert srv.proc.wait(timeout=10) == 0


@pytest.mark.parametrize(("fail", "status", "content"), [("wrong-answer", 200, "Nowhere"), ("status:503", 503, None)])
def test_failure_modes_of_answers(fail, status, content):
    with serving(fail=fail) as srv:
        got, body = srv.chat("Qwen/Qwen3-8B", "What is the capital of China?")
        assert got == status
        if content:
            assert body["choices"][0]["message"]["content"] == content


def test_die_after_n_requests():
    with serving(fail="die-after:2") as srv:
        assert srv.chat("Qwen/Qwen3-8B", "one")[0] == 200
        assert srv.chat("Qwen/Qwen3-8B", "two")[0] == 200
        assert srv.proc.wait(timeout=10) == 1
        rest = srv.proc.stdout.read() if srv.proc.stdout else ""
        assert "EngineCore died unexpectedly" in rest


def test_never_ready_never_listens():
    proc = _start("m", "--port", "0", fail="never-ready")
    try:
        deadline = time.monotonic() + 5
        out = ""
        assert proc.stdout is not None
        while time.monotonic() < deadline and "Loading weights" not in out:
            out += proc.stdout.readline()
        assert "Loading weights" in out and "Starting vLLM API server" not in out
        time.sleep(0.5)
        assert proc.poll() is None  # still "loading"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unknown_option_and_help():
    proc = subprocess.run(
        [sys.executable, str(STANDIN), "m", "--max-model-length", "4"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unrecognized arguments: --max-model-length" in proc.stderr
    full = subprocess.run([sys.executable, str(STANDIN), "--help=all"], capture_output=True, text=True).stdout
    assert "--gpu-memory-utilization" in full and "--diffusion-config" in full
    bad = subprocess.run(
        [sys.executable, str(STANDIN), "m"],
        capture_output=True,
        text=True,
        env={**os.environ, "STANDIN_SERVE_FAIL": "explode"},
    )
    assert bad.returncode != 0 and "unknown failure mode 'explode'" in bad.stderr


def _sampled(srv: Running, prompt: str, **params) -> str:
    body = json.dumps({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": prompt}], **params})
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.port}/v1/chat/completions", data=body.encode(), headers={"Content-Type": "x"}
    )
    status, answer = _call(req)
    assert status == 200, answer
    return str(answer["choices"][0]["message"]["content"])


def test_sampling_is_reproducible_with_a_seed_only():
    prompt = "What is the capital of China?"
    with serving() as srv:
        assert _sampled(srv, prompt, temperature=0, seed=7) == "Beijing"  # greedy: the seed changes nothing
        seeded = [_sampled(srv, prompt, temperature=0.8, seed=7, max_tokens=12) for _ in range(3)]
        assert seeded[0].startswith("Beijing ") and len(seeded[0].split()) == 12 and len(set(seeded)) == 1
        assert _sampled(srv, prompt, temperature=0.8, seed=8, max_tokens=12) != seeded[0]
        unseeded = {_sampled(srv, prompt, temperature=0.8, max_tokens=12) for _ in range(4)}
        assert len(unseeded) > 1


def test_ignore_seed_samples_differently_each_time():
    with serving(fail="ignore-seed") as srv:
        answers = {
            _sampled(srv, "What is the capital of China?", temperature=0.8, seed=7, max_tokens=12) for _ in range(4)
        }
        assert len(answers) > 1
        assert _sampled(srv, "What is the capital of China?", temperature=0, seed=7) == "Beijing"


def test_logprobs_come_in_vllms_shape_and_are_fixed_for_a_greedy_request():
    body = {"messages": [{"role": "user", "content": "Name a city in China."}], "logprobs": True, "seed": 1}
    with serving() as srv:
        req = urllib.request.Request(
            f"http://127.0.0.1:{srv.port}/v1/chat/completions",
            data=json.dumps({"model": "Qwen/Qwen3-8B", **body}).encode(),
            headers={"Content-Type": "application/json"},
        )
        first, second = _call(req)[1], _call(req)[1]
        content = first["choices"][0]["logprobs"]["content"]
        assert [t["token"] for t in content] == ["China"] and -3 <= content[0]["logprob"] <= 0
        assert first["choices"][0]["logprobs"] == second["choices"][0]["logprobs"]
        assert _call(srv_request(srv, "hi"))[1]["choices"][0]["logprobs"] is None  # not asked for


def srv_request(srv: Running, prompt: str) -> urllib.request.Request:
    data = json.dumps({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": prompt}]}).encode()
    return urllib.request.Request(f"http://127.0.0.1:{srv.port}/v1/chat/completions", data=data)


def test_options_are_vllms_from_the_facts():
    from tests.fixtures import facts

    full = subprocess.run([sys.executable, str(STANDIN), "--help=all"], capture_output=True, text=True).stdout
    groups = facts.vllm_serve()["serve"]["groups"]
    flags = [f for g in groups for o in g["options"] for f in o["flags"]]
    assert {"--quantization", "-q", "--speculative-config", "--trust-remote-code", "--attention-backend"} <= set(flags)
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", full), flag
    assert "--no-enforce-eager" in full and "--no-trust-remote-code" in full  # BooleanOptionalAction, as vLLM's
    sources = facts.upstream("vllm")["serve"]["sources"]
    assert all(o["source"] in sources for g in groups for o in g["options"])
    bad = subprocess.run(
        [sys.executable, str(STANDIN), "m", "--speculative-config", "{not json"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--speculative-config" in bad.stderr


def test_mtp_lines_only_with_an_mtp_speculative_config():
    spec = '{"method": "mtp", "num_speculative_tokens": 6}'
    with serving("--speculative-config", spec) as srv:
        mtp = [line for line in srv.lines if "Detected MTP model." in line]
        assert [line.split("] ", 1)[1].strip() for line in mtp] == [
            "Detected MTP model. Sharing target model embedding weights with the draft model.",
            "Detected MTP model. Sharing target model lm_head weights with the draft model.",
        ]
        assert mtp[0].startswith("(EngineCore pid=") and "[llm_base_proposer.py:" in mtp[0]
        assert any("'num_speculative_tokens': 6" in line for line in srv.lines if "non-default args" in line)
    with serving() as srv:
        assert not any("MTP" in line for line in srv.lines)


def test_access_lines_have_uvicorns_shape():
    with serving() as srv:
        assert srv.chat("Qwen/Qwen3-8B", "hi")[0] == 200
        assert srv.chat("nope", "hi")[0] == 404
        time.sleep(0.2)
        srv.proc.terminate()
        rest = srv.proc.stdout.read() if srv.proc.stdout else ""
    access = [line for line in rest.splitlines() if "INFO:     127.0.0.1:" in line]
    assert re.fullmatch(
        r'\(APIServer pid=\d+\) INFO:     127\.0\.0\.1:\d+ - "POST /v1/chat/completions HTTP/1\.1" 200 OK', access[0]
    ), access
    assert access[1].endswith('"POST /v1/chat/completions HTTP/1.1" 404 Not Found')


def test_seq_tot_kills_the_engine_at_the_fourth_user_turn_and_keeps_serving_500():
    def turns(srv: Running, n: int) -> int:
        messages = []
        for _ in range(n):
            messages += [
                {"role": "user", "content": "Name one more city in China."},
                {"role": "assistant", "content": "x"},
            ]
        body = json.dumps({"model": "Qwen/Qwen3-8B", "messages": messages[:-1]}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{srv.port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        return _call(req)[0]

    with serving(fail="seq-tot") as srv:
        assert [turns(srv, n) for n in (1, 2, 3)] == [200, 200, 200]
        assert turns(srv, 4) == 500
        status, body = srv.chat("Qwen/Qwen3-8B", "one turn")  # the engine is dead: every request fails now
        assert status == 500 and "EngineCore encountered an issue" in body["error"]["message"]
        time.sleep(0.2)
        srv.proc.terminate()
        rest = srv.proc.stdout.read() if srv.proc.stdout else ""
    errors = [line for line in rest.splitlines() if " ERROR " in line]
    assert [e.split("] ", 1)[1] for e in errors] == [
        "EngineCore encountered a fatal error.",
        "AttributeError: 'ChunkedContextMetadata' object has no attribute 'seq_tot'",
        "AsyncLLM output_handler failed.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
        "the root cause.",
    ]
    assert errors[1].startswith("(EngineCore pid=") and "[core.py:1348]" in errors[1]
    assert errors[3].startswith("(APIServer pid=") and "[async_llm.py:744]" in errors[3]
    assert rest.count('"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error') == 2
