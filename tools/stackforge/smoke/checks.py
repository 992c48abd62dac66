"""The smoke rows that sample and compare numbers: a chat request with seed, temperature and ``repeat``; a
``numeric`` row (a command's numbers against a reference file); a ``dump`` row (MATE's Level-10 dump of a command,
replayed by the image's own ``mate replay`` and compared with the run).

Each takes what it needs as plain callables (an HTTP request, a command inside the container), so it runs
unchanged against a fake in the unit tests and against a real container in a smoke run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stackforge import safeio
from stackforge.recipes.model import Chat
from stackforge.recipes.numeric import BadReference, DumpReplay, Logprobs, Numeric, load_reference
from stackforge.smoke.numbers import ANSI, PARSERS, compare, parse_mate_log
from stackforge.smoke.report import RowResult, one_line

#: (status, body text) of one chat request: the body is the request's JSON.
Send = Callable[[dict], tuple[int | None, str]]
#: (exit code, output) of an argv inside the container.
Exec = Callable[..., tuple[int, str]]

#: ``mate list-dumps DIR`` as mate/__main__.py prints a dump: ``  <dir name>: <function> [<status>]``.
DUMP_LINE = re.compile(r"^\s+(\S+): (\S+) \[(\w+)\]\s*$")
#: A dump's directory name as mate/api_logging.py makes it: ``<time>_pid<pid>_<function>_call<NNNN>``.
DUMP_NAME = re.compile(r"^\d{8}_\d{6}_\d+_pid\d+_(.+)_call(\d{4,})$")
#: ``mate replay --dir DUMP``'s verdict for a single dump (mate/__main__.py replay_cmd).
REPLAY_PASSED = "Replay passed - outputs match!"


def content_of(text: str) -> str | None:
    """The assistant's answer of a chat completion body."""
    try:
        return str(safeio.parse_json(text, source="the answer")["choices"][0]["message"]["content"])
    except (safeio.Malformed, KeyError, IndexError, TypeError):
        return None


def status_text(status: int | None, text: str) -> str:
    if status is None:
        return f"nothing (connection failed: {one_line(text, 120)})"
    return f"HTTP {status}" + (f" ({one_line(text, 160)})" if status >= 400 and text else "")


def chat_body(model: str, messages: list[dict], max_tokens: int, temperature: float = 0, seed: int | None = None):
    """An OpenAI chat request; ``seed`` only when given (vLLM then seeds this request's sampling)."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    return body


# -- chat -----------------------------------------------------------------------------------------------


def chat_row(chat: Chat, model: str, send: Send, out: RowResult) -> RowResult:
    """Send the request ``repeat`` times: each must answer 200 (and contain the word); every answer the same."""
    body = chat_body(model, [{"role": "user", "content": chat.prompt}], chat.max_tokens, chat.temperature, chat.seed)
    details: dict[str, Any] = {
        "prompt": chat.prompt,
        "contains": chat.contains,
        "temperature": chat.temperature,
        "seed": chat.seed,
        "max_tokens": chat.max_tokens,
    }
    answers: list[str | None] = []
    for i in range(chat.repeat):
        status, text = send(body)
        answer = content_of(text) if status == 200 else None
        answers.append(answer)
        _keep(details, chat.repeat, answers, status)
        which = f"request {i + 1} of {chat.repeat}" if chat.repeat > 1 else "the chat request"
        if status != 200:
            return out.failed(f"{which} answered {status_text(status, text)}", **details)
        if not answer:
            return out.failed(f"{which} answered no message content: {one_line(text, 200)!r}", **details)
        if chat.contains is not None and chat.contains.lower() not in answer.lower():
            return out.failed(
                f"{'answer ' + str(i + 1) if chat.repeat > 1 else 'the answer'} does not contain "
                f"{chat.contains!r}: {one_line(answer, 200)!r}",
                **details,
            )
    first = answers[0]
    differ = next((i for i, a in enumerate(answers) if a != first), None)
    if differ is not None:
        seeded = f"seed {chat.seed}" if chat.seed is not None else "no seed"
        return out.failed(
            f"answers 1 and {differ + 1} of {chat.repeat} differ ({seeded}, temperature {chat.temperature:g}): "
            f"{one_line(first, 120)!r} vs {one_line(answers[differ], 120)!r}",
            **details,
        )
    return out.passed(**details)


def _keep(details: dict, repeat: int, answers: list[str | None], status: int | None) -> None:
    details["status"] = status
    if repeat > 1:
        details["answers"] = list(answers)
    details["answer"] = answers[-1]


# -- numeric --------------------------------------------------------------------------------------------


def not_checked_reason(reference: str) -> str:
    """Why a numeric row is not run with no checkout: its reference file is the repository's."""
    return (
        f"not checked: no checkout here, and the row's reference file {reference} is read from one "
        "(run smoke in a checkout of the repository, or with --root DIR)"
    )


