"""The one injected clock.

Policy and simulator code never read wall time: they receive a `Clock` (or plain `now_s` values).
`SystemClock` is the only place in the pure layers that touches `time`; the import-linter contract
names this module as the exception.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds on a monotonic time line (origin unspecified)."""
        ...


class SystemClock:
    """Monotonic wall-clock time, for the live edges."""

    def now_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock advanced by its owner: the simulator's event loop, or a test."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._t = start_s

    def now_s(self) -> float:
        return self._t

    def advance_to(self, t_s: float) -> None:
        if t_s < self._t:
            raise ValueError(f"time went backwards: {t_s} < {self._t}")
        self._t = t_s

    def advance(self, dt_s: float) -> None:
        self.advance_to(self._t + dt_s)
