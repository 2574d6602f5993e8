"""Answers that are calls written as text become each API's calls, whole and streamed
(proxy/api/call_repair.py), on streams recorded from a real llama-server (b11434,
Qwen2.5-Coder-0.5B, temperature 0, tests/data/text_calls/): `call` is a fenced ```json call of
the declared write_file, `bare` the same as bare JSON, `undeclared` a fenced call of a tool
nobody declared, `prose` a sentence. Every other answer passes byte for byte."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from proxy.api.anthropic import MessagesStreamFix
from proxy.api.assemble import AnswerAssembler
from proxy.api.call_repair import KEEPALIVE_S, CallRepair
from proxy.api.openai_stream import OpenAIStreamEnd
from proxy.api.responses_stream import ResponsesStreamFix
from proxy.api.rewrite import StreamRewriter
from proxy.api.text_calls import CallApi, ToolCatalog
from proxy.sse import SseSplitter
from tests.helpers import ROOT

DATA = ROOT / "tests/data/text_calls"
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
TOOLS: dict[CallApi, list[dict[str, Any]]] = {
    "chat": [{"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}}],
    "messages": [{"name": "write_file", "input_schema": SCHEMA}],
    "responses": [{"type": "function", "name": "write_file", "parameters": SCHEMA}],
}
INNER: dict[CallApi, Callable[[], StreamRewriter]] = {
    "chat": OpenAIStreamEnd,
    "messages": lambda: MessagesStreamFix("coder"),
    "responses": ResponsesStreamFix,
}
APIS: tuple[CallApi, ...] = ("chat", "messages", "responses")
WRITTEN = {"path": "hello.txt", "content": "Hello, world!"}


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def repair(api: CallApi, clock: Callable[[], float] | None = None) -> CallRepair:
    found = ToolCatalog.of(api, {"tools": TOOLS[api]})
    assert found is not None
    return CallRepair(found) if clock is None else CallRepair(found, clock=clock)


def recorded(api: str, answer: str) -> bytes:
    return (DATA / f"{api}-{answer}.sse").read_bytes()


def pieces(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def run(rewriter: StreamRewriter, chunks: list[bytes]) -> bytes:
    return b"".join(rewriter.feed(c) for c in chunks) + rewriter.flush()


def payloads(raw: bytes) -> list[dict[str, Any]]:
    events = SseSplitter(b"\n\n").feed(raw)
    out = []
    for event in events:
        for line in event.split(b"\n"):
            if line.startswith(b"data: {"):
                out.append(json.loads(line[6:]))
    return out


def calls_seen(api: CallApi, raw: bytes) -> tuple[list[tuple[str, dict[str, Any]]], str, str]:
    """What a client makes of a stream: its calls (name, arguments), its text, how it ended."""
    events = payloads(raw)
    if api == "chat":
        assembler = AnswerAssembler("chat")
        for event in events:
            assembler.feed(event)
        choice = assembler.answer()["choices"][0]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in choice["message"].get("tool_calls", [])
        ]
        return calls, choice["message"]["content"] or "", choice["finish_reason"]
    if api == "messages":
        blocks: dict[int, dict[str, Any]] = {}
        stop = ""
        for e in events:
            if e["type"] == "content_block_start":
                blocks[e["index"]] = {**e["content_block"], "json": ""}
            elif e["type"] == "content_block_delta":
                delta = e["delta"]
                block = blocks[e["index"]]
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                else:
                    block["json"] += delta["partial_json"]
            elif e["type"] == "message_delta":
                stop = e["delta"]["stop_reason"]
        ordered = [blocks[i] for i in sorted(blocks)]
        assert sorted(blocks) == list(range(len(blocks))), "block indices run 0, 1, 2, ..."
        calls = [(b["name"], json.loads(b["json"])) for b in ordered if b["type"] == "tool_use"]
        text = "".join(b.get("text", "") for b in ordered if b["type"] == "text")
        return calls, text, stop
    (completed,) = [e for e in events if e["type"] == "response.completed"]
    output = completed["response"]["output"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["id"] for i in done] == [i["id"] for i in output], "items done = items completed"
    calls = [
        (i["name"], json.loads(i["arguments"])) for i in output if i["type"] == "function_call"
    ]
    text = "".join(p["text"] for i in output if i["type"] == "message" for p in i["content"])
    return calls, text, completed["response"]["status"]


ENDS = {"chat": "tool_calls", "messages": "tool_use", "responses": "completed"}


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("answer", ["call", "bare"])
@pytest.mark.parametrize("size", [7, 100, 100_000])
def test_a_streamed_call_written_as_text_reaches_the_client_as_a_call(
    api: CallApi, answer: str, size: int
) -> None:
    fixing = repair(api)
    raw = run(fixing.stream(INNER[api]()), pieces(recorded(api, answer), size))
    calls, text, end = calls_seen(api, raw)
    assert calls == [("write_file", WRITTEN)] and text == "" and end == ENDS[api]
    assert fixing.repaired == 1
    assert b": specproxy: 1 tool call(s) written as text" in raw


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("answer", ["undeclared", "prose"])
@pytest.mark.parametrize("size", [7, 100_000])
def test_every_other_answer_streams_byte_for_byte(api: CallApi, answer: str, size: int) -> None:
    chunks = pieces(recorded(api, answer), size)
    fixing = repair(api)
    assert run(fixing.stream(INNER[api]()), chunks) == run(INNER[api](), chunks)
    assert fixing.repaired == 0


TEXT_EVENTS = (b'"content":"', b'"text_delta"', b"response.output_text.delta")


@pytest.mark.parametrize("api", APIS)
def test_prose_is_never_held(api: CallApi) -> None:
    # Fed one event at a time, each token of prose reaches the client with the event that
    # carries it, as without repair: no added first-token delay. (An empty text block's start
    # waits for its first token.)
    events = [e + b"\n\n" for e in recorded(api, "prose").split(b"\n\n") if e]
    plain, fixed = INNER[api](), repair(api).stream(INNER[api]())
    sent = fixed_sent = b""
    tokens = 0
    for event in events:
        sent += plain.feed(event)
        fixed_sent += fixed.feed(event)
        if any(marker in event for marker in TEXT_EVENTS):
            tokens += 1
            assert fixed_sent == sent
    assert tokens > 10
    assert fixed_sent + fixed.flush() == sent + plain.flush()


@pytest.mark.parametrize("api", APIS)
def test_a_call_cut_by_the_token_budget_is_released_as_text(api: CallApi) -> None:
    raw = recorded(api, "call").decode()
    cut = {
        "chat": ('"finish_reason":"stop"', '"finish_reason":"length"'),
        "messages": ('"stop_reason":"end_turn"', '"stop_reason":"max_tokens"'),
        "responses": ("event: response.completed", "event: response.incomplete"),
    }[api]
    raw = raw.replace(*cut)
    if api == "responses":
        raw = raw.replace('"type":"response.completed"', '"type":"response.incomplete"')
    chunks = [raw.encode()]
    fixing = repair(api)
    assert run(fixing.stream(INNER[api]()), chunks) == run(INNER[api](), chunks)
    assert fixing.repaired == 0


@pytest.mark.parametrize("api", APIS)
def test_a_held_answer_keeps_the_stream_alive_and_still_becomes_a_call(api: CallApi) -> None:
    clock = Clock()
    fixing = repair(api, clock)
    stream = fixing.stream(INNER[api]())
    events = [e + b"\n\n" for e in recorded(api, "call").split(b"\n\n") if e]
    out = b""
    quiet = 0
    for event in events:
        clock.now += KEEPALIVE_S / 2
        got = stream.feed(event)
        quiet = 0 if got else quiet + 1
        assert quiet < 3, "never longer than KEEPALIVE_S without an event"
        out += got
    out += stream.flush()
    calls, text, end = calls_seen(api, out)
    assert calls == [("write_file", WRITTEN)] and text == "" and end == ENDS[api]


def whole_answers(text: str) -> dict[CallApi, dict[str, Any]]:
    """The non-streamed answers of each API, in llama-server's shapes, carrying `text`."""
    return {
        "chat": {
            "id": "chatcmpl-1",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        },
        "messages": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
        },
        "responses": {
            "id": "resp_1",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "annotations": [], "text": text}],
                }
            ],
        },
    }


