"""The live router's admission queue in the simulator: arrivals wait at the gate, placed late.

The splitserve router does not place a request at arrival: it asks its admission gate
(`router.admission.Admission`, around the pure `policy.admission.AdmissionGate`) first. With room
in the pool the request is placed at once; without, it waits in the EDF queue and is placed when
room appears, on the pool as it is *then* (a worker added meanwhile takes part); a sheddable
request predicted to miss its TTFT deadline is shed (HTTP 429). `SimAdmission` drives the same
`AdmissionGate` object from the cluster's events, so a backlog in the simulator is no longer
pinned to the workers that existed when it arrived.

Room for one more request, as `router.admission.Admission.has_room` decides it (both call the
pure `policy.admission.has_room`):

* with `AdmissionSpec.max_outstanding_per_worker`: some decode-capable worker accepting work has
  fewer requests in flight or reserved than the cap;
* the best prefill-side worker's predicted backlog (pending prefill tokens / prefill rate), at
  the percentile of the class with the tightest TTFT target (`TailRatios`, learned from each
  admitted request's actual time to first token against its prediction), is at most
  `max_backlog_fraction` x that target.

The queue is re-checked (`pump`) whenever the pool can have changed: after every engine step
or KV transfer while anything waits (the live router re-checks on each load report, ~0.1 s, and
every 50 ms), when a request finishes, and when the control loop adds, removes or flips a worker.

Approximations (said in docs/autoscaling.md): the prefill rate is the worker's own latency model
at the mean prompt length seen so far (the live router fits it from the worker's step stream at
the recent mean chunk); a request is placed in the same instant it is admitted (the live router
places it a moment later, counting it against the room meanwhile); the tail ratios learn from
the first token at the simulated instant it is produced. Pure: no I/O, no wall time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from splitserve.core.ids import RequestId
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.policy.admission import (
    AdmissionGate,
    Entry,
    GateParams,
    Outcome,
    SloPolicyClass,
    at_percentile,
    backlog_s,
    deadlines_for,
    has_room,
)
from splitserve.policy.placement.base import EndpointView
from splitserve.policy.predict.tail import TailRatios

if TYPE_CHECKING:
    from splitserve.sim.cluster import Cluster
    from splitserve.sim.engine import Simulator
    from splitserve.sim.entities import SimRequest

SHED = "shed"
"""`SimRequest.dropped` of a request the gate shed or rejected starts with this."""


@dataclass(frozen=True, slots=True)
class AdmissionSpec:
    """The router's admission settings (`api.router.SloSettings`; defaults are its defaults)."""

    max_backlog_fraction: float = 0.25
    """Room while the best prefill worker's predicted backlog is at most this fraction of the
    tightest TTFT target (`SloSettings.max_backlog_fraction`)."""
    max_outstanding_per_worker: int | None = None
    """Also a cap on requests in flight or reserved per decode-capable worker; None: no cap."""
    queue_capacity: int = 1024

    def __post_init__(self) -> None:
        if not (self.max_backlog_fraction > 0 and math.isfinite(self.max_backlog_fraction)):
            raise ValueError(
                f"max_backlog_fraction must be > 0 and finite, got {self.max_backlog_fraction}"
            )
        if self.max_outstanding_per_worker is not None and self.max_outstanding_per_worker < 1:
            raise ValueError(
                "max_outstanding_per_worker must be >= 1 or None, got "
                f"{self.max_outstanding_per_worker}"
            )
        if self.queue_capacity < 0:
            raise ValueError(f"queue_capacity must be >= 0, got {self.queue_capacity}")


@dataclass(slots=True)
class _Waiter:
    req: SimRequest
    cls: SloPolicyClass
    entry: Entry


