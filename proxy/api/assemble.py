"""Whole answers assembled from llama-server's stream, so a client that leaves stops generation.

llama-server b11434 keeps generating a non-streamed answer whose client has gone (it notices a
closed connection only when it writes), so an abandoned request would hold a slot, and the
device, to the end. The proxy therefore always streams upstream and builds the non-streamed
answer itself: content, reasoning, tool calls (their argument fragments joined per index),
logprobs, finish reason, usage and llama.cpp's timings, in the shape llama-server answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

AnswerKind = Literal["chat", "completions"]


@dataclass
class _Choice:
    index: int
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] = field(default_factory=list)
    has_logprobs: bool = False
    finish_reason: str | None = None
    role: str = "assistant"


@dataclass
class AnswerAssembler:
    """Folds a stream's chunks into the non-streamed answer a client asked for."""

    kind: AnswerKind
    _choices: dict[int, _Choice] = field(default_factory=dict)
    _head: dict[str, Any] = field(default_factory=dict)
    _extra: dict[str, Any] = field(default_factory=dict)

    def feed(self, event: dict[str, Any]) -> None:
        """Fold one SSE event (a parsed `data:` payload) into the answer."""
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in event and key not in self._head:
                self._head[key] = event[key]
        for key in ("usage", "timings"):
            if event.get(key):
                self._extra[key] = event[key]
        for raw in event.get("choices") or []:
            if not isinstance(raw, dict):
                continue
            index = int(raw.get("index", 0))
            choice = self._choices.setdefault(index, _Choice(index))
            if raw.get("finish_reason"):
                choice.finish_reason = raw["finish_reason"]
            logprobs = raw.get("logprobs")
            if isinstance(logprobs, dict):
                choice.has_logprobs = True
                choice.logprobs.extend(logprobs.get("content") or [])
            if self.kind == "completions":
                choice.content.append(raw.get("text") or "")
                continue
            delta = raw.get("delta") or {}
            choice.role = delta.get("role") or choice.role
            if delta.get("content"):
                choice.content.append(delta["content"])
            if delta.get("reasoning_content"):
                choice.reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or []:
                self._fold_tool_call(choice, call)

    @staticmethod
    def _fold_tool_call(choice: _Choice, call: dict[str, Any]) -> None:
        slot = choice.tool_calls.setdefault(
            int(call.get("index", len(choice.tool_calls))),
            {"type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        if call.get("type"):
            slot["type"] = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] += function["name"]
        if function.get("arguments"):
            slot["function"]["arguments"] += function["arguments"]

    def answer(self) -> dict[str, Any]:
        """The assembled non-streamed answer."""
        choices = [self._render(c) for _, c in sorted(self._choices.items())]
        return {
            "id": self._head.get("id", ""),
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            **(
                {"system_fingerprint": self._head["system_fingerprint"]}
                if "system_fingerprint" in self._head
                else {}
            ),
            "choices": choices,
            **self._extra,
        }

    def _render(self, c: _Choice) -> dict[str, Any]:
        logprobs = {"content": c.logprobs} if c.has_logprobs else None
        text = "".join(c.content)
        if self.kind == "completions":
            return {
                "index": c.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": c.finish_reason,
            }
        # OpenAI's shape: content is null beside tool calls, a string otherwise.
        content = text or (None if c.tool_calls else "")
        message: dict[str, Any] = {"role": c.role, "content": content}
        if c.reasoning:
            message["reasoning_content"] = "".join(c.reasoning)
        if c.tool_calls:
            message["tool_calls"] = [call for _, call in sorted(c.tool_calls.items())]
        rendered: dict[str, Any] = {
            "index": c.index,
            "message": message,
            "finish_reason": c.finish_reason,
        }
        if logprobs is not None:
            rendered["logprobs"] = logprobs
        return rendered
