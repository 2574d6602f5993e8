"""Scoreboard: decayed, measured speed and acceptance per (backend, task class, load level)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from proxy.json_file import write_json
from proxy.llamacpp import Timings

LOAD_LEVELS = (1, 2, 4, 8)
_FAST = 0.5
# A prompt this short measures llama-server's per-request overhead more than its prompt speed.
_MIN_PROMPT_TOKENS = 64
# z for the two-sided 90 % interval kept with each estimate.
_Z = 1.645


def load_level(in_flight: int) -> int:
    """The load bucket for a request that will run with in_flight requests on its backend."""
    for level in LOAD_LEVELS:
        if in_flight <= level:
            return level
    return LOAD_LEVELS[-1]


@dataclass
class Estimate:
    """Exponentially decayed averages of what one backend did for one task class at one load.

    ``tokens_per_s`` is decayed generated tokens over decayed generation seconds, so an answer
    weighs as much as the time it took: what a backend gives the traffic, where a mean of
    per-request rates would let a 40-token answer count as much as a 400-token one.
    """

    tokens_per_s: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    ttft_s: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    recent_acceptance: float | None = None
    samples: int = 0
    # Decayed mean and mean square of log(tokens/s) per answer: the spread of what it measured.
    log_mean: float = 0.0
    log_square: float = 0.0
    # Whether every sample here was taken while other programs used the machine's CPUs.
    contended: bool = False

    @property
    def acceptance(self) -> float | None:
        """Long-run accepted / drafted tokens, None for a backend that drafted nothing."""
        return self.accepted / self.drafted if self.drafted > 0 else None

    def interval(self, alpha: float) -> tuple[float, float]:
        """A 90 % interval of the speed this estimate stands for (tokens/s).

        One sample says nothing of the spread: its interval is taken as a factor of two either
        way, which any repeated measurement narrows.
        """
        if self.samples < 2:
            return self.tokens_per_s / 2, self.tokens_per_s * 2
        spread = math.sqrt(max(self.log_square - self.log_mean**2, 0.0))
        # Decayed averages remember about (2 - alpha) / alpha samples.
        n = min(float(self.samples), (2 - alpha) / alpha)
        half = _Z * max(spread, 0.02) / math.sqrt(n)
        return self.tokens_per_s * math.exp(-half), self.tokens_per_s * math.exp(half)


@dataclass(frozen=True)
class Outcome:
    """What one finished request measured."""

    backend: str
    task: str
    level: int
    tokens_per_s: float | None
    ttft_s: float | None
    predicted_n: int
    draft_n: int
    draft_n_accepted: int
    prompt_n: int = 0
    prompt_ms: float = 0.0
    # Whether other programs used a good share of the machine's CPUs while it ran.
    contended: bool = False
    # For an agent's turn (a request with tools), its session's intent (session_intent).
    agent: str | None = None
    # The engine (process) that processed its prompt; the backend's own name if not given.
    engine: str | None = None

    @classmethod
    def from_timings(
        cls,
        backend: str,
        task: str,
        level: int,
        timings: Timings,
        ttft_s: float | None = None,
        contended: bool = False,
        agent: str | None = None,
        engine: str | None = None,
    ) -> Outcome:
        """A sample from what llama.cpp measured."""
        return cls(
            backend=backend,
            task=task,
            level=level,
            tokens_per_s=timings.tokens_per_s if timings.measured else None,
            ttft_s=ttft_s,
            predicted_n=timings.predicted_n,
            draft_n=timings.draft_n,
            draft_n_accepted=timings.draft_n_accepted,
            prompt_n=timings.prompt_n,
            prompt_ms=timings.prompt_ms,
            contended=contended,
            agent=agent,
            engine=engine,
        )


@dataclass
class Rate:
    """A decayed tokens / seconds ratio: an engine's prompt speed."""

    tokens: float = 0.0
    seconds: float = 0.0
    samples: int = 0
    contended: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second over the decayed samples."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class Scoreboard:
    """Keeps estimates; new samples weigh `alpha`, so old measurements fade.

    Samples taken while other programs used the machine (a build, another server) are kept
    apart from quiet ones and stand in for them only until a quiet sample exists: a handful of
    requests measured on a busy machine cannot overrule what a quiet one measured.

    Prompt speed is kept per engine, not per backend: strategies sharing one llama-server
    process process prompts alike, and one process once measured 73.0 tokens/s as plain and
    80.3 as ngram, noise that would have ranked one strategy ahead of the other.
    """

    def __init__(self, alpha: float = 0.2, min_tokens: int = 8) -> None:
        self.alpha = alpha
        self.min_tokens = min_tokens
        self._table: dict[tuple[str, str, int], Estimate] = {}
        self._noisy: dict[tuple[str, str, int], Estimate] = {}
        # Per (engine, contended).
        self._prompt: dict[tuple[str, bool], Rate] = {}
        # Decayed mean answer length per (backend, task), short answers included.
        self._answers: dict[tuple[str, str], tuple[float, int]] = {}
        # Decayed answer tokens of agents' turns per (session intent, class): what a session
        # that asks for a change, or for an answer, decodes.
        self._agent_tokens: dict[tuple[str, str], float] = {}

    def record(self, outcome: Outcome) -> None:
        """Fold one request's measurements in; very short generations say little and are skipped."""
        self._record_prompt(outcome)
        if outcome.agent is not None and outcome.predicted_n:
            tasks = {t for i, t in self._agent_tokens if i == outcome.agent} | {outcome.task}
            for task in tasks:
                got = outcome.predicted_n if task == outcome.task else 0
                old = self._agent_tokens.get((outcome.agent, task), 0.0)
                self._agent_tokens[(outcome.agent, task)] = old + self.alpha * (got - old)
        if outcome.tokens_per_s is not None or outcome.predicted_n:
            key2 = (outcome.backend, outcome.task)
            mean, n = self._answers.get(key2, (0.0, 0))
            a = max(self.alpha, 1.0 / (n + 1))
            self._answers[key2] = (mean + a * (outcome.predicted_n - mean), n + 1)
        if not outcome.tokens_per_s or outcome.predicted_n < self.min_tokens:
            return
        key = (outcome.backend, outcome.task, outcome.level)
        table = self._noisy if outcome.contended else self._table
        est = table.setdefault(key, Estimate(contended=outcome.contended))
        # The first samples weigh more, so a fresh estimate is not dragged toward zero.
        a = max(self.alpha, 1.0 / (est.samples + 1))
        seconds = outcome.predicted_n / outcome.tokens_per_s
        share = a if est.seconds > 0 else 1.0
        est.tokens += share * (outcome.predicted_n - est.tokens)
        est.seconds += share * (seconds - est.seconds)
        est.tokens_per_s = est.tokens / est.seconds
        log_tps = math.log(outcome.tokens_per_s)
        est.log_mean += a * (log_tps - est.log_mean)
        est.log_square += a * (log_tps**2 - est.log_square)
        if outcome.ttft_s is not None:
            est.ttft_s += a * (outcome.ttft_s - est.ttft_s)
        est.drafted += a * (outcome.draft_n - est.drafted)
        est.accepted += a * (outcome.draft_n_accepted - est.accepted)
        if outcome.draft_n > 0:
            now = outcome.draft_n_accepted / outcome.draft_n
            # A fast average beside the slow one: a collapse in acceptance shows at once.
            prev = est.recent_acceptance
            est.recent_acceptance = now if prev is None else prev + _FAST * (now - prev)
        est.samples += 1

    def _record_prompt(self, outcome: Outcome) -> None:
        if outcome.prompt_n < _MIN_PROMPT_TOKENS or outcome.prompt_ms <= 0:
            return
        engine = outcome.engine or outcome.backend
        rate = self._prompt.setdefault(
            (engine, outcome.contended), Rate(contended=outcome.contended)
        )
        a = max(self.alpha, 1.0 / (rate.samples + 1))
        rate.tokens += a * (outcome.prompt_n - rate.tokens)
        rate.seconds += a * (outcome.prompt_ms / 1000 - rate.seconds)
        rate.samples += 1

    def get(self, backend: str, task: str, level: int) -> Estimate | None:
        """The estimate at exactly this load level (quiet samples if any), if any."""
        key = (backend, task, level)
        return self._table.get(key) or self._noisy.get(key)

    def samples(self, backend: str, task: str, level: int) -> int:
        """Samples at exactly this load level, from a quiet and from a busy machine alike."""
        key = (backend, task, level)
        return sum(t[key].samples for t in (self._table, self._noisy) if key in t)

    def measured_levels(self, backend: str, task: str) -> set[int]:
        """The load levels this backend has an estimate at for this task."""
        return {
            lv
            for lv in LOAD_LEVELS
            if (backend, task, lv) in self._table or ((backend, task, lv) in self._noisy)
        }

    def nearest(
        self, backend: str, task: str, level: int, among: set[int] | None = None
    ) -> Estimate | None:
        """The estimate at this load level, else at the closest measured level (of `among`)."""
        measured = self.measured_levels(backend, task)
        if among is not None:
            measured &= among
        if not measured:
            return None
        best = min(measured, key=lambda lv: (abs(lv - level), lv))
        return self.get(backend, task, best)

    def prompt_speed(self, engine: str) -> Rate | None:
        """This engine's measured prompt speed, from quiet samples where there are any."""
        return self._prompt.get((engine, False)) or self._prompt.get((engine, True))

    def answer_tokens(self, backend: str, task: str) -> float | None:
        """The decayed mean length of this backend's answers to this class, short ones too."""
        mean = self._answers.get((backend, task))
        return mean[0] if mean else None

    def agent_mix(self, intent: str) -> dict[str, float]:
        """The share of answer tokens in each class in sessions of this intent, as measured
        (empty before any)."""
        mine = {t: n for (i, t), n in self._agent_tokens.items() if i == intent}
        total = sum(mine.values())
        return {t: n / total for t, n in mine.items()} if total > 0 else {}

    def items(self) -> list[tuple[tuple[str, str, int], Estimate]]:
        """Every cell's estimate (quiet samples where there are any), sorted by key."""
        cells = {**self._noisy, **self._table}
        return sorted(cells.items())

    def save(self, path: Path) -> None:
        """Persist atomically as JSON."""
        rows = [
            {"backend": b, "task": t, "level": lv, **asdict(e)}
            for table in (self._table, self._noisy)
            for (b, t, lv), e in sorted(table.items())
        ]
        prompt = [{"engine": e, **asdict(r)} for (e, _), r in sorted(self._prompt.items())]
        answers = [
            {"backend": b, "task": t, "tokens": m, "samples": n}
            for (b, t), (m, n) in sorted(self._answers.items())
        ]
        document = {
            "estimates": rows,
            "prompt_speed": prompt,
            "answer_tokens": answers,
            "agent_tokens": [
                {"intent": i, "task": t, "tokens": n} for (i, t), n in self._agent_tokens.items()
            ],
        }
        write_json(path, document)

    def load(self, path: Path, engines: Mapping[str, str] | None = None) -> int:
        """Read estimates saved earlier; returns how many were loaded (0 if none or unreadable).

        `engines` names each backend's engine: a file from before prompt speeds were kept per
        engine has them per backend, and the one with most samples stands for its engine.
        """
        try:
            document = json.loads(path.read_text())
            # Before prompt speeds were kept the file was the list of estimates alone.
            rows = document if isinstance(document, list) else document["estimates"]
            for row in rows:
                key = (str(row.pop("backend")), str(row.pop("task")), int(row.pop("level")))
                est = Estimate(**row)
                (self._noisy if est.contended else self._table)[key] = est
            if isinstance(document, dict):
                self._load_prompt_speeds(document.get("prompt_speed", []), engines or {})
                for row in document.get("agent_tokens", []):
                    cell = (str(row["intent"]), str(row["task"]))
                    self._agent_tokens[cell] = float(row["tokens"])
                for row in document.get("answer_tokens", []):
                    pair = (float(row["tokens"]), int(row["samples"]))
                    self._answers[(str(row["backend"]), str(row["task"]))] = pair
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return 0
        return len(rows)

    def _load_prompt_speeds(self, rows: list[dict[str, Any]], engines: Mapping[str, str]) -> None:
        for row in rows:
            rate = Rate(**{k: v for k, v in row.items() if k not in ("engine", "backend")})
            if "engine" in row:
                engine = str(row["engine"])
            else:  # saved per backend, before they were kept per engine
                engine = engines.get(str(row["backend"]), str(row["backend"]))
            cell = (engine, rate.contended)
            if cell not in self._prompt or self._prompt[cell].samples < rate.samples:
                self._prompt[cell] = rate
