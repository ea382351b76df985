"""BROS reproduction (quick) and its hybrid RT + closed-loop BE driver.

Invariants:
1. direction: BROS lowers RT normalised latency vs vLLM and RR (RR sits between), costs BE
   throughput vs vLLM, and lifts TTFT attainment far above both baselines;
2. band: RT latency reductions vs vLLM and RR and RR's TTFT attainment land within ±25 % of the
   paper's; every other quick claim lands in the band we measure and outside the paper's (docs/
   reproductions/bros.md measures why), so a change that moves one must update the docs;
3. the driver submits each BE batch only once the previous one has finished, none after the
   trace ends, and keeps RT and BE request ids apart;
4. under `--latency gpu` BROS and RR (BROS's own engine) take DistServe's engine fit and the
   vLLM baseline vLLM's, both carried to the A100-40GB.
"""

from __future__ import annotations

import pytest

from splitserve.core.perf import MODELS
from splitserve.policy.batching.bros import BEST_EFFORT, REALTIME
from splitserve.sim.engine import Simulator
from splitserve.sim.reproductions import REPRODUCTIONS, Reproduction
from splitserve.sim.reproductions.bros import (
    BROS,
    DATASETS,
    QUICK_RATES,
    VLLM,
    Outcome,
    Sweep,
    reproduction,
    spec,
    sweep,
)
from splitserve.sim.reproductions.bros_cluster import HybridCluster, simulate_hybrid
from splitserve.sim.workload import WorkItem


@pytest.fixture(scope="module")
def quick() -> tuple[Sweep, Reproduction]:
    results = sweep(True)
    return results, reproduction(results, True)


def test_registered() -> None:
    assert "bros" in REPRODUCTIONS


def test_quick_directions_agreeing_with_the_paper(quick: tuple[Sweep, Reproduction]) -> None:
    results, rep = quick
    by = {c.name: c.ours for c in rep.comparisons}
    assert by["ShareGPT: RT norm. latency reduction vs vLLM"] > 0
    assert by["ShareGPT: RT norm. latency reduction vs RR"] > 0
    assert by["ShareGPT: BE throughput loss vs vLLM"] > 0
    out = results["ShareGPT"]
    assert len(out["BROS"]) == len(QUICK_RATES)
    for b, v, r in zip(out["BROS"], out["vLLM"], out["RR"], strict=True):
        assert b.ttft_attainment > 0.9 > 0.2 > r.ttft_attainment > v.ttft_attainment
        assert b.norm_latency_s < r.norm_latency_s < v.norm_latency_s  # RR sits between
    assert rep.paper == "BROS"
    assert "BROS" in rep.markdown()


PAPER_BAND = (
    "ShareGPT: RT norm. latency reduction vs vLLM",
    "ShareGPT: RT norm. latency reduction vs RR",
    "RR TTFT attainment (all cases)",
)
MISSES = {
    # claim: (low, high) of ours in the quick run (9 req/s, 2 min); the paper's number is in the
    # comparison, and docs/reproductions/bros.md measures why each of these misses it.
    # BROS checkpoints BE blocks to host (repro_bros.HOST_SWAP); with recompute only (HOST_SWAP
    # 0) these two were 15.8 % and -12.5 %: the 2-minute trace is short for BE (see the docs).
    "ShareGPT: BE throughput loss vs vLLM": (0.20, 0.35),  # paper 11 %
    "ShareGPT: BE throughput loss vs RR": (0.0, 0.06),  # paper 8.8 %: same direction, smaller
    "ShareGPT: BROS TPOT attainment": (0.90, 1.0),  # paper 65 %
    "ShareGPT: RR TPOT attainment": (0.95, 1.0),  # paper 47 %
    "ShareGPT: TPOT attainment gain vs vLLM": (0.90, 1.01),  # paper 1.73×
    "ShareGPT: TPOT attainment gain vs RR": (0.90, 1.01),  # paper 1.47×
    "vLLM TTFT attainment (all cases)": (0.01, 0.06),  # paper 1.28 %
}


def test_quick_claims_land_in_their_bands(quick: tuple[Sweep, Reproduction]) -> None:
    _, rep = quick
    by = {c.name: c for c in rep.comparisons}
    assert set(by) == set(PAPER_BAND) | set(MISSES)
    for name in PAPER_BAND:
        assert by[name].within_band, (name, by[name].ours)
    for name, (low, high) in MISSES.items():
        assert low <= by[name].ours <= high, (name, by[name].ours)
        assert not by[name].within_band, name  # a fix must update the docs


