"""Aladdin's worker planner: learned performance models, worker size (Eq 6) and worker count.

Aladdin (seeds/aladdin.txt §3, §5.2; research/seed-distserve-vidur-aladdin.md C.3, C.9-4/8, D.2,
D.4) models one worker configuration with three linear fits and derives everything else from them:

    Eq 1  kv(ctx)       = h·ctx + j                       KV demand of one request
    Eq 2  t_pre(Σl_in)  = k₁·Σl_in + c₁                   prefill iteration (batch-size free)
    Eq 3  t_dec(L, b)   = k₂·L + c₂·b + c₃                decode iteration, L = Σ context
    Eq 4  l^d(b)        = (T_dec − c₃ − c₂·b) / k₂         context budget under the ATGT SLO
    Eq 6  T_max(N_g)    = min{ M/(N_g·m_r·t(M/m_r)), B/(N_g·T_dec) }   tokens/s per GPU
    Eq 7  N_w           = ⌈k₅·r_a + c₅⌉                    workers for arrival rate r_a

Owns: `AladdinPerfModel` (Eq 1-4 for one worker size), `fit_perf_model` (least-squares fit of
Eq 2/3 to any `LatencyModel`, the "learned" models, with their fit errors), `per_gpu_throughput`
and `optimal_gpus_per_worker` (Eq 6, `N_g^opt`), the analytic lower bound on the worker count,
`min_workers` (the smallest count an attainment oracle accepts: the simulator, D.2) and
`WorkerLine` (Eq 7, fitted by least squares to (rate, workers) points, C.9-8).

Choices where the paper is silent (noted, as the spec recommends):
* `B` and `m_r` use the mean context over a request's lifetime `l̄ = E[l_in + l_out/2]` and the
  KV demand `kv(E[l_in + γ·l_out])` (C.9-4); `t_comm` is inside Eq 3 because we fit Eq 3 per
  tensor-parallel degree instead of extrapolating with Eq 5.
* KV is counted in tokens of cache (`h = 1`, `j = 0` fit exactly for a paged cache measured in
  tokens); `M` is the worker's KV capacity in the same unit.
* The lower bound is demand / capacity: `rate·E[l_out]` tokens/s over `N_g·T_max` per worker.
  It ignores queueing, so the oracle search starts there and only goes up.
Pure: no I/O, no clock. The oracle passed to `min_workers` is the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.core.perf.protocol import BatchShape, LatencyModel


@dataclass(frozen=True, slots=True)
class AladdinPerfModel:
    """Eq 1-4 for one worker configuration (all times in seconds, KV in tokens of cache).

    Defaults: Llama2-13B on one A100-80GB as the roofline prices it (`fit_perf_model`), so a
    scorer built with no parameters has a plausible model.
    """

    k1: float = 1.2e-4
    """Prefill seconds per prompt token (Eq 2)."""
    c1: float = 0.02
    k2: float = 5.0e-7
    """Decode seconds per context token in the batch (Eq 3)."""
    c2: float = 2.0e-5
    """Decode seconds per sequence in the batch (Eq 3)."""
    c3: float = 0.018
    """Decode seconds per iteration, whatever the batch (Eq 3)."""
    kv_slope: float = 1.0
    """h of Eq 1: KV units per context token."""
    kv_intercept: float = 0.0
    """j of Eq 1: KV units per request."""
    kv_capacity: float = 56_000.0
    """M: KV units one worker holds beside the weights (Eq 6's N_g·m_gpu − m_model)."""
    num_gpus: int = 1
    """N_g: GPUs per worker (tensor-parallel degree)."""

    def __post_init__(self) -> None:
        if min(self.k1, self.c1, self.k2, self.c2, self.c3) < 0:
            raise ValueError("performance-model coefficients must be >= 0")
        if self.k2 <= 0:
            raise ValueError("k2 must be > 0 (decode time grows with context)")
        if self.kv_slope <= 0 or self.kv_intercept < 0 or self.num_gpus < 1:
            raise ValueError("kv_slope must be > 0, kv_intercept >= 0 and num_gpus >= 1")

    def kv(self, context_tokens: float) -> float:
        """Eq 1: KV units a request with this much context holds."""
        return self.kv_slope * context_tokens + self.kv_intercept

    def prefill_s(self, prompt_tokens: float) -> float:
        """Eq 2: one prefill iteration over this many prompt tokens (0 for none)."""
        return self.k1 * prompt_tokens + self.c1 if prompt_tokens > 0 else 0.0

    def decode_s(self, context_tokens: float, batch: int) -> float:
        """Eq 3: one decode iteration of `batch` sequences holding `context_tokens` in all."""
        if batch <= 0:
            return 0.0
        return self.k2 * context_tokens + self.c2 * batch + self.c3

    def context_budget(self, batch: int, atgt_slo_s: float) -> float:
        """Eq 4: the most total context a batch of `batch` may hold and still decode within the
        ATGT SLO (<= 0: no batch that large meets it)."""
        return (atgt_slo_s - self.c3 - self.c2 * batch) / self.k2

    def slo_batch(self, atgt_slo_s: float, mean_context: float) -> float:
        """B of Eq 6: the batch whose iteration time equals the SLO at mean context `l̄`."""
        return max(0.0, (atgt_slo_s - self.c3) / (self.k2 * mean_context + self.c2))


# -- fitting (the "learned" models) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FitReport:
    """A fitted model and how well Eq 2/3 explain the samples they were fitted to."""

    model: AladdinPerfModel
    prefill_max_error: float
    """Largest relative error of Eq 2 on the prefill samples."""
    decode_max_error: float
    """Largest relative error of Eq 3 on the decode samples."""
    num_samples: int


def _lstsq_nonneg(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares, dropping columns whose coefficient comes out negative (few columns)."""
    free = list(range(x.shape[1]))
    while True:
        sol, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
        if np.all(sol >= 0) or len(free) == 1:
            out = np.zeros(x.shape[1])
            out[free] = np.maximum(sol, 0.0)
            return out
        free.pop(int(np.argmin(sol)))


def fit_perf_model(
    latency: LatencyModel,
    kv_capacity_tokens: int,
    num_gpus: int = 1,
    atgt_slo_s: float | None = None,
    max_prompt_tokens: int = 4096,
    max_batch: int = 256,
) -> FitReport:
    """Fit Eq 2 and Eq 3 to `latency` over a grid of operating points (the paper fits them to
    execution traces; here the traces are the latency model's own prices).

    Prefill: whole prompts of 1, 2, 4 and 8 requests (Σl_in up to `max_prompt_tokens`), as the
    paper validates. Decode: batches of 2..`max_batch` with average contexts 64..2048 that fit
    the KV capacity; with `atgt_slo_s`, only batches taking 0.5-1.5x the SLO: constraint (b)
    decides at the SLO, so the line is fitted where it decides (our roofline is a max of a
    weight-read and a compute line, which one straight line cannot follow everywhere). When
    fewer than three batches of the grid come that close (every batch is far faster than the
    SLO), all of the grid's batches are fitted.
    """
    if kv_capacity_tokens <= 0:
        raise ValueError("kv_capacity_tokens must be > 0 (the weights leave no KV room)")
    pre_x: list[tuple[float, float]] = []
    pre_y: list[float] = []
    for total in (128, 256, 512, 1024, 2048, 3072, max_prompt_tokens):
        for n in (1, 2, 4, 8):
            each = total // n
            batch = BatchShape(prefill_chunks=tuple((each, 0) for _ in range(n)))
            pre_x.append((float(each * n), 1.0))
            pre_y.append(latency.step_s(batch))
    dec_all: list[tuple[tuple[float, float, float], float]] = []
    dec_x: list[tuple[float, float, float]] = []
    dec_y: list[float] = []
    for b in range(2, max_batch + 1, 6):
        for avg in (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048):
            if b * avg > kv_capacity_tokens:
                continue
            seconds = latency.step_s(BatchShape(decode_contexts=(avg,) * b))
            dec_all.append(((float(b * avg), float(b), 1.0), seconds))
            if atgt_slo_s is not None and not 0.5 * atgt_slo_s <= seconds <= 1.5 * atgt_slo_s:
                continue
            dec_x.append((float(b * avg), float(b), 1.0))
            dec_y.append(seconds)
    if len(dec_y) < 3 <= len(dec_all):
        # No batch up to `max_batch` comes near the SLO (a fast worker, e.g. a large TP): the
        # SLO never decides within the grid, so fit every operating point instead.
        dec_x = [x for x, _ in dec_all]
        dec_y = [y for _, y in dec_all]
    if len(dec_y) < 3:
        raise ValueError("too few decode operating points to fit Eq 3")
    px, py = np.array(pre_x), np.array(pre_y)
    dx, dy = np.array(dec_x), np.array(dec_y)
    k1, c1 = _lstsq_nonneg(px, py)
    k2, c2, c3 = _lstsq_nonneg(dx, dy)
    model = AladdinPerfModel(
        k1=float(k1),
        c1=float(c1),
        k2=float(max(k2, 1e-12)),
        c2=float(c2),
        c3=float(c3),
        kv_capacity=float(kv_capacity_tokens),
        num_gpus=num_gpus,
    )
    pre_err = float(np.max(np.abs(px @ np.array([k1, c1]) - py) / py))
    dec_err = float(np.max(np.abs(dx @ np.array([k2, c2, c3]) - dy) / dy))
    return FitReport(model, pre_err, dec_err, len(pre_y) + len(dec_y))


# -- worker size (Eq 6) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LengthStats:
    """What the planner needs of the workload's lengths (from history)."""

    mean_prompt_tokens: float
    mean_output_tokens: float
    std_output_tokens: float = 0.0

    def __post_init__(self) -> None:
        if self.mean_prompt_tokens < 0 or self.mean_output_tokens <= 0:
            raise ValueError("mean prompt must be >= 0 and mean output > 0")

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, int]]) -> LengthStats:
        """From (prompt, output) samples."""
        if not pairs:
            raise ValueError("no length samples")
        arr = np.array(pairs, dtype=float)
        return cls(float(arr[:, 0].mean()), float(arr[:, 1].mean()), float(arr[:, 1].std()))

    @property
    def mean_context(self) -> float:
        """l̄ = E[l_in + l_out/2]: a request's context averaged over its lifetime."""
        return self.mean_prompt_tokens + self.mean_output_tokens / 2


