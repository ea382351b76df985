"""BROS's headline comparison re-run in the simulator: RT latency and SLO attainment, BE throughput.

Owns: BROS's evaluation set-up (seeds/bros.txt §7.1-§7.4; research/seed-accelgen-bros.md B7-B8)
expressed as cluster specs and hybrid workloads, and the computation of our numbers. Pure: returns
a `Reproduction`; the runner prints it.

Set-up, as the paper states it or as we infer it where it does not:
* OPT-13B, TP 2 on A100-SXM4-40GB (roofline; presets `opt-13b`, `a100-40g`); KV capacity 90 % of
  what the weights leave, block size 16. The paper also runs OPT-30B (TP 4) and Llama-3-70B
  (TP 8, A100-80GB); its headline figures average all three at every rate ("15 cases"). The
  default run is 13B only; `cases="all"` (`--cases all`) runs the three (`CASES`), each priced
  by the published model covering it (`latency_for`). The ablation runs OPT-30B, whose shape is
  defined here: no preset.
* `--latency gpu`: the vLLM baseline on DistServe's fit of vLLM, BROS and RR on DistServe's fit of
  its own engine (`OWN_ENGINE_FIT`: §6, BROS is its own engine, not vLLM), both carried to the
  A100-40GB (`common.gpu_or`).
* Systems, all one colocated instance: vLLM of 2024 (FCFS, no chunked prefill, prompts first,
  2,048 batched tokens, 256 sequences); RR (`bros` with `scheduler="rr"`: iteration-level
  round-robin between the RT and BE FCFS queues, no KV sharing); BROS (`bros`, paper defaults,
  with host memory for its block-level KV checkpoints: `HOST_SWAP`).
* RT: Poisson arrivals at 3-15 req/s (the figure's x values are lost; research B10-10), lengths
  lognormal with Table 2's means and standard deviations (ShareGPT, LMSYS-Chat-1M), prompt + output
  ≤ 2,048 (OPT's window). SLO TTFT 0.4 s, TPOT 0.2 s.
* BE: prompts U(512, 1024), outputs U(32, 128), submitted in batches of `BE_BATCH` (not stated;
  research B10-10) each as soon as the previous batch has finished, until the RT trace ends.
* Metrics (§7.1): RT normalised latency = mean over RT of e2e / outputs; TTFT (TPOT) attainment =
  fraction of RT with TTFT ≤ 0.4 s (mean TPOT ≤ 0.2 s: §7.1 defines TPOT as "the average
  latency for generating subsequent tokens"; the per-token reading is measured beside it,
  `Outcome.tpot_token_attainment`); BE throughput = BE finished within the trace / trace
  length. Every claim is the mean over the cases (rates, and models with `--cases all`) of the
  per-case value (the paper's "average ... at various request rates").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitserve.core.ids import PoolName
from splitserve.core.perf import (
    HARDWARE,
    MODELS,
    LatencyModel,
    ModelShape,
    RooflineModel,
    VidurModel,
    kv_link,
)
from splitserve.core.roles import Role
from splitserve.policy.batching.bros import BEST_EFFORT, PAPER_SLO, REALTIME
from splitserve.sim.cluster import ClusterSpec
from splitserve.sim.entities import PoolSpec, WorkerTemplate
from splitserve.sim.metrics import RequestRecord, SimResult
from splitserve.sim.reproductions.bros_cluster import TokenTimes, simulate_hybrid
from splitserve.sim.reproductions.common import (
    Comparison,
    Reproduction,
    gpu_or,
    latency_note,
    parallel_map,
    pricing,
    use_gpu_models,
)
from splitserve.sim.workload import LogNormal, Poisson, Uniform, WorkItem

OPT_30B = ModelShape("opt-30b", 48, 7168, 28672, 56, 56, 50272, mlp_matrices=2)
"""OPT-30B (Zhang et al. 2022, Table 1): 48 layers, hidden 7168, 56 heads. No preset exists."""

CONTEXT_TOKENS = 2048
BE_BATCH = 128
TTFT_S = PAPER_SLO.ttft_ms / 1e3
TPOT_S = PAPER_SLO.tpot_ms / 1e3


def _lognormal(mean: float, std: float) -> LogNormal:
    """The lognormal with this mean and standard deviation, clipped to OPT's window."""
    sigma2 = float(np.log1p((std / mean) ** 2))
    return LogNormal(mean / float(np.exp(sigma2 / 2)), float(np.sqrt(sigma2)), 1, CONTEXT_TOKENS)


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    prompt: LogNormal
    output: LogNormal


