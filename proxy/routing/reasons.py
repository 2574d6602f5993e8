"""Route reasons: why a request went to its backend, each with the rule that gives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What the route policy gives an `auto` request, in the order its rules decide.
AutoReason = Literal[
    "only_healthy",
    "unmeasured",
    "only_measured",
    "recheck",
    "join_batch",
    "spill",
    "join_queue",
    "wait_device",
    "explore",
    "demoted",
    "affinity",
    "within_margin",
    "fastest",
]
# Every reason a request can carry: the policy's, and those given without asking it.
RouteReason = Literal["pinned", "least_busy", "calibration", AutoReason]


@dataclass(frozen=True)
class Reason:
    """Where a reason is decided, when it is given, and whether the default layout can give it."""

    given_by: str
    when: str
    # Why the default layout (plain and ngram one engine, draft its own, one CPU) never gives
    # it; empty where it can.
    not_on_default: str = ""


REASONS: dict[RouteReason, Reason] = {
    "pinned": Reason(
        "`Router.route`",
        'the model id names a backend (`"model": "ngram"`): no choice is made',
    ),
    "least_busy": Reason(
        "`Router.choose_any`",
        "a request that generates nothing (tokenize, detokenize, apply-template, embeddings, "
        "token counts) with `auto`: any ready backend, one that starts at once first, then the "
        "least loaded, then the one holding most of the prompt",
    ),
    "calibration": Reason(
        "`Pipeline.background`",
        "the proxy's own start-up calibration request; only in the log line, never in a "
        "client's headers or the metrics",
    ),
    "only_healthy": Reason(
        "`RoutePolicy.choose`",
        "the only ready backend with room in its queue (on the default layout: the draft, while "
        "the engine of plain and ngram is down or its queue is full)",
    ),
    "unmeasured": Reason(
        "`RoutePolicy.choose`",
        "a backend never measured for the class, the request cheap to send there (at most 512 "
        "prompt tokens more than the cheapest choice): the first such in configuration order",
    ),
    "only_measured": Reason(
        "`RoutePolicy.choose`",
        "the only backend measured for the class; the others are not measured with this "
        "request, whose prompt would cost each of them more than 512 tokens more",
    ),
    "recheck": Reason(
        "`_rule_recheck`",
        "on a quiet machine, an idle device and a cheap request, a backend known for the class "
        "only from samples taken while other programs used the machine is re-measured",
    ),
    "join_batch": Reason(
        "`_rule_join_or_spill`",
        "the best cannot start at once; another backend on its device can (its engine is the one "
        "decoding there) and would take at most 25 % longer for the whole request",
    ),
    "spill": Reason(
        "`_rule_join_or_spill`",
        "the best cannot start at once; a backend on another device can, and would take at most "
        "50 % longer or finish before the best would after its wait",
        "all its backends are on one device",
    ),
    "join_queue": Reason(
        "`_rule_wait_for_device`",
        "the best waits for its device, which runs another engine next; a backend of that "
        "engine within 25 % is taken rather than waiting for a second drain",
    ),
    "wait_device": Reason(
        "`_rule_wait_for_device`",
        "the best waits for its device (another engine decodes there, or requests wait for it) "
        "and either its own engine runs next or no backend of the one that does is within 25 %",
    ),
    "explore": Reason(
        "`_rule_explore`",
        "a probe (`explore_share` of decisions): a backend other than the best, on an idle "
        "device, cheap to move to (on a shared device only one within 25 % of the best or "
        "whose 90 % interval reaches the best's), never an agent session's first turn",
    ),
    "demoted": Reason(
        "`_rule_fastest`",
        "the backend the whole request would be fastest on is a speculative one whose recent "
        "acceptance fell below its break-even; the best of the others is taken",
    ),
    "affinity": Reason(
        "`_rule_fastest`",
        "the prompt held in a backend's cache decided: with nothing cached anywhere another "
        "backend would be fastest for the whole request (between two strategies of one engine "
        "it never decides: both hold the same prompt)",
    ),
    "within_margin": Reason(
        "`_rule_fastest`",
        "the speculation margin decided: a speculative backend would be fastest for the whole "
        "request, but not by more than `speculation_margin` against plain decoding",
    ),
    "fastest": Reason(
        "`_rule_fastest`",
        "the backend the whole request (uncached prompt and expected answer at this load) is "
        "fastest on, and none of the rules above changed that",
    ),
}
