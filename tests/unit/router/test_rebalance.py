"""Aladdin's re-balancing (Alg. 2) live in the router: parity with the simulator's heartbeat
(both run `policy.placement.aladdin.plan_rebalance`) and a live move over real gRPC workers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings
from splitserve.core.clock import ManualClock, SystemClock
from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import EndpointView
from splitserve.policy.placement.aladdin import AladdinPacking, OngoingRequest, plan_rebalance
from splitserve.router.dispatch import Dispatcher, default_decider
from splitserve.router.ledger import Ledger
from splitserve.router.pool_view import PoolView
from splitserve.router.rebalance import LiveRebalancer
from tests.unit.router.conftest import FAST_POOL, WorkerFactory

A, B = EndpointId("a"), EndpointId("b")


class _Pool:
    def __init__(self) -> None:
        self.ledger = Ledger()

    def views(self) -> list[EndpointView]:
        return [
            EndpointView(e, Role.DECODE, ready=True, kv_total_blocks=1000, kv_block_size=16)
            for e in (A, B)
        ]

    def on_change(self, listener: Callable[[], None]) -> None:
        pass


def _ongoing(ledger: Ledger, eid: EndpointId, rid: str, prompt: int, gen: int, pred: int) -> None:
    ledger.reserve(
        eid,
        rid,
        prefill=False,
        num_prompt_tokens=prompt,
        predicted_output_tokens=pred,
        block_size=16,
    )
    ledger.start(eid, rid)
    ledger.progress(eid, rid, gen)


def test_router_heartbeat_makes_the_simulators_moves() -> None:
    """A over-runs its predictions (2 requests past them), B had a request end early; a pending
    decode share on A: the router's heartbeat over its ledger makes exactly the moves that the
    simulator's heartbeat computes from the same state (`plan_rebalance` on sim-shaped inputs),
    and the ledger then holds the share on B for the dispatch to read."""
    pool = _Pool()
    clock = ManualClock()
    packing = AladdinPacking()
    rb = LiveRebalancer(packing, pool, clock)  # type: ignore[arg-type]
    _ongoing(pool.ledger, A, "o1", 100, 50, 20)
    _ongoing(pool.ledger, A, "o2", 120, 60, 20)
    pool.ledger.reserve(
        A,
        "new",
        prefill=False,
        num_prompt_tokens=200,
        predicted_output_tokens=40,
        block_size=16,
        movable=True,
    )
    rb.finished(B, 5, 100)

    # The simulator's view of the same state, as `aladdin_cluster.Rebalancer` builds it.
    applied: list[tuple[str, EndpointId]] = []

    def apply(rid: str, eid: EndpointId) -> bool:
        applied.append((rid, eid))
        return True

    expected = plan_rebalance(
        packing,
        {
            A: [OngoingRequest(100, 50, 20), OngoingRequest(120, 60, 20)],
        },
        {B: [(5, 100)]},
        {"new": (A, OngoingRequest(200, 0, 40))},
        lambda _e: 16000.0,
        apply,
    )
    assert expected.moved == (("new", B),)
    assert applied == [("new", B)]

    got = rb.heartbeat()
    assert got == expected
    assert rb.num_moves == 1
    assert pool.ledger.moved_to("new") == B
    assert [e.request_id for e in pool.ledger.entries(B)] == ["new"]
    assert "new" not in [e.request_id for e in pool.ledger.entries(A)]


def test_no_move_without_prediction_error() -> None:
    pool = _Pool()
    rb = LiveRebalancer(AladdinPacking(), pool, ManualClock())  # type: ignore[arg-type]
    _ongoing(pool.ledger, A, "o1", 100, 10, 20)
    pool.ledger.reserve(
        A,
        "new",
        prefill=False,
        num_prompt_tokens=200,
        predicted_output_tokens=40,
        block_size=16,
        movable=True,
    )
    assert rb.heartbeat().moved == ()
    assert pool.ledger.moved_to("new") is None


def test_a_started_share_never_moves() -> None:
    ledger = Ledger()
    ledger.reserve(
        A,
        "r",
        prefill=False,
        num_prompt_tokens=10,
        predicted_output_tokens=5,
        block_size=16,
        movable=True,
    )
    ledger.start(A, "r")
    assert not ledger.move("r", A, B, 16)


async def test_live_move_sends_the_decode_to_the_new_worker(make_worker: WorkerFactory) -> None:
    """Real router dispatch over real gRPC workers: while a request's prefill runs, Alg. 2 moves
    its decode share (the error state is set up on the ledger), and the decode goes there."""
    hold = asyncio.Event()
    p = await make_worker(Role.PREFILL, prefill_hold=hold)
    d1 = await make_worker(Role.DECODE)
    d2 = await make_worker(Role.DECODE)
    clock = SystemClock()
    metrics = RouterMetrics(CollectorRegistry())
    placement = PlacementSettings(
        profile=v1.PlacementProfile.ALADDIN, disaggregation=v1.Disaggregation.ALWAYS
    )
    pool = PoolView([p.address, d1.address, d2.address], clock=clock, settings=FAST_POOL)
    await pool.start()
    try:
        await pool.wait_for(lambda pv: all(v.ready for v in pv.views()), 10)
        dispatcher = Dispatcher(
            pool,
            clock=clock,
            metrics=metrics,
            decider=default_decider(placement, pool.ledger),
            placement=placement,
        )
        rb = dispatcher.rebalancer
        assert rb is not None
        request = Request(RequestId("r1"), (1, 2, 3, 4), SamplingSpec(max_tokens=5), arrival_s=0.0)
        dispatch = dispatcher.open(request)

        async def run() -> list[int]:
            async with contextlib.aclosing(dispatch.chunks()) as chunks:
                return [t async for c in chunks for t in c.token_ids]

        task = asyncio.create_task(run())
        await p.wait_call("Prefill")
        ids = {EndpointId(d1.address): d1, EndpointId(d2.address): d2}
        src = next(e for e in ids if any(x.movable for x in pool.ledger.entries(e)))
        dst = next(e for e in ids if e != src)
        # The source over-runs its predictions; the other had a request end early.
        _ongoing(pool.ledger, src, "o1", 100, 50, 20)
        _ongoing(pool.ledger, src, "o2", 120, 60, 20)
        rb.finished(dst, 5, 100)
        assert rb.heartbeat().moved == (("r1", dst),)
        hold.set()
        assert await task == [10, 11, 12, 13, 14]
        assert ids[dst].names() == ["Decode"]
        assert ids[src].names() == []
        pool.ledger.drop(src, "o1")
        pool.ledger.drop(src, "o2")
        assert all(not list(pool.ledger.entries(e)) for e in ids)  # nothing leaked
        await dispatcher.drain_background()
    finally:
        hold.set()
        await pool.close()
