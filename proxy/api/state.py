"""Typed keys for the long-lived objects the aiohttp application holds."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.api.recent import RecentRequests
from proxy.api.relay import Upstream
from proxy.backends.contention import CpuMeter
from proxy.backends.pool import BackendPool
from proxy.backends.prompt_keeper import PromptKeepers
from proxy.config import Settings
from proxy.metrics import ProxyMetrics
from proxy.routing.router import Router
from proxy.traffic import CalibrationProgress, UserTraffic

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", BackendPool)
ROUTER = web.AppKey("router", Router)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", Upstream)
METRICS = web.AppKey("metrics", ProxyMetrics)
CPU = web.AppKey("cpu", CpuMeter)
RECENT = web.AppKey("recent", RecentRequests)
TRAFFIC = web.AppKey("traffic", UserTraffic)
CALIBRATION = web.AppKey("calibration", CalibrationProgress)
KEEPERS = web.AppKey("keepers", PromptKeepers)
