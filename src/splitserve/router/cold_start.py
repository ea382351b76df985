"""Hold requests while the pool has no decode-capable worker ready (scale from zero).

A request that finds no decode or mixed worker accepting work (no worker at all; only workers
that are starting, not ready, fenced or draining; only prefill workers) would be a 503 at once.
With `DispatchSettings.cold_start_wait_s` > 0 it is held instead, up to that long (and never past
its request timeout), and goes on as soon as a worker that can take it is ready: the pool's
change notification (`PoolView.on_change`: membership, readiness, fencing, load reports) wakes
the held requests, no polling. When the wait runs out the request is the 503 it would have been,
naming the condition and saying how long it waited.

Held requests are bounded (`cold_start_max_held`): beyond the bound a request is refused at once
(503 naming the bound). They are demand the autoscaler must see: each counts in
`splitserve_router_queue_depth` / `splitserve_router_queued_prompt_tokens` (what the operator's
control loop reads as "waiting at the router", `operator.control.signals`) and, on arrival, once
in `splitserve_router_admission_total{outcome="queued"}` (the arrival rate). A held request that
the client leaves is dropped at once (its task is cancelled: the hold's `finally`), and
`close()` (router shutdown) answers every held request with `RouterShuttingDown`.

`splitserve_router_cold_start_held_requests` is the number held now;
`splitserve_router_cold_start_total{outcome}` counts how each hold ended: `served` (a worker
became ready), `timed_out`, `dropped` (the client left), `shutdown`, and `refused` (not held: the
bound was reached).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from splitserve.core.clock import Clock
from splitserve.core.errors import NoEligibleEndpoint
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import EndpointView
from splitserve.policy.placement.decider import why_none
from splitserve.router.errors import RouterShuttingDown

log = logging.getLogger(__name__)

OUTCOMES: Final = ("served", "timed_out", "dropped", "shutdown", "refused")
"""Every `outcome` label of `splitserve_router_cold_start_total`."""


class _Pool(Protocol):
    def views(self) -> list[EndpointView]: ...

    def on_change(self, listener: Callable[[], None]) -> None: ...


def can_serve(views: list[EndpointView]) -> bool:
    """Whether some decode-capable worker takes work (no hold needed)."""
    return any(v.role.can_decode and v.accepts_work for v in views)


@dataclass(slots=True, eq=False)
class _Held:
    request_id: str
    future: asyncio.Future[None]
    slo_class: str
    prompt_tokens: int


class ColdStartHold:
    """The requests held for a decode-capable worker. One per router process (`Dispatcher`)."""

    def __init__(
        self,
        pool: _Pool,
        *,
        clock: Clock,
        metrics: RouterMetrics,
        wait_s: float,
        max_held: int,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.wait_s = wait_s
        self.max_held = max_held
        self._held: set[_Held] = set()
        self._closed = False
        for outcome in OUTCOMES:
            metrics.cold_start.labels(outcome)  # every series exists from the start
        pool.on_change(self._pool_changed)

    @property
    def enabled(self) -> bool:
        return self.wait_s > 0

    @property
    def num_held(self) -> int:
        return len(self._held)

    async def wait(
        self, request_id: str, prompt_tokens: int, slo_class: str, limit_s: float
    ) -> float:
        """Hold the request until a decode-capable worker is ready; returns the seconds held.

        `limit_s`: the most it may wait (its request timeout's remainder; the wait is the
        smaller of this and `wait_s`).

        Raises:
            NoEligibleEndpoint: the wait ran out, or `max_held` requests are held already.
            RouterShuttingDown: the router shut down while the request was held.
        """
        views = self.pool.views()
        if can_serve(views):
            return 0.0
        if self._closed:
            raise RouterShuttingDown(f"the router is shutting down (request {request_id})")
        if len(self._held) >= self.max_held:
            self.metrics.cold_start.labels("refused").inc()
            raise NoEligibleEndpoint(
                f"no decode or mixed worker accepts work ({len(views)} endpoints: "
                f"{why_none(views)}), and {len(self._held)} requests already wait for one "
                f"(the router's cold-start bound, --cold-start-max-held {self.max_held})"
            )
        budget_s = max(0.0, min(self.wait_s, limit_s))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held = _Held(request_id, future, slo_class, prompt_tokens)
        self._held.add(held)
        m = self.metrics
        m.cold_start_held.inc()
        m.queue_depth.labels(slo_class).inc()
        m.queued_prompt_tokens.labels(slo_class).inc(prompt_tokens)
        start_s = self.clock.now_s()
        log.info(
            "request %s held up to %g s: no decode or mixed worker accepts work (%s)",
            request_id,
            budget_s,
            why_none(views),
        )
        outcome = "dropped"
        try:
            async with asyncio.timeout(budget_s):
                await future
            outcome = "served"
        except TimeoutError:
            outcome = "timed_out"
            views = self.pool.views()
            raise NoEligibleEndpoint(
                f"no decode or mixed worker accepts work ({len(views)} endpoints: "
                f"{why_none(views)}); waited {self.clock.now_s() - start_s:.3g} s for one to "
                f"become ready (the router's cold-start wait, {self.wait_s:g} s)"
            ) from None
        except RouterShuttingDown:
            outcome = "shutdown"
            raise
        finally:
            self._held.discard(held)
            m.cold_start_held.dec()
            m.queue_depth.labels(slo_class).dec()
            m.queued_prompt_tokens.labels(slo_class).dec(prompt_tokens)
            m.cold_start.labels(outcome).inc()
        waited_s = self.clock.now_s() - start_s
        log.info("request %s goes on after %.3g s held", request_id, waited_s)
        return waited_s

    def _pool_changed(self) -> None:
        if not self._held or not can_serve(self.pool.views()):
            return
        for held in self._held:
            if not held.future.done():
                held.future.set_result(None)

    def close(self) -> int:
        """Router shutdown: answer every held request (`RouterShuttingDown`) and hold no more;
        returns how many were held."""
        self._closed = True
        n = 0
        for held in self._held:
            if not held.future.done():
                held.future.set_exception(
                    RouterShuttingDown(
                        f"the router is shutting down: request {held.request_id} was waiting for a "
                        "decode or mixed worker to become ready"
                    )
                )
                n += 1
        return n
