"""One turn of a session over HTTP: the streamed request, its answer and what it measured."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from loadtests.sessions.session import Session
from proxy.llamacpp import Timings
from proxy.sse import SseSplitter, data_of, is_done


@dataclass
class AnswerStream:
    """An OpenAI chat stream put back together: the assistant message, timings, first token."""

    content: str = ""
    reasoning: str = ""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    first_token_s: float | None = None
    last_token_s: float | None = None
    deltas: int = 0
    done: bool = False
    error: str | None = None
    _lines: SseSplitter = field(default_factory=SseSplitter)

    def feed(self, chunk: bytes, at_s: float) -> None:
        """Take the next bytes of the stream, received at_s seconds after the request."""
        for line in self._lines.feed(chunk):
            self.feed_line(line.rstrip(b"\r"), at_s)

    def feed_line(self, line: bytes, at_s: float) -> None:
        """One SSE line."""
        if is_done(line):
            self.done = True
            return
        event = data_of(line)
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.error = str(event["error"])
            return
        self.timings = event.get("timings") or self.timings
        self.usage = event.get("usage") or self.usage
        for choice in event.get("choices") or []:
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            produced = False
            if delta.get("content"):
                self.content += delta["content"]
                produced = True
            if delta.get("reasoning_content"):
                self.reasoning += delta["reasoning_content"]
                produced = True
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    int(call.get("index", 0)),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
                produced = True
            if produced:
                self.deltas += 1
                if self.first_token_s is None:
                    self.first_token_s = at_s
                self.last_token_s = at_s

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message as the model answered it (content and/or tool_calls)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


@dataclass
class TurnResult:
    """One turn as the client saw it."""

    session: str
    shape: str
    turn: int
    kind: str
    max_tokens: int
    status: int | None = None
    error: str | None = None
    backend: str | None = None
    route: str | None = None
    # The class the proxy gave the turn (X-Specproxy-Task): what routing expected it to be.
    task: str | None = None
    seconds: float = 0.0
    ttft_s: float | None = None
    finish_reason: str | None = None
    tools_called: list[str] = field(default_factory=list)
    tool_style: str | None = None
    content_chars: int = 0
    arguments_chars: int = 0
    answer: str = ""
    prompt_n: int = 0
    cache_n: int = 0
    predicted_n: int = 0
    predicted_per_second: float | None = None
    prompt_per_second: float | None = None
    draft_n: int = 0
    draft_n_accepted: int = 0

    @property
    def ok(self) -> bool:
        """Whether the turn got a complete answer."""
        return self.error is None

    def take_status(self, resp: requests.Response) -> bool:
        """The response's status and the proxy's headers; False (the error noted) unless 200."""
        self.status = resp.status_code
        self.backend = resp.headers.get("X-Specproxy-Backend")
        self.route = resp.headers.get("X-Specproxy-Route")
        self.task = resp.headers.get("X-Specproxy-Task")
        if resp.status_code != 200:
            self.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
            return False
        return True


def send_turn(
    http: requests.Session,
    base_url: str,
    session: Session,
    model: str,
    timeout_s: float = 900,
    stream: AnswerStream | None = None,
) -> TurnResult | None:
    """Make the session's next turn on base_url (…/v1/chat/completions), measure it, and
    append its answer to the session; None once the session is done.

    A failed turn ends the session: its conversation would go on without the answer. Pass
    stream to see what arrived of a turn that is interrupted.
    """
    body = session.next_request(model)
    if body is None:
        return None
    result = TurnResult(
        session.id, session.shape, session.turns_done, session.kind, body["max_tokens"]
    )
    stream = stream if stream is not None else AnswerStream()
    t0 = time.perf_counter()
    for attempt in range(2):
        try:
            _post(http, base_url, body, session.headers, timeout_s, result, stream, t0)
            break
        except requests.ConnectionError as exc:
            # A kept-alive connection the server had closed fails before the request reaches
            # it (llama-server closes some after a stream): one retry on a fresh connection.
            if attempt == 0 and result.status is None and stream.deltas == 0:
                t0 = time.perf_counter()
                continue
            result.error = f"{exc.__class__.__name__}: {exc}"
        except (requests.RequestException, ValueError) as exc:
            result.error = f"{exc.__class__.__name__}: {exc}"
            break
    result.seconds = time.perf_counter() - t0
    result.ttft_s = stream.first_token_s
    result.finish_reason = stream.finish_reason
    _fill_timings(result, stream.timings)
    message = stream.message
    result.content_chars = len(stream.content)
    calls = message.get("tool_calls") or []
    result.arguments_chars = sum(len(c["function"]["arguments"]) for c in calls)
    result.answer = json.dumps(
        {"content": stream.content, "tool_calls": [c["function"] for c in calls]}
    )
    if result.ok:
        result.tools_called = session.observe(message, stream.finish_reason)
        result.tool_style = session.last_style
    else:
        session.turns_done = session.max_turns
    return result


def _post(
    http: requests.Session,
    base_url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float,
    result: TurnResult,
    stream: AnswerStream,
    t0: float,
) -> None:
    """One streamed request: status, headers and the stream into result and stream."""
    with http.post(
        f"{base_url.rstrip('/')}/v1/chat/completions",
        json=body,
        headers=headers,
        stream=True,
        timeout=(10, timeout_s),
    ) as resp:
        if not result.take_status(resp):
            return
        # chunk_size=None hands over each chunk as it arrives: exact first-token time.
        for chunk in resp.iter_content(chunk_size=None):
            stream.feed(chunk, time.perf_counter() - t0)
    if stream.error:
        result.error = f"error event: {stream.error}"
    elif not stream.done:
        result.error = "the stream ended without [DONE]"


def _fill_timings(result: TurnResult, raw: dict[str, Any]) -> None:
    t = Timings.parse(raw)
    result.prompt_n, result.cache_n, result.predicted_n = t.prompt_n, t.cache_n, t.predicted_n
    result.predicted_per_second = t.tokens_per_s or None
    rate = raw.get("prompt_per_second") if isinstance(raw, dict) else None
    result.prompt_per_second = float(rate) if isinstance(rate, int | float) else None
    result.draft_n, result.draft_n_accepted = t.draft_n, t.draft_n_accepted