DATASETS: tuple[Dataset, ...] = (
    Dataset("ShareGPT", _lognormal(222.76, 256.36), _lognormal(234.51, 268.50)),
    Dataset("LMSYS", _lognormal(90.50, 148.52), _lognormal(237.04, 228.21)),
)
RATES = (3.0, 6.0, 9.0, 12.0, 15.0)
QUICK_RATES = (9.0,)
TRACE_S = 600.0
"""The paper's 10-minute traces. Length matters: vLLM's queue keeps growing over the trace."""
QUICK_TRACE_S = 120.0
MICRO_RATES = (9.0, 15.0)
ABLATION_RATE = 10.0


HOST_SWAP = 1.0
"""Host memory for BROS's checkpoints, as a multiple of the GPU KV capacity (the paper does not
size its CPU buffer; 1× is ≈ 44 GiB for OPT-13B, TP 2). Only BROS with KV sharing uses it: vLLM
and RR evict by recompute; 0 reproduces the recompute-only approximation."""


OWN_ENGINE_FIT = "distserve"
"""Which of DistServe's published engines prices BROS's own engine (BROS and RR) under
`--latency gpu`. §6: BROS is not vLLM but its own engine — 8.5k lines of Python and 2k of
C++/CUDA, "RPC messages between the engine and the executors are handled with Ray", the LLMs
implemented "with the operators provided by PyTorch and Xformers", prefill and decode requests
concatenated in one batch ("not available in vLLM"); RR is "BROS" with its scheduler replaced
(§7.1), so the same engine. DistServe's own engine is the published measurement of that kind of
engine (a Python research engine driving its TP workers over Ray, custom kernels); vLLM's fit
stays for the vLLM baseline. "vllm" prices all three systems with vLLM's fit (the previous
revision)."""


def _engine_fit(policy: str) -> str:
    """The DistServe engine whose fit prices `policy`'s system: vLLM for the vLLM baseline,
    `OWN_ENGINE_FIT` for BROS's engine (BROS and RR)."""
    return OWN_ENGINE_FIT if policy == "bros" else "vllm"


@dataclass(frozen=True, slots=True)
class Case:
    """One of the paper's three model set-ups (§7.1): the model, its TP degree and the GPU."""

    shape: ModelShape
    tp: int
    hardware: str


CASES: Mapping[str, Case] = {
    "opt-13b": Case(MODELS["opt-13b"], 2, "a100-40g"),
    "opt-30b": Case(OPT_30B, 4, "a100-40g"),
    "llama-3-70b": Case(MODELS["llama-3-70b"], 8, "a100-80g"),
}
"""§7.1: "OPT-13B, OPT-30B, and Llama-70B" at TP "2, 4, and 8", the OPT models on a server of
four A100-SXM4-40GB, Llama-3 on eight A100-80GB. The headline figures average all three models
at every rate ("8 out of 15 cases")."""
CASE_SETS: Mapping[str, tuple[str, ...]] = {
    "default": ("opt-13b",),
    "all": tuple(CASES),
}
"""`--cases`: "default" runs OPT-13B only (the quick run and the table of every earlier pass);
"all" runs every case the paper averages (three models × the rates)."""


