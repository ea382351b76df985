"""The slow capacity planner the operator runs with `planner.mode` Advise / Apply. Pure.

Every `planner.intervalSeconds` it sizes each pool for the workload observed over the window,
with the same Aladdin model as the autoscaler (`work_by_role`: prefill from rate x prompt work
against the TTFT target, decode from Eq 6's tokens/s within the TPOT target) at the target
utilisation, but without the autoscaler's forecast, hysteresis and rate limits: it answers
"what split does this workload need" (the P:D ratio), not "what to do this tick".

What it does not do, said plainly: it does not search worker-group shapes (tensor-parallel
degree) or placements; the operator has one performance model (the workers' own), not one per
shape, and does not run the simulator. `splitserve plan` does that search offline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from splitserve.core.roles import Role
from splitserve.policy.planner.aladdin import AladdinPerfModel, LengthStats
from splitserve.policy.planner.autoscaler import AutoscalerParams, Bounds, Targets, work_by_role
from splitserve.policy.planner.signals import Observation

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PoolPlan:
    role: Role
    current: int
    recommended: int
    work: float
    """Worker-equivalents of work at 100 % (before the utilisation margin)."""


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    time_s: float
    pools: Mapping[Role, PoolPlan]
    held: str | None = None
    """Why there is no plan (signals missing or stale); None when there is one."""
    inputs: Mapping[str, str] | None = None

    @property
    def changes(self) -> bool:
        return any(p.recommended != p.current for p in self.pools.values())

    @property
    def message(self) -> str:
        if self.held is not None:
            return f"no plan: {self.held}"
        sizes = ", ".join(
            f"{p.role.value} {p.current} -> {p.recommended}"
            if p.recommended != p.current
            else f"{p.role.value} {p.current} (kept)"
            for p in self.pools.values()
        )
        ratio = ""
        pre, dec = self.pools.get(Role.PREFILL), self.pools.get(Role.DECODE)
        if pre is not None and dec is not None and dec.recommended > 0:
            ratio = f"; P:D {pre.recommended}:{dec.recommended}"
        inputs = self.inputs or {}
        load = ", ".join(f"{k} {v}" for k, v in inputs.items())
        return f"plan: {sizes}{ratio} for {load}" if load else f"plan: {sizes}{ratio}"


def plan_capacity(
    obs: Observation,
    perf: AladdinPerfModel,
    params: AutoscalerParams,
    targets: Targets | None = None,
) -> CapacityPlan:
    """Pool sizes for the observed workload (within each pool's min / max)."""
    if not obs.usable:
        return CapacityPlan(obs.time_s, {}, held=obs.why_unusable())
    assert obs.arrival_rate_per_s is not None
    assert obs.mean_prompt_tokens is not None
    assert obs.mean_output_tokens is not None
    rate = max(0.0, obs.arrival_rate_per_s)
    stats = LengthStats(max(0.0, obs.mean_prompt_tokens), max(1.0, obs.mean_output_tokens))
    tgt = targets or Targets.of(obs.classes)
    work = work_by_role(tuple(obs.pools), rate, stats, perf, tgt, params)
    pools = {}
    for role, p in obs.pools.items():
        want = math.ceil(work[role] / params.target_utilization - _EPS)
        rec = Bounds(p.min_replicas, p.max_replicas).clamp(want)
        pools[role] = PoolPlan(role, p.current, rec, work[role])
    inputs = {
        "rate": f"{rate:.3g} req/s",
        "prompt": f"{stats.mean_prompt_tokens:.0f} tokens",
        "output": f"{stats.mean_output_tokens:.0f} tokens",
        "ttftTarget": f"{tgt.ttft_s:g} s",
        "tpotTarget": f"{tgt.tpot_s:g} s",
    }
    return CapacityPlan(obs.time_s, pools, inputs=inputs)
