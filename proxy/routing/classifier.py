"""Classify an OpenAI request body by the shape of the answer it will get: code, echo or prose."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from itertools import pairwise, repeat
from typing import Any, Final

from proxy.routing import code_syntax as cs
from proxy.routing import lexicon as lx
from proxy.routing import phrases as ph
from proxy.routing.agent_turns import next_answer_class
from proxy.routing.cues import (
    HISTORY_HEAD,
    INSTR_HEAD,
    SCORE_HEAD,
    SCORE_TAIL,
    USER_HEAD,
    USER_TAIL,
    RuleCues,
    bounded,
    count_upto,
    find_phrase,
    has_error_log,
    is_list,
    is_mapping,
    prompt_text,
    split_messages,
    strip_fences,
    tokenise,
)
from proxy.tasks import TASK_CLASSES, TaskClass

__all__ = ["TASK_CLASSES", "TaskClass", "TaskClassifier"]

WEIGHTS_FILE: Final = "classifier_weights.json"

_CODE_THRESHOLD: Final = 2
_SCORE_CAP: Final = 8
# Instruction words are read from the start and the end of the message, around a payload.
_WORD_HEAD: Final = 300
_WORD_TAIL: Final = 200
_MAX_BIGRAMS: Final = 40


class LinearModel:
    """A multinomial logistic regression over binary features: weights per class, summed."""

    def __init__(self, classes: Sequence[TaskClass], weights: Mapping[str, Sequence[float]]):
        self.classes = tuple(classes)
        # One dict per class: scoring is then a C-level map over the features.
        self._per_class = tuple(
            {name: float(w[i]) for name, w in weights.items() if w[i]}
            for i in range(len(self.classes))
        )

    @classmethod
    def load(cls, text: str | None = None) -> LinearModel:
        """The model in ``text`` (JSON), by default the packaged weights."""
        if text is None:
            text = resources.files("proxy.routing").joinpath(WEIGHTS_FILE).read_text("utf-8")
        data = json.loads(text)
        return cls(data["classes"], data["weights"])

    def scores(self, features: Sequence[str]) -> list[float]:
        return [sum(map(weights.get, features, repeat(0.0))) for weights in self._per_class]

    def predict(self, features: Sequence[str]) -> TaskClass:
        totals = self.scores(features)
        return self.classes[max(range(len(totals)), key=totals.__getitem__)]


def _bucket(value: int, edges: Sequence[int]) -> int:
    """Index of the first edge above ``value`` (len(edges) past the last)."""
    for i, edge in enumerate(edges):
        if value < edge:
            return i
    return len(edges)


class TaskClassifier:
    """Classify a ``/v1/chat/completions`` or ``/v1/completions`` body by its answer's shape.

    The classes are defined by what the answer will mostly be, since that is what speculative
    decoding's acceptance depends on:

    - **code**: mostly new code (write, implement, complete; a tool call);
    - **echo**: mostly text or code reproduced from the prompt (whole-file edits, search/replace
      edit blocks, fix/refactor/translate/reformat/correct a pasted text or code, "repeat
      this");
    - **prose**: mostly natural language, technical explanations included ("explain this
      function", "what is the difference between X and Y", a review, "why does this crash").

    FIM (``/infill``) requests are routed by their endpoint; a body with FIM markers,
    ``input_prefix``/``input_suffix`` is **code** here without further ado; a body with a
    non-empty ``tools``/``functions`` list is an agent's turn, **code** (a tool call) unless
    its history shows an edit of a file it read is due (``proxy.routing.agent_turns``):
    **echo**. Any other body goes through two stages:

    1. hand-written rules (``proxy.routing.cues`` over ``proxy.routing.lexicon``) find cues:
       an ask to repeat or edit a payload, weighted code evidence, a coding-assistant or
       edit-format system prompt, a change of subject;
    2. a linear model (``classifier_weights.json``, trained by ``scripts/train_classifier.py``
       on the tuning part of a public evaluation set and the project's labelled requests)
       weighs those cues with the request's shape (payload size, fences, code lines, history,
       files in the chat) and the instruction's words.

    Only bounded slices of the request are scanned, so a request costs a few hundred µs at
    most, however large (``scripts/classifier_speed.py``). Anything it cannot make sense of is
    **prose**.
    """

    def __init__(self, *, system_cache_size: int = 256, model: LinearModel | None = None) -> None:
        self._cues = RuleCues(system_cache_size=system_cache_size)
        self._model = model if model is not None else LinearModel.load()

    def classify(self, body: Mapping[str, Any]) -> TaskClass:
        """Return the task class of ``body``; never raises, falls back to ``"prose"``."""
        try:
            return self._classify(body)
        except Exception:
            return "prose"

    def _classify(self, body: Mapping[str, Any]) -> TaskClass:
        verdict = self.hard_verdict(body)
        if verdict is not None:
            return verdict
        return self._model.predict(self.features(body))

    def hard_verdict(self, body: object) -> TaskClass | None:
        """The class of bodies that need no weighing: odd bodies, tools, FIM."""
        if not is_mapping(body):
            return "prose"
        tools = body.get("tools") or body.get("functions")
        if tools and is_list(tools):
            messages = body.get("messages")
            return next_answer_class(messages) if is_list(messages) else "code"
        if isinstance(body.get("input_prefix"), str) or isinstance(body.get("input_suffix"), str):
            return "code"
        user = self._user_text(body)
        if ("fim" in user or "<PRE>" in user) and cs.FIM_RE.search(user):
            return "code"
        if not user.strip():
            return "prose"
        return None

    @staticmethod
    def _user_text(body: Mapping[str, Any]) -> str:
        messages = body.get("messages")
        if messages and is_list(messages):
            return split_messages(messages)[0]
        return bounded(prompt_text(body.get("prompt")), USER_HEAD, USER_TAIL)[0]

    def features(self, body: Mapping[str, Any]) -> list[str]:
        """The binary features of a body that ``hard_verdict`` leaves undecided (no repeats)."""
        system = ""
        history: list[str] = []
        messages = body.get("messages")
        if messages and is_list(messages):
            user, user_len, system, history = split_messages(messages)
        else:
            user, user_len = bounded(prompt_text(body.get("prompt")), USER_HEAD, USER_TAIL)
        feats = ["bias"] if messages else ["bias", "completion"]
        lower = user.lower()
        fences = lower.count("```") // 2
        stripped = strip_fences(lower) if fences or "```" in lower else lower
        cue, coding_system = self._cue_features(
            feats, user, user_len, lower, stripped, system, history
        )
        code_lines = self._shape_features(
            feats, user, user_len, stripped, fences, system, coding_system, history
        )
        pasted = "code" if fences or code_lines >= 3 else "text" if user_len >= 300 else "none"
        feats.append(f"payload:{pasted}")
        feats.append(f"cue:{cue}|payload:{pasted}")
        if system:
            edit = "system:edit_format" in feats
            kind = "edit" if edit else "coding" if coding_system else "other"
            feats.append(f"payload:{pasted}|system:{kind}")
        self._word_features(feats, stripped, pasted)
        return list(dict.fromkeys(feats))

    def _cue_features(
        self,
        feats: list[str],
        user: str,
        user_len: int,
        lower: str,
        stripped: str,
        system: str,
        history: list[str],
    ) -> tuple[str | None, bool]:
        """What the hand-written rules find; returns the echo cue and whether the system codes."""
        head_tokens = tokenise(stripped[:INSTR_HEAD])
        cue = self._cues.echo_cue(user, user_len, stripped, head_tokens, history)
        feats.append(f"cue:{cue}")
        whole = stripped is lower and len(lower) <= INSTR_HEAD
        scan = bounded(user, SCORE_HEAD, SCORE_TAIL)[0]
        score = self._cues.code_score(
            scan, _SCORE_CAP, lower if whole else None, head_tokens if whole else None
        )
        feats.append(f"score:{max(-2, min(score, _SCORE_CAP))}")
        head = lower[:INSTR_HEAD]
        reset = find_phrase(head, head_tokens if whole else tokenise(head), lx.TOPIC_RESET_INDEX)
        if reset >= 0:
            feats.append("topic_reset")
        coding_system = bool(system) and self._cues.system_is_coding(system)
        history_code = False
        if history:
            recent = "\n".join(text[:HISTORY_HEAD] for text in history[-2:])
            history_code = self._cues.code_score(recent, 2 * _CODE_THRESHOLD) >= 2 * _CODE_THRESHOLD
            if history_code:
                feats.append("history:code")
        feats.append(f"rule:{self._rule_verdict(cue, score, reset, coding_system, history_code)}")
        return cue, coding_system

    @staticmethod
    def _shape_features(
        feats: list[str],
        user: str,
        user_len: int,
        stripped: str,
        fences: int,
        system: str,
        coding_system: bool,
        history: list[str],
    ) -> int:
        """The request's shape: system prompt, history, sizes; returns the code lines counted."""
        if system:
            feats.append("system")
            if coding_system:
                feats.append("system:coding")
            if cs.EDIT_FORMAT_RE.search(system):
                feats.append("system:edit_format")
        if history:
            feats.append("history")
            if any(marker in text[:300] for text in history for marker in cs.FILES_IN_CHAT):
                feats.append("history:files")
            if "```" in history[-1]:
                feats.append("history:last_fenced")
            if len(history[-1]) >= 1000:
                feats.append("history:last_long")
        feats.append(f"len:{_bucket(user_len, (40, 120, 400, 1500, 5000))}")
        feats.append(f"fences:{min(fences, 2)}")
        fenced = user_len - len(stripped.strip()) if fences else 0
        feats.append(f"fenced:{_bucket(fenced, (1, 200, 1000, 4000))}")
        lines = bounded(user, SCORE_HEAD, SCORE_TAIL)[0].split("\n")
        # The last bucket starts at 20 code lines: counting stops there.
        code_lines = count_upto(
            (
                line
                for line in lines
                if line.rstrip().endswith((";", "{", "}", ")", ":"))
                or line.lstrip().startswith(cs.LINE_KEYWORDS)
            ),
            20,
        )
        feats.append(f"code_lines:{_bucket(code_lines, (1, 3, 8, 20))}")
        feats.append(f"lines:{_bucket(len(lines), (2, 4, 10, 40))}")
        if has_error_log(user):
            feats.append("error_log")
        return code_lines

    def _word_features(self, feats: list[str], stripped: str, pasted: str) -> None:
        """The instruction's words, from the start and the end of the message."""
        words_text = stripped.strip()
        if len(words_text) > _WORD_HEAD + _WORD_TAIL:
            words_text = words_text[:_WORD_HEAD] + " \n " + words_text[-_WORD_TAIL:]
        tokens = words_text.encode().translate(ph.TOKEN_TABLE).decode().split()
        if tokens:
            feats.append(f"first:{tokens[0]}")
            feats.append(f"first:{tokens[0]}|payload:{pasted}")
            feats.append(f"first2:{'_'.join(tokens[:2])}")
        for t in dict.fromkeys(tokens):
            feats.append(f"w:{t}")
            if len(t) >= 6:
                feats.append(f"p:{t[:5]}")
            if not t.isascii():
                # Scripts written without spaces (Chinese, Japanese): character pairs.
                feats.extend(f"c:{a}{b}" for a, b in pairwise(t) if a >= "\u3000")
        feats.extend(f"b:{a}_{b}" for a, b in pairwise(tokens[:_MAX_BIGRAMS]))
        if words_text.rstrip().endswith("?"):
            feats.append("ends:?")
        if self._cues.is_question(words_text.split("\n", 1)[0]):
            feats.append("question")

    @staticmethod
    def _rule_verdict(
        cue: str | None, score: int, reset: int, coding_system: bool, history_code: bool
    ) -> TaskClass:
        """What the hand-written rules alone would answer (the classifier before the model)."""
        if cue is not None:
            return "echo"
        if score >= _CODE_THRESHOLD:
            return "code"
        if reset >= 0:
            return "prose"
        # Context breaks ties: a coding-assistant system prompt, or code in the recent turns.
        if coding_system:
            score += _CODE_THRESHOLD
        if score < _CODE_THRESHOLD and history_code:
            score += _CODE_THRESHOLD
        return "code" if score >= _CODE_THRESHOLD else "prose"
