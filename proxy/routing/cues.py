"""Rule cues in a request's text: asks to repeat or edit a payload, and code evidence.

The rules read the vocabulary in ``proxy.routing.lexicon``; ``TaskClassifier`` weighs what they
find together with the request's structure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, TypeGuard

from proxy.routing import code_syntax as cs
from proxy.routing import lexicon as lx
from proxy.routing import phrases as ph

# Scan bounds: enough to see the instruction and a representative slice of any payload, while
# keeping a 200 KB request about as cheap as a 2 KB one.
USER_HEAD: Final = 8_000
USER_TAIL: Final = 4_000
SCORE_HEAD: Final = 3_000
SCORE_TAIL: Final = 1_000
SYSTEM_HEAD: Final = 2_000
HISTORY_MESSAGES: Final = 4
HISTORY_HEAD: Final = 1_000
# Instructions sit at the start or the end of a message, around the pasted payload.
INSTR_HEAD: Final = 600
INSTR_TAIL: Final = 400
# An instruction longer than this is a conversation, not a short order about a payload.
_MAX_INSTRUCTION: Final = 400
# Below this many characters there is nothing worth "repeating"; short quoted phrases
# ("how do you say 'thank you'") are ordinary questions.
_MIN_PAYLOAD: Final = 150
_MIN_PAYLOAD_LINES: Final = 6
_MIN_CONTEXT_PAYLOAD: Final = 200
_SYSTEM_CACHE_SIZE: Final = 256
# Occurrences of one trigger word tried per text; the first few decide in practice.
_MAX_OCCURRENCES: Final = 4
_CODE_WORD_KEYS: Final = frozenset(lx.CODE_WORDS)

# How a message asks for its payload back: an explicit repetition ("repeat this five times"),
# an edit verb aimed at a payload (strong, or a generic verb such as "fix"), a short follow-up
# editing an earlier turn, or a bare order next to a payload ("Spanish version of this:").
EchoCue = Literal["repeat", "edit", "weak-edit", "follow-up", "order"]


class RuleCues:
    """Hand-written rules over the vocabulary; a regex runs only where its trigger word occurs."""

    def __init__(self, *, system_cache_size: int = _SYSTEM_CACHE_SIZE) -> None:
        # Clients resend the same system prompt on every turn; remembering its verdict keeps
        # long agent prompts off the hot path.
        self._system_cache: dict[str, bool] = {}
        self._system_cache_size = system_cache_size

    # ------------------------------------------------------------------------------- echo

    def echo_cue(
        self,
        user: str,
        user_len: int,
        stripped: str,
        head_tokens: frozenset[str],
        history: list[str],
    ) -> EchoCue | None:
        """How the last user message asks for its payload back, if it does."""
        size = len(stripped)
        zones = [(0, min(size, INSTR_HEAD))]
        if size > INSTR_HEAD:
            zones.append((max(INSTR_HEAD, size - INSTR_TAIL), size))
        zone_tokens = [head_tokens] + [tokenise(stripped[a:b]) for a, b in zones[1:]]

        for (a, b), tokens in zip(zones, zone_tokens, strict=True):
            if tokens & lx.EXPLICIT_GATE:
                explicit = lx.ECHO_EXPLICIT_RE.search(stripped, a, b)
                if explicit is not None:
                    # "Write a function that prints it 5 times" wants the function.
                    write = self._find_code_write(stripped, tokens, a, b, create_only=True)
                    if write is None or write.end() > explicit.end():
                        return "repeat"
                    return None

        for (a, b), tokens in zip(zones, zone_tokens, strict=True):
            span, strong = self._first_echo_span(stripped, tokens, a, b)
            if span is None or self.is_question(self._sentence_at(stripped, *span)):
                continue
            if not strong and any(
                _has_debug(stripped[x:y], t) for (x, y), t in zip(zones, zone_tokens, strict=True)
            ):
                continue
            # "Write a script that converts this CSV" asks for new code, not the CSV back.
            write = self._find_code_write(stripped, tokens, a, b, create_only=True)
            if write is not None and write.start() <= span[0]:
                continue
            line_start = stripped.rfind("\n", 0, span[0]) + 1
            line_end = stripped.find("\n", span[1])
            if line_end < 0:
                line_end = size
            colon = stripped.find(":", span[1], line_end)
            instruction = (colon if colon >= 0 else line_end) - line_start
            if user_len - instruction >= _MIN_PAYLOAD or user.count("\n") >= _MIN_PAYLOAD_LINES:
                return "edit" if strong else "weak-edit"
            # A short follow-up ("now translate it") edits something from an earlier turn.
            if user_len < INSTR_HEAD and any(len(t) >= _MIN_CONTEXT_PAYLOAD for t in history):
                return "follow-up"

        return "order" if self._is_order_on_payload(user, user_len, stripped) else None

    def _first_echo_span(
        self, text: str, tokens: frozenset[str], start: int, end: int
    ) -> tuple[tuple[int, int] | None, bool]:
        """Leftmost strong echo cue in text[start:end], else the leftmost weak one."""
        best: dict[bool, tuple[int, int]] = {}
        for word in tokens & lx.ECHO_RULE_WORDS:
            rules = lx.ECHO_RULE_INDEX[word]
            for pos in _occurrences(text, word, start, end):
                for pattern, strong in rules:
                    found = best.get(strong)
                    if found is not None and found[0] <= pos:
                        continue
                    match = pattern.match(text, pos, end)
                    if match is not None:
                        best[strong] = match.span()
        # Phrases and stems may take a suffix ("type hints", "traducilo").
        for cues in (*lx.ECHO_PHRASE_INDEX.candidates(tokens), lx.ECHO_STEMS):
            for cue in cues:
                if text.find(cue, start, end) < 0:
                    continue
                # Occurrences come in order, so only the first can be the leftmost.
                for pos in _occurrences(text, cue, start, end, whole_word=False):
                    found = best.get(True)
                    if found is None or pos < found[0]:
                        best[True] = (pos, pos + len(cue))
                    break
        if True in best:
            return best[True], True
        return best.get(False), False

    def _is_order_on_payload(self, raw: str, user_len: int, stripped: str) -> bool:
        """Structural fallback: a short order aimed at a pasted payload, asking nothing about it.

        Edit requests are phrased in endless ways ("Spanish version of this", "tighten this
        up"), while asking about a payload has recognisable forms (questions, explain,
        summarise, review, write tests...), so the latter are what gets vetoed.
        """
        if user_len < _MIN_PAYLOAD:
            return False
        lower = raw.lower()
        candidates: list[str] = []
        if "```" in lower:
            text = stripped.strip()
            if len(text) <= _MAX_INSTRUCTION:
                candidates.append(text)
        else:
            head = lower.find("\n\n")
            if 0 < head <= _MAX_INSTRUCTION:
                candidates.append(lower[:head])
            tail = lower.rfind("\n\n")
            if tail > head and len(lower) - tail <= _MAX_INSTRUCTION:
                candidates.append(lower[tail:])
            if not candidates:
                line_end = lower.find("\n")
                first_line = lower if line_end < 0 else lower[:line_end]
                colon = first_line.find(":")
                if 0 < colon <= _MAX_INSTRUCTION:
                    candidates.append(first_line[:colon])
        if not candidates or has_error_log(raw):
            return False
        ordered = False
        for text in candidates:
            tokens = tokenise(text)
            if (
                tokens & lx.ANALYSIS_WORDS
                or any(stem in text for stem in lx.ANALYSIS_STEMS)
                or _has_debug(text, tokens)
                or self._creates_something(text, tokens)
                or any(self.is_question(m.group()) for m in lx.SENTENCE_RE.finditer(text))
            ):
                return False
            if (
                user_len - len(text) >= _MIN_PAYLOAD
                and tokens & lx.DEICTIC_WORDS
                and not lx.PRESENTATIONAL_RE.match(text)
            ):
                ordered = True
        return ordered

    def _creates_something(self, text: str, tokens: frozenset[str]) -> bool:
        for word in tokens & lx.CREATE_VERBS:
            for pos in _occurrences(text, word, 0, len(text)):
                if lx.CREATE_NEW_RE.match(text, pos):
                    return True
        return self._find_code_write(text, tokens, 0, len(text), create_only=True) is not None

    def _sentence_at(self, text: str, start: int, end: int) -> str:
        """The sentence around text[start:end]."""
        left = max(text.rfind(c, 0, start) for c in ".!?\n") + 1
        right = lx.SENTENCE_END_RE.search(text, end)
        return text[left : right.end() if right else len(text)]

    def is_question(self, sentence: str) -> bool:
        """Whether ``sentence`` asks something rather than orders something."""
        if lx.QUESTION_OPENER_RE.match(sentence):
            return True
        return sentence.rstrip().endswith("?") and not lx.REQUEST_OPENER_RE.match(sentence)

    # ------------------------------------------------------------------------------- code

    def code_score(
        self,
        raw: str,
        need: int,
        lower: str | None = None,
        tokens: frozenset[str] | None = None,
    ) -> int:
        """Weighted code evidence, counted until it reaches ``need``.

        Negative (narrative) evidence is counted first, so stopping early cannot change the
        comparison with ``need``.
        """
        if lower is None:
            lower = raw.lower()
        if tokens is None:
            tokens = tokenise(lower)
        score = sum(lx.CODE_WORDS[w] for w in tokens & _CODE_WORD_KEYS)
        score -= 2 * len(tokens & lx.PROSE_WORDS)
        if tokens & lx.PROSE_NOUN_WORDS and self._find_prose_write(lower, tokens):
            score -= 6
        if find_phrase(lower, tokens, lx.NARRATIVE_INDEX) >= 0 or (
            "0s" in lower and lx.DECADE_RE.search(lower)
        ):
            score -= 2
        if score >= need:
            return score
        if "```" in lower:
            score += 3
        if self._has_file_path(lower):
            score += 2
        if score >= need:
            return score
        # Counts and small separate regexes: each regex keeps the engine's literal-prefix scan,
        # which one combined alternation would lose.
        # Only min(syntax, 4) counts, so each count stops at 4.
        syntax = lower.count(";\n") + lower.count("{\n") + lower.count("}\n")
        if syntax < 4:
            keyword_lines = (
                line for line in lower.split("\n") if line.lstrip().startswith(cs.LINE_KEYWORDS)
            )
            syntax += count_upto(keyword_lines, 4 - syntax)
        if syntax < 4:
            syntax += count_upto(cs.OPERATORS_RE.finditer(lower), 4 - syntax)
        if syntax < 4:
            syntax += count_upto(cs.CLI_FLAG_RE.finditer(lower), 4 - syntax)
        if syntax < 4 and lower.count("`") >= 2:
            syntax += 1
        if syntax < 4:
            for call in cs.CALL_RE.finditer(lower):
                if call.start() > 0 and lower[call.start() - 1].isalnum():
                    syntax += 1
        score += min(syntax, 4)
        if score >= need:
            return score
        if self._find_code_write(lower, tokens, 0, len(lower)) is not None or self._mentions_cs(
            lower, tokens
        ):
            score += 3
        if score < need and has_error_log(raw):
            score += 3
        return score

    def _find_code_write(
        self, text: str, tokens: frozenset[str], start: int, end: int, *, create_only: bool = False
    ) -> re.Match[str] | None:
        """First "write/create ... function/script/..." in text[start:end]."""
        if not tokens & lx.CODE_NOUN_WORDS:
            return None
        verbs = tokens & (lx.CREATE_VERBS if create_only else lx.WRITE_VERBS)
        first: re.Match[str] | None = None
        for word in verbs:
            for pos in _occurrences(text, word, start, end):
                if first is not None and first.start() <= pos:
                    break
                match = lx.CODE_WRITE_RE.match(text, pos, end)
                if match is not None:
                    first = match
                    break
        return first

    def _find_prose_write(self, text: str, tokens: frozenset[str]) -> bool:
        for word in tokens & lx.PROSE_VERBS:
            for pos in _occurrences(text, word, 0, len(text)):
                if lx.PROSE_WRITE_RE.match(text, pos):
                    return True
        return False

    def _mentions_cs(self, text: str, tokens: frozenset[str]) -> bool:
        for lang in tokens & lx.AMBIGUOUS_LANGS:
            for phrase in lx.LANG_PHRASES[lang]:
                if phrase in text and any(True for _ in _occurrences(text, phrase, 0, len(text))):
                    return True
        return find_phrase(text, tokens, lx.CS_INDEX) >= 0

    def _has_file_path(self, text: str) -> bool:
        for match in cs.FILE_EXTENSION_RE.finditer(text):
            before = text[match.start() - 1] if match.start() > 0 else " "
            if before.isalnum() or before == "_":
                return True
        return False

    def system_is_coding(self, system: str) -> bool:
        cached = self._system_cache.get(system)
        if cached is not None:
            return cached
        verdict = bool(cs.CODING_SYSTEM_RE.search(system)) or self.code_score(system, 4) >= 4
        if self._system_cache_size > 0:
            if len(self._system_cache) >= self._system_cache_size:
                self._system_cache.clear()
            self._system_cache[system] = verdict
        return verdict


def strip_fences(text: str) -> str:
    """``text`` with each fenced block (an unclosed one runs to the end) replaced by a newline."""
    parts: list[str] = []
    pos = 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            parts.append(text[pos:])
            break
        parts.append(text[pos:start])
        parts.append("\n")
        end = text.find("```", start + 3)
        if end < 0:
            break
        pos = end + 3
    return "".join(parts)


def tokenise(text: str) -> frozenset[str]:
    """Distinct words of ``text`` (already lower-cased)."""
    if not text.isascii():
        for char in ph.UNICODE_PUNCT:
            if char in text:
                text = text.replace(char, " ")
    return frozenset(text.encode().translate(ph.TOKEN_TABLE).decode().split())


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # JSON bodies are dicts; the ABC check is several times slower and only a fallback.
    return isinstance(value, (dict, Mapping))


def is_list(value: object) -> TypeGuard[Sequence[Any]]:
    return isinstance(value, list) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))
    )


def _occurrences(
    text: str, word: str, start: int, end: int, *, whole_word: bool = True
) -> Iterator[int]:
    """Start offsets of ``word`` in text[start:end] that begin a word (not "s.replace")."""
    found = 0
    pos = text.find(word, start, end)
    while pos >= 0 and found < _MAX_OCCURRENCES:
        before = text[pos - 1] if pos > 0 else " "
        after_index = pos + len(word)
        after = text[after_index] if after_index < len(text) else " "
        if not (before.isalnum() or before in "._") and (
            not whole_word or not (after.isalnum() or after == "_")
        ):
            found += 1
            yield pos
        pos = text.find(word, pos + 1, end)


def find_phrase(text: str, tokens: frozenset[str], index: ph.PhraseIndex) -> int:
    """Offset of the first indexed phrase found in ``text`` (a suffix may follow), or -1."""
    for cues in index.candidates(tokens):
        for cue in cues:
            if cue in text:
                for pos in _occurrences(text, cue, 0, len(text), whole_word=False):
                    return pos
    return -1


def count_upto(items: Iterable[object], cap: int) -> int:
    """How many items there are, counting no further than ``cap``."""
    found = 0
    for _ in items:
        found += 1
        if found >= cap:
            break
    return found


def _has_debug(text: str, tokens: frozenset[str]) -> bool:
    return bool(tokens & lx.DEBUG_WORDS or any(cue in text for cue in lx.DEBUG_SUBSTRINGS))


def has_error_log(raw: str) -> bool:
    """A stack trace or compiler/runtime error in original case ("TypeError", "npm ERR!")."""
    if any(marker in raw for marker in cs.ERROR_MARKERS):
        return True
    for suffix in ("Error", "Exception"):
        pos = raw.find(suffix, 1)
        while pos > 0:
            end = pos + len(suffix)
            if raw[pos - 1].isalpha() and (end == len(raw) or not raw[end].isalnum()):
                return True
            pos = raw.find(suffix, end)
    return False


def split_messages(messages: Sequence[Any]) -> tuple[str, int, str, list[str]]:
    """The last user message (bounded, and its full length), system prompt head, recent turns."""
    last_user = -1
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if is_mapping(msg) and msg.get("role") == "user":
            last_user = i
            break
    if last_user < 0:
        # No user turn (e.g. a prefilled assistant continuation): judge the last message.
        last_user = len(messages) - 1
    last = messages[last_user]
    content = last.get("content") if is_mapping(last) else None
    user, user_len = bounded(_content_text(content), USER_HEAD, USER_TAIL)

    system_parts: list[str] = []
    for msg in messages[:3]:
        if is_mapping(msg) and msg.get("role") in ("system", "developer"):
            system_parts.append(_content_text(msg.get("content"))[:SYSTEM_HEAD])
    history: list[str] = []
    for msg in messages[max(0, last_user - HISTORY_MESSAGES) : last_user]:
        if is_mapping(msg) and msg.get("role") in ("user", "assistant"):
            history.append(_content_text(msg.get("content")))
    return user, user_len, "\n".join(system_parts)[:SYSTEM_HEAD], history


def _content_text(content: object) -> str:
    """Text of a message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if is_list(content):
        texts = [
            part["text"]
            for part in content
            if is_mapping(part) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""


def prompt_text(prompt: object) -> str:
    """Text of a ``/v1/completions`` ``prompt``: a string or a list of strings."""
    if isinstance(prompt, str):
        return prompt
    if is_list(prompt):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def bounded(text: str, head: int, tail: int) -> tuple[str, int]:
    """Head and tail of ``text`` within a scan budget, plus the full length."""
    if len(text) <= head + tail:
        return text, len(text)
    return text[:head] + "\n" + text[-tail:], len(text)
