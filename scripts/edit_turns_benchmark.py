"""Real agents' edit turns (tests/data/edit_turns/) replayed through specproxy: each turn pinned
to plain, ngram (ngram-mod) and copy (copy-json), and through auto, side by side in one run.

    .venv/bin/python scripts/edit_turns_benchmark.py [--rounds 1] [--max-tokens 700] [--out DIR]

It starts `specproxy serve` on the default config with one more strategy on its `coder` engine,
`copy` (copy-json), and start-up calibration off: auto starts from --scoreboard (a calibration
of the default) and learns from the pinned requests before it (they are measured as any request
is), as a running proxy would have. Each turn is sent as its
agent sent it (Claude Code's Messages, Codex's Responses, the others' chat), not streamed, at
temperature 0, its answer capped at --max-tokens. The engine's n-gram memory is shared by every
request, so each mode gets its own copy of the turn with the file's names renamed
(proxy/workload.py `fresh_word`): text new to the engine, as an agent's next file is. Modes take
turns, the order rotating. Decode tokens/s, acceptance and draft length come from the proxy's
log line of each request. Prints each request, then per mode the geometric mean of its decode
speed over plain's on the same turns with a 90 % bootstrap interval over turns.

With --prefill each turn's answer is begun for the model with the edit's opening, up to where the
file itself starts (loadtests/edit_turns.py `edit_opening`: the tool call in Qwen2.5's format up
to the new file's content or the patch's first hunk; aider's file name and fence), as the
assistant's unfinished message: the model then writes the edit itself, which an agent's edit
turn is for and which the 1.5B, left to itself, mostly does not (it reads the file again or
answers in a few words). "written" is the share of the expected edit the answer reproduced
before it first differed.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.edit_replay import as_written  # noqa: E402
from loadtests.edit_sessions import assistant_says  # noqa: E402
from loadtests.edit_turns import EditTurn, edit_opening, load_all, written  # noqa: E402
from proxy.testing.running_proxy import running_proxy  # noqa: E402
from proxy.workload import fresh_word, rename_identifiers  # noqa: E402

MODES = ("plain", "ngram", "copy", "auto")
DEFAULT_CONFIG = ROOT / "proxy" / "defaults" / "cpu.yaml"


def config_with_copy(path: Path) -> Path:
    """The default config with a copy-json strategy on the ngram strategy's engine."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    ngram = next(b for b in config["backends"] if b["name"] == "ngram")
    config["backends"].append({**ngram, "name": "copy", "ngram_variant": "copy-json"})
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def defined_names(*sources: str) -> set[str]:
    """The functions and classes the file defines, before and after the edit."""
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
    return names


def renamed(value: Any, names: set[str], word: str) -> Any:
    """Every string in a JSON value with the names renamed (inside strings: a serialized
    body's escapes, `\\n` before a name, would hide it)."""
    if isinstance(value, str):
        return rename_identifiers(value, names, word)
    if isinstance(value, list):
        return [renamed(v, names, word) for v in value]
    if isinstance(value, dict):
        return {k: renamed(v, names, word) for k, v in value.items()}
    return value


def request_body(
    turn: EditTurn, mode: str, word: str, max_tokens: int, prefill: bool = False
) -> dict[str, Any]:
    """The turn as its agent sent it, on its own copy of the names, for one mode; with
    prefill, the assistant's answer begun with the edit's opening."""
    names = defined_names(turn.file_before, turn.file_after)
    body: dict[str, Any] = renamed(turn.body, names, word)
    if prefill:
        key = "input" if turn.surface.endswith("/responses") else "messages"
        opening = renamed(edit_opening(turn), names, word)
        body[key] = [*body[key], assistant_says(turn.surface, opening)]
        # Not parsed as a tool call: an edit cut at --max-tokens, or one the model ends off the
        # format, is a 500 from llama-server's tool-call parser, and its timings are lost.
        # Messages spells it {"type": "none"}; our build's patch 0009 keeps it (upstream drops it).
        surface_none = {"type": "none"} if turn.surface.endswith("/messages") else "none"
        body["tool_choice"] = surface_none
    body["model"] = mode
    body["stream"] = False
    body["temperature"] = 0
    body.pop("stream_options", None)
    cap = "max_output_tokens" if turn.surface.endswith("/responses") else "max_tokens"
    body[cap] = max_tokens
    if turn.surface.endswith("/chat/completions"):
        body.pop("max_completion_tokens", None)
    return body


def written_share(turn: EditTurn, names: set[str], word: str, answer: str) -> float:
    """The share of the expected edit, after its opening, that the answer reproduced before it
    first differed (the answer holds the opening too: servers return a prefill with it)."""
    opening = renamed(edit_opening(turn), names, word)
    expected = renamed(written(turn), names, word)[len(opening) :]
    text = answer[len(opening) :] if answer.startswith(opening) else answer
    same = 0
    while same < min(len(text), len(expected)) and text[same] == expected[same]:
        same += 1
    return same / len(expected) if expected else 0.0


