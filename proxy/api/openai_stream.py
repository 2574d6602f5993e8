"""How OpenAI-style streams end: `[DONE]` for the /v1 surfaces, nothing for llama.cpp's own."""

from __future__ import annotations

from proxy.api.errors import ApiError

_DONE = b"data: [DONE]\n\n"


class PlainStream:
    """llama.cpp's native streams (/completion, /infill): passed as they are, no end marker."""

    def __init__(self) -> None:
        self.ended = False

    def feed(self, chunk: bytes) -> bytes:
        """The chunk unchanged."""
        # The last chunk of a native stream says `"stop": true`.
        self.ended = self.ended or b'"stop":true' in chunk or b'"stop": true' in chunk
        return chunk

    def flush(self) -> bytes:
        """Nothing: these streams end with their last `stop: true` chunk."""
        return b""

    def fail(self, error: ApiError) -> bytes:
        """An error event in llama.cpp's shape."""
        return error.openai_event()


class OpenAIStreamEnd:
    """OpenAI streams end with `data: [DONE]`: llama-server leaves it out after an error event,
    and clients (Qwen Code, opencode) take a stream without it for a broken one and retry.

    Chunks pass unchanged; the rewriter only notes how the stream ended.
    """

    def __init__(self) -> None:
        self._tail = b""
        self._errored = False

    @property
    def ended(self) -> bool:
        """Whether `[DONE]` went by."""
        return self._tail.rstrip().endswith(_DONE.rstrip())

    def feed(self, chunk: bytes) -> bytes:
        """The chunk unchanged."""
        self._tail = (self._tail + chunk)[-32:]
        # llama-server sends an error as one whole event, so one chunk holds its start.
        self._errored = self._errored or b'data: {"error"' in chunk
        return chunk

    def flush(self) -> bytes:
        """`[DONE]` when the stream lacked it, after an error event if it lacked that too."""
        if self._tail.rstrip().endswith(_DONE.rstrip()):
            return b""
        if self._errored:
            return _DONE
        early = "the backend ended the stream before its last chunk"
        return self.fail(ApiError(502, early, code="upstream_error"))

    def fail(self, error: ApiError) -> bytes:
        """An OpenAI error event, then `[DONE]`."""
        self._errored = True
        return error.openai_event() + _DONE
