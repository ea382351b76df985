"""The SLO-aware router end to end: real router, real simulated workers (issue 10).

* a burst of 200 simultaneous requests on 2 prefill + 2 decode workers lands 45-55 % on each
  decode worker (reservations at decision time: no herding);
* classes come from `x-slo-class` (unknown: 400 naming the header), overrides only where the
  class allows them, and the per-class metrics count them;
* `router.disaggregation` Never / Always / Auto decides the path, counted by path and reason;
* admission: a full pool queues non-sheddable requests (all served), sheds sheddable ones with
  429 + `Retry-After` + an OpenAI-style body; no decode-capable worker is a 503 naming why.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from tests.integration.slo.conftest import RouterFactory, WorkerFactory, sample

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings, SloSettings
from splitserve.core.roles import Role

pytestmark = pytest.mark.integration


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hello there", "max_tokens": 4, **extra}


async def test_burst_of_200_splits_evenly_over_two_decode_workers(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    ps = [await make_worker(Role.PREFILL, sim_time_scale=0.01) for _ in range(2)]
    ds = [await make_worker(Role.DECODE, sim_time_scale=0.01) for _ in range(2)]
    server, base = await make_router([*ps, *ds])
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        replies = await asyncio.gather(
            *(client.post(f"{base}/completions", json=_body()) for _ in range(200))
        )
    assert [r.status_code for r in replies] == [200] * 200

    def decoded() -> list[float]:
        return [
            d.sample("splitserve_worker_requests_total", kind="decode", outcome="ok") for d in ds
        ]

    # A worker counts a stream once it has closed, which can be just after the client has its
    # last token (a loaded CI run sampled 196 of 200): wait for the count, 10 s at most.
    for _ in range(1000):
        if sum(decoded()) >= 200:
            break
        await asyncio.sleep(0.01)
    per_decode = decoded()
    assert sum(per_decode) == 200
    for n in per_decode:
        assert 0.45 * 200 <= n <= 0.55 * 200, per_decode
    per_prefill = [
        p.sample("splitserve_worker_requests_total", kind="prefill", outcome="ok") for p in ps
    ]
    assert sum(per_prefill) == 200
    for n in per_prefill:
        assert 0.45 * 200 <= n <= 0.55 * 200, per_prefill
    assert (
        sample(server, "splitserve_router_placements_total", path="disaggregated", reason="split")
        == 200
    )
    assert not list(server.pool.ledger.entries(server.pool.ids()[0]))  # all released


CLASSES = (
    v1.SloClassSpec(name="interactive", ttft_ms=500, tpot_ms=100, priority=10),
    v1.SloClassSpec(name="batch", ttft_ms=5000, tpot_ms=500, sheddable=True, allow_overrides=True),
)


async def test_classes_from_headers(make_worker: WorkerFactory, make_router: RouterFactory) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    server, base = await make_router(
        [p, d], slo=SloSettings(classes=CLASSES, default_class="batch")
    )
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(f"{base}/completions", json=_body(), headers={"x-slo-class": "gold"})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "x-slo-class"
        assert "gold" in r.json()["error"]["message"]
        r = await client.post(
            f"{base}/completions",
            json=_body(),
            headers={"x-slo-class": "interactive", "x-slo-ttft-ms": "300"},
        )
        assert r.status_code == 400  # interactive allows no overrides
        assert r.json()["error"]["param"] == "x-slo-ttft-ms"
        r = await client.post(
            f"{base}/completions", json=_body(), headers={"x-slo-ttft-ms": "999999"}
        )
        assert r.status_code == 400  # batch allows them, within 1/4x..4x
        assert "outside" in r.json()["error"]["message"]
        r = await client.post(f"{base}/completions", json=_body(), headers={"x-slo-tpot-ms": "x"})
        assert r.status_code == 400
        ok = await client.post(
            f"{base}/completions", json=_body(), headers={"x-slo-class": "interactive"}
        )
        assert ok.status_code == 200, ok.text
        ok = await client.post(
            f"{base}/completions", json=_body(), headers={"x-slo-ttft-ms": "2000"}
        )
        assert ok.status_code == 200, ok.text
    for cls in ("interactive", "batch"):
        assert (
            sample(
                server,
                "splitserve_router_requests_total",
                outcome="ok",
                path="disaggregated",
                slo_class=cls,
            )
            == 1
        )
        assert (
            sample(server, "splitserve_router_slo_requests_total", slo_class=cls, result="met")
            + sample(server, "splitserve_router_slo_requests_total", slo_class=cls, result="missed")
            == 1
        )
        assert (
            sample(server, "splitserve_router_admission_total", slo_class=cls, outcome="admitted")
            == 1
        )
        assert sample(server, "splitserve_router_prompt_length_tokens_count", slo_class=cls) == 1
        assert sample(server, "splitserve_router_prediction_error_tokens_count", slo_class=cls) == 1
    assert (
        sample(server, "splitserve_router_slo_target_seconds", slo_class="interactive", slo="ttft")
        == 0.5
    )
    assert sample(server, "splitserve_router_slo_attainment_target", slo_class="batch") == 0.9


@pytest.mark.parametrize(
    ("mode", "min_pd", "path", "reason"),
    [
        (v1.Disaggregation.NEVER, 1, "aggregated", "never"),
        (v1.Disaggregation.ALWAYS, 100_000, "disaggregated", "split"),
        (v1.Disaggregation.AUTO, 100_000, "aggregated", "short_prompt"),
        (v1.Disaggregation.AUTO, 1, "disaggregated", "split"),
    ],
)
async def test_disaggregation_from_config(
    make_worker: WorkerFactory,
    make_router: RouterFactory,
    mode: v1.Disaggregation,
    min_pd: int,
    path: str,
    reason: str,
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    placement = PlacementSettings(disaggregation=mode, min_prompt_tokens_for_pd=min_pd)
    server, base = await make_router([p, d], placement=placement)
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(2):
            r = await client.post(f"{base}/completions", json=_body())
            assert r.status_code == 200, r.text
    assert sample(server, "splitserve_router_placements_total", path=path, reason=reason) == 2
    prefills = p.sample("splitserve_worker_requests_total", kind="prefill", outcome="ok")
    assert prefills == (2 if path == "disaggregated" else 0)


async def test_full_pool_queues_the_unsheddable_and_sheds_the_sheddable(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    d = await make_worker(Role.MIXED, sim_time_scale=0.5)
    classes = (
        v1.SloClassSpec(name="interactive", ttft_ms=5000, tpot_ms=1000, priority=10),
        v1.SloClassSpec(name="batch", ttft_ms=50, tpot_ms=1000, sheddable=True),
    )
    slo = SloSettings(classes=classes, max_outstanding_per_worker=1)
    server, base = await make_router([d], slo=slo)
    long = _body(max_tokens=40)
    async with httpx.AsyncClient(timeout=120) as client:
        first = asyncio.create_task(client.post(f"{base}/completions", json=long))
        await server.pool.wait_for(lambda pool: pool.views()[0].inflight >= 1, 20)
        replies = await asyncio.gather(
            *(
                client.post(f"{base}/completions", json=long, headers={"x-slo-class": c})
                for c in ("interactive", "interactive", "batch", "batch")
            )
        )
        head = await first
    assert head.status_code == 200
    inter, batch = replies[:2], replies[2:]
    assert [r.status_code for r in inter] == [200, 200]  # queued, never shed
    assert [r.status_code for r in batch] == [429, 429]
    for r in batch:
        assert int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded"
        assert err["type"] == "requests"
    assert (
        sample(
            server, "splitserve_router_admission_total", slo_class="interactive", outcome="queued"
        )
        == 2
    )
    assert (
        sample(server, "splitserve_router_queue_wait_seconds_count", slo_class="interactive") == 2
    )
    assert (
        sample(
            server,
            "splitserve_router_requests_total",
            outcome="shed",
            path="none",
            slo_class="batch",
        )
        == 2
    )
    assert sample(server, "splitserve_router_queue_depth", slo_class="interactive") == 0


async def test_no_decode_worker_is_a_503_naming_the_condition(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    p = await make_worker(Role.PREFILL)
    server, base = await make_router([p])
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(f"{base}/completions", json=_body())
    assert r.status_code == 503
    assert "1 role prefill" in r.json()["error"]["message"]
    assert sample(server, "splitserve_router_unavailable_total", condition="no_decode_role") == 1