@dataclass(frozen=True, slots=True)
class PlannerParams:
    atgt_slo_s: float = 0.03
    """T_dec (Llama2-13B on A100, Table 2)."""
    ttft_slo_s: float = 0.6
    gamma: float = 0.5
    """Strictness knob of constraint (b): also weights the output in m_r (C.9-4)."""

    def __post_init__(self) -> None:
        if self.atgt_slo_s <= 0 or self.ttft_slo_s <= 0 or not 0 <= self.gamma <= 1:
            raise ValueError("SLOs must be > 0 and gamma in [0, 1]")


def per_gpu_throughput(
    model: AladdinPerfModel, stats: LengthStats, params: PlannerParams = PlannerParams()
) -> float:
    """Eq 6: most decode tokens/s one GPU of this worker size sustains within the ATGT SLO
    (0 when the worker cannot meet it at all)."""
    t_dec = params.atgt_slo_s
    ctx = stats.mean_context
    m_r = model.kv(stats.mean_prompt_tokens + params.gamma * stats.mean_output_tokens)
    slo_batch = model.slo_batch(t_dec, ctx)
    kv_batch = model.kv_capacity / m_r if m_r > 0 else 0.0
    if slo_batch < 1 or kv_batch < 1:
        return 0.0
    ng = model.num_gpus
    kv_bound = kv_batch / (ng * model.decode_s(kv_batch * ctx, max(2, round(kv_batch))))
    slo_bound = slo_batch / (ng * t_dec)
    return min(kv_bound, slo_bound)


