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
   vLLM baseline vLLM's, both carried to the A100-40GB;
5. `--cases all` runs the paper's three model set-ups (§7.1) at every rate, each priced by the
   published model that covers it (Llama-3-70B: Vidur's A100 tables; OPT-30B: none, roofline);
   other papers refuse the flag;
6. token times, recorded for the per-token reading of TPOT attainment, leave every figure as it
   is, and the per-token reading is the mean of each request's share of gaps within the SLO.
"""

from __future__ import annotations

import pytest

from splitserve.core.perf import MODELS
from splitserve.policy.batching.bros import BEST_EFFORT, REALTIME
from splitserve.sim.engine import Simulator
from splitserve.sim.metrics import SimResult
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


def test_cases_all_runs_the_papers_three_models_at_every_rate() -> None:
    from splitserve.sim.reproductions.bros import CASE_SETS, CASES, RATES, _sweep_calls, bros

    default = _sweep_calls(True)
    assert len(default) == 3 * len(QUICK_RATES)  # the quick run is unchanged: OPT-13B, 9 req/s
    calls = _sweep_calls(True, "all")
    assert len(calls) == 3 * 3 * len(RATES)
    setups = {(c[4].name, c[5], c[8]) for c in calls}  # type: ignore[attr-defined]
    assert setups == {
        ("opt-13b", 2, "a100-40g"),
        ("opt-30b", 4, "a100-40g"),
        ("llama-3-70b", 8, "a100-80g"),
    }
    assert {c[2] for c in calls} == set(RATES)
    assert CASE_SETS["all"] == tuple(CASES)
    with pytest.raises(ValueError, match="--cases 'some'"):
        bros(True, "some")


def test_cases_all_is_refused_for_papers_without_cases() -> None:
    from click.testing import CliRunner

    from splitserve.cli.sim import sim
    from splitserve.sim.runner import run_reproduction

    with pytest.raises(ValueError, match="--cases all: tetriinfer"):
        run_reproduction("tetriinfer", True, None, cases="all")
    res = CliRunner().invoke(sim, ["reproduce", "accelgen", "--quick", "--cases", "all"])
    assert res.exit_code == 2  # a usage error, as for any other bad flag
    assert "Invalid value for '--cases'" in res.output
    assert "--cases acts on bros" in res.output


def test_each_case_is_priced_by_the_published_model_that_covers_it() -> None:
    from splitserve.core.perf import RescaledModel, RooflineModel, VidurModel
    from splitserve.sim.reproductions.bros import CASES
    from splitserve.sim.reproductions.common import latency_source

    def latency(case: str) -> object:
        c = CASES[case]
        return spec(BROS, c.shape, c.tp, hardware=c.hardware).pools[0].worker.latency

    assert all(isinstance(latency(case), RooflineModel) for case in CASES)
    with latency_source("gpu"):
        assert isinstance(latency("opt-13b"), RescaledModel)
        llama = latency("llama-3-70b")
        assert isinstance(llama, VidurModel)
        assert (llama.gpu, llama.model, llama.tp) == ("a100", "llama-3-70b", 8)
        assert isinstance(latency("opt-30b"), RooflineModel)  # no published OPT-30B


def test_token_times_change_nothing_and_give_the_per_token_reading() -> None:
    from splitserve.policy.batching.engine import Step
    from splitserve.sim.bench import build_kind
    from splitserve.sim.reproductions.bros import TPOT_S

    rt = tuple(WorkItem(0.02 * i, 200, 60 + i, REALTIME) for i in range(60))
    # The compiled (mypyc) build cannot replace a method on an instance: there the steps are not
    # counted (mk/bench.mk runs this file on both builds), the figures still compared.
    counting = build_kind() == "pure Python"

    def run(times: dict[str, list[float]] | None) -> tuple[SimResult, list[int]]:
        sim = Simulator()
        cluster = HybridCluster(spec(VLLM, MODELS["opt-13b"], 2), rt, lambda k, now: (), -1, times)
        engine = cluster.workers[0].engine
        schedule, repeats = engine.schedule, []

        def counted(now_s: float, max_repeat: int = 1) -> Step | None:
            step = schedule(now_s, max_repeat)
            repeats.append(step.repeat if step is not None else 0)
            return step

        if counting:
            engine.schedule = counted  # type: ignore[method-assign]
        cluster.start(sim)
        sim.run(cluster)
        return cluster.result(sim), repeats

    plain, fused = run(None)
    times: dict[str, list[float]] = {}
    recorded, single = run(times)
    if counting:
        assert max(fused) > 1  # without recording the engine fuses decode runs
        assert max(single) == 1  # recording steps one decode at a time
    # ... and every figure is the same (times to rounding: a fused run sums its steps' times)
    for a, b in zip(recorded.requests, plain.requests, strict=True):
        assert (a.id, a.num_output_tokens) == (b.id, b.num_output_tokens)
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-12)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-12)
    assert recorded.num_preemptions == plain.num_preemptions
    for r in recorded.requests:
        t = times[r.id]
        assert len(t) == r.num_output_tokens
        assert t[0] == r.first_token_s
        assert t[-1] == r.finish_s
        assert t == sorted(t)
    o = Outcome.of(recorded, 10.0, times)
    share = [
        sum(b - a <= TPOT_S for a, b in zip(times[r.id], times[r.id][1:], strict=False))
        / (r.num_output_tokens - 1)
        for r in recorded.requests
    ]
    assert o.tpot_token_attainment == pytest.approx(sum(share) / len(share))
    assert Outcome.of(plain, 10.0).tpot_token_attainment is None


def test_per_token_attainment_is_the_mean_of_each_requests_share() -> None:
    from splitserve.sim.metrics import RequestRecord
    from splitserve.sim.reproductions.bros import per_token_attainment

    def rec(rid: str, n: int) -> RequestRecord:
        return RequestRecord(rid, REALTIME, 0.0, 10, n, n, "mixed", 0.1, 1.0)

    times = {"a": [0.1, 0.2, 0.5], "b": [0.1]}  # a: gaps 0.1 (in), 0.3 (out); b: one token
    assert per_token_attainment([rec("a", 3), rec("b", 1)], times) == pytest.approx(0.75)
    with pytest.raises(RuntimeError, match="a: 3 token times, 4 tokens"):
        per_token_attainment([rec("a", 4)], times)
