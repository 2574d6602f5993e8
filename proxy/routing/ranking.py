"""A request's cost and its backends ranked by it: what the policy's rules decide on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proxy.backends.engine import RoutableBackend
from proxy.routing.reasons import AutoReason
from proxy.routing.scoreboard import Estimate

# Prompt tokens a backend may have to process beyond the cheapest choice for a request to be
# sent there only to measure it (an unmeasured backend, a probe): moving an agent's turn off
# the backend holding its 20 k-token prompt costs minutes on a CPU.
CHEAP_MOVE_TOKENS = 512


@dataclass(frozen=True)
class RequestCost:
    """What a request asks of a backend besides its answer: its prompt, and what each holds."""

    prompt_tokens: int = 0
    cached: Mapping[str, int] = field(default_factory=dict)
    max_tokens: int | None = None
    # Whether the machine's CPUs were left to the proxy and its backends just now.
    quiet: bool = True
    # For an agent's turn (a request with tools), what its session asks for (session_intent):
    # where its first turn lands, the session stays.
    agent: str | None = None

    def uncached(self, backend: str) -> int:
        """Prompt tokens this backend would have to process."""
        return max(self.prompt_tokens - self.cached.get(backend, 0), 0)


@dataclass(frozen=True)
class RouteChoice:
    """The chosen backend, why, and the load level the request runs at."""

    backend: str
    reason: AutoReason
    level: int


@dataclass(frozen=True)
class Ranking:
    """One request's measured backends, ranked once by the time the whole request takes on
    each; the rules read it."""

    task: str
    cost: RequestCost
    # Every backend, ready or not: a device is idle only if none of them decodes there.
    backends: Sequence[RoutableBackend]
    # Best first: demoted last, then by seconds, then by load.
    ranked: list[RoutableBackend]
    levels: Mapping[str, int]
    estimates: Mapping[str, Estimate]
    demoted: set[str]
    seconds: Mapping[str, float]
    # The same without one of the ranking's terms, to tell which one decided: with nothing
    # cached anywhere, and without the speculation margin.
    cold_seconds: Mapping[str, float]
    unmargined_seconds: Mapping[str, float]
    answer: float
    # The fewest prompt tokens any backend would process.
    cheapest: int

    @property
    def best(self) -> RoutableBackend:
        return self.ranked[0]

    def first_by(self, seconds: Mapping[str, float], demote: bool = True) -> RoutableBackend:
        """The backend ranked first by these times (demoted ones last unless told not to)."""
        return min(
            self.ranked_by_name(),
            key=lambda b: (demote and b.name in self.demoted, seconds[b.name], b.load),
        )

    def ranked_by_name(self) -> list[RoutableBackend]:
        """In the order the backends were given (a re-measure goes to the first due)."""
        return [b for b in self.backends if b.name in self.seconds]

    def credited(self, b: RoutableBackend) -> float:
        """The whole request's speed on `b`: answer tokens per second of its time."""
        return self.answer / self.seconds[b.name]

    def cheap_to_move(self, b: RoutableBackend) -> bool:
        """Whether `b` would process few more prompt tokens than the cheapest choice."""
        return self.cost.uncached(b.name) - self.cheapest <= CHEAP_MOVE_TOKENS

    def about_as_fast(self, other: RoutableBackend, margin: float, wait_s: float = 0.0) -> bool:
        """Within the margin of the best, or done sooner than the best after its wait."""
        if other.name in self.demoted:
            return False
        theirs, best = self.seconds[other.name], self.seconds[self.best.name]
        return theirs * (1 - margin) <= best or theirs <= best + wait_s

    def choice(self, b: RoutableBackend, reason: AutoReason) -> RouteChoice:
        return RouteChoice(b.name, reason, self.levels[b.name])