def optimal_gpus_per_worker(
    models: Mapping[int, AladdinPerfModel],
    stats: LengthStats,
    params: PlannerParams = PlannerParams(),
) -> int:
    """N_g^opt = argmax_N T_max(N) over the sizes given (keyed by N_g); ties: fewer GPUs.

    Sizes whose weights leave no KV room are simply absent from `models` (or have M <= 0).
    Raises ValueError when no size meets the SLO.
    """
    best, best_tp = 0, 0.0
    for ng in sorted(models):
        m = models[ng]
        if m.kv_capacity <= 0:
            continue
        tput = per_gpu_throughput(m, stats, params)
        if tput > best_tp * (1 + 1e-9):
            best, best_tp = ng, tput
    if best == 0:
        raise ValueError("no worker size meets the ATGT SLO")
    return best


# -- worker count (Eq 7 and the oracle search) -----------------------------------------------


def lower_bound_workers(
    rate_per_s: float,
    model: AladdinPerfModel,
    stats: LengthStats,
    params: PlannerParams = PlannerParams(),
) -> int:
    """Workers needed for the decode token demand at Eq 6's per-GPU throughput (>= 1)."""
    if rate_per_s < 0:
        raise ValueError("rate_per_s must be >= 0")
    per_worker = per_gpu_throughput(model, stats, params) * model.num_gpus
    if per_worker <= 0:
        raise ValueError("the worker cannot meet the ATGT SLO")
    return max(1, math.ceil(rate_per_s * stats.mean_output_tokens / per_worker - 1e-9))