def latency_for(policy: str, model: RooflineModel) -> LatencyModel:
    """The step pricing of `policy`'s system for `model`'s set-up. On the roofline: `model`.
    Under `--latency gpu`, by coverage:
    * OPT-13B: DistServe's fits (vLLM's for the vLLM baseline, its own engine's for BROS and RR,
      `_engine_fit`) carried to the A100-40GB (`common.gpu_or`);
    * Llama-3-70B, TP 8, A100-80GB: Vidur's A100 operator tables for that very model and TP
      (`VidurModel`), for all three systems alike: they time the GPU's operators, not an
      engine, so the vLLM / BROS engine difference of the OPT-13B case is not expressed;
    * OPT-30B: no published measurement (DistServe measured OPT-13B / 66B / 175B, Vidur the
      Llama family); carrying another shape's fit is not a measurement, so it keeps the
      roofline."""
    name = model.shape.name
    if name == "opt-13b":
        return gpu_or(model, name, model.tp, engine=_engine_fit(policy))
    if name == "llama-3-70b" and use_gpu_models() and model.hardware.name == "a100-80g":
        return VidurModel("a100", name, model.tp, kv_link("nvlink-a100"))
    return model


def _template(
    policy: str,
    params: Mapping[str, object],
    shape: ModelShape,
    tp: int,
    host_swap: float = HOST_SWAP,
    hardware: str = "a100-40g",
) -> WorkerTemplate:
    model = RooflineModel(shape, HARDWARE[hardware], tp=tp)
    latency = latency_for(policy, model)
    merged = dict(params)
    num_blocks = model.kv_capacity_tokens(0.9) // 16
    host = 0
    if policy == "bros":
        merged.setdefault("latency", latency)
        host = int(host_swap * num_blocks * 16)
    return WorkerTemplate(
        latency=latency,
        num_blocks=num_blocks,
        kv_layout=model.shape.kv_layout,
        num_gpus=tp,
        policy=policy,
        policy_params=merged,
        host_swap_tokens=host,
    )


VLLM: tuple[str, Mapping[str, object]] = (
    "fcfs",
    {
        "chunked_prefill": False,
        "prefill_priority": True,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
    },
)
RR: tuple[str, Mapping[str, object]] = ("bros", {"scheduler": "rr"})
BROS: tuple[str, Mapping[str, object]] = ("bros", {})
NO_BICACHE: tuple[str, Mapping[str, object]] = ("bros", {"kv_sharing": False})
RT_ONLY: tuple[str, Mapping[str, object]] = ("bros", {"be_fill": False, "kv_sharing": False})


def spec(
    system: tuple[str, Mapping[str, object]],
    shape: ModelShape,
    tp: int,
    host_swap: float = HOST_SWAP,
    hardware: str = "a100-40g",
) -> ClusterSpec:
    template = _template(system[0], system[1], shape, tp, host_swap, hardware)
    return ClusterSpec((PoolSpec(PoolName("bros"), Role.MIXED, 1, template),))


def rt_items(dataset: Dataset, rate: float, trace_s: float, seed: int = 0) -> tuple[WorkItem, ...]:
    rng = np.random.default_rng(seed)
    n = max(1, int(rate * trace_s))
    times = Poisson(rate).times_s(n, rng)
    prompts = dataset.prompt.sample(n, rng)
    outputs = dataset.output.sample(n, rng)
    return tuple(
        WorkItem(float(t), int(p), max(1, min(int(o), CONTEXT_TOKENS - int(p))), REALTIME)
        for t, p, o in zip(times, prompts, outputs, strict=True)
        if p < CONTEXT_TOKENS
    )


