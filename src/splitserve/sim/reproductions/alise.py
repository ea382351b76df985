"""ALISE's headline claims re-run in the simulator: ALISE vs vLLM (FCFS), and its KV policies.

Owns: ALISE's evaluation set-up (seeds/alise.txt §4; research/seed-pastfuture-alise.md §B.8-B.9)
expressed as cluster specs and workloads, the normalized-latency metric, the search for the
highest rate under a normalized-latency bound, and the comparisons. Pure: returns a
`Reproduction`; the runner prints it.

Set-up, as the paper states it or as we infer it where it does not:
* OPT-13B on one V100-32GB (paper Fig. 2 / Fig. 9: "OPT-13B on a single V100"), roofline model;
  fp16 weights, INT8 KV (paper §4.1), so a token's KV is half the fp16 bytes; 90 % of HBM minus
  the weights holds KV (≈ 6.4k tokens). Host link PCIe 3.0 x16, 12 GB/s effective (V100 hosts;
  the paper's "PCIe 4.0x16" cannot be reached by a V100, spec §B.8); host swap space 1 TB DRAM,
  i.e. unbounded here. Swaps overlap with compute (paper §3.2), so a step takes
  max(batch, copies) (`WorkerTemplate.host_swap_overlap`).
* vLLM = one instance, FCFS, vLLM of 2023 (no chunked prefill, prompts first, 2,048-token
  budget), recompute on KV shortage.
* ALISE = the "alise" step policy (multi-level predicted-SRPT queues, aging, demotion with
  doubling) with iteration-level preemption (`displace_running`) and swap preemption
  (`preemption="swap"`); T0 / alpha / beta of Eqs. 4-5 fitted to the same roofline. Predictor:
  the engine's oracle with the paper's reported mean relative error (9.2 % ShareGPT, 3.4 %
  Alpaca, §3.1), `oracle-noisy`; "Oracle" = exact lengths.
* Fig. 8 strawmen, same scheduler: Defer (no displacement of running jobs: new jobs wait when
  memory is full) and Recompute (displacement by dropping KV).
* Workloads: ShareGPT-shaped (mean ≈ 161 in / 338 out) and Alpaca-shaped (mean ≈ 19 in / 58 out,
  the vLLM paper's statistics); pairs longer than OPT's 2,048-token context are dropped, not
  truncated (a truncated 2,047-token prompt with 1 output token alone moves the mean normalized
  latency by 0.25 s/token); Poisson arrivals.
* Metric: normalized latency = mean over requests of end-to-end latency / output tokens
  (paper §4.1); throughput = the highest rate whose normalized latency stays under 200 ms/token
  (paper Fig. 6b), interpolated on a rate grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from splitserve.core.ids import PoolName
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel
from splitserve.core.roles import Role
from splitserve.sim.cluster import ClusterSpec, simulate
from splitserve.sim.entities import PoolSpec, WorkerTemplate
from splitserve.sim.metrics import SimResult
from splitserve.sim.reproductions.common import (
    Comparison,
    Reproduction,
    gpu_or,
    latency_note,
    parallel_map,
    pricing,
)
from splitserve.sim.workload import PRESETS, LengthDist, LogNormal, WorkItem

CONTEXT_TOKENS = 2048
BOUND_S_PER_TOKEN = 0.2
"""Paper Fig. 6b: the normalized-latency constraint of the throughput claims."""
HOST_LINK_BYTES_PER_S = 12e9
"""PCIe 3.0 x16 effective: what a V100 host link runs at (spec §B.8)."""
HOST_SWAP_TOKENS = 1 << 40
"""1 TB of host DRAM: never the limit for one V100's KV."""

