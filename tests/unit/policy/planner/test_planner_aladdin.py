"""Aladdin's planner: fitted performance models, Eq 6 worker size, worker counts (Eq 7).

Invariants (research/seed-distserve-vidur-aladdin.md C.10 and the module docstring):
1. fitting recovers known coefficients (C.10-1): a latency model that *is* Eq 2/3 is fitted
   exactly; prefill time is invariant to the batch split at fixed Σl_in;
2. Eq 6 (C.10-7): with Llama2-70B-like shapes on 80 GB GPUs the 1-GPU size is absent (weights do
   not fit) and the choice is among the sizes that fit; a tighter ATGT SLO never picks fewer GPUs
   on a synthetic GPU whose compute scales as k₄/N_g + c₄;
3. monotonicity (hypothesis): more load never needs fewer workers (bound and oracle search); a
   tighter SLO never needs fewer;
4. `min_workers` returns the smallest count a monotone oracle accepts, and fails past its limit;
5. Eq 7: the fitted line recovers a linear relation (R² = 1) and never predicts fewer workers
   for more load; R (SEM threshold) matches σ²/(ε·μ)²/heartbeat;
6. `plan` picks the Eq 6 size and searches its count from the analytic bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel
from splitserve.policy.planner.aladdin import (
    AladdinPerfModel,
    LengthStats,
    PlannerParams,
    WorkerLine,
    fit_perf_model,
    fit_worker_line,
    lower_bound_workers,
    min_workers,
    optimal_gpus_per_worker,
    per_gpu_throughput,
    plan,
    sem_min_rate,
)

STATS = LengthStats(161.0, 338.0, 300.0)


@dataclass(frozen=True)
class Linear:
    """A latency model that is exactly Eq 2 (prefill) and Eq 3 (decode)."""

    k1: float = 1e-4
    c1: float = 0.01
    k2: float = 5e-7
    c2: float = 4e-5
    c3: float = 0.015

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        if batch.prefill_chunks:
            return self.k1 * sum(n for n, _ in batch.prefill_chunks) + self.c1
        ctx = batch.decode_contexts
        return self.k2 * sum(ctx) + self.c2 * len(ctx) + self.c3

    def kv_transfer_s(self, num_bytes: int) -> float:
        return 0.0


def test_fit_recovers_known_coefficients() -> None:
    truth = Linear()
    rep = fit_perf_model(truth, 100_000, atgt_slo_s=0.03)
    m = rep.model
    for name in ("k1", "c1", "k2", "c2", "c3"):
        assert getattr(m, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    assert rep.prefill_max_error < 1e-6
    assert rep.decode_max_error < 1e-6
    assert m.kv_capacity == 100_000


def test_roofline_prefill_is_batch_split_invariant_in_eq2() -> None:
    m = fit_perf_model(RooflineModel(MODELS["llama-2-13b"], HARDWARE["a100-80g"]), 50_000).model
    # Eq 2 depends on Σl_in only: 1 x 2048 and 8 x 256 cost the same in the model.
    assert m.prefill_s(2048) == m.prefill_s(8 * 256)
    assert m.prefill_s(0) == 0.0


def test_eq6_70b_on_80gb_gpus_skips_sizes_that_do_not_fit() -> None:
    models = {}
    for tp in (1, 2, 4):
        lat = RooflineModel(MODELS["llama-2-70b"], HARDWARE["a100-80g"], tp)
        cap = lat.kv_capacity_tokens(0.9)
        if cap > 0:
            models[tp] = fit_perf_model(lat, cap, tp, 0.075).model
    assert 1 not in models  # 138 GB of weights do not fit one 80 GB GPU
    assert optimal_gpus_per_worker(models, STATS, PlannerParams(0.075, 1.6)) in (2, 4)


def _synthetic_sizes(k4: float, c4: float) -> dict[int, AladdinPerfModel]:
    """Compute per iteration k₄/N_g + c₄ (Eq 5), KV capacity N_g·80 GB − 60 GB of weights."""
    out = {}
    for ng in (1, 2, 4, 8):
        cap = max(0.0, ng * 80 - 60) * 1000
        out[ng] = AladdinPerfModel(
            k2=2e-7 / ng, c2=1e-5, c3=k4 / ng + c4, kv_capacity=cap, num_gpus=ng
        )
    return out


def test_eq6_grows_with_a_tighter_slo_and_prefers_the_smallest_fitting_when_kv_bound() -> None:
    sizes = _synthetic_sizes(k4=0.03, c4=0.004)
    loose = optimal_gpus_per_worker(sizes, STATS, PlannerParams(0.2))
    tight = optimal_gpus_per_worker(sizes, STATS, PlannerParams(0.02))
    assert tight >= loose
    # KV-bound with compute that does not scale with N_g (c₄ only) and KV proportional to N_g:
    # more GPUs per worker buy nothing per GPU, so the smallest size wins.
    kv_heavy = LengthStats(8000.0, 2000.0)
    flat = {
        ng: AladdinPerfModel(k2=2e-7, c2=1e-5, c3=0.01, kv_capacity=ng * 20_000.0, num_gpus=ng)
        for ng in (1, 2, 4)
    }
    assert optimal_gpus_per_worker(flat, kv_heavy, PlannerParams(5.0)) == 1
    with pytest.raises(ValueError, match="no worker size"):
        optimal_gpus_per_worker({1: AladdinPerfModel(c3=0.05)}, STATS, PlannerParams(0.03))


@given(st.floats(0, 200), st.floats(0, 200))
def test_more_load_never_needs_fewer_workers(r1: float, r2: float) -> None:
    m = AladdinPerfModel()
    lo, hi = sorted((r1, r2))
    assert lower_bound_workers(lo, m, STATS) <= lower_bound_workers(hi, m, STATS)


@given(st.floats(0.5, 100), st.floats(0.02, 0.1), st.floats(0.02, 0.1))
def test_tighter_slo_never_needs_fewer_workers(rate: float, t1: float, t2: float) -> None:
    m = AladdinPerfModel()
    tight, loose = sorted((t1, t2))
    assert (
        per_gpu_throughput(m, STATS, PlannerParams(tight))
        <= per_gpu_throughput(m, STATS, PlannerParams(loose)) + 1e-9
    )
    assert lower_bound_workers(rate, m, STATS, PlannerParams(tight)) >= lower_bound_workers(
        rate, m, STATS, PlannerParams(loose)
    )


@given(st.integers(1, 500), st.integers(1, 40))
def test_min_workers_finds_the_threshold(threshold: int, start: int) -> None:
    calls: list[int] = []

    def meets(n: int) -> bool:
        calls.append(n)
        return n >= threshold

    got = min_workers(meets, start=start, limit=1000)
    assert got == max(threshold, start)
    assert len(calls) <= 2 * 12 + 2  # gallop + bisect: logarithmic


@given(st.integers(1, 300), st.integers(1, 20), st.integers(1, 400))
def test_min_workers_with_a_guess_finds_the_same_threshold(
    threshold: int, start: int, guess: int
) -> None:
    got = min_workers(lambda n: n >= threshold, start=start, limit=1000, guess=guess)
    assert got == max(threshold, start)


@given(st.floats(0, 50), st.floats(0, 50))
def test_oracle_search_is_monotone_in_rate(r1: float, r2: float) -> None:
    """With a monotone oracle (capacity 7.3 req/s per worker), more load, more workers."""

    def count(rate: float) -> int:
        return min_workers(lambda n: n * 7.3 >= rate, start=1)

    lo, hi = sorted((r1, r2))
    assert count(lo) <= count(hi)


def test_min_workers_fails_past_the_limit() -> None:
    with pytest.raises(ValueError, match="do not meet"):
        min_workers(lambda n: False, start=1, limit=16)
    with pytest.raises(ValueError, match="start"):
        min_workers(lambda n: True, start=0)


def test_eq7_line_fit_and_sem_threshold() -> None:
    pts = [(r, round(0.5 * r + 2)) for r in (4.0, 8.0, 12.0, 16.0, 20.0)]
    line, r2 = fit_worker_line(pts)
    assert line.k5 == pytest.approx(0.5)
    assert line.c5 == pytest.approx(2.0)
    assert r2 == 1.0
    assert line.workers(10.0) == 7
    assert WorkerLine(0.5, 2.0, min_rate_per_s=6.0).workers(1.0) == 5  # below R: R's count
    with pytest.raises(ValueError, match="two"):
        fit_worker_line([(1.0, 2)])
    # σ/μ = 300/338; n = (0.888/0.05)² ≈ 315 requests per 30 s heartbeat ≈ 10.5 req/s.
    assert sem_min_rate(STATS, 30.0) == pytest.approx((300 / 338 / 0.05) ** 2 / 30)


@given(st.lists(st.tuples(st.floats(1, 100), st.integers(1, 200)), min_size=2, max_size=12))
@example(points=[(1.0, 1), (1.0000000000000002, 1)])  # rates one ulp apart: polyfit warned
@example(points=[(1.0, 1), (1.0000000000000002, 9)])
def test_eq7_line_never_decreases(points: list[tuple[float, int]]) -> None:
    line, _ = fit_worker_line(points)
    assert line.k5 >= 0
    assert line.workers(10.0) <= line.workers(20.0)


def test_plan_uses_eq6_size_and_searches_from_the_bound() -> None:
    sizes = {1: AladdinPerfModel(), 2: AladdinPerfModel(c3=0.01, k2=2.5e-7, num_gpus=2)}
    params = PlannerParams()
    analytic = plan(20.0, sizes, STATS, params)
    assert analytic.num_workers == analytic.lower_bound >= 1
    ng = analytic.gpus_per_worker
    assert ng == optimal_gpus_per_worker(sizes, STATS, params)
    searched = plan(20.0, sizes, STATS, params, meets=lambda g, n: n >= analytic.lower_bound + 3)
    assert searched.num_workers == analytic.lower_bound + 3
    assert searched.num_gpus == ng * searched.num_workers


def test_perf_model_validation() -> None:
    with pytest.raises(ValueError, match="k2"):
        AladdinPerfModel(k2=0.0)
    with pytest.raises(ValueError, match="coefficients"):
        AladdinPerfModel(c3=-1.0)
    m = AladdinPerfModel()
    assert m.decode_s(1000, 0) == 0.0
    assert m.slo_batch(0.001, 300) == 0.0  # SLO below the fixed cost: no batch meets it
    assert per_gpu_throughput(m, STATS, PlannerParams(0.001)) == 0.0


def test_fit_falls_back_to_every_batch_when_none_is_near_the_slo() -> None:
    from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
    from splitserve.policy.planner.aladdin import fit_perf_model

    # Llama-2-13B on four A100s: every batch up to 256 decodes far under 50 ms.
    roofline = RooflineModel(MODELS["llama-2-13b"], HARDWARE["a100-80g"], tp=4)
    kv = roofline.kv_capacity_tokens(0.9)
    report = fit_perf_model(roofline, kv, 4, atgt_slo_s=0.1)
    assert report.model.num_gpus == 4
    assert report.model.decode_s(64 * 512, 64) < 0.05
