"""max_answer_tokens: a client's larger budget is lowered to it and a request without one gets
it, in each API's own name for the budget; default_answer_tokens: the budget of a request that
sets none (fast tier, llama-server stubs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.inprocess import fast_proxy

CAP = 5
CHAT = {"model": "plain", "messages": [{"role": "user", "content": "Say hello."}]}
MESSAGES = {**CHAT, "max_tokens": 64000}  # Claude Code's own value
RESPONSES = {"model": "plain", "input": "Say hello."}  # Codex sends no budget


@pytest.mark.parametrize(
    ("path", "body", "key", "sent"),
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": 8000}, "max_tokens", CAP),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 3}, "max_tokens", 3),
        ("/v1/chat/completions", CHAT, "max_tokens", CAP),
        ("/v1/messages", MESSAGES, "max_tokens", CAP),
        ("/v1/responses", RESPONSES, "max_output_tokens", CAP),
        ("/infill", {"input_prefix": "def f(", "input_suffix": ")\n"}, "n_predict", CAP),
    ],
)
async def test_the_answer_cap_lowers_or_sets_each_apis_budget(
    tmp_path: Path, path: str, body: dict[str, Any], key: str, sent: int
) -> None:
    async with fast_proxy(
        tmp_path, backends={"plain": {}}, max_answer_tokens=CAP, calibration_requests=0
    ) as proxy:
        resp = await proxy.http.post(path, json=body)
        assert resp.status == 200, await resp.text()
        (received,) = proxy.doubles["plain"].received
    assert received[key] == sent, received


async def test_without_a_cap_the_clients_budget_stands_and_a_missing_one_gets_the_default(
    tmp_path: Path,
) -> None:
    async with fast_proxy(
        tmp_path, backends={"plain": {}}, default_answer_tokens=7, calibration_requests=0
    ) as proxy:
        resp = await proxy.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 8000})
        assert resp.status == 200, await resp.text()
        resp = await proxy.http.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 200
        resp = await proxy.http.post("/v1/responses", json=RESPONSES)
        assert resp.status == 200
    sent = proxy.doubles["plain"].received
    assert sent[0]["max_tokens"] == 8000
    assert sent[1]["max_tokens"] == 7 and sent[2]["max_output_tokens"] == 7


async def test_the_default_budget_is_never_above_the_cap_and_may_be_turned_off(
    tmp_path: Path,
) -> None:
    async with fast_proxy(
        tmp_path,
        backends={"plain": {}},
        max_answer_tokens=CAP,
        default_answer_tokens=4096,
        calibration_requests=0,
    ) as proxy:
        assert (await proxy.http.post("/v1/chat/completions", json=CHAT)).status == 200
    assert proxy.doubles["plain"].received[-1]["max_tokens"] == CAP
    async with fast_proxy(
        tmp_path / "off", backends={"plain": {}}, default_answer_tokens=None, calibration_requests=0
    ) as proxy:
        assert (await proxy.http.post("/v1/chat/completions", json=CHAT)).status == 200
    assert "max_tokens" not in proxy.doubles["plain"].received[-1]
