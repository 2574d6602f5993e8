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
