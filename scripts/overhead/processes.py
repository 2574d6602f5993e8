"""The processes the overhead benchmark starts: each in its own group and ended on exit, waited
for until they answer, their resident memory sampled."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from . import ROOT


def raise_open_files() -> None:
    """Thousands of streams need thousands of sockets: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Children:
    """Every process the benchmark starts, each in its own process group, all ended on exit."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def spawn(
        self,
        argv: list[str],
        log: Path,
        cpus: set[int] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        if cpus:
            # Before it has started any thread or child: those inherit the affinity.
            with contextlib.suppress(OSError):
                os.sched_setaffinity(process.pid, cpus)
        return process

    def stop(self, process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
        """SIGTERM to its whole group, SIGKILL after grace_s."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s)
        # Whatever the group still holds (a worker the leader left behind) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        if process in self.processes:
            self.processes.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.processes)):
            self.stop(process)


def wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll url until it answers 200 (and, for specproxy's /health, status ok)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args!r} exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read()
                if resp.status == 200 and b'"starting"' not in body and b'"loading"' not in body:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def group_pids(leader: int) -> list[int]:
    """The processes of leader's process group (a server and its workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == leader:  # fields: state, ppid, pgrp
            pids.append(int(entry))
    return pids or [leader]


def status_kib(pid: int, key: str) -> int:
    """A /proc/<pid>/status figure in KiB (VmRSS, VmHWM); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """The resident memory of a process group, sampled every 50 ms on a thread: its peak."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.pids = group_pids(leader)
        self.before = self.rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return sum(status_kib(p, "VmRSS") for p in self.pids)

    def _run(self) -> None:
        rescan = time.monotonic() + 2
        while not self._stop.wait(0.05):
            if time.monotonic() > rescan:
                self.pids = group_pids(self.leader)
                rescan = time.monotonic() + 2
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if len(self.pids) == 1:  # one process: its high-water mark misses no spike
            self.peak = max(self.peak, status_kib(self.pids[0], "VmHWM"))
