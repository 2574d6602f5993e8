"""Fuzz cases for the proxy's API, and how an answer to one is judged: no 5xx, an error body with
each 4xx.

Each case is a request body a client could send, made from a well-formed body of one surface
(`SEEDS`) by a few random mutations (a value of another type or an edge value in place of a
field, a field dropped, a stray field, a container nested or emptied), or its JSON cut short,
corrupted or not UTF-8 at all, sometimes sent to another surface's path. Case i of seed s is
the same on every run (`FUZZ_SEED=s` picks another series, `FUZZ_CASES=n` another length of
the in-process run); a failure names the case, how it was made, its body and the answer.

Two tiers run the same cases:

- in-process (tests/fast/test_fuzz.py): the proxy built in this process in front of
  llama-server stubs (proxy/testing/llama_double.py). 10,000 cases in seconds: what is fuzzed
  is the proxy's own code, validation, routing, the relay and its stream fixes; a stub takes
  what the proxy accepts and answers in llama-server's shape.
- real backends (tests/integration/test_fuzz.py, the session proxy on SmolLM2): a few hundred
  cases, for what a stub cannot show: that nothing the proxy lets through makes llama-server
  fail.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SEED = int(os.environ.get("FUZZ_SEED", "24"))
JSON = {"Content-Type": "application/json"}
HI = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {"name": "read", "parameters": {"type": "object", "properties": {}}},
}
# Well-formed bodies of every surface (proxy/api/surfaces.py), the shapes clients send.
SEEDS: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [
        {"model": "auto", "messages": HI, "max_tokens": 2},
        {"model": "plain", "messages": HI, "max_tokens": 2, "stream": True,
         "stream_options": {"include_usage": True}, "temperature": 0, "top_p": 1, "n": 1},
        {"model": "auto-code", "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "read", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]},
        ], "tools": [TOOL], "tool_choice": "auto", "max_tokens": 2, "stream": True},
        {"model": "gpt-4o-mini", "messages": HI, "max_completion_tokens": 2, "stop": ["\n"]},
    ],
    "/v1/completions": [
        {"model": "auto", "prompt": "def f(", "max_tokens": 2},
        {"model": "ngram", "prompt": ["def f(", "x"], "max_tokens": 2, "stream": True},
    ],
    "/v1/responses": [
        {"model": "auto", "input": "hi", "max_output_tokens": 2},
        {"model": "plain", "instructions": "Be terse.", "max_output_tokens": 2, "stream": True,
         "input": [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}]}],
         "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]},
    ],
    "/v1/messages": [
        {"model": "claude-x", "max_tokens": 2, "messages": HI},
        {"model": "plain", "max_tokens": 2, "stream": True,
         "system": [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                      {"role": "assistant", "content": "Hello"},
                      {"role": "user", "content": "again"}]},
    ],
    "/completion": [
        {"prompt": "def f(", "n_predict": 2},
        {"prompt": "def f(", "n_predict": 2, "stream": True, "model": "draft"},
    ],
    "/infill": [
        {"input_prefix": "def f(", "input_suffix": "\n", "n_predict": 2},
        {"input_prefix": "x = ", "input_suffix": "", "n_predict": 2, "stream": True,
         "input_extra": [{"filename": "a.py", "text": "y = 1\n"}], "prompt": ""},
    ],
    "/tokenize": [{"content": "hello world"}, {"content": ["hi", 3], "model": "ngram"}],
    "/detokenize": [{"tokens": [1, 2, 3]}, {"tokens": [], "model": "plain"}],
    "/apply-template": [{"messages": HI}],
    "/v1/embeddings": [{"input": "hello"}, {"input": ["a", "b"]}],
    "/v1/chat/completions/input_tokens": [{"messages": HI, "model": "auto"}],
    "/v1/responses/input_tokens": [{"input": "hi"}, {"input": [{"role": "user", "content": "x"}]}],
    "/v1/messages/count_tokens": [{"model": "claude-x", "messages": HI}],
}  # fmt: skip
PATHS = sorted(SEEDS)
GENERATING = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/v1/messages": "max_tokens",
    "/completion": "n_predict",
    "/infill": "n_predict",
}
# What the backends answer a well-formed request with: SmolLM2 has no FIM tokens, and neither
# the test backends nor the stubs run with --embeddings (llama-server's own 501s, relayed).
NOT_SUPPORTED = {"/infill", "/v1/embeddings"}

EDGE_VALUES: list[Any] = [
    None, True, False, 0, 1, 2, -1, 10**9, 2**63, -(2**63) - 1, 10**40, 0.5, -0.0, 2.5, 1e308,
    "", "2", "true", "auto", "plain", "ngram", "claude-x", "gpt-9", "text", "user", "tool",
    "\x00", "\ud800", "é😀", "x" * 300, "{", [], {}, [None], [[]], [{}], {"type": "text"},
    {"type": "text", "text": "hi"}, {"role": "user"}, {"role": "user", "content": "hi"},
]  # fmt: skip
FIELDS = sorted(
    {k for seeds in SEEDS.values() for body in seeds for k in body}
    | {"max_tokens", "n", "seed", "logprobs", "response_format", "id_slot", "cache_prompt",
       "previous_response_id", "thinking", "metadata", "parallel_tool_calls", "ignore_eos"}
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One fuzzed request: where it goes, its bytes, and how it was made (for a failure's text)."""

    index: int
    path: str
    data: bytes
    how: str


