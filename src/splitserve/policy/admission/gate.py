"""Admission at the router: dispatch now, queue (EDF), shed (429) or reject.

The owner (the router) says whether its workers have *room* for one more request now (the
predicted prefill backlog under `GateParams`' bound, or a concurrency cap), and predicts when a
request would get its first token if it waited its turn. The gate decides:

* arrival, room and nothing queued ahead of it: **admitted**;
* a sheddable request predicted to miss its TTFT deadline even after waiting: **shed** (429 with
  `Retry-After` = the predicted backlog);
* otherwise **queued** in the `EdfQueue`; a full queue evicts the lowest-ranked sheddable entry
  (shed) or, holding only non-sheddable ones, **rejects** the newcomer (429, `queue full`);
* at each release (a request finished, a worker reported) queued entries are admitted in EDF
  order one at a time while there is room (`admit_next`; the owner counts each before asking
  again); sheddable entries whose TTFT deadline can no longer be met are
  shed (`expire`). Non-sheddable entries wait however late they are (they are never shed).

Pure: the owner passes `now_s` and its predictions; the gate keeps only the queue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from splitserve.policy.admission.queue import EdfQueue, Entry


class Outcome(StrEnum):
    ADMITTED = "admitted"
    QUEUED = "queued"
    SHED = "shed"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class GateParams:
    queue_capacity: int = 1024
    """Requests the router holds at most."""
    min_retry_after_s: float = 1.0
    max_retry_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    retry_after_s: float = 0.0
    """For shed / rejected: when to try again (whole seconds, at least `min_retry_after_s`)."""
    reason: str = ""


class AdmissionGate:
    def __init__(self, params: GateParams | None = None) -> None:
        self.params = params or GateParams()
        self.queue = EdfQueue(self.params.queue_capacity)
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def retry_after(self, backlog_s: float) -> float:
        p = self.params
        s = backlog_s if math.isfinite(backlog_s) else p.max_retry_after_s
        return float(math.ceil(min(p.max_retry_after_s, max(p.min_retry_after_s, s))))

    def arrive(
        self, entry: Entry, *, room: bool, predicted_ttft_s: float | None, now_s: float
    ) -> tuple[Verdict, list[Entry]]:
        """The newcomer's verdict, and queued entries evicted to make room for it (shed).

        `predicted_ttft_s`: seconds from now to its first token if it waits its turn (None:
        no estimate yet, never shed on a guess).
        """
        ahead = self.queue.ahead_of(entry)
        if room and not ahead:
            return Verdict(Outcome.ADMITTED), []
        backlog = predicted_ttft_s if predicted_ttft_s is not None else 0.0
        if (
            entry.sheddable
            and predicted_ttft_s is not None
            and now_s + predicted_ttft_s > entry.deadline_s
        ):
            return Verdict(Outcome.SHED, self.retry_after(backlog), "cannot meet its SLO"), []
        pushed = self.queue.push(entry)
        if not pushed.queued:
            outcome = Outcome.SHED if entry.sheddable else Outcome.REJECTED
            return Verdict(outcome, self.retry_after(backlog), "the admission queue is full"), []
        return Verdict(Outcome.QUEUED), pushed.evicted

    def expire(
        self, now_s: float, predicted_ttft_s: Callable[[Entry], float | None]
    ) -> list[Entry]:
        """Remove and return the queued sheddable entries that can no longer meet their TTFT
        deadline (past it, or predicted to miss it)."""
        shed: list[Entry] = []
        for e in self.queue:
            if not e.sheddable:
                continue
            predicted = predicted_ttft_s(e)
            if now_s > e.deadline_s or (predicted is not None and now_s + predicted > e.deadline_s):
                self.queue.remove(e.id)
                shed.append(e)
        return shed

    def admit_next(self, room: bool) -> Entry | None:
        """The head of the queue when there is room (the owner accounts for it, then asks
        again), else None."""
        if not room or not len(self.queue):
            return None
        return self.queue.pop()
