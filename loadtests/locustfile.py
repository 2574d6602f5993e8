"""Locust scenarios for specproxy: single-stream, batched and coding-agent users, and metrics.

Run from the repository root, e.g.:
    locust -f loadtests/locustfile.py --headless -u 4 -r 4 -t 60s --host http://127.0.0.1:8080 \
        BatchedUser --model plain --task code --max-tokens 64
Besides each request ("chat:<task>"), every answer fires "tps:<task>:<backend>" (response time
column = generation tokens/s, length = tokens) and, when streaming, "ttft:<task>:<backend>"
(time to first token, ms).  --results-file keeps every request as a JSON line.

AgentSessionUser runs coding-agent sessions (loadtests/sessions/), each user its own growing
conversation with the answers really replayed; its task is "agent-<shape>", and every turn also
fires "cached:agent-<shape>:<backend>" (response time column = % of the prompt served from cache):
    locust -f loadtests/locustfile.py --headless -u 4 -r 4 -t 900s --host http://127.0.0.1:8080 \
        AgentSessionUser --model auto --session-shape edit-heavy --session-turns 8 \
        --sessions-per-user 1
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from locust import User, constant, events, task
from locust.env import Environment
from locust.exception import StopUser

from loadtests.measure import Sample, summarise, write_samples
from loadtests.prompts import PROMPTS, Messages, prompt_stream
from loadtests.sessions import (
    DEFAULT_SYSTEM_TOKENS,
    DEFAULT_TURNS,
    SHAPES,
    AnswerStream,
    Session,
    Shape,
    TurnSample,
    build_session,
    cached_share,
    send_turn,
    turn_sample,
)
from proxy.llamacpp import Timings
from proxy.sse import SseSplitter, data_of, is_done

log = logging.getLogger("loadtests")
TASKS = (*PROMPTS, "mixed")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="auto",
        env_var="LOCUST_MODEL",
        help="a backend name to pin (same load on plain and speculative backends), or auto",
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="mixed",
        env_var="LOCUST_TASK",
        help="prompt class to send; mixed rotates through all",
    )
    parser.add_argument("--max-tokens", type=int, default=64, env_var="LOCUST_MAX_TOKENS")
    parser.add_argument("--temperature", type=float, default=0.0, env_var="LOCUST_TEMPERATURE")
    parser.add_argument(
        "--stream",
        choices=("true", "false"),
        default="true",
        env_var="LOCUST_STREAM",
        help="stream the answer (needed for time to first token)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        env_var="LOCUST_REQUESTS",
        help="stop after issuing this many requests in all; 0 runs until --run-time",
    )
    parser.add_argument(
        "--prompt-start",
        type=int,
        default=0,
        env_var="LOCUST_PROMPT_START",
        help="first prompt of the class's pool to send (the sweep gives each cell its own)",
    )
    parser.add_argument(
        "--prompt-count",
        type=int,
        default=0,
        env_var="LOCUST_PROMPT_COUNT",
        help="prompts of the pool to send from --prompt-start, then again renamed afresh; 0: the "
        "whole pool",
    )
    parser.add_argument(
        "--api-key",
        default="",
        env_var="LOCUST_API_KEY",
        is_secret=True,
        help="sent as a Bearer token, for a proxy configured with api_keys",
    )
    parser.add_argument(
        "--results-file",
        default="",
        env_var="LOCUST_RESULTS_FILE",
        help="write every request as a JSON line here when the test stops",
    )
    sessions = parser.add_argument_group("AgentSessionUser")
    sessions.add_argument(
        "--session-shape",
        choices=SHAPES,
        default="mixed",
        env_var="LOCUST_SESSION_SHAPE",
        help="edit-heavy (reads then rewrites and edits), explain (reads and prose), or mixed",
    )
    sessions.add_argument(
        "--session-turns",
        type=int,
        default=DEFAULT_TURNS,
        env_var="LOCUST_SESSION_TURNS",
        help="requests per session",
    )
    sessions.add_argument(
        "--system-tokens",
        type=int,
        default=DEFAULT_SYSTEM_TOKENS,
        env_var="LOCUST_SYSTEM_TOKENS",
        help="size of each session's system prompt, in tokens (tools come on top)",
    )
    sessions.add_argument(
        "--session-seed",
        type=int,
        default=0,
        env_var="LOCUST_SESSION_SEED",
        help="which sessions: the same seed gives every mode the same ones",
    )
    sessions.add_argument(
        "--sessions-per-user",
        type=int,
        default=0,
        env_var="LOCUST_SESSIONS_PER_USER",
        help="stop each user after this many sessions (the run ends when all have); 0: go on",
    )
    sessions.add_argument(
        "--session-max-tokens",
        type=int,
        default=0,
        env_var="LOCUST_SESSION_MAX_TOKENS",
        help="cap every turn's max_tokens (0: by turn kind, 48 for a tool call to 600 for a "
        "whole-file write)",
    )


# locust declares no types (pyproject.toml ignores its imports), so its calls are untyped.
events.init_command_line_parser.add_listener(_add_arguments)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class LoadOptions:
    """What each request sends, from the command line (or LOCUST_* variables)."""

    model: str
    task: str
    max_tokens: int
    temperature: float
    stream: bool
    requests: int
    prompt_start: int
    prompt_count: int
    api_key: str
    results_file: Path | None
    session_shape: Shape = "mixed"  # the parser offers SHAPES alone
    session_turns: int = DEFAULT_TURNS
    system_tokens: int = DEFAULT_SYSTEM_TOKENS
    session_seed: int = 0
    sessions_per_user: int = 0
    session_max_tokens: int = 0

    @classmethod
    def of(cls, environment: Environment) -> LoadOptions:
        """The options of this run."""
        opts = environment.parsed_options
        assert opts is not None, "run with the locust command, which parses the options"
        return cls(
            model=opts.model,
            task=opts.task,
            max_tokens=opts.max_tokens,
            temperature=opts.temperature,
            stream=opts.stream == "true",
            requests=opts.requests,
            prompt_start=opts.prompt_start,
            prompt_count=opts.prompt_count,
            api_key=opts.api_key,
            results_file=Path(opts.results_file) if opts.results_file else None,
            session_shape=opts.session_shape,
            session_turns=opts.session_turns,
            system_tokens=opts.system_tokens,
            session_seed=opts.session_seed,
            sessions_per_user=opts.sessions_per_user,
            session_max_tokens=opts.session_max_tokens,
        )


class _RunState:
    """Requests issued, in flight and finished across all users of this process."""

    def __init__(self) -> None:
        self.issued = 0
        self.in_flight = 0
        self.samples: list[Sample] = []
        self.prompts: Iterator[tuple[str, Messages]] = iter(())
        self.sessions_started = 0
        self.agents_active = 0

    def reset(self, prompts: Iterator[tuple[str, Messages]]) -> None:
        """Forget the previous run (the web UI can start several in one process)."""
        self.issued, self.in_flight, self.samples = 0, 0, []
        self.sessions_started = 0
        # One sequence for all users, so concurrent users send different prompts.
        self.prompts = prompts

    def claim(self, limit: int) -> bool:
        """Take a request ticket; False once `limit` (if any) have been issued."""
        if limit and self.issued >= limit:
            return False
        self.issued += 1
        return True


_RUN = _RunState()


class _Failed(Exception):
    """The answer was not a complete completion with llama.cpp's timings."""