def edge(rng: random.Random) -> Any:
    """One of EDGE_VALUES, a copy: a later mutation must not change the list's own."""
    return copy.deepcopy(rng.choice(EDGE_VALUES))


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value, edge values often, nesting a little."""
    roll = rng.random()
    if depth >= 2 or roll < 0.6:
        return edge(rng)
    if roll < 0.8:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = [*rng.sample(FIELDS, rng.randint(0, 3)), rng.choice(["type", "role", "text", "x"])]
    return {k: random_json(rng, depth + 1) for k in keys}


def _slots(value: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value, its root included."""
    yield where
    if isinstance(value, dict | list):
        for key, inner in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _slots(inner, (*where, key))


def _mutate(body: Any, rng: random.Random) -> tuple[Any, str]:
    where = rng.choice(list(_slots(body)))
    if not where:
        return random_json(rng), "body replaced"
    parent = body
    for key in where[:-1]:
        parent = parent[key]
    key, old = where[-1], parent[where[-1]]
    op = rng.random()
    if op < 0.45:
        parent[key] = edge(rng) if rng.random() < 0.7 else random_json(rng)
        return body, f"{'.'.join(map(str, where))} = {parent[key]!r:.40}"
    if op < 0.65:
        del parent[key]
        return body, f"{'.'.join(map(str, where))} dropped"
    if op < 0.8 and isinstance(parent, dict):
        extra = rng.choice(FIELDS)
        parent[extra] = random_json(rng)
        return body, f"{'.'.join(map(str, where[:-1]))}.{extra} added"
    if op >= 0.9 and isinstance(old, list):
        parent[key] = [copy.deepcopy(x) for x in old * rng.randint(0, 3)]
        return body, f"{'.'.join(map(str, where))} repeated or emptied"
    parent[key] = [old] if rng.random() < 0.5 else {"type": "text", "text": old}
    return body, f"{'.'.join(map(str, where))} wrapped"


def _corrupt(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    roll = rng.random()
    if roll < 0.35:
        cut = rng.randint(0, max(len(data) - 1, 0))
        return data[:cut], f"cut at byte {cut}"
    if roll < 0.6:
        at = rng.randint(0, len(data))
        junk = rng.choice([b"\xff\xfe", b"\x00", b",", b"}", b"]]", b'"', b"\\", b"NaN"])
        return data[:at] + junk + data[at:], f"{junk!r} at byte {at}"
    if roll < 0.8:
        return rng.randbytes(rng.randint(0, 64)), "random bytes"
    text = data.decode()
    return text.replace(":", ": " * rng.randint(1, 3), 1).encode("utf-16"), "UTF-16"


def case(index: int, seed: int = SEED, paths: list[str] = PATHS) -> Case:
    """Case `index` of series `seed`: the same bytes on every run."""
    rng = random.Random(f"{seed}:{index}")
    path = paths[index % len(paths)]
    source = rng.randrange(len(SEEDS[path]))
    body = copy.deepcopy(SEEDS[path][source])
    how = [f"{path} seed {source}"]
    for _ in range(rng.choices((0, 1, 2, 3), (10, 45, 30, 15))[0]):
        body, step = _mutate(body, rng)
        how.append(step)
    data = json.dumps(body).encode()
    if rng.random() < 0.12:
        data, step = _corrupt(data, rng)
        how.append(step)
    if rng.random() < 0.05:
        path = rng.choice(PATHS)
        how.append(f"sent to {path}")
    return Case(index, path, data, "; ".join(how))


def capped(data: bytes, path: str) -> bytes:
    """A body that could generate, with at most 2 tokens: for real backends, which take their time.

    Token limits the proxy must refuse (0, -1, "2") are left as they are; a large or missing one
    becomes 2, so no case runs long on SmolLM2.
    """
    key = GENERATING.get(path)
    try:
        body = json.loads(data)
    except ValueError:
        return data
    if key is None or not isinstance(body, dict):
        return data
    limit = body.get(key)
    if limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit > 2):
        body[key] = 2
        return json.dumps(body).encode()
    return data


def judged(c: Case, status: int, body: bytes) -> str | None:
    """What is wrong with this answer to case `c`, or None: no 5xx, every 4xx with its error."""
    if status >= 500 and not (status == 501 and c.path in NOT_SUPPORTED):
        return f"{status}"
    if status >= 400:
        try:
            error = json.loads(body)
        except ValueError:
            return f"{status} without a JSON body"
        # OpenAI's {"error": {...}} and Anthropic's {"type": "error", "error": {...}} alike.
        if not isinstance(error, dict) or "error" not in error:
            return f"{status} without an error object"
    return None


def failure(c: Case, problem: str, body: bytes) -> str:
    return f"case {c.index}: {problem} ({c.how}): {c.data[:200]!r} -> {body[:300]!r}"


def verdict(statuses: Counter[str], failures: list[str], cases: int) -> None:
    print(f"\n{cases} cases (FUZZ_SEED={SEED}):", dict(sorted(statuses.items())))
    shown = "\n".join(failures[:10])
    assert not failures, f"{len(failures)} of {cases} cases failed, first ones:\n{shown}"
