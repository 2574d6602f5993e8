"""Typed keys for the long-lived objects the aiohttp application holds."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.api.recent import RecentRequests
from proxy.backends.pool import BackendPool
from proxy.backends.prompt_keeper import PromptKeepers
from proxy.config import Settings
from proxy.metrics import ProxyMetrics
from proxy.routing.router import Router
from proxy.traffic import CalibrationProgress

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", BackendPool)
ROUTER = web.AppKey("router", Router)
SESSION = web.AppKey("session", aiohttp.ClientSession)
METRICS = web.AppKey("metrics", ProxyMetrics)
RECENT = web.AppKey("recent", RecentRequests)
CALIBRATION = web.AppKey("calibration", CalibrationProgress)
KEEPERS = web.AppKey("keepers", PromptKeepers)
