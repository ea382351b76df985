"""Requests held while no decode-capable worker is ready (`router.cold_start`): served once one
is, a 503 naming the condition and the wait when the wait runs out, bounded, dropped when the
client leaves, answered at shutdown, and visible to the operator as requests waiting at the
router."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import generate_latest

from splitserve.api.router import DispatchSettings, SloSettings
from splitserve.api.v1alpha1 import SloClassSpec
from splitserve.core.clock import SystemClock
from splitserve.core.errors import NoEligibleEndpoint
from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.operator.control import signals
from splitserve.router.dispatch import Chunk, Dispatch
from splitserve.router.errors import RouterShuttingDown
from splitserve.router.slo import SloRuntime
from tests.unit.router.conftest import MODEL, ServerFactory, Stack, StackFactory, WorkerFactory

COMPLETION = (10, 11, 12, 13, 14)
HOLD = DispatchSettings(cold_start_wait_s=60)


def _request(rid: str = "r1") -> Request:
    return Request(
        RequestId(rid), (1, 2, 3, 4), SamplingSpec(max_tokens=5), arrival_s=SystemClock().now_s()
    )


async def _run(dispatch: Dispatch) -> list[Chunk]:
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        return [c async for c in chunks]


async def _held(stack: Stack, n: int = 1) -> None:
    """Until `n` requests are held (the hold is entered within a few loop turns)."""
    async with asyncio.timeout(10):
        while stack.dispatcher.hold.num_held < n:  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.001)


def _waiting_at_router(stack: Stack) -> int:
    """What the operator's control loop reads from this router's /metrics."""
    scrape = signals.parse(generate_latest(stack.registry).decode())
    return int(signals._sum(scrape, signals.QUEUE_DEPTH))


@pytest.mark.parametrize("start", ["prefill_only", "fenced", "none"])
async def test_a_held_request_is_served_once_a_decode_worker_is_ready(
    make_worker: WorkerFactory, make_stack: StackFactory, start: str
) -> None:
    first = []
    if start == "prefill_only":
        first = [await make_worker(Role.PREFILL)]
    elif start == "fenced":
        first = [await make_worker(Role.DECODE)]
    stack = await make_stack(*first, dispatch=HOLD)
    if start == "fenced":
        stack.pool.fence(first[0].address)
    dispatch = stack.dispatcher.open(_request())
    task = asyncio.create_task(_run(dispatch))
    await _held(stack)
    assert not task.done()
    # Visible as demand: the queue depth the operator reads, and one arrival (queued).
    assert _waiting_at_router(stack) == 1
    assert stack.sample("splitserve_router_cold_start_held_requests") == 1
    assert stack.sample("splitserve_router_queued_prompt_tokens", slo_class="default") == 4
    if start == "fenced":
        stack.pool.unfence(first[0].address)
    else:
        d = await make_worker(Role.DECODE)
        stack.pool.add(d.address)
    async with asyncio.timeout(10):
        chunks = await task
    assert [t for c in chunks for t in c.token_ids] == list(COMPLETION)
    assert stack.sample("splitserve_router_cold_start_total", outcome="served") == 1
    assert stack.sample("splitserve_router_cold_start_held_requests") == 0
    assert _waiting_at_router(stack) == 0
    assert stack.sample("splitserve_router_queued_prompt_tokens", slo_class="default") == 0
    # Counted once on arrival, not again when it went through admission.
    assert (
        stack.sample("splitserve_router_admission_total", slo_class="default", outcome="queued")
        == 1
    )
    assert (
        stack.sample("splitserve_router_admission_total", slo_class="default", outcome="admitted")
        == 0
    )
    assert (
        stack.sample(
            "splitserve_router_requests_total", outcome="ok", path="aggregated", slo_class="default"
        )
        + stack.sample(
            "splitserve_router_requests_total",
            outcome="ok",
            path="disaggregated",
            slo_class="default",
        )
        == 1
    )


async def test_the_wait_running_out_is_a_503_naming_the_condition_and_the_wait(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(dispatch=DispatchSettings(cold_start_wait_s=0.01))
    async with stack.client() as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 503
    message = r.json()["error"]["message"]
    assert "no workers known" in message
    assert "waited" in message
    assert "cold-start wait, 0.01 s" in message
    assert stack.sample("splitserve_router_unavailable_total", condition="no_workers") == 1
    assert stack.sample("splitserve_router_cold_start_total", outcome="timed_out") == 1
    assert _waiting_at_router(stack) == 0


async def test_without_the_wait_the_503_comes_at_once(make_stack: StackFactory) -> None:
    stack = await make_stack()  # the router's default: cold_start_wait_s 0
    with pytest.raises(NoEligibleEndpoint) as err:
        await _run(stack.dispatcher.open(_request()))
    assert "waited" not in str(err.value)
    assert stack.sample("splitserve_router_cold_start_total", outcome="timed_out") == 0


async def test_beyond_the_bound_a_request_is_refused_at_once(make_stack: StackFactory) -> None:
    stack = await make_stack(dispatch=DispatchSettings(cold_start_wait_s=60, cold_start_max_held=1))
    task = asyncio.create_task(_run(stack.dispatcher.open(_request("r1"))))
    await _held(stack)
    with pytest.raises(NoEligibleEndpoint, match="--cold-start-max-held 1"):
        await _run(stack.dispatcher.open(_request("r2")))
    assert stack.sample("splitserve_router_cold_start_total", outcome="refused") == 1
    assert stack.dispatcher.hold.num_held == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_client_leaving_while_held_is_dropped_at_once(make_stack: StackFactory) -> None:
    stack = await make_stack(dispatch=HOLD)
    task = asyncio.create_task(_run(stack.dispatcher.open(_request())))
    await _held(stack)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stack.dispatcher.hold.num_held == 0
    assert stack.sample("splitserve_router_cold_start_total", outcome="dropped") == 1
    assert _waiting_at_router(stack) == 0
    assert (
        stack.sample(
            "splitserve_router_requests_total",
            outcome="cancelled",
            path="none",
            slo_class="default",
        )
        == 1
    )


async def test_router_shutdown_answers_held_requests(make_router: ServerFactory) -> None:
    import httpx

    server = await make_router(dispatch=HOLD)
    hold = server.dispatcher.hold
    async with httpx.AsyncClient(timeout=30) as client:
        post = asyncio.create_task(
            client.post(
                f"http://127.0.0.1:{server.http_port}/v1/completions",
                json={"model": MODEL, "prompt": "x"},
            )
        )
        async with asyncio.timeout(10):
            while hold.num_held < 1:  # noqa: ASYNC110 - no event for it
                await asyncio.sleep(0.001)
        stop = asyncio.create_task(server.stop(grace_s=30))
        r = await post
        await stop
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "router_shutting_down"
    assert hold.num_held == 0
    assert (
        server.registry.get_sample_value(
            "splitserve_router_cold_start_total", {"outcome": "shutdown"}
        )
        == 1
    )
    with pytest.raises(RouterShuttingDown):  # and holds no more
        await hold.wait("late", 1, "default", 60)


def test_a_held_requests_deadlines_run_from_its_release() -> None:
    """The hold does not count against admission's TTFT test (its deadlines are re-stamped
    when it goes on), while its attainment is still measured from its arrival."""
    from prometheus_client import CollectorRegistry

    chat = SloClassSpec(name="chat", ttft_ms=500, tpot_ms=50, sheddable=True)
    rt = SloRuntime(SloSettings(classes=(chat,)), SystemClock(), RouterMetrics(CollectorRegistry()))
    req = Request(
        RequestId("r"),
        (1, 2),
        SamplingSpec(max_tokens=4),
        arrival_s=100.0,
        slo_class=SloClassName("chat"),
    )
    rs = rt.for_request(req)
    assert rs.deadlines.ttft_deadline_s == pytest.approx(100.5)
    later = rt.restamped(rs, req, 130.0)
    assert later.deadlines.ttft_deadline_s == pytest.approx(130.5)
    assert later.cls is rs.cls
    assert later.label == rs.label
    # 30 s held + 0.2 s to the first token, measured from the arrival: a miss.
    assert later.deadlines.met(30.2, 0.01, 30.3) == (False, True)
    assert later.deadlines.met(0.2, 0.01, 0.3) == (True, True)


async def test_held_requests_are_the_demand_that_scales_decode_from_zero(
    make_worker: WorkerFactory, make_stack: StackFactory
) -> None:
    """The operator's loop, on this router's /metrics with requests held and every pool at
    zero (a prefill worker only), starts a decode worker: the held requests are its demand."""
    from splitserve.policy.planner.aladdin import AladdinPerfModel
    from splitserve.policy.planner.autoscaler import AutoscalerState, Kind, decide, live_params
    from splitserve.policy.planner.signals import PoolSignal

    p = await make_worker(Role.PREFILL)
    stack = await make_stack(p, dispatch=HOLD)
    before = signals.parse(generate_latest(stack.registry).decode())
    tasks = [asyncio.create_task(_run(stack.dispatcher.open(_request(f"r{i}")))) for i in range(3)]
    await _held(stack, 3)
    held = signals.parse(generate_latest(stack.registry).decode())
    window = signals.Window(60.0, 30.0)
    window.add(signals.Snapshot(0.0, {"router": before}))
    window.add(signals.Snapshot(10.0, {"router": held}))
    pools = {r: PoolSignal(r, 0, 0, 0, 4, ()) for r in (Role.PREFILL, Role.DECODE)}
    default = signals.ClassTargets("default", 2.0, 0.2, 0.9, 0.9)
    obs = window.observe(10.0, [default], pools)
    assert obs.router_queue == 3
    assert obs.arrival_rate_per_s is not None
    assert obs.arrival_rate_per_s > 0
    decision, _ = decide(obs, AutoscalerState(), AladdinPerfModel(), live_params(5.0, 60.0))
    assert (decision.pools[Role.DECODE].kind, decision.pools[Role.DECODE].desired) == (
        Kind.SCALE_UP,
        1,
    )
    assert "3 waiting at the router" in decision.pools[Role.DECODE].reason
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
