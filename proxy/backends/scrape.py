"""Reading a llama-server's own /metrics, renamed and labelled for re-export."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from proxy.llamacpp import METRIC_PREFIX
from proxy.log import get_logger

log = get_logger("metrics")

# Well inside Prometheus' scrape timeout, so one stuck backend costs its own series, not the scrape.
_BACKEND_TIMEOUT_S = 1.0
_REEXPORT_PREFIX = "llamacpp_"


async def scrape_backend(
    url: str, labels: Mapping[str, str], session: aiohttp.ClientSession
) -> list[Metric] | None:
    """A server's llamacpp:* families renamed and given `labels`; None if it did not answer."""
    try:
        async with session.get(
            f"{url}/metrics",
            timeout=aiohttp.ClientTimeout(total=_BACKEND_TIMEOUT_S),
        ) as resp:
            if resp.status != 200:
                # An external llama-server started without --metrics answers 501.
                log.debug("backend metrics unavailable", url=url, status=resp.status)
                return None
            text = await resp.text()
        families = list(text_string_to_metric_families(text))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("backend metrics failed", url=url, error=str(exc))
        return None
    return [_relabel(family, labels) for family in families]


def _relabel(family: Metric, labels: Mapping[str, str]) -> Metric:
    # "llamacpp:" is legal in Prometheus but reserved for recording rules; "llamacpp_" keeps the
    # rest of the name.  The parser already gives counters their "_total" suffix, so llama.cpp's
    # n_tokens_max (declared a counter) arrives as llamacpp_n_tokens_max_total.
    renamed = Metric(_rename(family.name), family.documentation, family.type)
    renamed.samples = [
        Sample(_rename(s.name), {**s.labels, **labels}, s.value, s.timestamp)
        for s in family.samples
    ]
    return renamed


def _rename(name: str) -> str:
    return _REEXPORT_PREFIX + name.removeprefix(METRIC_PREFIX)
