"""Calibration: seed the scoreboard with the reference prompts on every backend at start-up."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from proxy.backends.supervisor import BackendSaturatedError, BackendSupervisor
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.prompts import chat_body, infill_body
from proxy.routing.router import fim_outcome
from proxy.routing.scoreboard import Outcome, Scoreboard
from proxy.tasks import FIM_TASK, ROUTED_TASKS

log = get_logger("calibration")


async def calibrate(
    backends: Sequence[BackendSupervisor],
    scoreboard: Scoreboard,
    session: aiohttp.ClientSession,
    requests: int,
    max_tokens: int,
) -> int:
    """Measure each (backend, task) short of `requests` single-stream samples; count the answers."""
    todo = [
        (b, task)
        for task in ROUTED_TASKS
        for b in backends
        if (est := scoreboard.get(b.name, task, 1)) is None or est.samples < requests
    ]
    made = 0
    for i, (backend, task) in enumerate(todo, 1):
        for _ in range(requests):
            if not backend.ready:
                break
            path, request = _reference_request(task, max_tokens)
            try:
                async with (
                    backend.slot(),
                    session.post(f"{backend.base_url}{path}", json=request) as resp,
                ):
                    body = await resp.json() if resp.status == 200 else {}
            except (aiohttp.ClientError, TimeoutError, ValueError, BackendSaturatedError) as exc:
                log.warning("calibration request failed", backend=backend.name, error=str(exc))
                continue
            if resp.status != 200:
                # A model without FIM tokens answers /infill with 501: fim stays unmeasured.
                log.warning(
                    "calibration request refused",
                    backend=backend.name,
                    task=task,
                    status=resp.status,
                )
                break
            timings = Timings.parse(body.get("timings"))
            outcome = Outcome.from_timings(backend.name, task, 1, timings)
            if task == FIM_TASK:
                outcome = fim_outcome(outcome, timings)
            scoreboard.record(outcome)
            made += 1
            log.info(
                "calibrating",
                step=f"{i}/{len(todo)}",
                backend=backend.name,
                task=task,
                tokens_per_s=round(outcome.tokens_per_s or 0.0, 1),
                draft_n=timings.draft_n,
                draft_n_accepted=timings.draft_n_accepted,
            )
    return made


def _reference_request(task: str, max_tokens: int) -> tuple[str, dict[str, object]]:
    """The path and body that measure a task class: /infill for FIM, chat for the others."""
    if task == FIM_TASK:
        return "/infill", infill_body(max_tokens)
    return "/v1/chat/completions", chat_body(task, max_tokens)
