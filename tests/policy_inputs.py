"""Stand-ins for what the route policy reads (backends on devices, measurements on a scoreboard),
and its answers read where a test knows there is one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.backends.devices import Device
from proxy.routing.policy import RoutePolicy
from proxy.routing.ranking import RequestCost, RouteChoice
from proxy.routing.scoreboard import Estimate, Outcome, Scoreboard


@dataclass
class Backend:
    """A backend as the policy reads it: its kind, its load and the device it decodes on."""

    name: str
    spec_type: str | None = None
    in_flight: int = 0
    ready: bool = True
    draft_n_max: int = 3
    saturated: bool = False
    queue_full: bool = False
    device: Device = field(default_factory=lambda: Device("own", 1))
    # The process serving it: its own unless named (strategies sharing an engine).
    process: str | None = None
    # Its longest draft (0: plain decoding), and whether the router chooses a shorter one per
    # request (a speculative strategy on specproxy's build).
    draft_cap: int = 0
    tunes_draft_length: bool = False

    def __post_init__(self) -> None:
        on_device(self.device, [self], share=1)

    @property
    def engine(self) -> EngineOf:
        return EngineOf(self)

    @property
    def load(self) -> int:
        return self.in_flight


@dataclass(frozen=True)
class EngineOf:
    """The engine as the policy reads it, from the stand-in's own fields."""

    backend: Backend

    @property
    def name(self) -> str:
        return self.backend.process or self.backend.name

    @property
    def device(self) -> Device:
        return self.backend.device

    @property
    def ready(self) -> bool:
        return self.backend.ready

    @property
    def saturated(self) -> bool:
        return self.backend.saturated

    @property
    def queue_full(self) -> bool:
        return self.backend.queue_full


def on_device(device: Device, backends: Sequence[Backend], share: int = 2) -> Device:
    """Put backends on `device` with `share` each (a shared engine's once, admitted as the
    engine), their in-flight requests admitted."""
    for b in backends:
        b.device = device
        device.add(b.engine.name, share)
        if b.process is not None:
            device.add_to_engine(b.name, b.process)
        for _ in range(b.in_flight):
            assert device.try_admit(b.name), f"{b.name} does not fit on {device.name}"
    return device


def shared(*backends: Backend, share: int = 2, capacity: int = 2) -> list[Backend]:
    """Backends on one CPU (the default config: each takes every core, so they take turns)."""
    on_device(Device("cpu", capacity), backends, share)
    return list(backends)


def measure(
    board: Scoreboard, backend: str, task: str, tps: float, level: int = 1, **kw: int
) -> None:
    """One request's outcome on `backend` at `tps` tokens/s (`draft_n`, `accepted`: its drafts)."""
    board.record(
        Outcome(backend, task, level, tps, 0.1, 64, kw.get("draft_n", 0), kw.get("accepted", 0))
    )


def chosen(
    policy: RoutePolicy,
    task: str,
    backends: Sequence[Backend],
    cost: RequestCost | None = None,
) -> RouteChoice:
    """The policy's choice where the test has a ready backend (None fails the test here)."""
    choice = policy.choose(task, backends, cost)
    assert choice is not None, f"no backend chosen for {task}"
    return choice


def estimate(board: Scoreboard, backend: str, task: str, level: int) -> Estimate:
    """The board's estimate at this level where the test measured one (None fails it here)."""
    found = board.get(backend, task, level)
    assert found is not None, f"no estimate for {backend}, {task}, level {level}"
    return found


def default_layout(device: Device | None = None) -> tuple[Backend, Backend, Backend]:
    """proxy/defaults/cpu.yaml as the policy reads it: plain and ngram strategies of one
    llama-server (`coder`), draft a process of its own, each taking both cores of one CPU."""
    plain = Backend("plain", process="coder")
    ngram = Backend("ngram", "ngram-mod", process="coder", draft_cap=64, tunes_draft_length=True)
    draft = Backend("draft", "draft-simple", draft_cap=3, tunes_draft_length=True)
    on_device(device or Device("cpu", 2), [plain, ngram, draft])
    return plain, ngram, draft


def decoding(backend: Backend, requests: int) -> None:
    """`requests` more of the backend's requests admitted on its device and decoding."""
    for _ in range(requests):
        assert backend.device.try_admit(backend.name), f"{backend.name} does not fit"
    backend.in_flight += requests
