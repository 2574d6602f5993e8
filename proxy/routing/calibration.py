"""Calibration: seed the scoreboard at start-up with workload requests on every backend."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest

import aiohttp

from proxy.backends.contention import CpuMeter
from proxy.backends.engine import BackendSaturatedError
from proxy.backends.strategy import Strategy
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.prompts import REFERENCE_PROMPTS, infill_body
from proxy.routing.router import fim_outcome
from proxy.routing.scoreboard import Outcome, Scoreboard, load_level
from proxy.tasks import FIM_TASK, ROUTED_TASKS
from proxy.tokens import FEW_CHARS_PER_TOKEN
from proxy.traffic import UserTraffic
from proxy.workload import WorkloadRequest, of_task

log = get_logger("calibration")


def calibration_requests(task: str, count: int, max_prompt_tokens: int) -> list[WorkloadRequest]:
    """The first ``count`` workload requests of a class that fit in ``max_prompt_tokens``.

    A backend with a small context (a test model) gets the lab's reference prompt for the class
    instead of requests it could not read.
    """
    fitting = [
        r for r in of_task(task) if r.prompt_chars() // FEW_CHARS_PER_TOKEN <= max_prompt_tokens
    ]
    if fitting:
        return fitting[:count]
    if task in REFERENCE_PROMPTS:
        messages = [{"role": "user", "content": REFERENCE_PROMPTS[task]}]
        return [WorkloadRequest(task, "reference", "/v1/chat/completions", {"messages": messages})]
    if task == FIM_TASK:
        body = {k: v for k, v in infill_body(0).items() if k in ("input_prefix", "input_suffix")}
        return [WorkloadRequest(task, "reference", "/infill", body)]
    return []


async def calibrate(
    backends: Sequence[Strategy],
    scoreboard: Scoreboard,
    session: aiohttp.ClientSession,
    meter: CpuMeter,
    traffic: UserTraffic,
    rounds: int,
    max_tokens: int,
    prompts: int = 3,
    echo_tokens: int | None = None,
) -> int:
    """Measure each (backend, task) on ``prompts`` workload requests, ``rounds`` times each.

    Several prompts per class, so that one prompt that happens to suit a backend does not
    decide the class. Echo requests generate ``echo_tokens`` (default ``max_tokens``), as an
    edit's answer is a whole file. Cells already holding that many samples (a saved
    scoreboard) are skipped. Returns the number of measurements recorded.

    Users come first: each request waits until no user's request is waiting or running, and a
    user's request arriving meanwhile waits at most for the one decoding. Routing looks past a
    calibration request (`background`), so no user's request goes where it is only because
    calibration holds the device there. A sample that shared its device anyway (a user's
    request joining its engine's batch) is filed at the load it ran at.
    """
    budget = {"echo": echo_tokens or max_tokens}
    # Prompt by prompt, every backend in turn: a machine whose speed drifts over minutes (a
    # shared host) then shifts every backend alike instead of favouring the one measured first.
    todo = []
    for task in ROUTED_TASKS:
        per_backend = []
        for backend in backends:
            config = backend.spec.config
            room = config.request_context - budget.get(task, max_tokens)
            requests = calibration_requests(task, prompts, room) * rounds
            est = scoreboard.get(backend.name, task, 1)
            if requests and (est is None or est.samples < len(requests)):
                per_backend.append([(backend, task, r) for r in requests])
        todo += [step for turn in zip_longest(*per_backend) for step in turn if step]
    sent = 0
    refused: set[tuple[str, str]] = set()
    for i, (backend, task, request) in enumerate(todo, 1):
        if not backend.engine.ready or (backend.name, task) in refused:
            continue
        # Users first: a request of theirs that arrives while this one decodes waits for it
        # (its device admits in arrival order), never for the next.
        if traffic.active:
            log.info("calibration waits for users' requests", waiting_for=traffic.active)
            await traffic.quiet()
        try:
            async with backend.slot(background=True) as use:
                # A backend sharing an engine's process decodes as its own fields say.
                payload = {
                    **request.with_sampling(budget.get(task, max_tokens)),
                    **backend.speculation,
                }
                start = meter.snapshot()
                async with session.post(f"{use.base_url}{request.path}", json=payload) as resp:
                    body = await resp.json() if resp.status == 200 else {}
                contended = meter.contended(start, meter.snapshot())
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
            refused.add((backend.name, task))
            continue
        timings = Timings.parse(body.get("timings") if isinstance(body, dict) else None)
        if not timings.measured:
            log.warning("calibration request gave no timings", backend=backend.name, task=task)
            continue
        # Filed at the load it ran at: a user's request may have joined its engine's batch.
        ran_at = load_level(int((use.mean_load or 1.0) + 0.5))
        outcome = Outcome.from_timings(backend.name, task, ran_at, timings, contended=contended)
        if task == FIM_TASK:
            outcome = fim_outcome(outcome, timings)
        scoreboard.record(outcome)
        sent += 1
        log.info(
            "calibrating",
            step=f"{i}/{len(todo)}",
            backend=backend.name,
            task=task,
            kind=request.kind,
            tokens_per_s=round(outcome.tokens_per_s or 0.0, 1),
            load_level=ran_at,
            contended=contended,
            draft_n=timings.draft_n,
            draft_n_accepted=timings.draft_n_accepted,
        )
    return sent
