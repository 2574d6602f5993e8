"""A stream's or answer's prompt counts read from usage where llama-server sends no timings
(its Messages surface): the cached part counted, in each API's own convention."""

from __future__ import annotations

import json
from collections.abc import Mapping

from proxy.tokens import StreamTally, counts_from_usage


def event(name: str, data: Mapping[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def test_a_messages_stream_counts_its_cached_prompt() -> None:
    # llama-server b11434's Messages stream: the prompt's counts in message_start only.
    tally = StreamTally()
    start = {
        "type": "message_start",
        "message": {
            "usage": {"cache_read_input_tokens": 17204, "input_tokens": 1396, "output_tokens": 0}
        },
    }
    tally.scan(event("message_start", start))
    tally.scan(event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 21}}))
    assert tally.counts() == {"prompt_n": 1396, "cache_n": 17204, "predicted_n": 21}


def test_responses_and_chat_count_the_cached_tokens_inside_their_input() -> None:
    responses = {
        "usage": {
            "input_tokens": 41,
            "output_tokens": 3,
            "input_tokens_details": {"cached_tokens": 40},
        }
    }
    chat = {
        "usage": {
            "prompt_tokens": 41,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 40},
        }
    }
    for answer in (responses, chat):
        assert counts_from_usage(answer) == {"predicted_n": 3, "prompt_n": 1, "cache_n": 40}


def test_usage_without_cache_figures_counts_no_cache() -> None:
    assert counts_from_usage({"usage": {"input_tokens": 41, "output_tokens": 3}}) == {
        "predicted_n": 3,
        "prompt_n": 41,
    }