def _batch(n: int, prompt: int = 64, output: int = 8) -> list[WorkItem]:
    return [WorkItem(0.0, prompt, output, BEST_EFFORT) for _ in range(n)]


def test_be_batches_arrive_closed_loop_and_stop_at_the_trace_end() -> None:
    rt = tuple(WorkItem(0.05 * i, 32, 16, REALTIME) for i in range(20))
    sim = Simulator()
    cluster = HybridCluster(spec(BROS, MODELS["opt-13b"], 2), rt, lambda k, now: _batch(4), 1.0)
    cluster.start(sim)
    sim.run(cluster)
    be = [r for r in cluster.requests if r.slo_class == BEST_EFFORT]
    assert len(be) == 4 * cluster.num_be_batches
    assert cluster.num_be_batches >= 2
    for k in range(1, cluster.num_be_batches):
        prev, cur = be[4 * (k - 1) : 4 * k], be[4 * k : 4 * k + 4]
        last_finish = max(r.finish_s or 0.0 for r in prev)
        assert {r.item.arrival_s for r in cur} == {last_finish}  # submitted when all finished
        assert last_finish < 1.0
    assert all(r.finish_s is not None for r in cluster.requests)
    assert len({r.id for r in cluster.requests}) == len(cluster.requests)
    assert {str(r.id)[:2] for r in be} == {"be"}


def test_outcome_metrics_on_a_small_hybrid_run() -> None:
    rt = tuple(WorkItem(0.1 * i, 100, 20, REALTIME) for i in range(10))
    result = simulate_hybrid(spec(VLLM, MODELS["opt-13b"], 2), rt, lambda k, now: _batch(8), 2.0)
    o = Outcome.of(result, 2.0)
    rt_recs = [r for r in result.requests if r.slo_class == REALTIME]
    expect = sum((r.e2e_s or 0.0) / r.num_output_tokens for r in rt_recs) / len(rt_recs)
    assert o.norm_latency_s == pytest.approx(expect)
    assert 0 <= o.ttft_attainment <= 1
    assert 0 <= o.tpot_attainment <= 1
    done = [r for r in result.requests if r.slo_class == BEST_EFFORT and (r.finish_s or 9) <= 2]
    assert o.be_throughput == pytest.approx(len(done) / 2.0)
    assert o.be_throughput > 0
    assert DATASETS[0].name == "ShareGPT"


def test_gpu_models_price_bros_own_engine_with_distserves_engine_fit() -> None:
    """§6: BROS (and RR, BROS with its scheduler replaced) run on BROS's own engine, not vLLM;
    under `--latency gpu` they take DistServe's own-engine fit, the vLLM baseline vLLM's fit,
    both carried to the paper's A100-40GB with the per-step cost off the GPU held."""
    from splitserve.core.perf import BatchShape, DistServeModel, RescaledModel, RooflineModel
    from splitserve.sim.reproductions.bros import OWN_ENGINE_FIT, RR
    from splitserve.sim.reproductions.common import latency_source

    assert OWN_ENGINE_FIT == "distserve"
    opt13b = MODELS["opt-13b"]
    assert isinstance(spec(BROS, opt13b, 2).pools[0].worker.latency, RooflineModel)
    with latency_source("gpu"):
        lat = {
            name: spec(s, opt13b, 2).pools[0].worker.latency
            for name, s in (("vLLM", VLLM), ("RR", RR), ("BROS", BROS))
        }
        cost = spec(BROS, opt13b, 2).pools[0].worker.policy_params["latency"]
    engines = {}
    for name, m in lat.items():
        assert isinstance(m, RescaledModel)
        assert isinstance(m.base, DistServeModel)
        assert m.base.tp == 2
        assert m.target.hardware.name == "a100-40g"
        engines[name] = m.base.engine
    assert engines == {"vLLM": "vllm", "RR": "distserve", "BROS": "distserve"}
    assert isinstance(cost, RescaledModel)  # BROS's cost model is profiled on its own engine
    assert isinstance(cost.base, DistServeModel)
    assert cost.base.engine == "distserve"
    # DistServe's engine leaves less per-step cost off the GPU than vLLM's (≈ 3 vs 15 ms at TP 2).
    one = BatchShape((), (1,))
    assert lat["BROS"].step_s(one) < lat["vLLM"].step_s(one)
    bros_m, vllm_m = lat["BROS"], lat["vLLM"]
    assert isinstance(bros_m, RescaledModel)
    assert isinstance(vllm_m, RescaledModel)
    assert bros_m.fixed_s < vllm_m.fixed_s
