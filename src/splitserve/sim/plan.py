"""Capacity planning by search with the simulator (`splitserve plan`).

For each tensor-parallel degree a model fits on — one for the whole service, or, with
`per_pool`, every (prefill TP, decode TP) pair (DistServe Alg. 1: the prefill and the decode
instance's intra-op parallelism searched separately; its inter-op / pipeline degree is not) —
start from the autoscaler model's pool sizes for the workload's rate (prefill work from the
prefill TP's fitted model, decode work from the decode TP's, `policy.planner.autoscaler.
work_by_role` at the target utilisation), grow both pools (up to a worker limit) until the
simulated attainment meets the target, then scan each pool down while it still meets
(Splitwise-style provisioning of the P:D split by simulation). The plan with the fewest GPUs
wins; ties: smaller TPs. Pure: the caller gives the workload.

Not searched (said so in the output): pipeline parallelism, heterogeneous hardware, mixed pools.
A plan whose pools have different TPs needs one worker group per role, so its workers cannot
flip between roles.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import LengthStats
from splitserve.policy.planner.autoscaler import AutoscalerParams, Targets, work_by_role
from splitserve.policy.planner.tp import tp_refusal
from splitserve.sim.autoscale import ROLES, RunResult, Setup, SloTarget, run_static
from splitserve.sim.autoscale_eval import min_static
from splitserve.sim.workload import WorkItem, arrival_rate


@dataclass(frozen=True, slots=True)
class Candidate:
    tps: Mapping[Role, int]
    """Tensor-parallel degree per pool."""
    pools: dict[Role, int]
    result: RunResult | None
    """None: no plan of at most `limit` workers met the target."""

    @property
    def gpus(self) -> int:
        return sum(self.tps[r] * n for r, n in self.pools.items())

    @property
    def uniform(self) -> bool:
        """One TP for every pool (one worker group can take both roles)."""
        return len(set(self.tps.values())) == 1


def fits(model: str, hardware: str, tp: int) -> bool:
    """`tp` is a degree vLLM allows for the model's heads (`policy.planner.tp`) and leaves KV
    room after the weights."""
    shape = MODELS[model]
    if tp_refusal(shape.num_heads, shape.num_kv_heads, tp) is not None:
        return False
    return RooflineModel(shape, HARDWARE[hardware], tp=tp).kv_capacity_tokens() > 0


def memory_misfit(model: str, hardware: str, tp: int) -> str | None:
    """Why `tp` workers of `hardware` hold no KV beside the model's weights (at the 0.9 memory
    utilisation `fits` uses); None when they do."""
    shape, hw = MODELS[model], HARDWARE[hardware]
    if RooflineModel(shape, hw, tp=tp).kv_capacity_tokens() > 0:
        return None
    return (
        f"TP {tp}: {model}'s weights ({shape.weight_bytes / 1e9:.0f} GB) leave no KV room in "
        f"90 % of {tp} x {hardware} ({hw.memory_bytes * tp * 0.9 / 1e9:.0f} GB)"
    )


def kv_room_tokens(model: str, hardware: str, tp: int) -> int:
    """The KV one simulated worker of TP `tp` holds, in tokens (as `Setup.template` sizes it): a
    request needing more (prompt and output) can never be served."""
    setup = Setup(model=model, hardware=hardware, tp=tp, classes=())
    t = setup.template()
    return t.num_blocks * t.block_size


def plan(
    items: Sequence[WorkItem],
    model: str,
    hardware: str,
    slo: SloTarget,
    tps: Sequence[int] = (1, 2, 4, 8),
    limit: int = 64,
    per_pool: bool = False,
) -> list[Candidate]:
    """One candidate per TP the model fits on (per (prefill, decode) TP pair with `per_pool`),
    best (fewest GPUs) first. A TP that does not divide the model's attention heads (or its KV
    heads, as vLLM requires) is skipped like one that does not fit (`fits`). `limit`: the most
    workers (both pools) a plan may have, and a size simulated: a start estimate or a doubling
    above it is scaled down to it; a candidate still missing the target there has `result`
    None and `pools` the last size tried."""
    if not items:
        raise ValueError("the workload has no requests")
    # (n - 1) / span, as `scale_to_rate` sets it (n / span sized a 2-request workload for twice
    # its rate); no span was taken as 1 ns: pools for 10^9 req/s, built for ever
    try:
        rate = arrival_rate(items)
    except ValueError as err:
        raise ValueError(f"the workload: {err} to size for") from None
    stats = LengthStats(
        sum(w.num_prompt_tokens for w in items) / len(items),
        sum(w.num_output_tokens for w in items) / len(items),
    )
    if model not in MODELS or hardware not in HARDWARE:
        raise ValueError(f"unknown model {model!r} or hardware {hardware!r}")
    usable = [tp for tp in dict.fromkeys(tps) if fits(model, hardware, tp)]
    pairs = list(itertools.product(usable, usable)) if per_pool else [(tp, tp) for tp in usable]
    out = []
    params = AutoscalerParams()
    targets = Targets(slo.ttft_s, slo.tpot_s)
    for tp_p, tp_d in pairs:
        by_role = {Role.PREFILL: tp_p, Role.DECODE: tp_d}
        setup = Setup(model=model, hardware=hardware, tp=tp_p, classes=(slo,))
        setup = replace(setup, tp_by_role=by_role)
        pre = work_by_role(ROLES, rate, stats, setup.perf_model(Role.PREFILL), targets, params)
        dec = work_by_role(ROLES, rate, stats, setup.perf_model(Role.DECODE), targets, params)
        work = {Role.PREFILL: pre[Role.PREFILL], Role.DECODE: dec[Role.DECODE]}
        # work too large for a float is not simulated (an OverflowError from ceil, `plan --rate
        # 1e308`); a start or a doubling past the limit is cut to it (a start past it was not
        # simulated at all: the model's estimate alone made the TP "not met")
        over = not all(math.isfinite(work[r]) for r in ROLES)
        pools = {
            r: limit + 1 if over else max(1, math.ceil(work[r] / params.target_utilization))
            for r in ROLES
        }
        result: RunResult | None = None
        if not over:
            pools = _at_most(pools, limit)
            result = run_static(items, setup, pools)
        while result is not None and result.attainment < slo.attainment:
            grown = _at_most({r: n * 2 for r, n in pools.items()}, limit)
            if grown == pools:
                result = None
                break
            pools = grown
            result = run_static(items, setup, pools)
        if result is not None:
            best = min_static(items, setup, slo.attainment, pools)
            if best is not None:
                result = best
                pools = dict(best.peak_workers)
        out.append(Candidate(by_role, pools, result))
    out.sort(key=lambda c: (c.result is None, c.gpus, sorted(c.tps.values(), reverse=True)))
    return out


def _at_most(pools: dict[Role, int], limit: int) -> dict[Role, int]:
    """`pools`, scaled down in proportion (each at least 1) when they add up to more than
    `limit` workers."""
    total = sum(pools.values())
    if total <= limit:
        return pools
    return {r: max(1, n * limit // total) for r, n in pools.items()}


def service_yaml(
    name: str, model: str, source: str, slo: SloTarget, best: Candidate, gpus_per_tp: int = 1
) -> str:
    """An `LLMService` for the plan: one worker group taking both roles (so flips work) when
    the pools share a TP, else one group per role at its TP."""
    import yaml

    if best.uniform:
        tp = best.tps[Role.PREFILL]
        groups = [
            {
                "name": "workers",
                "roles": ["prefill", "decode"],
                "gpus": tp * gpus_per_tp,
                "tensorParallel": tp,
            }
        ]
    else:
        groups = [
            {
                "name": r.value,
                "roles": [r.value],
                "gpus": best.tps[r] * gpus_per_tp,
                "tensorParallel": best.tps[r],
            }
            for r in ROLES
        ]

    body = {
        "apiVersion": "splitserve.io/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": model, "source": source},
            "engine": {"kind": "vllm", "image": "ghcr.io/splitserve/splitserve:latest"},
            "workerGroups": groups,
            "pools": {r.value: {"replicas": n, "minReplicas": 1} for r, n in best.pools.items()},
            "sloClasses": [
                {
                    "name": slo.name,
                    "ttftMs": slo.ttft_s * 1000,
                    "tpotMs": slo.tpot_s * 1000,
                    "percentile": slo.percentile,
                    "attainment": slo.attainment,
                }
            ],
        },
    }
    return str(yaml.safe_dump(body, sort_keys=False))
