"""Cut streams as a client that gives up does; compare proxy and backend token counters.

    .venv/bin/python scripts/cancelled_streams.py --url http://127.0.0.1:8080 --backend ngram

Each stream is a chat completion pinned to the backend (`ignore_eos`, so it would run on), read
for `--chunks` SSE chunks and then dropped. Run it with nothing else on that backend: the
counters are compared as deltas.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import time
import urllib.parse
import urllib.request

from proxy.sse import iter_data

COUNTERS = (
    "specproxy_generated_tokens_total",
    "llamacpp_tokens_predicted_total",
    "specproxy_draft_tokens_total",
    "llamacpp_spec_decode_num_draft_tokens_total",
)


def counters(url: str, backend: str) -> dict[str, float]:
    """Each counter summed over the backend's label sets."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = r'^{name}{{[^}}]*backend="{backend}"[^}}]*}} (\S+)$'
    return {
        name: sum(
            float(v) for v in re.findall(pattern.format(name=name, backend=backend), text, re.M)
        )
        for name in COUNTERS
    }


def cut_stream(url: str, backend: str, chunks: int) -> None:
    """One streamed chat completion, left after `chunks` chunks."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=120)
    body = {
        "model": backend,
        "stream": True,
        "max_tokens": 1000,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "Count from 1 to 200, one number per line."}],
    }
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    for read, _event in enumerate(iter_data(iter(lambda: resp.read1(4096), b"")), 1):
        if read >= chunks:
            break
    else:
        raise SystemExit("the stream ended before the client left; raise max_tokens")
    resp.close()
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--backend", default="plain")
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=40)
    args = parser.parse_args()
    before = counters(args.url, args.backend)
    for _ in range(args.streams):
        cut_stream(args.url, args.backend, args.chunks)
    time.sleep(3)  # the backend counts a slot's tokens when it releases the slot
    after = counters(args.url, args.backend)
    print(f"{args.streams} streams cut after {args.chunks} chunks on {args.backend!r}:")
    for name in COUNTERS:
        print(f"  {name}: +{after[name] - before[name]:.0f}")


if __name__ == "__main__":
    main()
