"""Progress lines for long provisioning steps, on stderr so stdout stays clean."""

from __future__ import annotations

import sys
import time


class Progress:
    """Reports a byte or step count: redrawn in place on a terminal, every 10 % otherwise."""

    def __init__(self, label: str, total: int | None, unit: str = "MB") -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._tty = sys.stderr.isatty()
        self._last_decile = -1
        self._last_draw = 0.0
        self._start = time.monotonic()

    def _scaled(self, n: int) -> str:
        return f"{n / 1e6:.0f}" if self.unit == "MB" else str(n)

    def advance(self, n: int) -> None:
        """Count n more units and redraw when it is worth it."""
        self.done += n
        if self.total:
            decile = min(10, self.done * 10 // self.total)
            now = time.monotonic()
            if self._tty and now - self._last_draw > 0.2:
                self._last_draw = now
                self._draw("\r", end="")
            elif not self._tty and decile > self._last_decile:
                self._last_decile = decile
                self._draw("")

    def _draw(self, prefix: str, end: str = "\n") -> None:
        pct = f"{100 * self.done / self.total:5.1f}%" if self.total else ""
        total = f"/{self._scaled(self.total)}" if self.total else ""
        print(
            f"{prefix}[specproxy] {self.label}: {self._scaled(self.done)}{total} {self.unit} {pct}",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    def finish(self) -> None:
        """Print the final line with the elapsed time."""
        elapsed = time.monotonic() - self._start
        if self._tty:
            print(file=sys.stderr)
        print(f"[specproxy] {self.label}: done in {elapsed:.1f} s", file=sys.stderr, flush=True)


def say(message: str) -> None:
    """One provisioning status line."""
    print(f"[specproxy] {message}", file=sys.stderr, flush=True)