def logged(log: Path, request_id: str) -> dict[str, Any]:
    """The proxy's log line of one request."""
    for line in log.read_text().splitlines():
        if line.startswith("{") and f'"{request_id}"' in line:
            entry = json.loads(line)
            if entry.get("event") == "request" and entry.get("request_id") == request_id:
                return dict(entry)
    raise LookupError(f"no log line for request {request_id}")


def interval(ratios: list[float], rounds: int = 2000) -> tuple[float, float, float]:
    """Geometric mean of ratios and its 90 % bootstrap interval."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(0)
    means = sorted(sum(rng.choice(logs) for _ in logs) / len(logs) for _ in range(rounds))
    mean = sum(logs) / len(logs)
    return math.exp(mean), math.exp(means[rounds // 20]), math.exp(means[-rounds // 20 - 1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="times every turn is replayed")
    parser.add_argument("--max-tokens", type=int, default=700, help="of each edit answer")
    parser.add_argument("--agents", default="", help="comma-separated (default: every one)")
    parser.add_argument(
        "--prefill",
        action="store_true",
        help="begin each answer with the edit's opening, so the model writes the edit",
    )
    parser.add_argument("--out", type=Path, default=Path("edit-turns-results"))
    parser.add_argument(
        "--scoreboard",
        type=Path,
        help="a saved scoreboard (a calibration of the default) auto starts from, copied",
    )
    args = parser.parse_args()
    turns = [t for t in load_all() if not args.agents or t.agent in args.agents.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = config_with_copy(Path(tmp) / "config.yaml")
        log = args.out / "proxy.log"
        scoreboard = Path(tmp) / "scoreboard.json"
        if args.scoreboard is not None:
            shutil.copyfile(args.scoreboard, scoreboard)
        with running_proxy(
            config,
            log,
            1800,
            inherit_env=True,
            SPECPROXY_CALIBRATION_REQUESTS="0",
            SPECPROXY_SCOREBOARD_FILE=str(scoreboard),
        ) as proxy:
            n = 0
            for round_ in range(args.rounds):
                for i, turn in enumerate(turns):
                    # Pinned modes first (rotating), auto last: it routes by what they measured.
                    shift = (i + round_) % 3
                    order = [*MODES[:3][shift:], *MODES[:3][:shift], "auto"]
                    for mode in order:
                        word = fresh_word(n)
                        body = request_body(turn, mode, word, args.max_tokens, args.prefill)
                        n += 1
                        resp = requests.post(f"{proxy.url}{turn.surface}", json=body, timeout=3600)
                        entry = logged(log, resp.headers.get("X-Request-Id", ""))
                        share = None
                        if resp.status_code == 200:
                            text = as_written(turn.surface, resp.json())
                            answers.append({"agent": turn.agent, "mode": mode, "answer": text})
                        if resp.status_code == 200 and args.prefill:
                            names = defined_names(turn.file_before, turn.file_after)
                            share = round(written_share(turn, names, word, text), 3)
                        row = {
                            "agent": turn.agent,
                            "round": round_,
                            "mode": mode,
                            "status": resp.status_code,
                            "written": share,
                            **{
                                k: entry.get(k)
                                for k in (
                                    "backend",
                                    "task",
                                    "route",
                                    "tokens",
                                    "tokens_per_s",
                                    "acceptance",
                                    "draft_n_max",
                                    "prompt_tokens",
                                    "cached_tokens",
                                )
                            },
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    (args.out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # What each answer said: what "written" compared, to read where an answer went its own way.
    (args.out / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    report(rows)
    return 0


def report(rows: list[dict[str, Any]]) -> None:
    """Per mode: decode speed over plain's on the same turns, and acceptance."""
    speed = {
        (r["agent"], r["round"], r["mode"]): r["tokens_per_s"]
        for r in rows
        if r["status"] == 200 and r["tokens_per_s"]
    }
    head = (
        "| mode | turns | decode vs plain (geo. mean) | 90 % interval | decode t/s | acceptance "
        "| written | routed to |"
    )
    print(f"\n{head}")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for mode in MODES:
        pairs = [
            (speed[(a, k, mode)], speed[(a, k, "plain")])
            for (a, k, m) in speed
            if m == mode and (a, k, "plain") in speed
        ]
        if not pairs:
            continue
        mean, low, high = interval([s / p for s, p in pairs])
        mine = [r for r in rows if r["mode"] == mode and r["status"] == 200]
        accepted = [r["acceptance"] for r in mine if r["acceptance"] is not None]
        acc = f"{sum(accepted) / len(accepted):.0%}" if accepted else "-"
        where = sorted({f"{r['backend']}" for r in mine})
        tps = sum(s for s, _ in pairs) / len(pairs)
        shares = [r["written"] for r in mine if r.get("written") is not None]
        wrote = f"{sum(shares) / len(shares):.0%}" if shares else "-"
        cells = [mode, str(len(pairs)), f"{mean:.2f}x", f"{low:.2f}-{high:.2f}", f"{tps:.1f}"]
        cells += [acc, wrote]
        print("| " + " | ".join([*cells, ", ".join(where)]) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
