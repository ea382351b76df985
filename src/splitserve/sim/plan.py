"""Capacity planning by search with the simulator (`splitserve plan`).

For each tensor-parallel degree a model fits on (DistServe Alg. 1's parallelism search, reduced
to one TP per pool), start from the autoscaler model's pool sizes for the workload's rate
(`policy.planner.autoscaler.work_by_role` at the target utilisation), grow both pools until the
simulated attainment meets the target, then scan each pool down while it still meets
(Splitwise-style provisioning of the P:D split by simulation). The plan with the fewest GPUs
wins; ties: smaller TP. Pure: the caller gives the workload.

Not searched (said so in the output): per-pool TP, heterogeneous hardware, mixed pools.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from splitserve.core.perf import HARDWARE, MODELS, RooflineModel
from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import LengthStats
from splitserve.policy.planner.autoscaler import AutoscalerParams, Targets, work_by_role
from splitserve.sim.autoscale import ROLES, RunResult, Setup, SloTarget, run_static
from splitserve.sim.autoscale_eval import min_static
from splitserve.sim.workload import WorkItem


@dataclass(frozen=True, slots=True)
class Candidate:
    tp: int
    pools: dict[Role, int]
    result: RunResult | None
    """None: no size up to the limit met the target."""

    @property
    def gpus(self) -> int:
        return self.tp * sum(self.pools.values())


def fits(model: str, hardware: str, tp: int) -> bool:
    return RooflineModel(MODELS[model], HARDWARE[hardware], tp=tp).kv_capacity_tokens() > 0


def plan(
    items: Sequence[WorkItem],
    model: str,
    hardware: str,
    slo: SloTarget,
    tps: Sequence[int] = (1, 2, 4, 8),
    limit: int = 64,
) -> list[Candidate]:
    """One candidate per TP the model fits on, best (fewest GPUs) first."""
    if not items:
        raise ValueError("the workload has no requests")
    span = max(items[-1].arrival_s - items[0].arrival_s, 1e-9)
    rate = len(items) / span
    stats = LengthStats(
        sum(w.num_prompt_tokens for w in items) / len(items),
        sum(w.num_output_tokens for w in items) / len(items),
    )
    out = []
    for tp in tps:
        if model not in MODELS or hardware not in HARDWARE:
            raise ValueError(f"unknown model {model!r} or hardware {hardware!r}")
        if not fits(model, hardware, tp):
            continue
        setup = Setup(model=model, hardware=hardware, tp=tp, classes=(slo,))
        params = AutoscalerParams()
        work = work_by_role(
            ROLES, rate, stats, setup.perf_model(), Targets(slo.ttft_s, slo.tpot_s), params
        )
        pools = {r: max(1, math.ceil(work[r] / params.target_utilization)) for r in ROLES}
        result: RunResult | None = run_static(items, setup, pools)
        while result is not None and result.attainment < slo.attainment:
            if sum(pools.values()) >= limit:
                result = None
                break
            pools = {r: n * 2 for r, n in pools.items()}
            result = run_static(items, setup, pools)
        if result is not None:
            best = min_static(items, setup, slo.attainment, pools)
            if best is not None:
                result = best
                pools = dict(best.peak_workers)
        out.append(Candidate(tp, pools, result))
    out.sort(key=lambda c: (c.result is None, c.gpus, c.tp))
    return out


def service_yaml(
    name: str, model: str, source: str, slo: SloTarget, best: Candidate, gpus_per_tp: int = 1
) -> str:
    """An `LLMService` for the plan (one worker group taking both roles, so flips work)."""
    import yaml

    body = {
        "apiVersion": "splitserve.io/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": model, "source": source},
            "engine": {"kind": "vllm", "image": "ghcr.io/splitserve/splitserve:latest"},
            "workerGroups": [
                {
                    "name": "workers",
                    "roles": ["prefill", "decode"],
                    "gpus": best.tp * gpus_per_tp,
                    "tensorParallel": best.tp,
                }
            ],
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
