"""Whether a llama-server is getting anywhere: how a wait on it is cut on progress, not the clock.

llama-server's `GET /slots` says, per slot at work, how many prompt tokens it has processed and
how many tokens it has generated; the counts change once per batch step. A server that is stuck
shows the same counts, or does not answer. A wait on a backend is cut only when two looks a stall
window apart see nothing advance: a 17 k-token prompt that takes 20 minutes on two cores is never
cut, a frozen backend is within about a window. Bare llama-server never gives up on a request
that progresses; neither does specproxy.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

# What one look sees: per processing slot, its task and how far it is.
Snapshot = tuple[tuple[Any, ...], ...]
# How long a wait on a server without /slots (progress unknown) may go on, unless capped.
BLIND_LIMIT_S = 900.0
# How far into a wait the first look at the slots is taken (a quarter window if shorter).
BASELINE_AFTER_S = 1.0


class ProgressWatch:
    """Looks at one llama-server's slots; says whether anything advanced since the last look."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self._session = session
        self._url = url.rstrip("/") + "/slots"
        self._last: Snapshot | None = None
        self.blind = False  # the server has no /slots (started with --no-slots)

    async def _look(self, timeout_s: float) -> Snapshot | None:
        """The slots' progress, or None where the server did not answer in time."""
        try:
            async with (
                asyncio.timeout(timeout_s),
                self._session.get(self._url) as resp,
            ):
                if resp.status in (404, 501):
                    self.blind = True
                    return None
                if resp.status != 200:
                    return None
                slots = await resp.json()
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        if not isinstance(slots, list):
            return None
        return tuple(
            _progress_of(s) for s in slots if isinstance(s, dict) and s.get("is_processing")
        )

    @property
    def has_baseline(self) -> bool:
        """Whether a look was kept to compare the next one with."""
        return self._last is not None

    async def baseline(self, timeout_s: float) -> None:
        """Keep a look to compare the next one with."""
        self._last = await self._look(timeout_s)

    def forget(self) -> None:
        """Drop the kept look: progress was seen some other way since."""
        self._last = None

    async def advanced(self, timeout_s: float) -> bool:
        """Whether the server's work advanced since the kept look; this look is kept next. A
        server that does not answer within `timeout_s` did not advance."""
        now = await self._look(timeout_s)
        if now is None:
            return self.blind
        advanced = self._last is not None and now != self._last
        self._last = now
        return advanced


def _progress_of(slot: dict[str, Any]) -> tuple[Any, ...]:
    tokens = slot.get("next_token")
    decoded = (
        [t.get("n_decoded") for t in tokens if isinstance(t, dict)]
        if isinstance(tokens, list)
        else []
    )
    return (
        slot.get("id"),
        slot.get("id_task"),
        slot.get("n_prompt_tokens_processed"),
        tuple(decoded),
    )


class Patience:
    """How long one wait on a backend may go on: while the backend progresses, up to an
    optional cap; a stall window without progress ends it.

    llama-server updates a slot's counts once per batch step, and a prompt step of 512 tokens
    takes tens of seconds on a slow CPU: so the looks compared are a whole stall window apart.
    The first is taken a moment into the wait, so a request answered at once never looks.
    """

    def __init__(self, watch: ProgressWatch | None, stall_s: float, cap_s: float | None) -> None:
        now = time.monotonic()
        self._start = now
        self._watch = watch
        self.stall_s = stall_s
        self.cap_s = cap_s
        self._deadline = None if cap_s is None else now + cap_s
        self._baseline_at = now
        self._check_at = now
        self.heard()

    def heard(self) -> None:
        """The backend sent something that is progress (a token, a prompt step): the next
        stall window starts now."""
        now = time.monotonic()
        self._baseline_at = now + min(BASELINE_AFTER_S, self.stall_s / 4)
        self._check_at = now + self.stall_s
        if self._watch is not None:
            self._watch.forget()

    def window(self) -> float:
        """Seconds to wait before asking again whether to go on."""
        ends = [self._check_at]
        if self._watch is not None and not self._watch.has_baseline:
            ends.append(self._baseline_at)
        if self._deadline is not None:
            ends.append(self._deadline)
        return max(min(ends) - time.monotonic(), 0.0)

    def _look_s(self, longest: float) -> float:
        """How long a look may take: at most `longest`, and never past the cap."""
        if self._deadline is None:
            return longest
        return max(min(longest, self._deadline - time.monotonic()), 0.01)

    async def cut(self) -> str | None:
        """Why the wait ends now, or None to wait another window."""
        now = time.monotonic()
        if self._deadline is not None and now >= self._deadline:
            return f"did not finish within {self.cap_s:g} s"
        watch = self._watch
        if watch is not None and not watch.has_baseline and now >= self._baseline_at:
            # A server that does not answer must not hold the wait past its cap.
            await watch.baseline(
                self._look_s(min(self.stall_s / 2, max(self._check_at - now, 0.01)))
            )
        if now < self._check_at:
            return None
        # A healthy server answers /slots at once, also mid-step: one that does not within a
        # quarter window (10 s at most) is stuck, so a frozen one is cut about a window in.
        if watch is not None and await watch.advanced(self._look_s(min(self.stall_s / 4, 10.0))):
            if not watch.blind or time.monotonic() - self._start < BLIND_LIMIT_S:
                self._check_at = time.monotonic() + self.stall_s
                return None
            return f"did not finish within {BLIND_LIMIT_S:g} s (its progress cannot be seen)"
        return f"made no progress for {self.stall_s:g} s"