def _read_stream(resp: requests.Response, sample: Sample, t0: float) -> tuple[dict[str, Any], int]:
    """Consume SSE events, counting tokens as they arrive; returns the timings and byte count."""
    timings: dict[str, Any] = {}
    lines, done, size = SseSplitter(), False, 0
    # chunk_size=None hands over each chunk as it arrives, so time to first token is exact.
    for chunk in resp.iter_content(chunk_size=None):
        size += len(chunk)
        for line in lines.feed(chunk):
            if is_done(line):
                done = True
                continue
            event = data_of(line)
            if not isinstance(event, dict):
                continue
            if "error" in event:
                raise _Failed(f"error event: {event['error']}")
            timings = event.get("timings") or timings
            choices = event.get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                if sample.ttft_s is None:
                    sample.ttft_s = time.perf_counter() - t0
                # One token per chunk; only a cut request keeps this count, the others take
                # predicted_n from the timings.
                sample.tokens += 1
                sample.last_token_s = time.perf_counter() - t0
    if not done:
        raise _Failed("the stream ended without [DONE]")
    return timings, size


class _ChatUser(User):
    """Sends chat completions one after another, measuring each answer."""

    abstract = True
    # Closed loop: the next request follows the answer at once, as a busy client would.
    wait_time = constant(0)

    def on_start(self) -> None:
        """Open a connection pool and read the options."""
        self.http = requests.Session()
        if not self.host:
            raise StopUser("set --host to the proxy's URL")
        self.url = f"{self.host.rstrip('/')}/v1/chat/completions"
        self.options = LoadOptions.of(self.environment)
        if self.options.api_key:
            self.http.headers["Authorization"] = f"Bearer {self.options.api_key}"

    def on_stop(self) -> None:
        """Close the connection pool."""
        self.http.close()

    @task
    def chat(self) -> None:
        """One chat completion, then its request and metric events."""
        opts = self.options
        if not _RUN.claim(opts.requests):
            if _RUN.in_flight == 0:
                assert self.environment.runner is not None
                self.environment.runner.quit()
            raise StopUser()
        task_class, messages = next(_RUN.prompts)
        sample = Sample(start=time.time(), task=task_class, model=opts.model, stream=opts.stream)
        t0 = time.perf_counter()
        size = 0
        _RUN.in_flight += 1
        try:
            size = self._send(messages, sample, t0)
        finally:
            # Also runs when locust stops this user mid-request at the end of the run: the
            # sample stays "cut", keeping the tokens that did arrive.
            sample.end = time.time()
            _RUN.in_flight -= 1
            _RUN.samples.append(sample)
        self._fire(sample, (time.perf_counter() - t0) * 1000, size)

    def _send(self, messages: Messages, sample: Sample, t0: float) -> int:
        """Make the request and fill the sample; returns the response size in bytes."""
        opts = self.options
        body: dict[str, Any] = {
            "model": opts.model,
            "messages": list(messages),
            "max_tokens": opts.max_tokens,
            "temperature": opts.temperature,
            "stream": opts.stream,
        }
        if opts.stream:
            body["stream_options"] = {"include_usage": True}
        try:
            with self.http.post(self.url, json=body, stream=opts.stream, timeout=(10, 600)) as resp:
                sample.status = resp.status_code
                sample.backend = resp.headers.get("X-Specproxy-Backend")
                sample.routed_task = resp.headers.get("X-Specproxy-Task")
                sample.route = resp.headers.get("X-Specproxy-Route")
                if resp.status_code != 200:
                    raise _Failed(f"HTTP {resp.status_code}: {resp.text[:300]}")
                if opts.stream:
                    timings, size = _read_stream(resp, sample, t0)
                else:
                    answer = resp.json()
                    if not isinstance(answer, dict):
                        raise _Failed(f"not a completion: {resp.text[:300]}")
                    timings = answer.get("timings") or {}
                    sample.tokens = int((answer.get("usage") or {}).get("completion_tokens", 0))
                    size = len(resp.content)
            measured = Timings.parse(timings)
            if not measured.measured:
                raise _Failed("the answer carries no llama.cpp timings")
        except (requests.RequestException, ValueError, _Failed) as exc:
            sample.outcome, sample.error = "failed", f"{exc.__class__.__name__}: {exc}"
            return 0
        sample.outcome = "ok"
        sample.tokens = measured.predicted_n or sample.tokens
        sample.tokens_per_s = measured.tokens_per_s
        sample.draft_n = measured.draft_n
        sample.draft_n_accepted = measured.draft_n_accepted
        return size

    def _fire(self, sample: Sample, elapsed_ms: float, size: int) -> None:
        _fire(self.environment, sample, elapsed_ms, size)


