"""Room in the pool for one more request, and the backlog a new prompt would find.

The arithmetic of the admission gate's two edges, written once: the live router
(`router.admission.Admission`) and the simulator's model of it (`sim.admission.SimAdmission`)
both call these. They differ only in what is passed:

* the prefill rate: the router uses each worker's fitted `EndpointView.prefill_tokens_per_s`
  (`rate_of=None`); the simulator passes `rate_of`, its latency model's rate at the mean prompt;
* requests admitted but not yet placed: the router counts them (`admitting_requests`,
  `admitting_tokens`); the simulator places at the instant it admits, so passes 0.

Room for one more request (`has_room`):

* with a cap (`max_outstanding_per_worker`): the decode-capable workers accepting work have, in
  all, more free slots (cap - in flight, per worker) than requests admitted but not yet placed;
* with a backlog bound: the best prefill-side worker's predicted backlog (pending prefill tokens
  plus those admitted but not yet placed, over its rate), taken at `percentile` through the tail
  ratios, is at most `bound_s`; no estimate (a worker without a rate): with `unfitted_cap`, the
  prefill-side workers have more free places (`unfitted_cap` - in flight, per worker) than
  requests admitted but not yet placed (no prefill-side worker at all: room, so placement
  answers that no worker can take it instead of the request waiting), else room (before it,
  the router admitted every arrival until a rate was fitted: on `up --autoscale` at 4 req/s,
  33 prompts queued on the one prefill worker within the first 10 s, and their waits ran
  into the stall timeout);
* without either: always room.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from splitserve.core.roles import Role
from splitserve.policy.placement.base import EndpointView
from splitserve.policy.predict.tail import TailRatios

RateOf = Callable[[int], float]
"""Prompt tokens per second of the worker at this index into the views."""


def prefill_side(views: Sequence[EndpointView]) -> list[int]:
    """Indices of the workers a new prompt is prefilled on: the prefill workers accepting work,
    or (none) the decode-capable ones accepting work."""
    live = [i for i, v in enumerate(views) if v.accepts_work]
    prefill = [i for i in live if views[i].role is Role.PREFILL]
    return prefill or [i for i in live if views[i].role.can_decode]


def backlog_s(
    views: Sequence[EndpointView], extra_tokens: int = 0, rate_of: RateOf | None = None
) -> float | None:
    """Predicted seconds before a new prompt starts prefilling on the best prefill-side worker:
    min over them of (pending prefill tokens + `extra_tokens`) / rate. None: no prefill-side
    worker, or one without a rate (<= 0; no prediction). `rate_of`: the rate of the worker at an
    index; None: each view's own `prefill_tokens_per_s`."""
    best: float | None = None
    for i in prefill_side(views):
        v = views[i]
        rate = v.prefill_tokens_per_s if rate_of is None else rate_of(i)
        if rate <= 0:
            return None
        s = (v.pending_prefill_tokens + extra_tokens) / rate
        best = s if best is None else min(best, s)
    return best


def at_percentile(predicted_s: float | None, percentile: float, tail: TailRatios) -> float | None:
    """A point prediction of TTFT turned into one at a class's percentile (None stays None)."""
    return None if predicted_s is None else predicted_s * tail.factor(percentile)


def has_room(
    views: Sequence[EndpointView],
    *,
    cap: int | None,
    bound_s: float | None,
    tail: TailRatios,
    percentile: float,
    rate_of: RateOf | None = None,
    admitting_requests: int = 0,
    admitting_tokens: int = 0,
    unfitted_cap: int | None = None,
) -> bool:
    """Whether the pool has room for one more request (see the module's docstring). `cap`:
    requests in flight or reserved per decode-capable worker (None: no cap); `bound_s`: the
    largest backlog, at `percentile`, that still leaves room (None: no bound); `unfitted_cap`:
    requests in flight or reserved per prefill-side worker while there is no backlog estimate
    (None: no cap)."""
    if cap is not None:
        free = sum(max(0, cap - v.inflight) for v in views if v.accepts_work and v.role.can_decode)
        if free - admitting_requests <= 0:
            return False
    if bound_s is not None:
        backlog = at_percentile(backlog_s(views, admitting_tokens, rate_of), percentile, tail)
        if backlog is not None and backlog > bound_s:
            return False
        if backlog is None and unfitted_cap is not None:
            side = prefill_side(views)
            # No prefill-side worker at all: room (placement answers "no worker", not the queue).
            free = sum(max(0, unfitted_cap - views[i].inflight) for i in side)
            if side and free - admitting_requests <= 0:
                return False
    return True
