"""Runs each variant alone on the machine and measures the reference prompts on it.

Every variant gets a llama-server of its own, started for it: no variant meets an answer another
one generated. Within it, each run (task, temperature, repeat) and the warm-up send their own
copy of the prompt (``chat_body``'s word), the same copies in every variant: ngram-mod remembers
every answer its process generated and would copy an earlier run's back (issue 45).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.backends.devices import Device
from proxy.backends.launch import LaunchSpec, prepare_backend
from proxy.backends.supervisor import SupervisedEngine
from proxy.bench.variants import Variant
from proxy.config import Settings
from proxy.llamacpp import METRIC_PREFIX, Timings, metric_value
from proxy.log import get_logger
from proxy.prompts import chat_body
from proxy.workload import fresh_word

log = get_logger("bench")


@dataclass
class Run:
    """One measured generation: a variant on a task at a temperature."""

    variant: str
    task: str
    temperature: float
    tokens_per_s: float
    predicted_n: int
    draft_n: int
    accepted: int
    drafts: int
    text: str
    sweep: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens."""
        return self.accepted / self.draft_n if self.draft_n else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Accepted tokens per draft made."""
        return self.accepted / self.drafts if self.drafts else None


async def _counter(session: aiohttp.ClientSession, base: str, name: str) -> float:
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return metric_value(text, METRIC_PREFIX + name)


async def _generate(
    session: aiohttp.ClientSession,
    base: str,
    task: str,
    tokens: int,
    temperature: float,
    word: str,
) -> tuple[dict[str, Any], float]:
    drafts_before = await _counter(session, base, "spec_decode_num_drafts_total")
    body = chat_body(task, tokens, temperature, word=word)
    async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        body = await resp.json()
    drafts = await _counter(session, base, "spec_decode_num_drafts_total") - drafts_before
    return body, drafts


async def run_variant(
    variant: Variant,
    settings: Settings,
    binary: Any,
    tasks: list[str],
    temperatures: list[float],
    tokens: int,
    repeats: int,
) -> list[Run]:
    """Start the variant's backend alone, measure every task and temperature, stop it."""
    spec: LaunchSpec = prepare_backend(variant.config, settings, binary)
    timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s)
    runs: list[Run] = []
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        _serving(variant, spec, settings, session) as base_url,
    ):
        # One short warm-up so page faults and caches do not land on the first measurement; a
        # copy of its own (word 0), as each run has (1, 2, ... in the same order everywhere).
        await _generate(session, base_url, tasks[0], 8, 0.0, fresh_word(0))
        plan = itertools.product(tasks, temperatures, range(repeats))
        for n, (task, temperature, _) in enumerate(plan, 1):
            start = time.monotonic()
            body, drafts = await _generate(
                session, base_url, task, tokens, temperature, fresh_word(n)
            )
            timings = Timings.parse(body.get("timings"))
            run = Run(
                variant=variant.label,
                task=task,
                temperature=temperature,
                tokens_per_s=timings.tokens_per_s,
                predicted_n=timings.predicted_n,
                draft_n=timings.draft_n,
                accepted=timings.draft_n_accepted,
                drafts=int(drafts),
                text=body["choices"][0]["message"].get("content") or "",
                sweep=variant.sweep,
            )
            runs.append(run)
            log.info(
                "bench",
                variant=variant.label,
                task=task,
                temperature=temperature,
                tokens_per_s=round(run.tokens_per_s, 1),
                acceptance=run.acceptance and round(run.acceptance, 3),
                wall_s=round(time.monotonic() - start, 1),
            )
    return runs


@contextlib.asynccontextmanager
async def _serving(
    variant: Variant, spec: LaunchSpec, settings: Settings, session: aiohttp.ClientSession
) -> AsyncIterator[str]:
    """The variant's server, ready: a llama-server started alone on its device, or the first
    replica of an external backend; yields its URL."""
    if spec.url is not None:
        if not await _healthy(session, spec.url, settings.ready_timeout_s):
            raise RuntimeError(f"{variant.label}: {spec.url} is not healthy")
        yield spec.url
        return
    # Alone on its device: the bench starts one variant at a time.
    device = Device("bench", capacity=1)
    device.add(spec.config.name, 1)
    backend = SupervisedEngine(spec, settings.supervision(), session, device)
    backend.start()
    try:
        if not await backend.wait_ready(settings.ready_timeout_s):
            raise RuntimeError(f"{variant.label} did not start: {list(backend.last_lines)[-5:]}")
        yield backend.base_url
    finally:
        await backend.stop()


async def _healthy(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    """Whether the server at `url` answers /health with 200 within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(f"{url}/health") as resp:
                if resp.status == 200:
                    return True
        await asyncio.sleep(0.5)
    return False
