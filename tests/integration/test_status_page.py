"""The status page at /ui loaded in a real headless chromium (its HTML, rendered in-process, is
checked in tests/fast/test_status_page.py).

The browser test drives chromium over its DevTools protocol: it loads the page, reads what it
shows, sends a request to the proxy and waits for the page's own refresh to list it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.helpers import ROOT
from tests.subprocess_proxy import RunningProxy

# Where the README's screenshot comes from: `SPECPROXY_STATUS_SCREENSHOT=docs/status-page.png`.
SCREENSHOT_ENV = "SPECPROXY_STATUS_SCREENSHOT"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "chromium is not installed; run ./scripts/system-deps.sh test (`make test` does)"
        )
    return found


class DevTools:
    """One page of a headless chromium, driven over the DevTools protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are skipped)."""
        call_id = next(self._ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = json.loads((await self.ws.receive(timeout=30)).data)
            if message.get("id") == call_id:
                assert "error" not in message, message
                return dict(message["result"])

    async def text(self, selector: str) -> str:
        """The text a user sees in the element, as the page renders it now."""
        result = await self.call(
            "Runtime.evaluate",
            expression=f"document.querySelector({json.dumps(selector)})?.innerText ?? ''",
            returnByValue=True,
        )
        return str(result["result"]["value"])


@contextlib.asynccontextmanager
async def headless_chromium(http: aiohttp.ClientSession) -> AsyncIterator[DevTools]:
    """A headless chromium with one blank page, killed with its children at the end."""
    profile = tempfile.mkdtemp(prefix="specproxy-chromium-")
    process = await asyncio.create_subprocess_exec(
        *[
            _chromium(),
            "--headless",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert process.returncode is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            pages = [t for t in await resp.json() if t["type"] == "page"]
        async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            yield DevTools(ws)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _served(summary: str) -> int:
    """The page's count of requests served, from its summary line."""
    words = summary.split()
    return int(words[words.index("served") - 2])


async def _wait_until(page: DevTools, selector: str, holds: Any, timeout: float) -> str:
    """The element's text once `holds(text)`, or its last text when timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        shown = await page.text(selector)
        if holds(shown) or time.monotonic() > deadline:
            return shown
        await asyncio.sleep(0.25)


async def test_the_page_loads_in_chromium_and_updates_after_a_request(
    proxy: RunningProxy, client: openai.OpenAI
) -> None:
    backends = list(proxy.health()["backends"])
    async with aiohttp.ClientSession() as http, headless_chromium(http) as page:
        await page.call("Page.enable")
        await page.call("Page.navigate", url=f"{proxy.url}/")  # a browser lands on /ui
        assert await _wait_until(page, "h1", lambda t: t == "specproxy", 30) == "specproxy"
        backends_table = await page.text("#live table")
        for name in backends:
            assert name in backends_table, (name, backends_table)
        before = _served(await page.text("#live p"))
        marker = f"status-page-{time.time_ns()}"

        def ask() -> None:
            client.chat.completions.create(
                model="ngram",
                messages=[{"role": "user", "content": f"Say hi. {marker}"}],
                max_tokens=8,
            )

        # In a thread, so the test's loop keeps reading the page meanwhile.
        await asyncio.to_thread(ask)
        # No reload: the page's own script fetches /ui/live and shows the new request.
        summary = await _wait_until(page, "#live p", lambda t: _served(t) > before, 15)
        assert _served(summary) == before + 1, summary
        newest = await page.text("#live table:last-of-type tr:nth-child(2)")
        cells = newest.split("\t")
        assert cells[1:4] == ["chat", "ngram", "ngram"], cells
        # Pinned, it drafts at its backend's own length: no draft length of the router's.
        assert cells[5:8] == ["pinned", "–", "200"], cells
        assert marker not in await page.text("body"), "the page never shows a prompt"
        shot = os.environ.get(SCREENSHOT_ENV)
        if shot:
            image = await page.call("Page.captureScreenshot", format="png")
            (ROOT / shot).write_bytes(base64.b64decode(image["data"]))
