"""Labelled metric children kept after the first look-up (`router.metric_children`)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.router.dispatch import Dispatch
from splitserve.router.metric_children import Children
from tests.unit.router.conftest import StackFactory, WorkerFactory


def test_a_child_is_the_metrics_own_and_records_the_same() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["a", "b"], registry=registry)
    hist = Histogram("h", "h", ["a"], registry=registry, buckets=(1.0, 10.0))
    kids, hkids = Children(counter), Children(hist)
    assert kids("x", "y") is counter.labels("x", "y")
    assert kids("x", "y") is kids("x", "y")
    kids("x", "y").inc()
    counter.labels("x", "y").inc(2)
    kids("x", "z").inc()
    hkids("p").observe(3.0)
    assert registry.get_sample_value("c_total", {"a": "x", "b": "y"}) == 3
    assert registry.get_sample_value("c_total", {"a": "x", "b": "z"}) == 1
    assert registry.get_sample_value("h_bucket", {"a": "p", "le": "10.0"}) == 1


def _total(registry: CollectorRegistry, family: str) -> float:
    """A counter's samples summed over its label values."""
    return sum(
        s.value
        for metric in registry.collect()
        if metric.name == family
        for s in metric.samples
        if s.name.endswith("_total")
    )


async def _run(dispatch: Dispatch) -> None:
    async with contextlib.aclosing(dispatch.chunks()) as chunks:
        async for _ in chunks:
            pass


async def test_a_request_after_the_first_looks_up_no_labelled_child(
    make_worker: WorkerFactory, make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement, admission and the SLO book record per request through kept children: the
    second request of the same shape calls `labels()` on no metric (each call takes the
    metric's lock and converts its arguments: ~3 µs)."""
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    stack = await make_stack(p, d)

    def request(rid: str) -> Request:
        return Request(RequestId(rid), (1, 2, 3, 4), SamplingSpec(max_tokens=5), arrival_s=0.0)

    await _run(stack.dispatcher.open(request("r1")))
    calls: list[tuple[str, tuple[Any, ...]]] = []
    labels = MetricWrapperBase.labels

    def counting(self: MetricWrapperBase, *values: Any, **kw: Any) -> Any:
        calls.append((self._name, values))
        return labels(self, *values, **kw)

    monkeypatch.setattr(MetricWrapperBase, "labels", counting)
    await _run(stack.dispatcher.open(request("r2")))
    await stack.dispatcher.drain_background()
    assert calls == []
    # Both requests counted, through the kept children the second time.
    assert _total(stack.registry, "splitserve_router_placements") == 2
    assert _total(stack.registry, "splitserve_router_slo_requests") == 2
    assert _total(stack.registry, "splitserve_router_admission") == 2