def numeric_row(
    numeric: Numeric, run: Exec | None, root: Path | None, out: RowResult, chat: tuple[str, Send] | None = None
) -> RowResult:
    """Read the numbers (a command's output, or a chat request's logprobs; ``chat`` is (model, send)) and
    compare them with the reference file."""
    details: dict[str, Any] = {"reference": numeric.reference, "tolerance": numeric.tolerance.model_dump()}
    if root is None:
        return out.skipped(not_checked_reason(numeric.reference))
    try:
        expected = load_reference(root, numeric.reference)
    except BadReference as err:
        return out.failed(str(err), **details)
    if numeric.logprobs is not None:
        if chat is None:
            return out.failed("a logprobs row sends a chat request, and there is no server to send it to")
        values = _logprobs(numeric.logprobs, chat[0], chat[1], details)
    elif run is None:
        return out.failed("a numeric row runs a command in the container, and there is none")
    else:
        values = _command_numbers(numeric, run, details)
    if isinstance(values, str):
        return out.failed(values, **details)
    result = compare(values, expected, numeric.tolerance)
    details.update(result.as_details())
    if not result.ok:
        return out.failed(
            result.reason("the answer's logprobs" if numeric.logprobs else "the command's output"), **details
        )
    return out.passed(**details)


def _command_numbers(numeric: Numeric, run: Exec, details: dict) -> dict[str, float] | str:
    assert numeric.run is not None
    argv = numeric.run.argv
    details.update(argv=argv, format=numeric.format)
    code, text = run(argv, timeout=numeric.run.timeout_s)
    details.update(exit_code=code, output_tail=_tail(text))
    if code != 0:
        return f"`{' '.join(argv)}` exited {code}: {one_line(_last(text))}"
    values = PARSERS[numeric.format](text)
    return f"`{' '.join(argv)}`: {values}" if isinstance(values, str) else values


def _logprobs(req: Logprobs, model: str, send: Send, details: dict) -> dict[str, float] | str:
    """A greedy request with logprobs: {"<i>:<token>": logprob} from choices[0].logprobs.content."""
    body = chat_body(model, [{"role": "user", "content": req.prompt}], req.max_tokens, 0, req.seed)
    body["logprobs"] = True
    details.update(prompt=req.prompt, max_tokens=req.max_tokens, seed=req.seed)
    status, text = send(body)
    details["status"] = status
    if status != 200:
        return f"the logprobs request answered {status_text(status, text)}"
    try:
        content = safeio.parse_json(text, source="the answer")["choices"][0]["logprobs"]["content"]
        values = {f"{i}:{t['token']}": float(t["logprob"]) for i, t in enumerate(content)}
    except (safeio.Malformed, ValueError, KeyError, IndexError, TypeError):
        return f"the answer has no choices[0].logprobs.content[i].logprob: {one_line(text, 200)!r}"
    if not values:
        return "the answer carries no token logprobs"
    details["answer"] = content_of(text)
    return values


# -- dump / replay --------------------------------------------------------------------------------------


def dump_dir(row: str) -> str:
    """A fresh directory inside the container for this row's dumps."""
    return f"/tmp/stackforge-dumps-{re.sub(r'[^A-Za-z0-9_.-]', '-', row)}-{os.urandom(4).hex()}"