V100_32G = HARDWARE["v100-32g"]
MODEL = RooflineModel(MODELS["opt-13b"], V100_32G)
KV_INT8 = replace(MODEL.shape.kv_layout, dtype_bytes=1)
KV_TOKENS = int((V100_32G.memory_bytes * 0.9 - MODEL.shape.weight_bytes) // KV_INT8.bytes_per_token)


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    prompt: LengthDist
    output: LengthDist
    predictor_error: float
    """The paper's mean relative length-prediction error on this dataset (§3.1)."""
    rates: tuple[float, ...]
    """Offered rates (req/s) the throughput curve is taken at."""
    quick_rates: tuple[float, ...]


SHAREGPT = Dataset(
    "ShareGPT",
    PRESETS["sharegpt"].prompt,
    PRESETS["sharegpt"].output,
    0.092,
    (0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4),
    (1.0, 1.4, 1.8, 2.2),
)
ALPACA = Dataset(
    "Alpaca",
    LogNormal(14.0, 0.8, 2, 512),
    LogNormal(42.0, 0.8, 1, 1024),
    0.034,
    (10.0, 15.0, 20.0, 25.0, 35.0, 45.0, 55.0),
    (30.0, 50.0),
)
"""Alpaca-shaped: medians 14 / 42 with sigma 0.8 give means ≈ 19 / 58 (vLLM paper §6.1)."""


def _fitted() -> dict[str, float]:
    """T0, alpha, beta of Eqs. 4-5, read off the roofline (the paper profiles them)."""
    model = gpu_or(MODEL)
    beta = model.step_s(BatchShape((), (1,)))
    alpha = (model.step_s(BatchShape((), (2049,))) - beta) / 2048
    t0 = model.step_s(BatchShape(((1024, 0),))) / 1024
    return {
        "prefill_s_per_token": t0,
        "decode_s_per_context_token": alpha,
        "decode_s_per_step": beta,
        "kv_bytes_per_token": KV_INT8.bytes_per_token,
        "pcie_bytes_per_s": HOST_LINK_BYTES_PER_S,
        "max_num_batched_tokens": 2048,
    }


@dataclass(frozen=True, slots=True)
class System:
    name: str
    policy: str
    params: Mapping[str, object]
    predictor: str = ""


def systems(dataset: Dataset) -> dict[str, System]:
    fit = _fitted()
    noisy = f"oracle-noisy:{dataset.predictor_error}"
    swap = {**fit, "preemption": "swap", "displace_running": True}
    return {
        "vLLM": System(
            "vLLM",
            "fcfs",
            {"chunked_prefill": False, "prefill_priority": True, "max_num_batched_tokens": 2048},
        ),
        "ALISE": System("ALISE", "alise", swap, noisy),
        "Oracle": System("Oracle", "alise", swap, "oracle"),
        "Defer": System("Defer", "alise", dict(fit), noisy),
        "Recompute": System("Recompute", "alise", {**fit, "displace_running": True}, noisy),
    }


def spec(system: System) -> ClusterSpec:
    template = WorkerTemplate(
        latency=gpu_or(MODEL),
        num_blocks=KV_TOKENS // 16,
        kv_layout=KV_INT8,
        policy=system.policy,
        policy_params=dict(system.params),
        predictor=system.predictor,
        host_swap_tokens=HOST_SWAP_TOKENS,
        host_link_bytes_per_s=HOST_LINK_BYTES_PER_S,
        host_swap_overlap=True,
    )
    return ClusterSpec((PoolSpec(PoolName("alise"), Role.MIXED, 1, template),))


POOL = 40_000
"""Requests drawn once per dataset and seed; every rate takes a prefix of the same draw."""


def workload(dataset: Dataset, rate: float, n: int, seed: int = 0) -> tuple[WorkItem, ...]:
    """The first `n` requests of one fixed draw, arriving as a Poisson process at `rate`: every
    rate sees the same requests in the same order with gaps scaled by 1 / rate (common random
    numbers, so the curves over rate are not dominated by sampling noise)."""
    if n > POOL:
        raise ValueError(f"at most {POOL} requests per point, got {n}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, POOL)[:n]
    prompts = dataset.prompt.sample(POOL, rng)
    outputs = dataset.output.sample(POOL, rng)
    fits = prompts + outputs <= CONTEXT_TOKENS  # dropped, not truncated (vLLM's benchmark)
    prompts, outputs = prompts[fits][:n], outputs[fits][:n]
    times = np.cumsum(gaps) / rate
    return tuple(
        WorkItem(float(t), int(p), int(o)) for t, p, o in zip(times, prompts, outputs, strict=True)
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    mean_e2e_s: float
    normalized_s: float
    """Mean over requests of end-to-end latency / output tokens."""
    preemptions: int

    @classmethod
    def of(cls, result: SimResult) -> Outcome:
        done = [r for r in result.requests if r.finished]
        if len(done) != len(result.requests):
            raise RuntimeError(f"{len(result.requests) - len(done)} requests did not finish")
        e2e = [r.e2e_s for r in done if r.e2e_s is not None]
        norm = [r.e2e_s / max(1, r.num_output_tokens) for r in done if r.e2e_s is not None]
        return cls(float(np.mean(e2e)), float(np.mean(norm)), result.num_preemptions)


def run(system: System, dataset: Dataset, rate: float, seconds: float) -> Outcome:
    """One point: `rate * seconds` requests (at least 50) arriving over about `seconds`."""
    n = max(50, round(rate * seconds))
    return Outcome.of(simulate(spec(system), workload(dataset, rate, n)))


def rate_at_bound(curve: Sequence[tuple[float, float]], bound: float) -> float:
    """The highest rate at which normalized latency is still <= `bound`, linearly interpolated
    between the grid points around the first crossing (the last rate if it never crosses, the
    first if it starts above)."""
    prev: tuple[float, float] | None = None
    for rate, value in curve:
        if value > bound:
            if prev is None:
                return rate
            r0, v0 = prev
            return r0 + (rate - r0) * (bound - v0) / (value - v0)
        prev = (rate, value)
    return curve[-1][0]


Curves = dict[str, list[tuple[float, Outcome]]]


def _curve_calls(
    dataset: Dataset, plan: Mapping[str, Sequence[float]], seconds: float
) -> list[tuple[object, ...]]:
    """`run`'s arguments for each named system at each of its rates, in `plan` order."""
    found = systems(dataset)
    return [(found[name], dataset, r, seconds) for name, rates in plan.items() for r in rates]


def _as_curves(plan: Mapping[str, Sequence[float]], outcomes: Sequence[Outcome]) -> Curves:
    done = iter(outcomes)
    return {name: [(r, next(done)) for r in rates] for name, rates in plan.items()}


def curves(dataset: Dataset, plan: Mapping[str, Sequence[float]], seconds: float) -> Curves:
    """Each named system at each of its rates (each point a `parallel_map` unit)."""
    return _as_curves(plan, parallel_map(run, _curve_calls(dataset, plan, seconds)))


def bound_rate(c: Curves, name: str) -> float:
    return rate_at_bound([(r, o.normalized_s) for r, o in c[name]], BOUND_S_PER_TOKEN)


def max_ratio(c: Curves, worse: str, better: str) -> tuple[float, float]:
    """Largest normalized-latency ratio worse / better over the rates ("up to"), and its rate."""
    at = dict(c[better])
    return max((w.normalized_s / at[r].normalized_s, r) for r, w in c[worse] if r in at)


def _fmt(dataset: Dataset, c: Curves) -> list[str]:
    out = []
    for name, points in c.items():
        cells = ", ".join(f"{r:g}: {o.normalized_s * 1e3:.0f} ({o.preemptions})" for r, o in points)
        out.append(
            f"{dataset.name} {name}: normalized latency ms/token (preemptions) by req/s: {cells}"
        )
    return out


def _memory_rows(dataset: Dataset, c: Curves) -> list[Comparison]:
    defer, _ = max_ratio(c, "Defer", "ALISE")
    recompute, _ = max_ratio(c, "Recompute", "ALISE")
    fig8 = "normalized latency, max over rates (Fig. 8)"
    return [
        Comparison(
            f"{dataset.name}: Defer / Swap (ALISE) {fig8}", 1.8, defer, "up to 1.8×", 1.8, 1.8, "×"
        ),
        Comparison(
            f"{dataset.name}: Recompute / Swap (ALISE) {fig8}",
            2.8,
            recompute,
            "up to 2.8×",
            2.8,
            2.8,
            "×",
        ),
    ]


SECONDS = 300.0
"""Seconds of arrivals per point (the paper: 30-minute traces)."""
QUICK_SECONDS = 120.0
ALPACA_SECONDS = 60.0
"""Alpaca points (full run only) are shorter: at 10-55 req/s a minute is 600-3,300 requests."""
QUICK_MEMORY_RATES = (1.4, 1.8)
"""Quick: the rates at which Defer and Recompute run (ALISE's grid includes them)."""


def alise(quick: bool = False) -> Reproduction:
    seconds = QUICK_SECONDS if quick else SECONDS
    if quick:
        grid = SHAREGPT.quick_rates
        plan = {
            "vLLM": grid,
            "ALISE": grid,
            "Defer": QUICK_MEMORY_RATES,
            "Recompute": QUICK_MEMORY_RATES,
        }
    else:
        plan = dict.fromkeys(systems(SHAREGPT), SHAREGPT.rates)
    alpaca_plan = dict.fromkeys(("vLLM", "ALISE", "Defer", "Recompute"), ALPACA.rates)
    # ShareGPT's points and (full run) Alpaca's in one batch, so `--jobs` spreads all.
    calls = _curve_calls(SHAREGPT, plan, seconds)
    if not quick:
        calls += _curve_calls(ALPACA, alpaca_plan, ALPACA_SECONDS)
    points = parallel_map(run, calls)
    share = _as_curves(plan, points)
    alpaca = _as_curves(alpaca_plan, points[sum(map(len, plan.values())) :]) if not quick else {}
    comparisons = [
        Comparison(
            "ShareGPT: throughput at 200 ms/token, ALISE / vLLM",
            2.1,
            bound_rate(share, "ALISE") / bound_rate(share, "vLLM"),
            "up to 2.1× (Fig. 2, OPT-13B on V100: up to 2×)",
            2.0,
            2.1,
            "×",
        )
    ]
    fig9_rate = bound_rate(share, "vLLM")
    found = systems(SHAREGPT)
    base, ours = parallel_map(
        run, [(found[name], SHAREGPT, fig9_rate, seconds) for name in ("vLLM", "ALISE")]
    )
    comparisons.append(
        Comparison(
            "ShareGPT: mean response latency reduction vs FCFS (Fig. 9)",
            0.46,
            1 - ours.mean_e2e_s / base.mean_e2e_s,
            "0.46 (−46 %; OPT-13B, 2 req/s)",
            0.46,
            0.46,
            "−%",
        )
    )
    comparisons += _memory_rows(SHAREGPT, share)
    notes = [
        f"Set-up: OPT-13B on 1 V100-32GB ({pricing()}), INT8 KV ({KV_TOKENS} tokens), host link "
        f"{HOST_LINK_BYTES_PER_S / 1e9:g} GB/s overlapped with compute; Poisson arrivals for "
        f"{seconds:g} s per point. vLLM = FCFS of 2023 (prompts first, no chunking, recompute); "
        "ALISE = alise policy, swap preemption, engine oracle with the paper's mean prediction "
        "error (9.2 % ShareGPT, 3.4 % Alpaca); Defer / Recompute = the same scheduler without "
        "displacement / displacing by recompute.",
        "Throughput = highest rate with mean normalized latency <= 200 ms/token (Fig. 6b), "
        "interpolated on the rate grid; Fig. 8 ratios are the maxima over the same grid.",
        f"Fig. 9 point: {fig9_rate:.2f} req/s (vLLM's rate at the bound, standing in for the "
        f"paper's 2 req/s on its V100): mean end-to-end vLLM {base.mean_e2e_s:.1f} s, ALISE "
        f"{ours.mean_e2e_s:.1f} s.",
    ]
    if not quick:
        notes.append(
            f"ShareGPT Oracle / vLLM throughput at the bound: "
            f"{bound_rate(share, 'Oracle') / bound_rate(share, 'vLLM'):.2f}×."
        )
        comparisons.append(
            Comparison(
                "Alpaca: throughput at 200 ms/token, ALISE / vLLM",
                1.5,
                bound_rate(alpaca, "ALISE") / bound_rate(alpaca, "vLLM"),
                "1.5× (Fig. 6b; 1.3–1.8× over models)",
                1.3,
                1.8,
                "×",
            )
        )
        comparisons += _memory_rows(ALPACA, alpaca)
        notes.append(f"Alpaca points: {ALPACA_SECONDS:g} s of arrivals each (run time).")
        notes += _fmt(SHAREGPT, share) + _fmt(ALPACA, alpaca)
    else:
        notes += _fmt(SHAREGPT, share)
        notes.append(
            f"Quick: ShareGPT only, {seconds:g} s per point, Defer and Recompute at "
            f"{' and '.join(f'{r:g}' for r in QUICK_MEMORY_RATES)} req/s only, no Oracle, "
            "no Alpaca."
        )
    notes.append("Why rows miss the band: docs/reproductions/alise.md.")
    notes += latency_note(
        "DistServe's fit of vLLM for OPT-13B on A100-80GB, carried to the paper's V100-32GB by "
        "the roofline's per-shape ratio (RescaledModel), the per-step cost off the GPU held "
        "as measured (RescaledModel.fixed_overhead)."
    )
    return Reproduction("ALISE", tuple(comparisons), {}, tuple(notes))
