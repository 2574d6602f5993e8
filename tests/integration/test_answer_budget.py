"""A client that sends no answer budget (Codex sends none) gets default_answer_tokens: an answer
that would run on ends with the API's normal `length` finish, from a real llama-server, read by
the official OpenAI client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.messages import openai_messages
from tests.subprocess_proxy import RunningProxy, openai_client, proxy_on

BUDGET = 24
CONFIG = f"""
default_answer_tokens: {BUDGET}
backends:
  - {{name: plain, kind: plain, model: smollm2-135m, threads: 1, ctx_size: 2048}}
"""
STORY = "Write a very long story about a dragon who learns to write Python, chapter by chapter."


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """SmolLM2-135M behind a proxy whose default answer budget is small."""
    with proxy_on(CONFIG, tmp_path_factory.mktemp("budget")) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_without_max_tokens_ends_with_length(budgeted: RunningProxy, stream: bool) -> None:
    with openai_client(budgeted.url) as client:
        messages = openai_messages(STORY)
        if not stream:
            answer = client.chat.completions.create(
                model="plain",
                messages=messages,
                temperature=0,
            )
            assert answer.choices[0].finish_reason == "length"
            assert answer.usage is not None and answer.usage.completion_tokens == BUDGET
            return
        chunks = list(
            client.chat.completions.create(
                model="plain",
                messages=messages,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens == BUDGET


def test_responses_without_max_output_tokens_ends_at_the_budget(budgeted: RunningProxy) -> None:
    # Codex's requests: no max_output_tokens.
    with openai_client(budgeted.url) as client:
        response = client.responses.create(model="plain", input=STORY, temperature=0)
    assert response.usage is not None and response.usage.output_tokens == BUDGET
