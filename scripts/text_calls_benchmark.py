"""Real agents' captured edit turns (tests/data/edit_turns/) sent to the default's model four ways:
the model's stock chat template with answers as written and repaired (proxy/api/call_repair.py),
and a template that asks for a parseable form, as written and repaired. Per turn: whether the
answer is a call of the agent's own edit tool, and whether that edit gives the expected file.

    .venv/bin/python scripts/text_calls_benchmark.py [--max-tokens 900] [--out FILE]

One `specproxy serve` with two backends of Qwen2.5-Coder-1.5B (the default's model), their
answers as written (`repair_tool_calls: false`): `as-written` on the GGUF's own template, and
`asks-as-written` on scripts/qwen25-tools-asks.jinja, the same template whose tool instructions
say to answer with the <tool_call> block alone, no fence, no prose (the prompt changes the same
way on every request, so agents' prompts stay cached). Each turn is sent as its agent sent it,
not streamed, at temperature 0. The `repaired` modes are each answer passed through the proxy's
own repair of a whole answer (proxy.api.call_repair.CallRepair.whole, what a backend with repair
on answers; tests/integration/test_text_calls.py checks the two agree): the same generation, not
run twice. Writes docs/results/text-calls.json and renders it into docs/agents.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.bare import log  # noqa: E402
from loadtests.edit_turns import EditTurn, load_all  # noqa: E402
from loadtests.results import render_text_calls, replace_section  # noqa: E402
from proxy.api.call_repair import CallRepair  # noqa: E402
from proxy.api.text_calls import CallApi, ToolCatalog  # noqa: E402
from proxy.testing.running_proxy import running_proxy  # noqa: E402

RESULT = ROOT / "docs" / "results" / "text-calls.json"
DOC = ROOT / "docs" / "agents.md"
TEMPLATE = ROOT / "scripts" / "qwen25-tools-asks.jinja"
MODES = ("as-written", "repaired", "asks-as-written", "asks-repaired")
SENT = {"as-written": "stock", "asks-as-written": "asks"}  # backend: its engine
CALL_API: dict[str, CallApi] = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
BACKEND = (
    "  - {{name: {name}, kind: plain, model: qwen2.5-coder-1.5b, engine: {engine}, ctx_size: 32768,"
    " kv_unified: true, batch_size: 512, repair_tool_calls: {repair}{extra}}}\n"
)


def config() -> str:
    """The default's model twice, on its own template and on the one that asks; as written."""
    asks = f', extra_args: ["--chat-template-file", "{TEMPLATE}"]'
    rows = [("as-written", "stock", ""), ("asks-as-written", "asks", asks)]
    return "backends:\n" + "".join(
        BACKEND.format(name=n, engine=e, repair="false", extra=x) for n, e, x in rows
    )


def calls_in(surface: str, answer: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    """The answer's tool calls (name, arguments JSON or custom input) and its text."""
    if surface == "/v1/messages":
        blocks = answer.get("content") or []
        calls = [(b["name"], json.dumps(b["input"])) for b in blocks if b["type"] == "tool_use"]
        return calls, "".join(b.get("text", "") for b in blocks if b["type"] == "text")
    if surface == "/v1/responses":
        items = answer.get("output") or []
        calls = [
            (i["name"], i.get("arguments", i.get("input", "")))
            for i in items
            if i["type"] in ("function_call", "custom_tool_call")
        ]
        text = "".join(
            p.get("text", "") for i in items if i["type"] == "message" for p in i["content"]
        )
        return calls, text
    message = answer["choices"][0]["message"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]
    return calls, message.get("content") or ""


def form_of(text: str) -> str:
    """How a text answer begins: what the model wrote instead of a call."""
    head = text.lstrip()[:12]
    if head.startswith("```"):
        return "fenced"
    if head.startswith(("{", "[")):
        return "bare JSON"
    if head.startswith("<tool"):
        return "tags"
    return "prose" if head else "empty"


def judged(turn: EditTurn, mode: str, answer: dict[str, Any], repaired: int) -> dict[str, Any]:
    """One answer: whether it is a call of the agent's edit tool, and the right edit."""
    calls, text = calls_in(turn.surface, answer)
    edits = [args for name, args in calls if name == turn.tool]
    correct = False
    for args in edits:
        # An edit that does not apply (a patch that does not fit) is not the right file.
        with contextlib.suppress(ValueError, KeyError):
            correct = correct or turn.applied(args) == turn.file_after
    row = {
        "agent": turn.agent,
        "mode": mode,
        "calls": [name for name, _ in calls],
        "edit_call": bool(edits),
        "correct_edit": correct,
        "text_form": None if calls else form_of(text),
        "text_start": None if calls else text[:160],
        "repaired": repaired,
        "timings": answer.get("timings") or {},
    }
    log(
        f"{turn.agent} {mode}: calls {row['calls']}, edit {row['edit_call']}, correct {correct}"
        + ("" if calls else f", text {row['text_form']}: {text[:80]!r}")
    )
    return row


def one(url: str, turn: EditTurn, backend: str, max_tokens: int) -> list[dict[str, Any]]:
    """One turn on one backend: its answer as written, and as the proxy's repair makes it."""
    body = {**turn.body, "model": backend, "stream": False, "temperature": 0}
    budget = {"/v1/responses": "max_output_tokens"}.get(turn.surface, "max_tokens")
    body[budget] = max_tokens
    body.pop("stream_options", None)
    response = requests.post(url + turn.surface, json=body, timeout=3600)
    response.raise_for_status()
    answer = response.json()
    rows = [judged(turn, backend, answer, 0)]
    catalog = ToolCatalog.of(CALL_API[turn.surface], body)
    repair = CallRepair(catalog) if catalog is not None else None
    fixed = repair.whole(copy.deepcopy(answer)) if repair is not None else answer
    mode = backend.replace("as-written", "repaired")
    rows.append(judged(turn, mode, fixed, repair.repaired if repair is not None else 0))
    return rows


def main() -> int:
    """Run every captured turn with tools through the four modes; write and render the result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=900)
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--render", action="store_true", help="only render --out into the doc")
    args = parser.parse_args()
    if not args.render:
        # The shortest prompts first; the result file is written after each turn, so a run
        # stopped early still leaves what it measured (`complete` says whether it finished).
        turns = sorted(
            (t for t in load_all() if t.tool is not None), key=lambda t: len(json.dumps(t.body))
        )
        root = Path(tempfile.mkdtemp(prefix="text-calls-"))
        (root / "config.yaml").write_text(config())
        started = datetime.now(UTC)
        rows: list[dict[str, Any]] = []

        def write(complete: bool) -> None:
            result = {
                "what": "captured edit turns with tools, Qwen2.5-Coder-1.5B, four ways",
                "command": "scripts/text_calls_benchmark.py " + " ".join(sys.argv[1:]),
                "started": started.isoformat(timespec="seconds"),
                "complete": complete,
                "modes": list(MODES),
                "rows": rows,
            }
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")

        with running_proxy(
            root / "config.yaml", root / "proxy.log", 900, SPECPROXY_CALIBRATION_REQUESTS="0"
        ) as proxy:
            for turn in turns:
                for backend in SENT:
                    rows += one(proxy.url, turn, backend, args.max_tokens)
                write(complete=False)
        write(complete=True)
        log(f"wrote {args.out}")
    result = json.loads(args.out.read_text())
    DOC.write_text(replace_section(DOC.read_text(), "text-calls", render_text_calls(result)))
    log(f"rendered into {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