def dump_row(dump: DumpReplay, row: str, run: Exec, out: RowResult, where: str | None = None) -> RowResult:
    """Run with the dump level on, list the dumps, replay each, compare each replay's statistics with the run's."""
    where = where or dump_dir(row)
    env = ["env", f"{dump.level_env}={dump.level}", f"{dump.dir_env}={where}"]
    details: dict[str, Any] = {
        "argv": dump.run.argv,
        "env": {dump.level_env: str(dump.level), dump.dir_env: where},
        "tolerance": dump.tolerance.model_dump(),
    }
    code, text = run([*env, *dump.run.argv], timeout=dump.run.timeout_s)
    details["exit_code"] = code
    if code != 0:
        return out.failed(f"`{' '.join(dump.run.argv)}` exited {code}: {one_line(_last(text))}", **details)
    ran = parse_mate_log(text)
    if isinstance(ran, str):
        return out.failed(f"the run: {ran}", **details)
    code, listing = run([*dump.tool, "list-dumps", where], timeout=120)
    dumps = [m.groups() for m in map(DUMP_LINE.match, ANSI.sub("", listing).splitlines()) if m]
    details["dumps"] = [{"dir": d, "function": f, "status": s} for d, f, s in dumps]
    if code != 0 or not dumps:
        return out.failed(
            f"the run wrote no Level-{dump.level} dump into {where} (`{' '.join(dump.tool)} list-dumps` exit {code}: "
            f"{one_line(_last(listing))}); does the command call MATE, and does MATE read {dump.level_env}?",
            **details,
        )
    unfinished = [d for d, _, s in dumps if s != "completed"]
    if unfinished:
        return out.failed(f"dump(s) without outputs (the call did not complete): {', '.join(unfinished)}", **details)
    replays: list[dict] = []
    details["replays"] = replays
    for name, function, _ in dumps:
        failed = _replay(dump, run, f"{where}/{name}", name, function, ran, replays)
        if failed:
            return out.failed(failed, **details)
    return out.passed(**details)


def _replay(
    dump: DumpReplay, run: Exec, path: str, name: str, function: str, ran: dict[str, float], replays: list[dict]
) -> str | None:
    """Replay one dump; the reason it failed, or None."""
    m = DUMP_NAME.match(name)
    call = int(m.group(2)) if m else 1
    argv = ["env", f"{dump.level_env}={dump.replay_level}", *dump.tool, "replay", "--dir", path]
    code, text = run(argv, timeout=dump.run.timeout_s)
    entry: dict[str, Any] = {"dump": name, "function": function, "exit_code": code, "output_tail": _tail(text)}
    replays.append(entry)
    if code != 0 or REPLAY_PASSED not in ANSI.sub("", text):
        return f"`{' '.join(dump.tool)} replay --dir {path}` exited {code}: {one_line(_last(text))}"
    stats = parse_mate_log(text)
    if isinstance(stats, str):
        return f"the replay of {name}: {stats}"
    # the replay is the first call of its process: compare it with the run's call number ``call`` (the run is one
    # process, as MATE numbers each function's calls per process)
    replayed = {f"{function}#{call}{rest}": v for k, v in stats.items() for rest in [_stat_of(k, function, 1)] if rest}
    expected = {k: v for k, v in ran.items() if _stat_of(k, function, call)}
    if not expected:
        return f"the run logged no output statistics for {function} call {call} (the dump {name})"
    result = compare(replayed, expected, dump.tolerance)
    entry.update(result.as_details())
    if not result.ok:
        return f"the replay of {name} differs from the run: {result.reason('the replay')}"
    return None


def _stat_of(name: str, function: str, call: int) -> str | None:
    """``.mean`` or ``[1].max`` when ``name`` is a statistic of that call of ``function``, else None."""
    head = f"{function}#{call}"
    rest = name[len(head) :] if name.startswith(head) else ""
    return rest if rest[:1] in (".", "[") else None


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
