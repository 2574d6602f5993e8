"""The routing benchmark's arithmetic: overall speed and the bootstrap over prompts."""

from __future__ import annotations

from scripts.routing_benchmark import Sample, bootstrap, tps


def samples(speeds: list[float]) -> list[Sample]:
    return [Sample("code", "plain", "fastest", 64, 64 / s) for s in speeds]


def test_speed_is_tokens_over_seconds_not_a_mean_of_rates() -> None:
    assert tps(samples([10.0, 40.0])) == 128 / (6.4 + 1.6)


def test_the_same_choices_are_never_faster_and_the_interval_is_one() -> None:
    same = samples([8.0, 9.5, 10.0, 12.0, 7.0])
    assert bootstrap(same, same) == (0.0, 1.0, 1.0)


def test_faster_on_every_prompt_wins_every_resample() -> None:
    slow = samples([8.0, 9.5, 10.0, 12.0, 7.0])
    fast = samples([s * 1.1 for s in [8.0, 9.5, 10.0, 12.0, 7.0]])
    wins, low, high = bootstrap(fast, slow)
    assert wins == 1.0
    assert 1.09 < low <= high < 1.11


def test_one_lucky_prompt_gives_a_wide_interval() -> None:
    base = [10.0] * 9 + [10.0]
    lucky = [10.0] * 9 + [30.0]
    wins, low, high = bootstrap(samples(lucky), samples(base))
    assert low == 1.0 and high > 1.05
    assert 0.5 < wins < 0.8