def min_workers(
    meets: Callable[[int], bool], start: int = 1, limit: int = 4096, guess: int | None = None
) -> int:
    """Smallest worker count `n >= start` with `meets(n)`, for an oracle that is monotone in n
    (more workers never hurt): gallop up from `start` by doubling, then bisect. With a `guess`
    (e.g. another policy's count) it is tried first: if it meets, walk down from it one by one
    (cheap when the guess is close); if not, gallop up from guess + 1. Raises ValueError when
    even `limit` workers fail. An oracle judged on one short run at P100 is not monotone (one
    unlucky request decides it); give it a target below 1 or average seeds, or scan as
    `sim.reproductions.aladdin` does, rather than trust a bisection on it."""
    if start < 1 or limit < start:
        raise ValueError("need 1 <= start <= limit")
    if guess is not None and start <= guess <= limit:
        if meets(guess):
            n = guess
            while n > start and meets(n - 1):
                n -= 1
            return n
        if guess == limit:
            raise ValueError(f"{limit} workers do not meet the target")
        start = guess + 1
    lo, hi = start - 1, start  # meets(lo) is False or lo is below start
    while not meets(hi):
        if hi >= limit:
            raise ValueError(f"{limit} workers do not meet the target")
        lo, hi = hi, min(limit, max(hi + 1, 2 * hi))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True)
class WorkerLine:
    """Eq 7: N_w = ⌈k₅·r_a + c₅⌉ above the rate `min_rate_per_s` (R)."""

    k5: float
    c5: float = 0.0
    min_rate_per_s: float = 0.0

    def workers(self, rate_per_s: float, minimum: int = 1) -> int:
        """Workers for an arrival rate; below R the line is not trusted and R's count is used."""
        r = max(rate_per_s, self.min_rate_per_s)
        return max(minimum, math.ceil(self.k5 * r + self.c5 - 1e-9))


def fit_worker_line(
    points: Sequence[tuple[float, int]], min_rate_per_s: float = 0.0
) -> tuple[WorkerLine, float]:
    """Least-squares Eq 7 over (rate, workers) points at or above R; returns the line and R².

    The slope is kept >= 0 (more load never needs fewer workers)."""
    used = [(r, n) for r, n in points if r >= min_rate_per_s]
    if len(used) < 2:
        raise ValueError("need at least two (rate, workers) points above R")
    x = np.array([r for r, _ in used], dtype=float)
    y = np.array([n for _, n in used], dtype=float)
    # Closed-form least squares. Rates that differ only by rounding (a spread within 1e-9 of
    # their size) carry no slope: the line is flat at the mean, not a near-singular fit.
    dx = x - x.mean()
    sxx = float(np.sum(dx**2))
    spread_ok = float(np.ptp(x)) > 1e-9 * float(np.max(np.abs(x)))
    k5 = max(0.0, float(np.sum(dx * (y - y.mean())) / sxx)) if spread_ok and sxx > 0 else 0.0
    c5 = float(y.mean() - k5 * x.mean())
    resid = y - (k5 * x + c5)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss if ss > 0 else 1.0
    return WorkerLine(k5, c5, min_rate_per_s), r2


def sem_min_rate(stats: LengthStats, heartbeat_s: float, rel_sem: float = 0.05) -> float:
    """R of Eq 7 (C.9-8): the arrival rate at which the per-heartbeat mean output length has a
    standard error (σ/√n) within `rel_sem` of the mean."""
    if heartbeat_s <= 0 or rel_sem <= 0:
        raise ValueError("heartbeat_s and rel_sem must be > 0")
    n = (stats.std_output_tokens / (rel_sem * stats.mean_output_tokens)) ** 2
    return n / heartbeat_s


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    gpus_per_worker: int
    num_workers: int
    lower_bound: int
    """The analytic bound the count was searched from."""

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_worker * self.num_workers


def plan(
    rate_per_s: float,
    models: Mapping[int, AladdinPerfModel],
    stats: LengthStats,
    params: PlannerParams = PlannerParams(),
    meets: Callable[[int, int], bool] | None = None,
) -> WorkerPlan:
    """Aladdin's plan for one arrival rate: the worker size by Eq 6, then the fewest workers of
    that size. `meets(gpus_per_worker, num_workers)` is the attainment oracle (the simulator
    running Alg 1 placement); without one the analytic lower bound is the answer."""
    ng = optimal_gpus_per_worker(models, stats, params)
    bound = lower_bound_workers(rate_per_s, models[ng], stats, params)
    if meets is None:
        return WorkerPlan(ng, bound, bound)
    oracle = meets
    return WorkerPlan(ng, min_workers(lambda n: oracle(ng, n), start=bound), bound)
