import json
from tests.test_metrics import *  # noqa
def test_dbg(client):
    for backend in BACKENDS:
        raw = client.chat.completions.with_raw_response.create(model=backend, messages=REPEAT, max_tokens=48, temperature=0)
        d = json.loads(raw.text); print(backend, d["timings"], repr(d["choices"][0]["message"]["content"][:80]))
