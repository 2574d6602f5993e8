"""Anthropic Messages streams and errors as Anthropic clients expect them from llama-server."""

from __future__ import annotations

import json
import uuid

from proxy.api import errors
from proxy.api.errors import ApiError
from proxy.api.rewrite import EventRewriter, join_event, split_event


def from_upstream(status: int, raw: bytes) -> bytes:
    """llama-server's OpenAI-style error answer on a Messages path, in Anthropic's shape."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("type") == "error":
        return raw  # already Anthropic's shape
    error = errors.from_upstream(data, status, raw)
    return json.dumps(ApiError(status, error.message, error.code).anthropic_payload()).encode()


class MessagesStreamFix(EventRewriter):
    """Messages streams as Anthropic clients expect them, from llama-server b11434's.

    It sends `message_start` with its first generated token only, so when that token is held
    back (the first bytes of a multi-token character such as an emoji) the stream starts with
    `content_block_start` and the SDK's `messages.stream()` fails; specproxy sends one then.
    Its mid-stream `error` events get Anthropic's shape.

    While a long prompt is processed llama-server sends only `:` comments (every 30 s), and
    Claude Code gives up on a stream after 5 minutes without an event (its `ping` events do not
    count either); a 20 k-token prompt takes longer than that on a CPU. So at each comment before
    the first token the client gets a real event: `message_start`, then an empty text block
    (index 0) that grows by empty deltas and is closed when the answer starts, whose blocks then
    follow it at index + 1.
    """

    LAST_EVENT = "message_stop"

    def __init__(self, model: str) -> None:
        super().__init__()
        self._model = model
        self._started = False  # message_start sent, by llama-server or by us
        self._synthetic_start = False
        self._answering = False  # llama-server sent an event
        self._keepalive_open = False
        self._shift = 0
        self._usage: dict[str, object] = {}  # of the message_start the client did not get

    def rewrite(self, event: bytes) -> bytes:
        """The event, after a `message_start` if the stream lacks one, errors reshaped."""
        if event.startswith(b":") and not self._answering:
            return self._keep_alive(event)
        if not event.startswith(b"event: "):
            return event
        if event.startswith((b"event: error", b"event: message_stop")):
            self._ended = True
        if event.startswith(b"event: error"):
            self._started = True
            return self._error(event)
        head = b""
        if not self._answering:
            self._answering = True
            if self._keepalive_open:
                self._keepalive_open = False
                stop = {"type": "content_block_stop", "index": 0}
                head = b"event: content_block_stop\ndata: " + json.dumps(stop).encode() + b"\n\n"
        if event.startswith(b"event: message_start"):
            if self._synthetic_start:
                # The client has its message_start; the prompt's token counts it carried go
                # into the final message_delta, where clients read the usage too.
                _, _, data = split_event(event)
                message = data.get("message") if isinstance(data, dict) else None
                usage = message.get("usage") if isinstance(message, dict) else None
                self._usage = usage if isinstance(usage, dict) else {}
                return head.rstrip(b"\n")
            self._started = True
            return head + event
        if self._shift and event.startswith(b"event: content_block_"):
            event = self._shifted(event)
        if self._usage and event.startswith(b"event: message_delta"):
            event = self._with_usage(event)
        if self._started:
            return head + event
        self._started = True
        return head + self._message_start() + b"\n\n" + event

    def _keep_alive(self, comment: bytes) -> bytes:
        """A real event in place of llama-server's keep-alive comment."""
        if not self._started:
            self._started = self._synthetic_start = True
            return self._message_start()
        if not self._keepalive_open:
            self._keepalive_open = True
            self._shift = 1
            data = {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
            return b"event: content_block_start\ndata: " + json.dumps(data).encode()
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": ""},
        }
        return b"event: content_block_delta\ndata: " + json.dumps(delta).encode()

    def _with_usage(self, event: bytes) -> bytes:
        lines, at, data = split_event(event)
        if at < 0 or not isinstance(data, dict):
            return event
        usage = data.get("usage")
        data["usage"] = {**self._usage, **(usage if isinstance(usage, dict) else {})}
        return join_event(lines, at, data)

    def _shifted(self, event: bytes) -> bytes:
        lines, at, data = split_event(event)
        if at < 0 or not isinstance(data, dict) or not isinstance(data.get("index"), int):
            return event
        data["index"] += self._shift
        return join_event(lines, at, data)

    def fail(self, error: ApiError) -> bytes:
        """Anthropic's `error` event, which ends a Messages stream."""
        self._ended = True
        return error.anthropic_event()

    def _message_start(self) -> bytes:
        # Its prompt token count is unknown here: the final message_delta still counts output.
        message: dict[str, object] = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        data = json.dumps({"type": "message_start", "message": message})
        return b"event: message_start\ndata: " + data.encode()

    @staticmethod
    def _error(event: bytes) -> bytes:
        lines, at, data = split_event(event)
        if at < 0 or not isinstance(data, dict) or data.get("type") == "error":
            return event
        error = errors.from_upstream(data, raw=b"the backend failed mid-stream")
        return join_event(lines, at, error.anthropic_payload())
