"""CpuMeter: how much of the machine other programs took while a request ran.

A speed measured while a build or another server shared the cores says little of the speed
once they are gone: the router keeps such samples apart (Scoreboard). The kernel counts every
CPU's time in /proc/stat and each process's in /proc/<pid>/stat; what neither the proxy nor
the llama-servers it supervises used, and a hypervisor's steal, is other programs' share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# Share of the machine's CPU time other programs may take before a sample counts as contended:
# a single busy core of two is half of it.
CONTENDED_SHARE = 0.25
# The window `quiet_now` looks back over: long enough for the kernel's 10-ms ticks to add up.
_RECENT_S = 1.0
# A snapshot this young is reused: reading /proc costs about half a millisecond, and a request
# shorter than this decodes too little for its speed to be distorted or to matter.
_FRESH_S = 0.05
_PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU time counters at one moment, in clock ticks."""

    total: int
    busy: int
    ours: dict[int, int]


def _machine() -> tuple[int, int] | None:
    """All CPUs' ticks and their busy ticks (steal included), or None off Linux."""
    try:
        with open(_PROC / "stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return sum(ticks), sum(ticks) - idle


def _process_ticks(pid: int) -> int | None:
    """A process's user and system ticks, its threads included."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields follow its last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return int(rest[11]) + int(rest[12])


class CpuMeter:
    """Snapshots of CPU time; the share of it other programs used between two of them."""

    def __init__(self, own_pids: Callable[[], Iterable[int | None]]) -> None:
        self._own_pids = own_pids
        self._mark: tuple[float, CpuSnapshot | None] | None = None
        self._recent: float | None = None
        self._last: tuple[float, CpuSnapshot | None] | None = None

    def snapshot(self) -> CpuSnapshot | None:
        """The counters now (read at most every 50 ms), or None where the kernel has none."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < _FRESH_S:
            return self._last[1]
        snap = self._read()
        self._last = (now, snap)
        return snap

    def _read(self) -> CpuSnapshot | None:
        machine = _machine()
        if machine is None:
            return None
        ours: dict[int, int] = {}
        for pid in {os.getpid(), *(p for p in self._own_pids() if p)}:
            ticks = _process_ticks(pid)
            if ticks is not None:
                ours[pid] = ticks
        return CpuSnapshot(machine[0], machine[1], ours)

    @staticmethod
    def foreign_share(start: CpuSnapshot | None, end: CpuSnapshot | None) -> float | None:
        """Share of all CPU time between the snapshots that other programs used."""
        if start is None or end is None or end.total <= start.total:
            return None
        ours = sum(t - start.ours[p] for p, t in end.ours.items() if p in start.ours)
        foreign = (end.busy - start.busy) - ours
        return min(max(foreign / (end.total - start.total), 0.0), 1.0)

    def contended(self, start: CpuSnapshot | None, end: CpuSnapshot | None) -> bool:
        """Whether other programs took enough of the machine to distort a speed measured."""
        share = self.foreign_share(start, end)
        return share is not None and share >= CONTENDED_SHARE

    def quiet_now(self) -> bool:
        """Whether other programs left the CPUs alone over about the last second."""
        now = time.monotonic()
        if self._mark is None or now - self._mark[0] >= _RECENT_S:
            snap = self.snapshot()
            if self._mark is not None:
                self._recent = self.foreign_share(self._mark[1], snap)
            self._mark = (now, snap)
        return self._recent is None or self._recent < CONTENDED_SHARE
