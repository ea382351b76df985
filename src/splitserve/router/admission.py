"""Admission at the router's edge: the `policy.admission.AdmissionGate` driven live.

Before a request is placed, `Admission.enter` asks the gate. Admitted: it goes on at once.
Queued: it waits (EDF, priority first) until the pool has room, re-checked whenever the pool
changes (load reports, fencing), a request leaves, and every `tick_s` while anything waits.
Shed or rejected: `Overloaded` (HTTP 429 with `Retry-After` and an OpenAI-style body).

`splitserve_router_queue_depth` and `splitserve_router_queued_prompt_tokens` are the requests
waiting in the queue and the sum of their prompt tokens (the prefill work held at the gate), per
class. `splitserve_router_admission_total` counts each arrival once, by its decision at arrival
(admitted / queued / shed / rejected), so its rate summed over outcomes is the arrival rate. A
queued request later shed ends with `splitserve_router_requests_total{outcome="shed"}`; one later
admitted is in `splitserve_router_queue_wait_seconds`.

Room for one more request (`has_room`; the arithmetic is `policy.admission.room`, shared with the
simulator):
* with `max_outstanding_per_worker`: some decode-capable worker accepting work has fewer
  requests in flight or reserved than the cap;
* with a fitted latency model: the best prefill-capable worker's predicted backlog (pending
  prefill tokens / fitted rate), taken at the percentile of the class with the tightest TTFT
  target (see Percentiles), is within `max_backlog_fraction` x that target;
* with a TTFT target but no backlog estimate yet (a prefill-capable worker without a fitted
  rate: cold start, a worker just added): the prefill-capable workers have fewer requests in
  flight or reserved than `unfitted_prefills_per_worker` (4) each, in all; None: always room;
* without either: always room, the wave-1 behaviour.
Requests admitted from the queue but not yet placed count against the room.

Percentiles: a class's TTFT target holds at its percentile (p50, p90, p99), so the shed and
expiry decisions compare the *predicted TTFT at that percentile* with the deadline: the point
prediction x `TailRatios.factor(percentile)`, the empirical quantile of actual / predicted TTFT
of the requests admitted so far (`observe_ttft`). A p99 class is thus shed (or expired from the
queue) at a shorter backlog than a p50 class with the same target. Before enough requests were
observed the factor is 1 for every percentile.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from splitserve.aio import stop_task
from splitserve.api.router import SloSettings
from splitserve.core.clock import Clock
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.admission import (
    AdmissionGate,
    Entry,
    GateParams,
    Outcome,
    at_percentile,
    backlog_s,
    has_room,
)
from splitserve.policy.placement import EndpointView
from splitserve.policy.predict.tail import TailRatios
from splitserve.router.errors import Overloaded
from splitserve.router.metric_children import Children
from splitserve.router.pool_view import PoolView
from splitserve.router.slo import RequestSlo

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Waiter:
    entry: Entry
    future: asyncio.Future[None]
    prompt_tokens: int
    percentile: float
    predicted_s: float | None = None
    """The point prediction of its time to first token when it was admitted."""


class Admission:
    def __init__(
        self,
        pool: PoolView,
        settings: SloSettings,
        *,
        clock: Clock,
        metrics: RouterMetrics,
        tightest_ttft_s: float | None,
        tick_s: float = 0.05,
        ttft_tail: TailRatios | None = None,
        tightest_percentile: float = 0.9,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self._admission = Children(metrics.admission)  # per request (`metric_children`)
        self.tick_s = tick_s
        self.ttft_tail = ttft_tail if ttft_tail is not None else TailRatios()
        self.tightest_percentile = tightest_percentile
        self.gate = AdmissionGate(GateParams(queue_capacity=settings.queue_capacity))
        self._waiters: dict[str, _Waiter] = {}
        self._admitting_requests = 0
        self._admitting_tokens = 0
        self._backlog_bound_s = (
            None if tightest_ttft_s is None else settings.max_backlog_fraction * tightest_ttft_s
        )
        self._ticker: asyncio.Task[None] | None = None
        pool.on_change(self.pump)

    # -- room --------------------------------------------------------------------------------

    def backlog_s(
        self, extra_tokens: int = 0, views: list[EndpointView] | None = None
    ) -> float | None:
        """Predicted seconds before a new prompt starts prefilling on the best worker
        (`policy.admission.backlog_s` at the fitted rates). `views`: the pool's snapshot when
        the caller has one (else taken here)."""
        return backlog_s(self.pool.views() if views is None else views, extra_tokens)

    def has_room(self, views: list[EndpointView] | None = None) -> bool:
        """`policy.admission.has_room` at the fitted rates, counting requests admitted but not
        yet placed."""
        return has_room(
            self.pool.views() if views is None else views,
            cap=self.settings.max_outstanding_per_worker,
            bound_s=self._backlog_bound_s,
            tail=self.ttft_tail,
            percentile=self.tightest_percentile,
            admitting_requests=self._admitting_requests,
            admitting_tokens=self._admitting_tokens,
            unfitted_cap=self.settings.unfitted_prefills_per_worker,
        )

    def predicted_ttft_s(
        self, entry: Entry, prompt_tokens: int, views: list[EndpointView] | None = None
    ) -> float | None:
        """If `entry` waited its turn: the backlog plus prompts queued ahead plus its own."""
        ahead = sum(
            self._waiters[e.id].prompt_tokens
            for e in self.gate.queue.ahead_of(entry)
            if e.id in self._waiters
        )
        return self.backlog_s(self._admitting_tokens + ahead + prompt_tokens, views)

    def at_percentile(self, predicted_s: float | None, percentile: float) -> float | None:
        """A point prediction of TTFT turned into one at the class's percentile."""
        return at_percentile(predicted_s, percentile, self.ttft_tail)

    def observe_ttft(self, predicted_s: float | None, actual_s: float) -> None:
        """A request's time to first token from admission against its prediction then."""
        if predicted_s is not None:
            self.ttft_tail.observe(predicted_s, actual_s)

    # -- the flow ----------------------------------------------------------------------------

    async def enter(self, request_id: str, prompt_tokens: int, rs: RequestSlo) -> float | None:
        """Return when the request may be placed; `placed()` must follow once it is. Returns
        the point prediction of its time to first token from now (None: no estimate), for
        `observe_ttft` once the first token is out.

        Raises:
            Overloaded: shed (sheddable, cannot meet its SLO) or rejected (queue full).
        """
        predicted, _ = await self.enter_with(request_id, prompt_tokens, rs, None)
        return predicted

    async def enter_with(
        self,
        request_id: str,
        prompt_tokens: int,
        rs: RequestSlo,
        views: list[EndpointView] | None,
        *,
        counted: bool = False,
    ) -> tuple[float | None, bool]:
        """`enter`, deciding on `views` (the pool's snapshot taken by the caller in this same
        step: one snapshot serves admission and placement instead of four); also says whether
        the request went on at once (True: `views` still describe the pool, nothing ran
        between) or waited in the queue (False: take a new snapshot). `counted`: the arrival
        was counted already (`count_arrival`: a request held for a cold start), so this
        decision is not counted again."""
        now_s = self.clock.now_s()
        if views is None:
            views = self.pool.views()
        if not self.settings.admission:
            if not counted:
                self._admission(rs.label, "admitted").inc()
            predicted_now = self.backlog_s(self._admitting_tokens + prompt_tokens, views)
            self._admitting_requests += 1
            self._admitting_tokens += prompt_tokens
            return predicted_now, True
        entry = Entry(
            id=request_id,
            priority=rs.cls.priority,
            deadline_s=rs.deadlines.ttft_deadline_s,
            sheddable=rs.cls.sheddable,
            slo_class=rs.label,
            enqueued_s=now_s,
            seq=self.gate.next_seq(),
        )
        point = self.predicted_ttft_s(entry, prompt_tokens, views)
        predicted = self.at_percentile(point, rs.cls.percentile)
        verdict, evicted = self.gate.arrive(
            entry, room=self.has_room(views), predicted_ttft_s=predicted, now_s=now_s
        )
        for e in evicted:
            self._refuse(e, "shed", "pushed out of the full admission queue")
        if not counted:
            self._admission(rs.label, verdict.outcome.value).inc()
        if verdict.outcome is Outcome.ADMITTED:
            self._admitting_requests += 1
            self._admitting_tokens += prompt_tokens
            return point, True
        if verdict.outcome is not Outcome.QUEUED:
            log.info("request %s %s: %s", request_id, verdict.outcome.value, verdict.reason)
            raise Overloaded(
                f"SLO class {rs.cls.name!r}: {verdict.reason}; retry after "
                f"{verdict.retry_after_s:g} s",
                verdict.retry_after_s,
                rs.label,
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(entry, future, prompt_tokens, rs.cls.percentile)
        self._waiters[request_id] = waiter
        self.metrics.queue_depth.labels(rs.label).inc()
        self.metrics.queued_prompt_tokens.labels(rs.label).inc(prompt_tokens)
        self._ensure_ticker()
        try:
            await future
        except BaseException:
            if self.gate.queue.remove(request_id) is not None:  # client left while queued
                self._forget(request_id)
            raise
        self.metrics.queue_wait.labels(rs.label).observe(self.clock.now_s() - now_s)
        return waiter.predicted_s, False

    def count_arrival(self, slo_class: str, outcome: str) -> None:
        """Count an arrival decided outside the gate (a request held for a cold start waits at
        the router: `queued`); its later `enter_with(counted=True)` is not counted again."""
        self._admission(slo_class, outcome).inc()

    def placed(self, prompt_tokens: int) -> None:
        """The request admitted by `enter` is placed (its reservations now count)."""
        self._admitting_requests = max(0, self._admitting_requests - 1)
        self._admitting_tokens = max(0, self._admitting_tokens - prompt_tokens)

    def pump(self) -> None:
        """Admit queued requests while there is room; shed hopeless sheddable ones."""
        if not self._waiters:
            return
        now_s = self.clock.now_s()

        def predicted(e: Entry) -> float | None:
            w = self._waiters.get(e.id)
            if w is None:
                return None
            return self.at_percentile(self.predicted_ttft_s(e, w.prompt_tokens), w.percentile)

        for gone in self.gate.expire(now_s, predicted):
            self._refuse(gone, "shed", "its TTFT deadline can no longer be met")
        while (e := self.gate.admit_next(self.has_room())) is not None:
            w = self._forget(e.id)
            if w is None:
                continue
            w.predicted_s = self.backlog_s(self._admitting_tokens + w.prompt_tokens)
            self._admitting_requests += 1  # counted before the next room check
            self._admitting_tokens += w.prompt_tokens
            if not w.future.done():
                w.future.set_result(None)

    def _refuse(self, e: Entry, outcome: str, why: str) -> None:
        w = self._forget(e.id)
        if w is None or w.future.done():
            return
        backlog = self.backlog_s()
        retry = self.gate.retry_after(backlog if backlog is not None else math.inf)
        log.info("request %s %s from the queue: %s", e.id, outcome, why)
        w.future.set_exception(
            Overloaded(
                f"SLO class {e.slo_class!r}: {why}; retry after {retry:g} s", retry, e.slo_class
            )
        )

    def _forget(self, request_id: str) -> _Waiter | None:
        w = self._waiters.pop(request_id, None)
        if w is not None:
            self.metrics.queue_depth.labels(w.entry.slo_class).dec()
            self.metrics.queued_prompt_tokens.labels(w.entry.slo_class).dec(w.prompt_tokens)
        return w

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick(), name="admission-tick")

    async def _tick(self) -> None:
        while self._waiters:
            await asyncio.sleep(self.tick_s)
            self.pump()

    async def close(self) -> None:
        if self._ticker is not None:
            await stop_task(self._ticker)
