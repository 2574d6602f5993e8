"""The policy's decisions on given measurements: speed order, load levels, break-even, exploring."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from proxy.backends.devices import Device
from proxy.routing.break_even import break_even_acceptance, speedup
from proxy.routing.policy import RoutePolicy
from proxy.routing.ranking import RequestCost, RouteChoice
from proxy.routing.scoreboard import Outcome, Scoreboard, load_level
from tests.policy_inputs import Backend, chosen, estimate, measure, on_device, shared


def test_load_levels() -> None:
    assert [load_level(n) for n in (1, 2, 3, 4, 5, 8, 30)] == [1, 2, 4, 4, 8, 8, 8]


def test_speedup_matches_the_paper() -> None:
    # Free drafts at acceptance 0.8, 4 drafted tokens: (1 - 0.8**5) / 0.2 = 3.36 tokens per step.
    assert speedup(0.8, 4, 0.0) == pytest.approx(3.3616)
    assert speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)


def test_break_even_from_a_winning_and_a_losing_draft() -> None:
    # A draft that doubles speed at 0.8 acceptance breaks even well below 0.8.
    winning = break_even_acceptance(0.8, 2.0, 3)
    assert winning is not None and 0.1 < winning < 0.8
    # The 0.5B draft on 2 CPU cores, about half plain's speed at 0.69-0.75 acceptance on code
    # (docs/bench-cpu.md), never breaks even.
    assert break_even_acceptance(0.75, 0.53, 3) is None


def test_fastest_backend_for_the_task_wins() -> None:
    board = Scoreboard()
    plain, ngram = Backend("plain"), Backend("ngram", "ngram-mod")
    measure(board, "plain", "code", 30)
    measure(board, "ngram", "code", 28)
    measure(board, "plain", "echo", 29)
    measure(board, "ngram", "echo", 56)
    policy = RoutePolicy(board, explore_share=0)
    assert chosen(policy, "code", [plain, ngram]).backend == "plain"
    assert chosen(policy, "echo", [plain, ngram]).backend == "ngram"


def test_speculation_has_to_win_by_more_than_the_margin() -> None:
    board = Scoreboard()
    plain, ngram = Backend("plain"), Backend("ngram", "ngram-mod")
    measure(board, "plain", "echo", 10.0)
    measure(board, "ngram", "echo", 10.4)  # a near-tie, as on 2 CPU cores
    measure(board, "plain", "code", 10.0)
    measure(board, "ngram", "code", 10.6)
    policy = RoutePolicy(board, explore_share=0)
    choice = policy.choose("echo", [plain, ngram])
    assert choice is not None and (choice.backend, choice.reason) == ("plain", "within_margin")
    choice = policy.choose("code", [plain, ngram])
    assert choice is not None and (choice.backend, choice.reason) == ("ngram", "fastest")
    # Without plain decoding to compare with, the faster speculative backend simply wins.
    draft = Backend("draft", "draft-simple")
    measure(board, "draft", "echo", 10.2)
    choice = policy.choose("echo", [draft, ngram])
    assert choice is not None and (choice.backend, choice.reason) == ("ngram", "fastest")
    assert RoutePolicy(board, explore_share=0, speculation_margin=0).choose(
        "echo", [plain, ngram]
    ) == RouteChoice("ngram", "fastest", 1)


def test_unmeasured_backends_are_tried_first_and_unready_ones_never() -> None:
    board = Scoreboard()
    measure(board, "plain", "code", 30)
    choice = RoutePolicy(board).choose("code", [Backend("plain"), Backend("draft", "draft-simple")])
    assert choice is not None and (choice.backend, choice.reason) == ("draft", "unmeasured")
    only = RoutePolicy(board).choose("code", [Backend("plain"), Backend("x", ready=False)])
    assert only is not None and only.reason == "only_healthy"
    assert RoutePolicy(board).choose("code", [Backend("x", ready=False)]) is None


def test_the_choice_follows_the_load_level() -> None:
    board = Scoreboard()
    plain, draft = Backend("plain", in_flight=3), Backend("draft", "draft-simple", in_flight=3)
    for level, (p, d) in {1: (20, 40), 4: (60, 45)}.items():
        measure(board, "plain", "code", p, level)
        measure(board, "draft", "code", d, level, draft_n=60, accepted=50)
    policy = RoutePolicy(board, explore_share=0)
    assert chosen(policy, "code", [plain, draft]).backend == "plain"
    plain.in_flight = draft.in_flight = 0
    assert chosen(policy, "code", [plain, draft]).backend == "draft"


def test_collapsed_acceptance_demotes_a_faster_draft_until_it_recovers() -> None:
    board = Scoreboard()
    plain, draft = Backend("plain"), Backend("draft", "draft-simple")
    measure(board, "plain", "code", 30)
    for _ in range(5):
        measure(board, "draft", "code", 60, draft_n=60, accepted=48)
    policy = RoutePolicy(board, explore_share=0)
    assert chosen(policy, "code", [plain, draft]).backend == "draft"
    for _ in range(3):  # e.g. temperature 1.0 traffic: acceptance collapses, speed follows
        measure(board, "draft", "code", 25, draft_n=60, accepted=3)
    # Its decayed speed still looks better than plain's: acceptance is the faster signal.
    assert estimate(board, "draft", "code", 1).tokens_per_s > 30
    choice = policy.choose("code", [plain, draft])
    assert choice is not None and (choice.backend, choice.reason) == ("plain", "demoted")
    for _ in range(3):
        measure(board, "draft", "code", 60, draft_n=60, accepted=50)
    assert chosen(policy, "code", [plain, draft]).backend == "draft"


def test_exploration_is_bounded_by_its_share() -> None:
    board = Scoreboard()
    backends = [Backend("plain"), Backend("ngram", "ngram-mod")]
    measure(board, "plain", "prose", 30)
    measure(board, "ngram", "prose", 20)
    policy = RoutePolicy(board, explore_share=0.1, rng=random.Random(7))
    reasons = [chosen(policy, "prose", backends).reason for _ in range(2000)]
    share = reasons.count("explore") / len(reasons)
    assert 0.08 < share < 0.12


def test_exploration_prefers_near_ties_but_still_probes_slow_backends() -> None:
    board = Scoreboard()
    backends = [Backend("plain"), Backend("ngram", "ngram-mod"), Backend("draft", "draft-simple")]
    measure(board, "ngram", "echo", 40)
    measure(board, "plain", "echo", 36)
    measure(board, "draft", "echo", 16)
    policy = RoutePolicy(board, explore_share=0.2, rng=random.Random(3))
    picks = [policy.choose("echo", backends) for _ in range(4000)]
    probes = Counter(c.backend for c in picks if c is not None and c.reason == "explore")
    assert "ngram" not in probes
    # Weights follow the estimated speed to the fourth: (36/40)^4 for plain, (16/40)^4 draft.
    assert probes["draft"] > 0
    assert 15 < probes["plain"] / probes["draft"] < 45


def test_on_a_shared_device_only_near_ties_are_probed() -> None:
    # A probe holds the device for a whole answer: on a shared one, a slow backend's probe
    # would make every request arriving meanwhile wait for it.
    board = Scoreboard()
    for jitter in (1.0, 1.01, 0.99, 1.005):  # a clear, repeated measurement
        measure(board, "plain", "code", 18 * jitter)
        measure(board, "ngram", "code", 17 * jitter)
        measure(board, "draft", "code", 12 * jitter)
    policy = RoutePolicy(board, explore_share=0.5, rng=random.Random(5))
    one_cpu = shared(
        Backend("plain"), Backend("ngram", "ngram-mod"), Backend("draft", "draft-simple")
    )
    picks = [policy.choose("code", one_cpu) for _ in range(400)]
    probes = Counter(c.backend for c in picks if c is not None and c.reason == "explore")
    assert set(probes) == {"ngram"}


def test_on_a_shared_device_one_slow_sample_does_not_bar_a_backend() -> None:
    # One sample cannot tell 12 t/s from 18 (its interval is a factor of two either way):
    # the twin measured once on a bad moment is probed until a repeat settles it.
    board = Scoreboard()
    for jitter in (1.0, 1.01, 0.99, 1.005):
        measure(board, "plain", "code", 18 * jitter)
    measure(board, "twin", "code", 12)
    policy = RoutePolicy(board, explore_share=0.5, rng=random.Random(5))
    one_cpu = shared(Backend("plain"), Backend("twin"))
    picks = [policy.choose("code", one_cpu) for _ in range(40)]
    assert any(c is not None and (c.backend, c.reason) == ("twin", "explore") for c in picks)
    measure(board, "twin", "code", 12.1)  # the repeat agrees: clearly slower, not probed again
    picks = [policy.choose("code", one_cpu) for _ in range(400)]
    assert all(c is not None and c.backend == "plain" for c in picks)


def test_no_exploring_next_to_busy_backends_on_a_shared_device() -> None:
    board = Scoreboard()
    measure(board, "plain", "prose", 30)
    measure(board, "ngram", "prose", 29)
    measure(board, "draft", "prose", 25)

    def backends() -> list[Backend]:
        # Pinned traffic keeps two backends busy; the draft is idle.
        return [
            Backend("plain", in_flight=1),
            Backend("ngram", "ngram-mod", in_flight=1),
            Backend("draft", "draft-simple"),
        ]

    # One thread each on a 3-core CPU: the draft has room, but its device does not idle.
    partitioned = shared(*backends(), share=1, capacity=3)
    policy = RoutePolicy(board, explore_share=0.5, rng=random.Random(1))
    assert {chosen(policy, "prose", partitioned).reason for _ in range(200)} == {"fastest"}
    separate = backends()  # each on a device of its own
    assert "explore" in {chosen(policy, "prose", separate).reason for _ in range(200)}


def test_load_level_counts_the_whole_device_and_only_it() -> None:
    board = Scoreboard()
    measure(board, "plain", "code", 30, level=1)
    measure(board, "plain", "code", 12, level=4)
    measure(board, "ngram", "code", 28, level=1)
    measure(board, "ngram", "code", 6, level=4)
    # Pinned traffic keeps both busy: three requests on the device, so the next runs at level 4.
    plain, ngram = Backend("plain", in_flight=2), Backend("ngram", "ngram-mod", in_flight=1)
    on_one = shared(plain, ngram, share=1)
    choice = RoutePolicy(board, explore_share=0).choose("code", on_one)
    assert choice is not None and (choice.backend, choice.level) == ("plain", 4)
    plain, ngram = Backend("plain", in_flight=2), Backend("ngram", "ngram-mod", in_flight=1)
    choice = RoutePolicy(board, explore_share=0).choose("code", [plain, ngram])
    assert choice is not None and (choice.backend, choice.level) == ("ngram", 2)


def test_requests_join_the_batch_decoding_on_the_device() -> None:
    board = Scoreboard()
    measure(board, "plain", "echo", 36)
    measure(board, "ngram", "echo", 40)
    measure(board, "draft", "echo", 15)  # under half the best: a probe there is not joined
    policy = RoutePolicy(board, explore_share=0)
    serialised = shared(Backend("plain", in_flight=1), Backend("ngram", "ngram-mod"))
    assert policy.choose("echo", serialised) == RouteChoice("plain", "join_batch", 2)
    # With a core each, the best starts beside the busy one.
    partitioned = shared(Backend("plain", in_flight=1), Backend("ngram", "ngram-mod"), share=1)
    assert policy.choose("echo", partitioned) == RouteChoice("ngram", "fastest", 2)
    separate = [Backend("plain", in_flight=1), Backend("ngram", "ngram-mod")]
    assert policy.choose("echo", separate) == RouteChoice("ngram", "fastest", 1)
    # A clearly slower busy backend (an exploration probe on the draft) is not joined: the
    # request waits for the device instead of starting the best beside it.
    probed = shared(
        Backend("plain"), Backend("ngram", "ngram-mod"), Backend("draft", "draft-simple", 1)
    )
    assert policy.choose("echo", probed) == RouteChoice("ngram", "wait_device", 2)


def test_under_load_the_backend_measured_fastest_at_that_load_is_waited_for() -> None:
    # Alone, plain and ngram tie (plain wins the margin); at four streams ngram makes 1.5x. A
    # request arriving while plain decodes three must not join plain's batch for good: it waits
    # for the device, so the batch moves to ngram once plain's streams finish.
    board = Scoreboard()
    measure(board, "plain", "prose", 30)
    measure(board, "ngram", "prose", 31)
    measure(board, "plain", "prose", 12, level=4)
    measure(board, "ngram", "prose", 18, level=4)
    policy = RoutePolicy(board, explore_share=0)
    idle = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    assert policy.choose("prose", idle) == RouteChoice("plain", "within_margin", 1)
    loaded = shared(Backend("plain", in_flight=3), Backend("ngram", "ngram-mod"))
    assert policy.choose("prose", loaded) == RouteChoice("ngram", "wait_device", 4)
    # Once ngram decodes, later requests join it.
    moved = shared(Backend("plain"), Backend("ngram", "ngram-mod", in_flight=3))
    assert policy.choose("prose", moved) == RouteChoice("ngram", "fastest", 4)
    # A near-tie at that load is joined: waiting would cost a drain for nothing.
    tie = Scoreboard()
    measure(tie, "plain", "prose", 16.5, level=4)
    measure(tie, "ngram", "prose", 18, level=4)
    assert chosen(RoutePolicy(tie, explore_share=0), "prose", loaded).reason == "join_batch"


def test_backends_are_compared_at_a_load_level_both_were_measured_at() -> None:
    # plain was measured only alone; ngram alone and at two streams. At two streams the only
    # fair comparison is the one-stream one, not plain alone against ngram shared.
    board = Scoreboard()
    measure(board, "plain", "echo", 17)
    measure(board, "ngram", "echo", 23)
    measure(board, "ngram", "echo", 9.4, level=2)
    policy = RoutePolicy(board, explore_share=0)
    busy = shared(Backend("plain"), Backend("ngram", "ngram-mod", in_flight=1))
    assert policy.choose("echo", busy) == RouteChoice("ngram", "fastest", 2)
    # On devices of their own each runs at its own load, where each was measured.
    apart = [Backend("plain"), Backend("ngram", "ngram-mod", in_flight=1)]
    assert policy.choose("echo", apart) == RouteChoice("plain", "fastest", 1)


def test_a_speculative_batch_a_little_slower_than_plain_is_joined_not_waited_out() -> None:
    # ngram drafts at four streams and measures 8 % below plain: plain is the better start,
    # but with ngram decoding, waiting for plain would idle the request for a whole drain.
    board = Scoreboard()
    measure(board, "plain", "code", 5.5, level=4)
    measure(board, "ngram", "code", 5.1, level=4, draft_n=60, accepted=20)
    policy = RoutePolicy(board, explore_share=0)
    busy = shared(Backend("plain"), Backend("ngram", "ngram-mod", in_flight=3))
    assert policy.choose("code", busy) == RouteChoice("ngram", "join_batch", 4)
    idle = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    assert policy.choose("code", idle) == RouteChoice("plain", "fastest", 1)


def test_a_full_batch_about_as_fast_is_queued_at_rather_than_drained() -> None:
    # plain decodes four streams, every slot taken; ngram measures a little better at that
    # load. A plain slot frees when one answer ends, the device only when all four have.
    board = Scoreboard()
    measure(board, "plain", "code", 5.5, level=4)
    measure(board, "ngram", "code", 6.2, level=4)
    policy = RoutePolicy(board, explore_share=0)
    full = shared(Backend("plain", in_flight=4, saturated=True), Backend("ngram", "ngram-mod"))
    assert policy.choose("code", full) == RouteChoice("plain", "join_batch", 8)
    # For a clear gain the request waits for the device to move.
    measure(board, "ngram", "code", 12, level=4)
    measure(board, "ngram", "code", 12, level=4)
    assert policy.choose("code", full) == RouteChoice("ngram", "wait_device", 8)


async def test_a_request_that_must_wait_goes_where_the_device_goes_next() -> None:
    # plain decodes two code streams and a request for ngram already waits for the device:
    # whatever comes next waits anyway, and waiting for plain would mean a second drain.
    board = Scoreboard()
    measure(board, "plain", "code", 6.0, level=4)
    measure(board, "ngram", "code", 5.8, level=4)
    plain, ngram = Backend("plain", in_flight=2), Backend("ngram", "ngram-mod")
    on_one = shared(plain, ngram)
    waiter = asyncio.create_task(on_one[0].device.admit("ngram"))
    await asyncio.sleep(0)
    policy = RoutePolicy(board, explore_share=0)
    assert policy.choose("code", on_one) == RouteChoice("ngram", "join_queue", 4)
    # A backend queued next but far slower is not followed: the request waits for the best.
    measure(board, "ngram", "code", 1.0, level=4)
    measure(board, "ngram", "code", 1.0, level=4)
    assert policy.choose("code", on_one) == RouteChoice("plain", "wait_device", 4)
    waiter.cancel()


def test_busy_fastest_backend_is_queued_at_unless_another_device_has_room() -> None:
    board = Scoreboard()
    measure(board, "plain", "code", 30)
    measure(board, "ngram", "code", 20)
    policy = RoutePolicy(board, explore_share=0)
    busy = shared(Backend("plain", in_flight=4, saturated=True), Backend("ngram", "ngram-mod"))
    assert policy.choose("code", busy) == RouteChoice("plain", "fastest", 8)
    full = shared(
        Backend("plain", in_flight=4, saturated=True, queue_full=True),
        Backend("ngram", "ngram-mod"),
    )
    assert policy.choose("code", full) == RouteChoice("ngram", "only_healthy", 8)
    separate = [Backend("plain", in_flight=4, saturated=True), Backend("ngram", "ngram-mod")]
    assert policy.choose("code", separate) == RouteChoice("ngram", "spill", 1)


def test_scoreboard_decays_toward_new_measurements() -> None:
    board = Scoreboard(alpha=0.2)
    measure(board, "b", "code", 100)
    for _ in range(20):
        measure(board, "b", "code", 50)
    est = board.get("b", "code", 1)
    assert est is not None and 50 <= est.tokens_per_s < 52 and est.samples == 21
    board.record(Outcome("b", "code", 1, 999, None, 2, 0, 0))  # too short to count
    assert estimate(board, "b", "code", 1).samples == 21


def test_an_answer_weighs_as_much_as_the_time_it_took() -> None:
    # Two requests, 40 tokens at 10 t/s (4 s) and 400 at 30 t/s (13.3 s): the backend gave
    # 440 tokens in 17.3 s, 25.4 t/s, not the 20 t/s mean of the two rates.
    board = Scoreboard()
    board.record(Outcome("ngram", "echo", 1, 10.0, None, 40, 0, 0))
    board.record(Outcome("ngram", "echo", 1, 30.0, None, 400, 320, 300))
    est = board.get("ngram", "echo", 1)
    assert est is not None and est.tokens_per_s == pytest.approx(440 / (4 + 400 / 30))
    board.record(Outcome("ngram", "echo", 1, 0.0, None, 64, 0, 0))  # no rate: not a sample
    assert estimate(board, "ngram", "echo", 1).samples == 2


def test_a_sessions_first_turn_compares_backends_at_a_level_all_were_measured_at() -> None:
    # Seen in the session benchmark: plain measured at two streams while another session's
    # prompt shared its batch (1.3 t/s), draft never measured at two; weighing the session's
    # classes at "the nearest level" set draft's one-stream speed against plain's busy one and
    # sent both sessions to draft, the slowest backend on this CPU.
    board = Scoreboard()
    for _ in range(3):
        for task in ("code", "echo"):
            measure(board, "plain", task, 20.0)
            measure(board, "plain", task, 1.3, level=2)
            measure(board, "draft", task, 13.0, accepted=60, draft_n=80)
    backends = shared(Backend("plain", in_flight=1), Backend("draft", spec_type="draft-simple"))
    first_turn = RequestCost(prompt_tokens=2800, agent="change")
    choice = RoutePolicy(board, explore_share=0.0).choose("code", backends, first_turn)
    assert choice is not None and choice.backend == "plain"


def test_a_calibration_request_on_the_device_is_looked_past_not_joined() -> None:
    # Calibration decodes on ngram, which measures within the join margin of plain: a user's
    # request still goes to plain, the fastest, and waits for that one request, rather than
    # joining or spilling to where calibration happens to be.
    board = Scoreboard()
    measure(board, "plain", "echo", 36)
    measure(board, "ngram", "echo", 33)
    policy = RoutePolicy(board, explore_share=0)
    plain, ngram = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    assert plain.device.try_admit("ngram")
    with plain.device.background("ngram"):
        assert not plain.device.admits("plain")
        assert policy.choose("echo", [plain, ngram]) == RouteChoice("plain", "fastest", 1)
    # The same request of a user's is another user's batch: joined, as before.
    ngram.in_flight = 1
    assert policy.choose("echo", [plain, ngram]) == RouteChoice("ngram", "join_batch", 2)


def test_a_draft_backend_is_never_taken_for_faster_at_prompts_than_plain() -> None:
    # Its prompt samples came from short calibration prompts and read faster than plain's from
    # long agent turns; but the draft model processes every prompt beside the target. An
    # agent's long first turn, decoded faster on plain, must not go to the draft for its prompt.
    board = Scoreboard()
    measure(board, "plain", "code", 25)
    measure(board, "ngram", "code", 31, draft_n=40, accepted=30)
    measure(board, "draft", "code", 16, draft_n=80, accepted=68)
    board.record(Outcome("plain", "code", 1, 25, 0.1, 64, 0, 0, 1200, 30e3, engine="coder"))
    board.record(Outcome("draft", "code", 1, 16, 0.1, 64, 80, 68, 600, 10e3))
    policy = RoutePolicy(board, explore_share=0)
    coder = Device("cpu", 2)
    plain = Backend("plain", process="coder")
    ngram = Backend("ngram", "ngram-mod", process="coder")
    draft = Backend("draft", "draft-simple")
    on_device(coder, [plain, ngram, draft])
    long_turn = RequestCost(prompt_tokens=3000, max_tokens=40)
    choice = policy.choose("code", [plain, ngram, draft], long_turn)
    assert choice is not None and choice.backend == "ngram"
    # ngram shares plain's process: its prompt speed is the engine's, not the slowest measured.
    assert policy._prompt_speeds([plain, ngram, draft]) == {
        "plain": 40.0,
        "ngram": 40.0,
        "draft": 40.0,
    }
