"""Token counts of an answer: llama.cpp's `timings` where it has them, else its `usage` fields.

Chat, completions, /completion, /infill and Responses streams carry llama.cpp's timings (speed,
drafts). Responses answers that are not streamed and every Messages answer carry only usage
counts, given here under the timings' own keys (`predicted_n`, `prompt_n`) so one record serves
every surface; they have no speed and no draft counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.sse import SseSplitter, data_of

# Characters (or body bytes) per token in these models' vocabularies, each for what it is used
# for. Code and English run at 3.2-4.8 characters a token with Qwen's and SmolLM's tokenizers.
# For "might this not fit?": low, so a prompt's tokens are over- rather than underestimated.
FEW_CHARS_PER_TOKEN = 3
# For "how much of this prompt is cached?" before a backend's own ratio was measured: typical.
TYPICAL_CHARS_PER_TOKEN = 3.6
# For writing a prompt of a given size (load tests): Qwen2.5-Coder on instructions (4.8) and
# generated code (3.9-4.3); system prompts of 2-20 k tokens come out within 5 % of the size asked.
WRITING_CHARS_PER_TOKEN = 4.3

# Anthropic streams say how many tokens they generated only in their last event; a stream its
# client leaves earlier is counted by its text events, one per token llama-server sent.
_DELTA_EVENT = b"event: content_block_delta"
_USAGE_LINES_KEPT = 4


def counts_from_usage(answer: Mapping[str, Any]) -> dict[str, int]:
    """`predicted_n`, `prompt_n` and `cache_n` from the usage of a chat, Responses or Messages
    answer."""
    usage = answer.get("usage")
    for wrapper in ("response", "message"):  # Responses and Messages stream events nest it
        inner = answer.get(wrapper)
        if usage is None and isinstance(inner, Mapping):
            usage = inner.get("usage")
    if not isinstance(usage, Mapping):
        return {}
    counts: dict[str, int] = {}
    generated = _first_int(usage, "output_tokens", "completion_tokens")
    if generated is not None:
        counts["predicted_n"] = generated
    prompt = _first_int(usage, "input_tokens", "prompt_tokens")
    # Messages count the cached tokens apart from input_tokens; Responses and chat inside it.
    cached = _first_int(usage, "cache_read_input_tokens")
    inside = cached is None
    if inside:
        for key in ("input_tokens_details", "prompt_tokens_details"):
            details = usage.get(key)
            if isinstance(details, Mapping) and cached is None:
                cached = _first_int(details, "cached_tokens")
    if prompt is not None:
        counts["prompt_n"] = max(prompt - ((cached or 0) if inside else 0), 0)
    if cached is not None:
        counts["cache_n"] = cached
    return counts


def counts_of(answer: Any) -> dict[str, Any]:
    """A whole answer's timings, else its usage counts, else nothing."""
    if not isinstance(answer, Mapping):
        return {}
    timings = answer.get("timings")
    if isinstance(timings, dict) and timings:
        return timings
    return counts_from_usage(answer)


def _first_int(mapping: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class StreamTally:
    """What a stream says about its tokens, kept cheaply as its lines pass."""

    def __init__(self) -> None:
        # Every chunk carries running timings, and decoding each one would put JSON parsing
        # in the relay loop: the latest such line is kept and parsed once at the end.
        self.timings_line = b""
        self.usage_lines: list[bytes] = []
        self.deltas = 0
        # The first `data:` line that cannot be JSON; checked by its end, not parsed, to keep
        # the relay loop cheap: a cut or garbled line does not end with its closing brace.
        self.malformed: bytes | None = None
        self._lines = SseSplitter()

    def scan(self, chunk: bytes) -> None:
        """Look at the complete lines of a chunk; an incomplete last line waits for the next."""
        for line in self._lines.feed(chunk):
            if line.startswith(b"data: {"):
                if not line.rstrip().endswith(b"}"):
                    self.malformed = self.malformed or line
                elif b'"timings"' in line:
                    self.timings_line = line
                elif b'"usage"' in line:
                    self.usage_lines = [*self.usage_lines[-_USAGE_LINES_KEPT + 1 :], line]
            elif line.startswith(_DELTA_EVENT):
                self.deltas += 1

    def counts(self) -> dict[str, Any]:
        """The last timings the stream carried, else its usage counts, else its text events."""
        timings = _timings_in(self.timings_line)
        if timings:
            return timings
        counts: dict[str, Any] = {}
        for line in self.usage_lines:
            for key, value in counts_from_usage(_parse(line)).items():
                counts[key] = max(value, counts.get(key, 0))
        if self.deltas > counts.get("predicted_n", 0):
            counts["predicted_n"] = self.deltas
        return counts


def _parse(line: bytes) -> dict[str, Any]:
    event = data_of(line)
    return event if isinstance(event, dict) else {}


def _timings_in(line: bytes) -> dict[str, Any]:
    timings = _parse(line).get("timings") if line else None
    return timings if isinstance(timings, dict) else {}