def be_batch(number: int, now: float) -> tuple[WorkItem, ...]:
    """The `number`-th closed-loop BE batch (seeded by its number, so every system sees the
    same sequence of batches)."""
    del now
    rng = np.random.default_rng(1000 + number)
    prompts = Uniform(512, 1024).sample(BE_BATCH, rng)
    outputs = Uniform(32, 128).sample(BE_BATCH, rng)
    return tuple(
        WorkItem(0.0, int(p), int(o), BEST_EFFORT) for p, o in zip(prompts, outputs, strict=True)
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """One system on one workload."""

    norm_latency_s: float
    """Mean over RT requests of end-to-end latency / output tokens."""
    ttft_attainment: float
    tpot_attainment: float
    be_throughput: float
    """BE requests finished within the trace, per second."""
    num_preemptions: int
    tpot_token_attainment: float | None = None
    """The per-token reading of TPOT attainment (measured beside the rows, not a row): the mean
    over RT requests of the share of their subsequent tokens that came out within the TPOT SLO
    of the token before (a request with one token: 1). None when token times were not
    recorded. `tpot_attainment` is the reading §7.1 defines (a request's TPOT is "the average
    latency for generating subsequent tokens")."""

    @classmethod
    def of(
        cls, result: SimResult, trace_s: float, token_times: TokenTimes | None = None
    ) -> Outcome:
        rt = [r for r in result.requests if r.slo_class == REALTIME]
        if any(not r.finished for r in rt):
            raise RuntimeError("some RT requests did not finish")
        be_done = sum(
            1
            for r in result.requests
            if r.slo_class == BEST_EFFORT and r.finish_s is not None and r.finish_s <= trace_s
        )
        return cls(
            float(np.mean([_e2e(r) / r.num_output_tokens for r in rt])),
            sum(1 for r in rt if (r.ttft_s or 0.0) <= TTFT_S) / len(rt),
            sum(1 for r in rt if (r.tpot_s or 0.0) <= TPOT_S) / len(rt),
            be_done / trace_s,
            result.num_preemptions,
            None if token_times is None else per_token_attainment(rt, token_times),
        )


def per_token_attainment(rt: Sequence[RequestRecord], token_times: TokenTimes) -> float:
    """Mean over `rt` of the share of each request's gaps between consecutive tokens that are
    ≤ the TPOT SLO (a request with one output token counts 1)."""
    shares = []
    for r in rt:
        times = token_times.get(r.id, [])
        if len(times) != r.num_output_tokens:
            raise RuntimeError(f"{r.id}: {len(times)} token times, {r.num_output_tokens} tokens")
        gaps = np.diff(np.asarray(times))
        shares.append(float(np.mean(gaps <= TPOT_S)) if gaps.size else 1.0)
    return _mean(shares)


def _e2e(r: RequestRecord) -> float:
    e2e = r.e2e_s
    assert e2e is not None
    return e2e


def run(
    system: tuple[str, Mapping[str, object]],
    dataset: Dataset,
    rate: float,
    trace_s: float,
    shape: ModelShape | None = None,
    tp: int = 2,
    with_be: bool = True,
    host_swap: float = HOST_SWAP,
    hardware: str = "a100-40g",
    per_token: bool = True,
) -> Outcome:
    """One system on one (dataset, rate) at one model set-up. `per_token`: also record every
    token's time for `Outcome.tpot_token_attainment` (steps one decode at a time: the same
    figures, more events)."""
    items = rt_items(dataset, rate, trace_s)
    cluster = spec(system, shape or MODELS["opt-13b"], tp, host_swap, hardware)
    until = trace_s if with_be else -1.0
    times: TokenTimes | None = {} if per_token else None
    result = simulate_hybrid(cluster, items, be_batch if with_be else _no_be, until, times)
    return Outcome.of(result, trace_s, times)


def _no_be(number: int, now: float) -> tuple[WorkItem, ...]:
    del number, now
    return ()


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("inf")


def _comparisons(ds: str, out: Mapping[str, Sequence[Outcome]], full: bool) -> list[Comparison]:
    bros, vllm, rr = out["BROS"], out["vLLM"], out["RR"]
    sharegpt = ds == "ShareGPT"

    def cut(base: Sequence[Outcome], attr: str) -> float:
        """Mean over rates of 1 − BROS / baseline."""
        pairs = zip(bros, base, strict=True)
        return _mean([1 - getattr(b, attr) / getattr(x, attr) for b, x in pairs])

    def mean(outcomes: Sequence[Outcome], attr: str) -> float:
        return _mean([getattr(o, attr) for o in outcomes])

    def gain(base: Sequence[Outcome], attr: str) -> float:
        return _ratio(mean(bros, attr), mean(base, attr))

    def row(name: str, paper: float, ours: float, text: str, unit: str) -> Comparison:
        return Comparison(f"{ds}: {name}", paper, ours, text, paper, paper, unit)

    def reduction(name: str, paper: float, ours: float) -> Comparison:
        return row(name, paper, ours, f"{paper:.4f} (−{paper:.2%})", "−%")

    lat_v, lat_r = (0.7420, 0.5431) if sharegpt else (0.6961, 0.2577)
    thr_v, thr_r = (0.1129, 0.0880) if sharegpt else (0.1767, 0.1518)
    tpot_b, tpot_rr = (0.6549, 0.4734) if sharegpt else (0.7538, 0.4281)
    ttft_gv, tpot_gv, ttft_gr, tpot_gr = (
        (36.38, 1.73, 11.75, 1.47) if sharegpt else (21.42, 2.62, 14.23, 2.28)
    )
    rows = [
        reduction("RT norm. latency reduction vs vLLM", lat_v, cut(vllm, "norm_latency_s")),
        reduction("RT norm. latency reduction vs RR", lat_r, cut(rr, "norm_latency_s")),
        reduction("BE throughput loss vs vLLM", thr_v, cut(vllm, "be_throughput")),
        reduction("BE throughput loss vs RR", thr_r, cut(rr, "be_throughput")),
        row("BROS TPOT attainment", tpot_b, mean(bros, "tpot_attainment"), f"{tpot_b:.2%}", "%"),
        row("RR TPOT attainment", tpot_rr, mean(rr, "tpot_attainment"), f"{tpot_rr:.2%}", "%"),
        row(
            "TPOT attainment gain vs vLLM",
            tpot_gv,
            gain(vllm, "tpot_attainment"),
            f"{tpot_gv}×",
            "×",
        ),
        row("TPOT attainment gain vs RR", tpot_gr, gain(rr, "tpot_attainment"), f"{tpot_gr}×", "×"),
    ]
    if full:
        per_case = "× (mean of per-case ratios)"
        rows += [
            row(
                "TTFT attainment gain vs vLLM",
                ttft_gv,
                gain(vllm, "ttft_attainment"),
                f"{ttft_gv}{per_case}",
                "×",
            ),
            row(
                "TTFT attainment gain vs RR",
                ttft_gr,
                gain(rr, "ttft_attainment"),
                f"{ttft_gr}{per_case}",
                "×",
            ),
        ]
    return rows


def _line(ds: str, rate: float, name: str, o: Outcome) -> str:
    per_token = (
        "" if o.tpot_token_attainment is None else f" (per token {o.tpot_token_attainment:.1%})"
    )
    return (
        f"{ds} {rate:g} req/s, {name}: norm. latency {o.norm_latency_s * 1e3:.1f} ms/token, "
        f"TTFT att. {o.ttft_attainment:.1%}, TPOT att. {o.tpot_attainment:.1%}{per_token}, "
        f"BE {o.be_throughput:.2f} req/s, preemptions {o.num_preemptions}"
    )


SYSTEMS: Mapping[str, tuple[str, Mapping[str, object]]] = {"vLLM": VLLM, "RR": RR, "BROS": BROS}


def _ablation_calls() -> list[tuple[object, ...]]:
    """`run`'s arguments for the full run's ablations: per MICRO_RATES vLLM and RT-only BROS
    without BE, then BROS with and without Bi-cache on OPT-30B."""
    sharegpt = DATASETS[0]
    calls: list[tuple[object, ...]] = []
    for rate in MICRO_RATES:
        calls.append((VLLM, sharegpt, rate, TRACE_S, None, 2, False))
        calls.append((RT_ONLY, sharegpt, rate, TRACE_S, None, 2, False))
    calls.append((BROS, sharegpt, ABLATION_RATE, TRACE_S, OPT_30B, 4))
    calls.append((NO_BICACHE, sharegpt, ABLATION_RATE, TRACE_S, OPT_30B, 4))
    return calls


def _ablations(lines: list[str], outcomes: Sequence[Outcome] | None = None) -> list[Comparison]:
    """Full run only: the RT-only microbenchmark (§7.3) and the Bi-cache ablation (§7.4).
    `outcomes`: `run` over `_ablation_calls()`, when already run (else run here)."""
    if outcomes is None:
        outcomes = parallel_map(run, _ablation_calls())
    cuts: list[float] = []
    for i, rate in enumerate(MICRO_RATES):
        vllm, rt_only = outcomes[2 * i], outcomes[2 * i + 1]
        lines.append(_line("RT only", rate, "vLLM", vllm))
        lines.append(_line("RT only", rate, "BROS (no BE phase, no Bi-cache)", rt_only))
        cuts.append(1 - rt_only.norm_latency_s / vllm.norm_latency_s)
    with_bi, without = outcomes[2 * len(MICRO_RATES) :]
    lines.append(_line("OPT-30B", ABLATION_RATE, "BROS", with_bi))
    lines.append(_line("OPT-30B", ABLATION_RATE, "BROS, No Bi-cache", without))
    return [
        Comparison(
            "RT only: norm. latency reduction vs vLLM",
            0.2936,
            _mean(cuts),
            "−29.36%",
            0.2936,
            0.2936,
            "−%",
        ),
        Comparison(
            "Bi-cache ablation: TTFT attainment gain",
            1.23,
            _ratio(with_bi.ttft_attainment, without.ttft_attainment),
            "1.23×",
            1.23,
            1.23,
            "×",
        ),
        Comparison(
            "Bi-cache ablation: TPOT attainment gain",
            1.63,
            _ratio(with_bi.tpot_attainment, without.tpot_attainment),
            "1.63×",
            1.63,
            1.63,
            "×",
        ),
    ]


Sweep = dict[str, dict[str, list[Outcome]]]
"""dataset -> system -> one outcome per rate."""


def _points(quick: bool, cases: str) -> list[tuple[str, float]]:
    """The (case, rate) points of one dataset and system, in `Sweep` order."""
    rates = QUICK_RATES if quick and cases == "default" else RATES
    return [(case, rate) for case in CASE_SETS[cases] for rate in rates]


def _sweep_calls(quick: bool, cases: str = "default") -> list[tuple[object, ...]]:
    """`run`'s arguments for every system on every (dataset, case, rate) of the run, in `Sweep`
    order (dataset, system, case, rate). Quick: ShareGPT, 120-s traces; with the default cases
    one rate (9 req/s), with all cases every rate."""
    trace_s = QUICK_TRACE_S if quick else TRACE_S
    calls: list[tuple[object, ...]] = []
    for ds in DATASETS[:1] if quick else DATASETS:
        for system in SYSTEMS.values():
            for case, rate in _points(quick, cases):
                c = CASES[case]
                calls.append(
                    (system, ds, rate, trace_s, c.shape, c.tp, True, HOST_SWAP, c.hardware)
                )
    return calls


def _as_sweep(quick: bool, outcomes: Sequence[Outcome], cases: str = "default") -> Sweep:
    n = len(_points(quick, cases))
    found = iter(outcomes)
    return {
        ds.name: {name: [next(found) for _ in range(n)] for name in SYSTEMS}
        for ds in (DATASETS[:1] if quick else DATASETS)
    }


def sweep(quick: bool, cases: str = "default") -> Sweep:
    """Every system on every (dataset, case, rate) of the run (each point a `parallel_map`
    unit)."""
    return _as_sweep(quick, parallel_map(run, _sweep_calls(quick, cases)), cases)


def bros(quick: bool = False, cases: str = "default") -> Reproduction:
    """The reproduction. `cases`: a key of `CASE_SETS` ("all": the paper's three models at
    every rate, the cases its averaged figures are means over)."""
    if cases not in CASE_SETS:
        raise ValueError(f"--cases {cases!r}: valid: {', '.join(CASE_SETS)}")
    if quick:
        return reproduction(sweep(quick, cases), quick, cases=cases)
    # Full run: the sweep's points and the ablations' in one batch, so `--jobs` spreads all.
    calls = _sweep_calls(quick, cases)
    outcomes = parallel_map(run, calls + _ablation_calls())
    return reproduction(
        _as_sweep(quick, outcomes[: len(calls)], cases), quick, outcomes[len(calls) :], cases
    )


def reproduction(
    results: Sweep,
    quick: bool,
    ablations: Sequence[Outcome] | None = None,
    cases: str = "default",
) -> Reproduction:
    """The rows and notes of `results`; the full run's ablations are run unless `ablations`
    (`run` over `_ablation_calls()`) is given."""
    points = _points(quick, cases)
    rates = sorted({rate for _, rate in points})
    trace_s = QUICK_TRACE_S if quick else TRACE_S
    comparisons: list[Comparison] = []
    lines: list[str] = []
    for ds, out in results.items():
        for name, outcomes in out.items():
            lines += [
                _line(ds if cases == "default" else f"{ds} {case}", rate, name, o)
                for (case, rate), o in zip(points, outcomes, strict=True)
            ]
        comparisons += _comparisons(ds, out, not quick)
    for name, paper in (("vLLM", 0.0128), ("RR", 0.1055)):
        ours = _mean([o.ttft_attainment for out in results.values() for o in out[name]])
        comparisons.append(
            Comparison(
                f"{name} TTFT attainment (all cases)",
                paper,
                ours,
                f"{paper:.2%}",
                paper,
                paper,
                "%",
            )
        )
    if not quick:
        comparisons += _ablations(lines, ablations)
    models = (
        "OPT-13B, A100-40GB, TP 2"
        if cases == "default"
        else "OPT-13B and OPT-30B on A100-40GB at TP 2 and 4, Llama-3-70B on A100-80GB at TP 8 "
        "(every case the paper averages)"
    )
    notes = [
        f"Set-up: {models}, one colocated instance ({pricing()}); vLLM = FCFS, no "
        "chunked prefill, prompts first; RR = BROS engine with RT/BE round-robin; BROS defaults "
        "(Bsz 8 +1, τ_min packing, BE fill/replace, KV sharing by block-level checkpoints of "
        "BE to host, recompute when the host is full).",
        f"Workload: RT Poisson at {', '.join(f'{r:g}' for r in rates)} req/s for {trace_s:g} s, "
        f"Table 2 lengths; BE closed loop, batches of {BE_BATCH}, U(512,1024) / U(32,128).",
        f"Ours = mean over {'rates' if cases == 'default' else 'cases (model × rate)'} of "
        "the per-case value; reductions are 1 − BROS / baseline; attainment gains are ratios "
        "of the mean attainments.",
        *lines,
    ]
    per_token = {
        name: [o.tpot_token_attainment for out in results.values() for o in out[name]]
        for name in SYSTEMS
    }
    if all(v is not None for vs in per_token.values() for v in vs):
        notes.append(
            "TPOT attainment, per-token reading (a request's share of tokens within 0.2 s of "
            "the one before; not a row, §7.1 defines TPOT per request): "
            + ", ".join(
                f"{name} {_mean([v for v in vs if v is not None]):.1%}"
                for name, vs in per_token.items()
            )
            + "."
        )
    if quick:
        notes.append(
            f"Quick: ShareGPT at {', '.join(f'{r:g}' for r in rates)} req/s, {trace_s:g} s "
            "traces (the paper's are 600 s); no TTFT × gains, no ablations."
        )
    notes.append("Why some rows miss the band: docs/reproductions/bros.md.")
    own = "DistServe's own engine" if OWN_ENGINE_FIT == "distserve" else "vLLM"
    notes += latency_note(
        f"DistServe's A100-80GB fits for OPT-13B TP 2 — of vLLM for the vLLM baseline, of {own} "
        "for BROS's own engine (BROS and RR, §6) — carried to the paper's A100-40GB "
        "(1.56 TB/s) by the roofline's per-shape ratio (RescaledModel; the per-step cost off "
        "the GPU held as measured), with the 40 GB card's "
        "KV capacity; Llama-3-70B (TP 8, A100-80GB) on Vidur's A100 operator tables for that "
        "model and TP, all three systems alike; OPT-30B keeps the roofline (no published "
        "measurement of it)."
    )
    return Reproduction("BROS", tuple(comparisons), {}, tuple(notes))
