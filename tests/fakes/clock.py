"""A monotonic-clock stand-in for the vLLM adapter's polling loops: read by calling it, moved
only by `sleep`, which records each pause."""

from __future__ import annotations


class SleepingClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s
