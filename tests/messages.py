"""A conversation of one user turn, typed as the OpenAI and Anthropic clients take it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anthropic.types import MessageParam
    from openai.types.chat import ChatCompletionMessageParam


def openai_messages(text: str) -> list[ChatCompletionMessageParam]:
    """`text` as the one user message of an OpenAI chat request."""
    return [{"role": "user", "content": text}]


def anthropic_messages(text: str) -> list[MessageParam]:
    """`text` as the one user message of an Anthropic Messages request."""
    return [{"role": "user", "content": text}]