def _fire(environment: Environment, sample: Sample, elapsed_ms: float, size: int) -> None:
    """The request event of a sample, then its metric rows."""
    # Locust's EventHook.fire is untyped.
    request: Any = environment.events.request
    request.fire(
        request_type="POST",
        name=f"chat:{sample.task}",
        response_time=elapsed_ms,
        response_length=size,
        exception=RuntimeError(sample.error) if sample.outcome == "failed" else None,
        context={"backend": sample.backend},
    )
    if sample.outcome != "ok" or sample.tokens_per_s is None:
        return
    # Metric rows: locust's "response time" columns hold tokens/s and TTFT in ms here.
    where = f"{sample.task}:{sample.backend}"
    request.fire(
        request_type="METRIC",
        name=f"tps:{where}",
        response_time=sample.tokens_per_s,
        response_length=sample.tokens,
        exception=None,
        context={},
    )
    if sample.ttft_s is not None:
        request.fire(
            request_type="METRIC",
            name=f"ttft:{where}",
            response_time=sample.ttft_s * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    share = cached_share([sample]) if isinstance(sample, TurnSample) else None
    if isinstance(sample, TurnSample) and share is not None:
        request.fire(
            request_type="METRIC",
            name=f"cached:{where}",
            response_time=share * 100,
            response_length=sample.cache_n,
            exception=None,
            context={},
        )


class SingleStreamUser(_ChatUser):
    """One user, one request after another: what a lone client sees."""

    fixed_count = 1


class BatchedUser(_ChatUser):
    """As many users as -u asks, all at once: what a shared server sees."""


class AgentSessionUser(User):
    """A coding agent: one session after another, each turn resending the grown conversation.

    Every user runs its own sessions (numbered across users, so no two share one), and each
    turn's answer is the one the model really gave, appended before the next turn.
    """

    # Closed loop, as an agent sends its next turn as soon as the tool results are in.
    wait_time = constant(0)

    def on_start(self) -> None:
        """Open a connection pool and read the options."""
        if not self.host:
            raise StopUser("set --host to the proxy's URL")
        self.base_url: str = self.host
        self.http = requests.Session()
        self.options = LoadOptions.of(self.environment)
        if self.options.api_key:
            self.http.headers["Authorization"] = f"Bearer {self.options.api_key}"
        self.session: Session | None = None
        self.sessions_done = 0
        self.finished = False
        _RUN.agents_active += 1

    def on_stop(self) -> None:
        """Close the connection pool; the last agent to finish ends the run."""
        self.http.close()
        if not self.finished:
            self.finished = True
            _RUN.agents_active -= 1

    def _stop(self) -> None:
        self.finished = True
        _RUN.agents_active -= 1
        if _RUN.agents_active <= 0 and _RUN.in_flight == 0:
            assert self.environment.runner is not None
            self.environment.runner.quit()
        raise StopUser()

    def _current(self) -> Session:
        """The session to continue, or the next one once it is done."""
        opts = self.options
        if self.session is not None and not self.session.done:
            return self.session
        if self.session is not None:
            self.sessions_done += 1
        if opts.sessions_per_user and self.sessions_done >= opts.sessions_per_user:
            self._stop()
        index = _RUN.sessions_started
        _RUN.sessions_started += 1
        self.session = build_session(
            opts.session_shape,
            index,
            opts.session_seed,
            opts.system_tokens,
            opts.session_turns,
            opts.session_max_tokens,
        )
        return self.session

    @task
    def turn(self) -> None:
        """One turn of the agent's session, then its request and metric events."""
        opts = self.options
        session = self._current()
        if not _RUN.claim(opts.requests):
            if _RUN.in_flight == 0:
                assert self.environment.runner is not None
                self.environment.runner.quit()
            raise StopUser()
        start = time.time()
        t0 = time.perf_counter()
        turn, kind = session.turns_done, session.kind
        stream = AnswerStream()
        sample: Sample | None = None
        _RUN.in_flight += 1
        try:
            result = send_turn(self.http, self.base_url, session, opts.model, 900, stream)
            if result is not None:
                sample = turn_sample(result, opts.model, start, time.time())
        finally:
            _RUN.in_flight -= 1
            if sample is None:
                # Stopped mid-turn at the end of the run: a cut sample keeps what arrived.
                sample = TurnSample(
                    start=start,
                    task=f"agent-{session.shape}",
                    model=opts.model,
                    stream=True,
                    end=time.time(),
                    tokens=stream.deltas,
                    ttft_s=stream.first_token_s,
                    last_token_s=stream.last_token_s,
                    session=session.id,
                    turn=turn,
                    kind=kind,
                )
            _RUN.samples.append(sample)
        _fire(self.environment, sample, (time.perf_counter() - t0) * 1000, 0)


def _on_test_start(environment: Environment, **_: Any) -> None:
    opts = LoadOptions.of(environment)
    _RUN.reset(prompt_stream(opts.task, opts.prompt_start, opts.prompt_count))


def _on_test_stop(environment: Environment, **_: Any) -> None:
    opts = LoadOptions.of(environment)
    if opts.results_file is not None:
        write_samples(opts.results_file, _RUN.samples)
    s = summarise(_RUN.samples)
    per_stream = f"{s.per_stream_tps:.1f}" if s.per_stream_tps is not None else "-"
    turns = [t for t in _RUN.samples if isinstance(t, TurnSample)]
    share = cached_share(turns)
    log.info(
        "%d requests (%d failed, %d cut), %d tokens in %.1f s: %.1f tok/s aggregate, "
        "%s tok/s per stream; backends %s%s",
        s.requests,
        s.failures,
        s.cut,
        s.tokens,
        s.wall_s,
        s.aggregate_tps,
        per_stream,
        s.backends,
        f"; {_RUN.sessions_started} agent sessions, {share:.0%} of prompt tokens cached"
        if share is not None
        else "",
    )


# Untyped as above: locust declares no types.
events.test_start.add_listener(_on_test_start)  # type: ignore[no-untyped-call]
events.test_stop.add_listener(_on_test_stop)  # type: ignore[no-untyped-call]
