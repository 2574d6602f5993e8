"""The status page at /ui rendered in-process: every backend, the last requests, no prompt text
(a real chromium loads it in tests/integration/test_status_page.py)."""

from __future__ import annotations

from pathlib import Path

from proxy.testing.llama_double import Behaviour, start_double
from tests.inprocess import proxy_in_front


async def test_the_page_shows_every_backend_and_the_last_requests_without_their_text(
    tmp_path: Path,
) -> None:
    doubles = {name: await start_double(Behaviour(cache_n=2180)) for name in ("plain", "ngram")}
    backends = [
        {"name": "plain", "url": doubles["plain"].url},
        {"name": "ngram", "kind": "ngram", "url": doubles["ngram"].url},
    ]
    try:
        async with proxy_in_front(tmp_path, backends, doubles) as proxy:
            secret = "<b>a prompt nobody may read</b>"
            body = {"model": "ngram", "messages": [{"role": "user", "content": secret}]}
            assert (await proxy.http.post("/v1/chat/completions", json=body)).status == 200
            page = await proxy.http.get("/ui")
            assert page.status == 200 and page.content_type == "text/html"
            html = await page.text()
            live = await (await proxy.http.get("/ui/live")).text()
            # A browser asking for / is sent to the page; a client still gets the JSON index.
            browser = await proxy.http.get(
                "/", headers={"Accept": "text/html"}, allow_redirects=False
            )
            index = await (await proxy.http.get("/")).json()
    finally:
        for double in doubles.values():
            await double.stop()
    for name in ("plain", "ngram"):
        assert f"<td>{name}</td>" in live
    assert "1 request served" in live and "<td>chat</td><td>ngram</td>" in live
    # What llama-server found cached of the prompt, beside the prompt's size.
    assert ">2,180 / 2,185</td>" in live
    assert "a prompt nobody may read" not in html + live
    assert live in html, "the page's live part is what /ui/live serves"
    assert browser.status == 302 and browser.headers["Location"] == "/ui"
    assert index["status_page"] == "/ui"