FENCED = (
    '```json\n{\n  "name": "write_file",\n  "arguments": {\n    "path": "hello.txt",\n'
    '    "content": "Hello, world!"\n  }\n}\n```'
)


@pytest.mark.parametrize("api", APIS)
def test_a_whole_answer_that_is_a_call_becomes_one(api: CallApi) -> None:
    fixing = repair(api)
    answer = fixing.whole(whole_answers(FENCED)[api])
    assert fixing.repaired == 1
    if api == "chat":
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] == "write_file"
        assert json.loads(call["function"]["arguments"]) == WRITTEN
    elif api == "messages":
        assert answer["stop_reason"] == "tool_use"
        (block,) = answer["content"]
        assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
        assert block["name"] == "write_file" and block["input"] == WRITTEN
    else:
        (item,) = answer["output"]
        assert item["type"] == "function_call" and item["status"] == "completed"
        assert item["name"] == "write_file" and json.loads(item["arguments"]) == WRITTEN
        assert item["call_id"].startswith("call_") and item["id"].startswith("fc_")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "text", [FENCED.replace("write_file", "greet"), "A Python list holds items.", FENCED[:-9]]
)
def test_any_other_whole_answer_is_left_exactly_as_written(api: CallApi, text: str) -> None:
    answer = whole_answers(text)[api]
    fixing = repair(api)
    assert fixing.whole(copy.deepcopy(answer)) == answer
    assert fixing.repaired == 0
