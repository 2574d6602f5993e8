"""The aiohttp application: routes, error middleware and the lifetime of backends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.api.auth import api_key_middleware
from proxy.api.background import keep_measured
from proxy.api.errors import openai_errors
from proxy.api.pipeline import PIPELINE, Pipeline
from proxy.api.recent import RecentRequests
from proxy.api.record import Recorder
from proxy.api.relay import (
    BoundedConnector,
    RelayTimeouts,
    UpstreamSessions,
    connection_reuse_trace,
)
from proxy.api.routes import add_routes
from proxy.api.state import (
    CALIBRATION,
    KEEPERS,
    METRICS,
    POOL,
    RECENT,
    ROUTER,
    SESSION,
    SETTINGS,
)
from proxy.api.surfaces import SURFACES
from proxy.backends.contention import CpuMeter
from proxy.backends.discovery import Resolver
from proxy.backends.engine import Placement
from proxy.backends.launch import LaunchSpec
from proxy.backends.pool import BackendPool
from proxy.backends.prompt_keeper import PromptKeeper, PromptKeepers
from proxy.config import Settings
from proxy.log import get_logger
from proxy.metrics import ProxyMetrics
from proxy.routing.aliases import ModelAliases
from proxy.routing.classifier import TaskClassifier
from proxy.routing.draft_length import DraftLengths
from proxy.routing.policy import RoutePolicy
from proxy.routing.prefixes import PromptPrefix
from proxy.routing.router import Router
from proxy.routing.scoreboard import Scoreboard
from proxy.traffic import CalibrationProgress, UserTraffic

log = get_logger("specproxy")


def build_app(
    settings: Settings, specs: list[LaunchSpec], resolver: Resolver | None = None
) -> web.Application:
    """An application that starts the backends on startup and stops them on cleanup.

    `resolver` finds the replicas behind host names in `urls` (default: the system's).
    """
    keys = settings.accepted_keys()
    middlewares = [openai_errors, *([api_key_middleware(keys)] if keys else [])]
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    scoreboard = Scoreboard()
    policy = RoutePolicy(
        scoreboard,
        explore_share=settings.explore_share,
        speculation_margin=settings.speculation_margin,
    )
    drafts = (
        DraftLengths(explore_share=settings.draft_length_explore_share)
        if settings.tune_draft_length
        else None
    )
    app[ROUTER] = Router(
        TaskClassifier(),
        policy,
        scoreboard,
        ModelAliases(settings.model_aliases),
        share_prefixes=settings.share_prefixes,
        drafts=drafts,
    )
    # The proxy's own llama-servers are not "other programs" to the contention meter.
    cpu = CpuMeter(lambda: [e.pid for e in app[POOL].engines] if POOL in app else [])
    app[RECENT] = RecentRequests()
    app[CALIBRATION] = CalibrationProgress()
    app[METRICS] = ProxyMetrics(
        {s.config.name: s.config.spec_type for s in specs},
        scoreboard,
        {s.endpoint: s.tasks for s in SURFACES if s.generates},
        drafts,
    )

    async def backends_ctx(app: web.Application) -> AsyncIterator[None]:
        # The connect timeout is the socket's own: a request waiting its turn to open a
        # connection (BoundedConnector) is not failing to connect.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
        # No per-host limit: concurrency is the backends' business, not the connection pool's.
        # Stock llama-server closes the connection after every streamed answer, and a pooled
        # half-closed one would fail the next request; so only servers of specproxy's build
        # (which keep it) get pooled connections, and everything else a new one per request.
        # cpp-httplib drops a connection idle for 5 s: the pool lets it go at 4.
        connects = settings.upstream_connects
        fresh_connector = BoundedConnector(connects, limit=0, force_close=True)
        pooled_connector = BoundedConnector(connects, limit=0, keepalive_timeout=4.0)
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=fresh_connector) as session,
            aiohttp.ClientSession(
                timeout=timeout,
                connector=pooled_connector,
                trace_configs=[connection_reuse_trace()],
            ) as pooled,
        ):
            app[SESSION] = session
            app[POOL] = BackendPool(specs, settings, session, resolver)
            app[KEEPERS] = _prompt_keepers(app, settings)
            app[PIPELINE] = Pipeline(
                router=app[ROUTER],
                pool=app[POOL],
                sessions=UpstreamSessions(pooled=pooled, fresh=session),
                counting=session,
                timeouts=RelayTimeouts(
                    first_token_s=settings.first_token_timeout_s,
                    idle_s=settings.idle_timeout_s,
                    whole_answer_s=settings.request_timeout_s,
                    stall_s=settings.stall_timeout_s,
                ),
                cpu=cpu,
                traffic=UserTraffic(),
                recorder=Recorder(
                    app[METRICS],
                    app[RECENT],
                    app[ROUTER],
                    app[KEEPERS],
                    log_prompts=settings.log_prompts,
                ),
                max_answer_tokens=settings.max_answer_tokens,
                default_answer_tokens=settings.default_answer_tokens,
            )
            app[POOL].start()
            app[KEEPERS].start()
            try:
                yield
            finally:
                await app[KEEPERS].stop()
                await app[POOL].stop()

    async def measurements_ctx(app: web.Application) -> AsyncIterator[None]:
        path = settings.scoreboard_path()
        engines = {b.name: b.engine.name for b in app[POOL]}
        loaded = scoreboard.load(path, engines)
        log.info("scoreboard loaded", path=str(path), estimates=loaded)
        if drafts is not None:
            lengths = drafts.load(settings.draft_lengths_path())
            log.info("draft lengths loaded", path=str(settings.draft_lengths_path()), arms=lengths)
        task = asyncio.create_task(
            keep_measured(app[PIPELINE], settings, scoreboard, app[CALIBRATION], path, drafts)
        )
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            scoreboard.save(path)
            if drafts is not None:
                drafts.save(settings.draft_lengths_path())

    app.cleanup_ctx.append(backends_ctx)
    app.cleanup_ctx.append(measurements_ctx)
    add_routes(app)
    return app


def _prompt_keepers(app: web.Application, settings: Settings) -> PromptKeepers:
    """A keeper for each process whose prompts are kept across restarts; what one restores,
    the router takes that process to hold."""
    root = settings.prompt_archive_path()
    router = app[ROUTER]

    def restored(engine: str, prefix: PromptPrefix, url: str, tokens: int) -> None:
        router.prefixes.record(engine, prefix, Placement(url), tokens, slots=1)

    if root is None:
        return PromptKeepers([])
    return PromptKeepers(
        [
            PromptKeeper(
                process,
                root,
                settings.prompt_archive_mib * 2**20,
                settings.prompt_archive_min_tokens,
                restored,
            )
            for process in app[POOL].keeping_prompts
        ]
    )
