"""Load tests' parts without a proxy: the prompt pool, the verdict, stream speeds, sweep options."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadtests import sweep
from loadtests.bare import BareServer
from loadtests.measure import Sample, stream_rate, summarise
from loadtests.prompts import PROMPTS
from loadtests.report import BARE, Cell, failed_cell, verdict
from loadtests.sweep import agent_host, parse_options, run_agent_cell, task_modes
from proxy.routing.classifier import TaskClassifier
from tests.load_runs import run_summary


@pytest.mark.parametrize("task", list(PROMPTS))
def test_prompts_are_classified_as_their_task(task: str) -> None:
    # The pool was generated from the standard library, not written to suit the classifier:
    # a few docstrings pasted whole read like text to correct.
    classifier = TaskClassifier()
    right = [classifier.classify({"messages": list(m)}) == task for m in PROMPTS[task]]
    assert sum(right) / len(right) >= 0.95


def test_verdict_says_up_to_which_concurrency_speculation_pays() -> None:
    levels = [1, 2, 4, 8]
    speeds = {
        "plain": [10.0, 18.0, 30.0, 40.0],
        "ngram": [14.0, 20.0, 29.0, 35.0],
        "draft": [8.0, 12.0, 20.0, 22.0],
    }
    cells = [
        Cell("code", b, lv, run_summary(v))
        for b, vs in speeds.items()
        for lv, v in zip(levels, vs, strict=True)
    ]
    lines = verdict(cells, "code", "plain", ["ngram", "draft"], levels, margin=0.05)
    assert "Speculation pays up to 2 concurrent streams on this hardware (ngram)" in lines[0]
    assert "- ngram: ×1.40 at 1, ×1.11 at 2, ×0.97 at 4, ×0.88 at 8 → pays up to 2" in lines[2]
    assert lines[3].endswith("→ never pays")


def test_a_cut_stream_gets_its_speed_from_what_the_client_received() -> None:
    done = Sample(0.0, "code", "plain", True, end=5.0, outcome="ok", tokens=40, tokens_per_s=12.5)
    cut = Sample(0.0, "code", "plain", True, end=8.0, tokens=21, ttft_s=2.0, last_token_s=6.0)
    barely = Sample(0.0, "code", "plain", True, end=8.0, tokens=2, ttft_s=7.0, last_token_s=7.5)
    assert stream_rate(done) == 12.5  # llama.cpp's own figure wins
    assert stream_rate(cut) == 5.0  # 20 tokens after the first, in 4 s
    assert stream_rate(barely) is None  # too few tokens to say
    summary = summarise([done, cut, barely])
    assert summary.per_stream_tps == pytest.approx(8.75)
    assert (summary.requests, summary.cut, summary.tokens) == (1, 2, 63)


def test_the_sweep_takes_llama_server_as_a_mode_of_agent_cells_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    opts = parse_options(["--tasks", "agent-mixed", "--backends", "llama-server,plain,auto"])
    assert opts.backends == [BARE, "plain", "auto"] and opts.levels == [1, 2, 4]
    assert (opts.config, opts.ctx) == (None, 32768)
    # A prompt class next to it runs the proxy's modes alone, at the usual levels.
    mixed = parse_options(["--tasks", "code,agent-mixed", "--backends", "llama-server,plain"])
    assert mixed.levels == [1, 2, 4, 8]
    assert task_modes("code", mixed.backends or []) == ["plain"]
    assert task_modes("agent-mixed", mixed.backends or []) == [BARE, "plain"]
    with pytest.raises(SystemExit):
        parse_options(["--tasks", "code", "--backends", "llama-server,plain"])
    assert "llama-server runs agent cells only" in capsys.readouterr().err


# Answers /health like a llama-server that has loaded its model, and nothing else.
_FAKE_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_llama_server_cell_gets_a_server_of_its_own_stopped_after_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[BareServer] = []

    class Recorded(BareServer):
        def __enter__(self) -> BareServer:
            started.append(self)
            return super().__enter__()

    monkeypatch.setattr(sweep, "BareServer", Recorded)
    monkeypatch.setattr(
        sweep, "bare_command", lambda _c, _x, port: [sys.executable, "-c", _FAKE_SERVER, str(port)]
    )
    opts = parse_options(["--url", "http://proxy:8080", "--tasks", "agent-mixed"])
    with agent_host(opts, "plain", tmp_path / "unused.log") as host:
        assert host == "http://proxy:8080" and not started
    with agent_host(opts, BARE, tmp_path / "bare.log") as host:
        (server,) = started
        assert host == server.url != opts.url
        assert server.process is not None and server.process.poll() is None
    assert server.process.poll() is not None  # stopped after the cell


def test_a_llama_server_that_does_not_start_fails_its_cell_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    exits = [sys.executable, "-c", "print('no model'); raise SystemExit(3)"]
    monkeypatch.setattr(sweep, "bare_command", lambda *_: exits)
    opts = parse_options(["--out", str(tmp_path), "--tasks", "agent-mixed"])
    cell = run_agent_cell(opts, "agent-mixed", BARE, 2)
    assert (cell.backend, cell.concurrency, cell.summary.tokens) == (BARE, 2, 0)
    assert failed_cell(cell.summary)
    assert cell.summary.first_error and "exited with 3" in cell.summary.first_error
    assert (
        "no model"
        in (tmp_path / "cells" / "agent-mixed-llama-server-c2.llama-server.log").read_text()
    )
