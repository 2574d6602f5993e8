"""Realistic prompts for the load tests, by task class: write code, write prose, echo back."""

from __future__ import annotations

from typing import Final

_LRU_SNIPPET: Final = """\
import os, json

def load(p):
    d = {}
    if os.path.exists(p):
        f = open(p)
        d = json.loads(f.read())
        f.close()
    return d

def save(p, d):
    f = open(p, "w")
    f.write(json.dumps(d))
    f.close()

def merge(a, b):
    r = {}
    for k in a:
        r[k] = a[k]
    for k in b:
        if k in r and type(r[k]) == dict and type(b[k]) == dict:
            r[k] = merge(r[k], b[k])
        else:
            r[k] = b[k]
    return r
"""

_HANDLER_SNIPPET: Final = """\
def handle(req):
    if req.method == "GET":
        if req.user is not None:
            if req.user.is_admin:
                items = db.query("select * from items")
            else:
                items = db.query("select * from items where owner = %s", req.user.id)
            out = []
            for i in items:
                out.append({"id": i.id, "name": i.name, "price": i.price})
            return json_response(out)
        else:
            return json_response({"error": "login required"}, status=401)
    else:
        return json_response({"error": "method not allowed"}, status=405)
"""

_STATS_SNIPPET: Final = """\
def stats(nums):
    n = 0
    s = 0
    for x in nums:
        n = n + 1
        s = s + x
    mean = s / n
    v = 0
    for x in nums:
        v = v + (x - mean) * (x - mean)
    var = v / n
    srt = sorted(nums)
    if n % 2 == 1:
        med = srt[n // 2]
    else:
        med = (srt[n // 2 - 1] + srt[n // 2]) / 2
    return {"mean": mean, "var": var, "median": med}
"""

# Write code: the lab's own Italian prompt first, then English ones of the same shape.
CODE: Final[tuple[str, ...]] = (
    "Scrivi in Python una classe LRUCache con metodi get e put, complessità O(1), "
    "con docstring e un piccolo test.",
    "Write a Python function that parses an ISO 8601 duration such as 'P3DT4H5M' into a "
    "datetime.timedelta. Use type hints and include a few pytest tests.",
    "Implement a thread-safe token bucket rate limiter class in Python with a "
    "try_acquire(tokens) method and a short usage example.",
    "Write a TypeScript function that debounces an async callback and cancels the pending "
    "call when a new one arrives. Include the type signature and a usage example.",
)

# Write prose: the lab's Italian story prompt first, then English ones.
PROSE: Final[tuple[str, ...]] = (
    "Scrivi un racconto di 300 parole su un faro abbandonato, con un finale a sorpresa.",
    "Write a 300-word short story about a night-shift baker who finds a letter hidden in a "
    "sack of flour.",
    "Write a warm birthday letter to my grandmother, who is turning ninety and still tends "
    "her vegetable garden every morning.",
    "Write a short essay on why old railway stations make people nostalgic, with one vivid "
    "example.",
)

# Echo: rewrite or refactor pasted code; most of the answer repeats the input.
ECHO: Final[tuple[str, ...]] = (
    "Refactor this module to use pathlib and context managers and add type hints. "
    "Return the full code.\n\n```python\n" + _LRU_SNIPPET + "```",
    "Rewrite this handler with early returns instead of nested ifs, keeping the behaviour "
    "identical. Return the whole function.\n\n```python\n" + _HANDLER_SNIPPET + "```",
    "Riscrivi questa funzione aggiungendo type hint e una docstring, senza cambiare la "
    "logica. Restituisci il codice completo.\n\n```python\n" + _STATS_SNIPPET + "```",
    "Add a docstring to every function in this code and return it otherwise unchanged.\n\n"
    "```python\n" + _LRU_SNIPPET + "```",
)

PROMPTS: Final[dict[str, tuple[str, ...]]] = {"code": CODE, "prose": PROSE, "echo": ECHO}
