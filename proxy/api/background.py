"""The proxy's own requests: calibration seeds the scoreboard at start-up, through the pipeline."""

from __future__ import annotations

import asyncio
import time
from itertools import zip_longest
from pathlib import Path

from proxy.api.pipeline import Pipeline
from proxy.api.surfaces import SURFACES
from proxy.config import Settings
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.prompts import REFERENCE_PROMPTS, infill_body
from proxy.routing.draft_length import DraftLengths
from proxy.routing.scoreboard import Scoreboard
from proxy.tasks import FIM_TASK, ROUTED_TASKS
from proxy.tokens import FEW_CHARS_PER_TOKEN
from proxy.traffic import CalibrationProgress
from proxy.workload import WorkloadRequest, of_task

_SAVE_EVERY_S = 30.0
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
    pipeline: Pipeline,
    scoreboard: Scoreboard,
    rounds: int,
    max_tokens: int,
    prompts: int = 3,
    echo_tokens: int | None = None,
    progress: CalibrationProgress | None = None,
) -> int:
    """Measure each (backend, task) on ``prompts`` workload requests, ``rounds`` times each.

    Several prompts per class, so that one prompt that happens to suit a backend does not
    decide the class. Echo requests generate ``echo_tokens`` (default ``max_tokens``), as an
    edit's answer is a whole file. Cells already holding that many samples (a saved
    scoreboard) are skipped. Returns the number of measurements recorded; `progress` counts
    the requests planned and done as they go, for /health.

    Each request is a background exchange of the pipeline: the same admission, relay,
    timeouts and record step as a user's request (the router files what it measured, at the
    load it ran at). Users come first: each request waits until no user's request is waiting
    or running, and a user's request arriving meanwhile waits at most for the one decoding.
    Routing looks past a calibration request (`background`), so no user's request goes where
    it is only because calibration holds the device there.
    """
    budget = {"echo": echo_tokens or max_tokens}
    surfaces = {s.path: s for s in SURFACES}
    # Prompt by prompt, every backend in turn: a machine whose speed drifts over minutes (a
    # shared host) then shifts every backend alike instead of favouring the one measured first.
    todo = []
    for task in ROUTED_TASKS:
        per_backend = []
        for backend in pipeline.pool:
            config = backend.spec.config
            room = config.request_context - budget.get(task, max_tokens)
            requests = calibration_requests(task, prompts, room) * rounds
            # Samples from a busy machine count: calibration sent those requests already, and
            # rechecks re-measure them once the machine is quiet.
            if requests and scoreboard.samples(backend.name, task, 1) < len(requests):
                per_backend.append([(backend, task, r) for r in requests])
        todo += [step for turn in zip_longest(*per_backend) for step in turn if step]
    sent = 0
    refused: set[tuple[str, str]] = set()
    traffic = pipeline.traffic
    progress = progress or CalibrationProgress(state="running")
    progress.planned = len(todo)
    for i, (backend, task, request) in enumerate(todo, 1):
        if not backend.engine.ready or (backend.name, task) in refused:
            progress.step_taken(None)
            continue
        # Users first: a request of theirs that arrives while this one decodes waits for it
        # (its device admits in arrival order), never for the next.
        if traffic.active:
            log.info("calibration waits for users' requests", waiting_for=traffic.active)
            await traffic.quiet()
        body = request.with_sampling(budget.get(task, max_tokens))
        started = time.monotonic()
        exchange = await pipeline.background(surfaces[request.path], backend, task, body)
        # A failed request counts too: the time left is what the rest will take, failures and all.
        progress.step_taken(time.monotonic() - started)
        measured = exchange.measured
        if exchange.status != 200 or measured is None:
            error = measured.error if measured is not None else None
            log.warning(
                "calibration request failed",
                backend=backend.name,
                task=task,
                status=exchange.status,
                error=error,
            )
            # A model without FIM tokens answers /infill with 501: fim stays unmeasured. A
            # backend that timed out is not asked that class again: calibration goes on.
            refused.add((backend.name, task))
            continue
        timings = Timings.parse(measured.timings)
        if not timings.measured:
            log.warning("calibration request gave no timings", backend=backend.name, task=task)
            continue
        sent += 1
        progress.requests = sent
        log.info(
            "calibrating",
            step=f"{i}/{len(todo)}",
            eta_s=progress.eta_s(),
            backend=backend.name,
            task=task,
            kind=request.kind,
            tokens_per_s=round(timings.tokens_per_s, 1),
            mean_load=round(exchange.mean_load, 2) if exchange.mean_load is not None else None,
            contended=exchange.contended,
            draft_n=timings.draft_n,
            draft_n_accepted=timings.draft_n_accepted,
        )
    return sent


async def keep_measured(
    pipeline: Pipeline,
    settings: Settings,
    scoreboard: Scoreboard,
    progress: CalibrationProgress,
    path: Path,
    drafts: DraftLengths | None = None,
) -> None:
    """Calibrate once backends are ready, then persist the scoreboard (and the draft lengths)
    every half minute."""
    if not settings.calibration_requests:
        progress.state = "off"
    await pipeline.pool.wait_ready()
    if settings.calibration_requests:
        progress.state = "running"
        made = await calibrate(
            pipeline,
            scoreboard,
            settings.calibration_requests,
            settings.calibration_max_tokens,
            settings.calibration_prompts,
            settings.calibration_echo_tokens,
            progress,
        )
        log.info("calibration done", requests=made)
        progress.state, progress.requests = "done", made
    while True:
        scoreboard.save(path)
        if drafts is not None:
            drafts.save(settings.draft_lengths_path())
        await asyncio.sleep(_SAVE_EVERY_S)
