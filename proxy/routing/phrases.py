"""How the classifier tokenises text, and how word sets become regexes and phrase indexes."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Final

# Tokens are runs between punctuation and spaces; "+", "#" and "_" stay so that c++, c# and
# snake_case survive.  bytes.translate + split is several times cheaper than a regex findall,
# and than str.translate, which is slow on non-ASCII text.
_ASCII_PUNCT: Final = bytes(c for c in string.punctuation.encode() if c not in b"+#_")

TOKEN_TABLE: Final = bytes.maketrans(_ASCII_PUNCT, b" " * len(_ASCII_PUNCT))

UNICODE_PUNCT: Final = "“”‘’«»–—…¿¡·"


def words(text: str) -> frozenset[str]:
    """The whitespace-separated words of ``text``."""
    return frozenset(text.split())


def tokens_of(phrase: str) -> list[str]:
    """Tokens of a phrase as the classifier tokenises text ("one-liner" -> one, liner)."""
    return phrase.encode().translate(TOKEN_TABLE).decode().split()


def alternation(phrases: Iterable[str], stems: Iterable[str] = ()) -> str:
    """A non-capturing regex group matching any phrase literally, or any stem plus letters.

    Longest first, so that "these" is tried before "the".
    """
    literal = sorted(set(phrases), key=lambda p: (-len(p), p))
    parts = [re.escape(p) for p in literal] + [re.escape(s) + r"\w*" for s in sorted(set(stems))]
    return "(?:" + "|".join(parts) + ")"


def gate_words(phrases: Iterable[str]) -> frozenset[str]:
    """The token each phrase ends with: a phrase can occur only where that token does."""
    return frozenset(tokens_of(p)[-1] for p in phrases if tokens_of(p))


class PhraseIndex:
    """Phrases by their first token, so that only phrases whose first word occurs are searched."""

    __slots__ = ("cues", "keys")

    def __init__(self, phrases: Iterable[str]) -> None:
        cues: dict[str, list[str]] = {}
        for phrase in phrases:
            cues.setdefault(tokens_of(phrase)[0], []).append(phrase)
        self.cues = {key: tuple(group) for key, group in cues.items()}
        self.keys = frozenset(self.cues)

    def candidates(self, tokens: frozenset[str]) -> list[tuple[str, ...]]:
        return [self.cues[key] for key in tokens & self.keys]


def bounded(phrases: Iterable[str], stems: Iterable[str] = ()) -> str:
    """A word-bounded alternation."""
    return r"\b" + alternation(phrases, stems) + r"\b"
