"""Every HTTP surface the proxy relays: how its body is checked, routed and measured, in one table.

A *generating* surface (task source set) is routed like chat: its task class comes from the
classifier (on an OpenAI-chat view of its body) or from the endpoint itself (FIM), the policy
picks the backend measured fastest for that class, the request takes a backend slot, and its
tokens are counted. A *passthrough* surface is answered by any ready backend (the backends share
one model), or the one `model` pins: no classification, no scoreboard, no token counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.api import validation as v
from proxy.api.anthropic import MessagesStreamFix
from proxy.api.billing_header import (
    chat_without_billing,
    messages_without_billing,
    responses_without_billing,
)
from proxy.api.openai_stream import OpenAIStreamEnd
from proxy.api.relay import OPENAI_WIRE, Wire
from proxy.api.responses_stream import ResponsesStreamFix
from proxy.api.text_calls import CallApi
from proxy.tasks import FIM_TASK, TASK_CLASSES

# "classifier": the class of the body; "fim": always FIM; None: passthrough, not routed by speed.
TaskSource = Literal["classifier", "fim"]
View = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def _as_is(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


_TOOL_ITEMS = frozenset(
    {"function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output"}
)


def responses_view(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Responses body as the chat body the classifier reads: instructions, input, tools."""
    messages: list[Any] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        # Tool calls and their outputs too: what the agent did last tells its next answer.
        messages.extend(
            item
            for item in value
            if isinstance(item, dict) and ("role" in item or item.get("type") in _TOOL_ITEMS)
        )
    return {"messages": messages, "tools": body.get("tools")}


def shape_responses(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body as llama-server b11434 takes it: without `additional_tools` items
    (nor Claude Code's billing line, proxy/api/billing_header.py).

    Codex sends its own models' tools (`gpt-*`, its default) as an `additional_tools` input
    item, which llama-server refuses ("Cannot determine type of 'item'"); they are namespaces
    of custom and function tools, of the kinds llama-server skips when they come as `tools`.
    """
    body = responses_without_billing(body)
    items = body.get("input")
    if not isinstance(items, list) or not any(_is_tools_item(i) for i in items):
        return body
    return {**body, "input": [i for i in items if not _is_tools_item(i)]}


def _is_tools_item(item: object) -> bool:
    return isinstance(item, dict) and item.get("type") == "additional_tools"


def messages_view(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """An Anthropic Messages body as a chat body: its text blocks read like OpenAI text parts."""
    system = body.get("system")
    head = [{"role": "system", "content": system}] if system else []
    messages = body.get("messages")
    return {"messages": [*head, *(messages or [])], "tools": body.get("tools")}


@dataclass(frozen=True)
class Surface:
    """One POST endpoint, relayed to the same path on a llama-server."""

    path: str
    endpoint: str  # its name in metrics and logs
    check: v.Check
    task: TaskSource | None = None
    view: View = _as_is
    wire: Wire = OPENAI_WIRE
    # Passthroughs that run on a llama-server slot (embeddings) queue for one like chat does;
    # tokenizing and templating run beside generation and must not wait behind it.
    uses_slot: bool = True
    # Ask llama-server for an event per prompt step while a stream's prompt is processed:
    # Codex gives up on a Responses stream after 5 minutes without an event (a ping comment
    # is none), and a 20 k-token prompt takes longer than that on a CPU.
    stream_progress: bool = False
    # What the body becomes on its way to llama-server, where a client's shape needs it.
    shape: Callable[[dict[str, Any]], dict[str, Any]] = _same
    # The API's own name for the answer's token budget.
    budget_key: str = "max_tokens"
    # Where its requests declare tools and its answers carry calls: tool calls the model
    # writes as text become calls on it (proxy.api.call_repair).
    calls: CallApi | None = None

    @property
    def generates(self) -> bool:
        """Whether the surface generates tokens, so it is routed by measured speed and counted."""
        return self.task is not None

    @property
    def tasks(self) -> tuple[str, ...]:
        """The task classes this surface's requests are routed as."""
        return (FIM_TASK,) if self.task == "fim" else TASK_CLASSES if self.generates else ()

    @property
    def fixed_task(self) -> str | None:
        """The task class the endpoint implies, if the classifier is not asked."""
        return FIM_TASK if self.task == "fim" else None


_ANTHROPIC = Wire(
    anthropic_errors=True, rewriter=lambda body: MessagesStreamFix(str(body.get("model", "")))
)
_INPUT_ONLY = Wire(input_faults_are_400=True)
_WHOLE_CHAT = Wire(assemble="chat", rewriter=lambda body: OpenAIStreamEnd())
_WHOLE_TEXT = Wire(assemble="completions", rewriter=lambda body: OpenAIStreamEnd())

SURFACES: tuple[Surface, ...] = (
    Surface(
        "/v1/chat/completions",
        "chat",
        v.check_chat,
        "classifier",
        wire=_WHOLE_CHAT,
        shape=chat_without_billing,
        calls="chat",
    ),
    Surface("/v1/completions", "completions", v.check_completions, "classifier", wire=_WHOLE_TEXT),
    Surface(
        "/v1/responses",
        "responses",
        v.check_responses,
        "classifier",
        view=responses_view,
        wire=Wire(rewriter=lambda body: ResponsesStreamFix()),
        stream_progress=True,
        shape=shape_responses,
        budget_key="max_output_tokens",
        calls="responses",
    ),
    Surface(
        "/v1/messages",
        "messages",
        v.check_messages,
        "classifier",
        messages_view,
        _ANTHROPIC,
        shape=messages_without_billing,
        calls="messages",
    ),
    Surface("/infill", "infill", v.check_infill, "fim", budget_key="n_predict"),
    Surface("/completion", "completion", v.check_completions, "classifier", budget_key="n_predict"),
    Surface("/tokenize", "tokenize", v.check_tokenize, wire=_INPUT_ONLY, uses_slot=False),
    Surface("/detokenize", "detokenize", v.check_detokenize, wire=_INPUT_ONLY, uses_slot=False),
    Surface(
        "/apply-template",
        "apply-template",
        v.check_chat_messages,
        wire=_INPUT_ONLY,
        uses_slot=False,
    ),
    Surface("/v1/embeddings", "embeddings", v.check_embeddings),
    Surface(
        "/v1/chat/completions/input_tokens",
        "chat-input-tokens",
        v.check_chat_messages,
        wire=_INPUT_ONLY,
        uses_slot=False,
    ),
    Surface(
        "/v1/responses/input_tokens",
        "responses-input-tokens",
        v.check_responses_input,
        wire=_INPUT_ONLY,
        uses_slot=False,
        shape=shape_responses,
    ),
    Surface(
        "/v1/messages/count_tokens",
        "messages-count-tokens",
        v.check_anthropic_messages,
        wire=Wire(anthropic_errors=True, input_faults_are_400=True),
        uses_slot=False,
        shape=messages_without_billing,
    ),
)
