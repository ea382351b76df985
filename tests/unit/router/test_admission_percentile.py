"""Admission reads a class's percentile: with the same TTFT target and the same backlog, a p99
class is shed (its predicted TTFT at p99 misses the deadline) while a p50 class is queued."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import SloSettings
from splitserve.core.clock import ManualClock
from splitserve.core.ids import EndpointId, RequestId, SloClassName
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import EndpointView
from splitserve.router.admission import Admission
from splitserve.router.errors import Overloaded
from splitserve.router.slo import SloRuntime


class _Pool:
    """A pool of one prefill worker with a fixed backlog (1000 tokens at 1000 tokens/s)."""

    def __init__(self) -> None:
        self.view = EndpointView(
            EndpointId("p"),
            Role.PREFILL,
            ready=True,
            pending_prefill_tokens=1000,
            prefill_tokens_per_s=1000.0,
        )

    def views(self) -> list[EndpointView]:
        return [self.view]

    def on_change(self, listener: Callable[[], None]) -> None:
        pass


CLASSES = (
    v1.SloClassSpec(name="p50", ttft_ms=2000, tpot_ms=100, percentile=0.5, sheddable=True),
    v1.SloClassSpec(name="p99", ttft_ms=2000, tpot_ms=100, percentile=0.99, sheddable=True),
)


def _setup() -> tuple[SloRuntime, Admission]:
    clock = ManualClock()
    metrics = RouterMetrics(CollectorRegistry())
    settings = SloSettings(classes=CLASSES, max_backlog_fraction=0.1)
    slo = SloRuntime(settings, clock, metrics)
    admission = Admission(
        _Pool(),  # type: ignore[arg-type]
        settings,
        clock=clock,
        metrics=metrics,
        tightest_ttft_s=slo.tightest_ttft_s,
        ttft_tail=slo.ttft_tail,
    )
    return slo, admission


def _request(rid: str, cls: str) -> Request:
    return Request(
        id=RequestId(rid),
        prompt_token_ids=tuple(range(100)),
        sampling=SamplingSpec(max_tokens=16),
        slo_class=SloClassName(cls),
        arrival_s=0.0,
    )


async def _verdict(slo: SloRuntime, admission: Admission, rid: str, cls: str) -> str:
    """No room (backlog 1.1 s > 0.1 x 2 s), so never admitted at once: shed (raises at
    arrival) or queued (waits; withdrawn again here)."""
    req = _request(rid, cls)
    task = asyncio.ensure_future(
        admission.enter(req.id, req.num_prompt_tokens, slo.for_request(req))
    )
    await asyncio.sleep(0)
    if task.done():
        try:
            task.result()
        except Overloaded:
            return "shed"
        return "admitted"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return "queued"


async def test_p99_class_is_treated_more_conservatively_than_p50() -> None:
    slo, admission = _setup()
    # Cold start: no tail observed, both classes judged on the point prediction (1.1 s < 2 s).
    assert await _verdict(slo, admission, "a", "p50") == "queued"
    assert await _verdict(slo, admission, "b", "p99") == "queued"
    # Observed TTFTs scatter around the predictions: actual / predicted from 0.5 to 2.49.
    for i in range(200):
        admission.observe_ttft(1.0, 0.5 + i * 0.01)
    assert slo.ttft_tail.factor(0.5) < 1.6 < 2.2 < slo.ttft_tail.factor(0.99)
    # The same backlog: p50 predicts ~1.1 s x 1.5 < 2 s (queued); p99 ~1.1 s x 2.5 > 2 s (shed).
    assert await _verdict(slo, admission, "c", "p50") == "queued"
    assert await _verdict(slo, admission, "d", "p99") == "shed"


def test_room_reads_the_tightest_class_at_its_percentile() -> None:
    """Room: the backlog an arrival of the tightest class would find, at its percentile, within
    `max_backlog_fraction` x its target. Backlog 1 s, bound 0.6 x 2 s = 1.2 s: room while
    predictions hold; none once TTFTs run 1.5-2.5x their predictions."""
    clock = ManualClock()
    metrics = RouterMetrics(CollectorRegistry())
    settings = SloSettings(classes=CLASSES, max_backlog_fraction=0.6)
    slo = SloRuntime(settings, clock, metrics)
    assert slo.tightest_percentile == 0.99  # same TTFT target: the stricter percentile
    admission = Admission(
        _Pool(),  # type: ignore[arg-type]
        settings,
        clock=clock,
        metrics=metrics,
        tightest_ttft_s=slo.tightest_ttft_s,
        ttft_tail=slo.ttft_tail,
        tightest_percentile=slo.tightest_percentile,
    )
    assert admission.has_room()
    for i in range(100):
        admission.observe_ttft(1.0, 1.5 + i * 0.01)
    assert not admission.has_room()


class _ColdPool:
    """One prefill worker with no fitted rate yet; `inflight` as the router counts it."""

    def __init__(self) -> None:
        self.inflight = 0

    def views(self) -> list[EndpointView]:
        return [
            EndpointView(EndpointId("p0"), Role.PREFILL, inflight=self.inflight),
            EndpointView(EndpointId("d0"), Role.DECODE),
        ]

    def on_change(self, listener: Callable[[], None]) -> None:
        pass


def _cold_gate(settings: SloSettings) -> tuple[RouterMetrics, SloRuntime, _ColdPool, Admission]:
    """The gate over `_ColdPool` (no fitted rate), on a manual clock and its own registry."""
    clock = ManualClock()
    metrics = RouterMetrics(CollectorRegistry())
    slo = SloRuntime(settings, clock, metrics)
    pool = _ColdPool()
    admission = Admission(
        pool,  # type: ignore[arg-type]
        settings,
        clock=clock,
        metrics=metrics,
        tightest_ttft_s=slo.tightest_ttft_s,
    )
    return metrics, slo, pool, admission


async def test_before_a_fitted_rate_the_gate_admits_up_to_the_cap_then_queues() -> None:
    """No backlog estimate: 4 (`unfitted_prefills_per_worker`) go on at once, the 5th waits
    until one of them is through its prefill (the worker's in-flight count falls)."""
    settings = SloSettings(classes=CLASSES)
    _, slo, pool, admission = _cold_gate(settings)
    assert settings.unfitted_prefills_per_worker == 4
    for i in range(4):
        req = _request(f"r{i}", "p50")
        await admission.enter(req.id, req.num_prompt_tokens, slo.for_request(req))
        admission.placed(req.num_prompt_tokens)
        pool.inflight += 1
    req = _request("r4", "p50")
    waiting = asyncio.ensure_future(
        admission.enter(req.id, req.num_prompt_tokens, slo.for_request(req))
    )
    await asyncio.sleep(0)
    assert not waiting.done()  # queued
    pool.inflight -= 1  # a prefill finished
    admission.pump()
    await waiting
    await admission.close()
    # None: the old cold start, every arrival admitted at once.
    _, _, open_pool, open_gate = _cold_gate(
        SloSettings(classes=CLASSES, unfitted_prefills_per_worker=None)
    )
    open_pool.inflight = 100
    assert open_gate.has_room()


def _gauge(metrics: RouterMetrics, name: str, cls: str) -> float:
    value = metrics.registry.get_sample_value(name, {"slo_class": cls})
    return 0.0 if value is None else value


async def test_the_queued_prompt_tokens_gauge_sums_the_prompts_waiting_at_the_gate() -> None:
    """`splitserve_router_queued_prompt_tokens` is the prompt tokens of the requests in the
    admission queue, next to `splitserve_router_queue_depth` (their count): up as requests
    queue, down as they are admitted or leave."""
    metrics, slo, pool, admission = _cold_gate(
        SloSettings(classes=CLASSES, unfitted_prefills_per_worker=1)
    )
    name = "splitserve_router_queued_prompt_tokens"
    assert metrics.registry.get_sample_value(name, {"slo_class": "p50"}) == 0.0  # from the start
    pool.inflight = 1  # the cap (1 per worker) is taken: arrivals queue
    tasks = []
    for rid, n in (("a", 300), ("b", 50)):
        req = Request(
            id=RequestId(rid),
            prompt_token_ids=tuple(range(n)),
            sampling=SamplingSpec(max_tokens=16),
            slo_class=SloClassName("p50"),
            arrival_s=0.0,
        )
        tasks.append(
            asyncio.ensure_future(
                admission.enter(req.id, req.num_prompt_tokens, slo.for_request(req))
            )
        )
        await asyncio.sleep(0)
    assert _gauge(metrics, "splitserve_router_queue_depth", "p50") == 2
    assert _gauge(metrics, "splitserve_router_queued_prompt_tokens", "p50") == 350
    pool.inflight = 0  # room for one: the earlier arrival goes on
    admission.pump()
    await tasks[0]
    assert _gauge(metrics, "splitserve_router_queued_prompt_tokens", "p50") == 50
    tasks[1].cancel()  # the client leaves while queued
    with contextlib.suppress(asyncio.CancelledError):
        await tasks[1]
    assert _gauge(metrics, "splitserve_router_queue_depth", "p50") == 0
    assert _gauge(metrics, "splitserve_router_queued_prompt_tokens", "p50") == 0
    await admission.close()


async def test_a_queued_request_shed_later_names_its_class_like_one_shed_at_arrival() -> None:
    """A 429 from the queue said only "its TTFT deadline can no longer be met", while one shed at
    arrival says "SLO class 'batch': cannot meet its SLO" (seen under load with `up`)."""
    slo, admission = _setup()
    req = _request("a", "p50")
    task = asyncio.ensure_future(
        admission.enter(req.id, req.num_prompt_tokens, slo.for_request(req))
    )
    await asyncio.sleep(0)
    assert not task.done()  # queued: 1.1 s predicted < 2 s, but no room
    clock = admission.clock
    assert isinstance(clock, ManualClock)
    clock.advance(2.5)  # past its TTFT deadline
    admission.pump()
    with pytest.raises(Overloaded, match=r"^SLO class 'p50': its TTFT deadline can no longer"):
        await task
