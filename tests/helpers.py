"""What tests and fixtures share that is not a fixture: the repository's paths, free ports, waiting
for a condition, a JSON GET, and an environment without the caller's SPECPROXY_* settings. One
place for each, for every tier."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar, overload

import pytest

# A caller's SPECPROXY_LLAMA_SERVER or SPECPROXY_API_KEYS would change what a test measures:
# spawned proxies get clean_env's environment, shared with the scripts.
from proxy.testing.running_proxy import ENV_PREFIX as ENV_PREFIX
from proxy.testing.running_proxy import clean_env as clean_env
from proxy.testing.running_proxy import get_json as get_json

T = TypeVar("T")

# The repository: where every command a test runs starts, and what test paths are relative to.
ROOT = Path(__file__).resolve().parent.parent
TEST_CONFIG = ROOT / "tests" / "configs" / "test.yaml"


# ------------------------------------------------------------------------------------- ports


def free_port(*hosts: str) -> int:
    """A port nobody listens on right now, on every one of `hosts` (default: 127.0.0.1).

    The OS picks it on the first host, so it is free there; a port also free on the others is
    looked for a few times. Someone may take it before the caller binds it: loopback tests
    only, where nothing else races for ports.
    """
    first, *others = hosts or ("127.0.0.1",)
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((first, 0))
            port = int(probe.getsockname()[1])
        try:
            for host in others:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")


@contextmanager
def taken_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port something listens on (without ever accepting) for as long as the block runs."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@contextmanager
def accepting_nothing(host: str = "127.0.0.1", port: int = 0) -> Iterator[int]:
    """A port (any free one by default) whose listener accepts no connection: its accept queue
    is full, so the kernel drops further SYNs and a connect hangs until its timeout, as against
    a server too busy to accept (fault injection: a real llama-server cannot do it on cue)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex((host, port))
            fillers.append(filler)
        time.sleep(0.1)
        yield port
    finally:
        for s in (*fillers, listener):
            s.close()


# ------------------------------------------------------------------------------------ waiting

# The workload below took this long (best of 3) on 2026-12-08, with the suite running beside it.
# The ceilings in the tests were set on days at least that fast.
REFERENCE_WORK_S = 0.045


def _work_s() -> float:
    start = time.perf_counter()
    sum(i * i for i in range(1_000_000))
    return time.perf_counter() - start


@functools.cache
def slowness() -> float:
    """How many times slower this machine runs now than when the tests' ceilings were set (at
    least 1): a fixed workload timed once per session. SPECPROXY_TEST_SLOWNESS sets it."""
    given = os.environ.get("SPECPROXY_TEST_SLOWNESS")
    if given:
        return max(float(given), 1.0)
    return max(min(_work_s() for _ in range(3)) / REFERENCE_WORK_S, 1.0)


def patience(seconds: float) -> float:
    """A ceiling on a wait, stretched as much as this machine is slow today: the machine's speed
    moves 3-4x from day to day, and what a test waits for (a prompt, a calibration, an agent's
    session) with it. Only ceilings: a test's own claim of "within N s" is not stretched."""
    return seconds * slowness()


def wait_until(
    condition: Callable[[], object],
    timeout: float,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> bool:
    """Poll `condition` until it is truthy (True) or `timeout` seconds pass (False).

    It is asked once more at the deadline, so a slow last poll is not lost. Exceptions of the
    `ignore` types count as "not yet" (OSError: a server not listening yet); any other one
    propagates, which is how a condition says "stop, this will never hold" (a process exited).
    `timeout` is a ceiling, stretched by patience() on a slow day.
    """
    deadline = time.monotonic() + patience(timeout)
    while True:
        last = time.monotonic() >= deadline
        try:
            if condition():
                return True
        except ignore:
            pass
        if last:
            return False
        time.sleep(min(interval, max(deadline - time.monotonic(), 0)))


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """The first truthy value of `condition`, polled as wait_until does; fails the test naming
    `what` (a string, or a callable asked then for the state worth showing) if none came."""
    found: list[T] = []

    def holds() -> bool:
        value = condition()
        if value:
            found.append(value)
        return bool(value)

    if not wait_until(holds, timeout, interval, ignore):
        pytest.fail(f"waited {patience(timeout):g} s for {what() if callable(what) else what}")
    return found[0]


# Two signatures, because a coroutine function is also a function returning a value: mypy
# infers T from the awaited value only when the awaitable case is a signature of its own.
@overload
async def eventually(
    condition: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    what: str = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T | None],
    timeout: float = ...,
    what: str = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    condition: Callable[[], Awaitable[T | None] | T | None],
    timeout: float = 5.0,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """wait_for for the in-process tier: polls without blocking the event loop the proxy and
    its doubles run on; `condition` may be a coroutine function or a plain one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        last = loop.time() >= deadline
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if last:
            pytest.fail(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------------------- HTTP


# -------------------------------------------------------------------------------- environment


def remove_specproxy_env(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Unset every SPECPROXY_* variable until `monkeypatch` undoes it; the names removed."""
    names = sorted(k for k in os.environ if k.startswith(ENV_PREFIX))
    for name in names:
        monkeypatch.delenv(name)
    return names


@contextmanager
def without_specproxy_env() -> Iterator[None]:
    """remove_specproxy_env for a block, where no test's monkeypatch is at hand (module-scoped
    fixtures that build Settings in-process)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        remove_specproxy_env(monkeypatch)
        yield
