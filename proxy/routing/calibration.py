"""Calibration: seed the scoreboard with the reference prompts on every backend at start-up."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from proxy.backends.pool import Backend
from proxy.backends.supervisor import BackendSaturatedError
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.prompts import chat_body
from proxy.routing.classifier import TASK_CLASSES
from proxy.routing.scoreboard import Outcome, Scoreboard

log = get_logger("calibration")


async def calibrate(
    backends: Sequence[Backend],
    scoreboard: Scoreboard,
    session: aiohttp.ClientSession,
    requests: int,
    max_tokens: int,
) -> int:
    """Measure each (backend, task) short of `requests` single-stream samples; count them."""
    todo = [
        (b, task)
        for task in TASK_CLASSES
        for b in backends
        if (est := scoreboard.get(b.name, task, 1)) is None or est.samples < requests
    ]
    for i, (backend, task) in enumerate(todo, 1):
        for _ in range(requests):
            if not backend.ready:
                break
            try:
                async with (
                    backend.slot() as use,
                    session.post(
                        f"{use.base_url}/v1/chat/completions", json=chat_body(task, max_tokens)
                    ) as resp,
                ):
                    body = await resp.json() if resp.status == 200 else {}
            except (aiohttp.ClientError, TimeoutError, ValueError, BackendSaturatedError) as exc:
                log.warning("calibration request failed", backend=backend.name, error=str(exc))
                continue
            timings = Timings.parse(body.get("timings"))
            scoreboard.record(Outcome.from_timings(backend.name, task, 1, timings))
            log.info(
                "calibrating",
                step=f"{i}/{len(todo)}",
                backend=backend.name,
                task=task,
                tokens_per_s=round(timings.tokens_per_s, 1),
                draft_n=timings.draft_n,
                draft_n_accepted=timings.draft_n_accepted,
            )
    return len(todo) * requests
