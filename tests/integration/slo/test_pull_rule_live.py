"""The P/D decider's `pull_would_miss_tpot` in a live router (issue 11): a real router over real
simulated workers, the decode worker's pull rate fitted from the pull totals of its load reports
(the sim engine times each pull on its KV link model), the pulls placed and not finished counted
by the router's ledger.

Sim workers at time scale 1 (llama-2-7b on an A100, its 25 GB/s KV link): a 2,000-token
prompt's KV takes ~42 ms to pull, a decode step ~10 ms. With a 25 ms TPOT class, a 2,000-token
prompt that asks for 2 tokens (one gap after the prefill's token) is served whole on the decode
worker once the router has a pull estimate; the same prompt asking for 64 tokens spreads its
pull over the predicted output's gaps and stays split. No timed assertion: the measured pull
only grows on a slow machine (the rule fires more surely); the decode worker's prefill and step
estimates come from the engine's modelled step times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest
from tests.integration.slo.conftest import RouterFactory, WorkerFactory, sample

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import PlacementSettings, SloSettings
from splitserve.core.roles import Role
from splitserve.policy.placement import EndpointView
from splitserve.policy.predict.tail import TailRatios
from splitserve.router.server import RouterServer

pytestmark = pytest.mark.integration

TPOT_MS = 25.0
TIGHT = v1.SloClassSpec(name="tight", ttft_ms=10_000, tpot_ms=TPOT_MS)


@dataclass(slots=True)
class _RecordingTail(TailRatios):
    predicted: list[float] = field(default_factory=list)

    def observe(self, predicted_s: float, actual_s: float) -> None:
        self.predicted.append(predicted_s)
        TailRatios.observe(self, predicted_s, actual_s)


def _placed(server: RouterServer, path: str, reason: str) -> float:
    return sample(server, "splitserve_router_placements_total", path=path, reason=reason)


async def test_a_slow_pull_runs_whole_on_the_decode_worker_a_cheap_one_stays_split(
    make_worker: WorkerFactory, make_router: RouterFactory
) -> None:
    p = await make_worker(Role.PREFILL, sim_time_scale=1.0)
    d = await make_worker(Role.DECODE, sim_time_scale=1.0)
    server, base = await make_router(
        [p, d],
        slo=SloSettings(classes=(TIGHT,), default_class="tight"),
        placement=PlacementSettings(min_prompt_tokens_for_pd=64),
    )
    pool = server.pool

    def decode_view() -> EndpointView:
        return pool.view(d.address)

    async def complete(prompt_tokens: int, max_tokens: int) -> None:
        prompt = [100 + i % 800 for i in range(prompt_tokens)]
        body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        r = await client.post(f"{base}/completions", json=body)
        assert r.status_code == 200, r.text
        # The next placement sees an idle pool (no batch on the decode worker to stall).
        await pool.wait_for(lambda pv: all(v.batch == 0 for v in pv.views()), 10)

    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(3):  # short prompts run whole on the decode worker: its estimates
            await complete(10, 8)
        assert _placed(server, "aggregated", "short_prompt") == 3
        assert decode_view().kv_pull_tokens_per_s == 0.0  # no pull yet: the rule is off
        for _ in range(2):
            await complete(2000, 2)
        assert _placed(server, "disaggregated", "split") == 2  # still no estimate
        await pool.wait_for(lambda pv: pv.view(d.address).kv_pull_tokens_per_s > 0, 10)
        view = decode_view()
        assert 2000 / view.kv_pull_tokens_per_s > TPOT_MS / 1000  # the pull alone misses
        assert view.prefill_tokens_per_s > 0
        assert view.decode_step_base_s > 0
        assert view.pending_pull_tokens == 0  # both pulls finished

        generated = d.sample("splitserve_worker_requests_total", kind="generate", outcome="ok")
        await complete(2000, 2)
        assert _placed(server, "aggregated", "pull_would_miss_tpot") == 1
        assert (
            d.sample("splitserve_worker_requests_total", kind="generate", outcome="ok")
            == generated + 1
        )
        prefills = p.sample("splitserve_worker_requests_total", kind="prefill", outcome="ok")
        assert prefills == 2  # it never reached the prefill worker

        # The same pull over the predicted output's gaps: cheap. Its predicted TPOT (what the
        # TPOT tail compares its measured TPOT with) holds its pull spread over those gaps.
        view = decode_view()
        pull_s = 2000 / view.kv_pull_tokens_per_s
        tail = server.dispatcher.slo.tpot_tail = _RecordingTail()
        await complete(2000, 64)
        assert len(tail.predicted) == 1
        assert tail.predicted[0] >= view.decode_step_base_s + pull_s / 63
        assert _placed(server, "disaggregated", "split") == 3
        assert _placed(server, "aggregated", "pull_would_miss_tpot") == 1
