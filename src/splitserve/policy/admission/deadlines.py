"""A request's absolute deadlines, from its arrival time on the owner's one clock."""

from __future__ import annotations

import math
from dataclasses import dataclass

from splitserve.policy.admission.classes import SloOverrides, SloPolicyClass


@dataclass(frozen=True, slots=True)
class Deadlines:
    arrival_s: float
    ttft_deadline_s: float
    """The first token is due by then (offline classes: the completion deadline)."""
    tpot_s: float | None
    """Mean time per output token allowed after the first (None: offline class)."""
    completion_deadline_s: float | None
    """Offline classes: the whole request is due by then."""

    def e2e_deadline_s(self, num_output_tokens: int) -> float:
        """When a request of this many output tokens must finish to meet both targets."""
        if self.completion_deadline_s is not None:
            return self.completion_deadline_s
        tpot = self.tpot_s or 0.0
        return self.ttft_deadline_s + tpot * max(0, num_output_tokens - 1)

    def met(self, ttft_s: float, tpot_s: float | None, e2e_s: float) -> tuple[bool, bool]:
        """(TTFT met, TPOT met) for a request that saw these latencies (from arrival)."""
        if self.completion_deadline_s is not None:
            ok = self.arrival_s + e2e_s <= self.completion_deadline_s
            return ok, ok
        ttft_ok = self.arrival_s + ttft_s <= self.ttft_deadline_s
        tpot_ok = tpot_s is None or self.tpot_s is None or tpot_s <= self.tpot_s
        return ttft_ok, tpot_ok


def deadlines_for(
    cls: SloPolicyClass, arrival_s: float, overrides: SloOverrides | None = None
) -> Deadlines:
    """Absolute deadlines of a request of class `cls` arriving at `arrival_s`.

    Monotone: a later arrival or a looser target never gives an earlier deadline.
    """
    o = overrides or SloOverrides()
    ttft = o.ttft_s if o.ttft_s is not None else cls.ttft_s
    tpot = o.tpot_s if o.tpot_s is not None else cls.tpot_s
    completion = None if cls.job_completion_s is None else arrival_s + cls.job_completion_s
    if ttft is None:
        ttft_deadline = completion if completion is not None else math.inf
    else:
        ttft_deadline = arrival_s + ttft
        if completion is not None:
            ttft_deadline = min(ttft_deadline, completion)
    return Deadlines(arrival_s, ttft_deadline, tpot, completion)
