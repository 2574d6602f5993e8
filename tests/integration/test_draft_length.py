"""Each auto request's longest draft, chosen by the router and sent to the real llama-server of
specproxy's build: the length a response names is the one its drafts kept to, it is in the log,
the status page and the metrics, and a pinned request drafts at its backend's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests
import yaml

from proxy.routing.draft_length import ladder
from proxy.routing.scoreboard import LOAD_LEVELS
from tests.helpers import get_json
from tests.subprocess_proxy import running_proxy

# A text the answer copies: ngram-mod drafts it from the prompt once 24 tokens match.
TEXT = (
    "The committee met on Tuesday to review the budget. It approved the new library, "
    "postponed the road repairs and asked the treasurer for a report on the pension fund. "
)


def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    backend = {
        "name": "ngram",
        "kind": "ngram",
        "ngram_variant": "ngram-mod",
        "model": "smollm2-135m",
        "threads": 1,
        "ctx_size": 2048,
    }
    path.write_text(yaml.safe_dump({"backends": [backend]}))
    return path


def ask(url: str, model: str) -> tuple[dict[str, str], dict[str, Any]]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT * 3}"}],
        "max_tokens": 96,
        "temperature": 0,
    }
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return dict(resp.headers), resp.json()


def learned_before(board: Path) -> None:
    """Lengths as an earlier run of the proxy saved them: 16 measured fastest for every class
    and load, at an acceptance that leaves both its neighbours worth a try."""
    rows = [
        {"backend": "ngram", "task": task, "level": level, "n_max": 16}
        | {"tokens_per_s": 50.0, "acceptance": 0.5, "samples": 3}
        for task in ("code", "prose", "echo")
        for level in LOAD_LEVELS
    ]
    board.with_suffix(".draft-lengths.json").write_text(json.dumps({"draft_lengths": rows}))


def test_auto_sends_the_draft_length_it_chose_and_shows_it(tmp_path: Path) -> None:
    # Started from 16, not from the cap: a copied text's drafts are mostly accepted, so from
    # the cap no shorter length would be tried, and the test would not see one kept to.
    board = tmp_path / "board.json"
    learned_before(board)
    with running_proxy(
        config(tmp_path),
        tmp_path / "proxy.log",
        SPECPROXY_CALIBRATION_REQUESTS="0",
        SPECPROXY_DRAFT_LENGTH_EXPLORE_SHARE="0.5",
        SPECPROXY_SCOREBOARD_FILE=str(board),
    ) as proxy:
        sent: list[int] = []
        for _ in range(12):
            headers, answer = ask(proxy.url, "auto")
            n_max = int(headers["X-Specproxy-Draft-N-Max"])
            assert n_max in ladder(64)
            sent.append(n_max)
            t = answer["timings"]
            # A verification step drafts at most n_max tokens, and every step but the last
            # rejects a draft or drafts nothing: the drafts kept to the length chosen.
            steps = t["predicted_n"] - t.get("draft_n_accepted", 0) + 1
            assert t.get("draft_n", 0) <= n_max * steps, (n_max, t)
        # The length learnt before, and half the requests a neighbour of the current one.
        assert sent[0] in (8, 16, 32) and len(set(sent)) > 1, sent
        assert min(sent) < 64
        headers, _ = ask(proxy.url, "ngram")
        assert "X-Specproxy-Draft-N-Max" not in headers  # pinned: the backend's own length
        lines = [json.loads(x) for x in proxy.log_path.read_text().splitlines() if x[:1] == "{"]
        logged = [x["draft_n_max"] for x in lines if x.get("event") == "request"]
        assert logged == [*sent, None]
        status, _ = get_json(f"{proxy.url}/health")
        assert status == 200
        page = requests.get(f"{proxy.url}/ui/live", timeout=10).text
        assert "Longest draft per class and load" in page
        metrics = requests.get(f"{proxy.url}/metrics", timeout=10).text
        chosen = [x for x in metrics.splitlines() if x.startswith("specproxy_router_draft_n_max{")]
        assert chosen and all('backend="ngram"' in x for x in chosen)
        assert float(chosen[0].rsplit(" ", 1)[1]) in ladder(64)
        counted = [
            x
            for x in metrics.splitlines()
            if x.startswith("specproxy_draft_length_requests_total{") and 'backend="ngram"' in x
        ]
        assert sum(float(x.rsplit(" ", 1)[1]) for x in counted) == len(sent)
