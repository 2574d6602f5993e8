"""The scoreboard file: saved whole, even when several proxies share it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from proxy.llamacpp import Timings
from proxy.routing.scoreboard import Outcome, Scoreboard


def _board(speed: float) -> Scoreboard:
    board = Scoreboard()
    timings = Timings(predicted_n=100, predicted_ms=100_000 / speed, tokens_per_s=speed)
    board.record(Outcome.from_timings("plain", "code", 1, timings))
    return board


def test_proxies_saving_one_shared_file_at_once_never_fail_and_leave_it_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared" / "scoreboard.json"
    boards = [_board(10.0), _board(20.0)]
    # Two replicas on one volume, saving together 200 times each: one temporary name between
    # them made one's rename fail, and that ended its background saves.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda i: boards[i % 2].save(path), range(400)))
    rows = json.loads(path.read_text())["estimates"]
    assert [round(r["tokens_per_s"]) for r in rows] in ([10], [20])
    assert sorted(p.name for p in path.parent.iterdir()) == ["scoreboard.json"]
    fresh = Scoreboard()
    assert fresh.load(path) == 1


def test_prompt_speeds_are_saved_per_engine_and_an_older_files_per_backend_ones_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "scoreboard.json"
    board = Scoreboard()
    board.record(Outcome("plain", "code", 1, None, None, 0, 0, 0, 1000, 10_000, engine="coder"))
    board.save(path)
    assert [r["engine"] for r in json.loads(path.read_text())["prompt_speed"]] == ["coder"]
    again = Scoreboard()
    again.load(path)
    assert again.prompt_speed("coder") is not None
    # A file from before kept them per backend: each engine takes its backends' best-measured.
    rate = {"tokens": 1000.0, "seconds": 10.0, "contended": False}
    older = {
        "estimates": [],
        "prompt_speed": [
            {"backend": "draft", **rate, "samples": 3},
            {"backend": "ngram", **rate, "seconds": 12.5, "samples": 2},
            {"backend": "plain", **rate, "samples": 9},
        ],
    }
    path.write_text(json.dumps(older))
    fresh = Scoreboard()
    fresh.load(path, {"plain": "coder", "ngram": "coder", "draft": "draft"})
    coder, draft = fresh.prompt_speed("coder"), fresh.prompt_speed("draft")
    assert coder is not None and (coder.samples, coder.tokens_per_s) == (9, 100.0)
    assert draft is not None and fresh.prompt_speed("plain") is None


def test_a_cell_measured_partly_on_a_busy_machine_keeps_all_its_samples_across_a_restart(
    tmp_path: Path,
) -> None:
    # Calibration skips a cell holding as many samples as it would send: counting the quiet
    # ones only made a restart recalibrate every cell a busy CI machine had touched.
    path = tmp_path / "scoreboard.json"
    board = Scoreboard()
    for contended in (False, True, False):
        board.record(Outcome("plain", "code", 1, 10.0, 10.0, 100, 0, 0, contended=contended))
    board.save(path)
    again = Scoreboard()
    again.load(path)
    assert again.samples("plain", "code", 1) == 3
    quiet = again.get("plain", "code", 1)
    assert quiet is not None and quiet.samples == 2
    assert again.samples("plain", "prose", 1) == 0
