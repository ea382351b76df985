"""The gate's room / backlog arithmetic, shared by the router and the simulator: the best
prefill-side worker's backlog, the cap on outstanding requests, requests admitted but not yet
placed, the rate source, and the percentile through the tail ratios."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import EndpointId
from splitserve.core.roles import Role
from splitserve.policy.admission import (
    RateOf,
    at_percentile,
    backlog_s,
    has_room,
    prefill_side,
)
from splitserve.policy.placement import EndpointView
from splitserve.policy.predict.tail import TailRatios


def _v(
    name: str,
    role: Role,
    *,
    pending: int = 0,
    rate: float = 1000.0,
    inflight: int = 0,
    ready: bool = True,
    fenced: bool = False,
) -> EndpointView:
    return EndpointView(
        EndpointId(name),
        role,
        ready=ready,
        fenced=fenced,
        pending_prefill_tokens=pending,
        inflight=inflight,
        prefill_tokens_per_s=rate,
    )


def _tail(ratio: float) -> TailRatios:
    t = TailRatios(min_samples=1)
    t.observe(1.0, ratio)
    return t


def test_prefill_side_is_the_live_prefill_workers_else_the_decode_capable_ones() -> None:
    views = [
        _v("p0", Role.PREFILL, fenced=True),
        _v("d0", Role.DECODE),
        _v("p1", Role.PREFILL),
        _v("p2", Role.PREFILL, ready=False),
    ]
    assert prefill_side(views) == [2]
    no_prefill = [_v("p0", Role.PREFILL, fenced=True), _v("d0", Role.DECODE)]
    assert prefill_side(no_prefill) == [1]
    assert prefill_side([]) == []


def test_backlog_is_the_best_worker_s_pending_plus_extra_over_its_rate() -> None:
    views = [_v("p0", Role.PREFILL, pending=4000), _v("p1", Role.PREFILL, pending=1000)]
    assert backlog_s(views) == 1.0
    assert backlog_s(views, extra_tokens=500) == 1.5
    # The rate from elsewhere (the simulator's latency model), by index into the views.
    assert backlog_s(views, 0, lambda i: [4000.0, 250.0][i]) == 1.0
    assert backlog_s(views, 0, lambda i: [8000.0, 250.0][i]) == 0.5


def test_no_prediction_without_a_rate_or_a_prefill_side_worker() -> None:
    assert backlog_s([_v("p0", Role.PREFILL, pending=10), _v("p1", Role.PREFILL, rate=0)]) is None
    assert backlog_s([_v("p0", Role.PREFILL)], 0, lambda i: 0.0) is None
    assert backlog_s([_v("p0", Role.PREFILL, fenced=True)]) is None


def test_at_percentile_scales_by_the_tail_factor() -> None:
    assert at_percentile(None, 0.9, _tail(3.0)) is None
    assert at_percentile(2.0, 0.9, TailRatios()) == 2.0  # no observations: factor 1
    assert at_percentile(2.0, 0.9, _tail(3.0)) == 6.0


def _room(
    views: list[EndpointView],
    *,
    cap: int | None = None,
    bound_s: float | None = None,
    tail: TailRatios | None = None,
    rate_of: RateOf | None = None,
    admitting_requests: int = 0,
    admitting_tokens: int = 0,
    unfitted_cap: int | None = None,
) -> bool:
    return has_room(
        views,
        cap=cap,
        bound_s=bound_s,
        tail=tail or TailRatios(),
        percentile=0.9,
        rate_of=rate_of,
        admitting_requests=admitting_requests,
        admitting_tokens=admitting_tokens,
        unfitted_cap=unfitted_cap,
    )


def test_the_cap_counts_requests_admitted_but_not_yet_placed() -> None:
    views = [_v("d0", Role.DECODE, inflight=3), _v("d1", Role.DECODE, inflight=5)]
    assert _room(views, cap=4)  # one free slot on d0
    assert not _room(views, cap=4, admitting_requests=1)
    assert not _room(views, cap=3)
    assert _room(views, admitting_requests=100)  # no cap


def test_the_backlog_bound_at_the_percentile_and_with_admitted_tokens() -> None:
    views = [_v("p0", Role.PREFILL, pending=1000)]  # 1 s backlog
    assert _room(views, bound_s=1.0)
    assert not _room(views, bound_s=1.0, admitting_tokens=1)
    assert not _room(views, bound_s=1.0, tail=_tail(1.5))  # 1.5 s at the percentile
    assert not _room(views, bound_s=1.0, rate_of=lambda i: 500.0)  # 2 s at half the rate
    # No estimate: room (the cold start); no bound: room.
    assert _room([_v("p0", Role.PREFILL, pending=10**9, rate=0)], bound_s=1.0)
    assert _room(views, tail=_tail(20.0))


def test_without_an_estimate_the_unfitted_cap_holds_per_prefill_side_worker() -> None:
    """No rate yet (cold start): room while the prefill-side workers have, in all, more free
    places (cap - in flight) than requests admitted but not yet placed."""
    cold = [
        _v("p0", Role.PREFILL, rate=0, inflight=3),
        _v("p1", Role.PREFILL, rate=0, inflight=5),
        _v("d0", Role.DECODE, rate=0),  # not prefill-side: its places do not count
    ]
    assert _room(cold, bound_s=1.0, unfitted_cap=4)  # one free place on p0
    assert not _room(cold, bound_s=1.0, unfitted_cap=4, admitting_requests=1)
    assert not _room(cold, bound_s=1.0, unfitted_cap=3)
    assert _room(cold, bound_s=1.0, admitting_requests=100)  # no cap: the old cold start
    assert _room(cold, unfitted_cap=1)  # no TTFT bound: the cap does not apply
    # One worker without a rate (just added) is enough to lose the estimate: the cap holds.
    mixed = [_v("p0", Role.PREFILL, inflight=9), _v("p1", Role.PREFILL, rate=0, inflight=4)]
    assert not _room(mixed, bound_s=100.0, unfitted_cap=4)
    # No live prefill-side worker: room, so placement answers 503 instead of a queue forever.
    gone = [_v("p0", Role.PREFILL, rate=0, inflight=9, ready=False)]
    assert _room(gone, bound_s=1.0, unfitted_cap=4)
    # With an estimate the cap is not used: the backlog decides.
    fitted = [_v("p0", Role.PREFILL, inflight=9)]
    assert _room(fitted, bound_s=1.0, unfitted_cap=4)


@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
    st.integers(0, 10**5),
    st.integers(0, 10**5),
    st.floats(0.01, 100.0),
)
def test_room_never_grows_with_more_admitted_or_pending_tokens(
    pending: list[int], extra: int, more: int, bound_s: float
) -> None:
    views = [_v(f"p{i}", Role.PREFILL, pending=p) for i, p in enumerate(pending)]
    if not _room(views, bound_s=bound_s, admitting_tokens=extra):
        assert not _room(views, bound_s=bound_s, admitting_tokens=extra + more)
    b0, b1 = backlog_s(views, extra), backlog_s(views, extra + more)
    assert b0 is not None
    assert b1 is not None
    assert b0 <= b1