class SimAdmission:
    """The gate in front of `cluster`'s placement (install with `Cluster.admission`)."""

    def __init__(
        self,
        cluster: Cluster,
        classes: Sequence[SloPolicyClass],
        spec: AdmissionSpec | None = None,
        default_class: str | None = None,
    ) -> None:
        if not classes:
            raise ValueError("SimAdmission needs at least one SLO class")
        self.cluster = cluster
        self.spec = spec or AdmissionSpec()
        self.classes: Mapping[str, SloPolicyClass] = {c.name: c for c in classes}
        self.default = self.classes[default_class] if default_class else classes[0]
        self.gate = AdmissionGate(GateParams(queue_capacity=self.spec.queue_capacity))
        timed = [c for c in classes if c.ttft_s is not None]
        tightest = min(timed, key=lambda c: (c.ttft_s, -c.percentile)) if timed else None
        self._bound_s = (
            None
            if tightest is None or tightest.ttft_s is None
            else self.spec.max_backlog_fraction * tightest.ttft_s
        )
        self._tightest_percentile = 0.9 if tightest is None else tightest.percentile
        self.tail = TailRatios()
        self._waiters: dict[RequestId, _Waiter] = {}
        self._sheddable_waiting = 0
        self._predicted: dict[RequestId, tuple[float, float]] = {}
        """Admitted requests without a first token yet: (admitted at, predicted TTFT)."""
        self._prompt_sum = 0
        self._prompt_n = 0
        self._rates: dict[tuple[int, int], float] = {}
        self.num_queued = 0
        """Arrivals the gate queued (each counted once, at arrival)."""
        self.num_shed = 0
        """Requests shed or rejected (at arrival, evicted, or expired from the queue)."""
        self.shed_at: list[float] = []
        """When each shed happened (simulated seconds), for the loop's windowed counts."""

    # -- what the loop and reports read --------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # -- room and predictions (policy.admission.room, as router.admission.Admission) ----------

    def _rate(self, latency: LatencyModel) -> float:
        """Prompt tokens per second of one prefill of the mean prompt seen so far."""
        chunk = max(1, round(self._prompt_sum / self._prompt_n)) if self._prompt_n else 512
        key = (id(latency), chunk)
        rate = self._rates.get(key)
        if rate is None:
            s = latency.step_s(BatchShape(((chunk, 0),)))
            rate = chunk / s if s > 0 else 0.0
            self._rates[key] = rate
        return rate

    def _rate_of(self, i: int) -> float:
        return self._rate(self.cluster.router.workers[i].latency)

    def backlog_s(self, views: Sequence[EndpointView], extra_tokens: int = 0) -> float | None:
        """Predicted seconds before a new prompt starts prefilling on the best worker
        (`policy.admission.backlog_s` at the latency model's rates)."""
        return backlog_s(views, extra_tokens, self._rate_of)

    def at_percentile(self, predicted_s: float | None, percentile: float) -> float | None:
        return at_percentile(predicted_s, percentile, self.tail)

    def has_room(self, views: Sequence[EndpointView]) -> bool:
        """`policy.admission.has_room` at the latency model's rates; nothing is admitted but not
        yet placed (placement is in the same instant)."""
        return has_room(
            views,
            cap=self.spec.max_outstanding_per_worker,
            bound_s=self._bound_s,
            tail=self.tail,
            percentile=self._tightest_percentile,
            rate_of=self._rate_of,
        )

    def _ahead_tokens(self, entry: Entry) -> int:
        return sum(
            w.req.item.num_prompt_tokens
            for e in self.gate.queue.ahead_of(entry)
            if (w := self._waiters.get(RequestId(e.id))) is not None
        )

    # -- the flow ------------------------------------------------------------------------------

    def arrive(self, req: SimRequest, sim: Simulator) -> None:
        """A new request at the gate: placed now, queued, or shed."""
        now = sim.now_s
        self._prompt_sum += req.item.num_prompt_tokens
        self._prompt_n += 1
        cls = self.classes.get(req.item.slo_class, self.default)
        deadlines = deadlines_for(cls, req.item.arrival_s)
        entry = Entry(
            id=req.id,
            priority=cls.priority,
            deadline_s=deadlines.ttft_deadline_s,
            sheddable=cls.sheddable,
            slo_class=cls.name,
            enqueued_s=now,
            seq=self.gate.next_seq(),
        )
        views = self.cluster.router.endpoint_views(now)
        prompt = req.item.num_prompt_tokens
        point = self.backlog_s(views, self._ahead_tokens(entry) + prompt)
        verdict, evicted = self.gate.arrive(
            entry,
            room=self.has_room(views),
            predicted_ttft_s=self.at_percentile(point, cls.percentile),
            now_s=now,
        )
        for e in evicted:
            w = self._unqueue(e.id)
            self._shed(w.req, now, "pushed out of the full admission queue")
        if verdict.outcome is Outcome.ADMITTED:
            self._place(req, now, point, sim)
        elif verdict.outcome is Outcome.QUEUED:
            self.num_queued += 1
            self._waiters[req.id] = _Waiter(req, cls, entry)
            self._sheddable_waiting += cls.sheddable
        else:
            self._shed(req, now, verdict.reason)

    def pump(self, sim: Simulator) -> bool:
        """Shed hopeless sheddable entries, then admit (and place) queued ones while there is
        room, in EDF order. Returns whether anything was admitted or shed."""
        if not self._waiters:
            return False
        now = sim.now_s
        router = self.cluster.router
        views = router.endpoint_views(now)
        changed = False
        # `expire` only ever removes sheddable entries: with none queued it is skipped (it
        # would walk the whole queue on every engine step for nothing).
        if self._sheddable_waiting:
            ahead = self._ahead_all()

            def predicted(e: Entry) -> float | None:
                w = self._waiters.get(RequestId(e.id))
                if w is None:
                    return None
                own = w.req.item.num_prompt_tokens
                return self.at_percentile(
                    self.backlog_s(views, ahead.get(e.id, 0) + own), w.cls.percentile
                )

            for gone in self.gate.expire(now, predicted):
                w = self._unqueue(gone.id)
                self._shed(w.req, now, "its TTFT deadline can no longer be met")
                changed = True
        while (head := self.gate.admit_next(self.has_room(views))) is not None:
            w = self._unqueue(head.id)
            point = self.backlog_s(views, w.req.item.num_prompt_tokens)
            self._place(w.req, now, point, sim)
            views = router.endpoint_views(now)  # the placement changed the pool
            changed = True
        return changed

    def _ahead_all(self) -> dict[str, int]:
        """Each queued entry's prompt tokens queued ahead of it, in one pass (EDF order)."""
        ahead: dict[str, int] = {}
        total = 0
        for e in self.gate.queue:
            ahead[e.id] = total
            w = self._waiters.get(RequestId(e.id))
            if w is not None:
                total += w.req.item.num_prompt_tokens
        return ahead

    def _unqueue(self, entry_id: str) -> _Waiter:
        w = self._waiters.pop(RequestId(entry_id))
        self._sheddable_waiting -= w.cls.sheddable
        return w

    def first_token(self, req: SimRequest, now_s: float) -> None:
        """`req` produced its first token: its time from admission teaches the tail ratios."""
        got = self._predicted.pop(req.id, None)
        if got is not None and got[1] > 0:
            self.tail.observe(got[1], now_s - got[0])

    def forget(self, req: SimRequest) -> None:
        """`req` ended without a first token (dropped after placement)."""
        self._predicted.pop(req.id, None)

    def _place(self, req: SimRequest, now: float, point: float | None, sim: Simulator) -> None:
        if point is not None:
            self._predicted[req.id] = (now, point)
        self.cluster.place(req, sim)

    def _shed(self, req: SimRequest, now: float, why: str) -> None:
        self.num_shed += 1
        self.shed_at.append(now)
        self.cluster.shed(req, f"{SHED}: {why}")
