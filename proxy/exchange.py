"""Exchange: one request from arrival to its record, each fact written by the stage that knows."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from proxy.backends.engine import Placement, SlotUse
from proxy.backends.strategy import Strategy
from proxy.measurement import Measurement
from proxy.routing.prefixes import Cached, PromptPrefix
from proxy.routing.reasons import RouteReason


@dataclass(frozen=True)
class Prompt:
    """What the router knows of a request's prompt before sending it: its prefix chain and
    the client's session key."""

    prefix: PromptPrefix
    session: str | None
    # For a request that offers tools (an agent's turn), what its session asks for.
    agent: str | None = None


@dataclass(frozen=True)
class Route:
    """Where the router sent the request, and why."""

    backend: Strategy
    reason: RouteReason
    level: int
    # What the router expected the backend to hold of the prompt.
    cached: Cached
    # The longest draft the router chose for it (DraftLengths); None: the backend's own.
    draft_n_max: int | None = None
    # Whether that length was a try of a neighbouring one.
    draft_explored: bool = False


@dataclass(frozen=True)
class Admitted:
    """How the backend took the request: server, device, and the wait for them."""

    device: str
    device_wait_s: float
    placement: Placement
    # The backend's concurrent requests, for how many prompts its slots keep.
    slots: int

    @classmethod
    def of(cls, use: SlotUse, slots: int) -> Admitted:
        """From the backend's hold on the request."""
        return cls(use.device, use.device_wait_s, Placement(use.base_url), slots)


@dataclass
class Exchange:
    """One request, owned by its handler and passed down: parse, classify, choose, admit,
    relay, then one record step reads it all.

    A stage writes only its own fields, once it knows them; a request that fails early leaves
    the later ones empty, and the record step reads what there is.
    """

    endpoint: str
    request_id: str
    generates: bool = True
    # The proxy's own request (calibration): admitted behind users', not counted as theirs.
    background: bool = False
    started: float = field(default_factory=time.monotonic)
    # Seconds the client took to send its body.
    body_wait_s: float = 0.0
    # parse
    body: dict[str, Any] = field(default_factory=dict)
    requested_model: str | None = None
    model: str = ""
    # The backend the model id names, looked up once; None for `auto*`.
    pinned: Strategy | None = None
    # classify: the task class (None for a passthrough) and the prompt's cache key
    task: str | None = None
    prompt: Prompt | None = None
    # Seconds spent waiting before the choice: llama-server counting a long prompt's tokens.
    fit_wait_s: float = 0.0
    # choose
    route: Route | None = None
    # Seconds waiting for another request on the engine to compute the start of this prompt.
    prefix_wait_s: float = 0.0
    # admit
    admission: Admitted | None = None
    # Seconds from asking the backend for a slot to holding it (the queue, room in a shared KV
    # cache, the device), over every attempt.
    admit_wait_s: float = 0.0
    # Seconds earlier attempts waited on a backend that then failed (its connect, above all).
    failed_attempts_wait_s: float = 0.0
    # The server an attempt could not reach: a retry never goes back to it.
    failed_server: str | None = None
    # Requests decoding at once on its device, on average over its hold (itself included).
    mean_load: float | None = None
    # relay: what the upstream's answer measured, and whether other programs took a good
    # share of the machine's CPUs while it ran
    measured: Measurement | None = None
    contended: bool = False
    # The client set its own speculation (a pinned backend): not the backend's measured speed.
    client_speculation: bool = False
    # outcome: the status the client got (499 when it left before the answer)
    status: int = 0

    def retry(self) -> None:
        """Start another attempt at the relay: what the last one waited stays waited."""
        if self.measured is not None:
            self.failed_attempts_wait_s += self.measured.waited_s
        self.measured, self.admission, self.mean_load = None, None, None

    def own_s(self, now: float) -> float:
        """Seconds the proxy itself spent on the request: all of it but the waits on others
        (the client's body, token counting, room, a shared prefix, device and slot, the
        backend, the client taking the answer)."""
        waited = (
            self.body_wait_s
            + self.fit_wait_s
            + self.prefix_wait_s
            + self.admit_wait_s
            + self.failed_attempts_wait_s
        )
        if self.measured is not None:
            waited += self.measured.waited_s
        return max(now - self.started - waited, 0.0)

    @property
    def answered(self) -> bool:
        """Whether the client had the whole answer (it may leave right after the last event)."""
        return self.measured is not None and self.measured.answered
