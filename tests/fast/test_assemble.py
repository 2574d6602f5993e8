"""Non-streamed answers assembled from a stream: the shape clients parse, tool calls included."""

from __future__ import annotations

import openai.types as types
import openai.types.chat as chat_types

from proxy.api.assemble import AnswerAssembler


def chunk(
    delta: dict[str, object], finish: str | None = None, **extra: object
) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "plain",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def test_content_usage_and_timings_become_one_chat_completion() -> None:
    a = AnswerAssembler("chat")
    a.feed(chunk({"role": "assistant", "content": None}))
    for piece in ("Hel", "lo", "!"):
        a.feed(chunk({"content": piece}))
    a.feed(chunk({}, "stop", timings={"predicted_n": 3, "predicted_per_second": 9.0}))
    a.feed(
        {
            "id": "chatcmpl-1",
            "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        }
    )
    answer = a.answer()
    parsed = chat_types.ChatCompletion.model_validate(answer)
    assert parsed.choices[0].message.content == "Hello!"
    assert parsed.choices[0].finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.total_tokens == 7
    assert answer["timings"]["predicted_n"] == 3 and answer["object"] == "chat.completion"


def test_tool_call_fragments_are_joined_per_index() -> None:
    a = AnswerAssembler("chat")
    a.feed(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        )
    )
    a.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}))
    a.feed(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "now", "arguments": "{}"},
                    }
                ]
            }
        )
    )
    a.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Rome"}'}}]}))
    a.feed(chunk({}, "tool_calls"))
    message = chat_types.ChatCompletion.model_validate(a.answer()).choices[0].message
    assert message.content is None and message.tool_calls is not None
    first, second = message.tool_calls
    assert isinstance(first, chat_types.ChatCompletionMessageFunctionToolCall)
    assert isinstance(second, chat_types.ChatCompletionMessageFunctionToolCall)
    assert (first.id, first.function.name, first.function.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Rome"}',
    )
    assert second.function.name == "now"


def test_logprobs_and_reasoning_are_kept() -> None:
    a = AnswerAssembler("chat")
    a.feed(chunk({"reasoning_content": "think"}))
    a.feed(
        {
            **chunk({"content": "a"}),
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "a"},
                    "logprobs": {
                        "content": [
                            {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}
                        ]
                    },
                }
            ],
        }
    )
    answer = a.answer()
    assert answer["choices"][0]["message"]["reasoning_content"] == "think"
    assert answer["choices"][0]["logprobs"]["content"][0]["token"] == "a"


def test_text_completion_chunks_become_one_completion() -> None:
    a = AnswerAssembler("completions")
    for piece in ("def ", "f():"):
        a.feed(
            {
                "id": "cmpl-1",
                "created": 1,
                "model": "plain",
                "choices": [{"index": 0, "text": piece, "finish_reason": None}],
            }
        )
    a.feed({"id": "cmpl-1", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    parsed = types.Completion.model_validate(a.answer())
    assert parsed.choices[0].text == "def f():" and parsed.choices[0].finish_reason == "length"
